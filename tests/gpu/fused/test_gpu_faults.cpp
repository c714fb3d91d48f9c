// Fault injection (EPFUSE_FAULT, src/common/fault.h) on the fused layer, one process per GPU (worlds 1,
// 2, 4) or every rank on one GPU (--one-gpu, worlds 2 and 4): linked into test_gpu_fused (its main) and
// registered as test_gpu_faults_* with --gtest_filter=Faults.* (tests/gpu/fused/CMakeLists.txt). In each test the last rank misbehaves in
// its second forward (call 1; call 0 is checked against the reference first):
//   skip, stall, throw: every other rank's call fails with kTimeout within the bound (1 s waits,
//                       checked under 5 s), naming itself, "timed out in" and the faulty rank's count
//                       message; the faulty rank never hangs;
//   bad_ids:            every rank fails fast with kInvalidArgument naming the faulty rank;
//   hang at P:          its kernel stops inside the call; per point, the wait each rank must report
//                       (HangCase, docs/fused_design.md's table), within 5 s, and the failed
//                       workspace refusing the next forward;
// that call's own y (filled finite before it) is NaN on every rank whose kernel ran and failed, as it
// was where the call never launched (the faulty skip and throw), and right if a late stalled call
// reported no error; then on every rank: no guard band around x, topk_idx, topk_weights or y was written and the inputs
// are unchanged (nothing outside the layer's buffers written), and after re-creating the layer (its
// workspace) the next call matches the reference. `exit` (a process that dies mid-call) is the CLI's
// test (run_fused_fault_* in tests/gpu/run/run_matrix.cmake): it ends the whole test process.
// After Communicator::abort a forward throws kAborted and launches nothing.
// Creation: fail_create on one rank, and (one process per GPU) a bad EPFUSE_TIMEOUT_MS on one rank,
// fail every rank's creation alike (agree_on_step) instead of leaving the others in a collective; so
// does an out-of-memory at any allocation of a creation (detail::fail_allocation), leaking nothing.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "epfuse/epfuse.h"
#include "fp8_layer_rank.h"
#include "layer_rank.h"
#include "multiprocess.h"
#include "scoped_env.h"

