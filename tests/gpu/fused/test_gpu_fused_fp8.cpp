// The fused layer with FP8 weights (weight_format = kFp8Block128): one persistent kernel with FP8
// dispatch (x quantised 1x128 on the way), TileGemmTmaFp8 Linear1 with the h quantisation in its
// epilogue, TileGemmTmaFp8 Linear2 and the bf16 combine, against the FP8 float64 reference
// (reference.h: the same weight blocks and the same x and h quantisation), on every routing and T in
// {0, 1, 7, 128} (and uneven T), both scale formats, the clamp, a wider layer; forwards after a kernel
// that left a byte pattern in every SM's shared memory, and new layers' first forwards at DeepSeek-V3's
// decode shape; the creation's checks of the FP8 weights; an FP8 layer on a workspace made for bf16 is
// refused; an FP8 and a bf16 layer share a workspace made for an FP8 capacity; both FP8 kernels (the
// decode kernel's tiles of at most 16 rows in the decode form, its larger tiles in the 64-row form).
// Self-diagnosing: every check prints its error against the FP8 reference (overall and worst row) and
// against the bf16 reference; a failing check prints the worst rows with their token, routed experts
// (local expert, rank) and the got / want ratio over the row (a clean factor means a scale mix-up: x
// scales in dispatch, h scales in Linear1's epilogue, block scales of w13 or w2), and whether the bad
// rows are the ones routed to one rank or one expert.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/job.h"
#include "epfuse/epfuse.h"
#include "fp8_layer_rank.h"
#include "fused/fused_layer.h"
#include "device/protocol/regions.h"
#include "fused/heuristics.h"
#include "layer_rank.h"
#include "multiprocess.h"
#include "scoped_env.h"
#include "stale_shared.h"

namespace epfuse {
namespace {

using testing::fp8_layer_config;

class Rank : public testing::Fp8LayerRank {
 public:
  explicit Rank(const LayerConfig& cfg) : Fp8LayerRank(Impl::kFused, cfg), cfg_(cfg) {}

  // Fp8LayerRank's check, and on a failure the worst rows (diagnose).
  void check(const HostTokens& in, const std::string& what) {
    const std::optional<Checked> c = Fp8LayerRank::check(in, what);
    if (c && c->failed) diagnose(in, c->got, c->want, c->row_errors, what);
  }

 private:
  // The worst rows: token, its slots (expert -> rank, local expert, weight), the got / want ratio (least
  // squares over the row) and the first column that differs by more than 5%.
  void diagnose(const HostTokens& in, const std::vector<double>& got, const std::vector<double>& want,
                const std::vector<double>& rows, const std::string& what) const {
    const size_t H = static_cast<size_t>(cfg_.hidden);
    const int L = cfg_.num_experts / world();
    std::vector<size_t> order(rows.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return !(rows[a] <= rows[b]); });
    std::vector<int> bad_by_rank(world(), 0), slots_by_rank(world(), 0);
    for (size_t t = 0; t < rows.size(); ++t)
      for (int j = 0; j < cfg_.topk; ++j) {
        const int e = in.topk_idx[t * cfg_.topk + j];
        if (e < 0) continue;
        ++slots_by_rank[e / L];
        if (!(rows[t] <= 1e-2)) ++bad_by_rank[e / L];
      }
    std::string per_rank;
    for (int r = 0; r < world(); ++r)
      per_rank += " rank" + std::to_string(r) + ":" + std::to_string(bad_by_rank[r]) + "/" + std::to_string(slots_by_rank[r]);
    std::printf("[fp8 fused diag] rank %d %s: slots of rows with error > 1e-2, by expert rank (bad/all):%s\n",
                rank(), what.c_str(), per_rank.c_str());
    for (size_t n = 0; n < std::min<size_t>(order.size(), 6); ++n) {
      const size_t t = order[n];
      double gw = 0, ww = 0;
      long first = -1;
      for (size_t c = 0; c < H; ++c) {
        const double g = got[t * H + c], w = want[t * H + c];
        gw += g * w, ww += w * w;
        if (first < 0 && !(std::fabs(g - w) <= 0.05 * std::fabs(w) + 1e-3)) first = static_cast<long>(c);
      }
      std::string slots;
      for (int j = 0; j < cfg_.topk; ++j) {
        const int e = in.topk_idx[t * cfg_.topk + j];
        slots += " [" + std::to_string(e) + (e >= 0 ? " r" + std::to_string(e / L) + " l" + std::to_string(e % L) : "") +
                 " w" + std::to_string(in.topk_weights[t * cfg_.topk + j]) + "]";
      }
      std::printf("[fp8 fused diag]   token %zu: row error %.3e, got/want %.4f, first bad column %ld (got %.5g want %.5g)"
                  " (column / 128 = x group or Linear2 half; / 256 = Linear2 n-block); slots:%s\n",
                  t, rows[t], ww > 0 ? gw / ww : 0.0, first, first >= 0 ? got[t * H + first] : 0.0,
                  first >= 0 ? want[t * H + first] : 0.0, slots.c_str());
    }
  }

