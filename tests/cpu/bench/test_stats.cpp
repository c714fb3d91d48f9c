#include "bench/stats.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace epfuse::bench
