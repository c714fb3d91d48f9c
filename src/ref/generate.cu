// generate_expert_weights: this rank's experts filled on its GPU with the generator's values
// (ref/generator.h), bit-identical to weight_w13/weight_w2 on the host.
#include <algorithm>
#include <cstdint>
#include <string>

#include "common/check.h"
#include "common/fp8.h"
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
    const int row = static_cast<int>(row_global % rows);
    const uint64_t key = detail::weight_row_key(seed, stream, expert, row);
    const uint64_t block_key = detail::weight_block_key(seed, stream, expert, row);
    uint32_t pairs[kColsPerThread / 2];  // little-endian: the even column in the low half
#pragma unroll
    for (int i = 0; i < kColsPerThread / 2; ++i)
      pairs[i] = detail::weight_bf16_bits(key, block_key, col + 2 * i, scale) |
                 static_cast<uint32_t>(detail::weight_bf16_bits(key, block_key, col + 2 * i + 1, scale)) << 16;
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

// One CTA per 128x128 block of matrices [matrices, rows, cols]: thread t walks column t of the block.
// The arithmetic of fp8::quantize_tile (the reference's), so codes and scales are bit-identical.
constexpr int kQuantThreads = fp8::kBlock;
__global__ void __launch_bounds__(kQuantThreads)
    quantize_blocks_kernel(const bf16* __restrict__ w, int rows, int cols, ScaleFormat format,
                           uint8_t* __restrict__ codes, void* scales) {
  const int cb = blockIdx.x, rb = blockIdx.y, m = blockIdx.z;
  const int c = cb * fp8::kBlock + static_cast<int>(threadIdx.x);
  const int row_end = min(rows, (rb + 1) * fp8::kBlock);
  const bool active = c < cols;
  const int64_t base = static_cast<int64_t>(m) * rows * cols;
  float amax = 0.0f;
  if (active)
    for (int r = rb * fp8::kBlock; r < row_end; ++r)
      amax = fmaxf(amax, fabsf(__bfloat162float(w[base + static_cast<int64_t>(r) * cols + c])));
  __shared__ unsigned int block_amax;  // |x| as float bits: the order of non-negative floats
  if (threadIdx.x == 0) block_amax = 0;
  __syncthreads();
  atomicMax(&block_amax, __float_as_uint(amax));
  __syncthreads();
  const float a = __uint_as_float(block_amax);
  const float scale = fp8::group_scale(a, format);
  const float inv = 1.0f / scale;
  if (active)
    for (int r = rb * fp8::kBlock; r < row_end; ++r) {
      const int64_t at = base + static_cast<int64_t>(r) * cols + c;
      codes[at] = fp8::float_to_e4m3(__bfloat162float(w[at]) * inv);
    }
  if (threadIdx.x == 0) {
    const int64_t s = (static_cast<int64_t>(m) * gridDim.y + rb) * gridDim.x + cb;
    if (format == ScaleFormat::kUe8m0)
      static_cast<uint8_t*>(scales)[s] = fp8::ue8m0_scale(a);
    else
      static_cast<float*>(scales)[s] = scale;
  }
}

void launch_quantize_blocks(const bf16* w, int matrices, int rows, int cols, ScaleFormat format, uint8_t* codes,
                            void* scales, cudaStream_t stream) {
  if (matrices == 0) return;
  const dim3 grid(fp8::num_blocks(cols), fp8::num_blocks(rows), matrices);
  quantize_blocks_kernel<<<grid, kQuantThreads, 0, stream>>>(w, rows, cols, format, codes, scales);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace

void quantize_expert_weights(const LayerConfig& cfg, int experts, const bf16* w13, const bf16* w2, uint8_t* w13_fp8,
                             uint8_t* w2_fp8, void* w13_scales, void* w2_scales, cudaStream_t stream) {
  EPFUSE_REQUIRE(experts >= 0 && experts <= 65535 / 2, ErrorCode::kInvalidArgument,
                 "quantize_expert_weights: experts=" + std::to_string(experts) + " outside [0, 32767]");
  EPFUSE_REQUIRE(w13 != nullptr && w2 != nullptr && w13_fp8 != nullptr && w2_fp8 != nullptr && w13_scales != nullptr &&
                     w2_scales != nullptr,
                 ErrorCode::kInvalidArgument, "quantize_expert_weights: null device pointer");
  // The gate and up halves of w13 are blocked apart (config.h): 2 * experts matrices [I, H].
  launch_quantize_blocks(w13, 2 * experts, cfg.intermediate, cfg.hidden, cfg.scale_format, w13_fp8, w13_scales,
                         stream);
  launch_quantize_blocks(w2, experts, cfg.hidden, cfg.intermediate, cfg.scale_format, w2_fp8, w2_scales, stream);
}

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
