// The fused kernel's work as one ordered list of tasks, and the expert plan that sizes its GEMM part.
//
// Task ids, in this order (every wait of a task targets a task with a smaller id on this rank, or
// work on a peer that the same order puts before it there, so tasks taken in id order by running
// CTAs can never deadlock; docs/fused_design.md):
//   layout    [token blocks of kLayoutTokens]   count slots, take tickets (rows, pairs, owned rows)
//   publish   [1]                               send per-expert counts (and input status) to receivers
//   collect   [1]                               read every sender's counts, build the expert plan
//   for g = 0 .. L, block g:
//     dispatch(g)   [rows this rank owns for local expert g at every receiver / kDispatchRows] (g < L)
//     linear1(g-1)  [m-blocks of local expert g-1 x n-blocks(2I)]                               (g > 0)
//   linear2   [m-blocks x n-blocks(H)]          wait the m-block's Linear1 tiles, Linear2 -> home
//   combine   [token blocks of kCombineTokens]  wait the token's tiles, reduce its k slots -> y
// A row is owned by the token's smallest expert at its receiver (owner_slot_for_rank), and the task
// that sends it writes the entries of all the token's pairs there: local expert g's pairs have all
// been sent once every rank's dispatch(0..g) is done, so linear1(g) (one block later, which leaves
// the peers' dispatch(g) a block's time to land) overlaps dispatch(g+2..). The first three phases are
// sized by this rank's token count; the rest by the plan (known only once every sender's counts are in).
#pragma once
#include <cstdint>

#include "common/hash.h"  // EPFUSE_HD

namespace epfuse::device {

inline constexpr int kLayoutTokens = 64;
inline constexpr int kDispatchRows = 16;  // two rows per warp
inline constexpr int kCombineTokens = 8;  // one warp per token

enum class Phase : int { kLayout, kPublish, kDispatch, kCollect, kLinear1, kLinear2, kCombine, kDone };

EPFUSE_HD int ceil_div(int a, int b) { return (a + b - 1) / b; }

// The segment of x in a partition given by non-decreasing starts start[0..n] (start[0] = 0,
// 0 <= x < start[n]): the last i < n with start[i] <= x. Empty segments (start[i] == start[i+1]) are
// skipped.
EPFUSE_HD int segment_of(const int* start, int n, int x) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (start[mid] <= x) lo = mid; else hi = mid - 1;
  }
  return lo;
}

struct TaskSpace {
  int layout = 0, combine = 0;  // from the token count
  // From the plan (none until it exists): groups = local experts, and the plan's partitions.
  int groups = 0;
  const int* dispatch_start = nullptr;  // [groups+1] first dispatch task of each group
  const int* mb_start = nullptr;        // [groups+1] first m-block of each local expert
  int nblocks1 = 0, nblocks2 = 0;

  EPFUSE_HD int static_tasks() const { return layout + 2; }
  EPFUSE_HD int interleaved() const { return groups == 0 ? 0 : dispatch_start[groups] + mb_start[groups] * nblocks1; }
  EPFUSE_HD int linear2() const { return groups == 0 ? 0 : mb_start[groups] * nblocks2; }
  EPFUSE_HD int total() const { return static_tasks() + interleaved() + linear2() + combine; }
  // First id of block g (g in [0, groups]) within the interleaved part: dispatch(g), then linear1(g-1).
  EPFUSE_HD int block_start(int g) const { return dispatch_start[g] + (g == 0 ? 0 : mb_start[g - 1] * nblocks1); }
};

EPFUSE_HD TaskSpace make_task_space(int num_tokens) {
  TaskSpace s;
  s.layout = ceil_div(num_tokens, kLayoutTokens);
  s.combine = ceil_div(num_tokens, kCombineTokens);
  return s;
}
// dispatch_start and mb_start: ExpertPlan's, [groups+1] each.
EPFUSE_HD TaskSpace with_plan_tasks(TaskSpace s, int groups, const int* dispatch_start, const int* mb_start,
                                    int nblocks1, int nblocks2) {
  s.groups = groups;
  s.dispatch_start = dispatch_start;
  s.mb_start = mb_start;
  s.nblocks1 = nblocks1;
  s.nblocks2 = nblocks2;
  return s;
}

