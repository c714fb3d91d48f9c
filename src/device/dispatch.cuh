// Dispatch over NVLink (issue item 2), in expert order: task i of group g sends rows
// [i * kDispatchRows, ...) of the rows this rank owns for local expert g at every receiver (a row is
// owned by the token's smallest expert there, routing.h). For each row, one warp pushes it once with
// 16-byte stores through the receiver's LSA pointer and writes one RowEntry for every pair of the token
// at that receiver (the owner's and the larger experts' that share the row). After the task's stores,
// one release add per (receiver, local expert) counts the pairs that arrived. Because a row and all
// its entries go out together, an arrival never counts a row another CTA is still writing, and
// expert g is complete once every rank's groups 0..g are done (task_map.h). A row for this rank itself
// is not copied: its entries point at x.
#pragma once
#include <cstdint>

#include "device/context.cuh"
#include "device/errors.cuh"
#include "device/ptx.cuh"
#include "device/routing.h"

namespace epfuse::device {

// Task: dispatch task `index` (over all groups; the plan's dispatch_start). smem: 2 * E u32. Runs
// after the plan, hence after this rank's layout: tickets and dispatch_order are totals.
__device__ void dispatch_task(const FusedContext& c, int index, void* smem) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int k = d.topk, E = d.num_experts, L = c.local_experts, H = d.hidden;
  const int g = segment_of(c.plan.dispatch_start, L, index);
  const int p0 = (index - c.plan.dispatch_start[g]) * kDispatchRows;
  const int p1 = min(p0 + kDispatchRows, group_rows(c.owner_tickets, d.world, L, g));
  int* entry_base = static_cast<int*>(smem);                     // [E]: my first entry per expert
  uint32_t* sent = reinterpret_cast<uint32_t*>(entry_base + E);  // [E]: pairs this task sends
  for (int dst = threadIdx.x; dst < d.world; dst += blockDim.x)
    exclusive_prefix(c.pair_tickets + dst * L, L, entry_base + dst * L);
  for (int e = threadIdx.x; e < E; e += blockDim.x) sent[e] = 0;
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  for (int p = p0 + warp; p < p1; p += warps) {
    const OwnedRow own = owned_row(c.owner_tickets, d.world, L, g, p);
    const int dst = own.receiver, owner_expert = dst * L + g;
    const int t = c.dispatch_order[static_cast<int64_t>(owner_expert) * d.max_tokens + own.index];
    const int32_t* idx = prm.topk_idx + static_cast<int64_t>(t) * k;
    // The row slot at dst is the same for all the token's pairs there (layout copied the owner's).
    int row = -1;
    for (int j = 0; j < k; ++j)
      if (idx[j] == owner_expert) {
        row = c.pair_row[static_cast<int64_t>(t) * k + j];
        break;
      }
    if (dst != prm.rank) {
      const int4* src_row = reinterpret_cast<const int4*>(prm.x + static_cast<int64_t>(t) * H);
      int4* dst_row = c.peer<int4>(dst, recv_row_offset(prm.sym, d, c.parity, dst, prm.rank, row));
      for (int v = lane; v < H / 8; v += 32) dst_row[v] = ptx::ld_nc_na_v4(src_row + v);
    }
    // Entries: one 16-byte store per routed pair of the token at dst.
    for (int j = lane; j < k; j += 32) {
      const int32_t e = idx[j];
      if (!slot_is_routed(e, E) || expert_rank(e, L) != dst) continue;
      const int64_t at = static_cast<int64_t>(t) * k + j;
      const RowEntry entry{dst == prm.rank ? t : row, t, j, prm.topk_weights[at]};
      const int64_t slot = entry_base[e] + c.pair_index[at];
      *c.peer<int4>(dst, recv_entry_offset(prm.sym, d, c.parity, prm.rank, slot)) = *reinterpret_cast<const int4*>(&entry);
      atomicAdd(&sent[e], 1u);
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const uint32_t n = sent[e];
    if (n != 0)
      red_add_release_sys(c.peer<uint32_t>(expert_rank(e, L), arrival_offset(prm.sym, d, c.parity, expert_local(e, L))), n);
  }
}

}  // namespace epfuse::device
