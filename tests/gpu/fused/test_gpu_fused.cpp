// The fused layer on 1, 2 or 4 GPUs (one process each): what the CLI correctness matrix
// (tests/gpu/run, registered for `fused`) cannot cover. Bounded waits: a peer that never calls
// forward makes the others' calls fail with kTimeout naming rank, phase and wait, within the bound.
// Bad input on one rank (expert id, token count) makes EVERY rank's call fail with kInvalidArgument,
// fast (no timeout); a layer with a device error refuses further calls and a re-created one works.
// Plus a reference check over many consecutive calls (epochs of both parities, wraps of nothing
// reset by the host), changing token counts (0 and 1 included), all routings and the clamp.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "epfuse/epfuse.h"
#include "fused/heuristics.h"
#include "fused/plan.h"
#include "multiprocess.h"
#include "unfused/device_buffer.h"

namespace epfuse {
namespace {

using unfused::DeviceMemory;
using Clock = std::chrono::steady_clock;

constexpr uint64_t kWeightSeed = 42;

LayerConfig test_config(float clamp = 0.0f) {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 256;
  cfg.num_experts = 16;  // 16, 8 or 4 per rank on 1, 2, 4 ranks
  cfg.topk = 4;
  cfg.max_tokens_per_rank = 96;
  cfg.swiglu_clamp = clamp;
  return cfg;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Sets EPFUSE_TIMEOUT_MS for the layers created in its scope (read at creation).
class TimeoutEnv {
 public:
  explicit TimeoutEnv(const char* ms) { setenv("EPFUSE_TIMEOUT_MS", ms, 1); }
  ~TimeoutEnv() { unsetenv("EPFUSE_TIMEOUT_MS"); }
};

class Rank {
 public:
  explicit Rank(const LayerConfig& cfg) : cfg_(cfg), comm_(testing::comm()) {
    const int local = cfg.experts_per_rank(comm_.world_size());
    w13_ = DeviceMemory(size_t(local) * 2 * cfg.intermediate * cfg.hidden * sizeof(bf16));
    w2_ = DeviceMemory(size_t(local) * cfg.hidden * cfg.intermediate * sizeof(bf16));
    EPFUSE_CUDA_CHECK(cudaStreamCreate(&stream_));
    generate_expert_weights(cfg, comm_.world_size(), comm_.rank(), kWeightSeed, w13_.as<bf16>(), w2_.as<bf16>(),
                            stream_);
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    recreate();
    const size_t tokens = cfg.max_tokens_per_rank + 1;  // +1: room for the too-many-tokens test
    x_ = DeviceMemory(tokens * cfg.hidden * sizeof(bf16));
    idx_ = DeviceMemory(tokens * cfg.topk * sizeof(int32_t));
    weights_ = DeviceMemory(tokens * cfg.topk * sizeof(float));
    y_ = DeviceMemory(tokens * cfg.hidden * sizeof(bf16));
  }
  ~Rank() {
    layer_.reset();
    cudaStreamDestroy(stream_);
  }

  // Collective.
  void recreate() {
    layer_.reset();
    layer_ = MoeLayer::create(Impl::kFused, cfg_, comm_, {w13_.as<bf16>(), w2_.as<bf16>()});
  }

  MoeLayer& layer() { return *layer_; }
  cudaStream_t stream() const { return stream_; }
  int rank() const { return comm_.rank(); }
  int world() const { return comm_.world_size(); }

  HostTokens tokens(int count, Routing routing, uint64_t seed) const {
    return make_tokens(cfg_, world(), rank(), count, routing, seed);
  }
  void upload(const HostTokens& in) {
    EPFUSE_CUDA_CHECK(cudaMemcpy(x_.as(), in.x.data(), in.x.size() * sizeof(bf16), cudaMemcpyHostToDevice));
    EPFUSE_CUDA_CHECK(
        cudaMemcpy(idx_.as(), in.topk_idx.data(), in.topk_idx.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    EPFUSE_CUDA_CHECK(cudaMemcpy(weights_.as(), in.topk_weights.data(), in.topk_weights.size() * sizeof(float),
                                 cudaMemcpyHostToDevice));
  }
  TokenBatch batch(int count) const { return {x_.as<bf16>(), idx_.as<int32_t>(), weights_.as<float>(), count}; }

  // Poisons y (bf16 NaN), runs one forward, returns the rows as double.
  std::vector<double> forward(const HostTokens& in) {
    upload(in);
    EPFUSE_CUDA_CHECK(cudaMemsetAsync(y_.as(), 0xff, y_.bytes(), stream_));
    layer_->forward(batch(in.num_tokens), y_.as<bf16>(), stream_);
    layer_->check_errors(stream_);
    std::vector<bf16> host(size_t(in.num_tokens) * cfg_.hidden);
    EPFUSE_CUDA_CHECK(cudaMemcpy(host.data(), y_.as(), host.size() * sizeof(bf16), cudaMemcpyDeviceToHost));
    std::vector<double> out(host.size());
    for (size_t i = 0; i < host.size(); ++i) out[i] = __bfloat162float(host[i]);
    return out;
  }

  void expect_matches_reference(const HostTokens& in, const std::string& what) {
    std::vector<double> got;
    try {
      got = forward(in);
    } catch (const Error& e) {
      ADD_FAILURE() << what << ": " << e.what();
      return;
    }
    size_t unwritten = 0;
    for (double v : got) unwritten += std::isnan(v);
    EXPECT_EQ(unwritten, 0u) << what;
    const std::vector<double> want = reference_forward(cfg_, in, GeneratedExperts(cfg_, kWeightSeed));
    if (in.num_tokens > 0) {
      EXPECT_LT(relative_error(want, got), 2e-2) << what;
    }
  }

  // Runs forward + check_errors and returns the Error (code kInternal with "no error" if none).
  Error forward_error(const TokenBatch& batch) {
    try {
      layer_->forward(batch, y_.as<bf16>(), stream_);
      layer_->check_errors(stream_);
    } catch (const Error& e) {
      // A rank that threw in forward still launched; let its kernel finish before anything else.
      cudaStreamSynchronize(stream_);
      return e;
    }
    return Error(ErrorCode::kInternal, "no error");
  }

 private:
  LayerConfig cfg_;
  Communicator& comm_;
  DeviceMemory w13_, w2_, x_, idx_, weights_, y_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<MoeLayer> layer_;
};

TEST(FusedLayer, MatchesReferenceOverManyCalls) {
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
// 32x128) against the reference: few experts and up to 256 tokens, so the per-call row estimate
// (tokens x k x world / E) crosses each shape's range.
TEST(FusedLayer, EveryTileShapeMatchesReference) {
  LayerConfig cfg = test_config();
  cfg.num_experts = 4;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 256;
  Rank r(cfg);
  std::vector<fused::GemmTileShape> seen;
  uint64_t seed = 300;
  for (int count : {256, 100, 16, 256, 40}) {
    const int rows = count * cfg.topk * r.world() / cfg.num_experts;
    const fused::GemmTileShape tile = fused::choose_fused_tile(cfg, rows);
    if (std::find(seen.begin(), seen.end(), tile) == seen.end()) seen.push_back(tile);
    for (Routing routing : {Routing::kUniform, Routing::kOneExpert})
      r.expect_matches_reference(r.tokens(count, routing, seed++),
                                 std::string(to_string(routing)) + " T=" + std::to_string(count) + " block " +
                                     std::to_string(tile.block_m) + "x" + std::to_string(tile.block_n) +
                                     (tile.mma == fused::GemmMma::kWgmma ? " wgmma" : " mma.sync"));
  }
  EXPECT_EQ(seen.size(), std::size(fused::kFusedTileShapes)) << "a fused tile shape went untested";
}

// Phase timing (the in-kernel profile): off by default, per-phase ms per SM when on, results unchanged.
TEST(FusedLayer, PhaseTimingReportsEveryPhase) {
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

TEST(FusedLayer, ClampMatchesReference) {
  Rank r(test_config(0.05f));
  r.expect_matches_reference(r.tokens(64, Routing::kUniform, 11), "clamp 0.05");
}

TEST(FusedLayer, MemoryIsThePlan) {
  const LayerConfig cfg = test_config();
  Rank r(cfg);
  const fused::FusedPlan plan = fused::plan_fused(cfg, r.world());
  EXPECT_EQ(r.layer().memory().symmetric_bytes, plan.symmetric_bytes());
  EXPECT_EQ(r.layer().memory().private_bytes, plan.private_bytes());
  if (r.rank() == 0) std::printf("fused memory plan, world %d:\n%s", r.world(), fused::format_plan(plan).c_str());
}

TEST(FusedLayer, BadExpertIdFailsEveryRankFast) {
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
  // The layer is now unusable (its counters are mid-call) and says so without launching.
  const Error again = r.forward_error(r.batch(in.num_tokens));
  EXPECT_EQ(again.code(), ErrorCode::kInternal);
  EXPECT_NE(std::string(again.what()).find("re-create"), std::string::npos) << again.what();
  r.recreate();
  r.expect_matches_reference(r.tokens(40, Routing::kUniform, 22), "re-created after a bad expert id");
}

TEST(FusedLayer, TooManyTokensFailsEveryRankFast) {
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

TEST(FusedLayer, MissingPeerTimesOutWithinTheBound) {
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
      // The first wait to expire is the collect task's (the others wait for its plan).
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(r.rank()) + ": timed out in "), std::string::npos)
          << e.what();
      std::printf("rank %d: %s\n", r.rank(), e.what());
    }
    testing::comm().barrier();
  }  // every rank destroys its layer (collective) ...
  Rank fresh(cfg);  // ... and a new one works
  fresh.expect_matches_reference(fresh.tokens(32, Routing::kUniform, 62), "new layer after a timeout");
}

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 2); }
