// The unfused layer on 1, 2 or 4 GPUs (one process each): what the CLI correctness matrix
// (tests/gpu/run) cannot cover. Bad input on one rank must make EVERY rank throw the same Error
// before any row moves, and the next call must work; plus a reference check over all routings,
// changing token counts (0 and 1 included), the clamp, and phase timing.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "epfuse/epfuse.h"
#include "layer_rank.h"
#include "multiprocess.h"

namespace epfuse {
namespace {

LayerConfig test_config(float clamp = 0.0f) { return testing::small_layer_config(128, clamp); }

// The unfused layer's rank: the shared fixture.
class Rank : public testing::LayerRank {
 public:
  explicit Rank(const LayerConfig& cfg) : LayerRank(Impl::kUnfused, cfg) {}
};

// Every rank calls forward with its own batch and must get kInvalidArgument with exactly `message`.
void expect_everyone_throws(Rank& r, const TokenBatch& batch, bf16* y, const std::string& message) {
  try {
    r.layer().forward(batch, y, r.stream());
    ADD_FAILURE() << "rank " << r.rank() << ": no error, expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(UnfusedLayer, MatchesReferenceForEveryRoutingAndTokenCount) {
  Rank r(test_config());
  uint64_t seed = 100;
  for (Routing routing : {Routing::kUniform, Routing::kSkewed, Routing::kOneExpert, Routing::kDropped}) {
    // Changing per-rank counts from a shared seed: 0 and max both occur over the calls.
    for (int call = 0; call < 3; ++call, ++seed) {
      const int count = make_token_counts(r.world(), 96, seed)[r.rank()];
      r.expect_matches_reference(r.tokens(count, routing, seed),
                                 std::string(to_string(routing)) + " T=" + std::to_string(count));
    }
  }
  r.expect_matches_reference(r.tokens(1, Routing::kUniform, 7), "T=1");
  r.expect_matches_reference(r.tokens(0, Routing::kUniform, 8), "T=0");
  r.expect_matches_reference(r.tokens(96, Routing::kUniform, 9), "T=max");
}

TEST(UnfusedLayer, AllRanksWithoutTokens) {
  Rank r(test_config());
  r.expect_matches_reference(r.tokens(0, Routing::kUniform, 1), "all T=0");
  r.expect_matches_reference(r.tokens(5, Routing::kUniform, 2), "after all T=0");
}

TEST(UnfusedLayer, ClampMatchesReference) {
  Rank r(test_config(0.05f));  // small enough to bite on these inputs
  r.expect_matches_reference(r.tokens(64, Routing::kUniform, 11), "clamp 0.05");
}

TEST(UnfusedLayer, BadExpertIdOnOneRankFailsEveryRankThenRecovers) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  const int bad_rank = r.world() - 1;
  HostTokens in = r.tokens(40, Routing::kUniform, 21);
  if (r.rank() == bad_rank) {
    in.topk_idx[7 * cfg.topk + 2] = cfg.num_experts + 3;  // the first bad one: reported
    in.topk_idx[30 * cfg.topk + 0] = -5;                  // a later one: not reported
  }
  r.upload(in);
  expect_everyone_throws(r, r.batch(in.num_tokens), r.y(),
                         "rank " + std::to_string(bad_rank) + ": topk_idx[7][2] = " +
                             std::to_string(cfg.num_experts + 3) + " out of range [-1, " +
                             std::to_string(cfg.num_experts) + ")");
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 22), "after a bad expert id");
}

TEST(UnfusedLayer, TooManyTokensFailsEveryRank) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  r.upload(r.tokens(10, Routing::kUniform, 30));  // valid routing behind every pointer
  const int count = r.rank() == 0 ? cfg.max_tokens_per_rank + 1 : 10;
  expect_everyone_throws(r, r.batch(count), r.y(),
                         "rank 0: num_tokens = " + std::to_string(cfg.max_tokens_per_rank + 1) +
                             " out of range [0, max_tokens_per_rank = " + std::to_string(cfg.max_tokens_per_rank) +
                             "]");
  r.expect_matches_reference(r.tokens(10, Routing::kDropped, 31), "after too many tokens");
}

