// The FP8 weights' block-scale layout that both implementations read (LayerConfig::weight_format =
// kFp8Block128): one float per 128x128 block of a weight matrix [n, k], the k-blocks of a 128-row block
// contiguous and padded to a multiple of 4 (16 bytes): element (nb, kb) at nb * padded_k_blocks(k) + kb,
// [ceil(n/128), padded_k_blocks(k)]. This is cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F (the
// unfused chain, unfused/fp8_layout.h) and what the fused kernel reads with 16-byte loads. The checkpoint
// layout ([ceil(n/128), ceil(k/128)], config.h) differs only by that padding, so the layers copy each
// scale row into a padded one at creation (padding 1.0f, never read for a real element; fp8_weights.h).
// Host and device, unit-tested on the CPU (tests/cpu/weights).
#pragma once
#include <cstdint>

#include "common/fp8.h"
#include "common/host_device.h"

namespace epfuse::weights {

// k-blocks of a block row of a padded block-scale tensor.
EPFUSE_HD int padded_k_blocks(int k) { return (fp8::num_blocks(k) + 3) / 4 * 4; }

// Floats of one expert's weight scales in the padded layout, n x k weights.
EPFUSE_HD int64_t weight_scale_floats(int n, int k) {
  return static_cast<int64_t>(fp8::num_blocks(n)) * padded_k_blocks(k);
}

}  // namespace epfuse::weights
