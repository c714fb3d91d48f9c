// 1-GPU correctness test of the fused kernel's GEMM pieces: a grouped expert FFN (grouped_ffn.cuh) with
// uneven expert row counts (0, 1, 17, 300, ...), rows gathered from a token pool, Linear1 + SwiGLU (with
// and without clamp, per-row weights) into bf16 h, then Linear2 into fp32, for every tile shape, against
// a float64 CPU reference on fresh random data. Covers the mma.sync TileGemm and the wgmma TileGemmWgmma
// shapes. Exit 0 pass, 1 fail, 77 without a GPU.
// Usage: test_tile_gemm [seed]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "common/hash.h"
#include "grouped_ffn.cuh"
#include "standalone.h"

namespace {

using epfuse::detail::hash_at;
using epfuse::detail::Stream;
using epfuse::detail::uniform_pm1;

struct Case {
  const char* name;
  int H;
  int I;
  std::vector<int> expert_rows;
  int pool_tokens;
};

// Values rounded to bf16, kept as float on the host for the reference.
std::vector<float> random_bf16(uint64_t seed, Stream stream, size_t n, float scale, std::vector<__nv_bfloat16>& dev) {
  std::vector<float> host(n);
  dev.resize(n);
  for (size_t i = 0; i < n; ++i) {
    dev[i] = __float2bfloat16(scale * uniform_pm1(hash_at(seed, stream, i)));
    host[i] = __bfloat162float(dev[i]);
  }
  return host;
}

const char* tile_kind(const epfuse::fused::GemmTileShape& s) {
  return s.mma == epfuse::fused::GemmMma::kWgmma ? "wgmma" : "mma.sync";
}

double swiglu_ref(double gate, double up, double clamp) {
  if (clamp > 0) {
    gate = std::min(gate, clamp);
    up = std::min(std::max(up, -clamp), clamp);
  }
  return gate / (1.0 + std::exp(-gate)) * up;
}

bool run_case(const Case& c, uint64_t seed, int num_sms) {
  const int E = static_cast<int>(c.expert_rows.size());
  const int H = c.H, I = c.I;
  std::vector<int> offset(E + 1, 0);
  for (int e = 0; e < E; ++e) offset[e + 1] = offset[e] + c.expert_rows[e];
  const int rows = offset[E];

  std::vector<__nv_bfloat16> x_dev, w13_dev, w2_dev;
  const std::vector<float> x = random_bf16(seed, Stream::kX, static_cast<size_t>(c.pool_tokens) * H, 1.0f, x_dev);
  const std::vector<float> w13 =
      random_bf16(seed, Stream::kW13, static_cast<size_t>(E) * 2 * I * H, 3.0f / std::sqrt(float(H)), w13_dev);
  const std::vector<float> w2 =
      random_bf16(seed, Stream::kW2, static_cast<size_t>(E) * H * I, 1.0f / std::sqrt(float(I)), w2_dev);
  std::vector<int> row_token(rows);
  std::vector<float> row_weight(rows);
  for (int r = 0; r < rows; ++r) {
    row_token[r] = static_cast<int>(hash_at(seed, Stream::kRouting, r) % c.pool_tokens);
    row_weight[r] = 0.5f * (1.0f + uniform_pm1(hash_at(seed, Stream::kTopkWeight, r)));
  }

  // float64 reference: gate/up once, then h and out for each clamp.
  const double clamps[2] = {0.0, 0.75};
  std::vector<double> gate_up(static_cast<size_t>(rows) * 2 * I);
  for (int e = 0; e < E; ++e)
    for (int r = offset[e]; r < offset[e + 1]; ++r) {
      const float* xr = &x[static_cast<size_t>(row_token[r]) * H];
      for (int n = 0; n < 2 * I; ++n) {
        const float* wr = &w13[(static_cast<size_t>(e) * 2 * I + n) * H];
        double s = 0;
        for (int k = 0; k < H; ++k) s += double(xr[k]) * double(wr[k]);
        gate_up[static_cast<size_t>(r) * 2 * I + n] = s;
      }
    }
  std::vector<double> out_ref[2];
  for (int ci = 0; ci < 2; ++ci) {
    out_ref[ci].assign(static_cast<size_t>(rows) * H, 0.0);
    std::vector<double> h(I);
    for (int e = 0; e < E; ++e)
      for (int r = offset[e]; r < offset[e + 1]; ++r) {
        const double* gu = &gate_up[static_cast<size_t>(r) * 2 * I];
        for (int i = 0; i < I; ++i) h[i] = swiglu_ref(gu[i], gu[I + i], clamps[ci]) * row_weight[r];
        for (int n = 0; n < H; ++n) {
          const float* wr = &w2[(static_cast<size_t>(e) * H + n) * I];
          double s = 0;
          for (int i = 0; i < I; ++i) s += h[i] * double(wr[i]);
          out_ref[ci][static_cast<size_t>(r) * H + n] = s;
        }
      }
  }

  using epfuse::test::upload;
  epfuse::test::GroupedFfnBuffers dev;
  dev.x_pool = upload(x_dev);
  dev.w13 = upload(w13_dev);
  dev.w2 = upload(w2_dev);
  dev.row_token = upload(row_token);
  dev.expert_offset = upload(offset);
  dev.row_weight = upload(row_weight);
  dev.h = epfuse::detail::DeviceArray<__nv_bfloat16>(std::max<size_t>(rows, 1) * I);
  dev.out = epfuse::detail::DeviceArray<float>(std::max<size_t>(rows, 1) * H);
  epfuse::test::GroupedFfnArgs args = dev.args(H, I);

  bool ok = true;
  std::vector<float> out(static_cast<size_t>(rows) * H);
  for (const epfuse::fused::GemmTileShape& shape : epfuse::test::all_tile_shapes()) {
    if (!epfuse::fused::ffn_tile_supports(shape, H, I)) {
      std::printf("SKIP %-10s tile=%dx%dx%d %s: does not tile this problem\n", c.name, shape.block_m, shape.block_n,
                  shape.block_k, tile_kind(shape));
      continue;
    }
    const epfuse::test::TilePlan plan = epfuse::test::make_tile_plan(shape, offset, H, I);
    for (int ci = 0; ci < 2; ++ci) {
      args.clamp = static_cast<float>(clamps[ci]);
      // Poison: 0xff bytes are NaN in bf16 and fp32, so any element left unwritten shows.
      EPFUSE_CUDA_CHECK(cudaMemset(args.h, 0xff, std::max<size_t>(rows, 1) * I * sizeof(__nv_bfloat16)));
      EPFUSE_CUDA_CHECK(cudaMemset(args.out, 0xff, std::max<size_t>(rows, 1) * H * sizeof(float)));
      // A full persistent grid, and a 5-CTA grid where every CTA runs many tiles back to back.
      const int num_ctas = ci == 0 ? num_sms : 5;
      epfuse::test::run_grouped_ffn(shape, args, plan, num_ctas, nullptr);
      EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
      EPFUSE_CUDA_CHECK(cudaMemcpy(out.data(), args.out, out.size() * sizeof(float), cudaMemcpyDeviceToHost));
      double err2 = 0, ref2 = 0;
      size_t nonfinite = 0;
      for (size_t i = 0; i < out.size(); ++i) {
        if (!std::isfinite(out[i])) ++nonfinite;
        const double d = double(out[i]) - out_ref[ci][i];
        err2 += d * d;
        ref2 += out_ref[ci][i] * out_ref[ci][i];
      }
      const double rel = rows == 0 ? 0.0 : std::sqrt(err2 / ref2);
      const bool pass = nonfinite == 0 && rel < 1e-2;
      std::printf("%s %-10s H=%-5d I=%-5d rows=%-4d tile=%dx%dx%d %s clamp=%.2f ctas=%-3d rel_fro=%.3e nonfinite=%zu\n",
                  pass ? "PASS" : "FAIL", c.name, H, I, rows, shape.block_m, shape.block_n, shape.block_k,
                  tile_kind(shape), clamps[ci], num_ctas, rel, nonfinite);
      ok = ok && pass;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (!epfuse::testing::have_gpu()) return epfuse::testing::kSkipped;
  const uint64_t seed = epfuse::testing::test_seed(argc, argv, "test_tile_gemm");
  try {
    int num_sms = 0;
    EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
    const std::vector<Case> cases = {
        {"small", 256, 128, {0, 1, 17, 300, 64, 129, 32, 33}, 400},
        {"medium", 2048, 768, {33, 0, 128, 5, 200}, 512},
        {"dsv3-like", 7168, 2048, {1, 17, 0}, 64},
        // Several full 128-row m-blocks per expert plus ragged tails: the large-M (wgmma) tiles' regime.
        {"large-m", 1024, 512, {600, 256, 0, 131}, 1024},
    };
    bool ok = true;
    for (size_t i = 0; i < cases.size(); ++i) ok = run_case(cases[i], seed + i, num_sms) && ok;
    std::printf("%s\n", ok ? "ALL PASSED" : "FAILED");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("FAILED with error: %s\n", e.what());
    return 1;
  }
}
