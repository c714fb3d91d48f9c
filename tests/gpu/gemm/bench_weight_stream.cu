// Microbenchmark (not a test): how fast TMA streams a decode step's FP8 weight tiles from HBM, by the
// weights' layout in memory. Each CTA streams one tile of 256 weight rows over all of K, two 128 x 128
// byte boxes a k-block (the FP8 tile's stage, gemm_mainloop_tma_fp8.cuh) into a ring of `stages`
// stages, with nothing consuming them: the most a tile's weight stream can give.
//   rows:    the weights as the layer holds them, [N][K] e4m3 K-major; a box is 128 rows of 128 bytes
//            K bytes apart (weight_tensor_map_fp8)
//   blocked: the same codes as [N / 128][K / 128][128][128], so that a box is 16 KiB contiguous
// Prints GB/s for each layout, grid and ring depth (median of 11 launches, events around each).
// docs/performance.md#the-k-split-of-small-tiles-2026-11-28-not-kept says what it is for.
// Usage: bench_weight_stream
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "common/check.h"
#include "common/device_buffer.h"
#include "device/ptx/mbarrier.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/signals.cuh"
#include "device/ptx/spin_wait.cuh"
#include "fused/tensor_map.h"
#include "standalone.h"

namespace {

namespace dev = epfuse::device;
using DeviceBuffer = epfuse::detail::CudaBuffer<epfuse::detail::MemoryKind::kDevice>;
constexpr int kBox = 128 * 128;  // bytes of one box
constexpr int kMaxStages = 6;

struct Params {
  int k_blocks;   // K / 128
  int stages;     // ring depth (<= kMaxStages)
  bool blocked;   // the blocked layout's map (rows = N * K / 128, 128 bytes each)
  uint32_t* abort;
  uint32_t* error;
};

// Box b (0: rows [256 t, +128), 1: [256 t + 128, +128)) of k-block kb of tile t: its map coordinates.
__device__ void box_coord(const Params& p, int t, int b, int kb, int& c0, int& c1) {
  const int nb = 2 * t + b;  // 128-row block of N
  if (p.blocked) c0 = 0, c1 = (nb * p.k_blocks + kb) * 128;
  else c0 = kb * 128, c1 = nb * 128;
}

__global__ void __launch_bounds__(32, 1) stream_kernel(const __grid_constant__ CUtensorMap map, const Params p) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  const uint32_t base = dev::ptx::smem_u32(smem);
  if (threadIdx.x != 0) return;
  for (int s = 0; s < p.stages; ++s) dev::ptx::mbar_init(dev::ptx::smem_u32(&full[s]), 1);
  dev::ptx::fence_mbar_init();
  const dev::WaitLimit limit{dev::globaltimer_ns() + 2'000'000'000ull, p.abort};
  const int t = static_cast<int>(blockIdx.x);
  for (int kb = 0; kb < p.k_blocks + p.stages; ++kb) {
    const int s = kb % p.stages;
    const uint32_t bar = dev::ptx::smem_u32(&full[s]);
    // The stage's previous round has landed before it is reused (and, past the last k-block, drained).
    if (kb >= p.stages && !dev::mbar_wait(bar, static_cast<uint32_t>((kb / p.stages - 1) & 1), limit)) {
      atomicExch(p.error, 1u);
      return;
    }
    if (kb >= p.k_blocks) continue;
    dev::ptx::mbar_arrive_expect_tx(bar, 2 * kBox);
    for (int b = 0; b < 2; ++b) {
      int c0, c1;
      box_coord(p, t, b, kb, c0, c1);
      dev::ptx::tma_load_2d(base + static_cast<uint32_t>((s * 2 + b) * kBox), &map, bar, c0, c1);
    }
  }
}

double run(const uint8_t* w, int K, int ctas, int stages, bool blocked, uint32_t* ctl) {
  const int64_t n = static_cast<int64_t>(ctas) * 256;
  const CUtensorMap map = blocked ? epfuse::fused::weight_tensor_map_fp8(w, n * K / 128, 128, 128)
                                  : epfuse::fused::weight_tensor_map_fp8(w, n, K, 128);
  const Params p{K / 128, stages, blocked, ctl, ctl + 1};
  const int smem = stages * 2 * kBox;
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  cudaEvent_t a, b;
  EPFUSE_CUDA_CHECK(cudaEventCreate(&a));
  EPFUSE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<float> ms(11);
  for (int i = -2; i < 11; ++i) {
    // Other weights in between, so that this tile's bytes come from HBM, not L2 (60 MB > L2).
    EPFUSE_CUDA_CHECK(cudaMemsetAsync(const_cast<uint8_t*>(w) + n * K, i & 0x7f, 64ll << 20));
    EPFUSE_CUDA_CHECK(cudaEventRecord(a));
    stream_kernel<<<ctas, 32, smem>>>(map, p);
    EPFUSE_CUDA_CHECK_LAUNCH();
    EPFUSE_CUDA_CHECK(cudaEventRecord(b));
    EPFUSE_CUDA_CHECK(cudaEventSynchronize(b));
    if (i >= 0) EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], a, b));
  }
  EPFUSE_CUDA_CHECK(cudaEventDestroy(a));
  EPFUSE_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return static_cast<double>(n) * K / (ms[5] * 1e-3) / 1e9;
}

}  // namespace

int main() {
  if (!epfuse::testing::have_gpu()) return epfuse::testing::kSkipped;
  int sms = 0;
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t bytes = static_cast<int64_t>(sms) * 256 * 7168 + (64ll << 20);
  DeviceBuffer w(static_cast<size_t>(bytes)), ctl(8);
  EPFUSE_CUDA_CHECK(cudaMemset(w.as(), 0x3c, static_cast<size_t>(bytes)));
  EPFUSE_CUDA_CHECK(cudaMemset(ctl.as(), 0, 8));
  std::printf("weight stream of one 256-row tile per CTA, TMA boxes of 128 x 128 bytes, nothing consuming (GB/s, median of 11)\n");
  std::printf("%6s %5s %7s %10s %10s\n", "K", "CTAs", "stages", "rows", "blocked");
  for (int K : {768, 2048, 7168})
    for (int ctas : {48, sms})
      for (int stages : {4, 6}) {
        const double rows = run(w.as<uint8_t>(), K, ctas, stages, false, ctl.as<uint32_t>());
        const double blocked = run(w.as<uint8_t>(), K, ctas, stages, true, ctl.as<uint32_t>());
        std::printf("%6d %5d %7d %10.0f %10.0f\n", K, ctas, stages, rows, blocked);
      }
  uint32_t err[2];
  EPFUSE_CUDA_CHECK(cudaMemcpy(err, ctl.as(), sizeof(err), cudaMemcpyDeviceToHost));
  std::printf("%s\n", err[1] == 0 ? "no wait ran out" : "FAIL: a wait ran out");
  return err[1] == 0 ? 0 : 1;
}
