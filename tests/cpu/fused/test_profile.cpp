// CPU tests of the fused kernel's profile summary (src/fused/profile.h): ms per SM, spans from the
// kernel's first start, the MoeLayer phase mapping, means over calls.
#include <gtest/gtest.h>

#include <string>

#include "device/protocol/task_map.h"
#include "fused/profile.h"

namespace epfuse::fused {
namespace {

using device::Phase;

constexpr uint64_t kOrigin = 1'000'000'000'000ull;  // an arbitrary %globaltimer value

// A record as 4 CTAs would leave it: dispatch 8 ms of CTA time (2 of it waiting), linear1 40, combine 4.
device::FusedProfile sample_record() {
  device::FusedProfile r{};
  auto set = [&](Phase p, uint64_t busy_ms, uint64_t wait_ms, uint64_t tasks, uint64_t start_ms, uint64_t end_ms) {
    const int b = static_cast<int>(p);
    r.busy_ns[b] = busy_ms * 1'000'000;
    r.wait_ns[b] = wait_ms * 1'000'000;
    r.tasks[b] = tasks;
    r.first_start_inv[b] = ~(kOrigin + start_ms * 1'000'000);
    r.last_end[b] = kOrigin + end_ms * 1'000'000;
  };
  set(Phase::kLayout, 1, 0, 4, 0, 1);
  set(Phase::kDispatch, 8, 2, 16, 1, 3);
  set(Phase::kLinear1, 40, 4, 64, 2, 12);
  set(Phase::kCombine, 4, 3, 16, 11, 13);
  r.kernel_start_inv = ~kOrigin;
  r.kernel_end = kOrigin + 13'000'000;
  r.cta_ns = 4 * 13'000'000ull;
  r.ctas = 4;
  return r;
}

TEST(FusedProfile, PerSmMillisecondsAndSpans) {
  const ProfileSummary s = summarize_profile(sample_record());
  const PhaseProfile& d = s.phase[static_cast<int>(Phase::kDispatch)];
  EXPECT_DOUBLE_EQ(d.busy_ms, 2.0);  // 8 CTA-ms over 4 CTAs
  EXPECT_DOUBLE_EQ(d.wait_ms, 0.5);
  EXPECT_DOUBLE_EQ(d.tasks, 16);
  EXPECT_DOUBLE_EQ(d.start_ms, 1.0);
  EXPECT_DOUBLE_EQ(d.end_ms, 3.0);
  EXPECT_DOUBLE_EQ(s.kernel_ms, 13.0);
  EXPECT_DOUBLE_EQ(s.sm_ms, 13.0);
  const PhaseProfile& unused = s.phase[static_cast<int>(Phase::kLinear2)];
  EXPECT_EQ(unused.tasks, 0);
  EXPECT_EQ(unused.busy_ms, 0);
  EXPECT_EQ(unused.start_ms, 0);
}

TEST(FusedProfile, LayerPhasesSumTheirTaskKinds) {
  const PhaseTimes t = phase_times_of(summarize_profile(sample_record()));
  EXPECT_FLOAT_EQ(t.dispatch_ms, 0.25f + 2.0f);  // layout + dispatch
  EXPECT_FLOAT_EQ(t.experts_ms, 10.0f);
  EXPECT_FLOAT_EQ(t.combine_ms, 1.0f);
}

TEST(FusedProfile, MeansOverCalls) {
  ProfileSummary sum;
  accumulate_profile(sum, summarize_profile(sample_record()));
  device::FusedProfile twice = sample_record();
  for (int b = 0; b < device::kProfileBuckets; ++b) twice.busy_ns[b] *= 3;
  accumulate_profile(sum, summarize_profile(twice));
  EXPECT_EQ(sum.calls, 2);
  EXPECT_FLOAT_EQ(phase_times_of(sum).experts_ms, 20.0f);  // (10 + 30) / 2
  const std::string table = format_profile(sum);
  EXPECT_NE(table.find("mean of 2 calls"), std::string::npos) << table;
  for (int b = 0; b < device::kProfileBuckets; ++b)
    EXPECT_NE(table.find(profile_bucket_name(b)), std::string::npos) << table;
  EXPECT_NE(table.find("linear1       20.000"), std::string::npos) << table;
}

TEST(FusedProfile, EmptyRecordIsZero) {
  const ProfileSummary s = summarize_profile(device::FusedProfile{});
  EXPECT_EQ(s.kernel_ms, 0);
  EXPECT_EQ(phase_times_of(s).experts_ms, 0.0f);
}

}  // namespace
}  // namespace epfuse::fused
