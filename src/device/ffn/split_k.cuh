// Linear2's K split (task_map.h linear2_parts): the parts of one tile run as tasks of their own, each over its
// run of k-blocks, and meet here after their k-loops. Each part but the last to arrive leaves its fp32 sums in
// its slot of the private split region (regions.h split_k_bytes) and ends; the last (its own sums in its slot
// too) adds every part's in part order (the same bits whichever part comes last) and goes on to the tile's
// epilogue, as the one tile of an unsplit call would. No part waits for another: a part that never arrives (its pipeline timed
// out, recorded) leaves the tile unsignalled, and the combine's bounded wait for the token names it.
// The sums travel in register order (math thread t's register i of every part holds the same (row, column)
// of the tile, whatever the k-loop's layout), as 16-byte vectors interleaved over the threads.
#pragma once
#include <cstdint>

#include "device/kernel/kernel_params.h"
#include "device/protocol/regions.h"
#include "device/protocol/task_map.h"
#include "device/ptx/thread_group.cuh"

namespace epfuse::device {

// The task slots this launch's split may take (task_map.h split_task_slots).
__device__ __forceinline__ int split_slot_count(const FusedParams& prm) {
  return split_task_slots(prm.split_k.slots, static_cast<int>(gridDim.x));
}

// A Linear2 task of the split kernel: its tile (the n-block), its part of `parts`, and that part's K.
struct Linear2Part {
  GemmTile tile;
  int part, parts;
  KSpan k;
};

// Math group g (all of it) after a Linear2 part's k-loop, acc its kN sums (kN % 4 == 0); active: whether this
// thread's values are real rows (a warp of padding rows neither writes nor reads). True when acc now holds the
// whole tile (no split, or this part came last); false: the tile is another part's to finish.
template <int kN>
__device__ __forceinline__ bool split_k_meet(const FusedParams& prm, const Linear2Part& p, int nblocks2, float (&acc)[kN],
                                            bool active, const ThreadGroup& g) {
  static_assert(kN % 4 == 0 && kN * 4 * 256 <= kSplitSlotBytes, "a part's sums fit one slot as float4s");
  const int parts = p.parts;
  if (parts <= 1) return true;
  const int id = split_tile_id(p.tile, nblocks2), t = g.rank();
  char* region = prm.workspace + prm.split_k.offset;
  uint32_t* count = reinterpret_cast<uint32_t*>(region) + id;
  const auto slot = [&](int part) {
    return reinterpret_cast<float4*>(region + split_counter_bytes() + static_cast<size_t>(id * parts + part) * kSplitSlotBytes) + t;
  };
  if (active) {
    float4* mine = slot(p.part);
#pragma unroll
    for (int v = 0; v < kN / 4; ++v) __stcg(mine + v * g.count, make_float4(acc[4 * v], acc[4 * v + 1], acc[4 * v + 2], acc[4 * v + 3]));
  }
  __threadfence();  // this thread's sums are visible device-wide before the group counts the part
  bool last = false;
  if (g.leader()) last = atomicAdd(count, 1u) == static_cast<uint32_t>(parts - 1);
  if (!g.sync_or(last)) return false;
  __threadfence();  // the other parts' counts came before their sums are read
  if (active) {
    // Every part's sums from its slot, this one's too: in part order, with no register held beside acc.
#pragma unroll
    for (int v = 0; v < kN / 4; ++v) {
      float4 sum = __ldcg(slot(0) + v * g.count);
#pragma unroll 1
      for (int q = 1; q < parts; ++q) {
        const float4 x = __ldcg(slot(q) + v * g.count);
        sum.x += x.x, sum.y += x.y, sum.z += x.z, sum.w += x.w;
      }
      acc[4 * v] = sum.x, acc[4 * v + 1] = sum.y, acc[4 * v + 2] = sum.z, acc[4 * v + 3] = sum.w;
    }
  }
  if (g.leader()) atomicExch(count, 0u);  // every part of this call has counted: ready for the next call
  return true;
}

}  // namespace epfuse::device
