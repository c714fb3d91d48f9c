// The fused layer on 1, 2 or 4 GPUs (one process each), and at worlds 2, 4 and 8 with every rank on
// one GPU (--one-gpu: threads and the loopback transport): what the CLI correctness matrix
// (tests/gpu/run, registered for `fused`) cannot cover. Bounded waits: a peer that never calls
// forward makes the others' calls fail with kTimeout naming rank, phase and wait, within the bound.
// Bad input on one rank (expert id, token count) makes EVERY rank's call fail with kInvalidArgument,
// fast (no timeout); a layer with a device error refuses further calls and a re-created one works.
// Plus a reference check over many consecutive calls (epochs of both parities, wraps of nothing
// reset by the host), changing token counts (0 and 1 included), all routings and the clamp; and every
// tile shape after a kernel that left a byte pattern in every SM's shared memory.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "epfuse/epfuse.h"
#include "failed_launch.h"
#include "fused/fused_layer.h"
#include "fused/heuristics.h"
#include "fused/plan.h"
#include "late_write.h"
#include "layer_rank.h"
#include "multiprocess.h"
#include "stale_shared.h"

namespace epfuse {
namespace {

using Clock = std::chrono::steady_clock;

LayerConfig test_config(float clamp = 0.0f) { return testing::small_layer_config(256, clamp); }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sets EPFUSE_TIMEOUT_MS for the layers created in its scope (read at creation).
class TimeoutEnv {
 public:
  explicit TimeoutEnv(const char* ms) { setenv("EPFUSE_TIMEOUT_MS", ms, 1); }
  ~TimeoutEnv() { unsetenv("EPFUSE_TIMEOUT_MS"); }
};

// The fused layer's rank: the shared fixture with room for one token too many.
class Rank : public testing::LayerRank {
 public:
  explicit Rank(const LayerConfig& cfg) : LayerRank(Impl::kFused, cfg, /*extra_tokens=*/1) {}

