// Host side of the fused kernel: its launch shape per GEMM tile shape, the one-time attribute setup
// (returns CTAs per SM that fit), and the launch itself (one per forward).
#pragma once
#include <cstddef>

#include <cuda_runtime.h>

#include "device/kernel/kernel_params.h"
#include "epfuse/communicator.h"
#include "fused/heuristics.h"

namespace epfuse::fused {

struct KernelShape {
  int threads;
  size_t smem_bytes;  // dynamic shared memory per CTA
};

KernelShape fused_kernel_shape(const GemmTileShape& tile, const device::FusedDims& dims);
// Sets the kernel's smem limit and returns how many of its CTAs fit on one SM (0: none; the grid
// must be co-resident, or the waits between CTAs would deadlock).
int prepare_fused_kernel(Transport transport, const GemmTileShape& tile, const device::FusedDims& dims);
// Ranks of comm that reach each other's windows through LSA (NVLink) pointers.
int lsa_team_size(ncclComm_t comm);
// One instantiation per (tile shape, transport): the transport is a compile-time choice in the kernel.
// programmatic: the launch may overlap the previous kernel's tail (common/launch.h; EPFUSE_PDL).
void launch_fused_kernel(Transport transport, const GemmTileShape& tile, const device::FusedParams& prm, int grid,
                         bool programmatic, cudaStream_t stream);

}  // namespace epfuse::fused
