// Microbenchmark (not a test): how fast TMA streams a decode step's FP8 weight tiles from HBM, by the
// weights' layout in memory. Each CTA streams one tile of 256 weight rows over all of K, two 128 x 128
// byte boxes a k-block (the FP8 tile's stage, gemm_mainloop_tma_fp8.cuh) into a ring of `stages`
// stages, with nothing consuming them: the most a tile's weight stream can give.
//   rows:    the weights as the layer holds them, [N][K] e4m3 K-major; a box is 128 rows of 128 bytes
//            K bytes apart (weight_tensor_map_fp8)
//   blocked: the same codes as [N / 128][K / 128][128][128], so that a box is 16 KiB contiguous
// and, with `bulk` as the argument, only a table of the same blocked bytes by 1-D bulk copies
// (cp.async.bulk, no tensor map): two of 16 KiB a stage, or one of 32 KiB ([N / 256][K / 128][256][128]),
// beside the rows' boxes: whether a tile's stream is held by the TMA's 128-byte box rows or by HBM;
// with `prefetch`, only a table of tiles streamed after a delay (a decode step's start-up chain: 48 tiles of
// K = 2048, qwen3-30b T = 1's Linear1, and 128 of K = 7168, dsv3's), the first bytes of their rows asked
// into L2 at the launch's start by every CTA of the grid (prefetch.global.L2, its evict_last form, or
// cp.async.bulk.prefetch.L2 by one thread a CTA), or not: whether a decode step's idle start can bring its
// weights into L2 for the tiles' rings; with `slices`, only a table of a decode call's weight streams by the
// CTAs' shares (today's tiles, or CTAs that each take a slice of one expert's I through both GEMMs).
// Prints GB/s for each layout, grid and ring depth (median of 11 launches, events around each), and a CTA's
// own rate (bytes over its first issue to its last landing, globaltimer; median over the CTAs of the
// median launch). A second table streams each CTA's tile `repeat` times from L2 (K = 768: 26 MB for 132
// tiles, read once before the timed launches): whether a CTA's rate is set by HBM or by the SM. A third
// table times the other direction: 256 threads a CTA storing a 64 KiB output tile (a Linear2 tile's bf16
// rows) 16 times with 16-byte stores, as the epilogue does from its registers; a fourth the same tile
// stored from shared memory by TMA tensor stores (four 128 x 64 boxes of the 128-byte swizzle, one
// thread issuing), as a Linear2 epilogue through held ring stages would: pipelined, and with each tile's
// stores waited for before the next (a tile's row signals need its writes done).
// A fifth table feeds each tile's ring from two SMs: a cluster of two CTAs, the first (the tile's owner)
// loading box 0 of every stage, the second box 1 into the owner's stage by TMA multicast to the owner alone;
// the owner tells the second CTA when a stage's round has landed (a remote mbarrier arrival), as a decode
// step's idle CTAs would feed the few tiles' rings (docs/performance.md#two-sms-on-one-tiles-weight-stream-2026-11-29).
// docs/performance.md#the-k-split-of-small-tiles-2026-11-28-not-kept says what the first table is for,
// docs/performance.md#stores-from-held-ring-stages-2026-11-28-not-kept what the second and third are for,
// its open questions ("the Linear2 tile's stores under the next tile's MMAs, by TMA") the fourth.
// Usage: bench_weight_stream [bulk | prefetch | slices]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device_buffer.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/ptx/mbarrier.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/signals.cuh"
#include "device/ptx/spin_wait.cuh"
#include "device/ptx/wgmma.cuh"
#include "fused/tensor_map.h"
#include "standalone.h"