namespace epfuse {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using testing::ScopedEnv;

// What the faulty rank's and its peers' call 1 must end with.
enum class Expect {
  kPeersTimeOut,   // skip, stall, throw
  kEveryRankBadInput,  // bad_ids
};

struct Outcome {
  bool threw = false;
  Error error{ErrorCode::kInternal, "no error"};
  double seconds = 0;
};

// The faulty call: `in` uploaded, y filled finite (the rows the call poisons show), one forward and
// check_errors, timed until the stream is done (a forward that threw may still have launched).
Outcome faulty_call(testing::LayerRank& r, const HostTokens& in) {
  r.upload(in);
  r.fill_y_finite();
  if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();  // see LoopbackWorld
  Outcome o;
  const auto t0 = Clock::now();
  try {
    r.layer().forward(r.batch(in.num_tokens), r.y(), r.stream());
    r.layer().check_errors(r.stream());
  } catch (const Error& e) {
    o.threw = true;
    o.error = e;
  }
  EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
  o.seconds = seconds_since(t0);
  return o;
}

// One rank's run of a fault test: a checked first forward, the faulty second one (EPFUSE_FAULT
// call=1), the checks, a re-created layer.
void run_fault(const std::string& kind, Expect expect) {
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  testing::LayerRank r(Impl::kFused, cfg);
  const int faulty = r.world() - 1;
  const bool me_faulty = r.rank() == faulty;
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 1400), "the first forward, before the fault");

  const HostTokens in = r.tokens(40, Routing::kUniform, 1401);
  const Outcome o = faulty_call(r, in);
  const std::string what = o.error.what();
  std::printf("%s%s fault, call 1: %s after %.2f s\n", me.c_str(), kind.c_str(), o.threw ? what.c_str() : "returned",
              o.seconds);
  // Bounded: 1 s device waits; a stall sleeps 1.5 s first, then its own kernel's waits expire.
  EXPECT_LT(o.seconds, 5.0) << me << "the call took " << o.seconds << " s";
  if (expect == Expect::kEveryRankBadInput) {
    EXPECT_TRUE(o.threw);
    EXPECT_EQ(o.error.code(), ErrorCode::kInvalidArgument) << what;
    if (me_faulty) {
      EXPECT_EQ(what, me + "topk_idx[0][0] = 2139062143 is not a valid expert id (-1 or [0, E))");
    } else {
      EXPECT_EQ(what, me + "rank " + std::to_string(faulty) + " reported invalid input (an expert id out of range)");
    }
  } else if (!me_faulty) {
    EXPECT_TRUE(o.threw) << me << "a peer's " << kind << " went unnoticed";
    EXPECT_EQ(o.error.code(), ErrorCode::kTimeout) << what;
    EXPECT_EQ(what.rfind(me + "timed out in ", 0), 0u) << what;
    EXPECT_NE(what.find("the count message of rank " + std::to_string(faulty)), std::string::npos) << what;
  } else if (kind == "throw") {
    EXPECT_TRUE(o.threw);
    EXPECT_EQ(o.error.code(), ErrorCode::kInternal) << what;
    EXPECT_EQ(what, me + "EPFUSE_FAULT: throw in forward call 1 (thrown before the launch)");
  } else if (kind == "skip") {
    EXPECT_FALSE(o.threw) << what;  // it never launched: nothing recorded on its device
  }
  // A stalled rank's late call may fail or not (its peers' epoch-1 messages are there): no expectation
  // on its error beyond the bound; its y below.

  // This call's own y (issue 43 item 1): NaN on every row wherever the call ran and failed (the peers
  // of skip, stall and throw; every rank under bad_ids); left as it was where the call never launched
  // (the faulty rank's skip and throw); a late call that reported no error must be right.
  const size_t values = static_cast<size_t>(in.num_tokens) * r.layer().config().hidden;
  const size_t not_nan = r.values_not_nan(in.num_tokens);
  if (expect == Expect::kEveryRankBadInput || !me_faulty) {
    EXPECT_EQ(not_nan, 0u) << me << kind << ": " << not_nan << " of " << values
                           << " values of the failed call's y are not NaN";
  } else if (kind == "skip" || kind == "throw") {
    const std::vector<double> y = r.output(in.num_tokens);
    EXPECT_EQ(std::count(y.begin(), y.end(), testing::LayerRank::kFiniteFill), static_cast<std::ptrdiff_t>(values))
        << me << kind << ": y was written by a call that never launched";
  } else if (o.threw) {
    EXPECT_EQ(not_nan, 0u) << me << kind << ": " << not_nan << " of " << values
                           << " values of the failed late call's y are not NaN";
  } else {
    r.expect_close_to_reference(in, r.output(in.num_tokens), me + "the stalled call that reported no error");
  }

  // Nothing outside the layer's buffers was written, on any rank (the faulty one's ids included).
  EXPECT_EQ(r.outside_writes(in), "") << me << kind;
  // Every rank re-creates its layer (and its workspace): the next call is correct.
  r.recreate();
  r.expect_matches_reference(r.tokens(57, Routing::kSkewed, 1402), "call 0 of the re-created layer");
  EXPECT_EQ(r.outside_writes(r.tokens(57, Routing::kSkewed, 1402)), "");
}

void fault_test(const std::string& kind, Expect expect) {
  if (expect == Expect::kPeersTimeOut && testing::world() < 2) GTEST_SKIP() << "needs a peer";
  // 1 s device waits: call 0 (before the fault) must not time out on a slow launch; a stall sleeps 1.5 s.
  ScopedEnv timeout("EPFUSE_TIMEOUT_MS", "1000");
  ScopedEnv fault("EPFUSE_FAULT", "rank=" + std::to_string(testing::world() - 1) + ",kind=" + kind + ",call=1" +
                                      (kind == "stall" ? ",ms=1500" : ""));
  testing::on_every_rank([&] { run_fault(kind, expect); });
}

