// The out-of-memory injection and the landed host copy of common/device_buffer.h.
#include "common/device_buffer.h"

namespace epfuse::detail {
namespace {

thread_local int t_fail_in = 0;  // allocations until the injected failure (1: the next); 0: none

}  // namespace

void fail_allocation(int n) { t_fail_in = n > 0 ? n : 0; }

bool injected_allocation_failure() {
  if (t_fail_in == 0) return false;
  return --t_fail_in == 0;
}

void copy_to_device_now(void* device, const void* host, size_t bytes) {
  if (bytes == 0) return;
  EPFUSE_CUDA_CHECK(cudaMemcpy(device, host, bytes, cudaMemcpyHostToDevice));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(nullptr));
}

}  // namespace epfuse::detail
