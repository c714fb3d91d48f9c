#include "bench/stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

TEST(Stats, PercentilesInterpolateLikeNumpy) {
  const std::vector<double> v{10, 3, 7, 1, 9, 2, 8, 4, 6, 5};  // 1..10, shuffled
  const Summary s = summarize(v);
  EXPECT_EQ(s.count, 10u);
  EXPECT_DOUBLE_EQ(s.median, 5.5);
  EXPECT_DOUBLE_EQ(s.p10, 1.9);  // numpy.percentile(range(1, 11), 10)
  EXPECT_DOUBLE_EQ(s.p90, 9.1);
  EXPECT_DOUBLE_EQ(s.min, 1);
  EXPECT_DOUBLE_EQ(s.max, 10);
  EXPECT_DOUBLE_EQ(s.mean, 5.5);
  EXPECT_DOUBLE_EQ(percentile(v, 0.0), 1);
  EXPECT_DOUBLE_EQ(percentile(v, 1.0), 10);
  const std::vector<double> odd{4, 1, 3};
  EXPECT_DOUBLE_EQ(percentile(odd, 0.5), 3);
}

TEST(Stats, SingleSampleAndErrors) {
  const std::vector<double> one{2.5};
  const Summary s = summarize(one);
  EXPECT_DOUBLE_EQ(s.p10, 2.5);
  EXPECT_DOUBLE_EQ(s.p90, 2.5);
  EXPECT_THROW(summarize(std::vector<double>{}), Error);
  EXPECT_THROW(percentile(one, 1.5), Error);
}

TEST(Stats, MaxOverRanksTakesTheSlowestRankPerIteration) {
  // 3 ranks x 4 iterations, rank-major.
  const std::vector<double> ms{1, 5, 3, 2, /**/ 4, 1, 3, 1, /**/ 2, 2, 9, 0};
  EXPECT_EQ(max_over_ranks(ms, 3), (std::vector<double>{4, 5, 9, 2}));
  EXPECT_EQ(max_over_ranks(ms, 1), ms);
  EXPECT_THROW(max_over_ranks(ms, 5), Error);
}

TEST(Stats, SustainedFiguresFromElapsedTimeAndEnergy) {
  const SustainedFigures f = sustained_figures(1500.0, 500, 1050.0);  // 500 calls in 1.5 s, 1050 J
  EXPECT_DOUBLE_EQ(f.ms_per_call, 3.0);
  EXPECT_DOUBLE_EQ(f.joules_per_call, 2.1);
  EXPECT_DOUBLE_EQ(f.watts, 700.0);
  const SustainedFigures no_counter = sustained_figures(10.0, 4, std::nan(""));
  EXPECT_DOUBLE_EQ(no_counter.ms_per_call, 2.5);
  EXPECT_TRUE(std::isnan(no_counter.joules_per_call));
  EXPECT_TRUE(std::isnan(no_counter.watts));
  EXPECT_THROW(sustained_figures(0.0, 4, 1.0), Error);
  EXPECT_THROW(sustained_figures(1.0, 0, 1.0), Error);
}

TEST(Stats, SustainedCallsCoverTheTargetWithAFloorOfTen) {
  EXPECT_EQ(sustained_calls(1500.0, 2.9), 518);  // ceil(517.2)
  EXPECT_EQ(sustained_calls(1500.0, 3.0), 500);
  EXPECT_EQ(sustained_calls(10.0, 5.0), 10);     // 2 would do: at least 10
  EXPECT_EQ(sustained_calls(1e9, 1e-3), 1000000);
  EXPECT_THROW(sustained_calls(0.0, 1.0), Error);
  EXPECT_THROW(sustained_calls(100.0, 0.0), Error);
}

}  // namespace
}  // namespace epfuse::bench