TEST(Faults, SkippedCallTimesOutEveryPeer) { fault_test("skip", Expect::kPeersTimeOut); }
TEST(Faults, StalledCallTimesOutEveryPeer) { fault_test("stall", Expect::kPeersTimeOut); }
TEST(Faults, ThrowMidCallTimesOutEveryPeer) { fault_test("throw", Expect::kPeersTimeOut); }
TEST(Faults, BadIdsFailEveryRankFast) { fault_test("bad_ids", Expect::kEveryRankBadInput); }

// A failed call is never silent, even unchecked: the last rank stalls in its second forward; every other rank's
// second forward leaves its own y all NaN (y held finite values before), and its third, with no
// check_errors in between, throws the recorded timeout (the kernel told the host through the workspace's mapped word)
// instead of launching.
void run_failed_call_poisons_y() {
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  testing::LayerRank r(Impl::kFused, cfg);
  const bool me_faulty = r.rank() == r.world() - 1;
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 1600), "the first forward, before the fault");
  const HostTokens in = r.tokens(40, Routing::kUniform, 1601);
  r.upload(in);
  r.fill_y_finite();
  if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();  // see LoopbackWorld
  try {
    r.layer().forward(r.batch(in.num_tokens), r.y(), r.stream());
  } catch (const Error& e) {
    ADD_FAILURE() << me << "the second forward threw on the host: " << e.what();
  }
  EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
  if (!me_faulty) {
    const size_t finite = r.values_not_nan(in.num_tokens);
    EXPECT_EQ(finite, 0u) << me << finite << " of " << size_t(in.num_tokens) * cfg.hidden
                          << " values of the failed call's y are not NaN";
    bool threw = false;
    try {
      r.layer().forward(r.batch(in.num_tokens), r.y(), r.stream());
    } catch (const Error& e) {
      threw = true;
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind(me + "timed out in ", 0), 0u) << e.what();
    }
    EXPECT_TRUE(threw) << me << "the third forward launched on a workspace whose second failed";
  }
  EXPECT_EQ(r.outside_writes(in), "") << me;
  r.recreate();
  r.expect_matches_reference(r.tokens(57, Routing::kSkewed, 1602), "the re-created layer's first forward");
}

TEST(Faults, FailedCallPoisonsItsOwnYAndTheNextForwardSaysWhy) {
  if (testing::world() < 2) GTEST_SKIP() << "needs a peer";
  ScopedEnv timeout("EPFUSE_TIMEOUT_MS", "1000");
  ScopedEnv fault("EPFUSE_FAULT", "rank=" + std::to_string(testing::world() - 1) + ",kind=stall,call=1,ms=1500");
  testing::on_every_rank([] { run_failed_call_poisons_y(); });
}

// kind=hang (docs/fused_design.md's EPFUSE_FAULT entry): the last rank R's kernel stops at point P of its
// second forward. Per point, inputs under which one wait must expire first on each rank, and the words
// describe_error gives it; nullptr: that rank's call completes and is right.
struct HangCase {
  const char* at;
  bool fp8;                // the warp-specialised kernel (the FP8 layer runs it at every T): producer, scheduler
  bool needs_peer;         // at world 1 nothing would wait for what stops
  int faulty_tokens;       // R's T in the faulty call (0: no combine of its own to race its wait)
  int peer_tokens;         // the others' T (0: no combine to race their arrival waits)
  bool faulty_keeps_home;  // R's slots on its own experts stay (else dropped: no arrival of R's own for R to wait for)
  const char* faulty_waits;
  const char* peers_wait;
};

