// How the fused kernel reaches its peers: every peer access and cross-rank signal takes its address
// from a transport, and the scope of its release/acquire (signals.cuh) from the transport's kScope.
// One type per transport, chosen when the kernel is launched (fused_kernel.cu with_kernel), so the
// loops never branch on it:
//   LsaTransport:      one process per GPU; rank r's window through NCCL's LSA (NVLink) mapping; .sys
//                      scope, as a peer is another GPU.
//   LocalTransport:    world 1 over NCCL: the LSA window, but every signal stays in this kernel: .gpu
//                      scope. A .sys release waits for the CTA's stores to be visible system-wide,
//                      which behind an SM's queued weight loads takes microseconds
//                      (docs/performance.md#signal-scope).
//   LoopbackTransport: every rank in one process on one GPU (LoopbackWorld in epfuse/communicator.h);
//                      rank r's window is slice r of one allocation, at slices + r * stride. .sys scope:
//                      with .gpu its world-4 bad-input fault run failed 2 of 13 times, a rank's count
//                      message missing for a second; not explained yet.
#pragma once
#include <cstddef>

#include <nccl_device.h>

#include "device/kernel/kernel_params.h"

namespace epfuse::device {

// The scope of the flags and counters between ranks (counts, arrivals, token signals).
enum class SignalScope { kGpu, kSys };

struct LsaTransport {
  static constexpr SignalScope kScope = SignalScope::kSys;
  __device__ __forceinline__ static void* peer(const FusedParams& prm, int rank, size_t offset) {
    return ncclGetPeerPointer(prm.window, offset, rank);
  }
  __device__ __forceinline__ static void* local(const FusedParams& prm, size_t offset) {
    return ncclGetLocalPointer(prm.window, offset);
  }
};

struct LocalTransport : LsaTransport {
  static constexpr SignalScope kScope = SignalScope::kGpu;
};

struct LoopbackTransport {
  static constexpr SignalScope kScope = SignalScope::kSys;
  __device__ __forceinline__ static void* peer(const FusedParams& prm, int rank, size_t offset) {
    return prm.loopback.slices + static_cast<size_t>(rank) * prm.loopback.stride + offset;
  }
  __device__ __forceinline__ static void* local(const FusedParams& prm, size_t offset) {
    return peer(prm, prm.rank, offset);
  }
};

}  // namespace epfuse::device
