// Microbenchmark (not a test): the fused FP8 kernel's tile (TileGemmTmaFp8<4>, gemm_mainloop_tma_fp8.cuh)
// alone on the layer's own GEMM shapes, to be read beside DeepGEMM's grouped GEMM on the same shapes
// (bench/peers/deepgemm_tile_shape.py --experts E --rows R --n N --k K, in the same job).
// test_fp8_tma_tile's bench lines time the tile on one synthetic shape whose A rows come from a 300-row
// pool in L2; there its k-loop ran at DeepGEMM's rate, on these shapes it does not
// (docs/performance.md#the-tile-alone-on-the-layers-shapes-ping-pong-128x192-and-a-by-tma-2026-11-29-not-kept).
// A grouped GEMM C[rows, N] (bf16) = A[rows, K] * B[e][N, K]^T over e4m3 codes with 1x128 row scales and
// 128x128 weight block scales: the tile's producer and math roles as the fused kernel runs them, A rows
// contiguous in HBM (gathered by cp.async, as the layer gathers its rows), B by TMA, tiles expert-major
// and n-block major within an expert (the fused schedule), the bf16 rows stored from registers by the
// layer's quad-transposed 16-byte stores (fragment_store.cuh); and each shape again without the stores
// ("k-loop only"). Values are checked first against a float64 reference on two small grouped GEMMs
// (several tiles a CTA, partial m-blocks; bf16 output: rel 4e-3 overall, 8e-3 per row).
// Shapes: the per-GPU experts of the world-1 table at even counts: qwen3-30b T=16384's Linear2 and Linear1,
// dsv3 T=4096's Linear1 and Linear2, mixtral T=4096's Linear1 and Linear2.
// Usage: bench_fp8_tile_shapes [seed]                    checks, then bursts (median of 21 launches, each
//                                                        timed alone after 3)
//        bench_fp8_tile_shapes SEED --sustain SHAPE MS   shape SHAPE (0-5) with its stores, launches back to
//                                                        back for MS ms: the rate at the power cap and the
//                                                        joules a launch (the GPU's energy counter, where
//                                                        NVML has one; deepgemm_tile_shape.py --sustain-ms
//                                                        prints DeepGEMM's); sample the clock beside it
//                                                        (scripts/clock_summary.py)
//        bench_fp8_tile_shapes SEED --sustain SHAPE MS DATA   the same on DATA: codes (the default: e4m3
//                                                        codes of uniform values in +-12 for A and +-3 for B,
//                                                        scales 2^-3..2^1), uniform (values uniform in [-1, 1),
//                                                        each 1x128 group of A and 128x128 block of B scaled so
//                                                        that its amax is 448, as the layer's x and weights are
//                                                        quantised) or normal (the same from Gaussian values:
//                                                        deepgemm_tile_shape.py's torch.randn). At the power cap
//                                                        the joules a launch depend on the codes
//                                                        (docs/performance.md#joules-a-launch-and-the-data-2026-11-29).
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "bench/energy.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/fp8.h"
#include "device/gemm/fragment_store.cuh"
#include "device/gemm/gemm_mainloop_tma_fp8.cuh"
#include "device/protocol/regions.h"
#include "device/protocol/task_map.h"
#include "device/ptx/ptx.cuh"
#include "device/ptx/signals.cuh"
#include "fused/tensor_map.h"
#include "standalone.h"
#include "tile_roles.cuh"

