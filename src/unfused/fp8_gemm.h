// The FP8 expert GEMM of the unfused chain: one cuBLASLt block-scaled FP8 GEMM per non-empty expert
// (e4m3 in, fp32 accumulation with cuBLASLt's per-128-K scale promotion, bf16 or fp32 out). Every
// expert's GEMM runs on its row count padded to a multiple of 16 (fp8_layout.h: cuBLASLt has no
// algorithm otherwise), p_g = padded_rows(rows[g]), the experts' rows packed at padded offsets. For
// every expert g with rows[g] > 0, with row-major matrices:
//   C_g[p_g, n] = (A_g * sa_g)[p_g, k] * (W_g * sw_g)[n, k]^T
//   A_g = a + first_g * lda (codes),  sa_g = a_scales + act_scale_start(first_g, k) (VEC128, [kb, p_g]),
//   W_g = w + g * w_expert_stride (codes, row stride k),
//   sw_g = w_scales + g * w_scale_expert_stride (BLK128x128, fp8_layout.h),
//   C_g = c + first_g * ldc,  first_g = p_0 + ... + p_{g-1}.
// The caller gives A's padded rows (local rows rows[g] .. p_g - 1) finite codes and scales (zeros
// with scale 1: their C rows are then zeros); they are computed and written like the real rows, and
// the caller never reads them. a holds (first_G) rows, c as many (G = rows.size()).
// cuBLASLt in column-major terms, as the bf16 GEMM (grouped_gemm.h): "TN", cuBLAS's A = W (its m = n,
// scale mode BLK128x128_32F), its B = the tokens (its n = p_g, scale mode VEC128_32F); "TN" is the
// only FP8 layout Hopper runs. Requirements (cuBLAS docs, FP8 block scaling on sm_90): k and n
// multiples of 16, pointers and leading dimensions 16-byte aligned, compute 32F, no fast accumulation.
// The algorithm comes from cublasLtMatmulAlgoGetHeuristic, cached per (n, k, p_g, lda, ldc); a shape
// with no algorithm is an Error(kUnsupported) naming the shape (has_algorithm asks without throwing).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <tuple>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "epfuse/types.h"

namespace epfuse::unfused {

struct Fp8GemmArgs {
  std::span<const int> rows;  // per expert, real rows (the GEMMs run on padded_rows of each)
  int n = 0, k = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const float* a_scales = nullptr;
  const uint8_t* w = nullptr;
  int64_t w_expert_stride = 0;  // bytes from one expert's W to the next
  const float* w_scales = nullptr;
  int64_t w_scale_expert_stride = 0;  // floats from one expert's W scales to the next
  void* c = nullptr;  // c_type elements
  int64_t ldc = 0;
  cudaDataType_t c_type = CUDA_R_16BF;  // or CUDA_R_32F
};

class Fp8Gemm {
 public:
  Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;
  ~Fp8Gemm();

  // Enqueues the GEMMs on `stream` with the given workspace (256-byte aligned).
  void run(cublasLtHandle_t handle, const Fp8GemmArgs& args, void* workspace, size_t workspace_bytes,
           cudaStream_t stream);

  // Whether cuBLASLt has an algorithm for one expert's GEMM of `rows` rows (padded as run pads them)
  // with these arguments (the pointers only need to be valid device addresses; nothing runs).
  bool has_algorithm(cublasLtHandle_t handle, const Fp8GemmArgs& args, int rows, size_t workspace_bytes);

 private:
  const cublasLtMatmulAlgo_t* find_algorithm(cublasLtHandle_t handle, const Fp8GemmArgs& args, int rows,
                                             cublasLtMatrixLayout_t w_layout, cublasLtMatrixLayout_t a_layout,
                                             cublasLtMatrixLayout_t c_layout, cublasStatus_t* status);
  void set_workspace(size_t workspace_bytes);

  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatmulPreference_t pref_ = nullptr;
  size_t pref_workspace_ = 0;
  std::map<std::tuple<int, int, int, int64_t, int64_t, int>, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace epfuse::unfused
