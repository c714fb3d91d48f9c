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
  kSkewed,     // k distinct experts per token; 4 hot experts (E/4 when E < 16; the same on every
               // rank) together weigh 3x all the others together: ~half of all slots at top-8
  kOneExpert,  // every token's slot 0 goes to one expert (from the seed); the other slots are -1
  kDropped,    // uniform, then 1 token in 16 loses every slot and the others each slot with
               // probability 1/5: about a quarter of the slots are -1
  kOneRank,    // each token's first min(k, E/R) slots are distinct experts of one rank (drawn per
               // token), the rest distinct experts of other ranks: at k >= E/R a token takes every
               // local expert of that rank (a row sent once serves E/R experts)
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

// Tokens of `rank` for input set `seed`: x uniform in [-1, 1] (bf16), routing as above, top-k
// weights positive, normalised over each token's kept slots; a dropped slot keeps a non-zero raw
// weight (a consumer that forgets to skip it gets a wrong answer, not a lucky one). Token t is the
// same whatever num_tokens is. Throws Error(kInvalidConfig) for a config check_config rejects;
// num_tokens is not limited to max_tokens_per_rank, so tests can build oversized batches.
HostTokens make_tokens(const LayerConfig& cfg, int world_size, int rank, int num_tokens,
                       Routing routing, uint64_t seed);
// Per-rank token counts in [0, max_tokens]: 1 rank in 8 gets 0, 1 in 8 gets max_tokens, the others
// a uniform count, so the edge cases turn up often in stress runs.
std::vector<int> make_token_counts(int world_size, int max_tokens, uint64_t seed);

// The weights of global expert e, as the generator defines them (bf16 values).
// w13: [2I, H], entries uniform in [-1, 1) / sqrt(H); w2: [H, I], uniform in [-1, 1) / sqrt(I).
bf16 weight_w13(const LayerConfig& cfg, uint64_t seed, int expert, int row, int col);
bf16 weight_w2(const LayerConfig& cfg, uint64_t seed, int expert, int row, int col);

// Fills this rank's experts [rank*E/R, (rank+1)*E/R) on the GPU with the same values, asynchronously
// on `stream`. w13: [E/R, 2I, H], w2: [E/R, H, I] device buffers, 16-byte aligned.
void generate_expert_weights(const LayerConfig& cfg, int world_size, int rank, uint64_t seed,
                             bf16* w13, bf16* w2, cudaStream_t stream);

// The FP8 weights (weight_format = kFp8Block128) of `experts` experts from bf16 ones, on the GPU and
// asynchronously on `stream`, as the float64 reference quantises them (reference.h; bit-identical
// codes and scales): e4m3fn codes w13_fp8 [experts, 2I, H], w2_fp8 [experts, H, I] and one scale per
// 128x128 block (the gate and up halves of w13 blocked apart) in cfg.scale_format (float, or the UE8M0
// exponent byte): w13_scales [experts, 2 * ceil(I/128), ceil(H/128)], w2_scales [experts, ceil(H/128),
// ceil(I/128)] (the layout of ExpertWeights, types.h).
void quantize_expert_weights(const LayerConfig& cfg, int experts, const bf16* w13, const bf16* w2, uint8_t* w13_fp8,
                             uint8_t* w2_fp8, void* w13_scales, void* w2_scales, cudaStream_t stream);

}  // namespace epfuse