namespace {

namespace dev = epfuse::device;
using DeviceBuffer = epfuse::detail::CudaBuffer<epfuse::detail::MemoryKind::kDevice>;
constexpr int kBox = 128 * 128;  // bytes of one box
constexpr int kMaxStages = 6;

struct Params {
  int k_blocks;   // K / 128
  int repeat;     // passes over the tile's K (k-block kb % k_blocks)
  int stages;     // ring depth (<= kMaxStages)
  int mode;       // Copy: the rows' map, the blocked layout's map (rows = N * K / 128, 128 bytes each), or bulk copies
  const uint8_t* w;  // the codes (bulk copies)
  uint32_t* abort;
  uint32_t* error;
  uint64_t* span_ns;  // [CTAs]: first issue to last landing
  int short_from = 1 << 30;  // CTAs from this one stream only the first short_k_blocks k-blocks of their rows
  int short_k_blocks = 0;
};

// How a stage's 32 KiB come: two TMA boxes of the rows' map or of the blocked layout's, two 1-D bulk copies
// of 16 KiB (the blocked layout's boxes) or one of 32 KiB.
enum Copy : int { kRows = 0, kBlocked = 1, kBulk16 = 2, kBulk32 = 3 };
constexpr const char* kCopyNames[] = {"rows", "blocked", "bulk 16 KiB", "bulk 32 KiB"};

// Box b (0: rows [256 t, +128), 1: [256 t + 128, +128)) of k-block kb of tile t: its map coordinates.
__device__ void box_coord(const Params& p, int t, int b, int kb, int& c0, int& c1) {
  const int nb = 2 * t + b;  // 128-row block of N
  if (p.mode == kBlocked) c0 = 0, c1 = (nb * p.k_blocks + kb) * 128;
  else c0 = kb * 128, c1 = nb * 128;
}

// Thread 0 of tile t's owner: its k-blocks into the ring of p.stages stages at base (full[s] guarding stage s),
// boxes [0, boxes) of each stage by this CTA's TMA, with the expected bytes of both (fed_stream_kernel's
// second CTA brings box 1 otherwise); before_refill(s) runs before a stage's next round is issued. False
// when a wait ran out (recorded in p.error).
template <class BeforeRefill>
__device__ bool stream_tile(const CUtensorMap& map, const Params& p, int t, uint64_t* full, uint32_t base, int boxes,
                            const dev::WaitLimit& limit, BeforeRefill before_refill) {
  const int k_blocks = t >= p.short_from ? p.short_k_blocks : p.k_blocks;
  const int total = k_blocks * p.repeat;
  for (int kb = 0; kb < total + p.stages; ++kb) {
    const int s = kb % p.stages;
    const uint32_t bar = dev::ptx::smem_u32(&full[s]);
    // The stage's previous round has landed before it is reused (and, past the last k-block, drained).
    if (kb >= p.stages && !dev::mbar_wait(bar, static_cast<uint32_t>((kb / p.stages - 1) & 1), limit)) {
      atomicExch(p.error, 1u);
      return false;
    }
    if (kb >= total) continue;
    if (kb >= p.stages) before_refill(s);
    dev::ptx::mbar_arrive_expect_tx(bar, 2 * kBox);
    const int64_t kbm = kb % k_blocks;
    const uint32_t dst = base + static_cast<uint32_t>(s * 2 * kBox);
    if (p.mode == kBulk32) {
      dev::ptx::bulk_load(dst, p.w + (static_cast<int64_t>(t) * p.k_blocks + kbm) * 2 * kBox, 2 * kBox, bar);
      continue;
    }
    if (p.mode == kBulk16) {
      for (int b = 0; b < 2; ++b)
        dev::ptx::bulk_load(dst + static_cast<uint32_t>(b * kBox), p.w + (static_cast<int64_t>(2 * t + b) * p.k_blocks + kbm) * kBox, kBox, bar);
      continue;
    }
    for (int b = 0; b < boxes; ++b) {
      int c0, c1;
      box_coord(p, t, b, static_cast<int>(kbm), c0, c1);
      dev::ptx::tma_load_2d(base + static_cast<uint32_t>((s * 2 + b) * kBox), &map, bar, c0, c1);
    }
  }
  return true;
}

// Thread 0 of a CTA: its tile (blockIdx.x) through a ring in its own shared memory (smem, full[]), both
// boxes of every stage by its own TMA, started at globaltimer not_before at the earliest; its span from
// the start to the last landing into p.span_ns.
__device__ void stream_own_tile(const CUtensorMap& map, const Params& p, char* smem, uint64_t* full, uint64_t not_before = 0) {
  for (int s = 0; s < p.stages; ++s) dev::ptx::mbar_init(dev::ptx::smem_u32(&full[s]), 1);
  dev::ptx::fence_mbar_init();
  while (dev::globaltimer_ns() < not_before) {
  }
  const dev::WaitLimit limit{dev::globaltimer_ns() + 2'000'000'000ull, p.abort};
  const int t = static_cast<int>(blockIdx.x);
  const uint64_t start = dev::globaltimer_ns();
  if (stream_tile(map, p, t, full, dev::ptx::smem_u32(smem), 2, limit, [](int) {})) p.span_ns[t] = dev::globaltimer_ns() - start;
}

__global__ void __launch_bounds__(32, 1) stream_kernel(const __grid_constant__ CUtensorMap map, const Params p) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  if (threadIdx.x == 0) stream_own_tile(map, p, smem, full);
}

// How prefetch_stream_kernel asks the tiles' bytes into L2 before streaming them.
enum Prefetch : int { kNoPrefetch = 0, kLineL2 = 1, kLineL2EvictLast = 2, kBulkL2 = 3 };
constexpr const char* kPrefetchNames[] = {"none", "prefetch.L2", "evict_last", "bulk prefetch"};

// Every thread of the grid asks the first `head` bytes of every row of the first `tiles` tiles (256 rows of
// K bytes each, row-major from w) into L2 (mode), at once, in k order (every row's first line, then every
// row's second, ...); then those CTAs wait until delay_ns after their start and stream their tile
// (stream_tile, the rows' map), each its span from the stream's start to its last landing into p.span_ns.
__global__ void __launch_bounds__(256, 1) prefetch_stream_kernel(const __grid_constant__ CUtensorMap map, const Params p,
                                                                 int tiles, int mode, int head, uint64_t delay_ns) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  const uint64_t t0 = dev::globaltimer_ns();
  const char* w = reinterpret_cast<const char*>(p.w);
  const int64_t K = static_cast<int64_t>(p.k_blocks) * 128, rows = static_cast<int64_t>(tiles) * 256;
  if (mode == kLineL2 || mode == kLineL2EvictLast) {
    const int64_t lines = rows * (head / 128);
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < lines; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const char* a = w + (i % rows) * K + (i / rows) * 128;
      if (mode == kLineL2) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(a));
      else asm volatile("prefetch.global.L2::evict_last [%0];\n" ::"l"(a));
    }
  } else if (mode == kBulkL2 && threadIdx.x == 0) {
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(w + r * K), "r"(static_cast<uint32_t>(head)) : "memory");
  }
  if (static_cast<int>(blockIdx.x) < tiles && threadIdx.x == 0) stream_own_tile(map, p, smem, full, t0 + delay_ns);
}