namespace {

namespace dev = epfuse::device;
namespace ptx = epfuse::device::ptx;
namespace fp8 = epfuse::fp8;
using DeviceBuffer = epfuse::detail::CudaBuffer<epfuse::detail::MemoryKind::kDevice>;
using Tile = dev::TileGemmTmaFp8<4>;

struct Problem {
  int experts, rows, N, K;  // rows per expert (the same for every expert); N, K per expert
  int kblocks, S;           // K blocks of 128; row-scale stride (fp8_scale_stride)
  const uint8_t* a;         // [experts * rows, K]
  const float* a_scales;    // [experts * rows, S]
  const float* b_scales;    // [experts * N / 128, kblocks]
  __nv_bfloat16* c;         // [experts * rows, N]
  uint32_t* abort;
  uint32_t* error;  // {1 + side (0 producer, 1 math), tile, CTA}
  uint64_t timeout_ns;
  bool kloop_only;
};

struct TileAt {
  int expert, nblock;
  int row0, rows;  // the tile's m-block: its first row of A and C, and its real rows
};
__device__ int num_tiles(const Problem& p) { return p.experts * dev::mblocks_of(p.rows, Tile::kBlockM) * (p.N / Tile::kBlockN); }
// Tile t: expert-major, n-block major within the expert (consecutive tiles share a weight n-block).
__device__ TileAt tile_at(const Problem& p, int t) {
  const int mblocks = dev::mblocks_of(p.rows, Tile::kBlockM), per_expert = mblocks * (p.N / Tile::kBlockN);
  const int e = t / per_expert, j = t % per_expert, mb = j % mblocks;
  return {e, j / mblocks, e * p.rows + mb * Tile::kBlockM, min(Tile::kBlockM, p.rows - mb * Tile::kBlockM)};
}

__device__ void record_failure(const Problem& p, int side, int tile) {
  epfuse::testing::record_ring_failure(p.error, p.abort, side, tile);
}

__global__ void __launch_bounds__(Tile::kThreads, 1) tile_kernel(const __grid_constant__ CUtensorMap bmap, const Problem p) {
  extern __shared__ __align__(1024) char smem[];
  Tile::init(smem);
  const dev::WaitLimit limit{dev::globaltimer_ns() + p.timeout_ns, p.abort};
  const int tiles = num_tiles(p);
  if (threadIdx.x < Tile::kProducerThreads) {
    ptx::setmaxnreg_dec<Tile::kProducerRegs>();
    const int pt = static_cast<int>(threadIdx.x);
    Tile::RingPos pos;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileAt at = tile_at(p, t);
      const int row0 = at.row0, rows = at.rows;
      const uint8_t* a_rows[Tile::kProducerRows];
#pragma unroll
      for (int i = 0; i < Tile::kProducerRows; ++i) {
        const int r = Tile::producer_row(pt, i);
        a_rows[i] = r < rows ? p.a + static_cast<int64_t>(row0 + r) * p.K : nullptr;
      }
      const int sr = Tile::producer_scale_row(pt);
      const float* a_scale = sr < rows ? p.a_scales + static_cast<int64_t>(row0 + sr) * p.S : nullptr;
      const int b0 = at.expert * p.N + at.nblock * Tile::kBlockN;
      const Tile::BOperand b{&bmap, b0, b0 + 128, p.b_scales + static_cast<int64_t>(b0 / 128) * p.kblocks,
                             p.b_scales + static_cast<int64_t>(b0 / 128 + 1) * p.kblocks, false};
      if (!Tile::load_tile(pos, a_rows, a_scale, b, p.K, smem, limit)) {
        record_failure(p, 0, t);
        break;
      }
    }
    ptx::cp_async_wait_all();
  } else {
    ptx::setmaxnreg_inc<Tile::kConsumerRegs>();
    const int ct = static_cast<int>(threadIdx.x) - Tile::kProducerThreads, lane = ct % 32;
    Tile::RingPos pos;
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileAt at = tile_at(p, t);
      const int row0 = at.row0, rows = at.rows;
      Tile::Accum acc;
      if (!Tile::mainloop(pos, p.K, rows, smem, acc, limit)) {
        record_failure(p, 1, t);
        break;
      }
      if (p.kloop_only) {
        epfuse::testing::keep_live(acc.v, p.c);
        continue;
      }
      // FragmentStores::linear2's stores, to rows of C instead of combine slots.
      __nv_bfloat16* c0 = p.c + static_cast<int64_t>(row0) * p.N + at.nblock * Tile::kBlockN;
      dev::store_fragment_rows<Tile::kBlockN, Tile::kBlockN / 32>(
          ct, rows,
          [&](int half, int group, int j) {
            const int reg = 4 * (4 * group + j) + 2 * half;
            return ptx::pack_bf16x2(acc.v[reg], acc.v[reg + 1]);
          },
          [&](int, int row, int group, const uint32_t (&w)[4]) {
            dev::store_chunk(c0 + static_cast<int64_t>(row) * p.N + dev::bf16_quad_chunk_col(lane, group), w);
          });
    }
  }
}