// Each rank's call 1 under the hang: bounded (waits of 1 s, twice that behind a wait); the expected
// rank's error is kTimeout naming itself and the wait (R's number filled in for "%R"); the failed
// call's y is all NaN; the failed workspace refuses the next forward on the host, naming that error;
// nothing outside the layer's buffers is written; a re-created layer is right.
void run_hang(const HangCase& hc) {
  const LayerConfig cfg = hc.fp8 ? testing::fp8_layer_config() : testing::small_layer_config(256, 0.0f);
  testing::LayerRank r(Impl::kFused, cfg);
  const int faulty = r.world() - 1;
  const bool me_faulty = r.rank() == faulty;
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 1800), "call 0, before the hang");

  HostTokens in = r.tokens(me_faulty ? hc.faulty_tokens : hc.peer_tokens, Routing::kUniform, 1801);
  if (me_faulty && !hc.faulty_keeps_home) {
    const int local = cfg.experts_per_rank(r.world());
    for (int32_t& e : in.topk_idx)
      if (e >= 0 && e / local == faulty) e = -1;
  }
  const Outcome o = faulty_call(r, in);
  const std::string what = o.error.what();
  std::printf("%shang at %s, call 1 (T = %d): %s after %.2f s\n", me.c_str(), hc.at, in.num_tokens,
              o.threw ? what.c_str() : "returned", o.seconds);
  EXPECT_LT(o.seconds, 5.0) << me << "the call took " << o.seconds << " s";

  const char* expected = me_faulty ? hc.faulty_waits : hc.peers_wait;
  if (expected == nullptr) {
    EXPECT_FALSE(o.threw) << me << what;
    if (!o.threw) r.expect_close_to_reference(in, r.output(in.num_tokens), me + "a call R's hang left whole");
  } else {
    std::string want = expected;
    if (const size_t r_at = want.find("%R"); r_at != std::string::npos) want.replace(r_at, 2, std::to_string(faulty));
    EXPECT_TRUE(o.threw) << me << "hang at " << hc.at << " went unnoticed";
    EXPECT_EQ(o.error.code(), ErrorCode::kTimeout) << what;
    EXPECT_EQ(what.rfind(me + "timed out in ", 0), 0u) << what;
    EXPECT_NE(what.find(" waiting for " + want), std::string::npos) << me << "expected a wait for '" << want
                                                                    << "': " << what;
    const size_t not_nan = r.values_not_nan(in.num_tokens);
    EXPECT_EQ(not_nan, 0u) << me << not_nan << " values of the failed call's y are not NaN";
    // The workspace is unusable until re-created (epfuse/layer.h): the next forward throws on the host,
    // naming the error, and launches nothing.
    try {
      r.layer().forward(r.batch(in.num_tokens), r.y(), r.stream());
      ADD_FAILURE() << me << "a forward after the failed call returned";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("re-create it"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(r.outside_writes(in), "") << me << "hang at " << hc.at;
  r.recreate();
  r.expect_matches_reference(r.tokens(57, Routing::kSkewed, 1802), "call 0 of the re-created layer");
}

void hang_test(const HangCase& hc) {
  if (hc.needs_peer && testing::world() < 2) GTEST_SKIP() << "needs a peer";
  ScopedEnv timeout("EPFUSE_TIMEOUT_MS", "1000");
  ScopedEnv fault("EPFUSE_FAULT", "rank=" + std::to_string(testing::world() - 1) + ",kind=hang,call=1,at=" + hc.at);
  testing::on_every_rank([&] { run_hang(hc); });
}

constexpr const char* kTokenTilesWait = "output tiles of token ";

TEST(Faults, HangAtPublishTimesOutEveryRankOnItsCounts) {
  hang_test({"publish", false, false, 40, 40, true, "the count message of rank %R", "the count message of rank %R"});
}
TEST(Faults, HangAtDispatchTimesOutItsReceiversOnArrivals) {
  hang_test({"dispatch", false, true, 40, 0, false, kTokenTilesWait, "arrivals of local expert "});
}
TEST(Faults, HangAtCollectTimesOutItsPlanAndThePeersCombine) {
  hang_test({"collect", false, false, 40, 40, true, "this rank's expert plan (collect task)", kTokenTilesWait});
}
TEST(Faults, HangAtProducerTimesOutItsOperandPipeline) {
  hang_test({"producer", true, true, 0, 40, true, "the operand pipeline of GEMM tile (m-block ", kTokenTilesWait});
}
TEST(Faults, HangAtSchedulerTimesOutItsTaskSlotAlone) {
  hang_test({"scheduler", true, false, 40, 40, true, "the next task from this CTA's producer warps (task slot ", nullptr});
}

// The guard check itself can fail: a byte written just outside y is reported.
EPFUSE_RANK_TEST(Faults, GuardBandsSeeAWriteOutsideTheBuffer) {
  testing::GuardedBuffer buf(256);
  cudaStream_t stream = nullptr;
  EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  EXPECT_EQ(buf.guard_damage("y", stream), "");
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(buf.as<char>() + 256, 0, 1, stream));
  EXPECT_EQ(buf.guard_damage("y", stream), "y: byte 0 after the buffer is 0x00 (guard 0xa5)");
  // Mend that byte, so that the next damage is the only one.
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(buf.as<char>() + 256, 0xa5, 1, stream));
  EXPECT_EQ(buf.guard_damage("y", stream), "");
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(buf.as<char>() - 3, 7, 1, stream));
  EXPECT_EQ(buf.guard_damage("y", stream), "y: byte 3 before the buffer is 0x07 (guard 0xa5)");
  EPFUSE_CUDA_CHECK(cudaStreamDestroy(stream));
  // Back-to-back device-synchronising frees on every rank's thread: nothing of a peer's is in flight.
  testing::comm().barrier();
}

