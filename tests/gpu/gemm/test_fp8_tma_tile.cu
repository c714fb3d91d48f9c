// 1-GPU correctness test of the FP8 warp-specialised 128x256 tile (device/gemm/gemm_mainloop_tma_fp8.cuh,
// TileGemmTmaFp8) under its real roles: 384 threads, a producer warpgroup (setmaxnreg down) issuing
// load_tile into the mbarrier ring and two math warpgroups (setmaxnreg up) running mainloop, dynamic
// shared memory as the fused kernel sizes it, the ring position carried from tile to tile (several
// tiles per CTA: the ring wraps within and across tiles).
// A grouped FP8 GEMM: e4m3 token rows gathered through a row list per tile (tail rows nullptr:
// padding, never read, never stored), 1x128 row scales (rows padded to fp8_scale_stride floats, the
// padding NaN so a wrong scale index shows); weights [E * 2I, K] e4m3 by TMA (weight_tensor_map_fp8)
// with 128x128 block scales, tile columns [0, 128) from gate rows and [128, 256) from up rows of the
// same expert (two row ranges I apart, two block scales per K block); K in {256, 2048, 2880 (a partial
// last block of 64: A rows are followed by NaN codes, so a chunk read past K shows), 7168}; at K = 2048
// and 2880 also with the scales at their extremes (extreme_factor: UE8M0's 2^20 and 2^-20, fp32's
// smallest normal and subnormal neighbours).
// The math warps write their accumulators (visit_cols) into an fp32 output poisoned with NaN first;
// compared per tile, per half (gate / up columns) and per row with a float64 sum over the decoded
// codes times the same scales: 3e-4 relative overall and 5e-4 per row (test_fp8_tile's bounds: the
// FP8 MMA's in-block sums measured ~1e-4 on an H200).
// Also the Linear1 epilogue path: h = silu(gate) * up from visit_gate_up, quantised 1x128 in registers
// (quantize_fragment_rows); its codes and scales bit for bit against common/fp8.h's quantize_tile of the
// h the kernel wrote, and h against the reference's silu(gate) * up. The same checks for the k-loop in
// n64 quarters (mainloop<true>, the decode kernel's tiles of more than kSwappedTokens rows); the decode
// form (mainloop_swapped at 8, 16 and 32 tokens) against the reference by swapped_coord.
// A timed-out ring wait (2 s) is reported with its side and tile. Exit 0 pass, 1 fail, 77 without a GPU.
// Usage: test_fp8_tma_tile [seed]
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device_buffer.h"
#include "common/fp8.h"
#include "common/hash.h"
#include "device/gemm/fp8_quantize.cuh"
#include "device/gemm/gemm_mainloop_tma_fp8.cuh"
#include "device/gemm/tile_gemm.cuh"
#include "device/protocol/regions.h"
#include "device/ptx/signals.cuh"
#include "fused/tensor_map.h"
#include "standalone.h"
#include "tile_roles.cuh"