  LayerConfig cfg_;
};

EPFUSE_RANK_TEST(FusedFp8, MatchesReferenceForEveryRoutingAndTokenCount) {
  testing::check_every_routing_and_token_count<Rank>();
}

EPFUSE_RANK_TEST(FusedFp8, ClampMatchesReference) { testing::check_clamp<Rank>(); }

EPFUSE_RANK_TEST(FusedFp8, WiderLayer) { testing::check_wider_layer<Rank>(); }

// The FP8 tile's two kernels (heuristics.h): the decode kernel (up to kFp8DecodeRowsPerExpert rows a
// local expert on average) runs its tiles of at most 8 rows in the decode form at N = 8, of 9 to 16 at
// N = 16, and larger ones in the 64-row form; the other kernel runs every tile in the 64-row form. T = 1,
// 3 and the largest decode T (kFp8DecodeRowsPerExpert x 4 / world with this config's 16 experts, top-4)
// on three routings: at that T uniform routing gives most experts 9 to 24 rows and kOneExpert puts every
// token's slot 0 on one expert, more than 16 rows in one decode-kernel tile; then T = 128, the other kernel.
// Which kernel ran is the layer's own record (last_launched_tile), so a change in the choice fails here
// rather than leaving a form untested.
EPFUSE_RANK_TEST(FusedFp8, BothKernelsAndBothFormsMatchReference) {
  const LayerConfig cfg = fp8_layer_config();
  Rank r(cfg);
  const int world = r.world();
  const int decode_max = fused::kFp8DecodeRowsPerExpert * cfg.num_experts / (cfg.topk * world);
  ASSERT_GE(decode_max, 1) << "this config has no decode T at world " << world;
  uint64_t seed = 700;
  int decode_launches = 0, other_launches = 0;
  for (int count : {1, 3, decode_max, 128})
    for (Routing routing : {Routing::kUniform, Routing::kOneExpert, Routing::kSkewed}) {
      const std::string what = std::string(to_string(routing)) + " T=" + std::to_string(count);
      r.check(r.tokens(count, routing, seed++), what);
      const std::optional<fused::GemmTileShape> tile = fused::last_launched_tile(r.layer());
      ASSERT_TRUE(tile.has_value()) << what << ": the fused layer reported no launch";
      const bool decode = *tile == fused::kTmaFp8M128N256Decode;
      EXPECT_TRUE(decode || *tile == fused::kTmaFp8M128N256) << what << ": not an FP8 kernel";
      EXPECT_EQ(decode, count <= decode_max) << what << ": " << (decode ? "the decode kernel" : "the 64-row kernel");
      (decode ? decode_launches : other_launches) += 1;
    }
  EXPECT_GT(decode_launches, 0);
  EXPECT_GT(other_launches, 0);
}

// Linear2's K split (task_map.h linear2_call_parts, split_k.cuh) in the split kernel, forced
// (EPFUSE_FUSED_TILE=fp8-split, set before the ranks create their layers) and chosen (auto: choose_fused_tile
// takes it where the expected tiles leave room for parts, every T here in every mode): a long I (8192: 64
// k-blocks) over few Linear2 tiles (H 256: one n-block; 8 experts, top-2) splits each tile into up to 4 parts,
// whose last part adds every part's sums and stores. Every form of the kernel: T = 1 and 3 (N = 8), 40 uniform
// (about 10 rows an expert: N = 16), kOneExpert at 40 and 128 (a tile of more than 16 rows: the 64-row form); one
// forward after another on one layer (each finds its tiles' counters at zero), every row against the reference.
void split_linear2_matches_reference() {
  LayerConfig cfg = fp8_layer_config();
  cfg.intermediate = 8192;
  cfg.num_experts = 8;
  cfg.topk = 2;
  Rank r(cfg);
  // The arithmetic the kernel runs: at most 8 Linear2 tiles on a grid of 132 or more CTAs take 4 parts.
  ASSERT_EQ(device::linear2_call_parts(8, 1, cfg.intermediate, device::kSplitSlots), 4);
  uint64_t seed = 900;
  for (int count : {1, 3, 40, 128, 1})
    for (Routing routing : {Routing::kUniform, Routing::kOneExpert}) {
      const std::string what = std::string(to_string(routing)) + " T=" + std::to_string(count);
      r.check(r.tokens(count, routing, seed++), what);
      const std::optional<fused::GemmTileShape> tile = fused::last_launched_tile(r.layer());
      ASSERT_TRUE(tile.has_value()) << what;
      EXPECT_EQ(*tile, fused::kTmaFp8M128N256Split) << what;
    }
}
TEST(FusedFp8, SplitLinear2MatchesReference) {
  testing::ScopedEnv tile("EPFUSE_FUSED_TILE", "fp8-split");
  testing::on_every_rank(split_linear2_matches_reference);
}
TEST(FusedFp8, SplitKernelChosenForFewLongTiles) {
  testing::ScopedEnv tile("EPFUSE_FUSED_TILE", "auto");
  testing::on_every_rank(split_linear2_matches_reference);
}

// Shared memory is not cleared between kernels. Before each checked forward every SM's shared memory
// holds a byte pattern (stale_shared.h: 0xFF, NaN as any float; 0x00; 0x7F, a large float): a forward
// that read shared memory it had not written in its own launch computes with it. A fresh layer and
// workspace per pattern, so that its first forward (zeroed workspace, epoch 1) is among the checked.
EPFUSE_RANK_TEST(FusedFp8, StaleSharedMemoryChangesNothing) {
  testing::prepare_shared_memory_fill();
  // The fill is worth something only if the next kernel finds the pattern (one rank asks: in the one-GPU
  // mode the others' kernels share the SMs).
  if (testing::comm().rank() == 0) {
    cudaStream_t stream = nullptr;
    EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    testing::fill_shared_memory(0xA5, stream);
    const testing::SharedWords w = testing::shared_words_not(0xA5, stream);
    EPFUSE_CUDA_CHECK(cudaStreamDestroy(stream));
    std::printf("[stale shared memory] %lld of %lld words read by the next kernel are not the pattern\n", w.differing,
                w.read);
    EXPECT_LT(w.differing, w.read / 100) << "the next kernel does not find the pattern: the fill tests nothing";
  }
  testing::comm().barrier();
  uint64_t seed = 900;
  for (const uint8_t byte : {uint8_t{0xFF}, uint8_t{0x00}, uint8_t{0x7F}}) {
    Rank r(fp8_layer_config());
    r.set_before_forward([byte](cudaStream_t stream) { testing::fill_shared_memory(byte, stream); });
    for (const auto& [count, routing] : {std::pair{7, Routing::kUniform}, std::pair{1, Routing::kUniform},
                                         std::pair{128, Routing::kSkewed}, std::pair{7, Routing::kDropped}}) {
      const HostTokens in = r.tokens(count, routing, seed++);
      char what[96];
      std::snprintf(what, sizeof what, "shared memory of 0x%02X, %s T=%d", byte, std::string(to_string(routing)).c_str(),
                    count);
      r.check(in, what);
    }
  }
}

// DeepSeek-V3's decode shape (H 7168, I 2048, top-8, 8 tokens a rank; 64 experts over the ranks), where
// a layer's first verified forward once came out wrong (docs/performance.md#faults-seen-while-timing):
// each new layer's first two forwards (fresh inputs each) checked on every row against the float64
// reference, in a process's first layer, after a bf16 layer of the same shape ran and went, and with
// every SM's shared memory holding 0xFF bytes. A wrong forward prints its error, worst row and output norm (0: every
// checked row zero).
EPFUSE_RANK_TEST(FusedFp8, DecodeShapeFirstForwards) {
  testing::prepare_shared_memory_fill();
  // 64 experts: one GPU's share of dsv3's 256 at world 4, the shape that failed at world 1.
  LayerConfig cfg = make_config(*find_model("dsv3"), 8);
  cfg.num_experts /= 4;
  cfg.weight_format = WeightFormat::kFp8Block128;
  LayerConfig bf16 = cfg;
  bf16.weight_format = WeightFormat::kBf16;
  const std::vector<int> rows = tools::sample_rows(cfg.max_tokens_per_rank, 0);
  constexpr double kTolerance = 2e-2;  // epfuse run's default
  uint64_t seed = 950;
  const auto first_forwards = [&](const std::string& before, bool fill) {
    tools::RankJob job(testing::comm(), cfg, Impl::kFused, testing::kWeightSeed);
    for (int call = 0; call < 2; ++call) {
      const tools::InputSet in = job.make_inputs(cfg.max_tokens_per_rank, Routing::kUniform, seed++);
      const tools::Verdict v = job.verified_launch(in, rows, kTolerance, 0, [&] {
        if (fill) testing::fill_shared_memory(0xFF, job.stream());
        job.forward(in);
      });
      const std::string what = before + ", forward " + std::to_string(call + 1);
      std::printf("[fp8 decode shape] rank %d %s: rel err %.3e, worst row %d of rank %d at %.3e, %lld unwritten, "
                  "output norm %.4e\n",
                  job.comm().rank(), what.c_str(), v.max_rel_err, v.worst_row.row, v.worst_row.rank, v.worst_row.err,
                  static_cast<long long>(v.total_unwritten), v.output_norm);
      EXPECT_TRUE(v.passed) << what << ": rel err " << v.max_rel_err << ", worst row " << v.worst_row.row << " at "
                            << v.worst_row.err << ", output norm " << v.output_norm;
    }
  };
  first_forwards("the process's first layer", false);
  {
    tools::RankJob other(testing::comm(), bf16, Impl::kFused, testing::kWeightSeed);
    const tools::InputSet in = other.make_inputs(1, Routing::kUniform, seed++);
    for (int i = 0; i < 20; ++i) other.forward(in);
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(other.stream()));
  }
  first_forwards("after a bf16 layer", false);
  first_forwards("shared memory of 0xFF bytes", true);
}

