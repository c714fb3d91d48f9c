// The FP8 expert GEMM unit (src/unfused/fp8_gemm.h: cuBLASLt block-scaled FP8, one GEMM per expert)
// against a float64 host GEMM on the same codes and scales, with non-uniform scales, uneven and empty
// groups, row counts that are not multiples of 4 and k-block counts that are not (the cuBLASLt scale
// layouts of fp8_layout.h: padded weight block rows, token-fastest activation scales per expert).
// When the result is wrong, the test also evaluates the other plausible readings of the same scale
// memory and says which one cuBLASLt's output matches, so one GPU run settles the layout (1 GPU).
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "common/fp8.h"
#include "unfused/fp8_gemm.h"
#include "unfused/fp8_layout.h"
#include "unfused/grouped_gemm.h"

namespace epfuse::unfused {
namespace {

template <class T>
detail::DeviceBuffer upload(const std::vector<T>& host) {
  detail::DeviceBuffer dev(std::max<size_t>(host.size(), 1) * sizeof(T));
  if (!host.empty())
    EPFUSE_CUDA_CHECK(cudaMemcpy(dev.as(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return dev;
}

struct Shape {
  std::vector<int> rows;  // per expert
  int n, k;
};

// Scale of weight element (expert g, row, col) and of activation element (expert g, local row, col),
// under one reading of the scale memory.
using WeightScale = std::function<float(int g, int row, int col)>;
using ActScale = std::function<float(int g, int local, int col)>;

void run_case(const Shape& s, uint32_t seed, cudaDataType_t c_type = CUDA_R_16BF) {
  const bool fp32 = c_type == CUDA_R_32F;
  SCOPED_TRACE("n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) + (fp32 ? " fp32 out" : " bf16 out"));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<float> scale(0.25f, 4.0f);
  const int experts = static_cast<int>(s.rows.size());
  const int kb = fp8::num_blocks(s.k), kb4 = fp8_layout::padded_k_blocks(s.k), nb = fp8::num_blocks(s.n);
  int total = 0;
  std::vector<int64_t> scale_start(experts);
  int64_t at = 0;
  for (int g = 0; g < experts; ++g) {
    scale_start[g] = at;
    at += fp8_layout::act_scale_region(s.rows[g], s.k);
    total += s.rows[g];
  }
  // Codes: any finite e4m3 (NaN codes 0x7f/0xff replaced by 0).
  const auto random_codes = [&](size_t count) {
    std::vector<uint8_t> v(count);
    for (auto& c : v) {
      c = static_cast<uint8_t>(code(rng));
      if ((c & 0x7f) == 0x7f) c = 0;
    }
    return v;
  };
  const std::vector<uint8_t> a = random_codes(static_cast<size_t>(total) * s.k);
  const std::vector<uint8_t> w = random_codes(static_cast<size_t>(experts) * s.n * s.k);
  std::vector<float> a_scales(static_cast<size_t>(std::max<int64_t>(at, 1)));
  for (auto& v : a_scales) v = scale(rng);
  std::vector<float> w_scales(static_cast<size_t>(experts) * nb * kb4);
  for (auto& v : w_scales) v = scale(rng);

  detail::DeviceBuffer a_dev = upload(a), w_dev = upload(w), as_dev = upload(a_scales), ws_dev = upload(w_scales);
  const int64_t ldc = s.n;
  const size_t c_bytes = fp32 ? sizeof(float) : sizeof(bf16);
  detail::DeviceBuffer c_dev(static_cast<size_t>(std::max(total, 1)) * ldc * c_bytes);
  detail::DeviceBuffer workspace(kCublasWorkspaceBytes);
  cublasLtHandle_t handle;
  EPFUSE_CUBLAS_CHECK(cublasLtCreate(&handle));
  cudaStream_t stream;
  EPFUSE_CUDA_CHECK(cudaStreamCreate(&stream));
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(c_dev.as(), 0xff, c_dev.bytes(), stream));  // NaN: unwritten shows
  Fp8Gemm gemm;
  gemm.run(handle,
           {.rows = s.rows, .n = s.n, .k = s.k, .a = a_dev.as<uint8_t>(), .lda = s.k, .a_scales = as_dev.as<float>(),
            .a_scale_start = scale_start, .w = w_dev.as<uint8_t>(), .w_expert_stride = int64_t{s.n} * s.k,
            .w_scales = ws_dev.as<float>(), .w_scale_expert_stride = int64_t{nb} * kb4, .c = c_dev.as(),
            .ldc = ldc, .c_type = c_type},
           workspace.as(), workspace.bytes(), stream);
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint8_t> raw(static_cast<size_t>(total) * ldc * c_bytes);
  if (!raw.empty()) EPFUSE_CUDA_CHECK(cudaMemcpy(raw.data(), c_dev.as(), raw.size(), cudaMemcpyDeviceToHost));
  std::vector<double> c(static_cast<size_t>(total) * ldc);
  for (size_t i = 0; i < c.size(); ++i)
    c[i] = fp32 ? reinterpret_cast<const float*>(raw.data())[i]
                : __bfloat162float(reinterpret_cast<const bf16*>(raw.data())[i]);
  cublasLtDestroy(handle);
  cudaStreamDestroy(stream);

  // The relative error of the GPU result against the float64 GEMM under a reading of the scales.
  const auto error_under = [&](const WeightScale& sw, const ActScale& sa, int64_t* unwritten) {
    double err2 = 0, ref2 = 0;
    int first = 0;
    for (int g = 0; g < experts; ++g) {
      for (int r = 0; r < s.rows[g]; ++r)
        for (int col = 0; col < s.n; ++col) {
          double ref = 0;
          for (int i = 0; i < s.k; ++i)
            ref += double(fp8::e4m3_to_float(a[size_t(first + r) * s.k + i])) * sa(g, r, i) *
                   double(fp8::e4m3_to_float(w[(size_t(g) * s.n + col) * s.k + i])) * sw(g, col, i);
          const double got = c[size_t(first + r) * ldc + col];
          if (unwritten != nullptr && std::isnan(got)) ++*unwritten;
          err2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
        }
      first += s.rows[g];
    }
    return ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  };
  // The layouts fp8_layout.h documents.
  const WeightScale w_doc = [&](int g, int row, int col) {
    return w_scales[size_t(g) * nb * kb4 + size_t(row / 128) * kb4 + col / 128];
  };
  const ActScale a_doc = [&](int g, int local, int col) {
    return a_scales[fp8_layout::act_scale_offset(scale_start[g], s.rows[g], local, col / 128)];
  };
  int64_t unwritten = 0;
  const double err = error_under(w_doc, a_doc, &unwritten);
  std::printf("[fp8 gemm] %s out, n=%d k=%d rows/expert", fp32 ? "fp32" : "bf16", s.n, s.k);
  for (int r : s.rows) std::printf(" %d", r);
  std::printf(": rel err %.3e vs the documented scale layouts, %lld unwritten\n", err, (long long)unwritten);
  EXPECT_EQ(unwritten, 0);
  // bf16 output of fp32 sums: ~2^-9 relative per element; fp32 output: the sums' own error (FP8 tensor
  // cores accumulate within a 128-K block at reduced precision before cuBLASLt's fp32 promotion).
  const double bound = fp32 ? 1e-3 : 1e-2;
  EXPECT_LT(err, bound);
  if (err < bound || total == 0) return;

  // Wrong: which reading of the same memory does cuBLASLt's output follow?
  const std::vector<std::pair<std::string, WeightScale>> w_readings = {
      {"weights [nb][kb padded to 4] (documented)", w_doc},
      {"weights [nb][kb] unpadded",
       [&](int g, int row, int col) { return w_scales[size_t(g) * nb * kb4 + size_t(row / 128) * kb + col / 128]; }},
      {"weights [kb][nb] (n-block fastest)",
       [&](int g, int row, int col) { return w_scales[size_t(g) * nb * kb4 + size_t(col / 128) * nb + row / 128]; }},
  };
  const std::vector<std::pair<std::string, ActScale>> a_readings = {
      {"activations [kb][rows] (documented)", a_doc},
      {"activations [rows][kb] (token-major)",
       [&](int g, int local, int col) { return a_scales[scale_start[g] + size_t(local) * kb + col / 128]; }},
      {"activations [kb][rows rounded up to 4]",
       [&](int g, int local, int col) {
         return a_scales[scale_start[g] + size_t(col / 128) * ((s.rows[g] + 3) / 4 * 4) + local];
       }},
  };
  for (const auto& [wn, wr] : w_readings)
    for (const auto& [an, ar] : a_readings) {
      const double e = error_under(wr, ar, nullptr);
      std::printf("[fp8 gemm]   %s, %s: rel err %.3e%s\n", wn.c_str(), an.c_str(), e,
                  e < bound ? "  <-- cuBLASLt's reading" : "");
    }
}

TEST(Fp8Gemm, MatchesFloat64WithBlockScales) {
  run_case({{16}, 256, 256}, 1);                    // one expert, everything aligned
  run_case({{1, 7, 0, 3, 128}, 384, 256}, 2);       // uneven groups, an empty one; n = 3 blocks
  run_case({{5, 0, 33}, 256, 384}, 3);              // k = 3 blocks: weight scale rows padded to 4
  run_case({{2, 9}, 768, 640}, 4);                  // Linear1-like 2I x H with 5 k-blocks
  run_case({{0, 0}, 256, 256}, 5);                  // no rows: nothing runs
}

// fp32 output, as the FP8 chain's Linear1 writes it (gate and up before SwiGLU).
TEST(Fp8Gemm, Fp32Output) {
  run_case({{1, 7, 0, 3, 128}, 768, 256}, 6, CUDA_R_32F);
  run_case({{5, 33}, 256, 384}, 7, CUDA_R_32F);
}

}  // namespace
}  // namespace epfuse::unfused

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices == 0) {
    std::printf("SKIPPED: no GPU\n");
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
