// Microbenchmark of the fused kernel's GEMM pieces: the grouped expert FFN of grouped_ffn.cuh (Linear1
// + SwiGLU, Linear2) at the per-GPU expert shapes of the bench's seven configs (tools/bench/options.h)
// at world 4 (E/4 local experts, T * 4 * k / E rows per expert, uniform), rows gathered from a pool of
// T * 4 tokens.
// For each config: the heuristic's tile shape (choose_bf16_tile: +) and every
// other shape (mma.sync TileGemm and wgmma TileGemmWgmma), median of 20
// timed runs (cudaEvents, after warm-up), as ms, TFLOP/s and weight bytes read per second.
// Usage: bench_tile_gemm [iters=20]. Not a ctest; exit 77 without a GPU.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/hash.h"
#include "grouped_ffn.cuh"
#include "standalone.h"

namespace {

using epfuse::fused::GemmTileShape;

struct BenchConfig {
  const char* name;
  int H, I, E, topk, tokens_per_rank;
};
constexpr int kWorld = 4;

__global__ void fill_bf16(__nv_bfloat16* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    p[i] = __float2bfloat16(scale * epfuse::detail::uniform_pm1(epfuse::detail::hash_at(seed, epfuse::detail::Stream::kW13, i)));
}

epfuse::detail::DeviceArray<__nv_bfloat16> alloc_random(size_t n, uint64_t seed, float scale) {
  epfuse::detail::DeviceArray<__nv_bfloat16> p(n);
  fill_bf16<<<1024, 256>>>(p.get(), n, seed, scale);
  EPFUSE_CUDA_CHECK_LAUNCH();
  return p;
}

float time_median_ms(const GemmTileShape& shape, const epfuse::test::GroupedFfnArgs& args,
                     const epfuse::test::TilePlan& plan, int num_sms, int phases, int iters) {
  cudaEvent_t start, stop;
  EPFUSE_CUDA_CHECK(cudaEventCreate(&start));
  EPFUSE_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i) epfuse::test::run_grouped_ffn(shape, args, plan, num_sms, nullptr, phases);
  std::vector<float> ms(iters);
  for (int i = 0; i < iters; ++i) {
    EPFUSE_CUDA_CHECK(cudaEventRecord(start));
    epfuse::test::run_grouped_ffn(shape, args, plan, num_sms, nullptr, phases);
    EPFUSE_CUDA_CHECK(cudaEventRecord(stop));
    EPFUSE_CUDA_CHECK(cudaEventSynchronize(stop));
    EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&ms[i], start, stop));
  }
  EPFUSE_CUDA_CHECK(cudaEventDestroy(start));
  EPFUSE_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

void bench_config(const BenchConfig& c, int num_sms, int iters) {
  const int experts = c.E / kWorld;
  const int pool = c.tokens_per_rank * kWorld;
  const int rows_per_expert = static_cast<int>(static_cast<int64_t>(pool) * c.topk / c.E);
  const int rows = experts * rows_per_expert;
  std::vector<int> offset(experts + 1);
  for (int e = 0; e <= experts; ++e) offset[e] = e * rows_per_expert;
  std::vector<int> row_token(rows);
  std::vector<float> row_weight(rows, 0.5f);
  for (int r = 0; r < rows; ++r)
    row_token[r] = static_cast<int>(epfuse::detail::hash_at(7, epfuse::detail::Stream::kRouting, r) % pool);

  epfuse::test::GroupedFfnBuffers dev;
  dev.x_pool = alloc_random(static_cast<size_t>(pool) * c.H, 1, 1.0f);
  dev.w13 = alloc_random(static_cast<size_t>(experts) * 2 * c.I * c.H, 2, 0.03f);
  dev.w2 = alloc_random(static_cast<size_t>(experts) * c.H * c.I, 3, 0.03f);
  dev.row_token = epfuse::test::upload(row_token);
  dev.expert_offset = epfuse::test::upload(offset);
  dev.row_weight = epfuse::test::upload(row_weight);
  dev.h = epfuse::detail::DeviceArray<__nv_bfloat16>(static_cast<size_t>(rows) * c.I);
  dev.out = epfuse::detail::DeviceArray<float>(static_cast<size_t>(rows) * c.H);
  epfuse::test::GroupedFfnArgs args = dev.args(c.H, c.I);
  args.clamp = 0.0f;

  const double flops = 2.0 * rows * 3.0 * c.H * c.I;
  const double weight_bytes = 2.0 * experts * 3.0 * c.H * c.I;
  const GemmTileShape chosen = epfuse::fused::choose_bf16_tile(rows_per_expert, experts, num_sms, c.H, c.I);
  for (const GemmTileShape& shape : epfuse::test::all_tile_shapes()) {
    if (!epfuse::fused::ffn_tile_supports(shape, c.H, c.I)) continue;
    const epfuse::test::TilePlan plan = epfuse::test::make_tile_plan(shape, offset, c.H, c.I);
    const float ms = time_median_ms(shape, args, plan, num_sms, epfuse::test::kBothLinears, iters);
    const float ms1 = time_median_ms(shape, args, plan, num_sms, epfuse::test::kLinear1, iters);
    const float ms2 = time_median_ms(shape, args, plan, num_sms, epfuse::test::kLinear2, iters);
    const bool wgmma = shape.mma == epfuse::fused::GemmMma::kWgmma;
    std::printf("%-9s T=%-5d experts=%-3d rows/expert=%-5d tile=%3dx%dx%d s%d %-8s %s  %7.3f ms  %6.1f TFLOP/s  "
                "%5.2f TB/s weights   (L1 %6.3f ms %6.1f TF/s, L2 %6.3f ms %6.1f TF/s)\n",
                c.name, c.tokens_per_rank, experts, rows_per_expert, shape.block_m, shape.block_n, shape.block_k,
                shape.stages, wgmma ? "wgmma" : "mma.sync", shape == chosen ? "+" : " ", ms, flops / ms * 1e-9, weight_bytes / ms * 1e-9, ms1,
                flops * 2.0 / 3.0 / ms1 * 1e-9, ms2, flops / 3.0 / ms2 * 1e-9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (!epfuse::testing::have_gpu()) return epfuse::testing::kSkipped;
  const int iters = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  try {
    int num_sms = 0;
    EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
    std::printf("grouped expert FFN (Linear1+SwiGLU, Linear2), world 4 per-GPU shapes, %d SMs, median of %d; "
                "+ = choose_bf16_tile\n", num_sms, iters);
    const BenchConfig configs[] = {
        {"dsv3", 7168, 2048, 256, 8, 128},     {"dsv3", 7168, 2048, 256, 8, 1024},
        {"dsv3", 7168, 2048, 256, 8, 4096},    {"qwen3-30b", 2048, 768, 128, 8, 128},
        {"qwen3-30b", 2048, 768, 128, 8, 4096}, {"qwen3-30b", 2048, 768, 128, 8, 16384},
        {"mixtral", 4096, 14336, 8, 2, 4096},
    };
    for (const BenchConfig& c : configs) bench_config(c, num_sms, iters);
    return 0;
  } catch (const std::exception& e) {
    std::printf("FAILED with error: %s\n", e.what());
    return 1;
  }
}