namespace {

using epfuse::detail::hash_at;
using epfuse::detail::Stream;
using epfuse::detail::uniform_pm1;
namespace dev = epfuse::device;
namespace fp8 = epfuse::fp8;

using Tile = dev::TileGemmTmaFp8<4>;
static_assert(dev::WarpSpecialisedFp8Tile<Tile>, "the FP8 tile satisfies its contract (tile_gemm.cuh)");
static_assert(dev::TileGemmKind<Tile>, "a kind the fused kernel runs (weight_format fp8-block128)");
constexpr int kM = Tile::kBlockM, kN = Tile::kBlockN, kHalf = kN / 2;
constexpr epfuse::ScaleFormat kHFormat = epfuse::ScaleFormat::kFp32;

struct Params {
  const uint8_t* x;         // [T, ldx] e4m3 codes, K used
  const float* x_scales;    // [T, S]
  const int* row_list;      // [tiles, 128]: token or -1 (padding)
  const int* tile_rows;     // [tiles]: real rows (the rest padding)
  const int2* tile_w;       // [tiles]: weight rows of tile columns 0 and 128
  const float* w_scales;    // [W rows / 128, kblocks]
  int64_t ldx;
  int K, S, kblocks, tiles;
  float* out;      // [tiles, 128, 256]
  float* h;        // [tiles, 128, 128]
  uint8_t* hq;     // [tiles, 128, 128]
  float* hs;       // [tiles, 128]
  uint32_t* abort;
  uint32_t* error;  // {1 + side (0 producer, 1 math), tile, CTA}
  uint64_t timeout_ns;
  bool kloop_only;  // bench: no epilogue (no output, no h), so the time is the k-loop's and the ring's
};

__device__ void record_failure(const Params& p, int side, int tile) {
  epfuse::testing::record_ring_failure(p.error, p.abort, side, tile);
}

// A math thread's decode-form tile at kTokens (mainloop_swapped<kTokens>): its registers into out by
// swapped_coord, rows past `rows` dropped. False when a ring wait failed (recorded).
template <int kTokens>
__device__ bool swapped_tile(const Params& p, Tile::RingPos& pos, int t, int rows, void* smem, const dev::WaitLimit& limit) {
  float acc[kTokens];
  if (!Tile::mainloop_swapped<kTokens>(pos, p.K, smem, acc, limit)) {
    record_failure(p, 1, t);
    return false;
  }
  if (p.kloop_only) {
    epfuse::testing::keep_live(acc, p.out);
    return true;
  }
  const int ct = static_cast<int>(threadIdx.x) - Tile::kProducerThreads;
  float* o = p.out + static_cast<int64_t>(t) * kM * kN;
#pragma unroll
  for (int i = 0; i < kTokens; ++i) {
    const auto [row, col] = dev::swapped_coord<kTokens>(ct, i);
    if (row < rows) o[row * kN + col] = acc[i];
  }
  return true;
}

// One kernel a k-loop form: kSwapped > 0, the decode form at that many tokens (mainloop_swapped<kSwapped>,
// tiles of at most that many rows; out only, no h); else the 64-row k-loop, in n64 quarters when
// kQuarters (mainloop<true>). Forms apart, as in the fused kernels: the quarters beside m64n32 in one
// kernel make ptxas serialise every wgmma of it (docs/performance.md#the-decode-form-at-32-rows-2026-11-30).
template <int kSwapped, bool kQuarters>
__global__ void __launch_bounds__(Tile::kThreads, 1) fp8_tma_tile_kernel(const __grid_constant__ CUtensorMap wmap,
                                                                      const Params p) {
  extern __shared__ __align__(1024) char smem[];
  Tile::init(smem);
  const dev::WaitLimit limit{dev::globaltimer_ns() + p.timeout_ns, p.abort};
  if (threadIdx.x < Tile::kProducerThreads) {
    dev::ptx::setmaxnreg_dec<Tile::kProducerRegs>();
    const int t_id = static_cast<int>(threadIdx.x);
    Tile::RingPos pos;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
      const int* list = p.row_list + t * kM;
      const uint8_t* a_rows[Tile::kProducerRows];
#pragma unroll
      for (int i = 0; i < Tile::kProducerRows; ++i) {
        const int r = list[Tile::producer_row(t_id, i)];
        a_rows[i] = r >= 0 ? p.x + r * p.ldx : nullptr;
      }
      const int rs = list[Tile::producer_scale_row(t_id)];
      const float* a_scale = rs >= 0 ? p.x_scales + static_cast<int64_t>(rs) * p.S : nullptr;
      const int2 w = p.tile_w[t];
      // Every third tile loads its weights with the L2 evict_first hint (the fused kernel's experts whose
      // weights a call reads once).
      const Tile::BOperand b{&wmap, w.x, w.y, p.w_scales + (w.x / 128) * p.kblocks, p.w_scales + (w.y / 128) * p.kblocks,
                             t % 3 == 2};
      // Every second tile of a CTA takes the fused kernel's path for tiles that wait for their inputs:
      // thread 0 issues the first k-blocks' weights ahead (load_weights), then load_tile adds their A rows.
      int preloaded = 0;
      if ((t / gridDim.x) % 2 == 1) {
        bool ok = true;
        if (t_id == 0) ok = Tile::load_weights(pos, b, p.K, smem, limit);
        if (dev::ptx::named_barrier_or(1, Tile::kProducerThreads, !ok)) {
          record_failure(p, 0, t);
          break;
        }
        preloaded = Tile::preload_blocks(p.K);
      }
      if (!Tile::load_tile(pos, a_rows, a_scale, b, p.K, smem, limit, preloaded)) {
        record_failure(p, 0, t);
        break;
      }
    }
    dev::ptx::cp_async_wait_all();
  } else {
    dev::ptx::setmaxnreg_inc<Tile::kConsumerRegs>();
    Tile::RingPos pos;
    for (int t = blockIdx.x; t < p.tiles; t += gridDim.x) {
      const int rows = p.tile_rows[t];
      if constexpr (kSwapped > 0) {
        if (!swapped_tile<kSwapped>(p, pos, t, rows, smem, limit)) break;
        continue;
      }
      Tile::Accum acc;
      if (!(kQuarters ? Tile::mainloop<true>(pos, p.K, rows, smem, acc, limit) : Tile::mainloop(pos, p.K, rows, smem, acc, limit))) {
        record_failure(p, 1, t);
        break;
      }
      if (p.kloop_only) {
        epfuse::testing::keep_live(acc.v, p.out);
        continue;
      }
      float* o = p.out + static_cast<int64_t>(t) * kM * kN;
      Tile::visit_cols<0, kN>(acc, [&](int r, int c, float v0, float v1) {
        if (r < rows) o[r * kN + c] = v0, o[r * kN + c + 1] = v1;
      });
      // Linear1's epilogue arithmetic: h = silu(gate) * up, one 1x128 group per row, quantised in registers.
      float hv[kHalf / 2];
      int j = 0;
      Tile::visit_gate_up<0, kHalf>(acc, [&](int, int, float g0, float g1, float u0, float u1) {
        hv[j] = g0 / (1.0f + expf(-g0)) * u0;
        hv[j + 1] = g1 / (1.0f + expf(-g1)) * u1;
        j += 2;
      });
      uint8_t code[kHalf / 2];
      float scale[2];
      dev::quantize_fragment_rows(hv, kHFormat, code, scale);
      const int ct = static_cast<int>(threadIdx.x) - Tile::kProducerThreads;
#pragma unroll
      for (int i = 0; i < kHalf / 2; ++i) {
        const dev::FragCoord c = dev::wgmma_accum_coord(ct, i, 1, kN);
        if (c.row < rows) {
          const int64_t at = (static_cast<int64_t>(t) * kM + c.row) * kHalf + c.col;
          p.h[at] = hv[i];
          p.hq[at] = code[i];
          if (c.col == 0) p.hs[t * kM + c.row] = scale[(i >> 1) & 1];
        }
      }
    }
  }
}

