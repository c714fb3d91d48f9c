// The float64 reference: a case worked by hand, the clamp, dropped slots, row subsets, threading,
// generated vs host-held experts, unusual inputs (duplicate ids, weights as given, NaN/Inf in x), the
// FP8 path (weights per block, each rounding step, the format's error against bf16) and relative_error.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/fp8.h"
#include "epfuse/error.h"
#include "epfuse/reference.h"

namespace epfuse {
namespace {

std::vector<bf16> to_bf16(std::initializer_list<float> values) {
  std::vector<bf16> out;
  for (float v : values) out.push_back(__float2bfloat16_rn(v));  // all exact in bf16
  return out;
}

// H = 2, I = 1, E = 2, k = 2. Per expert, w13 is [2I = 2, H = 2] (gate row, up row), w2 is [H = 2, I = 1]:
//   expert 0: W1 = [1, 0],     W3 = [0, 1],  W2 = [1, 2]^T
//   expert 1: W1 = [0.5, 0.5], W3 = [1, -1], W2 = [-1, 0.5]^T
struct HandCase {
  LayerConfig cfg;
  HostExperts experts;
  HostTokens in;

  explicit HandCase(float clamp = 0.0f)
      : cfg{2, 1, 2, 2, 3, clamp},
        experts(cfg, to_bf16({1, 0, 0, 1, /**/ 0.5f, 0.5f, 1, -1}), to_bf16({1, 2, /**/ -1, 0.5f})) {
    in.num_tokens = 3;
    in.x = to_bf16({2, 1, /**/ -1, 3, /**/ 1, 3});
    // Token 1's slot 0 is dropped but holds weight 0.5: a reference that used it would be off.
    in.topk_idx = {0, 1, /**/ -1, 1, /**/ 0, -1};
    in.topk_weights = {0.75f, 0.25f, /**/ 0.5f, 1.0f, /**/ 1.0f, 0.25f};
  }
};

double silu(double g) { return g / (1 + std::exp(-g)); }

TEST(Reference, HandComputedCase) {
  HandCase c;
  const std::vector<double> y = reference_forward(c.cfg, c.in, c.experts);
  ASSERT_EQ(y.size(), 6u);
  // Token 0, x = [2, 1]: expert 0: gate 2, up 1, a = silu(2) = 1.7615941559557646, W2 a = [a, 2a];
  //   expert 1: gate 1.5, up 1, b = silu(1.5) = 1.2263617142904656, W2 b = [-b, 0.5b];
  //   y = 0.75 [a, 2a] + 0.25 [-b, 0.5b] = [1.014605188394207, 2.7956864482199553].
  EXPECT_NEAR(y[0], 1.014605188394207, 1e-14);
  EXPECT_NEAR(y[1], 2.7956864482199553, 1e-14);
  // Token 1, x = [-1, 3], expert 1 only: gate 1, up -4, a = -4 silu(1) = -2.9242343145200196,
  //   y = [-a, 0.5a] = [2.9242343145200196, -1.4621171572600098].
  EXPECT_NEAR(y[2], 2.9242343145200196, 1e-14);
  EXPECT_NEAR(y[3], -1.4621171572600098, 1e-14);
  // Token 2, x = [1, 3], expert 0 only: gate 1, up 3, a = 3 silu(1) = 2.193175735890015, y = [a, 2a].
  EXPECT_NEAR(y[4], 2.193175735890015, 1e-14);
  EXPECT_NEAR(y[5], 4.38635147178003, 1e-14);
  EXPECT_NEAR(y[4], 3 * silu(1), 1e-14);  // the arithmetic above, once more in code
}

TEST(Reference, HandComputedClamp) {
  HandCase c(1.5f);
  const std::vector<double> y = reference_forward(c.cfg, c.in, c.experts);
  // Token 0: expert 0's gate 2 is clamped to 1.5: a = silu(1.5) = 1.2263617142904656 (b as before):
  //   y = 0.75 [a, 2a] + 0.25 [-b, 0.5b] = [0.6131808571452326, 1.9928377857220063].
  EXPECT_NEAR(y[0], 0.6131808571452326, 1e-14);
  EXPECT_NEAR(y[1], 1.9928377857220063, 1e-14);
  // Token 1: up -4 is clamped to -1.5: a = -1.5 silu(1) = -1.0965878679450074, y = [-a, 0.5a].
  EXPECT_NEAR(y[2], 1.0965878679450074, 1e-14);
  EXPECT_NEAR(y[3], -0.5482939339725037, 1e-14);
  // Token 2: up 3 is clamped to 1.5: a = 1.5 silu(1), y = [a, 2a].
  EXPECT_NEAR(y[4], 1.0965878679450074, 1e-14);
  EXPECT_NEAR(y[5], 2.193175735890015, 1e-14);
}

TEST(Reference, AllSlotsDroppedGivesZeroAndNoExpertIsLoaded) {
  HandCase c;
  c.in.topk_idx = {-1, -1, -1, -1, -1, -1};
  const std::vector<double> y = reference_forward(c.cfg, c.in, c.experts);
  for (double v : y) EXPECT_EQ(v, 0.0);
}

TEST(Reference, ZeroTokens) {
  HandCase c;
  c.in = HostTokens{};
  EXPECT_TRUE(reference_forward(c.cfg, c.in, c.experts).empty());
}

TEST(Reference, RejectsBadInputs) {
  HandCase c;
  HostTokens bad = c.in;
  bad.topk_idx[3] = 2;  // only experts 0 and 1 exist
  EXPECT_THROW(reference_forward(c.cfg, bad, c.experts), Error);
  bad = c.in;
  bad.topk_idx[3] = -2;
  EXPECT_THROW(reference_forward(c.cfg, bad, c.experts), Error);
  bad = c.in;
  bad.x.pop_back();
  EXPECT_THROW(reference_forward(c.cfg, bad, c.experts), Error);
  const int out_of_range[] = {3};
  EXPECT_THROW(reference_forward(c.cfg, c.in, c.experts, out_of_range), Error);
  EXPECT_THROW(HostExperts(c.cfg, to_bf16({1, 2, 3}), to_bf16({1, 2, 3, 4})), Error);
}

// A generated layer small enough to compute in full.
struct GeneratedCase {
  LayerConfig cfg{256, 128, 16, 4, 64, 0.0f};
  uint64_t seed = 42;
  GeneratedExperts experts{cfg, seed};
  HostTokens in = make_tokens(cfg, 2, 1, 40, Routing::kDropped, seed);
};

TEST(Reference, RowSubsetEqualsFullRows) {
  GeneratedCase g;
  const std::vector<double> full = reference_forward(g.cfg, g.in, g.experts, {}, 2);
  const std::vector<int> rows = {37, 3, 3, 0, 21};  // any order, repeats allowed
  const std::vector<double> sub = reference_forward(g.cfg, g.in, g.experts, rows, 2);
  ASSERT_EQ(sub.size(), rows.size() * 256);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int h = 0; h < 256; ++h) ASSERT_EQ(sub[i * 256 + h], full[rows[i] * 256 + h]) << "row " << rows[i];
}

TEST(Reference, ThreadCountDoesNotChangeTheResult) {
  GeneratedCase g;
  const std::vector<double> one = reference_forward(g.cfg, g.in, g.experts, {}, 1);
  for (int threads : {2, 3, 7, 0}) {
    const std::vector<double> many = reference_forward(g.cfg, g.in, g.experts, {}, threads);
    ASSERT_EQ(one, many) << threads << " threads";
  }
  double norm = 0;
  for (double v : one) norm += v * v;
  EXPECT_GT(norm, 0.0);
}

TEST(Reference, GeneratedExpertsEqualHostExpertsFromWeightFunctions) {
  GeneratedCase g;
  const int E = g.cfg.num_experts, H = g.cfg.hidden, I = g.cfg.intermediate;
  std::vector<bf16> w13(static_cast<size_t>(E) * 2 * I * H), w2(static_cast<size_t>(E) * H * I);
  for (int e = 0; e < E; ++e) {
    for (int r = 0; r < 2 * I; ++r)
      for (int c = 0; c < H; ++c)
        w13[(static_cast<size_t>(e) * 2 * I + r) * H + c] = weight_w13(g.cfg, g.seed, e, r, c);
    for (int r = 0; r < H; ++r)
      for (int c = 0; c < I; ++c) w2[(static_cast<size_t>(e) * H + r) * I + c] = weight_w2(g.cfg, g.seed, e, r, c);
  }
  const HostExperts host(g.cfg, std::move(w13), std::move(w2));
  std::vector<double> a13, a2, b13, b2;
  for (int e : {0, 7, 15}) {
    g.experts.load(e, a13, a2);
    host.load(e, b13, b2);
    EXPECT_EQ(a13, b13) << "expert " << e;
    EXPECT_EQ(a2, b2) << "expert " << e;
  }
  EXPECT_EQ(reference_forward(g.cfg, g.in, g.experts), reference_forward(g.cfg, g.in, host));
  EXPECT_THROW(g.experts.load(E, a13, a2), Error);
  EXPECT_THROW(host.load(-1, a13, a2), Error);
}

TEST(Reference, DroppedSlotsAreSkipped) {
  // Dropping a slot equals removing that expert from the token: compare with the same token where the
  // dropped slot points at an expert whose weight is 0.
  GeneratedCase g;
  HostTokens zeroed = g.in;
  int dropped = 0;
  for (size_t s = 0; s < zeroed.topk_idx.size(); ++s)
    if (zeroed.topk_idx[s] < 0) {
      zeroed.topk_idx[s] = static_cast<int>(s % g.cfg.num_experts);
      zeroed.topk_weights[s] = 0.0f;
      ++dropped;
    }
  ASSERT_GT(dropped, 0);
  const std::vector<double> a = reference_forward(g.cfg, g.in, g.experts);
  const std::vector<double> b = reference_forward(g.cfg, zeroed, g.experts);
  EXPECT_LT(relative_error(b, a), 1e-15);
}

// ---- unusual inputs: what types.h (TokenBatch) defines, as the reference does it ----

// Every token routed (no dropped slot), so that each row has experts to carry a change through.
GeneratedCase all_routed() {
  GeneratedCase g;
  g.in = make_tokens(g.cfg, 2, 1, 40, Routing::kUniform, g.seed);
  return g;
}

bool all_of_row(const std::vector<double>& y, int row, int H, bool (*pred)(double)) {
  for (int h = 0; h < H; ++h)
    if (!pred(y[static_cast<size_t>(row) * H + h])) return false;
  return true;
}
bool is_nan(double v) { return std::isnan(v); }
bool not_finite(double v) { return !std::isfinite(v); }
bool is_zero(double v) { return v == 0.0; }

// Every row but `row` holds exactly the same bits in a and b.
void expect_other_rows_equal(const std::vector<double>& a, const std::vector<double>& b, int row, int H) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    if (static_cast<int>(i / H) != row) ASSERT_EQ(a[i], b[i]) << "row " << i / H << " changed";
}

