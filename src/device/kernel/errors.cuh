// Error recording and the abort flag of the fused kernel. The first error of a call is recorded in
// FusedControl::error ({kind, rank, phase, what, a, b, expected, seen}) and the abort flag raised, which
// ends every wait (wait.cuh) and every CTA's task loop; the host turns the record into an Error.
#pragma once
#include <cstdint>

#include "device/diagnostics/error_record.h"
#include "device/kernel/kernel_params.h"
#include "device/protocol/task_map.h"

namespace epfuse::device {

__device__ __forceinline__ bool aborted(const FusedControl* ctl) {
  return *reinterpret_cast<const volatile uint32_t*>(&ctl->abort) != 0;
}
__device__ __forceinline__ void raise_abort(FusedControl* ctl) {
  atomicExch(&ctl->abort, 1u);
  __threadfence();
}

// First error of the call wins; later ones (usually consequences of the first) are dropped.
__device__ __forceinline__ void record_error(FusedControl* ctl, const ErrorRecord& rec) {
  if (atomicCAS(reinterpret_cast<int*>(&ctl->error.kind), 0, rec.kind) == 0) {
    ctl->error.rank = rec.rank;
    ctl->error.phase = rec.phase;
    ctl->error.what = rec.what;
    ctl->error.a = rec.a;
    ctl->error.b = rec.b;
    ctl->error.expected = rec.expected;
    ctl->error.seen = rec.seen;
    __threadfence();
  }
}

// Names the object a wait is for, for the error record.
struct WaitSite {
  Phase phase;
  WaitKind what;
  int a;
  int b;
};

// A wait ran out of time (wait.cuh): record what it waited for and abort the call, so every other
// wait ends too.
__device__ __forceinline__ void report_timeout(FusedControl* ctl, int rank, const WaitSite& site, uint32_t expected,
                                               uint32_t seen) {
  record_error(ctl, ErrorRecord{static_cast<int32_t>(ErrorKind::kTimeout), rank, static_cast<int32_t>(site.phase),
                                static_cast<int32_t>(site.what), site.a, site.b, expected, seen});
  raise_abort(ctl);
}

// Whether an earlier call on this workspace ended aborted (FusedControl::broken, set by its last CTA).
__device__ __forceinline__ bool workspace_broken(const FusedParams& prm) {
  const auto* ctl = reinterpret_cast<const FusedControl*>(prm.workspace + prm.priv.control);
  return *reinterpret_cast<const volatile uint32_t*>(&ctl->broken) != 0;
}

// y [num_tokens][H] = bf16 NaN (0xFFFF), vectors first, first + step, ...: what a call returns that did
// not finish (the last CTA of an aborted call), and every call on a failed workspace (every CTA a share).
__device__ __forceinline__ void fill_y_with_nan(const FusedParams& prm, int64_t first, int64_t step) {
  const int64_t vectors = static_cast<int64_t>(prm.num_tokens) * prm.dims.hidden / 8;
  int4* y = reinterpret_cast<int4*>(prm.y);
  for (int64_t v = first; v < vectors; v += step) y[v] = int4{-1, -1, -1, -1};
}
__device__ __forceinline__ void fill_y_with_nan(const FusedParams& prm) {
  fill_y_with_nan(prm, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
                  static_cast<int64_t>(gridDim.x) * blockDim.x);
}

// The host's view of a failure without a synchronisation (FusedParams::host_failed, page-locked and
// mapped): the next forward reads it before it launches.
__device__ __forceinline__ void tell_host_failed(const FusedParams& prm) {
  if (prm.host_failed == nullptr) return;
  *reinterpret_cast<volatile uint32_t*>(prm.host_failed) = 1u;
  __threadfence_system();
}

}  // namespace epfuse::device