  // Runs forward + check_errors and returns the Error (code kInternal with "no error" if none).
  Error forward_error(const TokenBatch& batch) {
    try {
      layer().forward(batch, y(), stream());
      layer().check_errors(stream());
    } catch (const Error& e) {
      // A rank that threw in forward still launched; let its kernel finish before anything else.
      EXPECT_EQ(cudaStreamSynchronize(stream()), cudaSuccess);
      return e;
    }
    return Error(ErrorCode::kInternal, "no error");
  }
};

EPFUSE_RANK_TEST(FusedLayer, MatchesReferenceOverManyCalls) {
  Rank r(test_config());
  uint64_t seed = 100;
  for (Routing routing : {Routing::kUniform, Routing::kSkewed, Routing::kOneExpert, Routing::kDropped}) {
    for (int call = 0; call < 3; ++call, ++seed) {  // odd count: parities swap between routings
      const int count = make_token_counts(r.world(), 96, seed)[r.rank()];
      r.expect_matches_reference(r.tokens(count, routing, seed),
                                 std::string(to_string(routing)) + " T=" + std::to_string(count));
    }
  }
  r.expect_matches_reference(r.tokens(1, Routing::kUniform, 7), "T=1");
  r.expect_matches_reference(r.tokens(0, Routing::kUniform, 8), "all T=0");
  r.expect_matches_reference(r.tokens(96, Routing::kUniform, 9), "T=max");
  r.expect_matches_reference(r.tokens(96, Routing::kOneExpert, 10), "T=max, one expert");
}

// Every instantiation of the fused kernel (kFusedTileShapes: wgmma 128x256 and 128x128, mma.sync
// 32x128) against the reference: few experts, up to 256 tokens and a grid of 8 CTAs, so the per-call row
// estimate (tokens x k x world / E) and the 128x256 tiles against the grid (choose_bf16_tile) cross each
// shape's range at every world: at T = 256 8 tiles of 128x256, at T = 100 fewer (128x128), at T = 16 or 4
// at most 32 rows an expert and fewer (32x128). The shapes counted are the ones the layer launched
// (fused::last_launched_tile), not a prediction.
LayerConfig every_tile_shape_config() {
  LayerConfig cfg = test_config();
  cfg.num_experts = std::max(4, testing::world());  // at least one expert per rank
  cfg.topk = 4;
  cfg.max_tokens_per_rank = 256;
  cfg.num_sms = 8;
  return cfg;
}

EPFUSE_RANK_TEST(FusedLayer, EveryTileShapeMatchesReference) {
  Rank r(every_tile_shape_config());
  std::vector<fused::GemmTileShape> seen;
  std::string launched;
  uint64_t seed = 300;
  for (int count : {256, 100, 16, 256, 40, 4}) {
    for (Routing routing : {Routing::kUniform, Routing::kOneExpert}) {
      r.expect_matches_reference(r.tokens(count, routing, seed++),
                                 std::string(to_string(routing)) + " T=" + std::to_string(count));
      const std::optional<fused::GemmTileShape> tile = fused::last_launched_tile(r.layer());
      ASSERT_TRUE(tile.has_value()) << "the fused layer reported no launch";
      launched += " " + std::to_string(tile->block_m) + "x" + std::to_string(tile->block_n) +
                  (tile->mma == fused::GemmMma::kMmaSync ? " mma.sync" : " wgmma") + " (T=" + std::to_string(count) + ")";
      if (std::find(seen.begin(), seen.end(), *tile) == seen.end()) seen.push_back(*tile);
    }
  }
  EXPECT_EQ(seen.size(), std::size(fused::kFusedTileShapes)) << "a fused tile shape went untested; launched:" << launched;
}

// Every tile shape's forwards after a kernel that left a byte pattern in every SM's shared memory
// (stale_shared.h: 0xFF, NaN as any float; 0x00): a forward that read shared memory it had not written in
// its own launch would compute with it. A fresh layer per pattern (its first forward on a zeroed
// workspace among the checked); the token counts of EveryTileShapeMatchesReference.
EPFUSE_RANK_TEST(FusedLayer, StaleSharedMemoryChangesNothing) {
  testing::prepare_shared_memory_fill();
  uint64_t seed = 900;
  for (const uint8_t byte : {uint8_t{0xFF}, uint8_t{0x00}}) {
    Rank r(every_tile_shape_config());
    r.set_before_forward([byte](cudaStream_t stream) { testing::fill_shared_memory(byte, stream); });
    std::vector<fused::GemmTileShape> seen;
    for (int count : {1, 256, 100, 16, 40}) {
      r.expect_matches_reference(r.tokens(count, Routing::kUniform, seed++),
                                 "shared memory of " + std::to_string(byte) + ", T=" + std::to_string(count));
      const std::optional<fused::GemmTileShape> tile = fused::last_launched_tile(r.layer());
      if (tile && std::find(seen.begin(), seen.end(), *tile) == seen.end()) seen.push_back(*tile);
    }
    EXPECT_EQ(seen.size(), std::size(fused::kFusedTileShapes)) << "a fused tile shape went untested";
  }
}

// Phase timing (the in-kernel profile): off by default, per-phase ms per SM when on, results unchanged.
EPFUSE_RANK_TEST(FusedLayer, PhaseTimingReportsEveryPhase) {
  Rank r(test_config());
  EXPECT_FALSE(r.layer().last_phase_times().has_value());  // off by default
  r.layer().set_phase_timing(true);
  r.expect_matches_reference(r.tokens(96, Routing::kUniform, 21), "timed call");
  const std::optional<PhaseTimes> t = r.layer().last_phase_times();
  ASSERT_TRUE(t.has_value());
  EXPECT_GT(t->dispatch_ms, 0.0f);
  EXPECT_GT(t->experts_ms, 0.0f);
  EXPECT_GT(t->combine_ms, 0.0f);
  EXPECT_LT(t->dispatch_ms + t->experts_ms + t->combine_ms, 1000.0f);  // ms, not ns
  r.expect_matches_reference(r.tokens(50, Routing::kSkewed, 22), "second timed call");
  ASSERT_TRUE(r.layer().last_phase_times().has_value());
  r.layer().set_phase_timing(false);
  r.expect_matches_reference(r.tokens(96, Routing::kUniform, 23), "untimed call");
  EXPECT_FALSE(r.layer().last_phase_times().has_value());
}

// The order of the one-GPU hang of 2026-11-28 (docs/performance.md, "Faults seen while timing"): the
// last rank issues its first forward on a fresh workspace only once its peers' kernels are running
// and waiting for it (timed and untimed). A forward makes only stream-ordered calls between its turn
// and its launch, so the late rank's forward returns at once and every call matches the reference; a
// forward that waited for the device on the host would sit there until the peers' kernels timed out.
EPFUSE_RANK_TEST(FusedLayer, LateRankEnqueuesWithoutWaitingForPeers) {
  const bool late = testing::comm().rank() == testing::world() - 1;
  for (int round = 0; round < 6; ++round) {
    const std::string what = "round " + std::to_string(round);
    Rank r(test_config());  // a fresh workspace: its first forward
    const bool timed = round % 2 == 1;
    r.layer().set_phase_timing(timed);  // before the barrier: it may allocate
    const HostTokens in = r.tokens(64, Routing::kUniform, 40 + round);
    r.upload(in);
    r.poison_y();
    testing::comm().barrier();
    if (late) std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the peers' kernels wait for it
    const auto t0 = Clock::now();
    try {
      r.layer().forward(r.batch(in.num_tokens), r.y(), r.stream());
      const double enqueue_s = seconds_since(t0);
      if (late) {
        EXPECT_LT(enqueue_s, 2.0) << what << ": the late rank's forward waited on the host";
      }
      r.layer().check_errors(r.stream());
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": " << e.what();
      EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
      continue;
    }
    r.expect_close_to_reference(in, r.output(in.num_tokens), what);
    if (timed) {
      EXPECT_TRUE(r.layer().last_phase_times().has_value()) << what;
    }
  }
}

EPFUSE_RANK_TEST(FusedLayer, ClampMatchesReference) {
  Rank r(test_config(0.05f));
  r.expect_matches_reference(r.tokens(64, Routing::kUniform, 11), "clamp 0.05");
}

// The device memory a workspace takes, measured (cudaMemGetInfo around its creation), against the
// plan it reports: at least the plan (allocations round up, never down), at most the plan plus page
// rounding and the NCCL window registration's own memory. In the one-GPU mode rank 0 measures the
// whole world's workspaces between barriers.
EPFUSE_RANK_TEST(FusedLayer, WorkspaceMemoryIsThePlan) {
  LayerConfig cfg = testing::small_layer_config(768, 0.0f);
  cfg.hidden = 2048;
  cfg.max_tokens_per_rank = testing::one_gpu() ? 2048 : 4096;
  cfg.num_experts = std::max(32, testing::world());
  cfg.topk = 8;
  const fused::FusedPlan plan = fused::plan_fused(cfg, testing::world());
  const int measured_ranks = testing::one_gpu() ? testing::world() : 1;
  const double expected = double(measured_ranks) * double(plan.symmetric_bytes() + plan.private_bytes());
  size_t free0 = 0, free1 = 0, total = 0;
  EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  testing::comm().barrier();
  if (testing::comm().rank() == 0 || !testing::one_gpu()) EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free0, &total));
  testing::comm().barrier();
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), cfg);
  EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  testing::comm().barrier();
  if (testing::comm().rank() == 0 || !testing::one_gpu()) {
    EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free1, &total));
    const double used = double(free0) - double(free1);
    const double slack = measured_ranks * 8.0 * (1 << 20) + 64.0 * (1 << 20);
    std::printf("rank %d: workspace plan %.1f MiB x %d rank(s) = %.1f MiB; measured %.1f MiB\n%s", testing::comm().rank(),
                double(plan.symmetric_bytes() + plan.private_bytes()) / (1 << 20), measured_ranks,
                expected / (1 << 20), used / (1 << 20), fused::format_plan(plan).c_str());
    EXPECT_GE(used, expected) << "the workspace took less device memory than its plan says";
    EXPECT_LE(used, expected + slack) << "the workspace took more device memory than its plan says";
    EXPECT_GT(expected, 4.0 * slack) << "the test's shape is too small for its bounds to mean anything";
  }
  testing::comm().barrier();
}

