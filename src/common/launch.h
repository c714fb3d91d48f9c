// Internal: a kernel launch that may overlap the previous kernel on its stream (programmatic dependent
// launch, PDL). With `programmatic`, the launch may start as soon as every CTA of the previous kernel
// has issued griddepcontrol.launch_dependents (device/ptx/ptx.cuh launch_dependents) or exited, and the
// kernel must call device::ptx::grid_dependency_wait() before it reads anything an earlier kernel may
// have written: until then it may only set itself up (shared memory, barriers, kernel parameters).
// Without it (or after a copy or memset, or a kernel that never issues launch_dependents), the kernel
// starts after the previous one ends, as an ordinary launch; its wait then returns at once. Stream capture records the dependency as a programmatic graph edge (CUDA 12.3+).
// EPFUSE_PDL (common/env.h programmatic_launch) turns it off.
#pragma once
#include <utility>

#include <cuda_runtime.h>

#include "common/check.h"

namespace epfuse::detail {

template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem_bytes, cudaStream_t stream,
                   bool programmatic, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = programmatic ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  EPFUSE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::detail
