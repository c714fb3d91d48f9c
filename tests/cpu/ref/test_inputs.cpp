// The seeded generator: determinism, routing properties, weights, token counts, value ranges.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "epfuse/error.h"
#include "epfuse/inputs.h"
#include "ref/generator.h"

namespace epfuse {
namespace {

constexpr Routing kAllRoutings[] = {Routing::kUniform, Routing::kSkewed, Routing::kOneExpert, Routing::kDropped,
                                    Routing::kOneRank};

LayerConfig config(int experts = 64, int topk = 8) {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 128;
  cfg.num_experts = experts;
  cfg.topk = topk;
  cfg.max_tokens_per_rank = 4096;
  return cfg;
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](bf16 x, bf16 y) {
           return __bfloat16_as_ushort(x) == __bfloat16_as_ushort(y);
         });
}

// Slots per expert over many tokens.
std::vector<int> expert_histogram(const HostTokens& in, int num_experts) {
  std::vector<int> hist(num_experts, 0);
  for (int32_t e : in.topk_idx)
    if (e >= 0) ++hist[e];
  return hist;
}

TEST(Routing, NamesRoundTrip) {
  EXPECT_EQ(to_string(Routing::kUniform), "uniform");
  EXPECT_EQ(to_string(Routing::kSkewed), "skewed");
  EXPECT_EQ(to_string(Routing::kOneExpert), "one-expert");
  EXPECT_EQ(to_string(Routing::kDropped), "dropped");
  EXPECT_EQ(to_string(Routing::kOneRank), "one-rank");
  for (Routing r : kAllRoutings) EXPECT_EQ(parse_routing(to_string(r)), r);
  EXPECT_FALSE(parse_routing("Uniform"));
  EXPECT_FALSE(parse_routing(""));
}

TEST(Tokens, SameSeedSameTokensOtherSeedOrRankOthers) {
  const LayerConfig cfg = config();
  for (Routing r : kAllRoutings) {
    const HostTokens a = make_tokens(cfg, 4, 1, 100, r, 7);
    const HostTokens b = make_tokens(cfg, 4, 1, 100, r, 7);
    EXPECT_TRUE(same_bits(a.x, b.x));
    EXPECT_EQ(a.topk_idx, b.topk_idx);
    EXPECT_EQ(a.topk_weights, b.topk_weights);
    const HostTokens c = make_tokens(cfg, 4, 1, 100, r, 8);
    EXPECT_FALSE(same_bits(a.x, c.x));
    EXPECT_NE(a.topk_weights, c.topk_weights);
    const HostTokens d = make_tokens(cfg, 4, 2, 100, r, 7);  // another rank's tokens differ too
    EXPECT_FALSE(same_bits(a.x, d.x));
    if (r != Routing::kOneExpert) {
      EXPECT_NE(a.topk_idx, c.topk_idx) << to_string(r);
      EXPECT_NE(a.topk_idx, d.topk_idx) << to_string(r);
    }
  }
}

TEST(Tokens, PrefixIsStableAcrossTokenCounts) {
  // Token t is a function of (seed, rank, t): asking for more tokens does not change earlier ones.
  const LayerConfig cfg = config();
  const HostTokens small = make_tokens(cfg, 2, 0, 10, Routing::kDropped, 3);
  const HostTokens large = make_tokens(cfg, 2, 0, 50, Routing::kDropped, 3);
  EXPECT_TRUE(std::equal(small.topk_idx.begin(), small.topk_idx.end(), large.topk_idx.begin()));
  EXPECT_TRUE(std::equal(small.topk_weights.begin(), small.topk_weights.end(), large.topk_weights.begin()));
  EXPECT_EQ(__bfloat16_as_ushort(small.x[9 * 256 + 17]), __bfloat16_as_ushort(large.x[9 * 256 + 17]));
}

