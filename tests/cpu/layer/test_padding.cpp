// The sizes padded layers run at and the block-scale re-layout (src/padding/padding.h).
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include "common/fp8.h"
#include "epfuse/error.h"
#include "padding/padding.h"

namespace epfuse::padding {
namespace {

LayerConfig sized(int hidden, int intermediate, WeightFormat format) {
  return {.hidden = hidden, .intermediate = intermediate, .num_experts = 8, .topk = 2, .max_tokens_per_rank = 16,
          .weight_format = format};
}

TEST(Padding, SizesEachImplementationRuns) {
  struct Case {
    int h, i;
    Impl impl;
    WeightFormat format;
    int want_h, want_i;
  };
  const Case cases[] = {
      {2880, 2880, Impl::kFused, WeightFormat::kBf16, 3072, 2944},  // padded: the 128 x 256 tile's H
      {2880, 2880, Impl::kFused, WeightFormat::kFp8Block128, 3072, 2944},  // the FP8 tile's H: 256
      {2944, 2944, Impl::kFused, WeightFormat::kBf16, 2944, 2944},         // tiled: not padded
      {320, 192, Impl::kFused, WeightFormat::kBf16, 512, 256},
      {2880, 2880, Impl::kUnfused, WeightFormat::kFp8Block128, 2944, 2944},
      {384, 256, Impl::kFused, WeightFormat::kFp8Block128, 512, 256},
      {384, 256, Impl::kFused, WeightFormat::kBf16, 384, 256},
      {320, 192, Impl::kUnfused, WeightFormat::kBf16, 384, 256},
      {7168, 2048, Impl::kFused, WeightFormat::kFp8Block128, 7168, 2048},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.h) + " x " + std::to_string(c.i));
    const LayerConfig cfg = sized(c.h, c.i, c.format);
    const LayerConfig run = padded_config(cfg, c.impl);
    EXPECT_EQ(run.hidden, c.want_h);
    EXPECT_EQ(run.intermediate, c.want_i);
    EXPECT_EQ(run.num_experts, cfg.num_experts);
    EXPECT_EQ(run.weight_format, cfg.weight_format);
    EXPECT_EQ(needs_padding(cfg, c.impl), c.want_h != c.h || c.want_i != c.i);
    EXPECT_FALSE(needs_padding(run, c.impl)) << "padded sizes run as they are";
  }
}

// w13 of one expert at H 320, I 192 for the fused FP8 tile (H 512, I 256): the gate and up halves
// (2 matrices) of ceil(192/128) = 2 block rows and ceil(320/128) = 3 block columns into 2 x 4.
TEST(Padding, BlockScalesKeepTheirBlocksAndAddScaleOne) {
  const int matrices = 2, rows = 2, cols = 3, rows_pad = 2, cols_pad = 4;
  std::vector<float> scales(matrices * rows * cols);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = 0.5f + static_cast<float>(i);
  const std::vector<uint8_t> bytes =
      pad_block_scales(scales.data(), ScaleFormat::kFp32, matrices, rows, cols, rows_pad, cols_pad);
  ASSERT_EQ(bytes.size(), sizeof(float) * matrices * rows_pad * cols_pad);
  std::vector<float> out(matrices * rows_pad * cols_pad);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  for (int m = 0; m < matrices; ++m)
    for (int r = 0; r < rows_pad; ++r)
      for (int c = 0; c < cols_pad; ++c) {
        const float want = c < cols ? scales[(m * rows + r) * cols + c] : 1.0f;
        EXPECT_EQ(out[(m * rows_pad + r) * cols_pad + c], want) << m << " " << r << " " << c;
      }
  // UE8M0 bytes, with a new block row (w2 at H 320 -> 512: 3 -> 4 rows).
  const std::vector<uint8_t> ue = {120, 121, 122, 123, 124, 125};  // [1, 3, 2]
  const std::vector<uint8_t> padded = pad_block_scales(ue.data(), ScaleFormat::kUe8m0, 1, 3, 2, 4, 2);
  EXPECT_EQ(padded, (std::vector<uint8_t>{120, 121, 122, 123, 124, 125, fp8::kUe8m0One, fp8::kUe8m0One}));
  EXPECT_THROW(pad_block_scales(ue.data(), ScaleFormat::kUe8m0, 1, 3, 2, 2, 2), Error);
}

}  // namespace
}  // namespace epfuse::padding