struct Task {
  Phase phase;
  int index;  // within the phase: dispatch tasks and Linear1 tiles are numbered over all groups
};

// Decodes a task id. Ids past the static phases need the plan (with_plan_tasks) first.
EPFUSE_HD Task decode_task(const TaskSpace& s, int id) {
  if (id < s.layout) return {Phase::kLayout, id};
  id -= s.layout;
  if (id < 1) return {Phase::kPublish, 0};
  id -= 1;
  if (id < 1) return {Phase::kCollect, 0};
  id -= 1;
  if (id < s.interleaved()) {
    int lo = 0, hi = s.groups;  // the last block starting at or before id
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.block_start(mid) <= id) lo = mid; else hi = mid - 1;
    }
    const int off = id - s.block_start(lo);
    const int dispatch = lo < s.groups ? s.dispatch_start[lo + 1] - s.dispatch_start[lo] : 0;
    if (off < dispatch) return {Phase::kDispatch, s.dispatch_start[lo] + off};
    return {Phase::kLinear1, s.mb_start[lo - 1] * s.nblocks1 + (off - dispatch)};
  }
  id -= s.interleaved();
  if (id < s.linear2()) return {Phase::kLinear2, id};
  id -= s.linear2();
  if (id < s.combine) return {Phase::kCombine, id};
  return {Phase::kDone, 0};
}

// A Linear2 tile's combine signals are released one tile late (after the CTA's next Linear2
// mainloop, so its remote stores drain under that GEMM). A CTA may carry unreleased signals into a
// task of phase `next` only if that task cannot wait, directly or through a chain of waits, for a
// combine signal: a Linear2 tile waits only for this rank's Linear1 tiles (-> arrivals -> dispatch ->
// the plan -> counts -> layout, none of which wait for combine). A combine task may wait for the held signal itself, and
// the end of the kernel must leave nothing held: both release first.
EPFUSE_HD bool may_hold_signals_into(Phase next) { return next == Phase::kLinear2; }

// GEMM tiles are numbered m-block major, so all n-blocks of an m-block are taken together and the
// Linear2 tiles of the first m-blocks find their Linear1 inputs finished first.
struct Tile {
  int mblock;  // over all local experts (ExpertPlan::mb_start)
  int nblock;
};
EPFUSE_HD Tile tile_of(int index, int nblocks) { return {index / nblocks, index % nblocks}; }

// ---- the expert plan: from counts[src][local expert] (pairs each sender sends) ----
struct ExpertPlan {
  int* rows;            // [L] pairs of expert e over all senders
  int* pair_off;        // [L] first row of expert e in h (exclusive prefix of rows)
  int* mb_start;        // [L+1] first m-block of expert e; mb_start[L] = m-blocks in all
  int* src_prefix;      // [L][world+1] first expert row of expert e that comes from sender s
  int* entry_off;       // [world][L] first entry of expert e in sender s's entry region
  uint32_t* target;     // [L] arrivals value at which expert e is complete (base + rows)
  int* dispatch_start;  // [L+1] first dispatch task of group g (this rank's rows owned by local expert g)
};

// Carves the plan out of plan_ints(dims) ints (buffer_layout.h).
EPFUSE_HD ExpertPlan plan_view(int* ints, int world, int local_experts) {
  ExpertPlan p;
  p.rows = ints;
  p.pair_off = p.rows + local_experts;
  p.mb_start = p.pair_off + local_experts;
  p.src_prefix = p.mb_start + local_experts + 1;
  p.entry_off = p.src_prefix + local_experts * (world + 1);
  p.target = reinterpret_cast<uint32_t*>(p.entry_off + world * local_experts);
  p.dispatch_start = reinterpret_cast<int*>(p.target + local_experts);
  return p;
}

