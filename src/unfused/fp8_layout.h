// The FP8 unfused chain's scale layouts: what cuBLASLt's block-scaled FP8 GEMMs on sm_90 read, and the
// arithmetic that puts the layer's scales there. Host and device (the quantise kernels index with it),
// unit-tested on the CPU (tests/cpu/unfused).
//
// cuBLASLt, "TN" FP8 GEMM with both operands K-major (weights [n, k], activations [rows, k]):
//  - weights, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: one float per 128x128 block, the k-blocks
//    of a 128-row block contiguous and padded to a multiple of 4 (16 bytes): element (nb, kb) at
//    nb * padded_k_blocks(k) + kb, [ceil(n/128), padded_k_blocks(k)]. The checkpoint layout
//    ([ceil(n/128), ceil(k/128)], config.h) differs only by that padding, so the layer copies each
//    scale row into a padded one at creation (padding 1.0f, never read for a real element).
//  - activations, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: one float per token per 128 channels,
//    token index fastest: element (row, kb) at kb * rows + row, [ceil(k/128), rows] for the GEMM's
//    `rows` tokens. One GEMM per expert, so each expert's rows have a region of their own, starting
//    16-byte aligned (act_scale_region rounds each region up to 4 floats).
// Sources: the cuBLAS documentation ("Scaling factors layouts"), as PyTorch's _scaled_mm checks it
// (pytorch/pytorch#166752: 128x128 scales [L4, M/128] stride [1, L4] with L4 = round_up(K/128, 4);
// 1x128 scales [M, K/128] stride [1, M]).
#pragma once
#include <cstdint>

#include "common/fp8.h"
#include "common/host_device.h"

namespace epfuse::unfused::fp8_layout {

// k-blocks of a block row of a BLK128x128 scale tensor as cuBLASLt reads it.
EPFUSE_HD int padded_k_blocks(int k) { return (fp8::num_blocks(k) + 3) / 4 * 4; }

// Floats of one expert's weight scales in the cuBLASLt layout, n x k weights.
EPFUSE_HD int64_t weight_scale_floats(int n, int k) {
  return static_cast<int64_t>(fp8::num_blocks(n)) * padded_k_blocks(k);
}

// Floats reserved for one expert's activation scales ([ceil(k/128), rows]), rounded up to 4 so the next
// expert's region starts 16-byte aligned.
EPFUSE_HD int64_t act_scale_region(int rows, int k) {
  return (static_cast<int64_t>(rows) * fp8::num_blocks(k) + 3) / 4 * 4;
}

// Element (local_row, kb) of an expert's VEC128 scales with `rows` rows, from its region start.
EPFUSE_HD int64_t act_scale_offset(int64_t region_start, int rows, int local_row, int kb) {
  return region_start + static_cast<int64_t>(kb) * rows + local_row;
}

}  // namespace epfuse::unfused::fp8_layout
