// Bounded waits and error recording. Every wait of the fused kernel polls one 32-bit word until a
// predicate holds, this rank's abort flag is raised, or the deadline (FusedParams::timeout_ns) passes;
// on timeout it records {rank, phase, what, expected, seen} and raises the abort flag, so every other
// CTA leaves its wait too and the kernel ends. The host turns the record into Error(kTimeout).
#pragma once
#include <cstdint>

#include "device/error_record.h"
#include "device/kernel_params.h"
#include "device/profile.cuh"
#include "device/signals.cuh"
#include "device/task_map.h"
#include "device/thread_group.cuh"

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

// One thread polls load() until done(value). Returns false (after recording a timeout when the
// deadline passed) when the wait was abandoned. The deadline is the timeout, or twice it for a wait
// behind another wait (waits_behind_a_wait). `abortable` = false only for waits that must finish
// even after a peer failed (a rank still publishes its counts so its peers learn about errors).
template <class Load, class Done>
__device__ bool bounded_wait(const FusedParams& prm, FusedControl* ctl, const WaitSite& site, uint32_t expected,
                             Load load, Done done, bool abortable = true) {
  const uint64_t deadline = globaltimer_ns() + (waits_behind_a_wait(site.what) ? 2 : 1) * prm.timeout_ns;
  for (uint32_t spin = 0;; ++spin) {
    const uint32_t v = load();
    if (done(v)) return true;
    if (abortable && aborted(ctl)) return false;
    if ((spin & 63u) == 63u && globaltimer_ns() > deadline) {
      record_error(ctl, ErrorRecord{static_cast<int32_t>(ErrorKind::kTimeout), prm.rank,
                                    static_cast<int32_t>(site.phase), static_cast<int32_t>(site.what), site.a,
                                    site.b, expected, v});
      raise_abort(ctl);
      return false;
    }
  }
}

// The group waits on its leader's bounded_wait; every thread of it gets the result.
template <class Load, class Done>
__device__ bool group_wait(const ThreadGroup& g, const FusedParams& prm, FusedControl* ctl, const WaitSite& site,
                           uint32_t expected, Load load, Done done, bool abortable = true) {
  __shared__ int ok;  // one group at a time: the CTA before the GEMM region, its producer warps in it
  g.sync();  // `ok` may still be read from a previous wait
  if (g.leader()) {
    // Only a whole CTA's wait stalls its task; the GEMM region's producer waits ahead of the math warps.
    const bool profiled = prm.profile != nullptr && g.barrier == 0;
    const uint64_t start = profiled ? globaltimer_ns() : 0;
    ok = bounded_wait(prm, ctl, site, expected, load, done, abortable) ? 1 : 0;
    if (profiled) profile_add_wait(globaltimer_ns() - start);
  }
  g.sync();
  return ok != 0;
}
template <class Load, class Done>
__device__ bool cta_wait(const FusedParams& prm, FusedControl* ctl, const WaitSite& site, uint32_t expected,
                         Load load, Done done, bool abortable = true) {
  return group_wait(ThreadGroup::cta(), prm, ctl, site, expected, load, done, abortable);
}

}  // namespace epfuse::device
