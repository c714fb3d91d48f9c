// The unfused chain's expert GEMM unit (src/unfused/grouped_gemm.h), both paths (grouped call and
// per-expert loop), against a float64 host GEMM, on random bf16 data with uneven and empty groups
// and padded leading dimensions (1 GPU).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "epfuse/types.h"
#include "unfused/gemm_path.h"
#include "unfused/grouped_gemm.h"

namespace epfuse::unfused {
namespace {

std::vector<bf16> random_bf16(size_t n, float scale, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<bf16> v(n);
  for (auto& x : v) x = __float2bfloat16(dist(rng));
  return v;
}

detail::DeviceBuffer upload(const std::vector<bf16>& host) {
  detail::DeviceBuffer dev(host.size() * sizeof(bf16));
  EPFUSE_CUDA_CHECK(cudaMemcpy(dev.as(), host.data(), dev.bytes(), cudaMemcpyHostToDevice));
  return dev;
}

struct Shape {
  std::vector<int> rows;  // per expert
  int n, k;
  int lda_pad, ldc_pad;  // extra columns in A and C rows (untouched in C)
};

// One call per entry of `call_paths`, on the same unit; the output of the last one is checked.
void run_case(const Shape& s, uint64_t seed, const std::vector<GemmPath>& call_paths) {
  std::string trace;
  for (GemmPath path : call_paths) trace += std::string(to_string(path)) + " ";
  SCOPED_TRACE("paths: " + trace);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  const int experts = static_cast<int>(s.rows.size());
  int64_t total_rows = 0;
  for (int r : s.rows) total_rows += r;
  const int64_t lda = s.k + s.lda_pad, ldc = s.n + s.ldc_pad;
  const auto a = random_bf16(static_cast<size_t>(total_rows * lda), 1.0f, rng);
  const auto w = random_bf16(static_cast<size_t>(experts) * s.n * s.k, 1.0f / std::sqrt(float(s.k)), rng);
  detail::DeviceBuffer a_dev = upload(a), w_dev = upload(w);
  detail::DeviceBuffer c_dev(static_cast<size_t>(std::max<int64_t>(total_rows, 1) * ldc) * sizeof(bf16));

  cublasHandle_t handle;
  EPFUSE_CUBLAS_CHECK(cublasCreate(&handle));
  detail::DeviceBuffer workspace(kCublasWorkspaceBytes);  // as in the layer: the loop's kernels may use it
  EPFUSE_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace.as(), workspace.bytes()));
  cudaStream_t stream;
  EPFUSE_CUDA_CHECK(cudaStreamCreate(&stream));
  GroupedGemm gemm(experts);
  std::vector<bf16> c(static_cast<size_t>(total_rows * ldc));
  // Several calls on the same unit: the pointer staging is reused between them.
  for (GemmPath path : call_paths) {
    EPFUSE_CUDA_CHECK(cudaMemsetAsync(c_dev.as(), 0xff, c_dev.bytes(), stream));  // NaN: unwritten shows
    gemm.run(handle,
             {.rows = s.rows, .n = s.n, .k = s.k, .a = a_dev.as<bf16>(), .lda = lda, .w = w_dev.as<bf16>(),
              .w_expert_stride = int64_t{s.n} * s.k, .c = c_dev.as<bf16>(), .ldc = ldc},
             path, stream);
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  EPFUSE_CUDA_CHECK(cudaMemcpy(c.data(), c_dev.as(), c.size() * sizeof(bf16), cudaMemcpyDeviceToHost));

  double err2 = 0, ref2 = 0;
  int64_t unwritten = 0, padding_touched = 0, first = 0;
  for (int e = 0; e < experts; ++e) {
    for (int64_t r = first; r < first + s.rows[e]; ++r) {
      for (int col = 0; col < s.n; ++col) {
        double ref = 0;
        for (int i = 0; i < s.k; ++i)
          ref += double(__bfloat162float(a[r * lda + i])) *
                 double(__bfloat162float(w[(static_cast<size_t>(e) * s.n + col) * s.k + i]));
        const float got = __bfloat162float(c[r * ldc + col]);
        if (std::isnan(got)) {
          ++unwritten;
          continue;
        }
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
      }
      for (int64_t col = s.n; col < ldc; ++col) {
        uint16_t bits;
        std::memcpy(&bits, &c[r * ldc + col], sizeof(bits));
        padding_touched += bits != 0xffff;
      }
    }
    first += s.rows[e];
  }
  EXPECT_EQ(unwritten, 0);
  EXPECT_EQ(padding_touched, 0) << "columns beyond n were written";
  if (total_rows > 0) {
    EXPECT_LT(std::sqrt(err2 / ref2), 1e-2) << "relative Frobenius error";
  }

  cudaStreamDestroy(stream);
  cublasDestroy(handle);
}

// Every case runs on both paths.
class ExpertGemm : public ::testing::TestWithParam<GemmPath> {};

TEST_P(ExpertGemm, UnevenAndEmptyGroups) {
  run_case({.rows = {37, 0, 1, 128, 0, 5, 300, 0}, .n = 256, .k = 384, .lda_pad = 0, .ldc_pad = 0}, 1, {GetParam()});
}

TEST_P(ExpertGemm, LeadingDimensionsAsInTheChain) {
  // Linear2 reads h from the first half of [rows, 2I] rows: lda = 2 * k.
  run_case({.rows = {16, 0, 64, 3}, .n = 256, .k = 128, .lda_pad = 128, .ldc_pad = 0}, 2, {GetParam()});
  run_case({.rows = {9, 40}, .n = 128, .k = 256, .lda_pad = 0, .ldc_pad = 64}, 3, {GetParam()});
}

TEST_P(ExpertGemm, OneHotExpertAndRepeatedCalls) {
  run_case({.rows = {0, 0, 700, 0}, .n = 512, .k = 256, .lda_pad = 0, .ldc_pad = 0}, 4,
           {GetParam(), GetParam(), GetParam()});
}

TEST_P(ExpertGemm, AllGroupsEmptyIsANoOp) {
  run_case({.rows = {0, 0, 0}, .n = 128, .k = 128, .lda_pad = 0, .ldc_pad = 0}, 5, {GetParam(), GetParam()});
}

TEST_P(ExpertGemm, LargeUnevenGroupsWithTails) {
  // Rows not multiples of any tile and an N-tail, where the loop's per-shape kernels differ from the
  // grouped kernel (and may split K through the workspace): the shapes the heuristic loops on.
  run_case({.rows = {513, 0, 1029, 131, 0, 257}, .n = 1000, .k = 512, .lda_pad = 0, .ldc_pad = 24}, 6,
           {GetParam(), GetParam()});
}

TEST_P(ExpertGemm, SkinnyDeepGemm) {
  // Few rows with a long K: what decode asks of a single expert (cuBLAS may choose split-K here).
  run_case({.rows = {3, 16, 0, 1}, .n = 512, .k = 4096, .lda_pad = 0, .ldc_pad = 0}, 7, {GetParam()});
}

INSTANTIATE_TEST_SUITE_P(Paths, ExpertGemm, ::testing::Values(GemmPath::kGrouped, GemmPath::kLoop),
                         [](const ::testing::TestParamInfo<GemmPath>& info) {
                           return std::string(to_string(info.param));
                         });

// Alternating paths on one unit: the grouped path's pointer staging survives a loop call in between.
TEST(ExpertGemmPaths, AlternateOnOneUnit) {
  run_case({.rows = {20, 0, 90}, .n = 256, .k = 256, .lda_pad = 0, .ldc_pad = 0}, 8,
           {GemmPath::kGrouped, GemmPath::kLoop, GemmPath::kGrouped});
  run_case({.rows = {20, 0, 90}, .n = 256, .k = 256, .lda_pad = 0, .ldc_pad = 0}, 9,
           {GemmPath::kLoop, GemmPath::kGrouped, GemmPath::kLoop});
}

}  // namespace
}  // namespace epfuse::unfused

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices < 1) {
    std::printf("SKIPPED: needs 1 GPU, found %d\n", devices);
    return 77;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