// After Communicator::abort (here of a communicator of the test's own) a fused forward throws
// kAborted on the host and launches nothing: y keeps what it held. NCCL only (the one-GPU mode's
// loopback world is the harness's).
TEST(Faults, ForwardAfterAbortThrowsAbortedAndLaunchesNothing) {
  if (testing::one_gpu()) GTEST_SKIP() << "NCCL communicators only";
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  testing::LayerRank r(Impl::kFused, cfg);
  std::unique_ptr<Communicator> comm = testing::own_communicator(std::chrono::milliseconds(10000));
  std::unique_ptr<MoeLayer> layer = MoeLayer::create(Impl::kFused, cfg, *comm, r.weights());
  const HostTokens in = r.tokens(24, Routing::kUniform, 1700);
  r.upload(in);
  layer->forward(r.batch(in.num_tokens), r.y(), r.stream());
  layer->check_errors(r.stream());
  comm->abort("the abort test");
  r.fill_y_finite();
  const std::string me = "rank " + std::to_string(r.rank()) + ": ";
  try {
    layer->forward(r.batch(in.num_tokens), r.y(), r.stream());
    ADD_FAILURE() << me << "a forward after abort() returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
    EXPECT_EQ(std::string(e.what()), me + "fused forward: the communicator was aborted; destroy the layer and create a "
                                          "new communicator");
  }
  EXPECT_EQ(cudaStreamSynchronize(r.stream()), cudaSuccess);
  EXPECT_EQ(r.values_not_nan(in.num_tokens), static_cast<size_t>(in.num_tokens) * cfg.hidden) << me << "y was written";
  layer.reset();
  comm.reset();
  testing::comm().barrier();
}

// No fault configured: a layer never misbehaves (EPFUSE_FAULT naming another rank is ignored, too).
TEST(Faults, OffWhenUnsetOrAnotherRank) {
  ScopedEnv fault("EPFUSE_FAULT", "rank=" + std::to_string(testing::world()) + ",kind=throw,call=0");
  testing::on_every_rank([] {
    testing::LayerRank r(Impl::kFused, testing::small_layer_config(256, 0.0f));
    for (int call = 0; call < 3; ++call)
      r.expect_matches_reference(r.tokens(33, Routing::kDropped, 1500 + call), "call " + std::to_string(call));
  });
}

// Failure-safe creation (src/comm/collective_step.h): one rank's workspace creation fails (as an allocation
// failure would); every rank's creation fails within the bound, the others naming that rank and its
// message, and a later creation on every rank works.
TEST(Faults, CreationFailureOnOneRankFailsEveryRank) {
  {
    ScopedEnv fault("EPFUSE_FAULT", "rank=" + std::to_string(testing::world() - 1) + ",kind=fail_create");
    testing::on_every_rank([] {
      const int faulty = testing::world() - 1;
      const std::string injected = "rank " + std::to_string(faulty) +
                                   ": EPFUSE_FAULT: fail_create: the workspace's allocation failed (injected)";
      const auto t0 = Clock::now();
      testing::expect_creation_fails_everywhere(
          [] { testing::LayerRank r(Impl::kFused, testing::small_layer_config(256, 0.0f)); }, faulty, ErrorCode::kCuda,
          injected, "Workspace::create");
      EXPECT_LT(seconds_since(t0), 30.0);
      testing::comm().barrier();  // every rank is still in step
    });
  }
  testing::on_every_rank([] {
    testing::LayerRank r(Impl::kFused, testing::small_layer_config(256, 0.0f));
    r.expect_matches_reference(r.tokens(20, Routing::kUniform, 1600), "created after a failed creation");
  });
}

