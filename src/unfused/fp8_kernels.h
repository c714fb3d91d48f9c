// Kernels of the FP8 unfused chain (weight_format = kFp8Block128), between the bf16 chain's permute
// and combine (kernels.h). Both quantise 1x128 groups with common/fp8.h (the arithmetic the float64
// reference uses, so x's codes and scales are the reference's exactly) and write the scales where
// cuBLASLt's VEC128_32F reads them: each expert's rows in a region of their own (fp8_layout.h).
// The FP8 GEMMs run on each expert's rows padded to a multiple of 16 (fp8_layout.h), so their inputs
// and outputs are in the padded layout: expert e's rows at padded_first[e] .. padded_first[e+1] - 1,
// the first expert_first[e+1] - expert_first[e] of them its real rows, in the permuted order. The
// quantise kernels cover every padded row, writing zero codes with scale group_scale(0) (finite) to
// the rows past an expert's real ones, and never read those rows' inputs.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "epfuse/config.h"
#include "epfuse/types.h"

namespace epfuse::unfused {

// Where each local expert's rows are, uploaded per forward (device arrays).
struct Fp8RowMap {
  const int32_t* expert_first = nullptr;  // [E_local + 1]: first permuted (real) row of each expert; [E_local] = rows
  const int32_t* padded_first = nullptr;  // [E_local + 1]: first padded row of each expert; [E_local] = padded rows
  int experts = 0;
};

// rows [real rows, hidden] bf16 (permuted tokens, real layout) -> codes [padded_rows, hidden] and 1x128
// scales (K = H), padded layout; padded_rows = map.padded_first[E_local].
void launch_quantize_rows(const bf16* rows, int64_t padded_rows, int hidden, ScaleFormat format, Fp8RowMap map,
                          uint8_t* codes, float* scales, int sm_count, cudaStream_t stream);

// Linear1's output inter [padded_rows, 2I] (padded layout; fp32, or bf16 when inter_fp32 is false) and
// row_weight (real layout) -> h = weight * silu(gate) * up in fp32 (clamped when clamp > 0, as the bf16
// chain's launch_swiglu), quantised: codes [padded_rows, I] and 1x128 scales (K = I), padded layout.
void launch_swiglu_quantize(const void* inter, bool inter_fp32, const float* row_weight, int64_t padded_rows,
                            int intermediate, float clamp, ScaleFormat format, Fp8RowMap map, uint8_t* codes,
                            float* scales, int sm_count, cudaStream_t stream);

// In place on the permute's token_rows ([count], real rows or -1): each real row -> its padded row, so
// the combine's pre-reduce reads Linear2's output (padded layout) at the real rows' places only.
void launch_pad_token_rows(int32_t* token_rows, int64_t count, Fp8RowMap map, int sm_count, cudaStream_t stream);

}  // namespace epfuse::unfused