EPFUSE_RANK_TEST(FusedLayer, BadExpertIdFailsEveryRankFast) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  const int bad_rank = r.world() - 1;
  HostTokens in = r.tokens(40, Routing::kUniform, 21);
  if (r.rank() == bad_rank) in.topk_idx[7 * cfg.topk + 2] = cfg.num_experts + 3;
  r.upload(in);
  const auto t0 = Clock::now();
  const Error e = r.forward_error(r.batch(in.num_tokens));
  EXPECT_LT(seconds_since(t0), 5.0) << "bad input must not wait for the 20 s timeout";
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  if (r.rank() == bad_rank) {
    EXPECT_EQ(std::string(e.what()), me + "topk_idx[7][2] = " + std::to_string(cfg.num_experts + 3) +
                                         " is not a valid expert id (-1 or [0, E))");
  } else {
    EXPECT_EQ(std::string(e.what()),
              me + "rank " + std::to_string(bad_rank) + " reported invalid input (an expert id out of range)");
  }
  // The layer is now unusable (its counters are mid-call) and says so without launching, naming the
  // error that broke it.
  const Error again = r.forward_error(r.batch(in.num_tokens));
  EXPECT_EQ(again.code(), ErrorCode::kInternal);
  EXPECT_NE(std::string(again.what()).find("re-create"), std::string::npos) << again.what();
  EXPECT_NE(std::string(again.what()).find("unusable after an earlier error (a device error: " + me), std::string::npos)
      << again.what();
  EXPECT_NE(std::string(again.what()).find("expert id"), std::string::npos) << again.what();
  r.recreate();
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 22), "re-created after a bad expert id");
}

