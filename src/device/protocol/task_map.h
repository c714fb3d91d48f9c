// The fused kernel's work as one ordered list of tasks, and the expert plan that sizes its GEMM part.
//
// Task ids, in this order (every wait of a task targets a task with a smaller id, on this rank or a
// peer, so tasks taken in id order by co-resident CTAs can never deadlock; docs/fused_design.md):
//   layout    [token blocks of kLayoutTokens]   count slots, take tickets
//   publish   [1]                               send per-expert counts (and input status) to receivers
//   collect   [1]                               read every sender's counts, build the expert plan
//   dispatch  [token blocks of dispatch_tokens] push rows + entries, count arrivals at receivers
//   gemm      [the GEMM schedule]               Linear1 and Linear2 tiles, interleaved by expert:
//     linear1 (m-block, n-block of 2I)            wait arrivals of the expert, Linear1+SwiGLU -> h
//     linear2 (m-block, n-block of H)             wait the m-block's Linear1 tiles, Linear2 -> home
//   combine   [token blocks of combine_tokens]  wait the token's tiles, reduce its k slots -> y
// The first four phases are sized by this rank's token count; the GEMM phase by the schedule the
// collect task builds (known only once every sender's counts are in). The collect task comes before the
// dispatch tasks (it waits only for the publish tasks) so that it builds the plan while they run; after
// them it started only once a CTA was free of dispatch work, 60 us into a dsv3 T = 4096 call
// (docs/performance.md#start-up-layout-publish-collect).
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace epfuse::device {

inline constexpr int kLayoutTokens = 64;
inline constexpr int kDispatchTokensMin = 8;   // tokens of a dispatch task: dispatch_tokens
inline constexpr int kDispatchTokensMax = 32;
inline constexpr int kCombineTokens = 8;  // tokens of a combine task, at most (combine_tokens)

// The dispatch task's row items: item q (< tokens x k) of a task of `tokens` tokens is slot q / tokens
// of its token q % tokens. Slot-major, so that consecutive items (one per warp) belong to different
// tokens: a token's row travels with its first owning slot (first_slot_for_rank), often slot 0 (always
// at world 1), and token-major items would give those rows to every k-th warp only.
struct DispatchItem {
  int token;  // within the task
  int slot;
};
EPFUSE_HD DispatchItem dispatch_item(int q, int tokens) { return {q % tokens, q / tokens}; }

enum class Phase : int { kLayout, kPublish, kDispatch, kCollect, kLinear1, kLinear2, kCombine, kDone };

EPFUSE_HD int ceil_div(int a, int b) { return (a + b - 1) / b; }

// A per-token phase's task size at small T: `size` (a power of two) halved, down to one token, while the
// tasks stay within max_tasks (at least one), so that a decode step's few tokens go to more CTAs and warps.
EPFUSE_HD int small_task_tokens(int size, int num_tokens, int max_tasks) {
  const int bound = max_tasks > 1 ? max_tasks : 1;
  while (size > 1 && ceil_div(num_tokens, size / 2) <= bound) size /= 2;
  return size;
}

// Tokens of a dispatch task for num_tokens tokens on a grid of `ctas` CTAs: the largest of 32, 16 and 8
// that still gives at least 7/8 of the CTAs a task. A task pays a fixed chain once (its claim, the
// layout wait, the ticket prefix, the entries' dependent loads, the release add), so many tokens want
// few tasks; a decode step's few tokens want every task on a CTA of its own. On an H100 32 tokens took
// the dispatch phase from 53 to 38 us at mixtral T=4096 and from 150 to 110 us at qwen3 T=16384, and
// cost T=128 7% when fixed (docs/performance.md#dispatch). Below 8-token tasks on 7/8 of the CTAs, the
// size halves (down to 1) while the tasks stay within a quarter of the CTAs at world 1 and within the
// grid at worlds > 1: one 8-token task at T = 8 quantised and sent its rows in 13 us at qwen3-30b and 37 us
// at dsv3 (world 4), on the way to the receivers' first tiles
// (docs/performance.md#decode-start-up-by-more-ctas-2026-11-28); at world 2 a 4-token task took 34 us at
// dsv3 T = 128, and tasks of every CTA took 0.7-2% off T = 128-256, while at world 1, where a task's rows
// stay on the GPU, they cost qwen3-30b 2-3% (docs/performance.md#dispatch-tasks-within-the-grid-2026-12-01).
EPFUSE_HD int dispatch_tokens(int num_tokens, int ctas, int world) {
  for (int size = kDispatchTokensMax; size > kDispatchTokensMin; size /= 2)
    if (ceil_div(num_tokens, size) >= ctas - ctas / 8) return size;
  return small_task_tokens(kDispatchTokensMin, num_tokens, world > 1 ? ctas : ctas / 4);
}

// Tokens of a combine task: kCombineTokens, or fewer at small T (small_task_tokens). A task of fewer
// tokens than half its warps shares each token's columns out to several warps (combine.cuh): one
// 8-token task took 6 us after the last Linear2 tile at qwen3-30b T = 8, world 4, one warp a token
// (docs/performance.md#combine-tasks-of-fewer-tokens-2026-11-28). The tasks stay within a quarter of the
// CTAs: within the grid, as the dispatch's, they cost qwen3-30b T = 64-256 2-4% at world 1
// (docs/performance.md#dispatch-tasks-within-the-grid-2026-12-01).
EPFUSE_HD int combine_tokens(int num_tokens, int ctas) { return small_task_tokens(kCombineTokens, num_tokens, ctas / 4); }

// Row items a dispatch task's pass walks (dispatch.cuh; each a (token, slot) of dispatch_item and a column
// chunk of dispatch_row_chunks). At worlds > 1 all of them: an item's routing says whether its slot owns
// the token's row at a receiver. At world 1 (lone) every row is the rank's own and travels with slot 0,
// whose items are the first `tokens` of the slot-major order, so FP8's pass that sends own rows walks
// those tokens x chunks items alone and bf16 (own rows read from x) none: 7 in 8 items at top-8 were
// routing loads for no row (docs/performance.md#world-1s-rows-without-the-routing-at-every-size-2026-11-30).
// pairs: tokens x k.
EPFUSE_HD int dispatch_row_items(bool lone, bool fp8, bool sends_own, int tokens, int pairs, int chunks) {
  return !lone ? pairs * chunks : fp8 && sends_own ? tokens * chunks : 0;
}

// Column chunks of a dispatch row: a task of fewer tokens than kDispatchTokensMin has fewer rows than
// warps, so each row is cut into pieces of kDispatchChunk columns, one warp each (a multiple of the
// quantiser's batch, fp8_quantize.cuh warp_quantize_row: 8 steps of 256 columns, and of its 128-column
// scale groups); a bulk task keeps one warp per row.
inline constexpr int kDispatchChunk = 2048;
EPFUSE_HD int dispatch_row_chunks(int task_tokens, int hidden) {
  return task_tokens < kDispatchTokensMin ? ceil_div(hidden, kDispatchChunk) : 1;
}
// Columns [first, first + count) of chunk `chunk` of a row cut into `chunks` (dispatch_row_chunks).
struct ColumnRange {
  int first, count;
};
EPFUSE_HD ColumnRange dispatch_chunk(int chunk, int chunks, int hidden) {
  const int first = chunk * kDispatchChunk;
  return {first, chunks == 1 ? hidden : (hidden - first < kDispatchChunk ? hidden - first : kDispatchChunk)};
}

struct TaskSpace {
  int layout = 0, dispatch = 0, combine = 0;  // from the token count
  int gemm = 0;                               // from the GEMM schedule (0 until the plan exists)
  int dispatch_tokens = kDispatchTokensMin;   // tokens of a dispatch task
  int combine_tokens = kCombineTokens;        // tokens of a combine task

  EPFUSE_HD int static_tasks() const { return layout + 1 + dispatch + 1; }
  EPFUSE_HD int total() const { return static_tasks() + gemm + combine; }
};

// The task counts of a rank with num_tokens tokens whose kernel runs `ctas` CTAs, in a world of `world` ranks.
EPFUSE_HD TaskSpace make_task_space(int num_tokens, int ctas, int world) {
  TaskSpace s;
  s.layout = ceil_div(num_tokens, kLayoutTokens);
  s.dispatch_tokens = dispatch_tokens(num_tokens, ctas, world);
  s.dispatch = ceil_div(num_tokens, s.dispatch_tokens);
  s.combine_tokens = combine_tokens(num_tokens, ctas);
  s.combine = ceil_div(num_tokens, s.combine_tokens);
  return s;
}
EPFUSE_HD TaskSpace with_gemm_tasks(TaskSpace s, int gemm_tasks) {
  s.gemm = gemm_tasks;
  return s;
}

// One GEMM tile: the expert, its m-block (numbered over all local experts, ExpertPlan::mb_start) and
// n-block (of a Linear2 tile split over K, its column: n-block x parts + part, split_column).
struct GemmTile {
  int expert = 0, mblock = 0, nblock = 0;
};

// ---- Linear2's K split (the FP8 split kernel's: heuristics.h kTmaFp8M128N256Split) ----
// Where a call has fewer Linear2 tiles than CTAs by a factor of two or more and a long Linear2 K (mixtral:
// I = 14336, two experts a GPU, 32 tiles of 112 k-blocks at decode sizes, each streaming 3.7 MB of weights on
// one SM while 100 SMs idle), each tile's K is cut into `parts` runs of k-blocks, one task each; the part that
// finishes last adds every part's fp32 sums in part order and runs the tile's epilogue
// (device/ffn/split_k.cuh). The schedule is the unsplit one over nblocks2 x parts Linear2 columns (the collect
// task builds it so, and gemm_tile returns the column as the n-block), a tile's parts consecutive
// (split_column). A part is a multiple of 4 k-blocks (the FP8 tile copies a row's scales in 16-byte groups of
// 4 K blocks, gemm_mainloop_tma_fp8.cuh) and at least kSplitMinKBlocks long: a K split of 3-block parts cost
// qwen3-30b's decode rows 3-5% (docs/performance.md#the-k-split-over-ctas-2026-11-28-not-kept).
inline constexpr int kSplitKBlock = 128;      // elements of K a k-block (the FP8 tile's scale block)
inline constexpr int kSplitMinKBlocks = 16;  // k-blocks of a part, at least
EPFUSE_HD int split_part_kblocks(int k_blocks, int parts) { return (ceil_div(k_blocks, parts) + 3) / 4 * 4; }
// The parts of each Linear2 tile: as many as `slots` task slots (the CTAs, at most the workspace's split
// slots) hold for `tiles` tiles, at most k_blocks / kSplitMinKBlocks; 1 (no split) below two.
EPFUSE_HD int linear2_parts(int tiles, int k_blocks, int slots) {
  if (tiles <= 0) return 1;
  int want = slots / tiles;
  if (k_blocks / kSplitMinKBlocks < want) want = k_blocks / kSplitMinKBlocks;
  return want < 2 ? 1 : ceil_div(k_blocks, split_part_kblocks(k_blocks, want));
}
// The task slots a call's split may take: the CTAs, at most the workspace's split slots (0: no split region).
EPFUSE_HD int split_task_slots(int workspace_slots, int ctas) { return workspace_slots < ctas ? workspace_slots : ctas; }
// The parts of a call's Linear2 tiles, from its m-blocks (ExpertPlan::mb_start[L]), n-blocks of H and I: what
// the collect task builds the schedule with and each task reads its column with.
EPFUSE_HD int linear2_call_parts(int mblocks, int nblocks2, int intermediate, int slots) {
  return linear2_parts(mblocks * nblocks2, ceil_div(intermediate, kSplitKBlock), slots);
}
// The k-blocks [first, first + count) of part `part` of `parts` (every part non-empty for linear2_parts' counts).
struct KBlockRange {
  int first, count;
};
EPFUSE_HD KBlockRange split_part_range(int k_blocks, int parts, int part) {
  if (parts <= 1) return {0, k_blocks};
  const int per = split_part_kblocks(k_blocks, parts), first = part * per;
  return {first, k_blocks - first < per ? k_blocks - first : per};
}
// K elements [k0, k0 + k) of a Linear2 tile of intermediate size I (its part's, or the whole of I).
struct KSpan {
  int k0, k;
};
EPFUSE_HD KSpan linear2_k_span(int intermediate, int parts, int part) {
  const KBlockRange r = split_part_range(ceil_div(intermediate, kSplitKBlock), parts, part);
  const int k0 = r.first * kSplitKBlock, end = (r.first + r.count) * kSplitKBlock;
  return {k0, (end < intermediate ? end : intermediate) - k0};
}
// A split Linear2 task's tile (its n-block) and part, from its column of the schedule.
struct SplitColumn {
  GemmTile tile;
  int part;
};
EPFUSE_HD SplitColumn split_column(const GemmTile& column, int parts) {
  return {{column.expert, column.mblock, column.nblock / parts}, column.nblock % parts};
}
// A split tile's counter and the first of its parts' slots: tiles (m-block, n-block) in m-block order.
EPFUSE_HD int split_tile_id(const GemmTile& t, int nblocks2) { return t.mblock * nblocks2 + t.nblock; }

struct Task {
  Phase phase;
  int index;      // within the phase (layout, dispatch, combine: the token block)
  GemmTile tile;  // linear1, linear2
};

// ---- the expert plan: from counts[src][local expert] (pairs each sender sends) ----
struct ExpertPlan {
  int* rows;            // [L] pairs of expert e over all senders
  int* pair_off;        // [L] first row of expert e in h (exclusive prefix of rows)
  int* mb_start;        // [L+1] first m-block of expert e; mb_start[L] = m-blocks in all
  int* src_prefix;      // [L][world+1] first expert row of expert e that comes from sender s
  int* entry_off;       // [world][L] first entry of expert e in sender s's entry region
  uint32_t* target;     // [L] arrivals value at which expert e is complete (base + rows)
  // The GEMM schedule (build_gemm_schedule): segments of consecutive GEMM task ids, each one kind of
  // tile of one expert.
  int* segments;        // [1] segments in use
  int* seg_start;       // [2L+1] first GEMM task of segment s; seg_start[segments] = GEMM tasks in all
  int* seg_code;        // [2L] expert * 2 + kind (kSegLinear1, kSegLinear2)
};

// Carves the plan out of plan_ints(dims) ints (regions.h; keep the two in step).
EPFUSE_HD ExpertPlan plan_view(int* ints, int world, int local_experts) {
  ExpertPlan p;
  p.rows = ints;
  p.pair_off = p.rows + local_experts;
  p.mb_start = p.pair_off + local_experts;
  p.src_prefix = p.mb_start + local_experts + 1;
  p.entry_off = p.src_prefix + local_experts * (world + 1);
  p.target = reinterpret_cast<uint32_t*>(p.entry_off + world * local_experts);
  p.segments = reinterpret_cast<int*>(p.target + local_experts);
  p.seg_start = p.segments + 1;
  p.seg_code = p.seg_start + 2 * local_experts + 1;
  return p;
}

// The elements [begin, end) of n that lane `lane` of a 32-lane scan takes (layout.cuh WarpScan<true>, the
// decode kernels'): ceil(n / 32) consecutive ones a lane, so that one round of shuffles over the lanes' sums
// covers any n; the last lanes take fewer or none.
struct LaneChunk {
  int begin;
  int end;
};
EPFUSE_HD LaneChunk scan_lane_chunk(int n, int lane) {
  const int per = (n + 31) / 32;
  const int begin = lane * per < n ? lane * per : n;
  return {begin, begin + per < n ? begin + per : n};
}

// An exclusive scan by one thread: store(i, sum of load(j) for j < i) for i < n, each element loaded
// before its sum is stored; returns the sum of all n. The collect task's warp computes the same sums 32
// elements a step or each lane on a chunk of consecutive elements (layout.cuh WarpScan, scan_lane_chunk).
struct SerialScan {
  template <class Load, class Store>
  EPFUSE_HD int operator()(int n, Load&& load, Store&& store) const {
    int sum = 0;
    for (int i = 0; i < n; ++i) {
      const int v = load(i);
      store(i, sum);
      sum += v;
    }
    return sum;
  }
};

// Exclusive prefix sum of n counts into out (out may not alias counts); returns the total. Senders use
// it over their pair tickets and receivers (plan_prefixes) the same scan over the count messages: one
// definition of entry offsets.
EPFUSE_HD int exclusive_prefix(const uint32_t* counts, int n, int* out) {
  return SerialScan{}(n, [&](int i) { return static_cast<int>(counts[i]); }, [&](int i, int v) { out[i] = v; });
}

EPFUSE_HD int mblocks_of(int rows, int block_m) { return (rows + block_m - 1) / block_m; }

// The plan in two steps, so that the device runs the first one expert per thread (layout.cuh
// collect_task): the collect task's thread 0 alone took 8.5 us for the whole plan of 64 experts and
// 21 us for the schedule (docs/performance.md#start-up-layout-publish-collect).
// counts: [world][count_stride] as received, the first local_experts of each row used (the count
// messages are laid out for the workspace's capacity, count_stride >= local_experts).
// Step 1, expert e alone: where its rows come from (src_prefix, rows), and its m-block count, held in
// mb_start[e] until step 2.
EPFUSE_HD void plan_expert(const uint32_t* counts, int count_stride, int world, int e, int block_m, const ExpertPlan& p) {
  int* pre = p.src_prefix + e * (world + 1);
  int rows = 0;
  for (int s = 0; s < world; ++s) {
    pre[s] = rows;
    rows += static_cast<int>(counts[s * count_stride + e]);
  }
  pre[world] = rows;
  p.rows[e] = rows;
  p.mb_start[e] = mblocks_of(rows, block_m);
}
// Step 2, once step 1 ran for every expert: the prefix sums over experts (entry_off, pair_off,
// mb_start), each one exclusive scan. scan(n, load, store) calls store(i, sum of load(j) for j < i)
// for every i < n and returns the sum of all n; it may store element i once it has loaded element i,
// never before (mb_start is scanned in place). The collect task's warp scans them side by side
// (layout.cuh WarpScan): the serial steps took its thread 0 microseconds on the way to the
// first tile (docs/performance.md#where-a-t--1-call-goes-2026-11-28-the-timeline). Every thread of the
// scan stores mb_start[local_experts] (the same value). Returns the m-block count.
#ifdef __CUDACC__
#pragma nv_exec_check_disable
#endif
template <class Scan>
EPFUSE_HD int plan_prefixes(const uint32_t* counts, int count_stride, int world, int local_experts, const ExpertPlan& p,
                            Scan&& scan) {
  for (int s = 0; s < world; ++s) {
    const uint32_t* from = counts + s * count_stride;
    int* to = p.entry_off + s * local_experts;
    scan(local_experts, [&](int e) { return static_cast<int>(from[e]); }, [&](int e, int v) { to[e] = v; });
  }
  scan(local_experts, [&](int e) { return p.rows[e]; }, [&](int e, int v) { p.pair_off[e] = v; });
  const int mblocks = scan(local_experts, [&](int e) { return p.mb_start[e]; }, [&](int e, int v) { p.mb_start[e] = v; });
  p.mb_start[local_experts] = mblocks;
  return mblocks;
}
EPFUSE_HD int plan_prefixes(const uint32_t* counts, int count_stride, int world, int local_experts, const ExpertPlan& p) {
  return plan_prefixes(counts, count_stride, world, local_experts, p, SerialScan{});
}
// Both steps. Fills everything but target; returns the m-block count.
EPFUSE_HD int build_expert_plan(const uint32_t* counts, int count_stride, int world, int local_experts, int block_m,
                                const ExpertPlan& p) {
  for (int e = 0; e < local_experts; ++e) plan_expert(counts, count_stride, world, e, block_m, p);
  return plan_prefixes(counts, count_stride, world, local_experts, p);
}
// counts: [world][L] contiguous.
EPFUSE_HD int build_expert_plan(const uint32_t* counts, int world, int local_experts, int block_m,
                                const ExpertPlan& p) {
  return build_expert_plan(counts, local_experts, world, local_experts, block_m, p);
}

// Expert e's arrival target, once rows[e] is known: bases[e] (the arrivals counted before this call)
// plus its rows; bases[e] advances to it for the next call.
EPFUSE_HD void plan_target(const ExpertPlan& p, uint32_t* bases, int e) {
  const uint32_t target = bases[e] + static_cast<uint32_t>(p.rows[e]);
  p.target[e] = target;
  bases[e] = target;
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

// ---- the GEMM schedule ----
inline constexpr int kSegLinear1 = 0, kSegLinear2 = 1;

// The schedule with every Linear1 segment first, asked for by lag = kLinear1First (schedule_lag, world 1):
// the order of an endless lag, except that an expert without rows keeps its two segments, empty
// (gemm_tile takes the last segment that starts at or before a task, never an empty one), so that segment
// e (expert e's Linear1) and L + e (its Linear2) follow from mb_start alone, with no chain from one
// expert to the next: the serial pass took the collect task's thread 0 7-15 us at 32-64 experts, on the
// way to the first tile (docs/performance.md#start-up-layout-publish-collect).
EPFUSE_HD void linear1_first_segments(const ExpertPlan& p, int local_experts, int nblocks1, int nblocks2, int e) {
  const int L = local_experts, mblocks = p.mb_start[L];
  p.seg_start[e] = p.mb_start[e] * nblocks1;
  p.seg_code[e] = e * 2 + kSegLinear1;
  p.seg_start[L + e] = mblocks * nblocks1 + p.mb_start[e] * nblocks2;
  p.seg_code[L + e] = e * 2 + kSegLinear2;
  if (e == 0) {
    p.seg_start[2 * L] = mblocks * (nblocks1 + nblocks2);
    *p.segments = 2 * L;
  }
}

// The lag the collect task asks for, given the phase's Linear1 tasks (m-blocks x nblocks1). One wave of
// CTAs spreads the Linear2 tiles' combine stores to other ranks over the GEMM phase. At world 2, where half
// of those stores stay home, and experts of at most two m-blocks on average, a wave and a half: there a
// Linear2 segment lands within a few tasks of one wave past its expert's Linear1 tiles and one wave took
// it while the last of them still ran (qwen3-30b FP8 T=1024 0.244 -> 0.227 ms); longer segments already
// add lag at their ends, and there a wave and a half cost up to 1.3% at world 2 and 1.4-1.5% at world 4
// (docs/performance.md#a-lag-of-a-wave-and-a-half-2026-11-30). World 1 has
// none, and there the lag cost time where experts have few m-blocks: a placed Linear2 segment counts
// toward the next one's lag, so one wave in every Linear2 segment so far went ahead of the remaining
// Linear1 segments, whose Linear2 tiles then ended the phase
// (docs/performance.md#start-up-layout-publish-collect). With at most `lag` Linear1 tasks no Linear2
// segment is `lag` tasks past the end of the first Linear1 one before the last Linear1 segment is placed,
// so every Linear2 segment follows it: the kLinear1First order, built one expert per lane instead of the
// serial pass (docs/performance.md#the-plan-at-world-4-2026-11-28).
inline constexpr int kLinear1First = 0x7fffffff;
// Also where the m-blocks are at most one per local expert (a decode step's shapes): there the combine
// stores the lag spreads are a few rows, and the lagged pass on one lane took ~7 us of the collect task
// at qwen3-30b T = 8 and 32, world 4 (docs/performance.md#decode-start-up-by-more-ctas-2026-11-28).
// And where the GEMMs hide the combine without it (combine_wants_lag false): there the lag only holds Linear2
// tiles behind Linear1 tiles of their expert still running (docs/performance.md#the-gemm-order-at-world-4-a-lag-sweep-2026-11-28).
EPFUSE_HD int schedule_lag(int world, int ctas, int mblocks, int nblocks1, int local_experts, bool combine_lag) {
  const int lag = world == 2 && mblocks <= 2 * local_experts ? ctas + ctas / 2 : ctas;
  return world == 1 || !combine_lag || mblocks * nblocks1 <= lag || mblocks <= local_experts ? kLinear1First : lag;
}

// Whether the combine's stores to other ranks need the lag to spread them. A routed row costs 6 H I FLOPs
// of expert GEMMs and sends 2 H bytes back: 3 I FLOPs a byte. An H200 does about 4,100 FP8 FLOPs (1,447
// TFLOP/s) or 2,300 bf16 ones (805) in the time its NVLink (351 GB/s) moves a byte. Below that the combine
// outlasts the GEMMs beside it: qwen3-30b (I = 768), FP8. Above it the GEMMs cover the combine wherever it
// falls: dsv3 (I = 2048), mixtral (14336).
EPFUSE_HD bool combine_wants_lag(int intermediate, bool fp8) { return 3 * intermediate < (fp8 ? 4096 : 2304); }

// The lag EPFUSE_SCHEDULE_LAG asks for (FusedParams::schedule_lag_quarters >= 0), in place of
// schedule_lag's: 0 Linear1 first, n > 0 n quarter waves of `ctas` tasks (at least one task).
EPFUSE_HD int forced_lag(int quarters, int ctas) {
  if (quarters == 0) return kLinear1First;
  const int lag = quarters * ctas / 4;
  return lag > 1 ? lag : 1;
}

// Order of the GEMM tasks (built after build_expert_plan by the collect task):
//  - within an expert, n-block major: consecutive tasks share one weight n-block and walk the expert's
//    m-blocks, so the CTAs in flight read a few weight tiles at a time and L2 keeps them (m-block major
//    order had about one distinct weight tile per CTA in flight and re-read an expert's weights from HBM
//    once per m-block);
//  - Linear1 segments in expert order; the Linear2 segment of expert j right after the first Linear1
//    segment whose end is `lag` Linear1 tasks or more past the end of Linear1(j) (lag = a wave of CTAs,
//    more for short segments at world 2, so its m-blocks are mostly finished when its tiles are taken), the
//    rest after the last Linear1 segment, in expert order. The Linear2 tiles' remote combine stores then
//    spread over the GEMM phase instead of bunching at its end.
// Every Linear2 segment comes after its expert's Linear1 segment, so waits still target smaller ids.
// Every expert keeps its two segments, empty ones too (as linear1_first_segments), so that each
// segment's place and start follow from mb_start and the placements alone: the collect task's warp
// builds them one expert a lane in two steps (lagged_placement, then lagged_segments, with the lanes'
// placements in between), where a serial pass over the experts took its thread 0 ~15 us at 64 experts
// (docs/performance.md#where-a-world-2-qwen3-30b-t--1024-call-goes-2026-11-30-the-timeline). The lag
// counts Linear1 tasks only (the serial pass counted the Linear2 tasks placed between as well), which
// makes a placement independent of the others and places Linear2 segments later: with both, qwen3-30b FP8
// at world 2 took 6-12% less time (docs/performance.md#the-lagged-schedule-by-lanes-its-lag-over-linear1-tiles-2026-11-30).
// Step 1, expert j: the Linear1 segment after which Linear2(j) goes (>= j; local_experts - 1: after all).
EPFUSE_HD int lagged_placement(const ExpertPlan& p, int local_experts, int nblocks1, int lag, int j) {
  const int end_j = p.mb_start[j + 1];
  // The first e >= j with (mb_start[e + 1] - end_j) * nblocks1 >= lag: mb_start is non-decreasing.
  int lo = j, hi = local_experts - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (static_cast<int64_t>(p.mb_start[mid + 1] - end_j) * nblocks1 >= lag) hi = mid; else lo = mid + 1;
  }
  return lo;
}
// Step 2, expert e, with every expert's placement in `placed` ([L], non-decreasing, placed[j] >= j):
// Linear1(e) and Linear2(e)'s segments. Linear1(e) follows the Linear1 segments before it and the
// Linear2 segments placed before it (those of the experts j with placed[j] < e: a prefix of them);
// Linear2(e) follows Linear1(0..placed[e]) and Linear2(0..e-1).
EPFUSE_HD void lagged_segments(const ExpertPlan& p, int local_experts, int nblocks1, int nblocks2, const int* placed, int e) {
  const int L = local_experts;
  int lo = 0, hi = L;  // before_e: the first j with placed[j] >= e (L if none)
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (placed[mid] >= e) hi = mid; else lo = mid + 1;
  }
  const int before_e = lo, after = placed[e];
  p.seg_start[e + before_e] = p.mb_start[e] * nblocks1 + p.mb_start[before_e] * nblocks2;
  p.seg_code[e + before_e] = e * 2 + kSegLinear1;
  p.seg_start[after + 1 + e] = p.mb_start[after + 1] * nblocks1 + p.mb_start[e] * nblocks2;
  p.seg_code[after + 1 + e] = e * 2 + kSegLinear2;
  if (e == 0) {
    p.seg_start[2 * L] = p.mb_start[L] * (nblocks1 + nblocks2);
    *p.segments = 2 * L;
  }
}

