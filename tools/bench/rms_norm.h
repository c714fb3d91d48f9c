// The RMS-normalisation between the layers of the decode step (bench/decode_step.h): x = y / sqrt(mean(y^2)
// + eps) per row of H bf16 values, in fp32, rounded to bf16. A model's norm also scales by a learned
// vector; the step leaves it out (1 everywhere), as it changes neither the work nor the check.
#pragma once
#include <cuda_runtime.h>

#include "epfuse/types.h"

namespace epfuse::bench {

// x[rows, H] from y[rows, H] on `stream` (rows = 0: nothing is launched). H a multiple of 8, both
// 16-byte aligned and not overlapping. Checks the launch.
void rms_norm(const bf16* y, bf16* x, int rows, int H, float eps, cudaStream_t stream);

}  // namespace epfuse::bench
