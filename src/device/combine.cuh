// Combine at home (issue item 4): for each of this rank's tokens, wait until every output tile of its
// routed slots has arrived (monotonic counter at home; base kept here), then reduce the k slots in fp32
// in slot order (deterministic) and store y in bf16. A token with no routed slot gets zeros.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/context.cuh"
#include "device/errors.cuh"
#include "device/routing.h"

namespace epfuse::device {

inline constexpr int kCombineBatch = 8;  // slot rows loaded at once per vector (top-k <= 8 in one batch)

// Task: tokens [b * kCombineTokens, ...), one warp per token.
__device__ void combine_task(const FusedContext& c, int block) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int k = d.topk, H = d.hidden;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int t = block * kCombineTokens + warp; t < min(prm.num_tokens, (block + 1) * kCombineTokens);
       t += blockDim.x / 32) {
    const int32_t* idx = prm.topk_idx + static_cast<int64_t>(t) * k;
    const uint32_t expected = token_signal_target(idx, k, d.num_experts, H);
    int ok = 1;
    if (lane == 0 && expected != 0) {
      const uint64_t start = prm.profile != nullptr ? globaltimer_ns() : 0;
      const uint32_t base = c.token_base[t];
      const uint32_t* signal = c.local<uint32_t>(token_signal_offset(prm.sym, d, c.parity, t));
      ok = bounded_wait(prm, c.ctl, c.site(Phase::kCombine, WaitKind::kTokenTiles, t), expected,
                        [&] { return ld_acquire_sys(signal); },
                        [&](uint32_t v) { return counter_reached(v, base, expected); })
               ? 1 : 0;
      if (ok) c.token_base[t] = base + expected;
      // Warps wait side by side: each adds its share of the CTA's time.
      if (prm.profile != nullptr) profile_add_wait((globaltimer_ns() - start) / (blockDim.x / 32));
    }
    ok = __shfl_sync(0xffffffffu, ok, 0);
    if (!ok) continue;
    // Routed slots as a mask, read once per token rather than once per vector.
    uint32_t routed = 0;
    for (int j = 0; j < k; ++j) routed |= slot_is_routed(idx[j], d.num_experts) ? 1u << j : 0u;
    for (int v = lane; v < H / 8; v += 32) {
      float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      // kCombineBatch slot loads in flight before the first add: one at a time, the warp waited one
      // memory latency per slot and vector (0.5-0.6 ms of combine tail at T = 4096-16384, top-8).
      for (int j0 = 0; j0 < k; j0 += kCombineBatch) {
        int4 raw[kCombineBatch];
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {
          const int j = j0 + b;
          raw[b] = j < k && (routed >> j & 1u)
                       ? __ldcg(c.local<int4>(combine_row_offset(prm.sym, d, c.parity, t, j)) + v)
                       : int4{0, 0, 0, 0};
        }
#pragma unroll
        for (int b = 0; b < kCombineBatch; ++b) {  // slot order, as before: deterministic
          const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[b]);
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const float2 f = __bfloat1622float2(pairs[p]);
            sum[2 * p] += f.x;
            sum[2 * p + 1] += f.y;
          }
        }
      }
      int4 out;
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
      for (int p = 0; p < 4; ++p) o[p] = __floats2bfloat162_rn(sum[2 * p], sum[2 * p + 1]);
      reinterpret_cast<int4*>(prm.y + static_cast<int64_t>(t) * H)[v] = out;
    }
  }
}

}  // namespace epfuse::device
