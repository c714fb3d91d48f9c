// generate_expert_weights: this rank's experts filled on its GPU with the generator's values
// (ref/generator.h), bit-identical to weight_w13/weight_w2 on the host.
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "epfuse/inputs.h"
#include "ref/generator.h"

namespace epfuse {
namespace {

// Columns one thread writes: one 16-byte store. Rows are multiples of kDimAlign wide, so this divides.
constexpr int kColsPerThread = 8;
static_assert(kColsPerThread == 8, "the store below packs exactly one uint4");

// Fills matrices [num_experts, rows, cols] of global experts first_expert.. of `stream`.
__global__ void generate_weights_kernel(uint64_t seed, detail::Stream stream, int first_expert, int rows, int cols,
                                        float scale, int64_t num_vectors, bf16* out) {
  const int vectors_per_row = cols / kColsPerThread;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < num_vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row_global = v / vectors_per_row;  // over all local experts
    const int col = static_cast<int>(v % vectors_per_row) * kColsPerThread;
    const int expert = first_expert + static_cast<int>(row_global / rows);
    const uint64_t key = detail::weight_row_key(seed, stream, expert, static_cast<int>(row_global % rows));
    uint32_t pairs[kColsPerThread / 2];  // little-endian: the even column in the low half
#pragma unroll
    for (int i = 0; i < kColsPerThread / 2; ++i)
      pairs[i] = detail::uniform_bf16_bits(key, col + 2 * i, scale) |
                 static_cast<uint32_t>(detail::uniform_bf16_bits(key, col + 2 * i + 1, scale)) << 16;
    *reinterpret_cast<uint4*>(out + v * kColsPerThread) = make_uint4(pairs[0], pairs[1], pairs[2], pairs[3]);
  }
}

void launch_generate(uint64_t seed, detail::Stream stream, int first_expert, int local_experts, int rows, int cols,
                     float scale, bf16* out, cudaStream_t cuda_stream) {
  const int64_t num_vectors = static_cast<int64_t>(local_experts) * rows * (cols / kColsPerThread);
  constexpr int kThreads = 256;
  // Enough blocks to fill any GPU; the grid-stride loop covers the rest.
  const int64_t blocks = std::min<int64_t>((num_vectors + kThreads - 1) / kThreads, 4096);
  generate_weights_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, cuda_stream>>>(seed, stream, first_expert, rows,
                                                                                       cols, scale, num_vectors, out);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void generate_expert_weights(const LayerConfig& cfg, int world_size, int rank, uint64_t seed, bf16* w13, bf16* w2,
                             cudaStream_t stream) {
  validate_config(cfg, world_size);
  EPFUSE_REQUIRE(rank >= 0 && rank < world_size, ErrorCode::kInvalidArgument,
                 "generate_expert_weights: rank=" + std::to_string(rank) +
                     " outside [0, world_size=" + std::to_string(world_size) + ")");
  EPFUSE_REQUIRE(w13 != nullptr && w2 != nullptr, ErrorCode::kInvalidArgument,
                 "generate_expert_weights: w13 and w2 must be device buffers, got a null pointer");
  // The kernel writes 16 bytes at a time.
  EPFUSE_REQUIRE(reinterpret_cast<uintptr_t>(w13) % 16 == 0 && reinterpret_cast<uintptr_t>(w2) % 16 == 0,
                 ErrorCode::kInvalidArgument, "generate_expert_weights: w13 and w2 must be 16-byte aligned");
  const int local = cfg.experts_per_rank(world_size);
  const int first = rank * local;
  launch_generate(seed, detail::Stream::kW13, first, local, 2 * cfg.intermediate, cfg.hidden,
                  detail::weight_scale(cfg.hidden), w13, stream);
  launch_generate(seed, detail::Stream::kW2, first, local, cfg.hidden, cfg.intermediate,
                  detail::weight_scale(cfg.intermediate), w2, stream);
}

}  // namespace epfuse
