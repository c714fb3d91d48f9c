#include "unfused/fp8_gemm.h"

#include <cstdio>
#include <limits>
#include <string>

#include "common/check.h"
#include "epfuse/error.h"
#include "unfused/fp8_layout.h"

namespace epfuse::unfused {
namespace {

// A matrix layout for one call, destroyed with it.
class Layout {
 public:
  Layout(cudaDataType type, int64_t rows, int64_t cols, int64_t ld) {
    EPFUSE_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout_, type, static_cast<uint64_t>(rows),
                                                   static_cast<uint64_t>(cols), ld));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout_); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
  operator cublasLtMatrixLayout_t() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

template <typename T>
void set(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  EPFUSE_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

}  // namespace

Fp8Gemm::Fp8Gemm() {
  EPFUSE_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  try {
    set(desc_, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    set(desc_, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    set(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F});
    set(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32_t{CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F});
    EPFUSE_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref_));
  } catch (...) {
    cublasLtMatmulDescDestroy(desc_);
    throw;
  }
}

Fp8Gemm::~Fp8Gemm() {
  if (pref_ != nullptr) cublasLtMatmulPreferenceDestroy(pref_);
  if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
}

void Fp8Gemm::set_workspace(size_t workspace_bytes) {
  if (workspace_bytes == pref_workspace_) return;
  const uint64_t bytes = workspace_bytes;
  EPFUSE_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref_, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
  pref_workspace_ = workspace_bytes;
  algos_.clear();
}

// The cached algorithm for this shape, or the heuristic's first (cached); null when there is none.
const cublasLtMatmulAlgo_t* Fp8Gemm::find_algorithm(cublasLtHandle_t handle, const Fp8GemmArgs& args, int rows,
                                                    cublasLtMatrixLayout_t w_layout, cublasLtMatrixLayout_t a_layout,
                                                    cublasLtMatrixLayout_t c_layout, cublasStatus_t* status) {
  const auto key = std::make_tuple(args.n, args.k, rows, args.lda, args.ldc, static_cast<int>(args.c_type));
  *status = CUBLAS_STATUS_SUCCESS;
  if (const auto it = algos_.find(key); it != algos_.end()) return &it->second;
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  *status = cublasLtMatmulAlgoGetHeuristic(handle, desc_, w_layout, a_layout, c_layout, c_layout, pref_, 1, &result,
                                           &found);
  if (*status != CUBLAS_STATUS_SUCCESS || found == 0) return nullptr;
  return &algos_.emplace(key, result.algo).first->second;
}

bool Fp8Gemm::has_algorithm(cublasLtHandle_t handle, const Fp8GemmArgs& args, int real_rows,
                            size_t workspace_bytes) {
  const int rows = fp8_layout::padded_rows(real_rows);
  set_workspace(workspace_bytes);
  set(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(args.w_scales));
  set(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(args.a_scales));
  const Layout w_layout(CUDA_R_8F_E4M3, args.k, args.n, args.k);
  const Layout a_layout(CUDA_R_8F_E4M3, args.k, rows, args.lda);
  const Layout c_layout(args.c_type, args.n, rows, args.ldc);
  cublasStatus_t status;
  return find_algorithm(handle, args, rows, w_layout, a_layout, c_layout, &status) != nullptr;
}

void Fp8Gemm::run(cublasLtHandle_t handle, const Fp8GemmArgs& args, void* workspace, size_t workspace_bytes,
                  cudaStream_t stream) {
  EPFUSE_REQUIRE(args.n > 0 && args.k > 0 && args.n % 16 == 0 && args.k % 16 == 0 && args.lda >= args.k &&
                     args.lda % 16 == 0 && args.ldc >= args.n && args.ldc % 8 == 0 &&
                     (args.c_type == CUDA_R_16BF || args.c_type == CUDA_R_32F),
                 ErrorCode::kInternal,
                 "Fp8Gemm: bad shape n=" + std::to_string(args.n) + " k=" + std::to_string(args.k) +
                     " lda=" + std::to_string(args.lda) + " ldc=" + std::to_string(args.ldc));
  set_workspace(workspace_bytes);
  const size_t c_bytes = args.c_type == CUDA_R_32F ? sizeof(float) : sizeof(bf16);
  const float alpha = 1.0f, beta = 0.0f;
  int64_t first = 0;
  for (size_t g = 0; g < args.rows.size(); ++g) {
    if (args.rows[g] <= 0) continue;
    const int rows = fp8_layout::padded_rows(args.rows[g]);  // the GEMM's n (fp8_layout.h)
    const uint8_t* w = args.w + static_cast<int64_t>(g) * args.w_expert_stride;
    const float* w_scales = args.w_scales + static_cast<int64_t>(g) * args.w_scale_expert_stride;
    const uint8_t* a = args.a + first * args.lda;
    const float* a_scales = args.a_scales + fp8_layout::act_scale_start(first, args.k);
    void* c = static_cast<uint8_t*>(args.c) + first * args.ldc * static_cast<int64_t>(c_bytes);
    set(desc_, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(w_scales));
    set(desc_, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(a_scales));
    const Layout w_layout(CUDA_R_8F_E4M3, args.k, args.n, args.k);  // W_g^T as col-major k x n, op T
    const Layout a_layout(CUDA_R_8F_E4M3, args.k, rows, args.lda);  // A_g^T: col-major k x rows, op N
    const Layout c_layout(args.c_type, args.n, rows, args.ldc);     // C_g^T: col-major n x rows
    cublasStatus_t status;
    const cublasLtMatmulAlgo_t* algo = find_algorithm(handle, args, rows, w_layout, a_layout, c_layout, &status);
    if (algo == nullptr)
      throw Error(ErrorCode::kUnsupported,
                  "cuBLASLt has no block-scaled FP8 GEMM (e4m3 TN, A BLK128x128_32F, B VEC128_32F, " +
                      std::string(args.c_type == CUDA_R_32F ? "fp32" : "bf16") + " out) for m=" +
                      std::to_string(args.n) + " n=" + std::to_string(rows) +
                      (rows != args.rows[g] ? " (" + std::to_string(args.rows[g]) + " rows padded)" : "") +
                      " k=" + std::to_string(args.k) +
                      " (status " + std::to_string(static_cast<int>(status)) +
                      "; it needs CUDA >= 12.9 and an sm_90 GPU)");
    EPFUSE_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, w, w_layout, a, a_layout, &beta, c, c_layout, c,
                                       c_layout, algo, workspace, workspace_bytes, stream));
    first += rows;
  }
}

}  // namespace epfuse::unfused