// The schedule's steps for the experts lane, lane + lanes, ... (the collect task's warp: 32 lanes; one
// thread: 0 and 1); sync() joins the lanes between the lagged steps. lag = kLinear1First:
// linear1_first_segments. placed: scratch of local_experts ints.
template <class Sync>
EPFUSE_HD void gemm_schedule_steps(const ExpertPlan& p, int local_experts, int nblocks1, int nblocks2, int lag,
                                   int* placed, int lane, int lanes, Sync sync) {
  if (lag == kLinear1First) {
    for (int e = lane; e < local_experts; e += lanes) linear1_first_segments(p, local_experts, nblocks1, nblocks2, e);
    return;
  }
  for (int j = lane; j < local_experts; j += lanes) placed[j] = lagged_placement(p, local_experts, nblocks1, lag, j);
  sync();
  for (int e = lane; e < local_experts; e += lanes) lagged_segments(p, local_experts, nblocks1, nblocks2, placed, e);
}

// The whole schedule by one thread (the CPU tests'). Returns the GEMM task count.
EPFUSE_HD int build_gemm_schedule(const ExpertPlan& p, int local_experts, int nblocks1, int nblocks2, int lag,
                                  int* placed) {
  gemm_schedule_steps(p, local_experts, nblocks1, nblocks2, lag, placed, 0, 1, [] {});
  return p.mb_start[local_experts] * (nblocks1 + nblocks2);
}

