#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "common/job.h"
#include "epfuse/error.h"

namespace epfuse::tools {
namespace {

TEST(SampleRows, AllRowsWhenSmallOrAsked) {
  EXPECT_TRUE(sample_rows(0, 0).empty());
  EXPECT_EQ(sample_rows(1, 0), (std::vector<int>{0}));
  EXPECT_EQ(sample_rows(3, 0), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(sample_rows(kAllRowsUpTo, 0).size(), static_cast<size_t>(kAllRowsUpTo));
  EXPECT_EQ(sample_rows(5, 100), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(SampleRows, SpreadDistinctWithFirstAndLast) {
  for (int T : {kAllRowsUpTo + 1, 100, 128, 4096, 16384}) {
    for (int want : {0, 2, 5, 32, 64}) {
      std::vector<int> rows = sample_rows(T, want);
      size_t n = static_cast<size_t>(want > 0 ? want : kSampledRows);
      ASSERT_EQ(rows.size(), n) << "T=" << T << " want=" << want;
      EXPECT_EQ(rows.front(), 0);
      EXPECT_EQ(rows.back(), T - 1);
      for (size_t i = 1; i < rows.size(); ++i) EXPECT_LT(rows[i - 1], rows[i]);
      // Spread: no gap much larger than the even step.
      int step = (T - 1) / static_cast<int>(n - 1);
      for (size_t i = 1; i < rows.size(); ++i) EXPECT_LE(rows[i] - rows[i - 1], step + 1);
    }
  }
  EXPECT_EQ(sample_rows(10, 1), (std::vector<int>{0}));
}

TEST(CallSeed, DistinctPerCallAndDeterministic) {
  std::set<uint64_t> seen;
  for (int call = 0; call < 1000; ++call) seen.insert(call_seed(42, call));
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(call_seed(42, 7), call_seed(42, 7));
  EXPECT_NE(call_seed(42, 0), call_seed(43, 0));
  EXPECT_NE(call_seed(42, 0), 42u);
}

TEST(TokenCounts, FixedPlanRepeatsWithoutVary) {
  TokenPlan plan{{128, 0, 7, 1}, false, 128};
  for (int call : {0, 1, 50}) EXPECT_EQ(token_counts_for_call(plan, 4, 9, call, false), plan.per_rank);
  // With --vary the first call keeps the requested counts; later ones are fresh, in range.
  EXPECT_EQ(token_counts_for_call(plan, 4, 9, 0, true), plan.per_rank);
  std::set<std::vector<int>> distinct;
  for (int call = 1; call < 40; ++call) {
    std::vector<int> c = token_counts_for_call(plan, 4, 9, call, true);
    ASSERT_EQ(c.size(), 4u);
    for (int t : c) {
      EXPECT_GE(t, 0);
      EXPECT_LE(t, 128);
    }
    EXPECT_EQ(c, token_counts_for_call(plan, 4, 9, call, true));  // every rank computes the same
    distinct.insert(c);
  }
  EXPECT_GT(distinct.size(), 30u);
}

TEST(TokenCounts, RandomPlanIsFixedPerRunUnlessVary) {
  TokenPlan plan{{}, true, 64};
  std::vector<int> first = token_counts_for_call(plan, 3, 5, 0, false);
  ASSERT_EQ(first.size(), 3u);
  for (int t : first) EXPECT_LE(t, 64);
  EXPECT_EQ(token_counts_for_call(plan, 3, 5, 9, false), first);
  EXPECT_NE(token_counts_for_call(plan, 3, 5, 1, true), token_counts_for_call(plan, 3, 5, 2, true));
}

TEST(TokenCounts, WrongRankCountThrows) {
  TokenPlan plan{{1, 2}, false, 2};
  EXPECT_THROW(token_counts_for_call(plan, 3, 1, 0, false), Error);
}

TEST(CountUnwritten, PoisonAndNaNCountedNotFiniteValues) {
  std::vector<bf16> y(6);
  const uint16_t bits[] = {0xFFFF, 0x7FC0, 0x3F80 /*1.0*/, 0x0000, 0x7F80 /*+inf*/, 0xFF81 /*NaN*/};
  for (size_t i = 0; i < y.size(); ++i) std::memcpy(static_cast<void*>(&y[i]), &bits[i], 2);
  EXPECT_EQ(count_unwritten(y), 3);
  EXPECT_EQ(count_unwritten({}), 0);
}

}  // namespace
}  // namespace epfuse::tools
