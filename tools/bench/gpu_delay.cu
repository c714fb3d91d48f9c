#include "bench/gpu_delay.h"

#include "common/check.h"
#include "device/ptx/signals.cuh"

namespace epfuse::bench {
namespace {

__global__ void delay_kernel(uint64_t ns) {
  const uint64_t end = device::globaltimer_ns() + ns;
  while (device::globaltimer_ns() < end) {
  }
}

}  // namespace

void gpu_delay(cudaStream_t stream, uint32_t microseconds) {
  delay_kernel<<<1, 1, 0, stream>>>(static_cast<uint64_t>(microseconds) * 1000u);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::bench
