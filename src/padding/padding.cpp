// Host side of padded layers (padding.h): sizes, the block-scale re-layout and the staging rows.
#include "padding/padding.h"

#include <cstring>
#include <string>

#include "common/check.h"
#include "common/fp8.h"
#include "epfuse/error.h"

namespace epfuse::padding {

LayerConfig padded_config(const LayerConfig& cfg, Impl impl) {
  const bool fused = impl == Impl::kFused;
  const int native_h = fused && cfg.weight_format == WeightFormat::kFp8Block128 ? kFusedHiddenAlign : kTileAlign;
  if (cfg.hidden % native_h == 0 && cfg.intermediate % kTileAlign == 0) return cfg;
  LayerConfig p = cfg;
  p.hidden = round_up(cfg.hidden, fused ? kFusedHiddenAlign : kTileAlign);
  p.intermediate = round_up(cfg.intermediate, kTileAlign);
  return p;
}

bool needs_padding(const LayerConfig& cfg, Impl impl) {
  const LayerConfig p = padded_config(cfg, impl);
  return p.hidden != cfg.hidden || p.intermediate != cfg.intermediate;
}

std::vector<uint8_t> pad_block_scales(const void* scales, ScaleFormat format, int matrices, int rows, int cols,
                                      int rows_pad, int cols_pad) {
  EPFUSE_REQUIRE(matrices >= 0 && rows >= 0 && cols >= 0 && rows_pad >= rows && cols_pad >= cols,
                 ErrorCode::kInternal,
                 "pad_block_scales: [" + std::to_string(matrices) + ", " + std::to_string(rows) + ", " +
                     std::to_string(cols) + "] into [" + std::to_string(rows_pad) + ", " + std::to_string(cols_pad) +
                     "]");
  const size_t elem = format == ScaleFormat::kFp32 ? sizeof(float) : 1;
  std::vector<uint8_t> out(static_cast<size_t>(matrices) * rows_pad * cols_pad * elem);
  const float one = 1.0f;
  for (size_t i = 0; i < out.size() / elem; ++i) {
    if (format == ScaleFormat::kFp32)
      std::memcpy(out.data() + i * elem, &one, elem);
    else
      out[i] = fp8::kUe8m0One;
  }
  const auto* in = static_cast<const uint8_t*>(scales);
  for (int m = 0; m < matrices; ++m)
    for (int r = 0; r < rows; ++r)
      std::memcpy(out.data() + ((static_cast<size_t>(m) * rows_pad + r) * cols_pad) * elem,
                  in + ((static_cast<size_t>(m) * rows + r) * cols) * elem, cols * elem);
  return out;
}

Stage::Stage(int max_tokens, int hidden)
    : max_tokens_(max_tokens),
      hidden_(hidden),
      buffer_(2 * static_cast<size_t>(max_tokens) * hidden * sizeof(bf16)) {}

Stage::~Stage() = default;

}  // namespace epfuse::padding
