// Kernels of the FP8 unfused chain (weight_format = kFp8Block128), between the bf16 chain's permute
// and combine (kernels.h). Both quantise 1x128 groups with common/fp8.h (the arithmetic the float64
// reference uses, so x's codes and scales are the reference's exactly) and write the scales where
// cuBLASLt's VEC128_32F reads them: each expert's rows in a region of their own (fp8_layout.h).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "epfuse/config.h"
#include "epfuse/types.h"

namespace epfuse::unfused {

// Where each local expert's rows and activation scales are, uploaded per forward (device arrays).
struct Fp8RowMap {
  const int32_t* expert_first = nullptr;    // [E_local + 1]: first row of each expert; [E_local] = rows
  const int64_t* scale_start_h = nullptr;   // [E_local]: first float of each expert's scales for K = H
  const int64_t* scale_start_i = nullptr;   // [E_local]: the same for K = I
  int experts = 0;
};

// rows [num_rows, hidden] bf16 (permuted tokens) -> codes [num_rows, hidden] and 1x128 scales (K = H).
void launch_quantize_rows(const bf16* rows, int64_t num_rows, int hidden, ScaleFormat format, Fp8RowMap map,
                          uint8_t* codes, float* scales, int sm_count, cudaStream_t stream);

// Linear1's output inter [num_rows, 2I] (fp32, or bf16 when inter_fp32 is false) -> h = weight *
// silu(gate) * up in fp32 (clamped when clamp > 0, as the bf16 chain's launch_swiglu), quantised: codes
// [num_rows, I] and 1x128 scales (K = I).
void launch_swiglu_quantize(const void* inter, bool inter_fp32, const float* row_weight, int64_t num_rows,
                            int intermediate, float clamp, ScaleFormat format, Fp8RowMap map, uint8_t* codes,
                            float* scales, int sm_count, cudaStream_t stream);

}  // namespace epfuse::unfused