EPFUSE_RANK_TEST(FusedLayer, TooManyTokensFailsEveryRankFast) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  r.upload(r.tokens(10, Routing::kUniform, 30));
  const int count = r.rank() == 0 ? cfg.max_tokens_per_rank + 1 : 10;
  const auto t0 = Clock::now();
  const Error e = r.forward_error(r.batch(count));
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  if (r.rank() == 0) {
    EXPECT_NE(std::string(e.what()).find("num_tokens = " + std::to_string(cfg.max_tokens_per_rank + 1)),
              std::string::npos)
        << e.what();
  } else {
    EXPECT_EQ(std::string(e.what()), "rank " + std::to_string(r.rank()) +
                                         ": rank 0 reported invalid input (num_tokens out of range)");
  }
  r.recreate();
  r.expect_matches_reference(r.tokens(10, Routing::kDropped, 31), "re-created after too many tokens");
}

// y aliasing x on rank 0: refused on the host (kInvalidArgument naming x) without waiting for the
// timeout, every peer learns of it, and the next forward's kInternal names that first error.
EPFUSE_RANK_TEST(FusedLayer, OutputAliasingXFailsEveryRankFast) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  r.upload(r.tokens(10, Routing::kUniform, 33));
  const TokenBatch batch = r.batch(10);
  bf16* y = r.rank() == 0 ? const_cast<bf16*>(batch.x) : r.y();
  const auto forward_error = [&](bf16* out) {
    try {
      r.layer().forward(batch, out, r.stream());
      r.layer().check_errors(r.stream());
    } catch (const Error& e) {
      EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
      return e;
    }
    return Error(ErrorCode::kInternal, "no error");
  };
  const auto t0 = Clock::now();
  const Error e = forward_error(y);
  EXPECT_LT(seconds_since(t0), 5.0);
  EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  if (r.rank() == 0) {
    EXPECT_NE(std::string(e.what()).find(me + "y overlaps x: the output must not alias an input"), std::string::npos)
        << e.what();
  } else {
    EXPECT_EQ(std::string(e.what()), me + "rank 0 reported invalid input (a null, misaligned or aliased pointer)");
  }
  const Error again = forward_error(r.y());
  EXPECT_EQ(again.code(), ErrorCode::kInternal) << again.what();
  EXPECT_NE(std::string(again.what()).find("re-create"), std::string::npos) << again.what();
  EXPECT_NE(std::string(again.what()).find(r.rank() == 0 ? "y overlaps x" : "rank 0 reported invalid input"),
            std::string::npos)
      << again.what();
  r.recreate();
  r.expect_matches_reference(r.tokens(10, Routing::kUniform, 34), "re-created after y aliasing x");
}

