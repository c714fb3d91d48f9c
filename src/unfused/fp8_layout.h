// The FP8 unfused chain's scale layouts: what cuBLASLt's block-scaled FP8 GEMMs on sm_90 read, and the
// arithmetic that puts the layer's scales there. Host and device (the quantise kernels index with it),
// unit-tested on the CPU (tests/cpu/unfused).
//
// cuBLASLt, "TN" FP8 GEMM with both operands K-major (weights [n, k], activations [rows, k]):
//  - weights, CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: the padded block layout both layers read
//    (weights/block_scales.h: padded_k_blocks, weight_scale_floats; brought into this namespace below).
//  - activations, CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: one float per token per 128 channels,
//    token index fastest: element (row, kb) at kb * rows + row, [ceil(k/128), rows] for the GEMM's
//    `rows` tokens (its n; the leading dimension of the scales is that n). One GEMM per expert, so
//    each expert's rows have a region of their own.
// Row padding: cuBLASLt 13.0 on an H200 has no algorithm (CUBLAS_STATUS_NOT_SUPPORTED) for these GEMMs
// when the token count is not a multiple of 16, so every expert's GEMM runs on its row count rounded
// up to kFp8GemmRowAlign (padded_rows). Each expert's token rows (codes, GEMM outputs) then start at
// padded_first, the sum of the padded counts of the experts before it, and its scale region is
// [ceil(k/128), padded_rows] from act_scale_start (16 rows x any k-block count: 64-byte aligned).
// The padded rows' codes are zeros with finite scales (their outputs are zeros), and nothing reads
// their outputs. Buffers hold padded_row_capacity rows.
// Sources: the cuBLAS documentation ("Scaling factors layouts"), as PyTorch's _scaled_mm checks it
// (pytorch/pytorch#166752: 128x128 scales [L4, M/128] stride [1, L4] with L4 = round_up(K/128, 4);
// 1x128 scales [M, K/128] stride [1, M]).
#pragma once
#include <cstdint>

#include "common/fp8.h"
#include "common/host_device.h"
#include "weights/block_scales.h"

namespace epfuse::unfused::fp8_layout {

// The weights' padded block layout (weights/block_scales.h), as cuBLASLt's BLK128x128_32F reads it.
using ::epfuse::weights::padded_k_blocks;
using ::epfuse::weights::weight_scale_floats;

// The token-count multiple of every FP8 GEMM. Measured on cuBLASLt 13.0 / H200 (bf16 and fp32 output,
// m = 384/768/1536, k = 256/2048): n = 16, 128, 256 ran; n = 1, 2, 7, 19, 26, 27, 31, 41, 93, 955
// returned CUBLAS_STATUS_NOT_SUPPORTED (no algorithm from the heuristic).
inline constexpr int kFp8GemmRowAlign = 16;

// An expert's GEMM row count: `rows` rounded up to kFp8GemmRowAlign (0 stays 0: no GEMM).
EPFUSE_HD int padded_rows(int rows) { return (rows + kFp8GemmRowAlign - 1) / kFp8GemmRowAlign * kFp8GemmRowAlign; }

// Rows a padded buffer needs for at most `max_rows` rows over `experts` experts: each non-empty expert
// adds at most kFp8GemmRowAlign - 1 rows, and at most min(experts, max_rows) experts are non-empty.
EPFUSE_HD int64_t padded_row_capacity(int64_t max_rows, int experts) {
  const int64_t nonempty = max_rows < experts ? max_rows : experts;
  return max_rows + nonempty * (kFp8GemmRowAlign - 1);
}

// First float of an expert's activation scales for K = k, its first padded row being padded_first
// (regions packed in expert order, each [ceil(k/128), padded_rows]).
EPFUSE_HD int64_t act_scale_start(int64_t padded_first, int k) { return padded_first * fp8::num_blocks(k); }

// Floats of one expert's activation scales ([ceil(k/128), padded_rows(rows)]).
EPFUSE_HD int64_t act_scale_region(int rows, int k) {
  return static_cast<int64_t>(padded_rows(rows)) * fp8::num_blocks(k);
}

// Element (local_row, kb) of an expert's VEC128 scales from its region start; `gemm_rows` is the
// GEMM's row count (the padded one), the scales' leading dimension.
EPFUSE_HD int64_t act_scale_offset(int64_t region_start, int gemm_rows, int local_row, int kb) {
  return region_start + static_cast<int64_t>(kb) * gemm_rows + local_row;
}

// --- the per-forward row map: expert e's real rows are [expert_first[e], expert_first[e+1]) of the
// permuted rows, its GEMM rows [padded_first[e], padded_first[e+1]) of the padded layout (arrays of
// experts + 1 entries, first[0] = 0).

// Fills expert_first and padded_first from the experts' real row counts.
EPFUSE_HD void fill_row_map(const int* rows, int experts, int32_t* expert_first, int32_t* padded_first) {
  int32_t first = 0, padded = 0;
  for (int e = 0; e < experts; ++e) {
    expert_first[e] = first;
    padded_first[e] = padded;
    first += rows[e];
    padded += padded_rows(rows[e]);
  }
  expert_first[experts] = first;
  padded_first[experts] = padded;
}

// The expert whose rows hold `row`, 0 <= row < first[experts]: the last e with first[e] <= row (binary
// search; experts with no rows share their first row with the next one, which the search skips).
EPFUSE_HD int expert_of_row(const int32_t* first, int experts, int64_t row) {
  int lo = 0, hi = experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first[mid] <= row)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Row p of the padded layout, 0 <= p < padded_first[experts]: its expert, its row within the expert's
// GEMM, that GEMM's row count (padded), and its permuted (real) row, or -1 for a padding row.
struct PaddedRow {
  int expert = 0, local = 0, gemm_rows = 0;
  int64_t real = -1;
};
EPFUSE_HD PaddedRow padded_row(const int32_t* expert_first, const int32_t* padded_first, int experts, int64_t p) {
  PaddedRow r;
  r.expert = expert_of_row(padded_first, experts, p);
  r.local = static_cast<int>(p - padded_first[r.expert]);
  r.gemm_rows = padded_first[r.expert + 1] - padded_first[r.expert];
  const int real_rows = expert_first[r.expert + 1] - expert_first[r.expert];
  r.real = r.local < real_rows ? int64_t{expert_first[r.expert]} + r.local : -1;
  return r;
}

// The padded row of permuted (real) row `real`, 0 <= real < expert_first[experts].
EPFUSE_HD int64_t padded_row_of(const int32_t* expert_first, const int32_t* padded_first, int experts, int64_t real) {
  const int e = expert_of_row(expert_first, experts, real);
  return real - expert_first[e] + padded_first[e];
}

}  // namespace epfuse::unfused::fp8_layout