TEST(Reference, DuplicateExpertIdsAreIndependentSlots) {
  GeneratedCase g = all_routed();
  const int k = g.cfg.topk;
  // Slot 1 repeats slot 0's expert and weight in every token, against slot 1 dropped and slot 0's
  // weight doubled: the same bits (w v + w v = 2 w v exactly, summed in the same slot order).
  HostTokens dup = g.in, merged = g.in, deduplicated = g.in;
  for (int t = 0; t < g.in.num_tokens; ++t) {
    dup.topk_idx[t * k + 1] = dup.topk_idx[t * k];
    dup.topk_weights[t * k + 1] = dup.topk_weights[t * k];
    merged.topk_idx[t * k + 1] = -1;
    merged.topk_weights[t * k] *= 2;
    deduplicated.topk_idx[t * k + 1] = -1;
  }
  const std::vector<double> y_dup = reference_forward(g.cfg, dup, g.experts);
  EXPECT_EQ(y_dup, reference_forward(g.cfg, merged, g.experts));
  // Not deduplicated: that would lose slot 1's share.
  EXPECT_GT(relative_error(y_dup, reference_forward(g.cfg, deduplicated, g.experts)), 1e-3);
}

TEST(Reference, WeightsAreUsedAsGiven) {
  GeneratedCase g = all_routed();
  const std::vector<double> y = reference_forward(g.cfg, g.in, g.experts);
  // A negative weight flips its slot's sign: all of them negated flip the whole output, bit for bit.
  HostTokens negated = g.in, doubled = g.in;
  for (float& w : negated.topk_weights) w = -w;
  const std::vector<double> y_neg = reference_forward(g.cfg, negated, g.experts);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y_neg[i], -y[i]) << i;
  // Weights summing to 2 are not normalised back to 1: twice the output (a power of two: exact).
  for (float& w : doubled.topk_weights) w *= 2;
  const std::vector<double> y_two = reference_forward(g.cfg, doubled, g.experts);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(y_two[i], 2 * y[i]) << i;
  // Mixed signs within a token: the hand case's token 0 with slot 1's weight negated.
  HandCase c;
  c.in.topk_weights[1] = -0.25f;
  const std::vector<double> mixed = reference_forward(c.cfg, c.in, c.experts);
  // 0.75 [a, 2a] - 0.25 [-b, 0.5b], a = silu(2), b = silu(1.5) (HandComputedCase).
  EXPECT_NEAR(mixed[0], 0.75 * silu(2) + 0.25 * silu(1.5), 1e-14);
  EXPECT_NEAR(mixed[1], 1.5 * silu(2) - 0.125 * silu(1.5), 1e-14);
}

