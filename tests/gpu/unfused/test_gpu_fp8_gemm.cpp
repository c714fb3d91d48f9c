// The FP8 expert GEMM unit (src/unfused/fp8_gemm.h: cuBLASLt block-scaled FP8, one GEMM per expert)
// against a float64 host GEMM on the same codes and scales, with non-uniform scales, uneven and empty
// groups, row counts that are not multiples of 16 (each expert's GEMM runs on its rows padded to 16:
// fp8_layout.h; the padding rows hold zero codes with scale 1, as the layer writes them) and k-block
// counts that are not multiples of 4 (the cuBLASLt scale layouts of fp8_layout.h: padded weight block
// rows, token-fastest activation scales per expert with the padded row count as leading dimension).
// The output is poisoned (NaN) with guard rows past the padded rows: every real row must be written,
// every padding row written with zeros, and the guard rows left alone.
// When the result is wrong, the test also evaluates the other plausible readings of the same scale
// memory and says which one cuBLASLt's output matches, so one GPU run settles the layout (1 GPU).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "common/fp8.h"
#include "epfuse/error.h"
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
  std::vector<int> rows;  // per expert, real rows
  int n, k;
};

// Scale of weight element (expert g, row, col) and of activation element (expert g, local row, col),
// under one reading of the scale memory.
using WeightScale = std::function<float(int g, int row, int col)>;
using ActScale = std::function<float(int g, int local, int col)>;

constexpr int kGuardRows = 16;  // poisoned output rows past the padded ones: nothing may write them

