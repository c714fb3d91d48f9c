#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <set>

#include "common/job.h"
#include "common/process.h"
#include "epfuse/error.h"
#include "epfuse/reference.h"

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

// A reference of `rows` rows of H values, and an output off by `noise` relative per element (about
// what bf16 does to a correct row).
struct RowsFixture {
  static constexpr size_t H = 256;
  std::vector<double> ref, out;
  RowsFixture(int rows, double noise) {
    std::mt19937 rng(11);
    std::uniform_real_distribution<double> value(-1.0, 1.0);
    std::normal_distribution<double> rel(0.0, noise);
    for (size_t i = 0; i < rows * H; ++i) {
      ref.push_back(value(rng));
      out.push_back(ref.back() * (1.0 + rel(rng)));
    }
  }
  std::span<double> row(int r) { return std::span<double>(out).subspan(r * H, H); }
};

TEST(RowErrors, PerRowNormsAndZeroRows) {
  const std::vector<double> ref = {3, 4, 0, 0, 1, 0};
  EXPECT_EQ(row_errors(ref, ref, 2), (std::vector<double>{0, 0, 0}));
  const std::vector<double> out = {3, 4.5, 0, 0, 1, 0.5};
  const std::vector<double> errs = row_errors(ref, out, 2);
  EXPECT_DOUBLE_EQ(errs[0], 0.5 / 5.0);  // each row against its own norm
  EXPECT_DOUBLE_EQ(errs[1], 0.0);        // a zero row that stayed zero
  EXPECT_DOUBLE_EQ(errs[2], 0.5);
  // A zero row that came out non-zero fails any bound; a NaN stays NaN.
  EXPECT_GT(row_errors(ref, std::vector<double>{3, 4, 1e-6, 0, 1, 0}, 2)[1], 1e20);
  EXPECT_TRUE(std::isnan(row_errors(ref, std::vector<double>{3, 4, 0, 0, std::nan(""), 0}, 2)[2]));
  EXPECT_THROW(row_errors(ref, std::vector<double>(4), 2), Error);
  EXPECT_THROW(row_errors(ref, ref, 4), Error);
}

// The reason for the per-row bound: one row with a missing or wrong contribution among 63 good ones
// moves the overall error by a 1/8 of its own, under the overall tolerance, but not past the per-row one.
TEST(RowErrors, OneBadRowAmongGoodOnesFailsOnlyThePerRowBound) {
  const double tolerance = 2e-2;  // epfuse run's default
  RowsFixture f(64, 3e-3);
  const int bad = 37;
  for (size_t h = 0; h < RowsFixture::H; ++h) f.row(bad)[h] = f.ref[bad * RowsFixture::H + h] * 0.9;  // 10% short
  EXPECT_LT(epfuse::relative_error(f.ref, f.out), tolerance) << "the overall bound alone passes this output";
  const std::vector<double> errs = row_errors(f.ref, f.out, RowsFixture::H);
  std::vector<int> rows(64);
  for (int r = 0; r < 64; ++r) {
    rows[r] = 100 + r;  // token indices, as sample_rows gives them
    if (r != bad) {
      EXPECT_LT(errs[r], row_tolerance(tolerance)) << "good row " << r;
    }
  }
  const WorstRow w = worst_row(errs, rows, 3);
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.row, 100 + bad);
  EXPECT_NEAR(w.err, 0.1, 1e-9);
  EXPECT_GT(w.err, row_tolerance(tolerance));

  Verdict v;
  v.max_rel_err = epfuse::relative_error(f.ref, f.out);
  v.worst_row = w;
  EXPECT_FALSE(within_tolerance(v, tolerance));
  v.worst_row.err = errs[0];  // the same run without the bad row
  EXPECT_TRUE(within_tolerance(v, tolerance));
  v.max_rel_err = 2.5e-2;  // the overall bound alone still fails a run
  EXPECT_FALSE(within_tolerance(v, tolerance));
  v.max_rel_err = 1e-3;
  v.total_unwritten = 1;
  EXPECT_FALSE(within_tolerance(v, tolerance));
}

TEST(RowErrors, Fp8RowsGetTheWiderRowBound) {
  const double tolerance = 2e-2;
  Verdict v;
  v.max_rel_err = 4e-3;
  v.worst_row = {0, 1, 0.05};  // between 2x and 3x the overall tolerance
  EXPECT_FALSE(within_tolerance(v, tolerance));
  EXPECT_FALSE(within_tolerance(v, tolerance, epfuse::WeightFormat::kBf16));
  EXPECT_TRUE(within_tolerance(v, tolerance, epfuse::WeightFormat::kFp8Block128));
  v.worst_row.err = 0.07;
  EXPECT_FALSE(within_tolerance(v, tolerance, epfuse::WeightFormat::kFp8Block128));
  EXPECT_DOUBLE_EQ(row_tolerance(tolerance, epfuse::WeightFormat::kFp8Block128), 6e-2);
}

