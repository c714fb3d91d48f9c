// The unfused layer on 1, 2 or 4 GPUs (one process each): what the CLI correctness matrix
// (tests/gpu/run) cannot cover. Bad input on one rank must make EVERY rank throw the same Error
// before any row moves, and the next call must work; plus a reference check over all routings,
// changing token counts (0 and 1 included), the clamp, and phase timing.
// UnfusedFaults (registered apart as test_gpu_unfused_faults_*): EPFUSE_FAULT (src/common/fault.h) on
// the last rank: bad_ids and fail_create fail every rank alike at once; throw, skip and a stall past
// the collective timeout end every rank's forward within that timeout, with its y NaN (on a
// communicator of the test's own, aborted afterwards), and later forwards fail at once.
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nccl.h>

#include "common/check.h"
#include "epfuse/epfuse.h"
#include "layer_rank.h"
#include "multiprocess.h"
#include "scoped_env.h"

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
  r.fill_y_finite();
  expect_everyone_throws(r, r.batch(in.num_tokens), r.y(),
                         "rank " + std::to_string(bad_rank) + ": topk_idx[7][2] = " +
                             std::to_string(cfg.num_experts + 3) + " out of range [-1, " +
                             std::to_string(cfg.num_experts) + ")");
  // The failed call's own y: NaN on every rank (none of its rows was finished).
  EXPECT_EQ(r.values_not_nan(in.num_tokens), 0u) << "rank " << r.rank() << ": the failed call's y is not all NaN";
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

// ---- EPFUSE_FAULT on the unfused chain -------------------------------------------------------------

using testing::ScopedEnv;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fault_text(const std::string& kind, const std::string& extra = "") {
  return "rank=" + std::to_string(testing::world() - 1) + ",kind=" + kind + extra;
}

// bad_ids in the second forward of the last rank: every rank throws kInvalidArgument naming it, before
// any row moves, with its y NaN; the caller's ids are untouched and the next forward is right (the chain
// keeps no failed state).
TEST(UnfusedFaults, BadIdsFailEveryRankAndPoisonY) {
  const LayerConfig cfg = test_config();
  ScopedEnv fault("EPFUSE_FAULT", fault_text("bad_ids", ",call=1"));
  Rank r(cfg);
  const int faulty = r.world() - 1;
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 60), "the first forward, before the fault");
  const HostTokens in = r.tokens(40, Routing::kUniform, 61);
  r.upload(in);
  r.fill_y_finite();
  expect_everyone_throws(r, r.batch(in.num_tokens), r.y(),
                         "rank " + std::to_string(faulty) + ": topk_idx[0][0] = 2139062143 out of range [-1, " +
                             std::to_string(cfg.num_experts) + ")");
  EXPECT_EQ(r.values_not_nan(in.num_tokens), 0u) << "rank " << r.rank() << ": the failed call's y is not all NaN";
  EXPECT_EQ(r.outside_writes(in), "") << "rank " << r.rank();
  r.expect_matches_reference(r.tokens(57, Routing::kSkewed, 62), "call 2, after the fault");
}

// fail_create on the last rank: its creation throws the injected kCuda error, every other rank's
// kAborted naming it (agreed, nobody waits in NCCL); a later creation works.
TEST(UnfusedFaults, CreationFailureOnOneRankFailsEveryRank) {
  const int faulty = testing::world() - 1;
  const std::string injected =
      "rank " + std::to_string(faulty) + ": EPFUSE_FAULT: fail_create: the unfused layer's allocation failed (injected)";
  {
    ScopedEnv fault("EPFUSE_FAULT", fault_text("fail_create"));
    testing::expect_creation_fails_everywhere([] { Rank r(test_config()); }, faulty, ErrorCode::kCuda, injected,
                                              "MoeLayer::create (unfused)");
  }
  Rank r(test_config());
  r.expect_matches_reference(r.tokens(20, Routing::kUniform, 63), "created after a failed creation");
}


