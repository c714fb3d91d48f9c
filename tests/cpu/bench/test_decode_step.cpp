// The decode step's pure parts (bench/decode_step.h): the weight-set budget, the seeds, the checked
// layers and the float64 RMS-norm the verified replay compares the kernel's norm with.
#include "bench/decode_step.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

constexpr size_t kGB = 1000ull * 1000 * 1000;

// dsv3 FP8 at world 4 (E/R = 64): ~2.82 GB a set. A 141 GB GPU with 130 GB free, 10% kept free and a
// 5.6 GB bf16 scratch reserved: floor((130 - 14.1 - 5.6) / 2.82) = 39 sets.
TEST(DecodeStep, WeightSetsFitTheBudget) {
  const size_t set = 2'820'000'000ull, total = 141 * kGB, free = 130 * kGB, scratch = 5'600'000'000ull;
  EXPECT_EQ(weight_sets_that_fit(free, total, set, scratch, 0.10, 58, 0), 39);
  EXPECT_EQ(weight_sets_that_fit(free, total, set, scratch, 0.10, 58, 8), 8);    // the cap
  EXPECT_EQ(weight_sets_that_fit(free, total, set, scratch, 0.10, 20, 0), 20);   // never more than layers
  EXPECT_EQ(weight_sets_that_fit(free, total, 151'000'000, 0, 0.10, 58, 0), 58);  // qwen3-30b: every layer its own
  EXPECT_EQ(weight_sets_that_fit(free, total, set, 0, 0.0, 58, 0), 46);          // nothing kept free
  EXPECT_EQ(weight_sets_that_fit(10 * kGB, total, set, 0, 0.10, 58, 0), 1);       // less than one: still one
  EXPECT_EQ(weight_sets_that_fit(free, total, set, 0, 0.10, 58, 100), 41);        // a cap above the fit
}

TEST(DecodeStep, SeedsAreDistinctAndSetZeroIsTheRowsWeights) {
  EXPECT_EQ(weight_set_seed(7, 0), 7u);  // layer 0 runs the single layer's weights
  std::set<uint64_t> seen;
  for (int s = 0; s < 64; ++s) seen.insert(weight_set_seed(7, s));
  for (int replay = 0; replay < 2; ++replay)
    for (int l = 0; l < 64; ++l) seen.insert(step_input_seed(7, replay, l));
  EXPECT_EQ(seen.size(), 64u + 128u);
  EXPECT_NE(weight_set_seed(7, 1), weight_set_seed(8, 1));
  EXPECT_EQ(step_input_seed(7, 1, 3), step_input_seed(7, 1, 3));
}

TEST(DecodeStep, CheckedLayersSpreadWithFirstAndLast) {
  EXPECT_EQ(checked_layers(58, 0).size(), 58u);
  EXPECT_EQ(checked_layers(58, 100).size(), 58u);
  EXPECT_EQ(checked_layers(58, 4), (std::vector<int>{0, 19, 38, 57}));
  EXPECT_EQ(checked_layers(58, 1), (std::vector<int>{57}));  // the step's last layer
  EXPECT_EQ(checked_layers(3, 2), (std::vector<int>{0, 2}));
  EXPECT_TRUE(checked_layers(0, 0).empty());
  const std::vector<int> all = checked_layers(5, 0);
  EXPECT_EQ(all, (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(DecodeStep, RmsNormReference) {
  // Rows of H = 4: (1, 1, 1, 1) stays; (2, 0, 0, 0) has mean square 1 -> (2, 0, 0, 0); (3, 4, 0, 0)
  // has mean square 25/4 -> / 2.5.
  const std::vector<double> y{1, 1, 1, 1, 2, 0, 0, 0, 3, 4, 0, 0};
  const std::vector<double> x = rms_norm_reference(y, 4, 0.0);
  const std::vector<double> expect{1, 1, 1, 1, 2, 0, 0, 0, 1.2, 1.6, 0, 0};
  ASSERT_EQ(x.size(), expect.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(x[i], expect[i], 1e-15) << i;
  // eps keeps a zero row finite and zero.
  const std::vector<double> zero = rms_norm_reference(std::vector<double>(8, 0.0), 8);
  for (double v : zero) EXPECT_EQ(v, 0.0);
  // The output's RMS is 1 (eps aside) whatever the input's scale.
  std::vector<double> big(64);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 1000.0 * std::sin(double(i));
  double sq = 0;
  for (double v : rms_norm_reference(big, 64)) sq += v * v;
  EXPECT_NEAR(std::sqrt(sq / 64), 1.0, 1e-9);
  EXPECT_THROW(rms_norm_reference(y, 5), Error);
  EXPECT_THROW(rms_norm_reference(y, 0), Error);
}

}  // namespace
}  // namespace epfuse::bench
