// The fused kernel's optional in-kernel profile (FusedParams::profile; null = off, the default): per
// task kind, CTA-nanoseconds inside tasks and inside their waits, the task count, and the first start /
// last end over all CTAs (%globaltimer). A plain struct, filled by the kernel (profile.cuh) and read by
// the host (src/fused/profile.h), which turns it into ms per SM and a per-phase table.
#pragma once
#include <cstdint>

namespace epfuse::device {

// One bucket per Phase (task_map.h) kLayout..kCombine, and one for the scheduler: taking task ids and
// waiting for this call's expert plan (at index Phase::kDone).
inline constexpr int kProfileBuckets = 8;

// Zeroed by the host before the launch; CTAs add into it once, at their end. Minimum starts are kept
// as maxima of ~t so that a zeroed buffer is the neutral element of both.
struct FusedProfile {
  uint64_t busy_ns[kProfileBuckets];          // CTA-ns in tasks of the kind, waits included
  uint64_t wait_ns[kProfileBuckets];          // CTA-ns of those spent in waits (all threads held)
  uint64_t tasks[kProfileBuckets];            // tasks run (scheduler: ids taken)
  uint64_t first_start_inv[kProfileBuckets];  // ~(earliest start)
  uint64_t last_end[kProfileBuckets];         // latest end
  uint64_t kernel_start_inv;                  // ~(earliest CTA start)
  uint64_t kernel_end;                        // latest CTA end
  uint64_t cta_ns;                            // CTA lifetimes, summed
  uint64_t ctas;                              // CTAs that reported
};

}  // namespace epfuse::device
