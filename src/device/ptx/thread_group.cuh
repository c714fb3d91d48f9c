// The threads a task runs on. Most CTAs run every task on all their threads (ThreadGroup::cta(), whose
// barrier is __syncthreads). A warp-specialised CTA (fused_kernel.cu) splits from its GEMM phase on into a
// producer warpgroup and the math warpgroups, each synchronising on its own named barrier, so the
// shared task code (scheduler, waits, combine, profile) takes the group it runs on.
#pragma once
#include "device/ptx/ptx.cuh"

namespace epfuse::device {

struct ThreadGroup {
  int first;    // first thread (threadIdx.x)
  int count;    // threads, a multiple of 32
  int barrier;  // 0: __syncthreads (the whole CTA); else a named barrier of `count` threads

  __device__ static ThreadGroup cta() { return {0, static_cast<int>(blockDim.x), 0}; }
  __device__ int rank() const { return static_cast<int>(threadIdx.x) - first; }
  __device__ bool leader() const { return static_cast<int>(threadIdx.x) == first; }
  __device__ int warp() const { return rank() / 32; }
  __device__ int warps() const { return count / 32; }
  __device__ void sync() const {
    if (barrier == 0) __syncthreads(); else ptx::named_barrier_sync(barrier, count);
  }
  // sync(), and true everywhere when pred held in any thread of the group. kConverge: where the code before
  // may leave a warp diverged (a leader's branch), each warp reconverges first and the barrier is the
  // aligned form (ptx::named_barrier_or<true>).
  template <bool kConverge = false>
  __device__ bool sync_or(bool pred) const {
    if constexpr (kConverge) __syncwarp();
    return barrier == 0 ? __syncthreads_or(pred) != 0 : ptx::named_barrier_or<kConverge>(barrier, count, pred);
  }
};

}  // namespace epfuse::device
