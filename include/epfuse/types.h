// epfuse/types.h: tensors as device pointers with shapes; no framework dependency.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>

namespace epfuse {

using bf16 = __nv_bfloat16;

// One rank's tokens for one forward call. All pointers are device pointers owned by the caller.
struct TokenBatch {
  const bf16* x = nullptr;              // [num_tokens, hidden]
  const int32_t* topk_idx = nullptr;    // [num_tokens, topk] global expert ids; -1 = dropped slot
  const float* topk_weights = nullptr;  // [num_tokens, topk]
  int num_tokens = 0;                   // 0 allowed; at most LayerConfig::max_tokens_per_rank
};

// This rank's experts (E/R of them), device pointers owned by the caller.
struct ExpertWeights {
  const bf16* w13 = nullptr;  // [E/R, 2I, H]: rows [0, I) are the gate (W1), rows [I, 2I) the up (W3)
  const bf16* w2 = nullptr;   // [E/R, H, I]: the down projection
};

}  // namespace epfuse
