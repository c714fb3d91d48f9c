// How the fused kernel reaches its peers: every peer access and cross-rank signal takes its address
// from a transport (the signals themselves are the release/acquire operations of signals.cuh on those
// addresses). One type per transport, chosen when the kernel is instantiated (fused_kernel.cu), so the
// loops never branch on it:
//   LsaTransport:      one process per GPU; rank r's window through NCCL's LSA (NVLink) mapping.
//   LoopbackTransport: every rank in one process on one GPU (LoopbackWorld in epfuse/communicator.h);
//                      rank r's window is slice r of one allocation, at slices + r * stride.
// one_gpu(prm): whether every rank of the call is on this GPU, so that the signals between ranks need
// only .gpu scope (context.cuh peer_release_add and friends).
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
  __device__ __forceinline__ static bool one_gpu(const FusedParams& prm) { return prm.dims.world == 1; }
};

struct LoopbackTransport {
  __device__ __forceinline__ static void* peer(const FusedParams& prm, int rank, size_t offset) {
    return prm.loopback.slices + static_cast<size_t>(rank) * prm.loopback.stride + offset;
  }
  __device__ __forceinline__ static void* local(const FusedParams& prm, size_t offset) {
    return peer(prm, prm.rank, offset);
  }
  __device__ __forceinline__ static bool one_gpu(const FusedParams&) { return true; }
};

}  // namespace epfuse::device
