#include "bench/floor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

const Ceilings kFacts{812.0, 4250.0, 350.0};  // FACTS.md's ceilings (4x H200)

LayerConfig model(std::string_view name, int tokens) { return make_config(*find_model(name), tokens); }

// FACTS.md "Floors" table, world = 4: config, T, compute, weights, comm, floor (ms, 3 decimals).
struct FactsRow {
  const char* config;
  int tokens;
  double compute, weights, comm, floor;
};
constexpr FactsRow kFactsTable[] = {
    {"dsv3", 128, 0.111, 1.326, 0.028, 1.326},      {"dsv3", 1024, 0.889, 1.326, 0.226, 1.326},
    {"dsv3", 4096, 3.554, 1.326, 0.906, 3.554},     {"qwen3-30b", 128, 0.012, 0.071, 0.008, 0.071},
    {"qwen3-30b", 4096, 0.381, 0.071, 0.259, 0.381}, {"qwen3-30b", 16384, 1.523, 0.071, 1.035, 1.523},
    {"mixtral", 4096, 3.554, 0.166, 0.252, 3.554},
};

TEST(Floor, ReproducesFactsTable) {
  const double rounding = 0.0005 + 1e-9;
  for (const FactsRow& row : kFactsTable) {
    SCOPED_TRACE(std::string(row.config) + " T=" + std::to_string(row.tokens));
    const LayerConfig cfg = model(row.config, row.tokens);
    const Floor f = layer_floor(cfg, expected_uniform_load(cfg, 4, row.tokens), kFacts);
    EXPECT_NEAR(f.compute_ms, row.compute, rounding);
    EXPECT_NEAR(f.weights_ms, row.weights, rounding);
    EXPECT_NEAR(f.floor_ms(), row.floor, rounding);
    // FACTS.md's comm column counts remote ranks as 3 * (1 - (3/4)^k), as if the k experts were
    // drawn with replacement; for k *distinct* experts (the generator's uniform routing) a token
    // reaches slightly more ranks: 0.4% more at top-8, 6% more for mixtral's top-2 of 8. No floor
    // of the table changes (compute or weights is the larger term in every row).
    EXPECT_GE(f.comm_ms, row.comm - rounding);
    EXPECT_LE(f.comm_ms, row.comm * 1.065);
    const double with_replacement = 2.0 * row.tokens * 3 * (1 - std::pow(0.75, cfg.topk)) *
                                    token_row_bytes(cfg) / 350e9 * 1e3;
    EXPECT_NEAR(with_replacement, row.comm, rounding);
  }
}

TEST(Floor, BoundNamesTheLargestTerm) {
  EXPECT_EQ((Floor{3, 1, 2}).bound(), "compute");
  EXPECT_EQ((Floor{1, 3, 2}).bound(), "weights");
  EXPECT_EQ((Floor{1, 2, 3}).bound(), "comm");
  EXPECT_DOUBLE_EQ((Floor{1, 2, 3}).floor_ms(), 3);
}

TEST(Floor, RejectsMissingCeilings) {
  const LayerConfig cfg = model("dsv3", 128);
  const RankLoad load = expected_uniform_load(cfg, 4, 128);
  EXPECT_THROW(layer_floor(cfg, load, {0, 4250, 350}), Error);
  EXPECT_THROW(layer_floor(cfg, load, {812, 4250, 0}), Error);
  // One rank sends nothing: no NVLink ceiling needed.
  const RankLoad single = expected_uniform_load(cfg, 1, 128);
  EXPECT_EQ(single.remote_rows, 0);
  EXPECT_EQ(layer_floor(cfg, single, {812, 4250, 0}).comm_ms, 0);
}

TEST(Floor, ExpectedRemoteRanksMatchesEnumeration) {
  // E = 8 experts, 4 ranks of 2, k = 2: P(rank not hit) = C(6,2)/C(8,2) = 15/28.
  LayerConfig cfg = model("mixtral", 16);
  EXPECT_NEAR(expected_remote_ranks_per_token(cfg, 4), 3.0 * 13.0 / 28.0, 1e-12);
  // Every expert on its own rank, k = E: all other ranks are hit.
  cfg.num_experts = 4;
  cfg.topk = 4;
  EXPECT_NEAR(expected_remote_ranks_per_token(cfg, 4), 3.0, 1e-12);
  EXPECT_EQ(expected_remote_ranks_per_token(cfg, 1), 0.0);
}

