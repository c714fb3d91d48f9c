// Internal: a kernel launch that may overlap the previous kernel on its stream (programmatic dependent
// launch, PDL). With `programmatic`, the launch may start as soon as every CTA of the previous kernel
// has issued griddepcontrol.launch_dependents (device/ptx/ptx.cuh launch_dependents) or exited, and the
// kernel must call device::ptx::grid_dependency_wait() before it reads anything an earlier kernel may
// have written: until then it may only set itself up (shared memory, barriers, kernel parameters).
// Without it (or after a copy or memset, or a kernel that never issues launch_dependents), the kernel
// starts after the previous one ends, as an ordinary launch; its wait then returns at once. Stream capture records the dependency as a programmatic graph edge (CUDA 12.3+).
// EPFUSE_PDL (common/env.h programmatic_launch) turns it off.
#pragma once
#include <cstddef>
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

// Lets `kernel` take as much dynamic shared memory as this GPU gives a block (its opt-in limit less the
// kernel's static shared memory), and returns that many bytes. The attribute is the function's, for the
// whole process: set to one layer's need it would fail the launches of another layer, or another thread's,
// that needs more (two layers of different expert counts on one workspace share a kernel).
template <class... Params>
size_t allow_all_dynamic_smem(void (*kernel)(Params...)) {
  cudaFuncAttributes attr{};
  EPFUSE_CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
  int device = 0, optin = 0;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t allowed = static_cast<size_t>(optin) - attr.sharedSizeBytes;
  if (static_cast<size_t>(attr.maxDynamicSharedSizeBytes) < allowed)
    EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(allowed)));
  return allowed;
}

}  // namespace epfuse::detail