TEST(Reference, NonFiniteXReachesOnlyItsOwnRow) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  const int H = 256;
  for (float clamp : {0.0f, 4.0f}) {
    GeneratedCase g = all_routed();
    g.cfg.swiglu_clamp = clamp;
    const GeneratedExperts experts(g.cfg, g.seed);
    const std::vector<double> clean = reference_forward(g.cfg, g.in, experts);
    for (double bad : {std::numeric_limits<double>::quiet_NaN(), kInf, -kInf}) {
      const int t = 7;
      HostTokens in = g.in;
      in.x[static_cast<size_t>(t) * H + 100] = __double2bfloat16(bad);
      const std::vector<double> y = reference_forward(g.cfg, in, experts);
      SCOPED_TRACE("clamp " + std::to_string(clamp) + ", x = " + std::to_string(bad));
      expect_other_rows_equal(clean, y, t, H);
      // Without a clamp every element of the row is NaN or Inf; with one, NaN stays NaN (std::min and
      // std::max keep a NaN first operand) while an Inf may be clamped to a finite value.
      if (clamp == 0.0f) EXPECT_TRUE(all_of_row(y, t, H, not_finite));
      if (std::isnan(bad)) EXPECT_TRUE(all_of_row(y, t, H, is_nan));
    }
  }
  GeneratedCase g = all_routed();
  const int k = g.cfg.topk, t = 3;
  HostTokens in = g.in;
  in.x[static_cast<size_t>(t) * H] = __double2bfloat16(std::numeric_limits<double>::quiet_NaN());
  // A weight of 0 still computes its expert (0 * NaN = NaN): only -1 drops a slot ...
  for (int j = 0; j < k; ++j) in.topk_weights[t * k + j] = 0.0f;
  EXPECT_TRUE(all_of_row(reference_forward(g.cfg, in, g.experts), t, H, is_nan));
  // ... and a token with every slot dropped gets zeros whatever its x holds.
  for (int j = 0; j < k; ++j) in.topk_idx[t * k + j] = -1;
  EXPECT_TRUE(all_of_row(reference_forward(g.cfg, in, g.experts), t, H, is_zero));
  // A NaN weight makes its token's row NaN and no other.
  HostTokens nan_weight = g.in;
  nan_weight.topk_weights[t * k + 2] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<double> y = reference_forward(g.cfg, nan_weight, g.experts);
  EXPECT_TRUE(all_of_row(y, t, H, is_nan));
  expect_other_rows_equal(reference_forward(g.cfg, g.in, g.experts), y, t, H);
}