// The last rank misbehaves in its second forward (throw, skip, or a stall past the collective
// timeout: all before the counts exchange). Every other rank's forward throws kTimeout, naming itself and the counts all-to-all, within
// the collective timeout (NCCL cannot say which rank is missing); the faulty rank's call fails as the
// kind says; every rank's next forward fails within the bound too (kAborted at once where the timeout
// aborted the communicator); nothing outside the layer's buffers was written; after the abort the
// harness's own communicator still runs a correct layer.
void peer_fault_test(const std::string& kind) {
  if (testing::world() < 2) GTEST_SKIP() << "needs a peer";
  constexpr int kTimeoutMs = 3000, kStallMs = 5000;
  constexpr double kMarginS = 10.0;
  const LayerConfig cfg = test_config();
  Rank r(cfg);  // on the harness's communicator, made before the fault is set: never misbehaves
  const int faulty = r.world() - 1;
  const bool me_faulty = r.rank() == faulty;
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  std::unique_ptr<Communicator> comm = testing::own_communicator(std::chrono::milliseconds(kTimeoutMs));
  std::unique_ptr<MoeLayer> layer;
  {
    ScopedEnv fault("EPFUSE_FAULT",
                    fault_text(kind, ",call=1" + (kind == "stall" ? ",ms=" + std::to_string(kStallMs) : std::string())));
    layer = MoeLayer::create(Impl::kUnfused, cfg, *comm, r.weights());
  }
  const auto call = [&](const HostTokens& in, Clock::time_point t0, double& seconds) -> std::optional<Error> {
    std::optional<Error> error;
    try {
      layer->forward(r.batch(in.num_tokens), r.y(), r.stream());
      layer->check_errors(r.stream());
    } catch (const Error& e) {
      error = e;
    }
    seconds = seconds_since(t0);
    return error;
  };
  double seconds = 0;
  const HostTokens first = r.tokens(40, Routing::kUniform, 70);
  r.upload(first);
  r.poison_y();
  const std::optional<Error> ok = call(first, Clock::now(), seconds);
  EXPECT_FALSE(ok.has_value()) << me << "call 0: " << (ok ? ok->what() : "");
  if (!ok) r.expect_close_to_reference(first, r.output(first.num_tokens), me + "the first forward, before the fault");

  const HostTokens in = r.tokens(40, Routing::kUniform, 71);
  r.upload(in);
  r.fill_y_finite();
  const auto t0 = Clock::now();
  const std::optional<Error> e1 = call(in, t0, seconds);
  std::printf("%s%s fault, call 1: %s after %.2f s\n", me.c_str(), kind.c_str(), e1 ? e1->what() : "returned", seconds);
  if (!me_faulty) {
    EXPECT_TRUE(e1.has_value()) << me << "a peer's " << kind << " went unnoticed";
    if (e1) {
      EXPECT_EQ(e1->code(), ErrorCode::kTimeout) << e1->what();
      EXPECT_EQ(std::string(e1->what()).rfind(me + "unfused forward: the counts all-to-all timed out after 3000 ms", 0),
                0u)
          << e1->what();
      // The timed-out call finished none of its rows: its y is NaN, not the finite fill from before.
      EXPECT_EQ(r.values_not_nan(in.num_tokens), 0u) << me << "the timed-out call's y is not all NaN";
    }
    EXPECT_LT(seconds, kTimeoutMs / 1000.0 + kMarginS) << me << "call 1 took " << seconds << " s";
  } else if (kind == "throw") {
    EXPECT_TRUE(e1.has_value());
    if (e1) {
      EXPECT_EQ(e1->code(), ErrorCode::kInternal) << e1->what();
      EXPECT_EQ(std::string(e1->what()), me + "EPFUSE_FAULT: throw in forward call 1 (thrown before the counts exchange)");
    }
  } else if (kind == "skip") {
    EXPECT_FALSE(e1.has_value()) << e1->what();  // it never called: nothing to report
  } else {
    // The stall: it joins the counts exchange after its peers gave up on it.
    EXPECT_TRUE(e1.has_value()) << me << "the stalled call reported no error after its peers timed out";
    EXPECT_LT(seconds, (kStallMs + kTimeoutMs) / 1000.0 + kMarginS) << me << "call 1 took " << seconds << " s";
  }
  // The next forward fails on every rank within the bound: the peers' communicators are aborted; the
  // faulty rank's (skip, throw) waits in the counts exchange for peers that are gone. Every rank starts
  // it after every rank's call 1 ended (the harness's barrier): a faulty rank that called again at once
  // would meet its peers' call 1 in NCCL's order and no rank would look missing.
  testing::comm().barrier();
  const std::optional<Error> e2 = call(in, Clock::now(), seconds);
  std::printf("%s%s fault, call 2: %s after %.2f s\n", me.c_str(), kind.c_str(), e2 ? e2->what() : "returned", seconds);
  EXPECT_TRUE(e2.has_value()) << me << "the forward after the fault reported no error";
  if (e2 && !me_faulty) {
    EXPECT_EQ(e2->code(), ErrorCode::kAborted) << e2->what();
    EXPECT_NE(std::string(e2->what()).find("the communicator was aborted"), std::string::npos) << e2->what();
  }
  EXPECT_LT(seconds, kTimeoutMs / 1000.0 + kMarginS) << me << "call 2 took " << seconds << " s";
  // Give up on the test's world (local after the abort), then check the harness's.
  comm->abort("the " + kind + " fault test is over");
  layer.reset();
  comm.reset();
  EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
  EXPECT_EQ(r.outside_writes(in), "") << me << kind;
  r.expect_matches_reference(r.tokens(57, Routing::kSkewed, 72), "the harness's layer after the fault");
}

TEST(UnfusedFaults, ThrowOnOneRankTimesOutEveryPeer) { peer_fault_test("throw"); }
TEST(UnfusedFaults, SkipOnOneRankTimesOutEveryPeer) { peer_fault_test("skip"); }
TEST(UnfusedFaults, StallPastTheTimeoutTimesOutEveryRank) { peer_fault_test("stall"); }

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 2); }