// Exclusive prefix sum of n counts into out (out may not alias counts); returns the total. Senders use
// it over their pair tickets and receivers over the count messages: one definition of entry offsets.
EPFUSE_HD int exclusive_prefix(const uint32_t* counts, int n, int* out) {
  int sum = 0;
  for (int i = 0; i < n; ++i) {
    out[i] = sum;
    sum += static_cast<int>(counts[i]);
  }
  return sum;
}

EPFUSE_HD int mblocks_of(int rows, int block_m) { return (rows + block_m - 1) / block_m; }

// counts: [world][L] as received. Fills everything but target; returns the m-block count.
EPFUSE_HD int build_expert_plan(const uint32_t* counts, int world, int local_experts, int block_m,
                                const ExpertPlan& p) {
  for (int s = 0; s < world; ++s)
    exclusive_prefix(counts + s * local_experts, local_experts, p.entry_off + s * local_experts);
  int pairs = 0, mblocks = 0;
  for (int e = 0; e < local_experts; ++e) {
    int* pre = p.src_prefix + e * (world + 1);
    int rows = 0;
    for (int s = 0; s < world; ++s) {
      pre[s] = rows;
      rows += static_cast<int>(counts[s * local_experts + e]);
    }
    pre[world] = rows;
    p.rows[e] = rows;
    p.pair_off[e] = pairs;
    p.mb_start[e] = mblocks;
    pairs += rows;
    mblocks += mblocks_of(rows, block_m);
  }
  p.mb_start[local_experts] = mblocks;
  return mblocks;
}

// The local expert owning m-block mb (mb < mb_start[L]).
EPFUSE_HD int expert_of_mblock(const int* mb_start, int local_experts, int mb) {
  return segment_of(mb_start, local_experts, mb);
}

// ---- expert-ordered dispatch (sender side) ----
// owner_tickets [world][L]: rows this rank owns for each global expert (rank r, local g) = r * L + g.
// Group g sends the rows owned by local expert g at every receiver, receiver-major, kDispatchRows per
// task.

// Rows of group g (sum over receivers).
EPFUSE_HD int group_rows(const uint32_t* owner_tickets, int world, int local_experts, int g) {
  int rows = 0;
  for (int r = 0; r < world; ++r) rows += static_cast<int>(owner_tickets[r * local_experts + g]);
  return rows;
}

// Fills dispatch_start [L+1]; returns the dispatch task count.
EPFUSE_HD int build_dispatch_groups(const uint32_t* owner_tickets, int world, int local_experts, int* dispatch_start) {
  int tasks = 0;
  for (int g = 0; g < local_experts; ++g) {
    dispatch_start[g] = tasks;
    tasks += ceil_div(group_rows(owner_tickets, world, local_experts, g), kDispatchRows);
  }
  dispatch_start[local_experts] = tasks;
  return tasks;
}

// Row p (0 <= p < rows of group g) of group g: its receiver and its index among the rows this rank
// owns for expert (receiver, g), i.e. its place in dispatch_order.
struct OwnedRow {
  int receiver;
  int index;
};
EPFUSE_HD OwnedRow owned_row(const uint32_t* owner_tickets, int world, int local_experts, int g, int p) {
  int r = 0;
  while (r + 1 < world && p >= static_cast<int>(owner_tickets[r * local_experts + g])) {
    p -= static_cast<int>(owner_tickets[r * local_experts + g]);
    ++r;
  }
  return {r, p};
}

// Where expert row r of expert e (r < rows[e]) was written: sender and entry index in its region.
struct RowSource {
  int src;
  int entry;
};
EPFUSE_HD RowSource row_source(const ExpertPlan& p, int world, int local_experts, int e, int r) {
  const int* pre = p.src_prefix + e * (world + 1);
  int s = 0;
  while (s + 1 < world && pre[s + 1] <= r) ++s;
  return {s, p.entry_off[s * local_experts + e] + (r - pre[s])};
}

}  // namespace epfuse::device
