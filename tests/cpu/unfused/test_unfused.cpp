// The unfused chain's protocol arithmetic (protocol.h), buffer plan (plan.h), count reading
// (counts.h) and GEMM path choice (gemm_path.h), and a CPU walk through the whole protocol on
// simulated ranks that uses the same functions as the kernels: every (token, slot) must reach its
// expert's row exactly once and come back to its token, within the plan's bounds.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "epfuse/error.h"
#include "epfuse/layer.h"
#include "unfused/counts.h"
#include "unfused/gemm_path.h"
#include "unfused/plan.h"
#include "unfused/protocol.h"

namespace epfuse::unfused {
namespace {

LayerConfig small_config(int experts, int topk, int max_tokens) {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 128;
  cfg.num_experts = experts;
  cfg.topk = topk;
  cfg.max_tokens_per_rank = max_tokens;
  return cfg;
}

// ---- protocol.h -----------------------------------------------------------------------------------------

TEST(Layout, TokenGoesOncePerDestinationRank) {
  // 8 experts on 4 ranks (2 each): experts 1 and 0 on rank 0, 5 on rank 2, 4 on rank 2 again.
  const int32_t experts[] = {1, 5, -1, 0, 4};
  const int E = 8, El = 2;
  EXPECT_TRUE(first_slot_for_rank(experts, 0, E, El));   // rank 0, first
  EXPECT_TRUE(first_slot_for_rank(experts, 1, E, El));   // rank 2, first
  EXPECT_FALSE(first_slot_for_rank(experts, 2, E, El));  // dropped
  EXPECT_FALSE(first_slot_for_rank(experts, 3, E, El));  // rank 0 again
  EXPECT_FALSE(first_slot_for_rank(experts, 4, E, El));  // rank 2 again
}

TEST(Layout, BadIdsRouteNowhereAndDoNotHideLaterSlots) {
  const int32_t experts[] = {-7, 8, 3};  // E = 8: -7 and 8 are out of range
  EXPECT_FALSE(first_slot_for_rank(experts, 0, 8, 4));
  EXPECT_FALSE(first_slot_for_rank(experts, 1, 8, 4));
  EXPECT_TRUE(first_slot_for_rank(experts, 2, 8, 4));
  EXPECT_EQ(local_expert_at(experts, 1, 1, 8, 4), -1);  // 8 / 4 = 2 would be "rank 2" if not checked
  EXPECT_FALSE(routed(-1, 8));
  EXPECT_FALSE(routed(8, 8));
  EXPECT_TRUE(routed(0, 8));
}

TEST(Layout, LocalExpertPerDestination) {
  const int32_t experts[] = {6, 1, 7, -1};  // El = 4: rank 1 holds 4..7
  EXPECT_EQ(local_expert_at(experts, 0, 1, 8, 4), 2);
  EXPECT_EQ(local_expert_at(experts, 1, 1, 8, 4), -1);  // expert 1 is on rank 0
  EXPECT_EQ(local_expert_at(experts, 1, 0, 8, 4), 1);
  EXPECT_EQ(local_expert_at(experts, 2, 1, 8, 4), 3);
  EXPECT_EQ(local_expert_at(experts, 3, 0, 8, 4), -1);
}

TEST(Layout, RecordsAre16ByteAligned) {
  for (int hidden : {128, 256, 7168})
    for (int topk = 1; topk <= 16; ++topk) {
      const int64_t bytes = record_bytes(hidden, topk);
      EXPECT_EQ(bytes % 16, 0) << hidden << " " << topk;
      EXPECT_GE(bytes - record_meta_offset(hidden), 8 * topk);  // k ids and k weights fit
      EXPECT_LT(bytes - record_meta_offset(hidden), 8 * topk + 16);
    }
  EXPECT_EQ(record_bytes(7168, 8), 7168 * 2 + 64);
  EXPECT_EQ(record_bytes(256, 3), 512 + 32);
}

TEST(Layout, FirstBadExpertWinsUnderAtomicMax) {
  const int topk = 8;
  const uint64_t a = bad_expert_key(3, 5, topk, 900), b = bad_expert_key(3, 6, topk, -2),
                 c = bad_expert_key(4, 0, topk, -100);
  EXPECT_GT(a, b);  // the larger key is the earlier (token, slot)
  EXPECT_GT(b, c);
  EXPECT_NE(a, 0u);
  EXPECT_NE(bad_expert_key(0, 0, 1, -1), 0u);  // 0 means "no error" and is never a key
  for (uint64_t key : {a, b, c}) {
    const BadExpert bad = decode_bad_expert(key, topk);
    EXPECT_EQ(bad_expert_key(bad.token, bad.slot, topk, bad.value), key);
  }
  const BadExpert bad = decode_bad_expert(std::max({c, a, b}), topk);
  EXPECT_EQ(bad.token, 3);
  EXPECT_EQ(bad.slot, 5);
  EXPECT_EQ(bad.value, 900);
  const BadExpert negative = decode_bad_expert(b, topk);
  EXPECT_EQ(negative.value, -2);
  const BadExpert far = decode_bad_expert(bad_expert_key((1 << 20) - 1, 15, 16, INT32_MIN), 16);
  EXPECT_EQ(far.token, (1 << 20) - 1);
  EXPECT_EQ(far.slot, 15);
  EXPECT_EQ(far.value, INT32_MIN);
}

TEST(Layout, OffsetsFromCounts) {
  const int R = 3, El = 2, W = counts_words(El);
  std::vector<int32_t> counts(R * W, 0);
  const int tokens[] = {4, 0, 7};
  const int rows[R][El] = {{1, 5}, {0, 0}, {9, 2}};
  for (int p = 0; p < R; ++p) {
    counts[p * W + CountsRow::kTokens] = tokens[p];
    for (int e = 0; e < El; ++e) counts[p * W + CountsRow::kExpertRows + e] = rows[p][e];
  }
  EXPECT_EQ(peer_record_offset(counts.data(), W, 0), 0);
  EXPECT_EQ(peer_record_offset(counts.data(), W, 1), 4);
  EXPECT_EQ(peer_record_offset(counts.data(), W, 2), 4);
  EXPECT_EQ(expert_rows(counts.data(), W, R, 0), 10);
  EXPECT_EQ(expert_rows(counts.data(), W, R, 1), 7);
}

TEST(Layout, GridBlocks) {
  EXPECT_EQ(grid_blocks(0, 256, 132, 2), 1);  // an empty launch still has a block
  EXPECT_EQ(grid_blocks(1, 256, 132, 2), 1);
  EXPECT_EQ(grid_blocks(257, 256, 132, 2), 2);
  EXPECT_EQ(grid_blocks(int64_t{1} << 30, 256, 132, 2), 264);  // capped at SMs x blocks per SM
}

TEST(Layout, RowVecWalkVisitsEveryElementOnce) {
  // Every (start, stride) of a grid over [rows, row_vecs], including strides below, equal to and
  // above a row and row_vecs = 1: the walks together visit each flat index exactly once, in order.
  for (const int row_vecs : {1, 7, 96, 256}) {
    for (const int64_t rows : {int64_t{0}, int64_t{1}, int64_t{13}}) {
      for (const int64_t stride :
           {int64_t{1}, int64_t{5}, int64_t{row_vecs}, int64_t{3 * row_vecs + 2}, int64_t{1000}}) {
        std::vector<int> visits(static_cast<size_t>(rows * row_vecs), 0);
        for (int64_t start = 0; start < stride; ++start) {
          int64_t expected = start;
          for (RowVecWalk w = row_vec_walk(start, stride, row_vecs); w.row < rows; advance(w)) {
            ASSERT_GE(w.vec, 0);
            ASSERT_LT(w.vec, row_vecs);
            ASSERT_EQ(w.row * row_vecs + w.vec, expected) << "start " << start << " stride " << stride;
            ++visits[static_cast<size_t>(expected)];
            expected += stride;
          }
          EXPECT_GE(expected, rows * row_vecs);  // stopped only past the end
        }
        for (size_t i = 0; i < visits.size(); ++i) ASSERT_EQ(visits[i], 1) << "index " << i;
      }
    }
  }
}

// ---- plan.h -----------------------------------------------------------------------------------------

TEST(Plan, SizesForASmallConfig) {
  // H 256, I 128, E 16, k 4, T 10, R 2: El 8.
  const UnfusedPlan p = plan_unfused(detail::CheckedConfig::check(small_config(16, 4, 10), 2));
  EXPECT_EQ(p.experts_per_rank, 8);
  EXPECT_EQ(p.counts_words, 5 + 8);
  EXPECT_EQ(p.record_bytes, 256 * 2 + 32);
  EXPECT_EQ(p.max_send_records, 10 * 2);      // min(k, R) = 2
  EXPECT_EQ(p.max_recv_records, 2 * 10);
  EXPECT_EQ(p.max_expert_rows, 2 * 10 * 4);   // min(k, El) = 4
  EXPECT_EQ(p.send_bytes, size_t{20} * 544);
  EXPECT_EQ(p.recv_bytes, size_t{20} * 544);
  EXPECT_EQ(p.rows_bytes, size_t{80} * 256 * 2);
  EXPECT_EQ(p.inter_bytes, size_t{80} * 256 * 2);
  EXPECT_EQ(p.row_weight_bytes, size_t{80} * 4);
  EXPECT_EQ(p.token_rows_bytes, size_t{20} * 4 * 4);
  EXPECT_EQ(p.send_slot_bytes, size_t{10} * 2 * 4);
  EXPECT_EQ(p.send_counts_offset, 0u);
  EXPECT_EQ(p.recv_counts_offset, size_t{2} * 13 * 4);
  EXPECT_GE(p.expert_fill_offset, p.recv_counts_offset + 2 * 13 * 4);
  EXPECT_GE(p.error_key_offset, p.expert_fill_offset + 8 * 4);
  EXPECT_EQ(p.error_key_offset % 8, 0u);
  EXPECT_GE(p.counts_bytes, p.error_key_offset + 8);
  EXPECT_EQ(p.total_bytes, p.send_bytes + p.recv_bytes + p.rows_bytes + p.inter_bytes + p.row_weight_bytes +
                               p.token_rows_bytes + p.send_slot_bytes + p.counts_bytes);
}

TEST(Plan, BoundsUseTheSmallerOfTopkAndRanksOrLocalExperts) {
  // One expert per rank: a token asks each rank for at most one expert.
  const UnfusedPlan one = plan_unfused(detail::CheckedConfig::check(small_config(4, 4, 8), 4));
  EXPECT_EQ(one.max_send_records, 8 * 4);
  EXPECT_EQ(one.max_expert_rows, 4 * 8 * 1);
  // k = 1: a token goes to one rank.
  const UnfusedPlan single = plan_unfused(detail::CheckedConfig::check(small_config(16, 1, 8), 4));
  EXPECT_EQ(single.max_send_records, 8);
  EXPECT_EQ(single.max_expert_rows, 4 * 8);
  // One rank holds everything: rows bounded by k.
  const UnfusedPlan alone = plan_unfused(detail::CheckedConfig::check(small_config(16, 8, 8), 1));
  EXPECT_EQ(alone.max_send_records, 8);
  EXPECT_EQ(alone.max_recv_records, 8);
  EXPECT_EQ(alone.max_expert_rows, 8 * 8);
}

TEST(Plan, RejectsInvalidConfig) {
  try {
    plan_unfused(detail::CheckedConfig::check(small_config(6, 2, 8), 4));  // 6 experts on 4 ranks
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
    EXPECT_NE(std::string(e.what()).find("num_experts"), std::string::npos) << e.what();
  }
}

TEST(Plan, LargestFactsConfig) {
  // dsv3 at 4096 tokens per rank on 4 ranks: 131072 expert rows of 7168 and of 2 x 2048.
  LayerConfig cfg;
  cfg.hidden = 7168;
  cfg.intermediate = 2048;
  cfg.num_experts = 256;
  cfg.topk = 8;
  cfg.max_tokens_per_rank = 4096;
  const UnfusedPlan p = plan_unfused(detail::CheckedConfig::check(cfg, 4));
  EXPECT_EQ(p.max_expert_rows, 131072);
  EXPECT_EQ(p.rows_bytes, size_t{131072} * 7168 * 2);
  EXPECT_EQ(p.inter_bytes, size_t{131072} * 4096 * 2);
  EXPECT_EQ(p.send_bytes, size_t{4096} * 4 * (7168 * 2 + 64));
  EXPECT_LT(p.total_bytes, size_t{4} << 30);  // about 3.4 GB of the H200's 141
}

// ---- counts.h ---------------------------------------------------------------------------------------

std::vector<int32_t> counts_matrix(int world, int words) { return std::vector<int32_t>(world * words, 0); }

TEST(Counts, NoErrorIsNullopt) {
  const LayerConfig cfg = small_config(8, 2, 16);
  const auto recv = counts_matrix(2, counts_words(4));
  EXPECT_FALSE(first_input_error(recv.data(), 2, counts_words(4), cfg).has_value());
}

TEST(Counts, LowestRankErrorWinsWithExactMessage) {
  const LayerConfig cfg = small_config(8, 2, 16);
  const int W = counts_words(4);
  auto recv = counts_matrix(3, W);
  int32_t* row1 = recv.data() + 1 * W;
  row1[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kExpertOutOfRange);
  row1[CountsRow::kErrorToken] = 5;
  row1[CountsRow::kErrorSlot] = 1;
  row1[CountsRow::kErrorValue] = 8;
  int32_t* row2 = recv.data() + 2 * W;
  row2[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kTokenCount);
  row2[CountsRow::kErrorValue] = 17;
  EXPECT_EQ(first_input_error(recv.data(), 3, W, cfg).value(), "rank 1: topk_idx[5][1] = 8 out of range [-1, 8)");
  row1[CountsRow::kErrorCode] = 0;
  EXPECT_EQ(first_input_error(recv.data(), 3, W, cfg).value(),
            "rank 2: num_tokens = 17 out of range [0, max_tokens_per_rank = 16]");
  row2[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kNullPointer);
  row2[CountsRow::kErrorToken] = 3;
  row2[CountsRow::kErrorValue] = NullPointer::kX | NullPointer::kOutput;
  EXPECT_EQ(first_input_error(recv.data(), 3, W, cfg).value(), "rank 2: null pointer(s) x, y with num_tokens = 3");
  row2[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kMisaligned);
  row2[CountsRow::kErrorValue] = NullPointer::kOutput;
  EXPECT_EQ(first_input_error(recv.data(), 3, W, cfg).value(),
            "rank 2: misaligned pointer(s) y with num_tokens = 3 (x and y must be 16-byte aligned)");
  row2[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kCallerFp8X);
  EXPECT_EQ(first_input_error(recv.data(), 3, W, cfg).value(),
            "rank 2: x quantised by the caller (TokenBatch::x_fp8) is not supported by the unfused chain, which sends "
            "bf16 rows: pass x, or use the fused layer");
  row2[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kAliased);
  row2[CountsRow::kErrorValue] = NullPointer::kX | NullPointer::kTopkWeights;
  EXPECT_EQ(first_input_error(recv.data(), 3, W, cfg).value(),
            "rank 2: y overlaps x, topk_weights with num_tokens = 3 (the output must not alias an input; give y its "
            "own memory)");
}

TEST(Counts, TrafficFromCounts) {
  const int R = 2, El = 3, W = counts_words(El);
  auto send = counts_matrix(R, W), recv = counts_matrix(R, W);
  send[0 * W + CountsRow::kTokens] = 4;
  send[1 * W + CountsRow::kTokens] = 6;
  recv[0 * W + CountsRow::kTokens] = 4;
  recv[1 * W + CountsRow::kTokens] = 0;
  recv[0 * W + CountsRow::kExpertRows + 0] = 3;
  recv[0 * W + CountsRow::kExpertRows + 2] = 2;
  recv[1 * W + CountsRow::kExpertRows + 2] = 5;  // inconsistent on purpose: sums are per column
  Traffic t;
  t.expert_rows = {99};  // reused storage must be reset
  read_traffic(send.data(), recv.data(), R, W, El, t);
  EXPECT_EQ(t.send_records, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(t.recv_records, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(t.expert_rows, (std::vector<int>{3, 0, 7}));
  EXPECT_EQ(t.total_send, 10);
  EXPECT_EQ(t.total_recv, 4);
  EXPECT_EQ(t.total_rows, 10);
}

// ---- gemm_path.h -------------------------------------------------------------------------------------

TEST(GemmPath, FactsShapesAtWorld4) {
  // Rows per local expert under uniform routing at world 4 (T * k / E per expert, the same on every
  // rank): dsv3 and qwen3-30b decode stay grouped (weight-bound), the large rows loop.
  const auto uniform = [](int experts, int rows) { return std::vector<int>(experts, rows); };
  EXPECT_EQ(choose_gemm_path(uniform(64, 16)), GemmPath::kGrouped);    // dsv3 T=128
  EXPECT_EQ(choose_gemm_path(uniform(64, 128)), GemmPath::kLoop);      // dsv3 T=1024
  EXPECT_EQ(choose_gemm_path(uniform(64, 512)), GemmPath::kLoop);      // dsv3 T=4096
  EXPECT_EQ(choose_gemm_path(uniform(32, 32)), GemmPath::kGrouped);    // qwen3-30b T=128
  EXPECT_EQ(choose_gemm_path(uniform(32, 1024)), GemmPath::kLoop);     // qwen3-30b T=4096
  EXPECT_EQ(choose_gemm_path(uniform(32, 4096)), GemmPath::kLoop);     // qwen3-30b T=16384
  EXPECT_EQ(choose_gemm_path(uniform(2, 4096)), GemmPath::kLoop);      // mixtral T=4096
}

TEST(GemmPath, MeanOverNonEmptyExpertsOnly) {
  // 63.5 rows on average over the non-empty experts: just under the threshold.
  EXPECT_EQ(choose_gemm_path(std::vector<int>{0, 63, 0, 64, 0}), GemmPath::kGrouped);
  EXPECT_EQ(choose_gemm_path(std::vector<int>{0, 64, 0, 64, 0}), GemmPath::kLoop);
  // Empty experts do not dilute the mean: 2 x 200 rows among 62 empty experts still loops.
  std::vector<int> sparse(64, 0);
  sparse[3] = sparse[40] = 200;
  EXPECT_EQ(choose_gemm_path(sparse), GemmPath::kLoop);
  // Skewed: one hot expert cannot lift a mean of many small ones over the threshold...
  std::vector<int> skewed(64, 8);
  skewed[0] = 3000;
  EXPECT_EQ(choose_gemm_path(skewed), GemmPath::kGrouped);  // (3000 + 63 * 8) / 64 = 54.8
  // ...but a few hot ones can.
  for (int e = 0; e < 4; ++e) skewed[e] = 3000;
  EXPECT_EQ(choose_gemm_path(skewed), GemmPath::kLoop);  // (12000 + 60 * 8) / 64 = 195
  static_assert(kLoopMinMeanRows == 64, "update the cases above with the threshold");
}

TEST(GemmPath, OneOrNoGroup) {
  EXPECT_EQ(choose_gemm_path(std::vector<int>{0, 0, 1, 0}), GemmPath::kLoop);  // one GEMM either way
  EXPECT_EQ(choose_gemm_path(std::vector<int>{0, 0, 0}), GemmPath::kGrouped);  // nothing runs
  EXPECT_EQ(choose_gemm_path(std::vector<int>{}), GemmPath::kGrouped);
}

TEST(GemmPath, OverrideParsing) {
  EXPECT_EQ(parse_gemm_path_override(nullptr), std::nullopt);
  EXPECT_EQ(parse_gemm_path_override(""), std::nullopt);
  EXPECT_EQ(parse_gemm_path_override("auto"), std::nullopt);
  EXPECT_EQ(parse_gemm_path_override("grouped"), GemmPath::kGrouped);
  EXPECT_EQ(parse_gemm_path_override("loop"), GemmPath::kLoop);
  for (GemmPath path : {GemmPath::kGrouped, GemmPath::kLoop})
    EXPECT_EQ(parse_gemm_path_override(to_string(path)), path);
  try {
    parse_gemm_path_override("Loop");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("EPFUSE_UNFUSED_GEMM=\"Loop\""), std::string::npos) << e.what();
  }
}

TEST(GemmPath, OverrideWinsOverTheHeuristic) {
  const std::vector<int> decode(64, 16), prefill(2, 4096);
  EXPECT_EQ(select_gemm_path(std::nullopt, decode), GemmPath::kGrouped);
  EXPECT_EQ(select_gemm_path(std::nullopt, prefill), GemmPath::kLoop);
  EXPECT_EQ(select_gemm_path(GemmPath::kLoop, decode), GemmPath::kLoop);
  EXPECT_EQ(select_gemm_path(GemmPath::kGrouped, prefill), GemmPath::kGrouped);
}

// ---- layer.h names -------------------------------------------------------------------------------

TEST(Impl, NamesRoundTrip) {
  for (Impl impl : {Impl::kUnfused, Impl::kFused}) EXPECT_EQ(parse_impl(to_string(impl)), impl);
  EXPECT_EQ(to_string(Impl::kUnfused), "unfused");
  EXPECT_EQ(to_string(Impl::kFused), "fused");
  EXPECT_FALSE(parse_impl("Unfused").has_value());
  EXPECT_FALSE(parse_impl("").has_value());
}

// ---- The whole protocol on simulated ranks ---------------------------------------------------------

struct RankInput {
  int tokens = 0;
  std::vector<int32_t> idx;    // [T, k]
  std::vector<double> weight;  // [T, k]
  std::vector<double> x;       // one value per token stands for its row
};

// An "expert" that is a different function per global expert.
double expert_fn(int expert, double x) { return std::sin(x * (expert + 1)) + 0.25 * expert; }

struct Record {
  double x;
  std::vector<int32_t> local;
  std::vector<double> weight;
};

// Runs layout, pack, exchange, permute, experts, pre-reduce, return, home reduce as the kernels do
// (sequential tickets stand for the atomics: any order is valid) and returns y per rank; checks every
// buffer bound of the plan on the way.
std::vector<std::vector<double>> simulate(const LayerConfig& cfg, int R, const std::vector<RankInput>& in,
                                          const UnfusedPlan& plan) {
  const int k = cfg.topk, E = cfg.num_experts, El = cfg.experts_per_rank(R), W = counts_words(El);
  std::vector<std::vector<int32_t>> send_counts(R, std::vector<int32_t>(R * W, 0));
  std::vector<std::vector<int32_t>> send_slot(R);
  std::vector<std::vector<Record>> send_records(R);
  for (int r = 0; r < R; ++r) {  // layout + pack
    const RankInput& rank = in[r];
    send_slot[r].assign(static_cast<size_t>(rank.tokens) * R, -1);
    for (int t = 0; t < rank.tokens; ++t) {
      const int32_t* experts = &rank.idx[t * k];
      for (int j = 0; j < k; ++j) {
        if (!routed(experts[j], E)) continue;
        const int d = rank_of_expert(experts[j], El);
        send_counts[r][d * W + CountsRow::kExpertRows + local_expert_of(experts[j], El)]++;
        if (first_slot_for_rank(experts, j, E, El)) send_slot[r][t * R + d] = send_counts[r][d * W + CountsRow::kTokens]++;
      }
    }
    int64_t total = 0;
    for (int d = 0; d < R; ++d) total += send_counts[r][d * W + CountsRow::kTokens];
    EXPECT_LE(total, plan.max_send_records);
    send_records[r].resize(total);
    for (int t = 0; t < rank.tokens; ++t) {
      const int32_t* experts = &rank.idx[t * k];
      for (int j = 0; j < k; ++j) {
        if (!first_slot_for_rank(experts, j, E, El)) continue;
        const int d = rank_of_expert(experts[j], El);
        Record& rec = send_records[r][peer_record_offset(send_counts[r].data(), W, d) + send_slot[r][t * R + d]];
        rec.x = rank.x[t];
        for (int slot = 0; slot < k; ++slot) {
          const int32_t local = local_expert_at(experts, slot, d, E, El);
          rec.local.push_back(local);
          rec.weight.push_back(local >= 0 ? rank.weight[t * k + slot] : 0.0);
        }
      }
    }
  }
  // Counts exchange, then each rank's experts and pre-reduce.
  std::vector<std::vector<double>> combine(R);  // per rank: one value per received record
  std::vector<std::vector<int32_t>> recv_counts(R, std::vector<int32_t>(R * W));
  for (int r = 0; r < R; ++r) {
    for (int s = 0; s < R; ++s)
      std::copy_n(&send_counts[s][r * W], W, &recv_counts[r][s * W]);
    Traffic traffic;
    read_traffic(send_counts[r].data(), recv_counts[r].data(), R, W, El, traffic);
    EXPECT_LE(traffic.total_recv, plan.max_recv_records);
    EXPECT_LE(traffic.total_rows, plan.max_expert_rows);
    std::vector<Record> records;
    for (int s = 0; s < R; ++s) {
      const int64_t first = peer_record_offset(send_counts[s].data(), W, r);
      EXPECT_EQ(traffic.recv_records[s], send_counts[s][r * W + CountsRow::kTokens]);
      records.insert(records.end(), send_records[s].begin() + first,
                     send_records[s].begin() + first + traffic.recv_records[s]);
    }
    // Permute: expert e's rows start after the rows of experts < e.
    std::vector<int64_t> start(El, 0), fill(El, 0);
    for (int e = 1; e < El; ++e) start[e] = start[e - 1] + traffic.expert_rows[e - 1];
    std::vector<double> row_out(traffic.total_rows, std::nan(""));
    std::vector<int> row_hits(traffic.total_rows, 0);
    std::vector<int64_t> token_rows(records.size() * k, -1);
    for (size_t i = 0; i < records.size(); ++i)
      for (int j = 0; j < k; ++j) {
        const int32_t local = records[i].local[j];
        if (local < 0) continue;
        const int64_t row = start[local] + fill[local]++;
        EXPECT_LT(fill[local], traffic.expert_rows[local] + 1) << "expert " << local << " overflows its rows";
        if (row >= traffic.total_rows) continue;
        token_rows[i * k + j] = row;
        ++row_hits[row];
        row_out[row] = records[i].weight[j] * expert_fn(r * El + local, records[i].x);  // SwiGLU weight, GEMMs
      }
    for (int64_t row = 0; row < traffic.total_rows; ++row) EXPECT_EQ(row_hits[row], 1) << "row " << row;
    combine[r].assign(records.size(), 0.0);
    for (size_t i = 0; i < records.size(); ++i)
      for (int j = 0; j < k; ++j)
        if (token_rows[i * k + j] >= 0) combine[r][i] += row_out[token_rows[i * k + j]];
  }
  // Return to the senders and reduce at home.
  std::vector<std::vector<double>> y(R);
  for (int r = 0; r < R; ++r) {
    std::vector<double> returned;
    for (int d = 0; d < R; ++d) {
      const int64_t first = peer_record_offset(recv_counts[d].data(), W, r);  // my block at d
      const int64_t count = send_counts[r][d * W + CountsRow::kTokens];
      returned.insert(returned.end(), combine[d].begin() + first, combine[d].begin() + first + count);
    }
    y[r].assign(in[r].tokens, std::nan(""));
    for (int t = 0; t < in[r].tokens; ++t) {
      double sum = 0.0;
      const int32_t* experts = &in[r].idx[t * k];
      for (int j = 0; j < k; ++j) {
        if (!first_slot_for_rank(experts, j, E, El)) continue;
        const int d = rank_of_expert(experts[j], El);
        sum += returned[peer_record_offset(send_counts[r].data(), W, d) + send_slot[r][t * R + d]];
      }
      y[r][t] = sum;
    }
  }
  return y;
}

enum class Routing { kUniform, kOneExpert, kDropped, kAllToAll };

RankInput make_input(const LayerConfig& cfg, int tokens, Routing routing, std::mt19937& rng) {
  RankInput in;
  in.tokens = tokens;
  const int k = cfg.topk, E = cfg.num_experts;
  std::uniform_real_distribution<double> unit(0.1, 1.0);
  for (int t = 0; t < tokens; ++t) {
    in.x.push_back(unit(rng) * 3.0);
    std::vector<int32_t> all(E);
    for (int e = 0; e < E; ++e) all[e] = e;
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < k; ++j) {
      int32_t expert = all[j];
      if (routing == Routing::kOneExpert) expert = j == 0 ? 3 % E : -1;
      if (routing == Routing::kDropped && (t % 5 == 0 || rng() % 4 == 0)) expert = -1;  // some tokens fully dropped
      if (routing == Routing::kAllToAll) expert = j;  // experts 0..k-1 in order
      in.idx.push_back(expert);
      in.weight.push_back(unit(rng));  // dropped slots keep a weight that must be ignored
    }
  }
  return in;
}

std::vector<double> expected_y(const LayerConfig& cfg, const RankInput& in) {
  std::vector<double> y(in.tokens, 0.0);
  for (int t = 0; t < in.tokens; ++t)
    for (int j = 0; j < cfg.topk; ++j) {
      const int32_t e = in.idx[t * cfg.topk + j];
      if (e >= 0) y[t] += in.weight[t * cfg.topk + j] * expert_fn(e, in.x[t]);
    }
  return y;
}

struct Case {
  int world, experts, topk;
  Routing routing;
  std::vector<int> tokens;  // per rank
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  static const char* const kRouting[] = {"uniform", "one_expert", "dropped", "all_to_all"};
  const Case& c = info.param;
  std::ostringstream name;  // (std::string's operator+ chain trips a GCC 12 -Wrestrict false positive)
  name << "w" << c.world << "_E" << c.experts << "_k" << c.topk << "_" << kRouting[static_cast<int>(c.routing)] << "_"
       << info.index;
  return name.str();
}

class Protocol : public ::testing::TestWithParam<Case> {};

TEST_P(Protocol, EverySlotReachesItsExpertAndComesBack) {
  const Case& c = GetParam();
  const int max_tokens = std::max(1, *std::max_element(c.tokens.begin(), c.tokens.end()));
  const LayerConfig cfg = small_config(c.experts, c.topk, max_tokens);
  const UnfusedPlan plan = plan_unfused(detail::CheckedConfig::check(cfg, c.world));
  std::mt19937 rng(1234 + c.world * 7 + c.experts * 3 + c.topk);
  std::vector<RankInput> in;
  for (int r = 0; r < c.world; ++r) in.push_back(make_input(cfg, c.tokens[r], c.routing, rng));
  const auto y = simulate(cfg, c.world, in, plan);
  for (int r = 0; r < c.world; ++r) {
    const auto want = expected_y(cfg, in[r]);
    ASSERT_EQ(y[r].size(), want.size());
    for (int t = 0; t < in[r].tokens; ++t) EXPECT_NEAR(y[r][t], want[t], 1e-12) << "rank " << r << " token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Routings, Protocol,
    ::testing::Values(Case{1, 8, 2, Routing::kUniform, {13}}, Case{2, 8, 2, Routing::kUniform, {17, 9}},
                      Case{4, 16, 8, Routing::kUniform, {40, 0, 33, 1}},  // a rank with no tokens, T = 1
                      Case{4, 8, 8, Routing::kUniform, {20, 20, 20, 20}},  // k = E: every expert
                      Case{2, 16, 4, Routing::kOneExpert, {30, 25}},       // one hot expert, others empty
                      Case{4, 16, 4, Routing::kDropped, {31, 12, 0, 27}},  // dropped slots and tokens
                      Case{2, 4, 1, Routing::kUniform, {9, 14}},           // k = 1
                      Case{4, 8, 3, Routing::kUniform, {0, 0, 0, 0}},       // nobody has tokens
                      // world 8 (the 8-GPU machine runs these shapes; nothing may assume R <= 4)
                      Case{8, 32, 8, Routing::kUniform, {21, 0, 7, 1, 16, 16, 3, 30}},
                      Case{8, 16, 4, Routing::kDropped, {12, 9, 0, 15, 4, 11, 13, 2}},
                      Case{8, 64, 8, Routing::kOneExpert, {10, 10, 10, 10, 10, 10, 10, 10}}),
    case_name);

TEST(Protocol, WorstCaseReachesThePlanBoundsExactly) {
  // 4 ranks, one expert each, k = 4 and every token to all experts: each rank sends T*4 records,
  // receives 4*T, computes 4*T rows: the plan's bounds are tight.
  const int R = 4, T = 6;
  const LayerConfig cfg = small_config(4, 4, T);
  const UnfusedPlan plan = plan_unfused(detail::CheckedConfig::check(cfg, R));
  std::mt19937 rng(7);
  std::vector<RankInput> in;
  for (int r = 0; r < R; ++r) in.push_back(make_input(cfg, T, Routing::kAllToAll, rng));
  const auto y = simulate(cfg, R, in, plan);
  EXPECT_EQ(plan.max_send_records, T * 4);
  EXPECT_EQ(plan.max_recv_records, R * T);
  EXPECT_EQ(plan.max_expert_rows, R * T);
  for (int r = 0; r < R; ++r) {
    const auto want = expected_y(cfg, in[r]);
    for (int t = 0; t < T; ++t) EXPECT_NEAR(y[r][t], want[t], 1e-12);
  }
}

}  // namespace
}  // namespace epfuse::unfused