// One-rank routing: min(k, E/R) slots on one rank's experts (all of them when k >= E/R), the rest on
// other ranks, every expert distinct; over many tokens every rank is some token's chosen one.
TEST(Tokens, OneRankRoutingFillsOneRanksExperts) {
  struct Case {
    int experts, topk, world;
  };
  for (const Case& c : {Case{64, 8, 8}, Case{256, 8, 8}, Case{16, 4, 8}, Case{16, 4, 2}, Case{8, 8, 1}}) {
    const LayerConfig cfg = config(c.experts, c.topk);
    const int L = c.experts / c.world, on_home = std::min(c.topk, L);
    const HostTokens in = make_tokens(cfg, c.world, c.world - 1, 400, Routing::kOneRank, 17);
    std::set<int> homes;
    for (int t = 0; t < in.num_tokens; ++t) {
      const int32_t* idx = &in.topk_idx[static_cast<size_t>(t) * c.topk];
      const int home = idx[0] / L;
      homes.insert(home);
      std::set<int> seen;
      for (int j = 0; j < c.topk; ++j) {
        ASSERT_GE(idx[j], 0);
        ASSERT_LT(idx[j], c.experts);
        EXPECT_EQ(idx[j] / L == home, j < on_home) << "E=" << c.experts << " k=" << c.topk << " slot " << j;
        seen.insert(idx[j]);
      }
      EXPECT_EQ(seen.size(), static_cast<size_t>(c.topk));
    }
    EXPECT_EQ(homes.size(), static_cast<size_t>(c.world)) << "E=" << c.experts << " R=" << c.world;
  }
}

TEST(Tokens, ShapesAndZeroTokens) {
  const LayerConfig cfg = config();
  const HostTokens in = make_tokens(cfg, 2, 1, 37, Routing::kUniform, 1);
  EXPECT_EQ(in.num_tokens, 37);
  EXPECT_EQ(in.x.size(), 37u * 256);
  EXPECT_EQ(in.topk_idx.size(), 37u * 8);
  EXPECT_EQ(in.topk_weights.size(), 37u * 8);
  const HostTokens none = make_tokens(cfg, 2, 1, 0, Routing::kSkewed, 1);
  EXPECT_EQ(none.num_tokens, 0);
  EXPECT_TRUE(none.x.empty() && none.topk_idx.empty() && none.topk_weights.empty());
}

TEST(Tokens, XInUnitRangeAndVaried) {
  const HostTokens in = make_tokens(config(), 1, 0, 200, Routing::kUniform, 11);
  double sum = 0, sum2 = 0;
  std::set<unsigned short> distinct;
  for (bf16 v : in.x) {
    const float f = __bfloat162float(v);
    ASSERT_GE(f, -1.0f);
    ASSERT_LE(f, 1.0f);
    sum += f;
    sum2 += f * f;
    distinct.insert(__bfloat16_as_ushort(v));
  }
  const double n = static_cast<double>(in.x.size());
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  // U(-1, 1) times a group magnitude 1, 1/2 or 1/4 (equally likely): (1 + 1/4 + 1/16) / 3 / 3.
  EXPECT_NEAR(sum2 / n, 1.3125 / 9.0, 0.01);
  EXPECT_GT(distinct.size(), 1000u);
}

