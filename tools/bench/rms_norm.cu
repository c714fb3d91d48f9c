#include "bench/rms_norm.h"

#include <cuda_bf16.h>

#include "common/check.h"
#include "common/env.h"
#include "common/launch.h"
#include "device/ptx/ptx.cuh"
#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

constexpr int kThreads = 256;

// One CTA per row: 16-byte loads of 8 values, a block-wide sum of squares, then the scaled row. Launched
// as the fused layers are (common/launch.h): it may start under the layer's tail and reads y only after
// the layer has ended; the next layer may start under its own tail in turn.
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(const uint4* __restrict__ y, uint4* __restrict__ x,
                                                            int vecs_per_row, float inv_h, float eps) {
  device::ptx::grid_dependency_wait();
  device::ptx::launch_dependents();
  const uint4* in = y + static_cast<size_t>(blockIdx.x) * vecs_per_row;
  uint4* out = x + static_cast<size_t>(blockIdx.x) * vecs_per_row;
  float sq = 0.0f;
  for (int i = threadIdx.x; i < vecs_per_row; i += kThreads) {
    const uint4 v = in[i];
    const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(p[j]);
      sq += f.x * f.x + f.y * f.y;
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, off);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = sq;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) total += warp_sums[w];
  const float scale = rsqrtf(total * inv_h + eps);
  for (int i = threadIdx.x; i < vecs_per_row; i += kThreads) {
    uint4 v = in[i];
    __nv_bfloat162* p = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float2 f = __bfloat1622float2(p[j]);
      p[j] = __floats2bfloat162_rn(f.x * scale, f.y * scale);
    }
    out[i] = v;
  }
}

}  // namespace

void rms_norm(const bf16* y, bf16* x, int rows, int H, float eps, cudaStream_t stream) {
  EPFUSE_REQUIRE(rows >= 0 && H > 0 && H % 8 == 0, ErrorCode::kInvalidArgument,
                 "rms_norm: rows " + std::to_string(rows) + ", H " + std::to_string(H) + " (a multiple of 8)");
  if (rows == 0) return;
  EPFUSE_REQUIRE(reinterpret_cast<uintptr_t>(y) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
                 ErrorCode::kInvalidArgument, "rms_norm: y and x must be 16-byte aligned");
  static const bool programmatic = env::programmatic_launch();
  detail::launch_kernel(rms_norm_kernel, rows, kThreads, 0, stream, programmatic, reinterpret_cast<const uint4*>(y),
                        reinterpret_cast<uint4*>(x), H / 8, 1.0f / static_cast<float>(H), eps);
}

}  // namespace epfuse::bench
