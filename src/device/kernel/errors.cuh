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

}  // namespace epfuse::device