// e4m3 codes of uniform values in [-range, range] (never NaN).
uint8_t random_code(uint64_t seed, Stream stream, uint64_t i, float range) {
  return fp8::float_to_e4m3(range * uniform_pm1(hash_at(seed, stream, i)));
}
// Positive scales spanning 2^-3 .. 2^1, not powers of two.
float random_scale(uint64_t seed, Stream stream, uint64_t i) {
  const double u = uniform_pm1(hash_at(seed, stream, i));
  return static_cast<float>(std::exp2(-1.0 + 2.0 * u) * (1.0 + 0.3 * u * u));
}
// Scales at their extremes: K block b's row scales times extreme_factor(b) and its weight block scales
// divided by it, so that each product stays near 1 while the scales themselves reach UE8M0's 2^20 and
// 2^-20, the smallest normal fp32 (2^-126 times a random scale of 2^-3 .. 2^1: down to subnormal row
// scales) and 2^125 (its weight scales down to subnormal 2^-128).
double extreme_factor(int b) {
  constexpr int kExp[4] = {20, -20, -126, 125};
  return std::ldexp(1.0, kExp[b % 4]);
}

struct TileDesc {
  int expert, mblock, nblock, rows;
};

// A grouped GEMM: experts of expert_rows rows (gathered from a pool of tokens), each with 2 * inter
// weight rows (gate, up), on `ctas` CTAs. bench: no reference, timed instead (a throughput figure, not a
// test; it still fails on a device error or a non-finite output); kloop_only: the bench without the
// epilogue (the tile bench's fp32 output and h stores bound it: 41% tensor busy on an H100, docs/performance.md#expert-gemms-fp8
// 2026-11-27), outputs not written and not checked.
bool run_case(int K, uint64_t seed, int ctas, const std::vector<int>& expert_rows, int inter, bool bench = false,
              bool kloop_only = false, bool extreme_scales = false, int swapped = 0, bool quarters = false) {
  using DeviceBuffer = epfuse::detail::CudaBuffer<epfuse::detail::MemoryKind::kDevice>;
  if (!Tile::supports_k(K)) {
    std::printf("FAIL K=%d: the tile refuses it (supports_k)\n", K);
    return false;
  }
  const int kblocks = fp8::num_blocks(K), S = dev::fp8_scale_stride(K);
  constexpr int kTokens = 300;
  const int kExperts = static_cast<int>(expert_rows.size()), kInter = inter;
  const int64_t ldx = K + 64;                       // each row followed by 64 NaN codes
  const int wrows = kExperts * 2 * kInter;

  // Tokens: codes, then NaN codes to ldx; scales padded to S with NaN.
  std::vector<uint8_t> x(static_cast<size_t>(kTokens) * ldx, fp8::kE4m3NaN);
  std::vector<float> xs(static_cast<size_t>(kTokens) * S, std::nanf(""));
  for (int r = 0; r < kTokens; ++r) {
    for (int k = 0; k < K; ++k) x[r * ldx + k] = random_code(seed, Stream::kX, static_cast<uint64_t>(r) * K + k, 12.0f);
    for (int b = 0; b < kblocks; ++b)
      xs[r * S + b] = static_cast<float>(random_scale(seed, Stream::kTopkWeight, r * kblocks + b) *
                                         (extreme_scales ? extreme_factor(b) : 1.0));
  }
  std::vector<uint8_t> w(static_cast<size_t>(wrows) * K);
  for (size_t i = 0; i < w.size(); ++i) w[i] = random_code(seed, Stream::kW13, i, 3.0f);
  std::vector<float> ws(static_cast<size_t>(wrows / 128) * kblocks);
  for (size_t i = 0; i < ws.size(); ++i)
    ws[i] = static_cast<float>(random_scale(seed, Stream::kW2, i) /
                               (extreme_scales ? extreme_factor(static_cast<int>(i % kblocks)) : 1.0));

  // Tiles: expert-major, n-block major within an expert (as the fused schedule), rows gathered at random.
  std::vector<TileDesc> tiles;
  std::vector<int> row_list, tile_rows;
  std::vector<int2> tile_w;
  for (int e = 0; e < kExperts; ++e) {
    std::vector<int> tokens(expert_rows[e]);
    for (int i = 0; i < expert_rows[e]; ++i)
      tokens[i] = static_cast<int>(hash_at(seed, Stream::kRouting, e, i) % kTokens);
    for (int nb = 0; nb < kInter / kHalf; ++nb)
      for (int m = 0; m * kM < expert_rows[e]; ++m) {
        const int rows = std::min(kM, expert_rows[e] - m * kM);
        tiles.push_back({e, m, nb, rows});
        for (int i = 0; i < kM; ++i) row_list.push_back(i < rows ? tokens[m * kM + i] : -1);
        tile_rows.push_back(rows);
        tile_w.push_back(make_int2(e * 2 * kInter + nb * kHalf, e * 2 * kInter + kInter + nb * kHalf));
      }
  }
  const int ntiles = static_cast<int>(tiles.size());
  if (swapped > 0 && std::any_of(tile_rows.begin(), tile_rows.end(), [&](int r) { return r > swapped; })) {
    std::printf("FAIL K=%d: a tile of more than %d rows asked of the decode form at %d tokens\n", K, swapped, swapped);
    return false;
  }
  if (swapped != 0 && swapped != 8 && swapped != 16 && swapped != 32) {
    std::printf("FAIL: no decode form at %d tokens\n", swapped);
    return false;
  }

  DeviceBuffer d_x(x.size()), d_xs(xs.size() * 4), d_w(w.size()), d_ws(ws.size() * 4), d_list(row_list.size() * 4),
      d_rows(tile_rows.size() * 4), d_tw(tile_w.size() * sizeof(int2)),
      d_out(static_cast<size_t>(ntiles) * kM * kN * 4), d_h(static_cast<size_t>(ntiles) * kM * kHalf * 4),
      d_hq(static_cast<size_t>(ntiles) * kM * kHalf), d_hs(static_cast<size_t>(ntiles) * kM * 4), d_ctl(16);
  auto up = [](DeviceBuffer& d, const void* src) {
    EPFUSE_CUDA_CHECK(cudaMemcpy(d.as(), src, d.bytes(), cudaMemcpyHostToDevice));
  };
  up(d_x, x.data()), up(d_xs, xs.data()), up(d_w, w.data()), up(d_ws, ws.data()), up(d_list, row_list.data());
  up(d_rows, tile_rows.data()), up(d_tw, tile_w.data());
  EPFUSE_CUDA_CHECK(cudaMemset(d_out.as(), 0xff, d_out.bytes()));  // NaN: unwritten elements show
  EPFUSE_CUDA_CHECK(cudaMemset(d_h.as(), 0xff, d_h.bytes()));
  EPFUSE_CUDA_CHECK(cudaMemset(d_hq.as(), 0x7f, d_hq.bytes()));
  EPFUSE_CUDA_CHECK(cudaMemset(d_hs.as(), 0xff, d_hs.bytes()));
  EPFUSE_CUDA_CHECK(cudaMemset(d_ctl.as(), 0, d_ctl.bytes()));
  const CUtensorMap wmap = epfuse::fused::weight_tensor_map_fp8(d_w.as<uint8_t>(), wrows, K, Tile::kBoxRows);

  Params p{};
  p.x = d_x.as<uint8_t>(), p.x_scales = d_xs.as<float>(), p.row_list = d_list.as<int>();
  p.tile_rows = d_rows.as<int>(), p.tile_w = d_tw.as<int2>(), p.w_scales = d_ws.as<float>();
  p.ldx = ldx, p.K = K, p.S = S, p.kblocks = kblocks, p.tiles = ntiles;
  p.out = d_out.as<float>(), p.h = d_h.as<float>(), p.hq = d_hq.as<uint8_t>(), p.hs = d_hs.as<float>();
  p.abort = d_ctl.as<uint32_t>(), p.error = d_ctl.as<uint32_t>() + 1, p.timeout_ns = 2'000'000'000ull;
  p.kloop_only = kloop_only;
  void (*const kernel)(const CUtensorMap, const Params) = swapped == 8    ? fp8_tma_tile_kernel<8, false>
                                                         : swapped == 16 ? fp8_tma_tile_kernel<16, false>
                                                         : swapped == 32 ? fp8_tma_tile_kernel<32, false>
                                                         : quarters      ? fp8_tma_tile_kernel<0, true>
                                                                         : fp8_tma_tile_kernel<0, false>;
  EPFUSE_REQUIRE(swapped == 0 || swapped == 8 || swapped == 16 || swapped == 32, epfuse::ErrorCode::kInvalidArgument,
                 "no decode form at this N");
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const std::string form = swapped > 0 ? ", decode form n" + std::to_string(swapped) : "";
  std::printf("K=%d: %d tiles on %d CTAs, %d k-blocks per tile (ring of %d stages)%s%s%s\n", K, ntiles, ctas, kblocks,
              Tile::kStages, extreme_scales ? ", scales at their extremes" : "", form.c_str(), quarters ? ", n64 quarters" : "");
  std::fflush(stdout);  // a crash in the kernel leaves this line as the last
  kernel<<<ctas, Tile::kThreads, Tile::kSmemBytes>>>(wmap, p);
  EPFUSE_CUDA_CHECK_LAUNCH();
  EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  if (bench) {
    cudaEvent_t start, stop;
    EPFUSE_CUDA_CHECK(cudaEventCreate(&start));
    EPFUSE_CUDA_CHECK(cudaEventCreate(&stop));
    // Median of kReps launches, each timed alone after a warm-up.
    constexpr int kWarmup = 3, kReps = 21;
    std::vector<float> times(kReps);
    for (int i = -kWarmup; i < kReps; ++i) {
      EPFUSE_CUDA_CHECK(cudaEventRecord(start));
      kernel<<<ctas, Tile::kThreads, Tile::kSmemBytes>>>(wmap, p);
      EPFUSE_CUDA_CHECK_LAUNCH();
      EPFUSE_CUDA_CHECK(cudaEventRecord(stop));
      EPFUSE_CUDA_CHECK(cudaEventSynchronize(stop));
      if (i >= 0) EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&times[i], start, stop));
    }
    std::sort(times.begin(), times.end());
    const float ms = times[kReps / 2];
    double flops = 0;
    for (int r : tile_rows) flops += 2.0 * r * kN * K;
    std::vector<float> out(static_cast<size_t>(ntiles) * kM * kN);
    uint32_t ctl[4];
    EPFUSE_CUDA_CHECK(cudaMemcpy(out.data(), d_out.as(), d_out.bytes(), cudaMemcpyDeviceToHost));
    EPFUSE_CUDA_CHECK(cudaMemcpy(ctl, d_ctl.as(), sizeof(ctl), cudaMemcpyDeviceToHost));
    long nonfinite = 0;
    for (int t = 0; t < ntiles && !kloop_only; ++t)
      for (int r = 0; r < tile_rows[t]; ++r)
        for (int c = 0; c < kN; ++c) nonfinite += !std::isfinite(out[(static_cast<size_t>(t) * kM + r) * kN + c]);
    const bool ok = ctl[1] == 0 && nonfinite == 0;
    const std::string outputs = kloop_only ? "outputs not stored" : "non-finite outputs " + std::to_string(nonfinite);
    std::printf("%s bench%s K=%d: %d tiles on %d CTAs: %.4f ms per launch (median of 21), %.0f TFLOP/s (real rows; device error %u, "
                "%s; not a test of the values)\n",
                ok ? "ok  " : "FAIL", (form + (kloop_only ? " (k-loop only)" : "")).c_str(), K, ntiles, ctas, ms,
                flops / (ms * 1e-3) / 1e12, ctl[1], outputs.c_str());
    EPFUSE_CUDA_CHECK(cudaEventDestroy(start));
    EPFUSE_CUDA_CHECK(cudaEventDestroy(stop));
    return ok;
  }

  std::vector<float> out(static_cast<size_t>(ntiles) * kM * kN), h(static_cast<size_t>(ntiles) * kM * kHalf),
      hs(static_cast<size_t>(ntiles) * kM);
  std::vector<uint8_t> hq(h.size());
  uint32_t ctl[4];
  EPFUSE_CUDA_CHECK(cudaMemcpy(out.data(), d_out.as(), d_out.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(h.data(), d_h.as(), d_h.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(hq.data(), d_hq.as(), d_hq.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(hs.data(), d_hs.as(), d_hs.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(ctl, d_ctl.as(), sizeof(ctl), cudaMemcpyDeviceToHost));
  bool ok = true;
  if (ctl[1] != 0) {
    std::printf("FAIL K=%d: a ring wait ran out (2 s) in the %s role of CTA %u at tile %u\n", K,
                ctl[1] == 1 ? "producer" : "math", ctl[3], ctl[2]);
    ok = false;
  }

  // Decoded operands, then the float64 reference of every real row.
  std::vector<float> xd(x.size()), wd(w.size());
  for (size_t i = 0; i < x.size(); ++i) xd[i] = fp8::e4m3_to_float(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wd[i] = fp8::e4m3_to_float(w[i]);
  const double kOverall = 3e-4, kRow = 5e-4, kH = 1e-3;
  double all_err2 = 0, all_ref2 = 0;
  int nan_total = 0;
  long hcode_diff = 0, hscale_diff = 0;
  double h_worst = 0;
  std::vector<double> ref(static_cast<size_t>(kN));
  for (int t = 0; t < ntiles; ++t) {
    const TileDesc& d = tiles[t];
    double err2[2] = {0, 0}, ref2[2] = {0, 0}, worst[2] = {0, 0};
    int worst_row[2] = {-1, -1}, nan[2] = {0, 0}, bad_rows[2] = {0, 0};
    std::string bad_list[2];
    int first_bad_row[2] = {-1, -1}, first_bad_col[2] = {-1, -1};
    double first_got[2] = {0, 0}, first_want[2] = {0, 0};
    for (int r = 0; r < d.rows; ++r) {
      const int tok = row_list[t * kM + r];
      for (int c = 0; c < kN; ++c) {
        const int wr = c < kHalf ? tile_w[t].x + c : tile_w[t].y + c - kHalf;
        double sum = 0;
        for (int b = 0; b < kblocks; ++b) {
          double block = 0;
          const float* xa = &xd[tok * ldx + b * 128];
          const float* wa = &wd[static_cast<size_t>(wr) * K + b * 128];
          for (int k = 0; k < fp8::block_extent(K, b); ++k) block += double(xa[k]) * double(wa[k]);
          sum += block * xs[tok * S + b] * ws[(wr / 128) * kblocks + b];
        }
        ref[c] = sum;
      }
      double row_err2[2] = {0, 0}, row_ref2[2] = {0, 0};
      for (int c = 0; c < kN; ++c) {
        const int half = c / kHalf;
        const double got = out[(static_cast<size_t>(t) * kM + r) * kN + c];
        if (!std::isfinite(got)) ++nan[half];
        row_err2[half] += (got - ref[c]) * (got - ref[c]);
        row_ref2[half] += ref[c] * ref[c];
      }
      for (int half = 0; half < 2; ++half) {
        err2[half] += row_err2[half], ref2[half] += row_ref2[half];
        const double rel = std::sqrt(row_err2[half] / std::max(row_ref2[half], 1e-300));
        if (!(rel <= worst[half])) worst[half] = rel, worst_row[half] = r;
        if (!(rel <= kRow)) {
          if (++bad_rows[half] <= 8) bad_list[half].append(1, ' ').append(std::to_string(r));
          if (first_bad_row[half] < 0)
            for (int c = half * kHalf; c < (half + 1) * kHalf; ++c) {
              const double got = out[(static_cast<size_t>(t) * kM + r) * kN + c];
              if (!(std::fabs(got - ref[c]) <= 1e-3 * std::sqrt(row_ref2[half] / kHalf))) {
                first_bad_row[half] = r, first_bad_col[half] = c, first_got[half] = got, first_want[half] = ref[c];
                break;
              }
            }
        }
      }
      // h: the kernel's own h re-quantised on the host (bit for bit), and h against the reference (the
      // decode form stores no h).
      if (swapped) continue;
      double h_err2 = 0, h_ref2 = 0;
      float hrow[kHalf];
      uint8_t qrow[kHalf];
      for (int c = 0; c < kHalf; ++c) {
        hrow[c] = h[(static_cast<size_t>(t) * kM + r) * kHalf + c];
        const double g = ref[c], u = ref[c + kHalf];
        const double want = g / (1.0 + std::exp(-g)) * u;
        h_err2 += (hrow[c] - want) * (hrow[c] - want), h_ref2 += want * want;
      }
      h_worst = std::max(h_worst, std::sqrt(h_err2 / std::max(h_ref2, 1e-300)));
      const float scale = fp8::quantize_tile(hrow, 1, kHalf, kHalf, qrow, kHalf, kHFormat);
      for (int c = 0; c < kHalf; ++c) hcode_diff += qrow[c] != hq[(static_cast<size_t>(t) * kM + r) * kHalf + c];
      hscale_diff += std::memcmp(&scale, &hs[t * kM + r], 4) != 0;
    }
    for (int half = 0; half < 2; ++half) {
      all_err2 += err2[half], all_ref2 += ref2[half];
      nan_total += nan[half];
      const double rel = std::sqrt(err2[half] / std::max(ref2[half], 1e-300));
      const bool hok = nan[half] == 0 && rel <= kOverall && worst[half] <= kRow;
      ok = ok && hok;
      std::printf("%s K=%d tile %d (CTA %d, expert %d, m-block %d, n-block %d, %d rows) %s columns [%d, %d): "
                  "rel %.3g, worst row %d %.3g, non-finite %d",
                  hok ? "ok  " : "FAIL", K, t, t % ctas, d.expert, d.mblock, d.nblock, d.rows,
                  half == 0 ? "gate" : "up  ", half * kHalf, (half + 1) * kHalf, rel, worst_row[half], worst[half],
                  nan[half]);
      if (bad_rows[half] > 0)
        std::printf("; %d rows over %.0e:%s%s; first bad element (row %d, col %d): got %.6g want %.6g (ratio %.4g)",
                    bad_rows[half], kRow, bad_list[half].c_str(), bad_rows[half] > 8 ? " ..." : "", first_bad_row[half],
                    first_bad_col[half], first_got[half], first_want[half], first_got[half] / first_want[half]);
      std::printf("\n");
    }
  }
  const double rel = std::sqrt(all_err2 / all_ref2);
  const bool hok = hcode_diff == 0 && hscale_diff == 0 && (swapped || h_worst <= kH);
  ok = ok && rel <= kOverall && nan_total == 0 && hok;
  std::printf("%s K=%d overall (%d tiles on %d CTAs, %d k-blocks each): rel frob %.3g (bound %.0e), non-finite %d\n",
              ok ? "ok  " : "FAIL", K, ntiles, ctas, kblocks, rel, kOverall, nan_total);
  std::printf("%s K=%d Linear1 epilogue: h codes differing %ld, scales differing %ld (bit for bit vs fp8.h), "
              "worst row of h vs silu(gate) * up %.3g (bound %.0e)\n",
              hok ? "ok  " : "FAIL", K, hcode_diff, hscale_diff, h_worst, kH);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!epfuse::testing::have_gpu()) return epfuse::testing::kSkipped;
  const uint64_t seed = epfuse::testing::test_seed(argc, argv, "test_fp8_tma_tile");
  std::printf("TileGemmTmaFp8<4>: %d threads, %d bytes of dynamic shared memory, registers %d producer / %d math\n",
              Tile::kThreads, Tile::kSmemBytes, Tile::kProducerRegs, Tile::kConsumerRegs);
  bool ok = true;
  try {
    // Expert 0: m-blocks of 128 and 72 rows, experts 1-3: one of 37, 64, 65 (the second math warpgroup
    // runs no MMA in the tiles of 37 and 64 rows), experts 4-8: one of 1, 16, 17, 32, 33 (a decode
    // step's tiles: one or a few warps of real rows); two n-blocks each: 28 tiles on 2 CTAs. K = 128:
    // one k-block; 384: three; 2880: 23, the last a partial block of 64.
    for (int K : {128, 256, 384, 2048, 2880, 7168})
      ok = run_case(K, seed + K, 2, {200, 37, 64, 65, 1, 16, 17, 32, 33}, 256) && ok;
    // The same experts with scales at their extremes (extreme_factor), K = 2048 and 2880 (a partial
    // last block): a scale product formed in another order, or flushed to zero, shows in the sums.
    for (int K : {2048, 2880}) ok = run_case(K, seed + K + 1, 2, {200, 37, 64, 65, 1, 16, 17, 32, 33}, 256, false, false, true) && ok;
    int sms = 0;
    EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    // dsv3-like Linear1 (H = 7168) on every SM: SMs / 4 experts of 1024 rows and 512 gate/up columns,
    // 32 full tiles each, 8 per CTA.
    ok = run_case(7168, seed, sms, std::vector<int>(std::max(1, sms / 4), 1024), 512, true) && ok;
    ok = run_case(7168, seed, sms, std::vector<int>(std::max(1, sms / 4), 1024), 512, true, true) && ok;
    // A decode step's Linear1 tiles (qwen3-30b, H = 2048): SMs / 6 experts of one row and 768 gate/up
    // columns, one tile per CTA (docs/performance.md#the-k-split-of-small-tiles-2026-11-28-not-kept).
    ok = run_case(2048, seed, sms, std::vector<int>(std::max(1, sms / 6), 1), 768, true) && ok;
    // The same tiles' pace a k-block with weights that stay in L2 between launches (8 experts, 25 MB) and
    // few tiles: 48 (qwen3-30b's T = 1 at world 1) and 6, each at K = 2048 and 256, the k-loop alone; the
    // difference over 14 k-blocks is a k-block's time with the weight stream out of the way
    // (docs/performance.md#linear2-as-slices-of-the-linear1-tiles-2026-11-29-not-kept).
    for (int experts : {8, 1})
      for (int K : {2048, 256}) ok = run_case(K, seed, experts * 6, std::vector<int>(experts, 1), 768, true, true) && ok;
    // The decode form (mainloop_swapped<N>: the weights as the MMA's M side, up to N rows as N) at each
    // N it can run: checked against the reference at 1 to N rows and every K kind (one block, several, a
    // partial last block, scales at their extremes).
    for (int tokens : {8, 16, 32}) {
      std::vector<int> rows = {1, 2, 5, 8, 3};
      if (tokens >= 16) rows.insert(rows.end(), {9, 16, 13});
      if (tokens >= 32) rows.insert(rows.end(), {17, 32, 30});
      for (int K : {128, 2048, 2880}) ok = run_case(K, seed + 7 * K + tokens, 2, rows, 256, false, false, false, tokens) && ok;
      ok = run_case(2048, seed + 3 + tokens, 2, {tokens, 1, 4}, 256, false, false, true, tokens) && ok;
    }
    // Paces, weights in L2 (8 experts a tile each, K = 2048 and 256, the k-loop alone): each N at 1 row and
    // at its most rows, and the n64 quarters (the 64-row form the decode kernel runs above N) at the same
    // rows (docs/performance.md#the-decode-form-at-16-rows-2026-11-30).
    for (int K : {2048, 256})
      for (int rows : {1, 8, 16, 32}) {
        for (int tokens : {8, 16, 32})
          if (rows <= tokens) ok = run_case(K, seed, 48, std::vector<int>(8, rows), 768, true, true, false, tokens) && ok;
        if (rows > 1) ok = run_case(K, seed, 48, std::vector<int>(8, rows), 768, true, true, false, 0, true) && ok;
      }
    // The 64-row k-loop in n64 quarters (the decode kernel's tiles of more than kSwappedTokens rows): the same
    // experts as the extreme-scale cases, with ordinary and extreme scales.
    for (int K : {2048, 2880})
      for (bool extreme : {false, true})
        ok = run_case(K, seed + K + 5, 2, {200, 37, 64, 65, 1, 16, 17, 32, 33}, 256, false, false, extreme, 0, true) && ok;
    // Both forms with the weights from HBM: every SM a tile, SMs / 6 experts (67 MB on 132 SMs, more than L2).
    for (int tokens : {0, 8, 16})
      for (int K : {2048, 256})
        ok = run_case(K, seed, sms, std::vector<int>(std::max(1, sms / 6), 1), 768, true, true, false, tokens) && ok;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