__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// A box into the shared memory of the cluster's CTAs in `mask`, at dst's offset there, completing on the
// barrier at bar's offset there; the issuing CTA need not be in the mask.
__device__ __forceinline__ void tma_load_2d_multicast(uint32_t dst, const void* map, uint32_t bar, int c0, int c1, uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1), "h"(mask)
      : "memory");
}
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar, uint32_t rank) {
  asm volatile("{\n .reg .b32 ra;\n mapa.shared::cluster.u32 ra, %0, %1;\n mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(bar),
               "r"(rank)
               : "memory");
}

// stream_kernel's tile t = cluster index, its ring in the owner's (rank 0) shared memory, fed by both CTAs:
// the owner issues box 0 of each k-block, rank 1 box 1 (multicast to the owner only). full[s] (owner): its
// own expect_tx arrival and both boxes' bytes. next[s] (rank 1): the owner saw stage s's round land, so
// rank 1 may issue the next round's box into it.
__global__ void __cluster_dims__(2, 1, 1) __launch_bounds__(32, 1) fed_stream_kernel(const __grid_constant__ CUtensorMap map,
                                                                                    const Params p) {
  extern __shared__ __align__(1024) char smem[];
  __shared__ __align__(8) uint64_t full[kMaxStages];
  __shared__ __align__(8) uint64_t next[kMaxStages];
  const uint32_t base = dev::ptx::smem_u32(smem), rank = cluster_rank();
  if (threadIdx.x == 0) {
    for (int s = 0; s < p.stages; ++s) {
      dev::ptx::mbar_init(dev::ptx::smem_u32(&full[s]), 1);
      dev::ptx::mbar_init(dev::ptx::smem_u32(&next[s]), 1);
    }
    dev::ptx::fence_mbar_init();
  }
  __syncwarp();
  cluster_sync();  // both CTAs' barriers initialised before any multicast or remote arrival
  const dev::WaitLimit limit{dev::globaltimer_ns() + 2'000'000'000ull, p.abort};
  const int t = static_cast<int>(blockIdx.x / 2), total = p.k_blocks * p.repeat;
  if (threadIdx.x == 0 && rank == 0) {
    const uint64_t start = dev::globaltimer_ns();
    if (stream_tile(map, p, t, full, base, 1, limit, [&](int s) { mbar_arrive_remote(dev::ptx::smem_u32(&next[s]), 1); }))
      p.span_ns[t] = dev::globaltimer_ns() - start;
  } else if (threadIdx.x == 0) {
    for (int kb = 0; kb < total; ++kb) {
      const int s = kb % p.stages;
      if (kb >= p.stages &&
          !dev::mbar_wait(dev::ptx::smem_u32(&next[s]), static_cast<uint32_t>((kb / p.stages - 1) & 1), limit)) {
        atomicExch(p.error, 1u);
        break;
      }
      int c0, c1;
      box_coord(p, t, 1, kb % p.k_blocks, c0, c1);
      tma_load_2d_multicast(base + static_cast<uint32_t>((s * 2 + 1) * kBox), &map, dev::ptx::smem_u32(&full[s]), c0, c1, 1);
    }
  }
  __syncwarp();
  cluster_sync();  // the owner's last round landed (it waited for it) before rank 1 leaves
}

// Each CTA stores its own 64 KiB tile `repeat` times, 16 bytes a thread a step (256 threads).
__global__ void __launch_bounds__(256, 1) store_kernel(int4* out, int repeat, uint64_t* span_ns) {
  constexpr int kVecs = (64 << 10) / 16;
  int4* tile = out + static_cast<int64_t>(blockIdx.x) * kVecs;
  __syncthreads();
  const uint64_t start = dev::globaltimer_ns();
  for (int r = 0; r < repeat; ++r)
    for (int v = static_cast<int>(threadIdx.x); v < kVecs; v += 256) tile[v] = make_int4(r, v, r ^ v, 7);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) span_ns[blockIdx.x] = dev::globaltimer_ns() - start;
}