EPFUSE_RANK_TEST(FusedLayer, MissingPeerTimesOutWithinTheBound) {
  if (testing::world() < 2) GTEST_SKIP() << "needs a peer";
  const LayerConfig cfg = test_config();
  {
    TimeoutEnv timeout("300");
    Rank r(cfg);
    const int absent = r.world() - 1;
    r.upload(r.tokens(32, Routing::kUniform, 61));
    if (r.rank() != absent) {
      const auto t0 = Clock::now();
      const Error e = r.forward_error(r.batch(32));
      const double s = seconds_since(t0);
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
      EXPECT_LT(s, 5.0) << "a 300 ms bound took " << s << " s";
      // The first wait to expire is the collect task's (the others wait for its plan): for the count
      // message of the absent rank.
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(r.rank()) + ": timed out in "), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("the count message of rank " + std::to_string(absent)), std::string::npos)
          << e.what();
      std::printf("rank %d: %s\n", r.rank(), e.what());
    }
    testing::comm().barrier();
  }  // every rank destroys its layer (collective) ...
  Rank fresh(cfg);  // ... and a new one works
  fresh.expect_matches_reference(fresh.tokens(32, Routing::kUniform, 62), "new layer after a timeout");
}

// A CUDA graph of one forward, replayed 1000 times with fresh inputs written into the captured buffers
// (routing, weights and x change every replay; T is what was captured): the kernel advances its own
// epoch, so every checked replay matches the reference. Then a bad expert id on one rank inside a
// replay: every rank's check reports it, and the next replay fills y with NaN on every rank instead of
// leaving the last good output in place.
EPFUSE_RANK_TEST(FusedLayer, GraphReplaysMatchTheReference) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  constexpr int kTokens = 64;
  r.upload(r.tokens(kTokens, Routing::kUniform, 700));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  // Thread-local capture: in the one-GPU mode the other ranks' threads capture at the same time.
  EPFUSE_CUDA_CHECK(cudaStreamBeginCapture(r.stream(), cudaStreamCaptureModeThreadLocal));
  r.layer().forward(r.batch(kTokens), r.y(), r.stream());
  EPFUSE_CUDA_CHECK(cudaStreamEndCapture(r.stream(), &graph));
  EPFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  // Instantiating and uploading a graph may wait for the device's running kernels: in the one-GPU mode
  // every rank finishes both before any rank replays (LoopbackWorld on device-synchronising calls).
  EPFUSE_CUDA_CHECK(cudaGraphUpload(exec, r.stream()));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(r.stream()));
  testing::comm().barrier();
  const Routing routings[] = {Routing::kUniform, Routing::kSkewed, Routing::kDropped, Routing::kOneRank};
  int checked = 0;
  for (int replay = 1; replay <= 1000; ++replay) {
    const bool check = replay <= 3 || replay % 250 == 0 || replay == 999;
    const HostTokens in = r.tokens(kTokens, routings[replay % 4], 700 + replay);
    r.upload(in);
    if (check) r.poison_y();
    EPFUSE_CUDA_CHECK(cudaGraphLaunch(exec, r.stream()));
    if (!check) continue;
    r.layer().check_errors(r.stream());
    r.expect_close_to_reference(in, r.output(kTokens), "replay " + std::to_string(replay));
    ++checked;
  }
  EXPECT_EQ(checked, 8);
  // A bad id in the captured buffer on the last rank: the replay fails on every rank ...
  HostTokens bad = r.tokens(kTokens, Routing::kUniform, 1800);
  if (r.rank() == r.world() - 1) bad.topk_idx[5 * cfg.topk] = cfg.num_experts + 1;
  r.upload(bad);
  EPFUSE_CUDA_CHECK(cudaGraphLaunch(exec, r.stream()));
  EXPECT_THROW(r.layer().check_errors(r.stream()), Error);
  // ... and the next replay returns NaN, not the previous output.
  r.upload(r.tokens(kTokens, Routing::kUniform, 1801));
  EPFUSE_CUDA_CHECK(cudaGraphLaunch(exec, r.stream()));
  const std::vector<double> after = r.output(kTokens);
  EXPECT_TRUE(std::all_of(after.begin(), after.end(), [](double v) { return std::isnan(v); }))
      << "a failed workspace left non-NaN output in a graph replay";
  EXPECT_THROW(r.layer().forward(r.batch(kTokens), r.y(), r.stream()), Error);  // the host knows too
  EPFUSE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  EPFUSE_CUDA_CHECK(cudaGraphDestroy(graph));
}

