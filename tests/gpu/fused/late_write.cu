#include "late_write.h"

#include "common/check.h"
#include "device/ptx/ptx.cuh"
#include "device/ptx/signals.cuh"

namespace epfuse::testing {
namespace {

struct Copies {
  LateCopy c[3];
};

__global__ void late_write_kernel(Copies copies, uint64_t delay_ns) {
  device::ptx::launch_dependents();
  if (threadIdx.x == 0) {
    const uint64_t end = device::globaltimer_ns() + delay_ns;
    while (device::globaltimer_ns() < end) {
    }
  }
  __syncthreads();
  for (const LateCopy& c : copies.c) {
    const uint32_t* src = static_cast<const uint32_t*>(c.src);
    uint32_t* dst = static_cast<uint32_t*>(c.dst);
    for (size_t i = threadIdx.x; i < c.bytes / 4; i += blockDim.x) dst[i] = src[i];
  }
}

}  // namespace

void prepare_late_write() {
  cudaFuncAttributes attr{};
  EPFUSE_CUDA_CHECK(cudaFuncGetAttributes(&attr, late_write_kernel));
}

void late_write(const LateCopy (&copies)[3], uint32_t delay_us, cudaStream_t stream) {
  Copies all{};
  for (int i = 0; i < 3; ++i) all.c[i] = copies[i];
  late_write_kernel<<<1, 256, 0, stream>>>(all, static_cast<uint64_t>(delay_us) * 1000u);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::testing