// Each CTA stores its own 128 x 256 bf16 tile (rows [128 t, +128) of `map`, a [CTAs * 128][256] view:
// weight_tensor_map's boxes of 128 rows x 64 columns) `repeat` times from shared memory by TMA tensor
// stores, thread 0 issuing; wait_each: every tile's stores complete (their writes, not only their reads of
// shared memory) before the next tile's are issued.
__global__ void __launch_bounds__(128, 1) tma_store_kernel(const __grid_constant__ CUtensorMap map, int repeat,
                                                           bool wait_each, uint64_t* span_ns) {
  extern __shared__ __align__(1024) char smem[];
  constexpr int kTileBytes = 64 << 10, kBoxRows = 128, kBoxCols = dev::kSw128RowBytes / 2;
  constexpr int kBoxBytes = kBoxRows * dev::kSw128RowBytes;
  int4* tile = reinterpret_cast<int4*>(smem);
  for (int v = static_cast<int>(threadIdx.x); v < kTileBytes / 16; v += blockDim.x)
    tile[v] = make_int4(v, static_cast<int>(blockIdx.x), 3, 7);
  dev::ptx::fence_proxy_async_shared();  // the generic writes, before the async proxy reads them
  __syncthreads();
  if (threadIdx.x != 0) return;
  const uint32_t base = dev::ptx::smem_u32(smem);
  const int row0 = static_cast<int>(blockIdx.x) * kBoxRows;
  const uint64_t start = dev::globaltimer_ns();
  for (int r = 0; r < repeat; ++r) {
    for (int b = 0; b < kTileBytes / kBoxBytes; ++b)
      dev::ptx::tma_store_2d(&map, base + static_cast<uint32_t>(b * kBoxBytes), b * kBoxCols, row0);
    dev::ptx::bulk_commit();
    if (wait_each) dev::ptx::bulk_wait_all();
  }
  dev::ptx::bulk_wait_all();
  span_ns[blockIdx.x] = dev::globaltimer_ns() - start;
}

