// The expert GEMM of the unfused chain over all local experts (bf16 in and out, fp32 accumulation),
// in a unit of its own so the benchmark can time the same calls alone. Two paths (gemm_path.h): one
// cublasGemmGroupedBatchedEx, or one cublasGemmEx per non-empty expert. For every expert g with
// rows[g] > 0, with row-major matrices:
//   C_g[rows[g], n] = A_g[rows[g], k] * W_g[n, k]^T
//   A_g = a + first_g * lda,  C_g = c + first_g * ldc,  W_g = w + g * w_expert_stride (row stride k),
//   first_g = rows[0] + ... + rows[g-1].
// Experts with no rows are left out of the group list.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "common/device_buffer.h"
#include "epfuse/types.h"
#include "unfused/gemm_path.h"

namespace epfuse::unfused {

// cuBLAS's recommended workspace on Hopper, for the handle that runs these GEMMs (cublasSetWorkspace):
// given once so no call allocates.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

struct GroupedGemmArgs {
  std::span<const int> rows;  // per expert; rows of A and C
  int n = 0, k = 0;
  const bf16* a = nullptr;
  int64_t lda = 0;  // >= k
  const bf16* w = nullptr;
  int64_t w_expert_stride = 0;  // elements from one expert's W to the next (n * k when packed)
  bf16* c = nullptr;
  int64_t ldc = 0;  // >= n
};

// cuBLAS in column-major terms: C_g^T[n, m] = op_T(W_g as col-major k x n) * A_g^T (col-major k x m),
// i.e. "TN" with both operands K-major, the layout cuBLAS's bf16 Hopper kernels are fastest in; the
// weights are cuBLAS's A (its M = n, the larger side in every config) and the tokens its B.
// Grouped path: cuBLAS reads the per-group host arrays at the call but the A/B/C pointer arrays from
// device memory when the GEMM runs, so the pointers are written to pinned memory and uploaded with
// one async copy per call: the host computes them in the same loop that fills the m values cuBLAS
// needs on the host anyway, and a copy costs no more than a kernel that would rebuild them.
// Loop path: plain pointers; cuBLAS picks a kernel per shape (with the handle's workspace).
class GroupedGemm {
 public:
  explicit GroupedGemm(int max_groups);
  GroupedGemm(const GroupedGemm&) = delete;
  GroupedGemm& operator=(const GroupedGemm&) = delete;
  ~GroupedGemm();

  // Enqueues the GEMMs on `stream` by `path` (sets the handle's stream). The grouped path waits on
  // the host only for the previous grouped call's pointer upload, long done in a forward that
  // synchronised since.
  void run(cublasHandle_t handle, const GroupedGemmArgs& args, GemmPath path, cudaStream_t stream);

  int max_groups() const { return max_groups_; }
  size_t device_bytes() const { return 3 * static_cast<size_t>(max_groups_) * sizeof(void*); }

 private:
  void run_grouped(cublasHandle_t handle, const GroupedGemmArgs& args, int groups, cudaStream_t stream);
  void run_loop(cublasHandle_t handle, const GroupedGemmArgs& args);

  int max_groups_;
  detail::PinnedBuffer pinned_pointers_;  // W, A, C pointers of the groups, back to back
  detail::DeviceBuffer device_pointers_;
  cudaEvent_t uploaded_ = nullptr;
  // Host arrays cuBLAS's grouped call reads at the call.
  std::vector<cublasOperation_t> trans_w_, trans_a_;
  std::vector<int> m_, n_, k_, ldw_, lda_, ldc_, group_size_;
  std::vector<float> alpha_, beta_;
};

}  // namespace epfuse::unfused
