// The fused kernel's one wait. Every wait, on a flag or counter in global memory or on a shared-memory
// mbarrier, is spin_wait: poll until the condition holds, this rank's abort flag is raised, or the
// deadline passes. The abort flag is the one way out of every wait: a wait that runs out of time
// records what it waited for (report_timeout, errors.cuh) and raises the flag, so every other wait of
// the call ends too and the kernel finishes; the host turns the record into Error(kTimeout).
//   spin_wait     the primitive (the poll, the abort test, the clock), policy-free: ptx/spin_wait.cuh,
//                 with mbar_wait, so that the GEMM engine's rings wait the same way without the kernel
//   bounded_wait  one thread on a 32-bit word, recording by WaitSite on timeout
//   group_wait    a thread group (cta_wait: the CTA) on its leader's bounded_wait
//   cta_wait_words  the CTA on a set of epoch-tagged words (protocol/epoch.h), each thread its share
//   mbar_wait     an mbarrier phase (the GEMM ring's stages, the scheduler's task slots): spin_wait.cuh
//   hang_here     not a wait for anything: EPFUSE_FAULT kind=hang's stop, which ends as a wait does
#pragma once
#include <cstdint>

#include "device/diagnostics/error_record.h"
#include "device/diagnostics/profile.cuh"
#include "device/kernel/errors.cuh"
#include "device/kernel/kernel_params.h"
#include "device/protocol/epoch.h"
#include "device/ptx/signals.cuh"
#include "device/ptx/spin_wait.cuh"
#include "device/ptx/thread_group.cuh"

namespace epfuse::device {

// One thread polls load() until done(value). Returns false (after recording a timeout when the
// deadline passed) when the wait was abandoned. The deadline is the timeout, or twice it for a wait
// behind another wait (waits_behind_a_wait). `abortable` = false only for waits that must finish
// even after a peer failed (a rank still publishes its counts so its peers learn about errors).
template <class Load, class Done>
__device__ bool bounded_wait(const FusedParams& prm, FusedControl* ctl, const WaitSite& site, uint32_t expected,
                             Load load, Done done, bool abortable = true) {
  const WaitLimit limit{globaltimer_ns() + (waits_behind_a_wait(site.what) ? 2 : 1) * prm.timeout_ns, &ctl->abort};
  uint32_t v = 0;
  return spin_wait<1, 64>([&] { return done(v = load()); }, limit,
                          [&] { report_timeout(ctl, prm.rank, site, expected, v); }, abortable);
}

// The group waits on its leader's bounded_wait; every thread of it gets the result.
template <class Load, class Done>
__device__ bool group_wait(const ThreadGroup& g, const FusedParams& prm, FusedControl* ctl, const WaitSite& site,
                           uint32_t expected, Load load, Done done, bool abortable = true) {
  // One group at a time: the CTA before the GEMM phase, a warp-specialised CTA's producer warps after it.
  __shared__ int ok;
  g.sync();  // `ok` may still be read from a previous wait
  if (g.leader()) {
    // Only a whole CTA's wait stalls its task; a warp-specialised CTA's producer waits ahead of its math warps.
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

// The CTA until each of n tagged words (protocol/epoch.h) holds this call's epoch. Every pass each
// thread loads words threadIdx.x, + blockDim.x, ... (load(i)) and hands each current one to take(i,
// value); a word's writer stores it once a call, so a value taken is final (a later pass takes it again,
// the same). Between passes the leader tests the abort flag (when abortable) and the clock; on timeout
// it records site_of(i) of the first word still missing, with the tag that word held. True in every
// thread once all are in, false when the wait was abandoned.
template <class Load, class Take, class SiteOf>
__device__ bool cta_wait_words(const FusedParams& prm, FusedControl* ctl, int n, uint32_t epoch, Load load, Take take,
                               SiteOf site_of, bool abortable = true) {
  __shared__ int missing, stop;
  const bool leader = threadIdx.x == 0;
  const uint64_t start = leader ? globaltimer_ns() : 0;
  for (;;) {
    if (leader) missing = n;
    __syncthreads();  // `missing` and `stop` of the last pass are read
    for (int i = static_cast<int>(threadIdx.x); i < n; i += blockDim.x) {
      const uint64_t w = load(i);
      if (word_is_current(w, epoch)) take(i, word_value(w));
      else atomicMin(&missing, i);
    }
    __syncthreads();
    const int first_missing = missing;
    if (first_missing == n) break;
    if (leader) {
      stop = 0;
      if (abortable && *reinterpret_cast<const volatile uint32_t*>(&ctl->abort) != 0) {
        stop = 1;
      } else if (globaltimer_ns() > start + prm.timeout_ns) {
        report_timeout(ctl, prm.rank, site_of(first_missing), epoch, static_cast<uint32_t>(load(first_missing) >> 32));
        stop = 1;
      }
    }
    __syncthreads();
    if (stop) return false;
  }
  if (leader && prm.profile != nullptr) profile_add_wait(globaltimer_ns() - start);
  return true;
}

// EPFUSE_FAULT kind=hang (common/fault.h): at the point prm.fault_hang names, group g stops making
// progress. Its leader waits for this rank's abort flag (raised when a wait of this rank runs out,
// recording what it waited for) for at most 4x the timeout, twice the longest wait (waits behind a
// wait, the task queue's), so the kernel always ends. True in every thread of g: the call was aborted
// meanwhile and the caller abandons its task; false: no hang here, or the bound passed and the caller
// goes on, late. g is uniform where it is called; elsewhere the cost is one compare of a kernel
// parameter per task.
__device__ __forceinline__ bool hang_here(const FusedParams& prm, FusedControl* ctl, const ThreadGroup& g,
                                          HangPoint at) {
  if (prm.fault_hang != at) return false;
  bool stopped = false;
  if (g.leader()) {
    spin_wait<1, 64>([] { return false; }, WaitLimit{globaltimer_ns() + 4 * prm.timeout_ns, &ctl->abort});
    stopped = aborted(ctl);
  }
  return g.sync_or(stopped);
}

}  // namespace epfuse::device