// Progress counts every needed expert's w13 bands, its activation and its w2 bands.
TEST(Reference, ProgressCountsBandsAndExperts) {
  GeneratedCase g;
  int64_t last = 0, calls = 0, total = -1;
  reference_forward(g.cfg, g.in, g.experts, {}, 3, [&](int64_t done, int64_t all) {
    EXPECT_EQ(done, last + 1);  // serialised, in order
    last = done;
    total = all;
    ++calls;
  });
  const int per_expert = 2 * ((g.cfg.intermediate + 127) / 128) + 1 + (g.cfg.hidden + 127) / 128;
  EXPECT_EQ(total, g.cfg.num_experts * per_expert);  // 40 tokens x 4 slots hit all 16 experts
  EXPECT_EQ(calls, total);
}

TEST(Reference, ExceptionsFromLoadReachTheCaller) {
  struct Failing final : ExpertSource {
    using ExpertSource::ExpertSource;
    void bf16_band(int expert, Matrix, int first, int, double*) const override {
      if (first >= 128) throw Error(ErrorCode::kInternal, "cannot load expert " + std::to_string(expert));
    }
  };
  GeneratedCase g;
  for (int threads : {1, 4}) EXPECT_THROW(reference_forward(g.cfg, g.in, Failing{g.cfg}, {}, threads), Error);
}

