// The FP8 weights' host arithmetic, shared by both implementations: the padded block-scale layout
// (block_scales.h) and the checks and conversion of the caller's block scales at layer creation
// (fp8_weights.h).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "epfuse/error.h"
#include "weights/block_scales.h"
#include "weights/fp8_weights.h"

namespace epfuse::weights {
namespace {

TEST(BlockScales, PaddedKBlocks) {
  EXPECT_EQ(padded_k_blocks(128), 4);
  EXPECT_EQ(padded_k_blocks(512), 4);
  EXPECT_EQ(padded_k_blocks(640), 8);
  EXPECT_EQ(padded_k_blocks(768), 8);    // qwen3-30b I: 6 blocks -> 8
  EXPECT_EQ(padded_k_blocks(2048), 16);
  EXPECT_EQ(padded_k_blocks(2880), 24);  // 23 blocks, the last 64 wide
  EXPECT_EQ(padded_k_blocks(7168), 56);
  EXPECT_EQ(weight_scale_floats(2 * 768, 2048), 12 * 16);
  EXPECT_EQ(weight_scale_floats(2048, 768), 16 * 8);
}

LayerConfig fp8_config() {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 384;
  cfg.num_experts = 4;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 8;
  cfg.weight_format = WeightFormat::kFp8Block128;
  return cfg;
}

TEST(Fp8Weights, ScaleCounts) {
  const LayerConfig cfg = fp8_config();
  EXPECT_EQ(w13_scale_count(cfg, 4), 4 * 6 * 2);
  EXPECT_EQ(w2_scale_count(cfg, 4), 4 * 2 * 3);
}

TEST(Fp8Weights, PointerChecks) {
  const LayerConfig cfg = fp8_config();
  alignas(16) static uint8_t codes[64];
  alignas(16) static float scales[64];
  ExpertWeights w;
  EXPECT_EQ(check_fp8_weight_pointers(cfg, 4, w),
            "FP8 weights (weight_format=fp8-block128) need w13_fp8, w2_fp8, w13_scales and w2_scales (null: w13_fp8 "
            "w2_fp8 w13_scales w2_scales)");
  w.w13_fp8 = codes;
  w.w2_fp8 = codes + 1;
  w.w13_scales = scales;
  w.w2_scales = scales;
  w.w13_scales_count = w13_scale_count(cfg, 4);
  w.w2_scales_count = w2_scale_count(cfg, 4);
  EXPECT_EQ(check_fp8_weight_pointers(cfg, 4, w), "w13_fp8 and w2_fp8 must be 16-byte aligned");
  w.w2_fp8 = codes;
  EXPECT_EQ(check_fp8_weight_pointers(cfg, 4, w), "");
  w.w13_scales_count = 4 * 5 * 2;  // 5 scale rows per expert where I = 384 has 2 * 3
  EXPECT_EQ(check_fp8_weight_pointers(cfg, 4, w),
            "w13_scales_count = 40, expected 48 = [4, 6, 2] (one scale per 128x128 block, gate and up halves "
            "blocked apart)");
  w.w13_scales_count = w13_scale_count(cfg, 4);
  w.w2_scales_count = 1;
  EXPECT_EQ(check_fp8_weight_pointers(cfg, 4, w),
            "w2_scales_count = 1, expected 24 = [4, 2, 3] (one scale per 128x128 block)");
}

// Checkpoint [matrices, rows, ceil(k/128)] -> [matrices, rows, padded_k_blocks(k)], padding 1.
TEST(Fp8Weights, ConvertsToPaddedBlockLayout) {
  const int matrices = 2, rows = 3, k = 768;  // 6 k-blocks -> 8
  std::vector<float> in(matrices * rows * 6);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 0.5f + static_cast<float>(i);
  const std::vector<float> out = to_padded_block_scales(in.data(), ScaleFormat::kFp32, matrices, rows, k, "s");
  ASSERT_EQ(out.size(), size_t(matrices * rows * 8));
  for (int m = 0; m < matrices; ++m)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 8; ++c)
        EXPECT_EQ(out[(m * rows + r) * 8 + c], c < 6 ? in[(m * rows + r) * 6 + c] : 1.0f) << m << " " << r << " " << c;
}

TEST(Fp8Weights, ConvertsUe8m0Exponents) {
  const std::vector<uint8_t> in = {127, 120, 134, 1};
  const std::vector<float> out = to_padded_block_scales(in.data(), ScaleFormat::kUe8m0, 1, 1, 512, "s");
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], std::ldexp(1.0f, -7));
  EXPECT_EQ(out[2], 128.0f);
  EXPECT_EQ(out[3], std::ldexp(1.0f, -126));
}

void expect_rejected(const void* scales, ScaleFormat format, const std::string& message) {
  try {
    to_padded_block_scales(scales, format, 2, 2, 256, "w2_scales");
    ADD_FAILURE() << "no error, expected " << message;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(Fp8Weights, RejectsBadScalesNamingTheFirst) {
  std::vector<float> f(2 * 2 * 2, 0.25f);
  f[5] = std::numeric_limits<float>::quiet_NaN();  // [1][0][1]
  f[7] = 0.0f;
  expect_rejected(f.data(), ScaleFormat::kFp32, "w2_scales[1][0][1] = nan (scales must be finite and > 0)");
  f[5] = 0.25f;
  expect_rejected(f.data(), ScaleFormat::kFp32, "w2_scales[1][1][1] = 0 (scales must be finite and > 0)");
  f[7] = -1.0f;
  expect_rejected(f.data(), ScaleFormat::kFp32, "w2_scales[1][1][1] = -1 (scales must be finite and > 0)");
  f[7] = std::numeric_limits<float>::infinity();
  expect_rejected(f.data(), ScaleFormat::kFp32, "w2_scales[1][1][1] = inf (scales must be finite and > 0)");
  std::vector<uint8_t> e(8, 127);
  e[2] = 0;
  expect_rejected(e.data(), ScaleFormat::kUe8m0,
                  "w2_scales[0][1][0] = exponent byte 0 (UE8M0 scales must be bytes in [1, 254])");
  e[2] = 255;
  expect_rejected(e.data(), ScaleFormat::kUe8m0,
                  "w2_scales[0][1][0] = exponent byte 255 (UE8M0 scales must be bytes in [1, 254])");
}

}  // namespace
}  // namespace epfuse::weights
