// The bounded spin every wait of the fused kernel is built on (kernel/wait.cuh adds the kernel's
// policy: the timeout, the error record, the profile). Policy-free, so the GEMM engine's rings
// (gemm/mbarrier_ring.cuh) wait through it without depending on the kernel's parameters.
#pragma once
#include <cstdint>

#include "device/ptx/mbarrier.cuh"
#include "device/ptx/signals.cuh"

namespace epfuse::device {

// What ends a wait besides its condition: the deadline (globaltimer_ns), or the call's abort flag.
struct WaitLimit {
  uint64_t deadline;
  const uint32_t* abort;
};

// Polls done() until it holds (true), the abort flag is raised (false; tested every kAbortEvery polls,
// only when abortable), or the deadline has passed (on_timeout(), then false; the clock is read every
// kClockEvery polls). on_timeout names what the wait was for (report_timeout, errors.cuh), or nothing
// where the caller reports.
struct NoReport {
  __device__ void operator()() const {}
};
template <uint32_t kAbortEvery, uint32_t kClockEvery, class Done, class OnTimeout = NoReport>
__device__ __forceinline__ bool spin_wait(Done done, const WaitLimit& limit, OnTimeout on_timeout = {},
                                          bool abortable = true) {
  static_assert((kAbortEvery & (kAbortEvery - 1)) == 0 && (kClockEvery & (kClockEvery - 1)) == 0, "powers of two");
  for (uint32_t spin = 0;; ++spin) {
    if (done()) return true;
    if ((spin & (kAbortEvery - 1)) == kAbortEvery - 1 && abortable &&
        *reinterpret_cast<const volatile uint32_t*>(limit.abort) != 0)
      return false;
    if ((spin & (kClockEvery - 1)) == kClockEvery - 1 && globaltimer_ns() > limit.deadline) {
      on_timeout();
      return false;
    }
  }
}

// Until the mbarrier at shared address `bar` completes phase `parity` (abort and clock tested every 256
// polls: the barrier usually completes within them).
template <class OnTimeout = NoReport>
__device__ __forceinline__ bool mbar_wait(uint32_t bar, uint32_t parity, const WaitLimit& limit, OnTimeout on_timeout = {}) {
  return spin_wait<256, 256>([&] { return ptx::mbar_try_wait(bar, parity); }, limit, on_timeout);
}

}  // namespace epfuse::device