// A band is whole FP8 block rows of one matrix half: load_band refuses any other range, and the whole
// expert read band by band equals the bands read one at a time, in any order.
TEST(Reference, LoadBandTakesBandsOnly) {
  LayerConfig cfg{320, 192, 4, 2, 8, 0.0f};  // halves of 192 rows: bands of 128 and 64
  cfg.weight_format = WeightFormat::kFp8Block128;
  const GeneratedExperts experts(cfg, 3);
  std::vector<double> w13, w2, band(128 * 320);
  experts.load(2, w13, w2);
  using M = ExpertSource::Matrix;
  for (const auto& [first, count] : std::vector<std::pair<int, int>>{{320, 64}, {0, 128}, {192, 128}, {128, 64}}) {
    experts.load_band(2, M::kW13, first, count, band.data());
    for (int i = 0; i < count * 320; ++i) ASSERT_EQ(band[i], w13[static_cast<size_t>(first) * 320 + i]) << first;
  }
  experts.load_band(2, M::kW2, 256, 64, band.data());
  for (int i = 0; i < 64 * 192; ++i) ASSERT_EQ(band[i], w2[static_cast<size_t>(256) * 192 + i]);
  for (const auto& [first, count] :
       std::vector<std::pair<int, int>>{{64, 128}, {128, 128}, {0, 129}, {0, 0}, {-128, 64}, {384, 1}, {320, 65}})
    EXPECT_THROW(experts.load_band(2, M::kW13, first, count, band.data()), Error) << first << " " << count;
  EXPECT_THROW(experts.load_band(2, M::kW2, 256, 128, band.data()), Error);
  EXPECT_THROW(experts.load_band(4, M::kW2, 0, 64, band.data()), Error);
  // A source of another shape than the layer's is refused.
  LayerConfig other = cfg;
  other.intermediate = 256;
  const HostTokens in = make_tokens(cfg, 1, 0, 3, Routing::kUniform, 1);
  EXPECT_THROW(reference_forward(cfg, in, GeneratedExperts(other, 3)), Error);
}

