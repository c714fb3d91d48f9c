// The expert GEMMs of the unfused chain alone: the same calls (src/unfused/grouped_gemm.h) for W13
// (N = 2I, K = H) and W2 (N = H, K = I) over this rank's experts, with the per-expert row counts the
// routing gives, on random operands. Both paths are timed (gemm_path.h), and the one the layer would
// pick for these rows is named, so the table's "GEMM alone" is exactly what the layer runs and the
// JSON shows which path is faster per shape. The layer's expert phase should reach this rate.
#pragma once
#include <span>
#include <vector>

#include <cuda_runtime.h>

#include "epfuse/config.h"
#include "epfuse/types.h"
#include "unfused/gemm_path.h"

namespace epfuse::bench {

struct GemmAloneTimes {
  unfused::GemmPath layer_path = unfused::GemmPath::kGrouped;  // EPFUSE_UNFUSED_GEMM or the heuristic
  std::vector<double> grouped_ms, loop_ms;  // per timed call, W13 then W2

  const std::vector<double>& layer_ms() const {
    return layer_path == unfused::GemmPath::kLoop ? loop_ms : grouped_ms;
  }
};

// Milliseconds of each of `iters` timed calls per path, after `warmup` untimed ones.
// rows: [E/R] rows per local expert.
GemmAloneTimes time_expert_gemms(const LayerConfig& cfg, const ExpertWeights& weights, std::span<const int> rows,
                                 int warmup, int iters, cudaStream_t stream);

}  // namespace epfuse::bench