void run_case_or_throw(const Shape& s, uint32_t seed, cudaDataType_t c_type) {
  const bool fp32 = c_type == CUDA_R_32F;
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> code(0, 255);
  std::uniform_real_distribution<float> scale(0.25f, 4.0f);
  const int experts = static_cast<int>(s.rows.size());
  const int kb = fp8::num_blocks(s.k), kb4 = fp8_layout::padded_k_blocks(s.k), nb = fp8::num_blocks(s.n);
  // The padded layout (fp8_layout.h): expert g's GEMM rows [padded[g], padded[g + 1]), its real rows
  // the first s.rows[g] of them; scales [kb, padded rows] from act_scale_start(padded[g], k).
  std::vector<int32_t> first(experts + 1), padded(experts + 1);
  fp8_layout::fill_row_map(s.rows.data(), experts, first.data(), padded.data());
  const int total = padded[experts];
  const auto gemm_rows = [&](int g) { return padded[g + 1] - padded[g]; };
  const auto scale_start = [&](int g) { return fp8_layout::act_scale_start(padded[g], s.k); };
  // Codes: any finite e4m3 (NaN codes 0x7f/0xff replaced by 0).
  const auto random_code = [&] {
    auto c = static_cast<uint8_t>(code(rng));
    return (c & 0x7f) == 0x7f ? uint8_t{0} : c;
  };
  std::vector<uint8_t> a(static_cast<size_t>(total) * s.k, 0);  // padding rows: zero codes
  std::vector<float> a_scales(static_cast<size_t>(std::max<int64_t>(fp8_layout::act_scale_start(total, s.k), 1)),
                              1.0f);  // padding rows: scale 1
  for (int g = 0; g < experts; ++g)
    for (int r = 0; r < s.rows[g]; ++r) {
      for (int i = 0; i < s.k; ++i) a[size_t(padded[g] + r) * s.k + i] = random_code();
      for (int b = 0; b < kb; ++b)
        a_scales[fp8_layout::act_scale_offset(scale_start(g), gemm_rows(g), r, b)] = scale(rng);
    }
  std::vector<uint8_t> w(static_cast<size_t>(experts) * s.n * s.k);
  for (auto& c : w) c = random_code();
  std::vector<float> w_scales(static_cast<size_t>(experts) * nb * kb4);
  for (auto& v : w_scales) v = scale(rng);

  detail::DeviceBuffer a_dev = upload(a), w_dev = upload(w), as_dev = upload(a_scales), ws_dev = upload(w_scales);
  const int64_t ldc = s.n;
  const size_t c_bytes = fp32 ? sizeof(float) : sizeof(bf16);
  const size_t c_rows = static_cast<size_t>(total) + kGuardRows;
  detail::DeviceBuffer c_dev(c_rows * ldc * c_bytes);
  detail::DeviceBuffer workspace(kCublasWorkspaceBytes);
  cublasLtHandle_t handle;
  EPFUSE_CUBLAS_CHECK(cublasLtCreate(&handle));
  cudaStream_t stream;
  EPFUSE_CUDA_CHECK(cudaStreamCreate(&stream));
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(c_dev.as(), 0xff, c_dev.bytes(), stream));  // NaN: unwritten shows
  std::string gemm_error;
  {
    Fp8Gemm gemm;
    try {
      gemm.run(handle,
               {.rows = s.rows, .n = s.n, .k = s.k, .a = a_dev.as<uint8_t>(), .lda = s.k,
                .a_scales = as_dev.as<float>(), .w = w_dev.as<uint8_t>(), .w_expert_stride = int64_t{s.n} * s.k,
                .w_scales = ws_dev.as<float>(), .w_scale_expert_stride = int64_t{nb} * kb4, .c = c_dev.as(),
                .ldc = ldc, .c_type = c_type},
               workspace.as(), workspace.bytes(), stream);
    } catch (const Error& e) {
      gemm_error = e.what();
    }
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));  // the GEMMs enqueued so far, with gemm alive
  }
  std::vector<uint8_t> raw(c_rows * ldc * c_bytes);
  EPFUSE_CUDA_CHECK(cudaMemcpy(raw.data(), c_dev.as(), raw.size(), cudaMemcpyDeviceToHost));
  cublasLtDestroy(handle);
  cudaStreamDestroy(stream);
  if (!gemm_error.empty()) throw std::runtime_error(gemm_error);
  const auto c_at = [&](size_t row, int col) -> double {
    const size_t i = row * ldc + col;
    return fp32 ? reinterpret_cast<const float*>(raw.data())[i]
                : __bfloat162float(reinterpret_cast<const bf16*>(raw.data())[i]);
  };

  // Padding rows: computed from zero codes, so written as zeros; guard rows: untouched (all 0xff).
  int64_t pad_unwritten = 0, pad_nonzero = 0, guard_written = 0;
  for (int g = 0; g < experts; ++g)
    for (int r = s.rows[g]; r < gemm_rows(g); ++r)
      for (int col = 0; col < s.n; ++col) {
        const double v = c_at(size_t(padded[g] + r), col);
        if (std::isnan(v))
          ++pad_unwritten;
        else if (v != 0.0)
          ++pad_nonzero;
      }
  for (size_t i = size_t(total) * ldc * c_bytes; i < raw.size(); ++i) guard_written += raw[i] != 0xff ? 1 : 0;

  // The relative error of the GPU result's real rows against the float64 GEMM under a reading of the scales.
  const auto error_under = [&](const WeightScale& sw, const ActScale& sa, int64_t* unwritten) {
    double err2 = 0, ref2 = 0;
    for (int g = 0; g < experts; ++g)
      for (int r = 0; r < s.rows[g]; ++r)
        for (int col = 0; col < s.n; ++col) {
          double ref = 0;
          for (int i = 0; i < s.k; ++i)
            ref += double(fp8::e4m3_to_float(a[size_t(padded[g] + r) * s.k + i])) * sa(g, r, i) *
                   double(fp8::e4m3_to_float(w[(size_t(g) * s.n + col) * s.k + i])) * sw(g, col, i);
          const double got = c_at(size_t(padded[g] + r), col);
          if (unwritten != nullptr && std::isnan(got)) ++*unwritten;
          err2 += (got - ref) * (got - ref);
          ref2 += ref * ref;
        }
    return ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  };
  // The layouts fp8_layout.h documents.
  const WeightScale w_doc = [&](int g, int row, int col) {
    return w_scales[size_t(g) * nb * kb4 + size_t(row / 128) * kb4 + col / 128];
  };
  const ActScale a_doc = [&](int g, int local, int col) {
    return a_scales[fp8_layout::act_scale_offset(scale_start(g), gemm_rows(g), local, col / 128)];
  };
  int64_t unwritten = 0;
  const double err = error_under(w_doc, a_doc, &unwritten);
  std::printf("[fp8 gemm] %s out, n=%d k=%d rows/expert", fp32 ? "fp32" : "bf16", s.n, s.k);
  for (int r : s.rows) std::printf(" %d", r);
  std::printf(" (padded %d): rel err %.3e vs the documented scale layouts, %lld unwritten; padding rows %lld "
              "unwritten, %lld nonzero; %lld guard bytes written\n",
              total, err, (long long)unwritten, (long long)pad_unwritten, (long long)pad_nonzero,
              (long long)guard_written);
  EXPECT_EQ(unwritten, 0);
  EXPECT_EQ(pad_unwritten, 0);
  EXPECT_EQ(pad_nonzero, 0);
  EXPECT_EQ(guard_written, 0);
  // bf16 output of fp32 sums: ~2^-9 relative per element; fp32 output: the sums' own error (FP8 tensor
  // cores accumulate within a 128-K block at reduced precision before cuBLASLt's fp32 promotion).
  const double bound = fp32 ? 1e-3 : 1e-2;
  EXPECT_LT(err, bound);
  if (err < bound || first[experts] == 0) return;

  // Wrong: which reading of the same memory does cuBLASLt's output follow?
  const std::vector<std::pair<std::string, WeightScale>> w_readings = {
      {"weights [nb][kb padded to 4] (documented)", w_doc},
      {"weights [nb][kb] unpadded",
       [&](int g, int row, int col) { return w_scales[size_t(g) * nb * kb4 + size_t(row / 128) * kb + col / 128]; }},
      {"weights [kb][nb] (n-block fastest)",
       [&](int g, int row, int col) { return w_scales[size_t(g) * nb * kb4 + size_t(col / 128) * nb + row / 128]; }},
  };
  const std::vector<std::pair<std::string, ActScale>> a_readings = {
      {"activations [kb][padded rows] (documented)", a_doc},
      {"activations [padded rows][kb] (token-major)",
       [&](int g, int local, int col) { return a_scales[scale_start(g) + size_t(local) * kb + col / 128]; }},
      {"activations [kb][real rows] (leading dimension the unpadded count)",
       [&](int g, int local, int col) { return a_scales[scale_start(g) + size_t(col / 128) * s.rows[g] + local]; }},
  };
  for (const auto& [wn, wr] : w_readings)
    for (const auto& [an, ar] : a_readings) {
      const double e = error_under(wr, ar, nullptr);
      std::printf("[fp8 gemm]   %s, %s: rel err %.3e%s\n", wn.c_str(), an.c_str(), e,
                  e < bound ? "  <-- cuBLASLt's reading" : "");
    }
}