TEST(RowErrors, WorstRowOverRanks) {
  const double inf = std::numeric_limits<double>::infinity();
  // (err, row) per rank as all_gather returns them; rank 2 checked no row.
  const std::vector<double> gathered = {3e-3, 5, 0.2, 17, 0.0, -1, 0.1, 4};
  WorstRow w = worst_of_ranks(gathered);
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.row, 17);
  EXPECT_EQ(w.err, 0.2);
  w = worst_of_ranks(std::vector<double>{0.0, -1, 0.0, 3});  // an exact row beats no row
  EXPECT_EQ(w.rank, 1);
  EXPECT_EQ(w.row, 3);
  EXPECT_EQ(worst_of_ranks(std::vector<double>{0.0, -1}).rank, -1);
  // A NaN row (unwritten output) is the worst there is.
  w = worst_row(std::vector<double>{0.5, std::nan(""), 0.7}, std::vector<int>{1, 2, 3}, 0);
  EXPECT_EQ(w.row, 2);
  EXPECT_EQ(w.err, inf);
  EXPECT_EQ(worst_row({}, {}, 0).row, -1);
  EXPECT_THROW(worst_row(std::vector<double>{1.0}, {}, 0), Error);
}

TEST(CallTimes, FirstAndLastWindowsShowDrift) {
  EXPECT_EQ(call_time_stats({}).calls, 0u);
  const CallTimes one = call_time_stats(std::vector<double>{2.0});
  EXPECT_EQ(one.window, 1u);
  EXPECT_EQ(one.first_median, 2.0);
  EXPECT_EQ(one.last_median, 2.0);
  // 3000 calls drifting from 1 ms to 4 ms: the windows are the first and last 1000.
  std::vector<double> ms;
  for (int i = 0; i < 3000; ++i) ms.push_back(1.0 + i * 1e-3);
  const CallTimes t = call_time_stats(ms);
  EXPECT_EQ(t.calls, 3000u);
  EXPECT_EQ(t.window, 1000u);
  EXPECT_NEAR(t.first_median, 1.0 + 499.5e-3, 1e-12);
  EXPECT_NEAR(t.last_median, 1.0 + 2499.5e-3, 1e-12);
  EXPECT_NEAR(t.median, 1.0 + 1499.5e-3, 1e-12);
  EXPECT_EQ(t.min, 1.0);
  EXPECT_NEAR(t.max, 3.999, 1e-12);
  // A short run: halves; one slow outlier does not move a median.
  std::vector<double> short_run(10, 1.0);
  short_run[9] = 100.0;
  const CallTimes s = call_time_stats(short_run);
  EXPECT_EQ(s.window, 5u);
  EXPECT_EQ(s.last_median, 1.0);
  EXPECT_EQ(s.max, 100.0);
}

// Two rows of 10 columns in blocks of 4 (the last of 2): identical, zero, and errors of each size.
TEST(BlockErrorMap, OneCharacterPerBlockOfEachRow) {
  std::vector<double> ref(20, 1.0), out(20, 1.0);
  for (int h = 4; h < 8; ++h) out[h] = 0.0;   // row 0, block 1: all zero
  out[8] = 1.5;                               // row 0, block 2 (2 columns): err 0.5 / sqrt(2)
  out[10] = 1.0 + 1e-3;                       // row 1, block 0: below 1e-2
  out[14] = 1.1;                              // row 1, block 1: 0.1 / 2 = 0.05
  out[18] = -5.0;                             // row 1, block 2: 6 / sqrt(2), >= 1
  const std::vector<std::string> map = block_error_map(ref, out, 10, 4);
  ASSERT_EQ(map.size(), 2u);
  EXPECT_EQ(map[0], ".z1");
  EXPECT_EQ(map[1], "320");
  out[2] = std::numeric_limits<double>::quiet_NaN();  // row 0, block 0: NaN
  EXPECT_EQ(block_error_map(ref, out, 10, 4)[0], "nz1");
  EXPECT_THROW(block_error_map(ref, out, 7, 4), Error);  // not rows of 7
  EXPECT_THROW(block_error_map(ref, out, 10, 0), Error);
}

// The UUID as nvidia-smi -L writes it: "GPU-", then 8-4-4-4-12 lower-case hex digits.
TEST(DeviceUuid, SpelledAsNvidiaSmiDoes) {
  const unsigned char bytes[16] = {0x20, 0x9d, 0x82, 0x4b, 0xd3, 0xcb, 0x25, 0x90,
                                   0xbd, 0x57, 0x8e, 0x49, 0xe3, 0x1f, 0x4a, 0xbf};
  EXPECT_EQ(format_gpu_uuid(bytes), "GPU-209d824b-d3cb-2590-bd57-8e49e31f4abf");
  const unsigned char zeros[16] = {};
  EXPECT_EQ(format_gpu_uuid(zeros), "GPU-00000000-0000-0000-0000-000000000000");
}

}  // namespace
}  // namespace epfuse::tools