// Programmatic dependent launch (common/launch.h, EPFUSE_PDL): the fused kernel's prologue may run
// under the tail of the kernel before it. Here that kernel lets the next one launch at its start and
// only 20 us later copies this call's x, routing and weights over a decoy (other tokens, other
// routing) uploaded before it. Every call, launched one by one and replayed from a CUDA graph of both
// kernels, matches the float64 reference of the late inputs: the fused kernel reads nothing of them
// (nor the previous call's state) before its wait for the previous kernel.
EPFUSE_RANK_TEST(FusedLayer, OverlappedLaunchSeesThePreviousKernelsWrites) {
  Rank r(test_config());
  constexpr int kTokens = 64;
  constexpr uint32_t kDelayUs = 20;
  const HostTokens shape = r.tokens(kTokens, Routing::kUniform, 0);
  detail::DeviceBuffer x(shape.x.size() * sizeof(bf16)), idx(shape.topk_idx.size() * sizeof(int32_t)),
      wts(shape.topk_weights.size() * sizeof(float));
  const TokenBatch batch = r.batch(kTokens);
  const testing::LateCopy copies[3] = {{x.as(), const_cast<bf16*>(batch.x), x.bytes()},
                                       {idx.as(), const_cast<int32_t*>(batch.topk_idx), idx.bytes()},
                                       {wts.as(), const_cast<float*>(batch.topk_weights), wts.bytes()}};
  testing::prepare_late_write();
  // The decoy in the layer's input buffers, this call's tokens where the late kernel copies from.
  const auto stage = [&](int call, uint64_t seed) {
    const Routing routings[] = {Routing::kUniform, Routing::kSkewed, Routing::kDropped, Routing::kOneExpert};
    r.upload(r.tokens(kTokens, routings[(call + 1) % 4], seed + 5000));
    const HostTokens in = r.tokens(kTokens, routings[call % 4], seed);
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(x.as(), in.x.data(), x.bytes(), cudaMemcpyHostToDevice, r.stream()));
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(idx.as(), in.topk_idx.data(), idx.bytes(), cudaMemcpyHostToDevice, r.stream()));
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(wts.as(), in.topk_weights.data(), wts.bytes(), cudaMemcpyHostToDevice, r.stream()));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(r.stream()));
    r.poison_y();
    return in;
  };
  const auto enqueue = [&] {
    testing::late_write(copies, kDelayUs, r.stream());
    r.layer().forward(r.batch(kTokens), r.y(), r.stream());
  };
  testing::comm().barrier();
  for (int call = 0; call < 40; ++call) {
    const HostTokens in = stage(call, 1200 + call);
    enqueue();
    r.layer().check_errors(r.stream());
    r.expect_close_to_reference(in, r.output(kTokens), "call " + std::to_string(call));
  }
  testing::comm().barrier();  // every rank's calls are done before any captures and instantiates
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  EPFUSE_CUDA_CHECK(cudaStreamBeginCapture(r.stream(), cudaStreamCaptureModeThreadLocal));
  enqueue();
  EPFUSE_CUDA_CHECK(cudaStreamEndCapture(r.stream(), &graph));
  EPFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  EPFUSE_CUDA_CHECK(cudaGraphUpload(exec, r.stream()));  // see GraphReplaysMatchTheReference
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(r.stream()));
  testing::comm().barrier();
  for (int replay = 0; replay < 40; ++replay) {
    const HostTokens in = stage(replay, 1300 + replay);
    EPFUSE_CUDA_CHECK(cudaGraphLaunch(exec, r.stream()));
    r.layer().check_errors(r.stream());
    r.expect_close_to_reference(in, r.output(kTokens), "replay " + std::to_string(replay));
  }
  EPFUSE_CUDA_CHECK(cudaGraphExecDestroy(exec));
  EPFUSE_CUDA_CHECK(cudaGraphDestroy(graph));
}