// The median CTA's span of a launch (globaltimer ns; the spans are sorted in place).
uint64_t median_span(std::vector<uint64_t>& spans) {
  std::sort(spans.begin(), spans.end());
  return spans[spans.size() / 2];
}

struct Rate {
  double all;      // GB/s over the launch
  double per_cta;  // GB/s of the median CTA over its own span
  double launch_us = 0;  // the median launch (run)
};

// 11 timed launches of launch() after 2 warm-up ones, before(i) ahead of launch i outside its timing: the
// median launch by time, its ms and the spans its CTAs wrote to span (one uint64_t a CTA).
template <class Before, class Launch>
std::pair<float, std::vector<uint64_t>> median_launch(const DeviceBuffer& span, Before before, Launch launch) {
  const size_t ctas = span.bytes() / sizeof(uint64_t);
  cudaEvent_t a, b;
  EPFUSE_CUDA_CHECK(cudaEventCreate(&a));
  EPFUSE_CUDA_CHECK(cudaEventCreate(&b));
  std::vector<std::pair<float, std::vector<uint64_t>>> runs(11);
  for (int i = -2; i < 11; ++i) {
    before(i);
    EPFUSE_CUDA_CHECK(cudaEventRecord(a));
    launch();
    EPFUSE_CUDA_CHECK_LAUNCH();
    EPFUSE_CUDA_CHECK(cudaEventRecord(b));
    EPFUSE_CUDA_CHECK(cudaEventSynchronize(b));
    if (i < 0) continue;
    EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&runs[i].first, a, b));
    runs[i].second.resize(ctas);
    EPFUSE_CUDA_CHECK(cudaMemcpy(runs[i].second.data(), span.as(), ctas * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  }
  EPFUSE_CUDA_CHECK(cudaEventDestroy(a));
  EPFUSE_CUDA_CHECK(cudaEventDestroy(b));
  std::sort(runs.begin(), runs.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  return runs[5];
}

// from_l2: no other weights between launches (the tiles stay in L2 from the warm-up launches).
// fed: fed_stream_kernel, `ctas` tiles on 2 ctas CTAs.
// short_from / short_K: the CTAs from short_from stream only the first short_K bytes of their rows (Params).
Rate run(const uint8_t* w, int K, int ctas, int stages, int mode, int repeat, bool from_l2, uint32_t* ctl,
         bool fed = false, int short_from = 1 << 30, int short_K = 0) {
  const int64_t n = static_cast<int64_t>(ctas) * 256;
  const CUtensorMap map = mode == kBlocked ? epfuse::fused::weight_tensor_map_fp8(w, n * K / 128, 128, 128)
                                           : epfuse::fused::weight_tensor_map_fp8(w, n, K, 128);
  DeviceBuffer span(static_cast<size_t>(ctas) * sizeof(uint64_t));
  const Params p{K / 128, repeat, stages, mode, w, ctl, ctl + 1, span.as<uint64_t>(), short_from, short_K / 128};
  const int smem = stages * 2 * kBox;
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(fed_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  auto median = median_launch(
      span,
      [&](int i) {  // other weights in between, so that this tile's bytes come from HBM, not L2 (60 MB > L2)
        if (!from_l2) EPFUSE_CUDA_CHECK(cudaMemsetAsync(const_cast<uint8_t*>(w) + n * K, i & 0x7f, 64ll << 20));
      },
      [&] {
        if (fed) fed_stream_kernel<<<2 * ctas, 32, smem>>>(map, p);
        else stream_kernel<<<ctas, 32, smem>>>(map, p);
      });
  const int long_ctas = std::min(ctas, short_from);
  const double bytes = 256.0 * (static_cast<double>(long_ctas) * K + static_cast<double>(ctas - long_ctas) * short_K) * repeat;
  return {bytes / (median.first * 1e-3) / 1e9, bytes / ctas / static_cast<double>(median_span(median.second)),
          median.first * 1e3};
}

// The prefetch table's row: `tiles` tiles of K streamed delay_us after the launch's start on a grid of
// `ctas` CTAs, the first `head` bytes of each of their rows asked into L2 by `mode`; from HBM (64 MB
// written before each launch). Rate.all: the launch in us; per_cta: a tile's own stream, GB/s.
Rate run_prefetch(const uint8_t* w, int ctas, int tiles, int K, int head, int mode, double delay_us, uint32_t* ctl) {
  constexpr int kStages = 4;
  const int64_t n = static_cast<int64_t>(tiles) * 256, weight_bytes = n * K;
  const CUtensorMap map = epfuse::fused::weight_tensor_map_fp8(w, n, K, 128);
  DeviceBuffer span(static_cast<size_t>(tiles) * sizeof(uint64_t));
  const Params p{K / 128, 1, kStages, kRows, w, ctl, ctl + 1, span.as<uint64_t>()};
  const int smem = kStages * 2 * kBox;
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(prefetch_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  auto median = median_launch(
      span, [&](int i) { EPFUSE_CUDA_CHECK(cudaMemsetAsync(const_cast<uint8_t*>(w) + weight_bytes, i & 0x7f, 64ll << 20)); },
      [&] { prefetch_stream_kernel<<<ctas, 256, smem>>>(map, p, tiles, mode, head, static_cast<uint64_t>(delay_us * 1e3)); });
  return {median.first * 1e3, static_cast<double>(weight_bytes) / tiles / static_cast<double>(median_span(median.second))};
}

// A store table's row: launch() 13 times (2 warm-up), each CTA writing its 64 KiB tile `repeat` times
// and its span to span_ns; GB/s of the median CTA over its own span, in the median launch of 11 (by its
// slowest CTA).
template <class Launch>
double median_cta_store_rate(int ctas, int repeat, const DeviceBuffer& span, Launch launch) {
  std::vector<std::pair<uint64_t, uint64_t>> launches(11);  // (slowest CTA, median CTA)
  std::vector<uint64_t> spans(ctas);
  for (int i = -2; i < 11; ++i) {
    launch();
    EPFUSE_CUDA_CHECK_LAUNCH();
    EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
    if (i < 0) continue;
    EPFUSE_CUDA_CHECK(cudaMemcpy(spans.data(), span.as(), ctas * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    const uint64_t median = median_span(spans);
    launches[i] = {spans.back(), median};
  }
  std::sort(launches.begin(), launches.end());
  return static_cast<double>(repeat) * (64 << 10) / static_cast<double>(launches[5].second);
}

// The store table's row, by store_kernel.
double run_stores(int ctas, int repeat) {
  DeviceBuffer out(static_cast<size_t>(ctas) << 16), span(static_cast<size_t>(ctas) * sizeof(uint64_t));
  return median_cta_store_rate(ctas, repeat, span,
                               [&] { store_kernel<<<ctas, 256>>>(out.as<int4>(), repeat, span.as<uint64_t>()); });
}

// The TMA store table's row, by tma_store_kernel; -1 when a CTA's rows do not hold its tile.
double run_tma_stores(int ctas, int repeat, bool wait_each) {
  DeviceBuffer out(static_cast<size_t>(ctas) << 16), span(static_cast<size_t>(ctas) * sizeof(uint64_t));
  const CUtensorMap map = epfuse::fused::weight_tensor_map(out.as<__nv_bfloat16>(), static_cast<int64_t>(ctas) * 128, 256, 128);
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(tma_store_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 64 << 10));
  const double rate = median_cta_store_rate(ctas, repeat, span, [&] {
    tma_store_kernel<<<ctas, 128, 64 << 10>>>(map, repeat, wait_each, span.as<uint64_t>());
  });
  // What the boxes wrote: CTA t's rows hold its tile (the last repeat's; every repeat writes the same).
  std::vector<int4> host(static_cast<size_t>(ctas) << 12);
  EPFUSE_CUDA_CHECK(cudaMemcpy(host.data(), out.as(), host.size() * sizeof(int4), cudaMemcpyDeviceToHost));
  for (int t = 0; t < ctas; ++t)
    if (host[(static_cast<size_t>(t) << 12) + 1].y != t) return -1.0;  // row 128 t, first box's second chunk
  return rate;
}

// The exit status: 0 when no stream's wait ran out in any launch (ctl's error word), and the line saying so.
int waits_in_time(const DeviceBuffer& ctl) {
  uint32_t err[2];
  EPFUSE_CUDA_CHECK(cudaMemcpy(err, ctl.as(), sizeof(err), cudaMemcpyDeviceToHost));
  std::printf("%s\n", err[1] == 0 ? "no wait ran out" : "FAIL: a wait ran out");
  return err[1] == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (!epfuse::testing::have_gpu()) return epfuse::testing::kSkipped;
  const bool bulk_only = argc > 1 && std::string(argv[1]) == "bulk";
  const bool prefetch_only = argc > 1 && std::string(argv[1]) == "prefetch";
  const bool slices_only = argc > 1 && std::string(argv[1]) == "slices";
  int sms = 0;
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const int64_t bytes = static_cast<int64_t>(sms) * 256 * 7168 + (64ll << 20);
  DeviceBuffer w(static_cast<size_t>(bytes)), ctl(8);
  EPFUSE_CUDA_CHECK(cudaMemset(w.as(), 0x3c, static_cast<size_t>(bytes)));
  EPFUSE_CUDA_CHECK(cudaMemset(ctl.as(), 0, 8));
  if (prefetch_only) {
    std::printf("tiles streamed after a delay, the first `head` bytes of their rows asked into L2 at the launch's start by a grid of %d CTAs, from HBM\n", sms);
    std::printf("launch us (a tile's own stream GB/s), median of 11\n");
    std::printf("%6s %5s %6s %6s", "tiles", "K", "head", "delay");
    for (int mode : {kNoPrefetch, kLineL2, kLineL2EvictLast, kBulkL2}) std::printf(" %16s", kPrefetchNames[mode]);
    std::printf("\n");
    struct Case { int tiles, K, head; double delay; };
    for (const Case& c : {Case{48, 2048, 2048, 8}, Case{48, 2048, 2048, 12}, Case{48, 2048, 1024, 8}, Case{128, 7168, 512, 12},
                          Case{128, 7168, 1024, 12}, Case{128, 7168, 1024, 16}, Case{128, 7168, 1536, 16}}) {
      std::printf("%6d %5d %6d %6.0f", c.tiles, c.K, c.head, c.delay);
      for (int mode : {kNoPrefetch, kLineL2, kLineL2EvictLast, kBulkL2}) {
        const Rate r = run_prefetch(w.as<uint8_t>(), sms, c.tiles, c.K, c.head, mode, c.delay, ctl.as<uint32_t>());
        std::printf(" %8.1f (%5.1f)", r.all, r.per_cta);
      }
      std::printf("\n");
    }
    return waits_in_time(ctl);
  }
  if (slices_only) {
    // qwen3-30b T = 1 (H 2048, I 768, 8 experts routed), its 37.7 MB of weights from HBM: as the decode kernel
    // streams them (48 Linear1 tiles of 256 rows over K = H beside 64 Linear2 tiles of 256 rows over K = I), and
    // as CTAs that each take a slice of one expert's I through both GEMMs would (a slice of 128: Linear1's 256
    // rows over H and Linear2's H rows over 128, 768 KB, as one tile of K = 3072; of 64: 384 KB, K = 1536)
    // (docs/performance.md#a-cta-a-slice-of-i-through-both-gemms-the-weight-stream-2026-12-02).
    std::printf("decode weight streams from HBM: launch us and GB/s over the launch, median of 11\n");
    // And the same bytes over every SM (132 x K 1152, 38.9 MB), each at 4 and 6 stages: what more streams or more
    // bytes in flight give.
    struct Case { const char* name; int ctas, K, short_from, short_K; };
    for (int stages : {4, 6})
      for (const Case& c : {Case{"Linear1 alone: 48 x K 2048", 48, 2048, 1 << 30, 0},
                            Case{"Linear1 beside Linear2: 48 x K 2048 + 64 x K 768", 112, 2048, 48, 768},
                            Case{"slices of 128: 48 x K 3072", 48, 3072, 1 << 30, 0},
                            Case{"slices of 64: 96 x K 1536", 96, 1536, 1 << 30, 0},
                            Case{"every SM: 132 x K 1152", 132, 1152, 1 << 30, 0}}) {
        if (c.ctas > sms) continue;
        const Rate r = run(w.as<uint8_t>(), c.K, c.ctas, stages, kRows, 1, false, ctl.as<uint32_t>(), false, c.short_from, c.short_K);
        std::printf("%-50s %d stages %8.1f us %8.0f GB/s\n", c.name, stages, r.launch_us, r.all);
      }
    return waits_in_time(ctl);
  }
  if (bulk_only) {
    std::printf("weight stream of one 256-row tile per CTA, nothing consuming, from HBM, by the copy: GB/s over the launch (a CTA's own rate), median of 11\n");
    std::printf("%6s %5s %7s", "K", "CTAs", "stages");
    for (int mode : {kRows, kBulk16, kBulk32}) std::printf(" %18s", kCopyNames[mode]);
    std::printf("\n");
    for (int K : {2048, 7168})
      for (int ctas : {48, 96, sms})
        for (int stages : {4, 6}) {
          std::printf("%6d %5d %7d", K, ctas, stages);
          for (int mode : {kRows, kBulk16, kBulk32}) {
            const Rate r = run(w.as<uint8_t>(), K, ctas, stages, mode, 1, false, ctl.as<uint32_t>());
            std::printf(" %10.0f (%5.1f)", r.all, r.per_cta);
          }
          std::printf("\n");
        }
    return waits_in_time(ctl);
  }
  std::printf("weight stream of one 256-row tile per CTA, TMA boxes of 128 x 128 bytes, nothing consuming\n");
  std::printf("from HBM: GB/s over the launch (a CTA's own rate), median of 11\n");
  std::printf("%6s %5s %7s %18s %18s\n", "K", "CTAs", "stages", "rows", "blocked");
  for (int K : {768, 2048, 7168})
    for (int ctas : {48, sms})
      for (int stages : {4, 6}) {
        const Rate rows = run(w.as<uint8_t>(), K, ctas, stages, kRows, 1, false, ctl.as<uint32_t>());
        const Rate blocked = run(w.as<uint8_t>(), K, ctas, stages, kBlocked, 1, false, ctl.as<uint32_t>());
        std::printf("%6d %5d %7d %10.0f (%5.1f) %10.0f (%5.1f)\n", K, ctas, stages, rows.all, rows.per_cta, blocked.all,
                    blocked.per_cta);
      }
  std::printf("from L2 (K = 768, each tile 16 times): GB/s over the launch (a CTA's own rate), median of 11\n");
  std::printf("%5s %7s %18s\n", "CTAs", "stages", "rows");
  for (int ctas : {1, 8, 48, sms})
    for (int stages : {4, 6}) {
      const Rate r = run(w.as<uint8_t>(), 768, ctas, stages, kRows, 16, true, ctl.as<uint32_t>());
      std::printf("%5d %7d %10.0f (%5.1f)\n", ctas, stages, r.all, r.per_cta);
    }
  std::printf("from HBM, each tile's ring fed by one SM or by the two of a cluster: GB/s over the launch (a tile's own rate), median of 11\n");
  std::printf("%6s %5s %7s %18s %18s\n", "K", "tiles", "stages", "one SM", "two SMs");
  for (int K : {768, 2048, 7168})
    for (int tiles : {48, sms / 2}) {
      const Rate one = run(w.as<uint8_t>(), K, tiles, 4, kRows, 1, false, ctl.as<uint32_t>());
      const Rate two = run(w.as<uint8_t>(), K, tiles, 4, kRows, 1, false, ctl.as<uint32_t>(), true);
      std::printf("%6d %5d %7d %10.0f (%5.1f) %10.0f (%5.1f)\n", K, tiles, 4, one.all, one.per_cta, two.all, two.per_cta);
    }
  std::printf("stores of a 64 KiB tile by 256 threads, 16 times: a CTA's own GB/s, median of 11\n");
  std::printf("%5s %10s\n", "CTAs", "GB/s");
  for (int ctas : {1, 48, sms}) std::printf("%5d %10.1f\n", ctas, run_stores(ctas, 16));
  std::printf("TMA tensor stores of the same tile from shared memory, 16 times: a CTA's own GB/s, median of 11\n");
  std::printf("%5s %10s %10s\n", "CTAs", "pipelined", "each waited");
  for (int ctas : {1, 48, sms})
    std::printf("%5d %10.1f %10.1f\n", ctas, run_tma_stores(ctas, 16, false), run_tma_stores(ctas, 16, true));
  return waits_in_time(ctl);
}