// ---- data: e4m3 codes and scales from a hash, made on the device (GBs of weights at dsv3's shapes) ----
__device__ uint64_t mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}
__device__ float unit(uint64_t seed, uint64_t i) {  // uniform in [-1, 1)
  return static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + i) >> 40) * (2.0f / 16777216.0f) - 1.0f;
}
__global__ void fill_codes(uint8_t* dst, size_t n, uint64_t seed, float range) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    dst[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(range * unit(seed, i), __NV_SATFINITE, __NV_E4M3));
}
__global__ void fill_scales(float* dst, size_t n, uint64_t seed) {  // 2^-3 .. 2^1, not powers of two
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const float u = unit(seed, i);
    dst[i] = exp2f(-1.0f + 2.0f * u) * (1.0f + 0.3f * u * u);
  }
}

// Values for the quantised modes: uniform in [-1, 1), or standard normal (Box-Muller over two hashes).
__device__ float value(uint64_t seed, uint64_t i, bool normal) {
  if (!normal) return unit(seed, i);
  const float u1 = (static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + 2 * i) >> 40) + 0.5f) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(unit(seed, 2 * i + 1));
}
// A: row r's K block kb (one thread each) quantised as one 1x128 group (fp8.h quantize_tile, fp32 scales).
__global__ void fill_quantised_rows(uint8_t* codes, float* scales, int rows, int K, int S, uint64_t seed, bool normal) {
  const int kblocks = K / 128;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < static_cast<int64_t>(rows) * kblocks;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = g / kblocks, kb = g % kblocks, first = r * K + kb * 128;
    float v[128];
    for (int k = 0; k < 128; ++k) v[k] = value(seed, first + k, normal);
    scales[r * S + kb] = fp8::quantize_tile(v, 1, 128, 128, codes + first, 128, epfuse::ScaleFormat::kFp32);
  }
}
// B: one CTA of 128 threads a 128 x 128 block (thread: a row), quantised with the block's amax at 448.
__global__ void fill_quantised_blocks(uint8_t* codes, float* scales, int K, uint64_t seed, bool normal) {
  __shared__ unsigned amax_bits;
  const int kblocks = K / 128, rb = blockIdx.x / kblocks, kb = blockIdx.x % kblocks;
  const int64_t first = (static_cast<int64_t>(rb) * 128 + threadIdx.x) * K + kb * 128;
  if (threadIdx.x == 0) amax_bits = 0;
  __syncthreads();
  float amax = 0;
  for (int k = 0; k < 128; ++k) amax = fmaxf(amax, fabsf(value(seed, first + k, normal)));
  atomicMax(&amax_bits, __float_as_uint(amax));  // non-negative floats order as their bits
  __syncthreads();
  // fp8.h's rule (quantize_tile's, with the block's amax from every row): the scale, then codes of x / scale
  // by one reciprocal.
  const float scale = fp8::group_scale(__uint_as_float(amax_bits), epfuse::ScaleFormat::kFp32), inv = 1.0f / scale;
  for (int k = 0; k < 128; ++k) codes[first + k] = fp8::float_to_e4m3(value(seed, first + k, normal) * inv);
  if (threadIdx.x == 0) scales[static_cast<int64_t>(rb) * kblocks + kb] = scale;
}

enum class Data { kCodes, kUniform, kNormal };

struct Shape {
  const char* name;
  int experts, rows, N, K;
};

