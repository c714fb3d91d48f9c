// Dispatch over NVLink: each token row is pushed once per receiver rank (16-byte stores
// through the receiver's LSA pointer), with one RowEntry per (token, local expert) pair; after the
// block's stores, one release add per (receiver, local expert) counts the pairs that arrived. A row
// for this rank itself is not copied: its entries point at x.
#pragma once
#include <cstdint>

#include "device/diagnostics/trace.cuh"
#include "device/gemm/fp8_quantize.cuh"
#include "device/kernel/context.cuh"
#include "device/kernel/wait.cuh"
#include "device/phases/layout.cuh"
#include "device/protocol/routing.h"
#include "device/ptx/ptx.cuh"

namespace epfuse::device {

// Task: dispatch tokens [b * space.dispatch_tokens, ...). smem: 2 * E u32.
// kFp8 (weight_format fp8-block128): each row is quantised on the way (one warp per row,
// warp_quantize_row), or copied as the caller quantised it (TokenBatch::x_fp8, warp_copy_fp8_row), and
// sent as an FP8 x row (regions.h: codes, then scales); this
// rank's own rows are quantised into the private fp8_x region (row = token), which its Linear1 tiles
// read instead of x. The entries and arrival adds are the bf16 ones, so the release add that follows
// the block's stores also publishes the fp8_x rows to this GPU's other CTAs.
// kOwnRowsFirst (the decode kernels, FP8): this rank's own rows are quantised before the wait for the
// layout, which they do not need (their place is the token's fp8_x row), and the rest after it; every row
// by warp_quantize_row_compact, whose registers suit the decode kernel (fp8_quantize.cuh).
template <bool kFp8 = false, bool kOwnRowsFirst = false, class Transport>
__device__ void dispatch_task(const FusedContext<Transport>& c, int block, const TaskSpace& space, void* smem) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int k = d.topk, E = d.num_experts, L = c.local_experts, H = d.hidden;
  constexpr bool kSplit = kFp8 && kOwnRowsFirst;
  // EPFUSE_FAULT at=dispatch: this task's rows, entries and arrival adds never go out; the receivers'
  // Linear1 tiles wait for them.
  if (hang_here(prm, c.ctl, ThreadGroup::cta(), HangPoint::kDispatch)) return;
  int* entry_base = static_cast<int*>(smem);                            // [E]: my first entry per expert
  uint32_t* sent = reinterpret_cast<uint32_t*>(entry_base + E);         // [E]: pairs this block sends
  const int t0 = block * space.dispatch_tokens;
  const int tokens = min(space.dispatch_tokens, prm.num_tokens - t0), pairs = tokens * k;
  // Two passes when kSplit (this rank's own rows, the wait, the other ranks' rows), else the wait and
  // one pass over all rows; the rows' code once either way (a second copy costs the decode kernel spills).
#pragma unroll 1
  for (int pass = kSplit ? 0 : 1; pass < 2; ++pass) {
    if (pass == 1) {
      if constexpr (kSplit && trace::kOn) {
        __syncthreads();  // every warp's own rows written (the stamp's meaning)
        trace::stamp_current(threadIdx.x == 0, trace::kPosted);
      }
      if (!wait_layout_done(c, Phase::kDispatch, space.layout, /*abortable=*/true)) return;
      trace::stamp_current(threadIdx.x == 0, trace::kInputs);
      for (int dst = threadIdx.x; dst < d.world; dst += blockDim.x)
        exclusive_prefix(c.pair_tickets + dst * L, L, entry_base + dst * L);
      for (int e = threadIdx.x; e < E; e += blockDim.x) sent[e] = 0;
      __syncthreads();
    }
    // Which rows this pass sends: all, or (kSplit) this rank's own in pass 0 and the others in pass 1.
    // At world 1 (lone) every row is this rank's own and its place is the token's: each token's row is
    // quantised with no routing load (a token with no routed slot for nothing), bf16 sends none
    // (task_map.h dispatch_row_items).
    const bool all = !kSplit, own = pass == 0, lone = d.world == 1;
    // Rows: one warp per (token, owning slot) of a remote receiver and column chunk (dispatch_row_chunks:
    // several only in a task of few tokens), items in dispatch_item's order, a row's chunks on
    // consecutive warps.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    const int chunks = dispatch_row_chunks(tokens, H);
    const int items = dispatch_row_items(lone, kFp8, all || own, tokens, pairs, chunks);
    for (int q = warp; q < items; q += warps) {
      const DispatchItem item = dispatch_item(q / chunks, tokens);
      const int t = t0 + item.token, j = item.slot;
      const ColumnRange cols = dispatch_chunk(q % chunks, chunks, H);
      const int c0 = cols.first, n = cols.count;
      const int32_t* idx = prm.topk_idx + static_cast<int64_t>(t) * k;
      if (!lone && first_slot_for_rank(idx, j, E, L) != j) continue;
      const int dst = lone ? prm.rank : expert_rank(idx[j], L);
      if (!all && (dst == prm.rank) != own) continue;
      if constexpr (kFp8) {
        uint8_t* q = dst == prm.rank
                         ? reinterpret_cast<uint8_t*>(prm.workspace + prm.fp8.x_offset) + t * fp8_x_row_bytes(H)
                         : peer_ptr<uint8_t>(c, dst, recv_row_offset(prm.sym, prm.capacity, c.parity, dst, prm.rank,
                                                                     c.pair_row[static_cast<int64_t>(t) * k + j]));
        float* q_scales = reinterpret_cast<float*>(q + fp8_x_scale_offset(H)) + c0 / fp8::kBlock;
        if (prm.fp8.x_codes != nullptr)
          warp_copy_fp8_row(prm.fp8.x_codes + static_cast<int64_t>(t) * H + c0,
                            prm.fp8.x_scales + static_cast<int64_t>(t) * fp8::num_blocks(H) + c0 / fp8::kBlock, n,
                            q + c0, q_scales);
        else if constexpr (kOwnRowsFirst)
          warp_quantize_row_compact(prm.x + static_cast<int64_t>(t) * H + c0, n, q + c0, q_scales, prm.fp8.scale_format);
        else
          warp_quantize_row(prm.x + static_cast<int64_t>(t) * H + c0, n, q + c0, q_scales, prm.fp8.scale_format);
        continue;
      }
      if (dst == prm.rank) continue;
      const int4* src_row = reinterpret_cast<const int4*>(prm.x + static_cast<int64_t>(t) * H + c0);
      int4* dst_row = peer_ptr<int4>(c, dst, recv_row_offset(prm.sym, prm.capacity, c.parity, dst, prm.rank,
                                                      c.pair_row[static_cast<int64_t>(t) * k + j])) + c0 / 8;
      for (int v = lane; v < n / 8; v += 32) dst_row[v] = ptx::ld_nc_na_v4(src_row + v);
    }
  }
  if constexpr (trace::kOn) {
    __syncthreads();
    trace::stamp_current(threadIdx.x == 0, trace::kLoaded);
  }
  // Entries: one 16-byte store per routed pair.
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int t = t0 + q / k, j = q % k;
    const int64_t at = static_cast<int64_t>(t) * k + j;
    const int32_t e = prm.topk_idx[at];
    if (!slot_is_routed(e, E)) continue;
    const int dst = expert_rank(e, L);
    const RowEntry entry{dst == prm.rank ? t : c.pair_row[at], t, j, prm.topk_weights[at]};
    const int64_t slot = entry_base[e] + c.pair_index[at];
    *peer_ptr<int4>(c, dst, recv_entry_offset(prm.sym, prm.capacity, c.parity, prm.rank, slot)) = *reinterpret_cast<const int4*>(&entry);
    atomicAdd(&sent[e], 1u);
  }
  __syncthreads();
  trace::stamp_current(threadIdx.x == 0, trace::kEpiStored);
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const uint32_t n = sent[e];
    if (n != 0)
      peer_release_add(c, peer_ptr<uint32_t>(c, expert_rank(e, L), arrival_offset(prm.sym, prm.capacity, c.parity, expert_local(e, L))), n);
  }
}

}  // namespace epfuse::device