// The reference's use case: a few sampled rows of a big layer. On a machine with 16+ threads this
// is the 16 tokens x 8 experts case that must take seconds; on smaller ones, 2 tokens.
TEST(Reference, Dsv3SampledRowsTakeSeconds) {
  const LayerConfig cfg = make_config(*find_model("dsv3"), 4096);
  const HostTokens in = make_tokens(cfg, 4, 2, 4096, Routing::kUniform, 1);
  const int num_rows = std::thread::hardware_concurrency() >= 16 ? 16 : 2;
  std::vector<int> rows;
  for (int i = 0; i < num_rows; ++i) rows.push_back(i * 257);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<double> y = reference_forward(cfg, in, GeneratedExperts(cfg, 1), rows);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("dsv3, %d rows x 8 experts on %u threads: %.2f s\n", num_rows, std::thread::hardware_concurrency(),
              seconds);
  ASSERT_EQ(y.size(), static_cast<size_t>(num_rows) * 7168);
  double norm = 0;
  for (double v : y) norm += v * v;
  EXPECT_GT(norm, 0.0);
  EXPECT_LT(seconds, 60.0);
}

// --- FP8 (kFp8Block128): the same generated layer, its weights quantised in 128x128 blocks, x and h
// in 1x128 groups.

// Each weight GeneratedExperts loads for an FP8 config is decode(encode(w / s)) * s of its bf16 value w,
// with s the scale of the block that w13_scale_index / w2_scale_index put it in (common/fp8.h tests
// those indices against an enumeration), so the reference blocks the gate and up halves apart. The
// same for HostExperts.
TEST(ReferenceFp8, WeightsAreTheBf16WeightsQuantisedPerBlock) {
  for (int source : {0, 1})  // GeneratedExperts, HostExperts
    for (ScaleFormat format : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) {
      LayerConfig bf{320, 192, 2, 1, 8, 0.0f};  // 64-multiples: partial blocks in both dimensions
      LayerConfig f8 = bf;
      f8.weight_format = WeightFormat::kFp8Block128;
      f8.scale_format = format;
      // Generated weights, and host weights whose magnitude changes every 32 rows, so that a block taken
      // over other rows (say gate and up rows together) has another amax.
      const int E = bf.num_experts, H = bf.hidden, I = bf.intermediate;
      const auto banded = [](int count, int cols) {
        std::vector<bf16> w;
        for (int i = 0; i < count; ++i)
          w.push_back(__float2bfloat16_rn(std::sin(0.37f * i) * std::ldexp(1.0f, (i / cols / 32) % 5)));
        return w;
      };
      const std::vector<bf16> h13 = banded(E * 2 * I * H, H), h2 = banded(E * H * I, I);
      std::vector<double> b13, b2, q13, q2;
      if (source == 0) {
        GeneratedExperts(bf, 5).load(1, b13, b2);
        GeneratedExperts(f8, 5).load(1, q13, q2);
      } else {
        HostExperts(bf, h13, h2).load(1, b13, b2);
        HostExperts(f8, h13, h2).load(1, q13, q2);
      }
      const auto expect_quantised = [&](const std::vector<double>& w, const std::vector<double>& q, int rows,
                                        int cols, auto index) {
        std::vector<float> amax(static_cast<size_t>(index(rows - 1, cols - 1)) + 1, 0.0f);  // per scale
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) {
            float& a = amax[index(r, c)];
            a = std::max(a, static_cast<float>(std::fabs(w[static_cast<size_t>(r) * cols + c])));
          }
        for (int r = 0; r < rows; ++r)
          for (int c = 0; c < cols; ++c) {
            const size_t i = static_cast<size_t>(r) * cols + c;
            const float scale = fp8::group_scale(amax[index(r, c)], format);
            const double want =
                static_cast<double>(fp8::e4m3_to_float(fp8::float_to_e4m3(static_cast<float>(w[i]) * (1.0f / scale)))) *
                scale;
            ASSERT_EQ(q[i], want) << "row " << r << " col " << c;
          }
      };
      expect_quantised(b13, q13, 2 * I, H, [&](int r, int c) { return fp8::w13_scale_index(0, r, c, I, H); });
      expect_quantised(b2, q2, H, I, [&](int r, int c) { return fp8::w2_scale_index(0, r, c, H, I); });
      EXPECT_NE(b13, q13);
    }
}

