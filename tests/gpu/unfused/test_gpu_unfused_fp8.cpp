// The unfused layer with FP8 weights (weight_format = kFp8Block128): cuBLASLt block-scaled FP8 GEMMs
// between 1x128 quantise kernels, against the FP8 float64 reference (reference.h: the same weight
// blocks and the same x and h quantisation), on every routing and T in {0, 1, 7, 128}, both scale
// formats, the clamp; and the creation's checks of the FP8 weights (bad scales, wrong shapes,
// misaligned codes). Each reference check prints its errors, so a failing GPU run says how far off.
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
#include "layer_rank.h"
#include "multiprocess.h"

namespace epfuse {
namespace {

using testing::fp8_layer_config;

class Rank : public testing::Fp8LayerRank {
 public:
  explicit Rank(const LayerConfig& cfg) : Fp8LayerRank(Impl::kUnfused, cfg) {}
};

TEST(UnfusedFp8, MatchesReferenceForEveryRoutingAndTokenCount) { testing::check_every_routing_and_token_count<Rank>(); }

TEST(UnfusedFp8, ClampMatchesReference) { testing::check_clamp<Rank>(); }

TEST(UnfusedFp8, WiderLayer) { testing::check_wider_layer<Rank>(); }

// Creation with FP8 weights whose fields are bad: every rank makes the same mistake, so every rank
// throws alone (the unfused creation has no collective after the config agreement).
void expect_create_fails(const LayerConfig& cfg, const ExpertWeights& weights, ErrorCode code,
                         const std::string& message, Impl impl = Impl::kUnfused) {
  try {
    MoeLayer::create(impl, cfg, testing::comm(), weights);
    ADD_FAILURE() << "no error, expected: " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code);
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(UnfusedFp8, CreateChecksTheWeights) {
  const LayerConfig cfg = fp8_layer_config();
  Rank r(cfg);
  const std::string who = "rank " + std::to_string(r.rank()) + ": MoeLayer::create: ";
  const ExpertWeights good = r.weights();

  ExpertWeights w = good;
  w.w2_scales = nullptr;
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument,
                      who + "FP8 weights (weight_format=fp8-block128) need w13_fp8, w2_fp8, w13_scales and "
                            "w2_scales (null: w2_scales)");
  w = good;
  w.w13_fp8 += 1;
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument, who + "w13_fp8 and w2_fp8 must be 16-byte aligned");
  w = good;
  w.w13_scales_count -= 1;
  const int local = cfg.experts_per_rank(r.world());
  expect_create_fails(cfg, w, ErrorCode::kInvalidArgument,
                      who + "w13_scales_count = " + std::to_string(good.w13_scales_count - 1) + ", expected " +
                          std::to_string(good.w13_scales_count) + " = [" + std::to_string(local) +
                          ", 6, 2] (one scale per 128x128 block, gate and up halves blocked apart)");

  // Bad values: a copy of the scales with one element replaced.
  const auto with_bad_scale = [&](size_t index, float value, const std::string& message) {
    detail::DeviceBuffer copy(static_cast<size_t>(good.w2_scales_count) * sizeof(float));
    EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as(), good.w2_scales, copy.bytes(), cudaMemcpyDeviceToDevice));
    EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as<float>() + index, &value, sizeof(float), cudaMemcpyHostToDevice));
    ExpertWeights bad = good;
    bad.w2_scales = copy.as();
    expect_create_fails(cfg, bad, ErrorCode::kInvalidArgument, who + message);
  };
  // w2 scales [local, 2, 3]: element 5 is [0][1][2].
  with_bad_scale(5, std::numeric_limits<float>::quiet_NaN(), "w2_scales[0][1][2] = nan (scales must be finite and > 0)");
  with_bad_scale(6, 0.0f, "w2_scales[1][0][0] = 0 (scales must be finite and > 0)");
  with_bad_scale(0, -0.5f, "w2_scales[0][0][0] = -0.5 (scales must be finite and > 0)");

  // The layer still works with the good weights after all that.
  r.check(r.tokens(7, Routing::kUniform, 31), "after bad weights");
}

TEST(UnfusedFp8, CreateChecksUe8m0Scales) {
  const LayerConfig cfg = fp8_layer_config(ScaleFormat::kUe8m0);
  Rank r(cfg);
  const ExpertWeights good = r.weights();
  detail::DeviceBuffer copy(static_cast<size_t>(good.w13_scales_count));
  EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as(), good.w13_scales, copy.bytes(), cudaMemcpyDeviceToDevice));
  const uint8_t nan_exponent = 255;
  EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as<uint8_t>() + 13, &nan_exponent, 1, cudaMemcpyHostToDevice));  // [1][0][1]
  ExpertWeights bad = good;
  bad.w13_scales = copy.as();
  expect_create_fails(cfg, bad, ErrorCode::kInvalidArgument,
                      "rank " + std::to_string(r.rank()) +
                          ": MoeLayer::create: w13_scales[1][0][1] = exponent byte 255 (UE8M0 scales must be bytes "
                          "in [1, 254])");
}

// H 320 and I 192 are not tiled by the kernels: both layers run them padded (src/padding), checking
// the caller's weights in the caller's layout first, so counts and bad scales are named as the caller
// holds them (w13 scales [local, 2 * 2, 3]), and the padded layer matches the reference.
TEST(UnfusedFp8, PaddedLayersCheckTheCallersLayout) {
  LayerConfig cfg = fp8_layer_config(ScaleFormat::kUe8m0);
  cfg.hidden = 320;
  cfg.intermediate = 192;
  Rank r(cfg);
  const ExpertWeights good = r.weights();
  const std::string who = "rank " + std::to_string(r.rank()) + ": MoeLayer::create: ";
  const int local = cfg.experts_per_rank(r.world());
  detail::DeviceBuffer copy(static_cast<size_t>(good.w13_scales_count));
  EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as(), good.w13_scales, copy.bytes(), cudaMemcpyDeviceToDevice));
  const uint8_t nan_exponent = 255;
  EPFUSE_CUDA_CHECK(cudaMemcpy(copy.as<uint8_t>() + 13, &nan_exponent, 1, cudaMemcpyHostToDevice));  // [1][0][1]
  for (Impl impl : {Impl::kUnfused, Impl::kFused}) {
    SCOPED_TRACE(std::string(to_string(impl)));
    ExpertWeights bad = good;
    bad.w13_scales = copy.as();
    expect_create_fails(cfg, bad, ErrorCode::kInvalidArgument,
                        who + "w13_scales[1][0][1] = exponent byte 255 (UE8M0 scales must be bytes in [1, 254])", impl);
    bad = good;
    bad.w13_scales_count -= 1;
    expect_create_fails(cfg, bad, ErrorCode::kInvalidArgument,
                        who + "w13_scales_count = " + std::to_string(good.w13_scales_count - 1) + ", expected " +
                            std::to_string(good.w13_scales_count) + " = [" + std::to_string(local) +
                            ", 4, 3] (one scale per 128x128 block, gate and up halves blocked apart)",
                        impl);
  }
  r.check(r.tokens(7, Routing::kUniform, 41), "padded, T=7");
  r.check(r.tokens(96, Routing::kSkewed, 42), "padded, T=96");
}

}  // namespace
}  // namespace epfuse

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 1); }