// Every real row of C against a float64 sum over the decoded codes times the same scales.
bool check_values(const Shape& sh, const DeviceBuffer& a, const DeviceBuffer& as, const DeviceBuffer& b,
                  const DeviceBuffer& bs, const DeviceBuffer& c, int S) {
  const int M = sh.experts * sh.rows, kblocks = sh.K / 128;
  std::vector<uint8_t> ha(a.bytes()), hb(b.bytes());
  std::vector<float> has(as.bytes() / 4), hbs(bs.bytes() / 4);
  std::vector<uint16_t> hc(c.bytes() / 2);
  EPFUSE_CUDA_CHECK(cudaMemcpy(ha.data(), a.as(), a.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(hb.data(), b.as(), b.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(has.data(), as.as(), as.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(hbs.data(), bs.as(), bs.bytes(), cudaMemcpyDeviceToHost));
  EPFUSE_CUDA_CHECK(cudaMemcpy(hc.data(), c.as(), c.bytes(), cudaMemcpyDeviceToHost));
  double err2 = 0, ref2 = 0, worst = 0;
  long nonfinite = 0;
  int worst_row = -1;
  for (int r = 0; r < M; ++r) {
    double rerr2 = 0, rref2 = 0;
    for (int n = 0; n < sh.N; ++n) {
      const int wr = (r / sh.rows) * sh.N + n;
      double sum = 0;
      for (int kb = 0; kb < kblocks; ++kb) {
        double block = 0;
        for (int k = kb * 128; k < kb * 128 + 128; ++k)
          block += double(fp8::e4m3_to_float(ha[static_cast<size_t>(r) * sh.K + k])) *
                   double(fp8::e4m3_to_float(hb[static_cast<size_t>(wr) * sh.K + k]));
        sum += block * has[static_cast<size_t>(r) * S + kb] * hbs[static_cast<size_t>(wr / 128) * kblocks + kb];
      }
      const uint32_t bits = static_cast<uint32_t>(hc[static_cast<size_t>(r) * sh.N + n]) << 16;
      float got;
      std::memcpy(&got, &bits, 4);
      if (!std::isfinite(got)) ++nonfinite;
      rerr2 += (got - sum) * (got - sum), rref2 += sum * sum;
    }
    err2 += rerr2, ref2 += rref2;
    const double rel = std::sqrt(rerr2 / std::max(rref2, 1e-300));
    if (!(rel <= worst)) worst = rel, worst_row = r;
  }
  const double rel = std::sqrt(err2 / std::max(ref2, 1e-300));
  const bool ok = nonfinite == 0 && rel <= 4e-3 && worst <= 8e-3;
  std::printf("%s check %s (%d rows, N %d, K %d): rel frob %.3g (bound 4e-3), worst row %d %.3g (bound 8e-3), "
              "non-finite %ld\n",
              ok ? "ok  " : "FAIL", sh.name, M, sh.N, sh.K, rel, worst_row, worst, nonfinite);
  return ok;
}

// check: on `ctas` CTAs, values against the reference. Otherwise on every SM: bursts with and without
// the stores, or (sustain_ms > 0) the stores' variant back to back for sustain_ms.
bool run(const Shape& sh, uint64_t seed, bool check, int ctas, double sustain_ms = 0, Data data = Data::kCodes) {
  const int M = sh.experts * sh.rows, kblocks = sh.K / 128, S = dev::fp8_scale_stride(sh.K);
  DeviceBuffer a(static_cast<size_t>(M) * sh.K), as(static_cast<size_t>(M) * S * 4),
      b(static_cast<size_t>(sh.experts) * sh.N * sh.K), bs(static_cast<size_t>(sh.experts) * sh.N / 128 * kblocks * 4),
      c(static_cast<size_t>(M) * sh.N * 2), ctl(16);
  if (data == Data::kCodes) {
    fill_codes<<<1024, 256>>>(a.as<uint8_t>(), a.bytes(), seed, 12.0f);
    fill_codes<<<1024, 256>>>(b.as<uint8_t>(), b.bytes(), seed + 1, 3.0f);
    fill_scales<<<256, 256>>>(as.as<float>(), as.bytes() / 4, seed + 2);
    fill_scales<<<256, 256>>>(bs.as<float>(), bs.bytes() / 4, seed + 3);
  } else {
    EPFUSE_CUDA_CHECK(cudaMemset(as.as(), 0, as.bytes()));  // the stride's padding scales
    fill_quantised_rows<<<1024, 256>>>(a.as<uint8_t>(), as.as<float>(), M, sh.K, S, seed, data == Data::kNormal);
    fill_quantised_blocks<<<sh.experts * sh.N / 128 * kblocks, 128>>>(b.as<uint8_t>(), bs.as<float>(), sh.K, seed + 1,
                                                                       data == Data::kNormal);
  }
  EPFUSE_CUDA_CHECK_LAUNCH();
  EPFUSE_CUDA_CHECK(cudaMemset(ctl.as(), 0, ctl.bytes()));
  const CUtensorMap bmap = epfuse::fused::weight_tensor_map_fp8(b.as<uint8_t>(), static_cast<int64_t>(sh.experts) * sh.N, sh.K,
                                                                Tile::kBoxRows);
  Problem p{};
  p.experts = sh.experts, p.rows = sh.rows, p.N = sh.N, p.K = sh.K, p.kblocks = kblocks, p.S = S;
  p.a = a.as<uint8_t>(), p.a_scales = as.as<float>(), p.b_scales = bs.as<float>(), p.c = c.as<__nv_bfloat16>();
  p.abort = ctl.as<uint32_t>(), p.error = ctl.as<uint32_t>() + 1, p.timeout_ns = 2'000'000'000ull;
  EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(tile_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tile::kSmemBytes));
  const double flops = 2.0 * M * sh.N * static_cast<double>(sh.K);
  auto launch = [&] {
    tile_kernel<<<ctas, Tile::kThreads, Tile::kSmemBytes>>>(bmap, p);
    EPFUSE_CUDA_CHECK_LAUNCH();
  };
  // A device error or a ring wait that ran out fails the shape (it names the side, tile and CTA).
  auto failed = [&](const char* what) {
    uint32_t err[4];
    EPFUSE_CUDA_CHECK(cudaMemcpy(err, ctl.as(), sizeof(err), cudaMemcpyDeviceToHost));
    if (err[1] == 0) return false;
    std::printf("FAIL %s%s: a ring wait ran out (2 s) in the %s of CTA %u at tile %u\n", sh.name, what,
                err[1] == 1 ? "producer" : "math", err[3], err[2]);
    return true;
  };
  bool ok = true;
  for (const bool kloop_only : {false, true}) {
    if ((check || sustain_ms > 0) && kloop_only) break;
    p.kloop_only = kloop_only;
    const char* what = kloop_only ? ", k-loop only" : "";
    EPFUSE_CUDA_CHECK(cudaMemset(c.as(), 0xff, c.bytes()));  // NaN: unwritten rows show
    launch();
    EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
    if (failed(what)) return false;
    if (check) return check_values(sh, a, as, b, bs, c, S);
    cudaEvent_t start, stop;
    EPFUSE_CUDA_CHECK(cudaEventCreate(&start));
    EPFUSE_CUDA_CHECK(cudaEventCreate(&stop));
    if (sustain_ms > 0) {
      float one = 0, total = 0;
      EPFUSE_CUDA_CHECK(cudaEventRecord(start));
      launch();
      EPFUSE_CUDA_CHECK(cudaEventRecord(stop));
      EPFUSE_CUDA_CHECK(cudaEventSynchronize(stop));
      EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&one, start, stop));
      const int n = std::max(1, static_cast<int>(sustain_ms / one));
      std::string why;
      const auto meter = epfuse::bench::EnergyCounter::open(0, &why);
      const double j0 = meter ? meter->joules().value_or(NAN) : NAN;
      EPFUSE_CUDA_CHECK(cudaEventRecord(start));
      for (int i = 0; i < n; ++i) launch();
      EPFUSE_CUDA_CHECK(cudaEventRecord(stop));
      EPFUSE_CUDA_CHECK(cudaEventSynchronize(stop));
      const double j1 = meter ? meter->joules().value_or(NAN) : NAN;
      EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&total, start, stop));
      ok = !failed(" sustained");
      std::string energy = ", no energy counter (" + (why.empty() ? std::string("a read failed") : why) + ")";
      if (std::isfinite(j0) && std::isfinite(j1)) {
        char buf[96];
        std::snprintf(buf, sizeof(buf), ", %.4f J a launch, %.0f W", (j1 - j0) / n, (j1 - j0) / (total * 1e-3));
        energy = buf;
      }
      const char* data_name = data == Data::kCodes ? "codes" : data == Data::kUniform ? "uniform" : "normal";
      std::printf("%s sustained %s (%s data): %d launches back to back, %.4f ms a launch, %.0f TFLOP/s%s\n",
                  ok ? "ok  " : "FAIL", sh.name, data_name, n, total / n, flops / (total / n * 1e-3) / 1e12, energy.c_str());
    } else {
      constexpr int kWarmup = 3, kReps = 21;
      std::vector<float> times(kReps);
      for (int i = -kWarmup; i < kReps; ++i) {
        EPFUSE_CUDA_CHECK(cudaEventRecord(start));
        launch();
        EPFUSE_CUDA_CHECK(cudaEventRecord(stop));
        EPFUSE_CUDA_CHECK(cudaEventSynchronize(stop));
        if (i >= 0) EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&times[i], start, stop));
      }
      std::sort(times.begin(), times.end());
      const double ms = times[kReps / 2];
      ok = !failed(what) && ok;
      std::printf("%s bench %s%s (%d x %d rows, N %d, K %d): %.4f ms (median of %d; p10 %.4f, p90 %.4f), %.0f TFLOP/s\n",
                  ok ? "ok  " : "FAIL", sh.name, what, sh.experts, sh.rows, sh.N, sh.K, ms, kReps, times[kReps / 10],
                  times[kReps * 9 / 10], flops / (ms * 1e-3) / 1e12);
    }
    EPFUSE_CUDA_CHECK(cudaEventDestroy(start));
    EPFUSE_CUDA_CHECK(cudaEventDestroy(stop));
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!epfuse::testing::have_gpu()) return epfuse::testing::kSkipped;
  const uint64_t seed = epfuse::testing::test_seed(argc, argv, "bench_fp8_tile_shapes");
  // The world-1 table's per-GPU experts at even counts (T k / E rows an expert).
  const Shape shapes[] = {{"qwen3-30b T=16384 Linear2", 32, 4096, 2048, 768}, {"qwen3-30b T=16384 Linear1", 32, 4096, 1536, 2048},
                          {"dsv3 T=4096 Linear1", 64, 512, 4096, 7168},       {"dsv3 T=4096 Linear2", 64, 512, 7168, 2048},
                          {"mixtral T=4096 Linear1", 2, 4096, 28672, 4096},   {"mixtral T=4096 Linear2", 2, 4096, 4096, 14336}};
  int sms = 0;
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  bool ok = true;
  try {
    if (argc >= 5 && std::string(argv[2]) == "--sustain") {
      const int i = std::atoi(argv[3]);
      if (i < 0 || i >= static_cast<int>(sizeof(shapes) / sizeof(shapes[0]))) {
        std::printf("FAIL: shape %d: 0 to %zu\n", i, sizeof(shapes) / sizeof(shapes[0]) - 1);
        return 1;
      }
      const std::string data = argc >= 6 ? argv[5] : "codes";
      if (data != "codes" && data != "uniform" && data != "normal") {
        std::printf("FAIL: data %s: codes, uniform or normal\n", data.c_str());
        return 1;
      }
      return run(shapes[i], seed, false, sms, std::atof(argv[4]),
                 data == "codes" ? Data::kCodes : data == "uniform" ? Data::kUniform : Data::kNormal) ? 0 : 1;
    }
    // Values first, on 3 CTAs (several tiles each, the ring wrapping across tiles): experts of 200 rows
    // (a partial m-block of 72) and of 65 rows (the second math warpgroup with one real row).
    ok = run({"check-a", 3, 200, 768, 768}, seed, true, 3) && ok;
    ok = run({"check-b", 2, 65, 512, 1024}, seed + 7, true, 3) && ok;
    ok = run({"check-normal", 2, 130, 256, 512}, seed + 9, true, 3, 0, Data::kNormal) && ok;
    if (!ok) {
      std::printf("FAILED\n");
      return 1;
    }
    for (const Shape& sh : shapes) ok = run(sh, seed, false, sms) && ok;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  return ok ? 0 : 1;
}