// Creation with bad FP8 weights: every rank makes the same mistake, so every rank throws its own error.
void expect_create_fails(const LayerConfig& cfg, const ExpertWeights& weights, ErrorCode code, const std::string& message) {
  try {
    MoeLayer::create(Impl::kFused, cfg, testing::comm(), weights);
    ADD_FAILURE() << "no error, expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what() << "\nexpected to contain: " << message;
  }
}

EPFUSE_RANK_TEST(FusedFp8, CreateChecksTheWeights) {
  const LayerConfig cfg = fp8_layer_config();
  Rank r(cfg);
  const ExpertWeights good = r.weights();
  ExpertWeights w = good;
  w.w2_scales = nullptr;
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument, "(null: w2_scales)");
  w = good;
  w.w13_fp8 += 1;
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument, "w13_fp8 and w2_fp8 must be 16-byte aligned");
  w = good;
  w.w13_scales_count -= 1;
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument, "w13_scales_count = ");
  detail::DeviceBuffer copy(static_cast<size_t>(good.w2_scales_count) * sizeof(float));
  EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as(), good.w2_scales, copy.bytes(), cudaMemcpyDeviceToDevice));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as<float>() + 5, &nan, sizeof(float), cudaMemcpyHostToDevice));
  w = good;
  w.w2_scales = copy.as();
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument, "w2_scales[0][1][2] = nan (scales must be finite and > 0)");
  // The good weights still make a working layer afterwards.
  r.check(r.tokens(7, Routing::kUniform, 5), "after failed creations T=7");
}