// GEMM task `index` (< the schedule's total): its segment by binary search, then n-block major.
EPFUSE_HD GemmTile gemm_tile(const ExpertPlan& p, int index, int* kind) {
  int lo = 0, hi = *p.segments - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (p.seg_start[mid] <= index) lo = mid; else hi = mid - 1;
  }
  const int expert = p.seg_code[lo] / 2;
  *kind = p.seg_code[lo] % 2;
  const int mblocks = p.mb_start[expert + 1] - p.mb_start[expert];
  const int j = index - p.seg_start[lo];
  return {expert, p.mb_start[expert] + j % mblocks, j / mblocks};
}

// Whether this call reads expert e's weights once: one m-block, so each of its weight tiles goes through
// one GEMM tile. The FP8 tile then loads them with an L2 evict_first hint: at small T the weights are a
// stream larger than L2 that would otherwise push out, every call, the code and the small data the next
// call reads first (docs/performance.md#the-evict-first-hint: qwen3 FP8 T=128 0.127 -> 0.107 ms on an H100).
EPFUSE_HD bool weights_read_once(const ExpertPlan& p, int expert) { return p.mb_start[expert + 1] - p.mb_start[expert] == 1; }

// Decodes a task id. Ids past the static phases need the schedule (with_gemm_tasks, plan) first.
EPFUSE_HD Task decode_task(const TaskSpace& s, const ExpertPlan& plan, int id) {
  if (id < s.layout) return {Phase::kLayout, id, {}};
  id -= s.layout;
  if (id < 1) return {Phase::kPublish, 0, {}};
  id -= 1;
  if (id < 1) return {Phase::kCollect, 0, {}};
  id -= 1;
  if (id < s.dispatch) return {Phase::kDispatch, id, {}};
  id -= s.dispatch;
  if (id < s.gemm) {
    int kind = kSegLinear1;
    const GemmTile tile = gemm_tile(plan, id, &kind);
    return {kind == kSegLinear1 ? Phase::kLinear1 : Phase::kLinear2, id, tile};
  }
  id -= s.gemm;
  if (id < s.combine) return {Phase::kCombine, id, {}};
  return {Phase::kDone, 0, {}};
}

}  // namespace epfuse::device
