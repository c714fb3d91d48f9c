// The three ceilings the floors are computed from, measured on this run's GPUs (collective: every
// rank measures its own GPU; the result is the median over GPUs of each GPU's median):
//   GEMM    bf16 8192^3 with cuBLAS (cublasGemmEx, fp32 accumulation), random operands;
//   HBM     a 1 GiB device-to-device copy, counting bytes read + bytes written;
//   NVLink  SM-driven 16-byte stores into every peer's symmetric window through LSA pointers, one
//           CTA per SM (the push mode of shared/probes/nccl_lsa.cu), remote bytes per GPU; checked
//           byte-exact after timing. 0 with one rank (nothing remote).
#pragma once
#include <cuda_runtime.h>

#include "bench/floor.h"
#include "epfuse/communicator.h"
#include "epfuse/types.h"

namespace epfuse::bench {

Ceilings measure_ceilings(Communicator& comm, cudaStream_t stream);

// Fills n bf16 values with uniform [-1, 1) numbers from `seed` (never zeros: timing on zeros flatters).
void fill_random(bf16* data, size_t n, uint64_t seed, cudaStream_t stream);

}  // namespace epfuse::bench