// An FP8 layer needs a workspace made for an FP8 capacity (its fp8_x region).
EPFUSE_RANK_TEST(FusedFp8, RefusedOnBf16Workspace) {
  LayerConfig capacity = fp8_layer_config();
  capacity.weight_format = WeightFormat::kBf16;
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), capacity);
  try {
    testing::LayerRank r(Impl::kFused, fp8_layer_config(), 0, ws.get());
    ADD_FAILURE() << "an FP8 layer on a bf16 workspace was created";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig) << e.what();
    EXPECT_NE(std::string(e.what()).find("needs a workspace created with an fp8-block128 capacity"), std::string::npos)
        << e.what();
  }
}

// An FP8 layer and a bf16 layer of other shapes alternating on one workspace made for an FP8 capacity
// (every region addressed by the capacity; FP8 h and x rows in the bf16-sized regions): every call of
// each checked against its reference.
EPFUSE_RANK_TEST(FusedFp8, SharesAWorkspaceWithABf16Layer) {
  const LayerConfig capacity = fp8_layer_config();  // H 256, I 384, E 16, k 4, T 128
  LayerConfig small_fp8 = capacity;
  small_fp8.intermediate = 256;
  small_fp8.topk = 2;
  small_fp8.max_tokens_per_rank = 96;
  LayerConfig bf16 = capacity;
  bf16.weight_format = WeightFormat::kBf16;
  bf16.scale_format = ScaleFormat::kFp32;
  bf16.intermediate = 128;
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), capacity);
  {
    testing::LayerRank ra(Impl::kFused, small_fp8, 0, ws.get());
    testing::LayerRank rb(Impl::kFused, bf16, 0, ws.get());
    for (int call = 0; call < 6; ++call) {
      testing::LayerRank& r = call % 2 == 0 ? ra : rb;
      const int tokens = make_token_counts(r.world(), call % 2 == 0 ? 96 : 128, 700 + call)[r.rank()];
      const HostTokens in = r.tokens(tokens, call % 3 == 0 ? Routing::kSkewed : Routing::kUniform, 700 + call);
      r.expect_matches_reference(in, std::string(call % 2 == 0 ? "fp8 I=256 k=2" : "bf16 I=128") + " call " +
                                         std::to_string(call) + " T=" + std::to_string(tokens));
    }
  }
}

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 1); }
