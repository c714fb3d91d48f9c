#include "weights/fp8_weights.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include <cuda_runtime.h>

#include "common/check.h"
#include "common/fp8.h"
#include "epfuse/error.h"
#include "weights/block_scales.h"

namespace epfuse::weights {

int64_t w13_scale_count(const LayerConfig& cfg, int experts_per_rank) {
  return int64_t{experts_per_rank} * fp8::w13_scale_rows(cfg.intermediate) * fp8::num_blocks(cfg.hidden);
}

int64_t w2_scale_count(const LayerConfig& cfg, int experts_per_rank) {
  return int64_t{experts_per_rank} * fp8::num_blocks(cfg.hidden) * fp8::num_blocks(cfg.intermediate);
}

std::string check_fp8_weight_pointers(const LayerConfig& cfg, int experts_per_rank, const ExpertWeights& w) {
  if (w.w13_fp8 == nullptr || w.w2_fp8 == nullptr || w.w13_scales == nullptr || w.w2_scales == nullptr)
    return "FP8 weights (weight_format=fp8-block128) need w13_fp8, w2_fp8, w13_scales and w2_scales (null:" +
           std::string(w.w13_fp8 == nullptr ? " w13_fp8" : "") + (w.w2_fp8 == nullptr ? " w2_fp8" : "") +
           (w.w13_scales == nullptr ? " w13_scales" : "") + (w.w2_scales == nullptr ? " w2_scales" : "") + ")";
  if (reinterpret_cast<uintptr_t>(w.w13_fp8) % 16 != 0 || reinterpret_cast<uintptr_t>(w.w2_fp8) % 16 != 0)
    return "w13_fp8 and w2_fp8 must be 16-byte aligned";
  const size_t scale_align = cfg.scale_format == ScaleFormat::kFp32 ? sizeof(float) : 1;
  if (reinterpret_cast<uintptr_t>(w.w13_scales) % scale_align != 0 ||
      reinterpret_cast<uintptr_t>(w.w2_scales) % scale_align != 0)
    return "w13_scales and w2_scales must be 4-byte aligned (float scales)";
  const int64_t want13 = w13_scale_count(cfg, experts_per_rank), want2 = w2_scale_count(cfg, experts_per_rank);
  const auto shape = [](int64_t e, int64_t r, int64_t c) {
    std::string text(1, '[');  // appended, not "[" + ...: GCC 12 warns (-Wrestrict) on the latter
    text += std::to_string(e);
    text += ", ";
    text += std::to_string(r);
    text += ", ";
    text += std::to_string(c);
    return text + "]";
  };
  if (w.w13_scales_count != want13)
    return "w13_scales_count = " + std::to_string(w.w13_scales_count) + ", expected " + std::to_string(want13) +
           " = " +
           shape(experts_per_rank, fp8::w13_scale_rows(cfg.intermediate), fp8::num_blocks(cfg.hidden)) +
           " (one scale per 128x128 block, gate and up halves blocked apart)";
  if (w.w2_scales_count != want2)
    return "w2_scales_count = " + std::to_string(w.w2_scales_count) + ", expected " + std::to_string(want2) + " = " +
           shape(experts_per_rank, fp8::num_blocks(cfg.hidden), fp8::num_blocks(cfg.intermediate)) +
           " (one scale per 128x128 block)";
  return "";
}

std::vector<float> to_padded_block_scales(const void* scales, ScaleFormat format, int matrices, int rows, int k,
                                            const std::string& name) {
  const int kb = fp8::num_blocks(k), padded = padded_k_blocks(k);
  std::vector<float> out(static_cast<size_t>(matrices) * rows * padded, 1.0f);
  const auto* f = static_cast<const float*>(scales);
  const auto* e = static_cast<const uint8_t*>(scales);
  for (int m = 0; m < matrices; ++m)
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < kb; ++c) {
        const size_t in = (static_cast<size_t>(m) * rows + r) * kb + c;
        float value;
        bool ok;
        std::string shown;
        if (format == ScaleFormat::kUe8m0) {
          ok = e[in] != 0 && e[in] != 255;
          value = fp8::ue8m0_to_float(e[in]);
          shown = "exponent byte " + std::to_string(e[in]) + " (UE8M0 scales must be bytes in [1, 254])";
        } else {
          value = f[in];
          ok = std::isfinite(value) && value > 0.0f;
          char buf[48];
          std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(value));
          shown = std::string(buf) + " (scales must be finite and > 0)";
        }
        if (!ok)
          throw Error(ErrorCode::kInvalidArgument, name + "[" + std::to_string(m) + "][" + std::to_string(r) + "][" +
                                                       std::to_string(c) + "] = " + shown);
        out[(static_cast<size_t>(m) * rows + r) * padded + c] = value;
      }
  return out;
}

CheckedScales read_block_scales(const void* device_scales, int64_t count, ScaleFormat format, int matrices, int rows,
                                int k, const std::string& name, const std::string& prefix) {
  CheckedScales s;
  s.raw.resize(static_cast<size_t>(count) * (format == ScaleFormat::kFp32 ? sizeof(float) : 1));
  EPFUSE_CUDA_CHECK(cudaMemcpy(s.raw.data(), device_scales, s.raw.size(), cudaMemcpyDeviceToHost));
  try {
    s.blocked = to_padded_block_scales(s.raw.data(), format, matrices, rows, k, name);
  } catch (const Error& e) {
    throw Error(e.code(), prefix + e.what());
  }
  return s;
}

}  // namespace epfuse::weights
