// Layout on the GPU: per token block, which receivers and local experts its slots go to; row and pair
// slots reserved with a ticket dispenser (one global atomic per CTA per receiver and per expert, not
// one per slot); then the counts published to every receiver, and read back by the collect task into
// this call's expert plan. No host involvement, nothing reset by the host.
#pragma once
#include <cstdint>

#include "device/diagnostics/trace.cuh"
#include "device/kernel/context.cuh"
#include "device/kernel/wait.cuh"
#include "device/protocol/routing.h"

namespace epfuse::device {

// Task: layout of tokens [b * kLayoutTokens, ...). smem: (world + E) u32. kDecode: the decode kernels
// (fused_kernel.cu decode_kernel), where a call of at most kLayoutTokens tokens has one layout task.
template <bool kDecode, class Transport>
__device__ void layout_task(const FusedContext<Transport>& c, int block, void* smem) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int k = d.topk, E = d.num_experts, L = c.local_experts;
  const int t0 = block * kLayoutTokens;
  const int pairs = min(kLayoutTokens, prm.num_tokens - t0) * k;
  uint32_t* cnt_rows = static_cast<uint32_t*>(smem);  // [world] then [E]: block counts, then ticket bases
  uint32_t* cnt_pairs = cnt_rows + d.world;
  for (int i = threadIdx.x; i < d.world + E; i += blockDim.x) cnt_rows[i] = 0;
  __syncthreads();

  // Slots within the block; the first slot of a token for a receiver owns the token's row there.
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int t = t0 + q / k, j = q % k;
    const int32_t* idx = prm.topk_idx + static_cast<int64_t>(t) * k;
    const int32_t e = idx[j];
    int32_t row = -1, index = -1;
    if (slot_is_invalid(e, E)) {
      record_error(c.ctl, ErrorRecord{static_cast<int32_t>(ErrorKind::kBadExpert), prm.rank,
                                      static_cast<int32_t>(Phase::kLayout), 0, t, j, static_cast<uint32_t>(e), 0});
      atomicExch(&c.ctl->input_status, static_cast<uint32_t>(ErrorKind::kBadExpert));
    } else if (slot_is_routed(e, E)) {
      const SlotTickets draws = slot_tickets(idx, j, E, L);
      if (draws.owns_row) row = static_cast<int32_t>(atomicAdd(&cnt_rows[draws.row_rank], 1u));
      index = static_cast<int32_t>(atomicAdd(&cnt_pairs[draws.pair_expert], 1u));
    }
    c.pair_row[static_cast<int64_t>(t) * k + j] = row;
    c.pair_index[static_cast<int64_t>(t) * k + j] = index;
  }
  __syncthreads();
  trace::stamp_current(threadIdx.x == 0, trace::kPosted);
  bool one_block = false;
  if constexpr (kDecode) one_block = prm.num_tokens <= kLayoutTokens;
  if (one_block) {
    // The call's only layout task: its counts are the totals and every base is 0 (the dispensers are zero
    // at a call's start), so the pair totals are stored as they are and the slots keep the indices above:
    // no ticket round trip and no second pass over the slots
    // (docs/performance.md#the-start-of-a-decode-call-in-the-decode-kernels-2026-11-30).
    for (int e = threadIdx.x; e < E; e += blockDim.x)
      if (cnt_pairs[e] != 0) c.pair_tickets[e] = cnt_pairs[e];
    trace::stamp_current(threadIdx.x == 0, trace::kLoaded);
  } else {
    // Ticket dispenser: one atomic per receiver / expert this block uses turns counts into bases.
    for (int i = threadIdx.x; i < d.world + E; i += blockDim.x) {
      const uint32_t n = cnt_rows[i];
      if (n == 0) continue;
      uint32_t* ticket = i < d.world ? c.row_tickets + i : c.pair_tickets + (i - d.world);
      cnt_rows[i] = atomicAdd(ticket, n);
    }
    __syncthreads();
    trace::stamp_current(threadIdx.x == 0, trace::kLoaded);
    for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
      const int t = t0 + q / k, j = q % k;
      const int32_t e = prm.topk_idx[static_cast<int64_t>(t) * k + j];
      if (!slot_is_routed(e, E)) continue;
      const int64_t at = static_cast<int64_t>(t) * k + j;
      c.pair_index[at] += static_cast<int32_t>(cnt_pairs[e]);
      if (c.pair_row[at] >= 0) c.pair_row[at] += static_cast<int32_t>(cnt_rows[expert_rank(e, L)]);
    }
  }
  __syncthreads();  // the owning slots' rows are final; copy them to the token's other slots there
  trace::stamp_current(threadIdx.x == 0, trace::kLoopEnd);
  for (int q = threadIdx.x; q < pairs; q += blockDim.x) {
    const int t = t0 + q / k, j = q % k;
    const int32_t* idx = prm.topk_idx + static_cast<int64_t>(t) * k;
    const int first = first_slot_for_rank(idx, j, E, L);
    if (first >= 0 && first != j) c.pair_row[static_cast<int64_t>(t) * k + j] = c.pair_row[static_cast<int64_t>(t) * k + first];
  }
  __syncthreads();
  if (threadIdx.x == 0) red_add_release_gpu(&c.ctl->layout_done, 1u);
}