// Every 1x128 group of a token row and every 128x128 block of a weight matrix has its own magnitude
// (generator.h group_magnitude): the largest value of each is that magnitude (times the weight scale)
// to within the uniform draw's reach, and all three magnitudes occur, within one row and over blocks.
TEST(Generator, GroupsAndBlocksHaveTheirOwnMagnitudes) {
  LayerConfig cfg = config();
  cfg.hidden = 1024;  // 8 groups per token row
  const HostTokens in = make_tokens(cfg, 1, 0, 64, Routing::kUniform, 5);
  int rows_with_two_magnitudes = 0;
  std::set<float> seen_x;
  for (int t = 0; t < 64; ++t) {
    std::set<float> row_magnitudes;
    for (int g = 0; g < cfg.hidden / 128; ++g) {
      float amax = 0.0f;
      for (int c = 0; c < 128; ++c) amax = std::max(amax, std::fabs(__bfloat162float(in.x[t * cfg.hidden + g * 128 + c])));
      const float m = detail::group_magnitude(detail::token_row_key(5, 0, t), g * 128);
      EXPECT_LE(amax, m);
      EXPECT_GT(amax, 0.9f * m);  // 128 uniform draws all below 0.9: 0.9^128 = 1.4e-6
      row_magnitudes.insert(m);
      seen_x.insert(m);
    }
    rows_with_two_magnitudes += row_magnitudes.size() >= 2;
  }
  EXPECT_EQ(seen_x, (std::set<float>{0.25f, 0.5f, 1.0f}));
  EXPECT_GE(rows_with_two_magnitudes, 60);  // 8 groups share one magnitude with probability 3 * 3^-8
  std::set<float> seen_w;
  for (int rb = 0; rb < 4; ++rb)
    for (int cb = 0; cb < cfg.hidden / 128; ++cb) {
      float amax = 0.0f;
      for (int r = rb * 128; r < rb * 128 + 128; ++r)
        for (int c = cb * 128; c < cb * 128 + 128; ++c) amax = std::max(amax, std::fabs(__bfloat162float(weight_w13(cfg, 3, 2, r, c))));
      const float m = detail::group_magnitude(detail::weight_block_key(3, detail::Stream::kW13, 2, rb * 128), cb * 128);
      EXPECT_LE(amax, m * detail::weight_scale(cfg.hidden) * 1.004f) << rb << " " << cb;
      EXPECT_GT(amax, 0.99f * m * detail::weight_scale(cfg.hidden)) << rb << " " << cb;
      seen_w.insert(m);
    }
  EXPECT_EQ(seen_w, (std::set<float>{0.25f, 0.5f, 1.0f}));
}

TEST(Tokens, DistinctExpertsInRange) {
  for (const LayerConfig& cfg : {config(64, 8), config(8, 8), config(16, 16), config(3, 1)}) {
    for (Routing r : {Routing::kUniform, Routing::kSkewed, Routing::kDropped, Routing::kOneRank}) {
      const HostTokens in = make_tokens(cfg, 1, 0, 500, r, 5);
      for (int t = 0; t < in.num_tokens; ++t) {
        std::set<int> seen;
        for (int j = 0; j < cfg.topk; ++j) {
          const int e = in.topk_idx[t * cfg.topk + j];
          if (e == -1 && r == Routing::kDropped) continue;
          ASSERT_GE(e, 0) << to_string(r);
          ASSERT_LT(e, cfg.num_experts) << to_string(r);
          ASSERT_TRUE(seen.insert(e).second)
              << "expert " << e << " twice in token " << t << " (" << to_string(r) << ")";
        }
        if (r != Routing::kDropped) EXPECT_EQ(static_cast<int>(seen.size()), cfg.topk);
      }
    }
  }
}

TEST(Tokens, UniformSpreadsOverAllExperts) {
  const LayerConfig cfg = config(64, 8);
  const HostTokens in = make_tokens(cfg, 1, 0, 4000, Routing::kUniform, 9);
  const std::vector<int> hist = expert_histogram(in, 64);
  const double mean = 4000.0 * 8 / 64;  // 500
  for (int c : hist) EXPECT_NEAR(c, mean, 0.25 * mean);
}

TEST(Tokens, SkewedConcentratesOnHotExperts) {
  for (const LayerConfig& cfg : {config(256, 8), config(64, 8), config(8, 2)}) {
    const int T = 4000;
    const HostTokens in = make_tokens(cfg, 1, 0, T, Routing::kSkewed, 21);
    std::vector<int> hist = expert_histogram(in, cfg.num_experts);
    std::sort(hist.rbegin(), hist.rend());
    const int hot = std::min(4, std::max(1, cfg.num_experts / 4));
    long hot_slots = 0;
    for (int i = 0; i < hot; ++i) hot_slots += hist[i];
    const double hot_share = static_cast<double>(hot_slots) / (static_cast<double>(T) * cfg.topk);
    const double uniform_share = static_cast<double>(hot) / cfg.num_experts;
    std::printf("skewed, %d experts, top-%d: %d hot experts take %.3f of the slots (uniform: %.3f)\n", cfg.num_experts,
                cfg.topk, hot, hot_share, uniform_share);
    EXPECT_GT(hot_share, 0.4) << cfg.num_experts << " experts";  // about half
    EXPECT_GT(hot_share, 1.5 * uniform_share) << cfg.num_experts << " experts";
    if (cfg.num_experts >= 256) EXPECT_GT(hot_share, 20 * uniform_share);
  }
}

