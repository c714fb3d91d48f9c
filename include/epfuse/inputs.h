// epfuse/inputs.h: seeded input generator for tests, the CLI and benchmarks.
//
// Every value is a pure function of (seed, tensor, indices) through a counter-based hash
// (src/common/hash.h), so any process, and the GPU, can produce any rank's tokens or any expert's
// weights without communication: rank r generates its own experts on its GPU, and the CPU
// reference regenerates whichever experts the sampled tokens need.
#pragma once
#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "epfuse/config.h"
#include <cuda_runtime.h>

#include "epfuse/types.h"

namespace epfuse {

enum class Routing {
  kUniform,    // k distinct experts per token, uniformly at random
  kSkewed,     // a few hot experts take most of the slots (still k distinct experts per token)
  kOneExpert,  // every token's slot 0 goes to one expert; the other slots are dropped (-1)
  kDropped,    // uniform, with about a quarter of the slots dropped (-1), some tokens entirely
};
std::string_view to_string(Routing routing);
std::optional<Routing> parse_routing(std::string_view name);

// One rank's inputs on the host.
struct HostTokens {
  int num_tokens = 0;
  std::vector<bf16> x;              // [T, H]
  std::vector<int32_t> topk_idx;    // [T, k], -1 = dropped
  std::vector<float> topk_weights;  // [T, k], positive, each token's non-dropped slots sum to 1
};

// Tokens of `rank` for input set `seed`.
HostTokens make_tokens(const LayerConfig& cfg, int world_size, int rank, int num_tokens,
                       Routing routing, uint64_t seed);
// Per-rank token counts drawn in [0, max_tokens] (0 and max both reachable).
std::vector<int> make_token_counts(int world_size, int max_tokens, uint64_t seed);

// The weights of global expert e, as the generator defines them (bf16 values).
// w13: [2I, H], entries uniform in [-1, 1) / sqrt(H); w2: [H, I], uniform in [-1, 1) / sqrt(I).
bf16 weight_w13(const LayerConfig& cfg, uint64_t seed, int expert, int row, int col);
bf16 weight_w2(const LayerConfig& cfg, uint64_t seed, int expert, int row, int col);

// Fills this rank's experts [rank*E/R, (rank+1)*E/R) on the GPU with the same values.
// w13: [E/R, 2I, H], w2: [E/R, H, I] device buffers.
void generate_expert_weights(const LayerConfig& cfg, int world_size, int rank, uint64_t seed,
                             bf16* w13, bf16* w2, cudaStream_t stream);

}  // namespace epfuse