// Waits until every layout task of this call is done (their tickets are totals from then on).
template <class Transport>
__device__ bool wait_layout_done(const FusedContext<Transport>& c, Phase phase, int layout_tasks, bool abortable) {
  uint32_t* done = &c.ctl->layout_done;
  return cta_wait(*c.prm, c.ctl, c.site(phase, WaitKind::kLayoutDone), static_cast<uint32_t>(layout_tasks),
                  [&] { return ld_acquire_gpu(done); },
                  [&](uint32_t v) { return v >= static_cast<uint32_t>(layout_tasks); }, abortable);
}

// Task: send every receiver this rank's count message: its pair counts per local expert, its input
// status and its layer identity, each a word tagged with the epoch (epoch.h tagged_word: no flag, no
// release, so no round trip for the stores to land before a flag goes out). Runs even after an abort: a
// rank with bad input must still tell its peers (they then fail with kInvalidArgument instead of timing out).
// In the decode kernels (kDecode) with one layout task the counts are this rank's routing's histogram,
// taken here from topk_idx into smem ([E] u32) by the layout's rule (slot_is_routed, a pair a routed
// slot), so the message goes out without waiting for the layout's tickets; otherwise the tickets' totals.
// Only there: the other kernels keep their instructions
// (docs/performance.md#the-start-of-a-decode-call-in-the-decode-kernels-2026-11-30).
template <bool kDecode, class Transport>
__device__ void publish_task(const FusedContext<Transport>& c, int layout_tasks, void* smem) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int L = c.local_experts, E = d.num_experts, words = count_words_per_sender(prm.capacity);
  // EPFUSE_FAULT at=publish: this rank's count messages never go out; every rank's collect waits for them.
  if (hang_here(prm, c.ctl, ThreadGroup::cta(), HangPoint::kPublish)) return;
  uint32_t found = 0u;
  const uint32_t* counts = c.pair_tickets;
  bool from_routing = false;
  if constexpr (kDecode) {
    from_routing = layout_tasks == 1;
    if (from_routing) {
      uint32_t* histogram = static_cast<uint32_t*>(smem);
      __shared__ uint32_t bad_id;
      for (int e = threadIdx.x; e < E; e += blockDim.x) histogram[e] = 0u;
      if (threadIdx.x == 0) bad_id = 0u;
      __syncthreads();
      for (int q = threadIdx.x; q < prm.num_tokens * d.topk; q += blockDim.x) {
        const int32_t e = prm.topk_idx[q];
        if (slot_is_routed(e, E)) atomicAdd(&histogram[e], 1u);
        else if (slot_is_invalid(e, E)) atomicOr(&bad_id, 1u);  // the layout task records which
      }
      __syncthreads();
      found = bad_id != 0u ? static_cast<uint32_t>(ErrorKind::kBadExpert) : 0u;
      counts = histogram;
    }
  }
  if (!from_routing) {
    if (!wait_layout_done(c, Phase::kPublish, layout_tasks, /*abortable=*/false)) return;
    found = *reinterpret_cast<volatile uint32_t*>(&c.ctl->input_status);
  }
  trace::stamp_current(threadIdx.x == 0, trace::kInputs);
  const uint32_t status = found != 0 ? found : prm.host_status;
  // Every word of the window's message, counts past this layer's L included (zeros), so that the
  // receiver polls one contiguous run of words a sender.
  for (int i = threadIdx.x; i < d.world * words; i += blockDim.x) {
    const int dst = i / words, j = i % words;
    const uint32_t v = j < L ? counts[dst * L + j]
                             : j == count_status_word(prm.capacity) ? status
                             : j == count_layer_word(prm.capacity)  ? prm.layer_id
                                                                     : 0u;
    peer_store_word(c, peer_ptr<uint64_t>(c, dst, count_word_offset(prm.sym, prm.capacity, c.parity, prm.rank, j)),
                    tagged_word(c.epoch, v));
  }
  __syncthreads();
  trace::stamp_current(threadIdx.x == 0, trace::kEpiStored);
  if (threadIdx.x == 0 && status != 0) raise_abort(c.ctl);
}

