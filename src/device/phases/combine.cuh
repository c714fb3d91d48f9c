// Combine at home: for each of this rank's tokens, wait until every output tile of its
// routed slots has arrived (monotonic counter at home; base kept here), then reduce the k slots in fp32
// in slot order (deterministic) and store y in bf16. A token with no routed slot gets zeros.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/diagnostics/trace.cuh"
#include "device/kernel/context.cuh"
#include "device/kernel/wait.cuh"
#include "device/protocol/routing.h"

namespace epfuse::device {

// One warp reduces one token's routed slot rows (k rows of H bf16 at `rows`, slot j at rows + j * stride
// elements) into y_row, in slot order (deterministic). kVecs 16-byte vectors per lane and kSlots slots
// are loaded before the first add: with one load in flight per lane the warp waited one memory latency
// per slot and vector (0.4-0.6 ms of combine tail at T = 4096-16384, top-8); kVecs * kSlots = 16 loads
// in flight whatever k is.
// store = false: the same instructions, y not written (combine_task's warm-up pass, with routed = 0).
template <int kVecs, int kSlots>
__device__ __forceinline__ void reduce_token(const __nv_bfloat16* rows, size_t stride, int k, uint32_t routed, int H,
                                             __nv_bfloat16* y_row, int lane, bool store) {
  const int vectors = H / 8;
  for (int v0 = lane; v0 < vectors; v0 += 32 * kVecs) {
    float sum[kVecs][8] = {};
    for (int j0 = 0; j0 < k; j0 += kSlots) {
      int4 raw[kVecs][kSlots];
#pragma unroll
      for (int u = 0; u < kVecs; ++u)
#pragma unroll
        for (int b = 0; b < kSlots; ++b) {
          const int j = j0 + b, v = v0 + 32 * u;
          raw[u][b] = j < k && (routed >> j & 1u) && v < vectors
                          ? __ldcg(reinterpret_cast<const int4*>(rows + j * stride) + v)
                          : int4{0, 0, 0, 0};
        }
#pragma unroll
      for (int u = 0; u < kVecs; ++u)
#pragma unroll
        for (int b = 0; b < kSlots; ++b) {  // slot order within and across batches
          const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw[u][b]);
#pragma unroll
          for (int p = 0; p < 4; ++p) {
            const float2 f = __bfloat1622float2(pairs[p]);
            sum[u][2 * p] += f.x;
            sum[u][2 * p + 1] += f.y;
          }
        }
    }
#pragma unroll
    for (int u = 0; u < kVecs; ++u) {
      const int v = v0 + 32 * u;
      if (v >= vectors) break;
      int4 out;
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(&out);
#pragma unroll
      for (int p = 0; p < 4; ++p) o[p] = __floats2bfloat162_rn(sum[u][2 * p], sum[u][2 * p + 1]);
      if (store) reinterpret_cast<int4*>(y_row)[v] = out;
    }
  }
}

// Waits (lane 0 of the calling warp) until token t's output tiles are all in its combine slots: true
// when they are; the token's base then moves on (one warp per token calls this).
template <class Transport>
__device__ __forceinline__ bool wait_token_tiles(const FusedContext<Transport>& c, int t, int lane, int warps) {
  const FusedParams& prm = *c.prm;
  const uint32_t expected = token_signal_target(prm.topk_idx + static_cast<int64_t>(t) * prm.dims.topk,
                                                prm.dims.topk, prm.dims.num_experts, prm.dims.hidden);
  int ok = 1;
  if (lane == 0 && expected != 0) {
    const uint64_t start = prm.profile != nullptr ? globaltimer_ns() : 0;
    const uint32_t base = c.token_base[t];
    const uint32_t* signal = local_ptr<uint32_t>(c, token_signal_offset(prm.sym, prm.capacity, c.parity, t));
    ok = bounded_wait(prm, c.ctl, c.site(Phase::kCombine, WaitKind::kTokenTiles, t), expected,
                      [&] { return peer_acquire(c, signal); },
                      [&](uint32_t v) { return counter_reached(v, base, expected); })
             ? 1 : 0;
    if (ok) c.token_base[t] = base + expected;
    // Warps wait side by side: each adds its share of the CTA's time.
    if (prm.profile != nullptr) profile_add_wait((globaltimer_ns() - start) / warps);
  }
  return __shfl_sync(0xffffffffu, ok, 0) != 0;
}

