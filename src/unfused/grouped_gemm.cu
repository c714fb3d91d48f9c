#include "unfused/grouped_gemm.h"

#include <cstdio>
#include <limits>
#include <string>

#include "common/check.h"
#include "epfuse/error.h"

namespace epfuse::unfused {

GroupedGemm::GroupedGemm(int max_groups)
    : max_groups_(max_groups),
      pinned_pointers_(device_bytes()),
      device_pointers_(device_bytes()),
      trans_w_(max_groups, CUBLAS_OP_T),
      trans_a_(max_groups, CUBLAS_OP_N),
      m_(max_groups),
      n_(max_groups),
      k_(max_groups),
      ldw_(max_groups),
      lda_(max_groups),
      ldc_(max_groups),
      group_size_(max_groups, 1),
      alpha_(max_groups, 1.0f),
      beta_(max_groups, 0.0f) {
  EPFUSE_REQUIRE(max_groups > 0, ErrorCode::kInternal,
                 "GroupedGemm: max_groups=" + std::to_string(max_groups) + " must be positive");
  EPFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&uploaded_, cudaEventDisableTiming));
}

GroupedGemm::~GroupedGemm() {
  // The staging memory is freed after this: let a pending upload finish first. Never throws.
  if (cudaEventSynchronize(uploaded_) != cudaSuccess)
    std::fprintf(stderr, "epfuse: GroupedGemm: pending pointer upload failed\n");
  cudaEventDestroy(uploaded_);
}

void GroupedGemm::run(cublasHandle_t handle, const GroupedGemmArgs& args, GemmPath path, cudaStream_t stream) {
  const int experts = static_cast<int>(args.rows.size());
  EPFUSE_REQUIRE(experts <= max_groups_, ErrorCode::kInternal,
                 "GroupedGemm: " + std::to_string(experts) + " experts, sized for " + std::to_string(max_groups_));
  EPFUSE_REQUIRE(args.lda >= args.k && args.ldc >= args.n && args.n > 0 && args.k > 0 &&
                     args.lda <= std::numeric_limits<int>::max() && args.ldc <= std::numeric_limits<int>::max(),
                 ErrorCode::kInternal,
                 "GroupedGemm: bad shape n=" + std::to_string(args.n) + " k=" + std::to_string(args.k) +
                     " lda=" + std::to_string(args.lda) + " ldc=" + std::to_string(args.ldc));
  int groups = 0;
  for (int g = 0; g < experts; ++g) {
    EPFUSE_REQUIRE(args.rows[g] >= 0, ErrorCode::kInternal,
                   "GroupedGemm: expert " + std::to_string(g) + " has " + std::to_string(args.rows[g]) + " rows");
    groups += args.rows[g] > 0;
  }
  if (groups == 0) return;
  EPFUSE_CUBLAS_CHECK(cublasSetStream(handle, stream));
  if (path == GemmPath::kLoop)
    run_loop(handle, args);
  else
    run_grouped(handle, args, groups, stream);
}

void GroupedGemm::run_loop(cublasHandle_t handle, const GroupedGemmArgs& args) {
  const float alpha = 1.0f, beta = 0.0f;
  int64_t first = 0;
  for (size_t g = 0; g < args.rows.size(); ++g) {
    const int rows = args.rows[g];
    if (rows > 0)
      EPFUSE_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, args.n, rows, args.k, &alpha,
                                       args.w + static_cast<int64_t>(g) * args.w_expert_stride, CUDA_R_16BF, args.k,
                                       args.a + first * args.lda, CUDA_R_16BF, static_cast<int>(args.lda), &beta,
                                       args.c + first * args.ldc, CUDA_R_16BF, static_cast<int>(args.ldc),
                                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    first += rows;
  }
}

void GroupedGemm::run_grouped(cublasHandle_t handle, const GroupedGemmArgs& args, int groups, cudaStream_t stream) {
  // The staging area is reused: the previous call's upload must have left it.
  EPFUSE_CUDA_CHECK(cudaEventSynchronize(uploaded_));

  // Pointer arrays W, A, C back to back, so one copy of 3 * groups pointers uploads them.
  const void** w_ptrs = pinned_pointers_.as<const void*>();
  const void** a_ptrs = w_ptrs + groups;
  const void** c_ptrs = w_ptrs + 2 * groups;
  int group = 0;
  int64_t first = 0;
  for (size_t g = 0; g < args.rows.size(); ++g) {
    const int rows = args.rows[g];
    if (rows > 0) {
      m_[group] = args.n;
      n_[group] = rows;
      k_[group] = args.k;
      ldw_[group] = args.k;
      lda_[group] = static_cast<int>(args.lda);
      ldc_[group] = static_cast<int>(args.ldc);
      w_ptrs[group] = args.w + static_cast<int64_t>(g) * args.w_expert_stride;
      a_ptrs[group] = args.a + first * args.lda;
      c_ptrs[group] = args.c + first * args.ldc;
      ++group;
    }
    first += rows;
  }
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(device_pointers_.as(), pinned_pointers_.as(),
                                    3 * static_cast<size_t>(groups) * sizeof(void*), cudaMemcpyHostToDevice, stream));
  EPFUSE_CUDA_CHECK(cudaEventRecord(uploaded_, stream));
  const void** dev_w = device_pointers_.as<const void*>();
  const void** dev_a = dev_w + groups;
  const void** dev_c = dev_w + 2 * groups;

  EPFUSE_CUBLAS_CHECK(cublasGemmGroupedBatchedEx(
      handle, trans_w_.data(), trans_a_.data(), m_.data(), n_.data(), k_.data(), alpha_.data(), dev_w, CUDA_R_16BF,
      ldw_.data(), dev_a, CUDA_R_16BF, lda_.data(), beta_.data(), const_cast<void* const*>(dev_c), CUDA_R_16BF,
      ldc_.data(), groups, group_size_.data(), CUBLAS_COMPUTE_32F));
}

}  // namespace epfuse::unfused
