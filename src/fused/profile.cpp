#include "fused/profile.h"

#include <cstdio>

#include "device/protocol/task_map.h"

namespace epfuse::fused {

const char* profile_bucket_name(int bucket) {
  static constexpr const char* kNames[device::kProfileBuckets] = {"layout",  "publish", "dispatch", "collect",
                                                                  "linear1", "linear2", "combine",  "schedule"};
  return bucket >= 0 && bucket < device::kProfileBuckets ? kNames[bucket] : "?";
}

ProfileSummary summarize_profile(const device::FusedProfile& rec) {
  ProfileSummary s;
  s.calls = 1;
  if (rec.ctas == 0) return s;
  const double ctas = static_cast<double>(rec.ctas);
  const uint64_t origin = ~rec.kernel_start_inv;
  auto ms = [](double ns) { return ns * 1e-6; };
  for (int b = 0; b < device::kProfileBuckets; ++b) {
    PhaseProfile& p = s.phase[b];
    p.tasks = static_cast<double>(rec.tasks[b]);
    if (rec.tasks[b] == 0) continue;
    p.busy_ms = ms(rec.busy_ns[b] / ctas);
    p.wait_ms = ms(rec.wait_ns[b] / ctas);
    p.start_ms = ms(static_cast<double>(~rec.first_start_inv[b] - origin));
    p.end_ms = ms(static_cast<double>(rec.last_end[b] - origin));
  }
  s.kernel_ms = ms(static_cast<double>(rec.kernel_end - origin));
  s.sm_ms = ms(rec.cta_ns / ctas);
  return s;
}

void accumulate_profile(ProfileSummary& a, const ProfileSummary& b) {
  for (int i = 0; i < device::kProfileBuckets; ++i) {
    a.phase[i].busy_ms += b.phase[i].busy_ms;
    a.phase[i].wait_ms += b.phase[i].wait_ms;
    a.phase[i].tasks += b.phase[i].tasks;
    a.phase[i].start_ms += b.phase[i].start_ms;
    a.phase[i].end_ms += b.phase[i].end_ms;
  }
  a.kernel_ms += b.kernel_ms;
  a.sm_ms += b.sm_ms;
  a.calls += b.calls;
}

PhaseTimes phase_times_of(const ProfileSummary& s) {
  using device::Phase;
  auto busy = [&](Phase p) { return s.phase[static_cast<int>(p)].busy_ms; };
  const double n = s.calls > 0 ? s.calls : 1;
  PhaseTimes t;
  t.dispatch_ms = static_cast<float>((busy(Phase::kLayout) + busy(Phase::kPublish) + busy(Phase::kDispatch) +
                                      busy(Phase::kCollect)) / n);
  t.experts_ms = static_cast<float>((busy(Phase::kLinear1) + busy(Phase::kLinear2)) / n);
  t.combine_ms = static_cast<float>(busy(Phase::kCombine) / n);
  return t;
}

std::string format_profile(const ProfileSummary& s) {
  const double n = s.calls > 0 ? s.calls : 1;
  std::string out;
  char line[192];
  std::snprintf(line, sizeof line,
                "fused profile (mean of %d calls): kernel %.3f ms, CTA lifetime %.3f ms/SM\n"
                "  %-9s %10s %10s %9s %10s %10s\n",
                s.calls, s.kernel_ms / n, s.sm_ms / n, "phase", "ms/SM", "wait ms/SM", "tasks", "first ms", "last ms");
  out += line;
  for (int b = 0; b < device::kProfileBuckets; ++b) {
    const PhaseProfile& p = s.phase[b];
    std::snprintf(line, sizeof line, "  %-9s %10.3f %10.3f %9.0f %10.3f %10.3f\n", profile_bucket_name(b),
                  p.busy_ms / n, p.wait_ms / n, p.tasks / n, p.start_ms / n, p.end_ms / n);
    out += line;
  }
  return out;
}

}  // namespace epfuse::fused