// plan_prefixes' scan (task_map.h) by the 32 lanes of one warp, each call from all of them; the same sums
// as SerialScan. kChunks false: 32 elements a step, each step's sums by shuffles, carried into the next.
// kChunks true (the decode kernels, fused_kernel.cu decode_kernel): lane l sums its consecutive elements
// (scan_lane_chunk), one round of shuffles turns the lanes' sums into their chunks' bases, and each lane
// stores its chunk's sums: one round whatever n, where by steps the collect's scans took 1.7 us at 128
// experts against 0.7 at 32, twice a call (docs/performance.md#the-plans-scans-by-chunks-a-lane-2026-12-01).
// Only there, and its loops not unrolled: in the prefill kernels the chunks moved the producer's registers
// (spills in its loads), and unrolled they took the FP8 decode kernel from 0 to 75 spill instructions.
template <bool kChunks>
struct WarpScan {
  int lane;
  template <class Load, class Store>
  __device__ int operator()(int n, Load&& load, Store&& store) const {
    if constexpr (kChunks) {
      const LaneChunk chunk = scan_lane_chunk(n, lane);
      int sum = 0;
#pragma unroll 1
      for (int i = chunk.begin; i < chunk.end; ++i) sum += load(i);
      const int inclusive = inclusive_lanes(sum);
      int run = inclusive - sum;
#pragma unroll 1
      for (int i = chunk.begin; i < chunk.end; ++i) {  // element i loaded again before its sum is stored
        const int v = load(i);
        store(i, run);
        run += v;
      }
      return __shfl_sync(~0u, inclusive, 31);
    } else {
      int carry = 0;
      for (int base = 0; base < n; base += 32) {
        const int i = base + lane;
        const int v = i < n ? load(i) : 0;
        const int inclusive = inclusive_lanes(v);
        if (i < n) store(i, carry + inclusive - v);
        carry += __shfl_sync(~0u, inclusive, 31);
      }
      return carry;
    }
  }
  // The sum of v over lanes 0 .. lane (doubling rounds of shuffles).
  __device__ int inclusive_lanes(int v) const {
    int inclusive = v;
#pragma unroll
    for (int d = 1; d < 32; d *= 2) {
      const int below = __shfl_up_sync(~0u, inclusive, d);
      if (lane >= d) inclusive += below;
    }
    return inclusive;
  }
};

// Task: wait for every sender's counts, check their input status, build the expert plan (rows per
// expert, m-blocks of block_m rows, where each expert row sits), the GEMM schedule and the arrival
// targets; then publish plan_epoch.
// The plan is built in shared memory when it fits (collect_scratch_ints within the `scratch_bytes` the
// tile leaves free before the GEMM phase): the whole CTA reads the counts and arrival bases in, runs
// plan_expert one expert per thread, warp 0 the prefix sums (scans), the schedule and the targets, and
// the whole CTA copies the plan out before the release. Thread 0 alone on global memory took 40 us for
// 64 experts (docs/performance.md#start-up-layout-publish-collect).
EPFUSE_HD size_t collect_scratch_ints(const FusedDims& d) {
  return plan_ints(d) + static_cast<size_t>(d.world) * d.local_experts() + d.local_experts();
}