TEST(Tokens, OneExpertUsesSlotZeroOnly) {
  const LayerConfig cfg = config(64, 8);
  std::set<int> targets;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    // Every rank routes to the same expert.
    const HostTokens a = make_tokens(cfg, 4, 0, 50, Routing::kOneExpert, seed);
    const HostTokens b = make_tokens(cfg, 4, 3, 50, Routing::kOneExpert, seed);
    const int target = a.topk_idx[0];
    ASSERT_GE(target, 0);
    ASSERT_LT(target, 64);
    targets.insert(target);
    for (const HostTokens* in : {&a, &b})
      for (int t = 0; t < 50; ++t) {
        EXPECT_EQ(in->topk_idx[t * 8], target);
        EXPECT_FLOAT_EQ(in->topk_weights[t * 8], 1.0f);
        for (int j = 1; j < 8; ++j) EXPECT_EQ(in->topk_idx[t * 8 + j], -1);
      }
  }
  EXPECT_GT(targets.size(), 5u);  // derived from the seed, not a constant
}

TEST(Tokens, DroppedAboutAQuarterSomeTokensEntirely) {
  const LayerConfig cfg = config(64, 8);
  const HostTokens in = make_tokens(cfg, 2, 1, 4000, Routing::kDropped, 13);
  int dropped = 0, whole_tokens = 0;
  for (int t = 0; t < in.num_tokens; ++t) {
    int d = 0;
    for (int j = 0; j < 8; ++j) d += in.topk_idx[t * 8 + j] == -1;
    dropped += d;
    whole_tokens += d == 8;
  }
  EXPECT_NEAR(dropped / (4000.0 * 8), 0.25, 0.03);
  EXPECT_GT(whole_tokens, 100);  // ~1 in 16
  EXPECT_LT(whole_tokens, 400);
  // Uniform routing drops nothing.
  const HostTokens full = make_tokens(cfg, 2, 1, 1000, Routing::kUniform, 13);
  EXPECT_EQ(std::count(full.topk_idx.begin(), full.topk_idx.end(), -1), 0);
}

TEST(Tokens, WeightsPositiveAndNormalisedOverKeptSlots) {
  const LayerConfig cfg = config(64, 8);
  for (Routing r : kAllRoutings) {
    const HostTokens in = make_tokens(cfg, 1, 0, 1000, r, 17);
    for (int t = 0; t < in.num_tokens; ++t) {
      double kept = 0;
      int num_kept = 0;
      for (int j = 0; j < 8; ++j) {
        const float w = in.topk_weights[t * 8 + j];
        ASSERT_GT(w, 0.0f) << "dropped slots keep a non-zero weight too";
        ASSERT_TRUE(std::isfinite(w));
        if (in.topk_idx[t * 8 + j] >= 0) {
          kept += w;
          ++num_kept;
        }
      }
      if (num_kept > 0) EXPECT_NEAR(kept, 1.0, 1e-5) << to_string(r) << " token " << t;
    }
  }
}

TEST(Tokens, RejectsBadArguments) {
  const LayerConfig cfg = config();
  EXPECT_THROW(make_tokens(cfg, 2, 2, 10, Routing::kUniform, 1), Error);
  EXPECT_THROW(make_tokens(cfg, 2, -1, 10, Routing::kUniform, 1), Error);
  EXPECT_THROW(make_tokens(cfg, 2, 0, -1, Routing::kUniform, 1), Error);
  LayerConfig bad = cfg;
  bad.hidden = 100;
  try {
    make_tokens(bad, 2, 0, 10, Routing::kUniform, 1);
    ADD_FAILURE() << "accepted hidden=100";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
  }
}