// Draws uniform routing (k distinct experts per token) and checks the counted loads against the
// expectations: the two ways the harness computes a floor must agree.
TEST(Floor, CountedLoadMatchesExpectationOnRandomRouting) {
  LayerConfig cfg = model("qwen3-30b", 64);
  cfg.num_experts = 64;  // small enough that not every expert is hit
  const int world = 4, tokens = 2;  // 8 tokens of top-8 over 64 experts: about a third missed
  std::mt19937_64 rng(7);
  const int trials = 4000;
  double sends = 0, hit = 0, slots = 0;
  for (int trial = 0; trial < trials; ++trial) {
    RoutingCounts counts = make_routing_counts(cfg, world);
    for (int rank = 0; rank < world; ++rank) {
      std::vector<int32_t> topk;
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> experts(cfg.num_experts);
        std::iota(experts.begin(), experts.end(), 0);
        std::shuffle(experts.begin(), experts.end(), rng);
        topk.insert(topk.end(), experts.begin(), experts.begin() + cfg.topk);
      }
      count_rank_routing(cfg, world, rank, topk, counts);
    }
    const RankLoad load = rank_load(cfg, world, trial % world, counts);
    sends += load.remote_rows;
    hit += load.experts_hit;
    slots += load.routed_slots;
  }
  const RankLoad expected = expected_uniform_load(cfg, world, tokens);
  EXPECT_NEAR(sends / trials, expected.remote_rows, 0.02 * expected.remote_rows);
  EXPECT_NEAR(hit / trials, expected.experts_hit, 0.02 * expected.experts_hit);
  EXPECT_NEAR(slots / trials, expected.routed_slots, 0.02 * expected.routed_slots);
  EXPECT_LT(expected.experts_hit, cfg.experts_per_rank(world) - 0.5);  // the test exercises misses
}

TEST(Floor, CountsHandcraftedRouting) {
  LayerConfig cfg = model("mixtral", 4);  // 8 experts, top-2; 4 ranks own {0,1} {2,3} {4,5} {6,7}
  RoutingCounts counts = make_routing_counts(cfg, 4);
  // Rank 1's tokens: t0 -> experts 0, 1 (rank 0 once); t1 -> 3, 6 (local rank 1, and rank 3);
  // t2 -> dropped, 5 (rank 2); t3 -> all dropped.
  const std::vector<int32_t> topk{0, 1, 3, 6, -1, 5, -1, -1};
  count_rank_routing(cfg, 4, 1, topk, counts);
  EXPECT_EQ(counts.sends_per_rank, (std::vector<double>{0, 3, 0, 0}));
  EXPECT_EQ(counts.recvs_per_rank, (std::vector<double>{1, 0, 1, 1}));
  EXPECT_EQ(counts.slots_per_expert, (std::vector<double>{1, 1, 0, 1, 0, 1, 1, 0}));
  const RankLoad r0 = rank_load(cfg, 4, 0, counts), r1 = rank_load(cfg, 4, 1, counts);
  EXPECT_EQ(r0.routed_slots, 2);
  EXPECT_EQ(r0.experts_hit, 2);
  EXPECT_EQ(r0.remote_rows, 1);
  EXPECT_EQ(r1.routed_slots, 1);
  EXPECT_EQ(r1.experts_hit, 1);
  EXPECT_EQ(r1.remote_rows, 3);
  const std::vector<int32_t> bad{0, 8};
  EXPECT_THROW(count_rank_routing(cfg, 4, 0, bad, counts), Error);
  const std::vector<int32_t> ragged{0, 1, 2};
  EXPECT_THROW(count_rank_routing(cfg, 4, 0, ragged, counts), Error);
}

TEST(Floor, FlopsAndBytes) {
  const LayerConfig cfg = model("dsv3", 1);
  EXPECT_DOUBLE_EQ(expert_weight_bytes(cfg), 3.0 * 7168 * 2048 * 2);
  EXPECT_DOUBLE_EQ(token_row_bytes(cfg), 7168 * 2);
  EXPECT_DOUBLE_EQ(expert_flops(cfg, 10), 2.0 * 10 * 3 * 7168 * 2048);
}

// FP8 layers: weights at one byte plus a float per 128x128 block, compute at the FP8 GEMM rate
// (FACTS.md, one GPU: dsv3 per-GPU T=128 FP8 floor 0.66 ms, weights-bound).
TEST(Floor, Fp8WeightsAndCompute) {
  LayerConfig cfg = model("dsv3", 1);
  cfg.weight_format = WeightFormat::kFp8Block128;
  EXPECT_DOUBLE_EQ(expert_weight_bytes(cfg), 3.0 * 7168 * 2048 + 3.0 * 56 * 16 * 4);
  Ceilings c{812, 4250, 350};
  EXPECT_DOUBLE_EQ(c.fp8_gemm_tflops, 1447);
  RankLoad load;
  load.routed_slots = 1e6;
  load.experts_hit = 64;
  const Floor f = layer_floor(cfg, load, c);
  EXPECT_NEAR(f.compute_ms, expert_flops(cfg, 1e6) / 1447e12 * 1e3, 1e-12);
  EXPECT_NEAR(f.weights_ms, 64 * expert_weight_bytes(cfg) / 4250e9 * 1e3, 1e-12);
  load.routed_slots = 128 * 8;
  EXPECT_NEAR(layer_floor(cfg, load, c).floor_ms(), 0.66, 0.01);
}

}  // namespace
}  // namespace epfuse::bench