// One warp reduces columns [c0, c0 + cols) of token t's routed slots into y (reduce_token). warm: the
// same instructions with every slot load and the store predicated off. kRoutedGiven: the token's
// routed_slot_mask is `given`, read by the caller; otherwise read here, once per token rather than once
// per vector.
template <bool kRoutedGiven = false, class Transport>
__device__ __forceinline__ void reduce_token_columns(const FusedContext<Transport>& c, int t, int c0, int cols, int lane,
                                                     bool warm = false, uint32_t given = 0) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int k = d.topk;
  uint32_t routed = given;
  if constexpr (!kRoutedGiven) routed = routed_slot_mask(prm.topk_idx + static_cast<int64_t>(t) * k, k, d.num_experts);
  if (warm) routed = 0;
  const __nv_bfloat16* rows = local_ptr<const __nv_bfloat16>(c, combine_row_offset(prm.sym, prm.capacity, c.parity, t, 0)) + c0;
  // A token's slot rows are consecutive, each the workspace's widest row (combine_row_offset).
  const size_t stride = static_cast<size_t>(prm.capacity.hidden);
  __nv_bfloat16* y_row = prm.y + static_cast<int64_t>(t) * d.hidden + c0;
  if (k <= 2) {
    reduce_token<8, 2>(rows, stride, k, routed, cols, y_row, lane, !warm);
  } else if (k <= 4) {
    reduce_token<4, 4>(rows, stride, k, routed, cols, y_row, lane, !warm);
  } else {
    reduce_token<2, 8>(rows, stride, k, routed, cols, y_row, lane, !warm);
  }
}

// Task: tokens [b * space.combine_tokens, ...), one warp of g per token. A task of fewer tokens than half of
// g's warps (decode: T = 1 has one) shares each token's columns out to several warps, after one warp per
// token has waited for its tiles: a warp alone is bound by the latency of its loads (one token's 8 slots
// of 2048 columns took ~6 us after the last Linear2 tile; docs/performance.md#decode-fixed-cost).
// kWarm (the kernels the host runs at decode sizes): such a task runs as two passes of one loop; in the
// first, while the tokens' warps wait, the other warps run the reduction's code once with nothing loaded
// or stored, so that its instructions are on the SM before the pass that counts
// (docs/performance.md#the-decode-combines-code-before-its-tiles-2026-11-29). Only there: the loop moved
// the register allocation of the prefill kernels (a spill in the FP8 k-loop).
template <bool kWarm, class Transport>
__device__ void combine_task(const FusedContext<Transport>& c, int block, const TaskSpace& space,
                             const ThreadGroup& g = ThreadGroup::cta()) {
  const FusedParams& prm = *c.prm;
  const int H = prm.dims.hidden;
  const int warp = g.warp(), lane = g.rank() % 32;
  const int first = block * space.combine_tokens, tokens = min(prm.num_tokens, first + space.combine_tokens) - first;
  const int parts = tokens > 0 ? g.warps() / tokens : 1;  // warps per token
  if (parts < 2) {
    for (int t = first + warp; t < first + tokens; t += g.warps())
      if (wait_token_tiles(c, t, lane, g.warps())) reduce_token_columns(c, t, 0, H, lane);
    return;
  }
  __shared__ int token_in[kCombineTokens];
  // kWarm: each warp's token's routing is read before the wait, so that the reduction after it starts
  // with the slot loads, not with a dependent round trip for the routing
  // (docs/performance.md#the-decode-combines-routing-before-its-wait-2026-11-29).
  [[maybe_unused]] uint32_t routed = 0;
  if constexpr (kWarm)
    if (warp < tokens * parts)
      routed = routed_slot_mask(prm.topk_idx + static_cast<int64_t>(first + warp / parts) * prm.dims.topk,
                                prm.dims.topk, prm.dims.num_experts);
  // warm: the warm-up pass, by the warps that do not wait (their own columns, as the real pass takes them).
  const auto run_pass = [&](bool warm) {
    if (!warm) {
      if (warp < tokens) {
        const bool ok = wait_token_tiles(c, first + warp, lane, g.warps());
        if (lane == 0) token_in[warp] = ok ? 1 : 0;
      }
      g.sync();  // token_in is read below, and the tiles of every token are in
      trace::stamp_current(g.leader(), trace::kFirstFull);
    }
    if (warp < tokens * parts) {
      const int i = warp / parts, part = warp % parts;
      // Each part a whole number of 8-column vectors.
      const int span = (H / 8 + parts - 1) / parts * 8, c0 = part * span;
      if ((warm ? warp >= tokens : token_in[i] != 0) && c0 < H)
        if constexpr (kWarm) reduce_token_columns<true>(c, first + i, c0, min(span, H - c0), lane, warm, routed);
        else reduce_token_columns(c, first + i, c0, min(span, H - c0), lane, warm);
    }
  };
  if constexpr (kWarm) {
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) run_pass(pass == 0);  // one copy of the code for both passes
  } else {
    run_pass(false);
  }
  g.sync();  // token_in is free for the next task
  trace::stamp_current(g.leader(), trace::kLoopEnd);
}

}  // namespace epfuse::device