// One case; a thrown error (no cuBLASLt algorithm, say) fails it and lets the next cases run.
void run_case(const Shape& s, uint32_t seed, cudaDataType_t c_type = CUDA_R_16BF) {
  std::string trace = "n=";
  trace += std::to_string(s.n);
  trace += " k=";
  trace += std::to_string(s.k);
  trace += " rows/expert";
  for (int r : s.rows) {
    trace += ' ';
    trace += std::to_string(r);
  }
  trace += c_type == CUDA_R_32F ? " fp32 out" : " bf16 out";
  SCOPED_TRACE(trace);
  try {
    run_case_or_throw(s, seed, c_type);
  } catch (const std::exception& e) {
    ADD_FAILURE() << e.what();
  }
}

TEST(Fp8Gemm, MatchesFloat64WithBlockScales) {
  run_case({{16}, 256, 256}, 1);                    // one expert, everything aligned
  run_case({{1, 7, 0, 3, 128}, 384, 256}, 2);       // uneven groups, an empty one; n = 3 blocks
  run_case({{5, 0, 33}, 256, 384}, 3);              // k = 3 blocks: weight scale rows padded to 4
  run_case({{2, 9}, 768, 640}, 4);                  // Linear1-like 2I x H with 5 k-blocks
  run_case({{0, 0}, 256, 256}, 5);                  // no rows: nothing runs
}

// Each expert's GEMM runs on its rows padded to 16 (cuBLASLt 13.0 had no algorithm otherwise): one
// expert of each count, then the counts uneven across experts, empty ones between.
TEST(Fp8Gemm, RowCountsPaddedTo16) {
  uint32_t seed = 10;
  for (int rows : {1, 7, 16, 27, 128}) run_case({{rows}, 384, 256}, seed++);
  run_case({{27, 1, 0, 128, 7, 16, 0}, 384, 256}, seed++);
  run_case({{0, 7, 1, 27}, 256, 2048}, seed++);     // k = 2048 (16 k-blocks), the first expert empty
  run_case({{1, 27}, 2048, 768}, seed++);           // Linear2-like H x I of qwen3-30b (6 k-blocks)
}

// fp32 output, as the FP8 chain's Linear1 writes it (gate and up before SwiGLU).
TEST(Fp8Gemm, Fp32Output) {
  run_case({{1, 7, 0, 3, 128}, 768, 256}, 6, CUDA_R_32F);
  run_case({{5, 33}, 256, 384}, 7, CUDA_R_32F);
  run_case({{27, 1, 16, 0, 7}, 1536, 256}, 8, CUDA_R_32F);
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