// kDecode: the decode kernels (fused_kernel.cu decode_kernel), whose scans go by chunks (WarpScan).
// kSplit (the FP8 split kernel): its Linear2 tiles split over K on split_slots task slots (task_map.h
// linear2_call_parts): the schedule holds nblocks2 x parts Linear2 columns an m-block.
template <bool kDecode, bool kSplit, class Transport>
__device__ void collect_task(const FusedContext<Transport>& c, int block_m, int nblocks1, int nblocks2, void* smem,
                             int scratch_bytes, int split_slots) {
  const FusedParams& prm = *c.prm;
  const FusedDims& d = prm.dims;
  const int L = c.local_experts, W = d.world;
  // EPFUSE_FAULT at=collect: this rank's plan never comes; its GEMM and combine tasks wait for it.
  if (hang_here(prm, c.ctl, ThreadGroup::cta(), HangPoint::kCollect)) return;
  // This parity's count messages, [world][capacity L + 2] tagged words; their values go to counts_smem,
  // or (plan outside shared memory) to the private counts region, [world][capacity L].
  const uint64_t* words = local_ptr<uint64_t>(c, count_word_offset(prm.sym, prm.capacity, c.parity, 0, 0));
  const int per_src = count_words_per_sender(prm.capacity);
  uint32_t* counts_priv = reinterpret_cast<uint32_t*>(prm.workspace + prm.priv.counts);
  const bool in_smem = collect_scratch_ints(d) * sizeof(int) <= static_cast<size_t>(scratch_bytes);
  int* plan_smem = static_cast<int*>(smem);
  uint32_t* counts_smem = reinterpret_cast<uint32_t*>(plan_smem + plan_ints(d));  // [world][L]
  uint32_t* bases_smem = counts_smem + W * L;                                    // [L]
  const ExpertPlan published = c.published_plan();
  __shared__ int bad_src;  // the lowest sender with a bad status or another layer; W: none
  // Pass 0 (plan in shared memory only): the plan's code run once on zero counts into the scratch, while
  // the counts are not in yet, so that pass 1 finds its instructions on the SM: cold, warp 0's ~50
  // instructions of scans, schedule and targets took ~2 us at T = 1
  // (docs/performance.md#the-start-up-chain-at-world-2-2026-11-29). One loop, not two copies of the code.
#pragma unroll 1
  for (int pass = in_smem ? 0 : 1; pass < 2; ++pass) {
    const bool real = pass == 1;
    if (real) {
      if (threadIdx.x == 0) bad_src = W;  // the wait's first barrier orders it before any take
      // Word i of the parity's messages is word i % per_src of sender i / per_src: its counts (the first
      // L used), status and layer identity. A bad status or another layer is noted here, rarely, and the
      // lowest such sender recorded after the wait: the words come in any order, the error names the
      // same peer every time.
      const auto take = [&](int i, uint32_t v) {
        const int src = i / per_src, j = i % per_src;
        if (j < L) {
          (in_smem ? counts_smem[src * L + j] : counts_priv[src * prm.capacity.local_experts() + j]) = v;
        } else if ((j == count_status_word(prm.capacity) && v != 0) ||
                   (j == count_layer_word(prm.capacity) && v != prm.layer_id)) {
          atomicMin(&bad_src, src);
        }
      };
      if (!cta_wait_words(prm, c.ctl, W * per_src, c.epoch, [&](int i) { return peer_load_word(c, words + i); }, take,
                          [&](int i) { return c.site(Phase::kCollect, WaitKind::kCounts, i / per_src); }))
        return;
      trace::stamp_current(threadIdx.x == 0, trace::kInputs);
      if (threadIdx.x == 0 && bad_src < W) {
        const uint64_t* m = words + bad_src * per_src;
        const uint32_t status = word_value(peer_load_word(c, m + count_status_word(prm.capacity)));
        const uint32_t layer = word_value(peer_load_word(c, m + count_layer_word(prm.capacity)));
        if (status != 0)
          record_error(c.ctl, ErrorRecord{static_cast<int32_t>(ErrorKind::kPeerBadInput), prm.rank,
                                          static_cast<int32_t>(Phase::kCollect), 0, bad_src, 0, 0, status});
        if (layer != prm.layer_id)
          record_error(c.ctl, ErrorRecord{static_cast<int32_t>(ErrorKind::kPeerOtherLayer), prm.rank,
                                          static_cast<int32_t>(Phase::kCollect), 0, bad_src, 0, prm.layer_id, layer});
        raise_abort(c.ctl);
      }
    }
    if (in_smem) {
      if (!real)
        for (int i = threadIdx.x; i < W * L; i += blockDim.x) counts_smem[i] = 0u;
      for (int e = threadIdx.x; e < L; e += blockDim.x) bases_smem[e] = real ? c.arrival_base[e] : 0u;
    }
    __syncthreads();
    trace::stamp_current(threadIdx.x == 0 && real, trace::kPosted);
    if (real && bad_src < W) return;
    const ExpertPlan p = in_smem ? plan_view(plan_smem, W, L) : published;
    const uint32_t* counts = in_smem ? counts_smem : counts_priv;
    const int count_stride = in_smem ? L : prm.capacity.local_experts();
    uint32_t* bases = in_smem ? bases_smem : c.arrival_base;
    for (int e = threadIdx.x; e < L; e += blockDim.x) plan_expert(counts, count_stride, W, e, block_m, p);
    __syncthreads();
    trace::stamp_current(threadIdx.x == 0 && real, trace::kLoaded);
    const int lane = static_cast<int>(threadIdx.x) % 32;
    if (threadIdx.x < 32) {
      // Warp 0: the prefixes as scans, then the schedule and the targets expert by expert (lane by lane);
      // the lagged schedule of worlds > 1 (more Linear1 tiles than its lag, more m-blocks than
      // experts, a combine the GEMMs do not cover) in two such steps (task_map.h gemm_schedule_steps).
      const int mblocks = plan_prefixes(counts, count_stride, W, L, p, WarpScan<kDecode>{lane});
      __syncwarp();
      trace::stamp_current(threadIdx.x == 0 && real, trace::kEpiMath);
      const int lag = prm.schedule_lag_quarters >= 0 ? forced_lag(prm.schedule_lag_quarters, static_cast<int>(gridDim.x))
                                                     : schedule_lag(W, static_cast<int>(gridDim.x), mblocks, nblocks1, L, prm.combine_lag);
      const int parts = kSplit ? linear2_call_parts(mblocks, nblocks2, d.intermediate, split_slots) : 1;
      // target is filled below: until then it holds the lagged schedule's placements.
      gemm_schedule_steps(p, L, nblocks1, nblocks2 * parts, lag, reinterpret_cast<int*>(p.target), lane, 32,
                          [] { __syncwarp(); });
      __syncwarp();
      trace::stamp_current(threadIdx.x == 0 && real, trace::kEpiSwiglu);
      for (int e = lane; e < L; e += 32) plan_target(p, bases, e);
      if (lane == 0 && real) c.ctl->mblocks = static_cast<uint32_t>(mblocks);
    }
    __syncthreads();  // pass 0's plan is overwritten by pass 1
  }
  trace::stamp_current(threadIdx.x == 0, trace::kLoopEnd);
  if (in_smem) {
    __syncthreads();
    // plan_view: published.rows is the base of the plan's plan_ints(d) ints, laid out as in shared memory.
    for (int i = threadIdx.x; i < static_cast<int>(plan_ints(d)); i += blockDim.x) published.rows[i] = plan_smem[i];
    for (int e = threadIdx.x; e < L; e += blockDim.x) c.arrival_base[e] = bases_smem[e];
  }
  __syncthreads();  // every store of the plan is issued before thread 0's release
  trace::stamp_current(threadIdx.x == 0, trace::kEpiStored);
  if (threadIdx.x == 0) st_release_gpu(&c.ctl->plan_epoch, c.epoch);
}

}  // namespace epfuse::device