// Out of memory at creation: one rank's n-th allocation fails (detail::fail_allocation), for every n
// from the first allocation of a workspace and three layers on it and beside it (the window, the
// private buffers, a padded layer's weight copies and staging rows, shared and owned), and (NCCL) of
// an unfused layer and a padded one, to past the last.
// Every rank's creation fails alike, naming "out of memory", or (past the last) every rank's succeeds;
// the device memory after each failed creation equals what it was before (nothing leaked), and a
// layer made afterwards matches the reference. Rank 0 and the last rank fail in turn: in the one-GPU
// mode rank 0 allocates the world's window. Rank 0 measures the one GPU between barriers.
EPFUSE_RANK_TEST(Faults, OutOfMemoryAtCreationLeaksNothing) {
  Communicator& comm = testing::comm();
  const int rank = comm.rank(), world = comm.world_size();
  const std::string me = "rank " + std::to_string(rank) + ": ";
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  LayerConfig odd = cfg;  // padded to hidden 256, intermediate 256 (padding.h): fits the workspace
  odd.hidden = 192;
  odd.intermediate = 192;
  const int local = cfg.experts_per_rank(world);
  detail::DeviceBuffer w13(size_t(local) * 2 * cfg.intermediate * cfg.hidden * sizeof(bf16));
  detail::DeviceBuffer w2(size_t(local) * cfg.hidden * cfg.intermediate * sizeof(bf16));
  EPFUSE_CUDA_CHECK(cudaMemset(w13.as(), 0, w13.bytes()));
  EPFUSE_CUDA_CHECK(cudaMemset(w2.as(), 0, w2.bytes()));
  const ExpertWeights weights{w13.as<bf16>(), w2.as<bf16>()};  // large enough for both shapes
  const bool measures = rank == 0 || !testing::one_gpu();
  auto device_free = [&] {
    size_t free = 0, total = 0;
    EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());  // no forward in flight in this test
    comm.barrier();
    if (measures) EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    comm.barrier();
    return free;
  };
  // Returns "" when every object was made, else the error; destroys what was made either way. Fused: a
  // workspace with a layer and a padded layer on it, and a padded layer with its own workspace;
  // unfused: a layer and a padded one.
  auto create_all = [&](Impl impl) -> std::string {
    std::unique_ptr<Workspace> ws;
    std::unique_ptr<MoeLayer> plain, padded, owned;
    std::string error;
    try {
      if (impl == Impl::kFused) {
        ws = Workspace::create(comm, cfg);
        plain = MoeLayer::create(cfg, *ws, weights);
        padded = MoeLayer::create(odd, *ws, weights);  // padded copies, the workspace's staging rows
        owned = MoeLayer::create(Impl::kFused, odd, comm, weights);  // its own workspace and staging rows
      } else {
        plain = MoeLayer::create(impl, cfg, comm, weights);
        padded = MoeLayer::create(impl, odd, comm, weights);
      }
    } catch (const Error& e) {
      error = e.what();
      if (error.empty()) error = "an empty error";
      EXPECT_TRUE(e.code() == ErrorCode::kCuda || e.code() == ErrorCode::kAborted) << e.what();
    }
    detail::fail_allocation(0);
    owned.reset();
    padded.reset();
    plain.reset();
    ws.reset();
    return error;
  };
  std::vector<int> failing{0};
  if (world > 1) failing.push_back(world - 1);
  for (Impl impl : {Impl::kFused, Impl::kUnfused}) {
    if (impl == Impl::kUnfused && testing::one_gpu()) continue;  // NCCL only
    const std::string name = impl == Impl::kFused ? "fused" : "unfused";
    // What the driver, NCCL and cuBLAS make once, before the first measurement.
    EXPECT_EQ(create_all(impl), "") << me << name << ", before any injection";
    comm.all_reduce_sum(0);
    for (int faulty : failing) {
      int n = 1;
      for (; n <= 64; ++n) {
        const size_t before = device_free();
        if (rank == faulty) detail::fail_allocation(n);
        const std::string error = create_all(impl);
        const size_t after = device_free();
        const std::string what = name + ": rank " + std::to_string(faulty) + "'s allocation " + std::to_string(n);
        if (measures) {
          EXPECT_EQ(after, before) << me << what << " failed: " << (double(before) - double(after)) / (1 << 20)
                                   << " MiB of device memory not given back";
        }
        const int64_t created = comm.all_reduce_sum(error.empty() ? 1 : 0);
        EXPECT_TRUE(created == 0 || created == world) << me << what << ": " << created << " of " << world
                                                      << " ranks created everything";
        if (created == world) break;  // n is past the last allocation
        EXPECT_NE(error.find("out of memory"), std::string::npos) << me << what << ": " << error;
      }
      EXPECT_GT(n, 2) << name << ": fewer allocations than a creation makes";
      EXPECT_LE(n, 64) << name << ": creation never succeeded again after failing rank " << faulty << "'s allocations";
    }
  }
  testing::LayerRank r(Impl::kFused, cfg);
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 1700), "created after the failed creations");
}

