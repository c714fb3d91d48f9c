// A kernel that writes a forward's inputs late: it lets the next kernel on its stream launch at once
// (programmatic dependent launch, common/launch.h), waits on the GPU, and only then copies the inputs
// into place. A fused kernel launched after it whose prologue read x or the routing before its
// grid_dependency_wait would read what was there before (tests/gpu/fused/test_gpu_fused.cpp).
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

namespace epfuse::testing {

// One copy of `bytes` (a multiple of 4, both 4-byte aligned) from src to dst.
struct LateCopy {
  const void* src;
  void* dst;
  size_t bytes;
};

// Loads the kernel now: in the one-GPU mode a kernel loaded lazily at its first launch could wait for
// the other ranks' running kernels (LoopbackWorld on device-synchronising calls). Call before the
// ranks' first forward.
void prepare_late_write();

// On `stream`: lets the next kernel launch, spins delay_us on %globaltimer, then the three copies.
// Checks the launch.
void late_write(const LateCopy (&copies)[3], uint32_t delay_us, cudaStream_t stream);

}  // namespace epfuse::testing