// Two layers of different shapes on one workspace, each on its own stream, alternating for 100 calls
// (the workspace orders them); every 10th call of each checked. The layers add no device memory.
// Ranks that call different layers of one workspace in the same call (same shapes, so nothing else
// would notice) fail alike, fast, naming the rank and both layers (the count message carries the
// layer's identity, FusedParams::layer_id).
EPFUSE_RANK_TEST(FusedLayer, RanksCallingDifferentLayersFailClearly) {
  if (testing::world() < 2) GTEST_SKIP() << "needs a peer";
  const LayerConfig cfg = test_config();
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), cfg);
  testing::LayerRank first(Impl::kFused, cfg, 0, ws.get());   // layer 1 of the workspace
  testing::LayerRank second(Impl::kFused, cfg, 0, ws.get());  // layer 2, the same shape
  testing::LayerRank& r = testing::comm().rank() == 0 ? first : second;
  const HostTokens in = r.tokens(24, Routing::kUniform, 1700);
  r.upload(in);
  if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();  // see LoopbackWorld
  const auto t0 = Clock::now();
  std::optional<Error> e;
  try {
    r.layer().forward(r.batch(in.num_tokens), r.y(), r.stream());
    r.layer().check_errors(r.stream());
  } catch (const Error& err) {
    e = err;
  }
  EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
  EXPECT_LT(seconds_since(t0), 5.0) << "mismatched layers must not wait for the timeout";
  ASSERT_TRUE(e.has_value()) << "rank " << r.rank() << ": a call of another layer than rank 0's went unnoticed";
  EXPECT_EQ(e->code(), ErrorCode::kInvalidArgument) << e->what();
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  // Rank 0 (layer 1) sees the first peer on layer 2; every other rank (layer 2) sees rank 0 on layer 1.
  const std::string expect = r.rank() == 0 ? me + "rank 1 called another layer in this call (its layer 2, this rank's 1"
                                           : me + "rank 0 called another layer in this call (its layer 1, this rank's 2";
  EXPECT_EQ(std::string(e->what()).rfind(expect, 0), 0u) << e->what();
  if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();
}