TEST(UnfusedLayer, NullPointerFailsEveryRank) {
  Rank r(test_config());
  const int bad_rank = r.world() / 2;
  TokenBatch batch = r.batch(12);
  if (r.rank() == bad_rank) batch.topk_idx = nullptr;
  r.upload(r.tokens(12, Routing::kUniform, 41));
  expect_everyone_throws(r, batch, r.y(),
                         "rank " + std::to_string(bad_rank) + ": null pointer(s) topk_idx with num_tokens = 12");
  r.expect_matches_reference(r.tokens(12, Routing::kUniform, 42), "after a null pointer");
}

// The kernels move rows as 16-byte vectors: a misaligned x or y is an input error every rank reports,
// found before any row moves (no rank waits in an all-to-all for the one that stopped).
TEST(UnfusedLayer, MisalignedPointerFailsEveryRank) {
  Rank r(test_config());
  const int bad_rank = r.world() - 1;
  r.upload(r.tokens(12, Routing::kUniform, 43));
  TokenBatch batch = r.batch(12);
  bf16* y = r.y();
  if (r.rank() == bad_rank) y += 1;  // 2 bytes off; the buffer has room for max_tokens_per_rank rows
  expect_everyone_throws(r, batch, y,
                         "rank " + std::to_string(bad_rank) +
                             ": misaligned pointer(s) y with num_tokens = 12 (x and y must be 16-byte aligned)");
  r.expect_matches_reference(r.tokens(12, Routing::kUniform, 44), "after a misaligned pointer");
}

// y is written while x is still read: an output aliasing x is an input error every rank reports.
TEST(UnfusedLayer, OutputAliasingXFailsEveryRank) {
  Rank r(test_config());
  const int bad_rank = r.world() - 1;
  r.upload(r.tokens(12, Routing::kUniform, 45));
  TokenBatch batch = r.batch(12);
  bf16* y = r.rank() == bad_rank ? const_cast<bf16*>(batch.x) : r.y();
  expect_everyone_throws(r, batch, y,
                         "rank " + std::to_string(bad_rank) +
                             ": y overlaps x with num_tokens = 12 (the output must not alias an input; give y its "
                             "own memory)");
  r.expect_matches_reference(r.tokens(12, Routing::kUniform, 46), "after y aliasing x");
}

TEST(UnfusedLayer, PhaseTimingIsOptional) {
  Rank r(test_config());
  EXPECT_FALSE(r.layer().last_phase_times().has_value());  // off by default
  r.layer().set_phase_timing(true);
  r.expect_matches_reference(r.tokens(32, Routing::kUniform, 51), "timed");
  const auto times = r.layer().last_phase_times();
  ASSERT_TRUE(times.has_value());
  EXPECT_GT(times->dispatch_ms, 0.0f);
  EXPECT_GT(times->experts_ms, 0.0f);
  EXPECT_GT(times->combine_ms, 0.0f);
  r.layer().set_phase_timing(false);
  r.expect_matches_reference(r.tokens(32, Routing::kUniform, 52), "untimed");
  EXPECT_FALSE(r.layer().last_phase_times().has_value());
}

TEST(UnfusedLayer, CreateValidates) {
  const LayerConfig cfg = test_config();
  detail::DeviceBuffer w(16);
  const ExpertWeights weights{w.as<bf16>(), w.as<bf16>()};
  LayerConfig bad = cfg;
  bad.hidden = 100;
  try {
    MoeLayer::create(Impl::kUnfused, bad, testing::comm(), weights);
    ADD_FAILURE() << "no error for hidden=100";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
  }
  try {
    MoeLayer::create(Impl::kUnfused, cfg, testing::comm(), {nullptr, nullptr});
    ADD_FAILURE() << "no error for null weights";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
  auto layer = MoeLayer::create(Impl::kUnfused, cfg, testing::comm(), weights);
  EXPECT_EQ(layer->impl(), Impl::kUnfused);
  EXPECT_GT(layer->memory().private_bytes, 0u);
  EXPECT_EQ(layer->memory().symmetric_bytes, 0u);
}

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 2); }
