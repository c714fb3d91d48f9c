// How the fused kernel reaches its peers: every peer access and cross-rank signal takes its address
// from a transport (the signals themselves are the release/acquire operations of signals.cuh on those
// addresses). One type per transport, chosen when the kernel is instantiated (fused_kernel.cu), so the
// loops never branch on it:
//   LsaTransport:      one process per GPU; rank r's window through NCCL's LSA (NVLink) mapping.
//   LoopbackTransport: every rank in one process on one GPU (LoopbackWorld in epfuse/communicator.h);
//                      rank r's window is slice r of one allocation, at slices + r * stride.
#pragma once
#include <cstddef>

#include <nccl_device.h>

#include "device/kernel_params.h"

namespace epfuse::device {

struct LsaTransport {
  __device__ __forceinline__ static void* peer(const FusedParams& prm, int rank, size_t offset) {
    return ncclGetPeerPointer(prm.window, offset, rank);
  }
  __device__ __forceinline__ static void* local(const FusedParams& prm, size_t offset) {
    return ncclGetLocalPointer(prm.window, offset);
  }
};

struct LoopbackTransport {
  __device__ __forceinline__ static void* peer(const FusedParams& prm, int rank, size_t offset) {
    return prm.loopback.slices + static_cast<size_t>(rank) * prm.loopback.stride + offset;
  }
  __device__ __forceinline__ static void* local(const FusedParams& prm, size_t offset) {
    return peer(prm, prm.rank, offset);
  }
};

}  // namespace epfuse::device
