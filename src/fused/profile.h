// Host side of the fused kernel's optional profile (src/device/diagnostics/profile_record.h): the record a launch
// fills, turned into per-phase milliseconds per SM (CTA-ms / CTAs), the phases' spans, and a printable
// table.
// Pure functions: tested on the CPU (tests/cpu/fused/test_profile.cpp).
#pragma once
#include <array>
#include <cstdint>
#include <string>

#include "device/diagnostics/profile_record.h"
#include "epfuse/layer.h"

namespace epfuse::fused {

struct PhaseProfile {
  double busy_ms = 0;   // per SM: CTA-ms in the phase's tasks / CTAs (waits included)
  double wait_ms = 0;   // per SM: the part of busy_ms spent waiting for other CTAs or ranks
  double tasks = 0;
  double start_ms = 0;  // first start, from the kernel's first CTA start
  double end_ms = 0;    // last end, same origin
};

struct ProfileSummary {
  // layout, publish, dispatch, collect, linear1, linear2, combine, schedule (taking ids, the plan wait)
  std::array<PhaseProfile, device::kProfileBuckets> phase{};
  double kernel_ms = 0;  // first CTA start to last CTA end
  double sm_ms = 0;      // per SM: CTA lifetime
  int calls = 0;         // forwards summed (accumulate: means over calls)
};

const char* profile_bucket_name(int bucket);
// One launch's record; ctas = the grid (every CTA reports once).
ProfileSummary summarize_profile(const device::FusedProfile& rec);
// Sums b into a (per-call means are a / a.calls, see format_profile).
void accumulate_profile(ProfileSummary& a, const ProfileSummary& b);
// The MoeLayer phases: dispatch = layout + publish + dispatch + collect, experts = linear1 + linear2,
// combine; each in ms per SM.
PhaseTimes phase_times_of(const ProfileSummary& s);
// A table of the per-call means: one line per phase (ms/SM busy, of it waiting, tasks, span).
std::string format_profile(const ProfileSummary& s);

}  // namespace epfuse::fused
