// Host side of the FP8 expert weights (LayerConfig::weight_format = kFp8Block128, epfuse/types.h), what
// every layer that runs them does at creation (the fused and the unfused ones, and the padded wrapper):
// the checks of the caller's FP8 fields and the conversion of its block scales (fp32 or UE8M0) into the
// padded fp32 layout (block_scales.h). Host functions, unit-tested on the CPU (tests/cpu/weights;
// read_block_scales also copies from the device).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "epfuse/config.h"
#include "epfuse/types.h"

namespace epfuse::weights {

// Scale elements of this rank's w13 / w2 in the caller's (checkpoint) layout, config.h:
// w13 [E_local, 2 * ceil(I/128), ceil(H/128)], w2 [E_local, ceil(H/128), ceil(I/128)].
int64_t w13_scale_count(const LayerConfig& cfg, int experts_per_rank);
int64_t w2_scale_count(const LayerConfig& cfg, int experts_per_rank);

// "" when the FP8 fields of `weights` can be used (non-null, 16-byte aligned codes, scale pointers
// non-null, scale counts equal to the shapes above); otherwise one line naming the first problem.
std::string check_fp8_weight_pointers(const LayerConfig& cfg, int experts_per_rank, const ExpertWeights& weights);

// Scales as the caller stores them (a host copy: `matrices` matrices of `rows` x ceil(k/128) block
// scales, float or UE8M0 bytes by `format`) into the padded block layout (block_scales.h): float, each
// row of k-blocks padded to padded_k_blocks(k) with 1.0f. Throws Error(kInvalidArgument) for the
// first scale that is not finite and > 0 (kFp32) or whose exponent byte is 0 or 255 (kUe8m0: 2^-127
// is not a normal float and 255 is NaN), naming it as `name`[matrix][row][col] with its value.
std::vector<float> to_padded_block_scales(const void* scales, ScaleFormat format, int matrices, int rows, int k,
                                            const std::string& name);

// What every FP8 layer does with the caller's scales at creation: reads `count` of them from the device
// (a synchronous copy) and checks them through to_padded_block_scales (`matrices` x `rows` x
// ceil(k/128), named `name`; its error prefixed with `prefix`, e.g. "rank 0: MoeLayer::create: ").
struct CheckedScales {
  std::vector<uint8_t> raw;    // as the caller holds them (float or UE8M0 bytes)
  std::vector<float> blocked;  // the padded block layout (block_scales.h)
};
CheckedScales read_block_scales(const void* device_scales, int64_t count, ScaleFormat format, int matrices, int rows,
                                int k, const std::string& name, const std::string& prefix);

}  // namespace epfuse::weights
