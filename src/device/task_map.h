// The fused kernel's work as one ordered list of tasks, and the expert plan that sizes its GEMM part.
//
// Task ids, in this order (every wait of a task targets a task of an earlier phase, on this rank or a
// peer, so tasks taken in id order by co-resident CTAs can never deadlock; docs/fused_design.md):
//   layout    [token blocks of kLayoutTokens]   count slots, take tickets
//   publish   [1]                               send per-expert counts (and input status) to receivers
//   dispatch  [token blocks of kDispatchTokens] push rows + entries, count arrivals at receivers
//   collect   [1]                               read every sender's counts, build the expert plan
//   linear1   [m-blocks x n-blocks(2I)]         wait arrivals of the expert, Linear1+SwiGLU -> h
//   linear2   [m-blocks x n-blocks(H)]          wait the m-block's Linear1 tiles, Linear2 -> home
//   combine   [token blocks of kCombineTokens]  wait the token's tiles, reduce its k slots -> y
// The first four phases are sized by this rank's token count; the GEMM phases by the m-block count
// the collect task computes (known only once every sender's counts are in).
#pragma once
#include <cstdint>

#include "common/hash.h"  // EPFUSE_HD

namespace epfuse::device {

inline constexpr int kLayoutTokens = 64;
inline constexpr int kDispatchTokens = 8;
inline constexpr int kCombineTokens = 8;  // one warp per token

enum class Phase : int { kLayout, kPublish, kDispatch, kCollect, kLinear1, kLinear2, kCombine, kDone };

EPFUSE_HD int ceil_div(int a, int b) { return (a + b - 1) / b; }

struct TaskSpace {
  int layout = 0, dispatch = 0, combine = 0;  // from the token count
  int linear1 = 0, linear2 = 0;               // from the m-block count (0 until the plan exists)

  EPFUSE_HD int static_tasks() const { return layout + 1 + dispatch + 1; }
  EPFUSE_HD int total() const { return static_tasks() + linear1 + linear2 + combine; }
};

EPFUSE_HD TaskSpace make_task_space(int num_tokens) {
  TaskSpace s;
  s.layout = ceil_div(num_tokens, kLayoutTokens);
  s.dispatch = ceil_div(num_tokens, kDispatchTokens);
  s.combine = ceil_div(num_tokens, kCombineTokens);
  return s;
}
EPFUSE_HD TaskSpace with_gemm_tasks(TaskSpace s, int mblocks, int nblocks1, int nblocks2) {
  s.linear1 = mblocks * nblocks1;
  s.linear2 = mblocks * nblocks2;
  return s;
}

struct Task {
  Phase phase;
  int index;  // within the phase
};

// Decodes a task id. Ids past the static phases need the GEMM counts (with_gemm_tasks) first.
EPFUSE_HD Task decode_task(const TaskSpace& s, int id) {
  if (id < s.layout) return {Phase::kLayout, id};
  id -= s.layout;
  if (id < 1) return {Phase::kPublish, 0};
  id -= 1;
  if (id < s.dispatch) return {Phase::kDispatch, id};
  id -= s.dispatch;
  if (id < 1) return {Phase::kCollect, 0};
  id -= 1;
  if (id < s.linear1) return {Phase::kLinear1, id};
  id -= s.linear1;
  if (id < s.linear2) return {Phase::kLinear2, id};
  id -= s.linear2;
  if (id < s.combine) return {Phase::kCombine, id};
  return {Phase::kDone, 0};
}

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

// The local expert owning m-block mb (mb < mb_start[L]): the last e with mb_start[e] <= mb. Experts
// without rows have mb_start[e] == mb_start[e+1] and are skipped.
EPFUSE_HD int expert_of_mblock(const int* mb_start, int local_experts, int mb) {
  int lo = 0, hi = local_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (mb_start[mid] <= mb) lo = mid; else hi = mid - 1;
  }
  return lo;
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