// A bad EPFUSE_TIMEOUT_MS on one rank only (one process per GPU: each has its own environment): every
// rank's creation fails, the others naming the rank and the variable, and nobody waits in NCCL.
TEST(Faults, BadTimeoutOnOneRankFailsEveryRank) {
  if (testing::one_gpu()) GTEST_SKIP() << "the ranks of the one-GPU mode share one environment";
  const int faulty = testing::world() - 1;
  const int rank = testing::comm().rank();
  const std::string bad = "rank " + std::to_string(faulty) +
                          ": EPFUSE_TIMEOUT_MS = 'soon' is not a whole number of milliseconds in [1, 86400000]";
  {
    std::optional<ScopedEnv> env;
    if (rank == faulty) env.emplace("EPFUSE_TIMEOUT_MS", "soon");
    testing::expect_creation_fails_everywhere(
        [] { testing::LayerRank r(Impl::kFused, testing::small_layer_config(256, 0.0f)); }, faulty,
        ErrorCode::kInvalidArgument, bad, "Workspace::create");
  }
  testing::LayerRank r(Impl::kFused, testing::small_layer_config(256, 0.0f));
  r.expect_matches_reference(r.tokens(20, Routing::kUniform, 1601), "created with a good timeout");
}

// Null weights on one rank only: that rank's creation fails with its own error, and every other rank's
// with Error(kAborted) naming it, before any allocation (they used to wait in the workspace's collectives).
EPFUSE_RANK_TEST(Faults, NullWeightsOnOneRankFailEveryRank) {
  const int faulty = testing::world() - 1;
  const int rank = testing::comm().rank();
  const std::string own = "rank " + std::to_string(faulty) + ": MoeLayer::create: expert weights w13/w2 must not be null";
  detail::DeviceBuffer w(16);
  const ExpertWeights weights = rank == faulty ? ExpertWeights{nullptr, nullptr} : ExpertWeights{w.as<bf16>(), w.as<bf16>()};
  testing::comm().barrier();  // every rank's cudaMalloc is done (one-GPU mode)
  for (Impl impl : {Impl::kFused, Impl::kUnfused}) {
    if (impl == Impl::kUnfused && testing::one_gpu()) continue;  // NCCL only
    testing::expect_creation_fails_everywhere(
        [&] { MoeLayer::create(impl, testing::small_layer_config(256, 0.0f), testing::comm(), weights); }, faulty,
        ErrorCode::kInvalidArgument, own, "MoeLayer::create");
  }
  testing::comm().barrier();
}

}  // namespace
}  // namespace epfuse
