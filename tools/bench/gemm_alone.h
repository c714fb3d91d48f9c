// The expert GEMMs of the unfused chain alone: the same cuBLAS grouped call (src/unfused/
// grouped_gemm.h) for W13 (N = 2I, K = H) and W2 (N = H, K = I) over this rank's experts, with the
// per-expert row counts the routing gives, on random operands. The layer's expert phase should
// reach this rate.
#pragma once
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "epfuse/config.h"
#include "epfuse/types.h"

namespace epfuse::bench {

// Milliseconds of each of `iters` timed calls (W13 then W2), after `warmup` untimed ones.
// rows: [E/R] rows per local expert.
std::vector<double> time_grouped_gemms(const LayerConfig& cfg, const ExpertWeights& weights,
                                       std::span<const int> rows, int warmup, int iters, cudaStream_t stream);

}  // namespace epfuse::bench