TEST(TokenCounts, InRangeDeterministicReachingBothEnds) {
  bool saw_zero = false, saw_max = false, saw_between = false;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::vector<int> counts = make_token_counts(4, 100, seed);
    ASSERT_EQ(counts.size(), 4u);
    EXPECT_EQ(counts, make_token_counts(4, 100, seed));
    for (int c : counts) {
      ASSERT_GE(c, 0);
      ASSERT_LE(c, 100);
      saw_zero |= c == 0;
      saw_max |= c == 100;
      saw_between |= c > 0 && c < 100;
    }
  }
  EXPECT_TRUE(saw_zero);
  EXPECT_TRUE(saw_max);
  EXPECT_TRUE(saw_between);
  EXPECT_NE(make_token_counts(8, 4096, 1), make_token_counts(8, 4096, 2));
  EXPECT_EQ(make_token_counts(3, 0, 5), (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(make_token_counts(0, 10, 1), Error);
  EXPECT_THROW(make_token_counts(2, -1, 1), Error);
}

TEST(Weights, DeterministicScaledAndDistinctPerTensor) {
  const LayerConfig cfg = config();
  EXPECT_EQ(__bfloat16_as_ushort(weight_w13(cfg, 3, 5, 7, 11)), __bfloat16_as_ushort(weight_w13(cfg, 3, 5, 7, 11)));
  int differs_seed = 0, differs_expert = 0, differs_tensor = 0;
  double max13 = 0, max2 = 0, sum2 = 0;
  for (int row = 0; row < 128; ++row)
    for (int col = 0; col < 128; ++col) {
      const float a = __bfloat162float(weight_w13(cfg, 3, 5, row, col));
      differs_seed += a != __bfloat162float(weight_w13(cfg, 4, 5, row, col));
      differs_expert += a != __bfloat162float(weight_w13(cfg, 3, 6, row, col));
      const float b = __bfloat162float(weight_w2(cfg, 3, 5, row, col));
      differs_tensor += a != b;  // the draws differ
      max13 = std::max(max13, std::fabs(static_cast<double>(a)));
      max2 = std::max(max2, std::fabs(static_cast<double>(b)));
      sum2 += static_cast<double>(a) * a;
    }
  EXPECT_GT(differs_seed, 16000);
  EXPECT_GT(differs_expert, 16000);
  EXPECT_GT(differs_tensor, 16000);
  // The block [0, 128)^2: w13 entries uniform in [-1, 1) / sqrt(H = 256), w2 in [-1, 1) / sqrt(I = 128),
  // times the block's magnitude (generator.h group_magnitude).
  const double m13 = detail::group_magnitude(detail::weight_block_key(3, detail::Stream::kW13, 5, 0), 0);
  const double m2 = detail::group_magnitude(detail::weight_block_key(3, detail::Stream::kW2, 5, 0), 0);
  EXPECT_LE(max13, m13 / 16 * 1.004);
  EXPECT_GT(max13, 0.95 * m13 / 16);
  EXPECT_LE(max2, m2 / std::sqrt(128.0) * 1.004);
  EXPECT_GT(max2, 0.95 * m2 / std::sqrt(128.0));
  EXPECT_NEAR(sum2 / (128 * 128), m13 * m13 / 3 / 256, 0.05 * m13 * m13 / 256);
}

TEST(Generator, Bf16RoundingMatchesCudaRoundToNearestEven) {
  // Every float with 16 random high bits and each interesting low half: exact, tie (even and odd), above.
  int checked = 0;
  for (uint32_t high = 0; high < 0x10000; ++high) {
    const uint32_t exponent = (high >> 7) & 0xff;
    if (exponent == 0xff || exponent == 0xfe) continue;  // inf/NaN, and values that round to inf
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const uint32_t bits = high << 16 | low;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      ASSERT_EQ(detail::bf16_bits_rn(f), __bfloat16_as_ushort(__float2bfloat16_rn(f))) << std::hex << bits;
      ASSERT_EQ(detail::bf16_bits_to_float(detail::bf16_bits_rn(f)), __bfloat162float(__float2bfloat16_rn(f)));
      ++checked;
    }
  }
  EXPECT_GT(checked, 300000);
}

}  // namespace
}  // namespace epfuse