EPFUSE_RANK_TEST(FusedLayer, TwoLayersShareOneWorkspace) {
  const testing::TwoLayerShapes shapes = testing::two_layer_shapes();  // a: H 256, I 256, E 16, k 4, T 96
  const LayerConfig& a = shapes.a;
  LayerConfig b = shapes.b;
  b.max_tokens_per_rank = 80;
  const LayerConfig& capacity = shapes.capacity;
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), capacity);
  size_t free_before = 0, free_after = 0, total = 0;
  EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free_before, &total));
  {
    testing::LayerRank ra(Impl::kFused, a, 0, ws.get());
    testing::LayerRank rb(Impl::kFused, b, 0, ws.get());
    EXPECT_EQ(ra.layer().memory().symmetric_bytes + ra.layer().memory().private_bytes, 0u);
    EXPECT_EQ(ws->memory().symmetric_bytes, fused::plan_fused(capacity, testing::world()).symmetric_bytes());
    for (int call = 0; call < 100; ++call) {
      testing::LayerRank& r = call % 2 == 0 ? ra : rb;
      const int tokens = make_token_counts(r.world(), call % 2 == 0 ? 96 : 80, 900 + call)[r.rank()];
      const HostTokens in = r.tokens(tokens, call % 3 == 0 ? Routing::kSkewed : Routing::kUniform, 900 + call);
      if (call % 20 < 2) {
        r.expect_matches_reference(in, std::string(call % 2 ? "b" : "a") + " call " + std::to_string(call));
      } else {
        r.forward(in);
      }
    }
    // A layer larger than the workspace is refused, naming the field.
    LayerConfig too_wide = a;
    too_wide.hidden = 512;
    try {
      testing::LayerRank big(Impl::kFused, too_wide, 0, ws.get());
      ADD_FAILURE() << "a layer wider than its workspace was created";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
      EXPECT_NE(std::string(e.what()).find("hidden=512 exceeds the workspace's 256"), std::string::npos) << e.what();
    }
  }
  // 58 layers (a DeepSeek-V3 stack) on one workspace, sharing one weight pair: no device memory each.
  testing::LayerRank first(Impl::kFused, a, 0, ws.get());
  std::vector<std::unique_ptr<MoeLayer>> stack;
  size_t free_stack_before = 0;
  EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  testing::comm().barrier();
  EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free_stack_before, &total));
  for (int i = 0; i < 58; ++i) stack.push_back(MoeLayer::create(a, *ws, first.weights()));
  EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
  testing::comm().barrier();
  EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free_after, &total));
  EXPECT_LE(free_stack_before - std::min(free_stack_before, free_after), size_t{2} << 20)
      << "58 layers on one workspace took device memory";
  (void)free_before;
}

// Two layers on one workspace whose kernels differ in their shared memory alone (the plan's size follows
// the expert count), the larger created first: a kernel's shared-memory attribute is the process's, and
// set to the second layer's need it failed every launch of the first (common/launch.h
// allow_all_dynamic_smem). Before their calls, a launch the runtime refuses: its error is that launch's
// alone, not reported again by the next call's launch check (core/check.cpp throw_cuda).
EPFUSE_RANK_TEST(FusedLayer, LayersOfDifferentExpertCountsShareOneWorkspace) {
  const LayerConfig a = testing::small_layer_config(256, 0.0f);  // 16 experts, top-4
  LayerConfig b = a;
  b.num_experts = 8;
  b.topk = 2;
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), a);
  testing::LayerRank ra(Impl::kFused, a, 0, ws.get());
  testing::LayerRank rb(Impl::kFused, b, 0, ws.get());
  try {
    testing::failed_launch();
    ADD_FAILURE() << "a launch of 2048 threads a block went through";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCuda) << e.what();
  }
  for (int call = 0; call < 6; ++call) {
    testing::LayerRank& r = call % 2 == 0 ? ra : rb;
    const int tokens = make_token_counts(r.world(), 64, 1900 + call)[r.rank()];
    const HostTokens in = r.tokens(tokens, Routing::kUniform, 1900 + call);
    r.expect_matches_reference(in, std::string(call % 2 ? "b" : "a") + " call " + std::to_string(call));
  }
}

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 2); }