// 40 tokens of x in [-1, 1] with every slot routed (make_tokens takes only configs the kernels run,
// and the 64-multiple shape is not one yet).
HostTokens fp8_case_tokens(const LayerConfig& cfg) {
  HostTokens in;
  in.num_tokens = 40;
  for (int t = 0; t < in.num_tokens; ++t) {
    for (int h = 0; h < cfg.hidden; ++h) in.x.push_back(__float2bfloat16_rn(std::sin(0.7f * t + 1.3f * h)));
    for (int j = 0; j < cfg.topk; ++j) {
      in.topk_idx.push_back((t * 5 + j * 3) % cfg.num_experts);
      in.topk_weights.push_back(1.0f / static_cast<float>(j + 1));
    }
  }
  return in;
}

// The FP8 reference against the bf16 one on the same generated layer: the format's own error, per row
// and over all rows. Measured (these shapes, fp32 and UE8M0 scales alike): 5.8e-2 to 6.2e-2 over all
// rows, worst row 7.2e-2 to 8.1e-2. As expected: e4m3 rounds a value uniform within a binade with an RMS
// relative error of about 2.4%, and x, W13, h and W2 are each rounded once (SwiGLU's product of gate and
// up adds one more such term), about sqrt(6) * 2.4% = 5.9%. Exactly reproducible, whatever the thread
// count.
TEST(ReferenceFp8, CloseToTheBf16ReferenceAndReproducible) {
  for (const LayerConfig& shape : {LayerConfig{256, 128, 16, 4, 64, 0.0f}, LayerConfig{320, 192, 8, 2, 64, 0.0f}})
    for (ScaleFormat format : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) {
      LayerConfig f8 = shape;
      f8.weight_format = WeightFormat::kFp8Block128;
      f8.scale_format = format;
      const HostTokens in = fp8_case_tokens(shape);
      const std::vector<double> bf = reference_forward(shape, in, GeneratedExperts(shape, 42), {}, 2);
      const std::vector<double> q = reference_forward(f8, in, GeneratedExperts(f8, 42), {}, 2);
      const double all = relative_error(bf, q);
      double worst_row = 0;
      const size_t H = static_cast<size_t>(shape.hidden);
      for (size_t r = 0; r < bf.size() / H; ++r)
        worst_row =
            std::max(worst_row, relative_error(std::span(bf).subspan(r * H, H), std::span(q).subspan(r * H, H)));
      std::printf("FP8 vs bf16, H %d I %d, %s scales: relative error %.4f, worst row %.4f\n", shape.hidden,
                  shape.intermediate, std::string(to_string(format)).c_str(), all, worst_row);
      EXPECT_GT(all, 4e-2);
      EXPECT_LT(all, 8e-2);
      EXPECT_LT(worst_row, 1.2e-1);
      for (int threads : {1, 3}) EXPECT_EQ(reference_forward(f8, in, GeneratedExperts(f8, 42), {}, threads), q);
    }
}

