#include "bench/gpu_delay.h"

#include "common/check.h"

namespace epfuse::bench {
namespace {

__device__ uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void delay_kernel(uint64_t ns) {
  const uint64_t end = globaltimer_ns() + ns;
  while (globaltimer_ns() < end) {
  }
}

}  // namespace

void gpu_delay(cudaStream_t stream, uint32_t microseconds) {
  delay_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(microseconds) * 1000u);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::bench