// One token, one expert, written out step by step in the order the kernels will go: x quantised 1x128,
// Linear1 on the FP8 weights, SwiGLU, times the top-k weight, quantised 1x128, Linear2. Leaving out any
// quantisation (or applying the top-k weight twice or not at all) moves the result far beyond the
// tolerance.
TEST(ReferenceFp8, OneTokenStepByStep) {
  for (ScaleFormat format : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) {
    LayerConfig cfg{192, 320, 2, 1, 8, 0.0f};
    cfg.weight_format = WeightFormat::kFp8Block128;
    cfg.scale_format = format;
    const int H = cfg.hidden, I = cfg.intermediate;
    HostTokens in = fp8_case_tokens(cfg);
    in.num_tokens = 1;
    in.x.resize(H);
    in.topk_idx = {1};
    in.topk_weights = {0.375f};
    std::vector<double> w13, w2;
    GeneratedExperts(cfg, 9).load(1, w13, w2);  // FP8 weights (WeightsAreTheBf16WeightsQuantisedPerBlock)
    // Quantise a row of doubles in 1x128 groups, through float, as the kernels will.
    const auto quantised = [&](const std::vector<double>& v) {
      std::vector<float> f(v.begin(), v.end()), back(v.size());
      std::vector<uint8_t> q(v.size());
      for (int g = 0; g < fp8::num_blocks(static_cast<int>(v.size())); ++g) {
        const int n = fp8::block_extent(static_cast<int>(v.size()), g);
        const float s = fp8::quantize_tile(&f[g * 128], 1, n, n, &q[g * 128], n, format);
        fp8::dequantize_tile(&q[g * 128], 1, n, n, s, &back[g * 128], n);
      }
      return std::vector<double>(back.begin(), back.end());
    };
    std::vector<double> x(H);
    for (int h = 0; h < H; ++h) x[h] = __bfloat162float(in.x[h]);
    x = quantised(x);
    std::vector<double> act(I);
    for (int c = 0; c < I; ++c) {
      double gate = 0, up = 0;
      for (int h = 0; h < H; ++h) {
        gate += w13[static_cast<size_t>(c) * H + h] * x[h];
        up += w13[static_cast<size_t>(I + c) * H + h] * x[h];
      }
      act[c] = silu(gate) * up * 0.375;
    }
    act = quantised(act);
    const std::vector<double> y = reference_forward(cfg, in, GeneratedExperts(cfg, 9));
    std::vector<double> want(H, 0.0);
    double largest = 0;
    for (int h = 0; h < H; ++h) {
      for (int c = 0; c < I; ++c) want[h] += w2[static_cast<size_t>(h) * I + c] * act[c];
      largest = std::max(largest, std::fabs(want[h]));
    }
    // 1e-6 of the row's largest value: the sums here run in another order, and a last-bit change of a
    // group's amax moves its float scale by 2^-24; any left-out rounding to e4m3 moves y by percents.
    for (int h = 0; h < H; ++h)
      ASSERT_NEAR(y[h], want[h], 1e-6 * largest) << "format " << to_string(format) << " column " << h;
  }
}

TEST(RelativeError, Basics) {
  const std::vector<double> ref = {3, 4};
  EXPECT_EQ(relative_error(ref, ref), 0.0);
  EXPECT_DOUBLE_EQ(relative_error(ref, std::vector<double>{3, 4.5}), 0.5 / 5);
  EXPECT_DOUBLE_EQ(relative_error(ref, std::vector<double>{0, 0}), 1.0);
  // All-zero reference: the absolute norm of out.
  EXPECT_EQ(relative_error(std::vector<double>{0, 0}, std::vector<double>{0, 0}), 0.0);
  EXPECT_DOUBLE_EQ(relative_error(std::vector<double>{0, 0}, std::vector<double>{3, 4}), 5.0);
  EXPECT_TRUE(std::isnan(relative_error(ref, std::vector<double>{3, std::nan("")})));
  EXPECT_TRUE(std::isnan(relative_error(std::vector<double>{0, 0}, std::vector<double>{std::nan(""), 0})));
  EXPECT_EQ(relative_error(std::vector<double>{}, std::vector<double>{}), 0.0);
  EXPECT_THROW(relative_error(ref, std::vector<double>{1}), Error);
}

}  // namespace
}  // namespace epfuse
