// The expert FFN tiles (the GEMM tasks), with a tile GEMM (gemm_mainloop*.cuh) for the math and the
// epilogues of epilogue.cuh for the output; this file decides which rows a tile reads and what it waits
// for:
//   Linear1 tile (m-block, n-block of 2I): waits for its expert's arrivals, gathers the received rows,
//     SwiGLU with the pair's top-k weight -> h (local, bf16), counts itself done for the m-block.
//   Linear2 tile (m-block, n-block of H): waits for the m-block's Linear1 tiles, stages the bf16 output
//     in smem and writes each row into its home rank's combine slot (token, top-k slot) with 16-byte
//     stores over NVLink, then one release add per row on the token's counter at home.
// ExpertTiles runs a tile on all threads (TileGemm, TileGemmWgmma); WarpSpecialisedTiles splits it
// between the producer and math roles of a TileGemmTma CTA (fused_kernel.cu).
#pragma once
#include <concepts>
#include <cstdint>

#include <cuda_bf16.h>

#include "device/diagnostics/trace.cuh"
#include "device/ffn/epilogue.cuh"
#include "device/ffn/split_k.cuh"
#include "device/gemm/gemm_mainloop.cuh"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/kernel/context.cuh"
#include "device/kernel/scheduler.cuh"
#include "device/kernel/wait.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/thread_group.cuh"

namespace epfuse::device {

// The rows [row0, row0 + rows) of expert `expert` a GEMM tile of block_m rows covers.
struct TileRows {
  int expert, row0, rows;
};
template <class Transport>
__device__ __forceinline__ TileRows tile_rows(const FusedContext<Transport>& c, const GemmTile& tile, int block_m) {
  const int row0 = (tile.mblock - c.plan.mb_start[tile.expert]) * block_m;
  return {tile.expert, row0, min(block_m, c.plan.rows[tile.expert] - row0)};
}

// Expert row w.row0 + i as its sender wrote it: the sender (the row's home rank), the token there, the
// top-k slot, the weight, and where the row is (the receive region, or x for this rank's own tokens).
struct ResolvedRow {
  const __nv_bfloat16* a;
  int home, token, slot;
  float weight;
};
template <class Transport>
__device__ __forceinline__ ResolvedRow resolve_row(const FusedContext<Transport>& c, const TileRows& w, int i) {
  const FusedParams& prm = *c.prm;
  const RowSource src = row_source(c.plan, prm.dims.world, c.local_experts, w.expert, w.row0 + i);
  const int4 raw = __ldcg(local_ptr<int4>(c, recv_entry_offset(prm.sym, prm.capacity, c.parity, src.src, src.entry)));
  const RowEntry entry = *reinterpret_cast<const RowEntry*>(&raw);
  const __nv_bfloat16* a =
      src.src == prm.rank
          ? prm.x + static_cast<int64_t>(entry.row) * prm.dims.hidden
          : local_ptr<const __nv_bfloat16>(c, recv_row_offset(prm.sym, prm.capacity, c.parity, prm.rank, src.src, entry.row));
  return {a, src.src, entry.token, entry.slot, entry.weight};
}

// Per tile row, resolved once per tile (in shared memory): where its A row is (nullptr: padding) and
// what its epilogue needs. fill(i, ...) writes row i (< rows) or marks it padding.
template <int kRows>
struct RowTableOf {
  const __nv_bfloat16* a[kRows];
  float weight[kRows];
  int home[kRows];
  int token[kRows];
  int slot[kRows];

  template <class Transport>
  __device__ void fill(const FusedContext<Transport>& c, const TileRows& w, int i) {
    a[i] = nullptr;
    if (i >= w.rows) return;
    const ResolvedRow r = resolve_row(c, w, i);
    home[i] = r.home;
    token[i] = r.token;
    slot[i] = r.slot;
    weight[i] = r.weight;
    a[i] = r.a;
  }
};

// The counter a tile's inputs are counted on: a Linear1 tile needs every sender's rows of its expert
// (arrivals: `need` rows past `base`), a Linear2 tile every Linear1 tile of its m-block (l1_done:
// `need` = l1_tiles of them, into h).
struct TileInputs {
  const uint32_t* counter;
  bool arrivals;
  uint32_t base, need;
  WaitSite site;

  template <class Transport>
  __device__ uint32_t load(const FusedContext<Transport>& c) const {
    return arrivals ? peer_acquire(c, counter) : ld_acquire_gpu(counter);
  }
  __device__ bool in(uint32_t v) const { return arrivals ? counter_reached(v, base, need) : v >= need; }
};
template <class Transport>
__device__ __forceinline__ TileInputs tile_inputs(const FusedContext<Transport>& c, Phase phase, const GemmTile& tile,
                                                  int l1_tiles) {
  const FusedParams& prm = *c.prm;
  if (phase == Phase::kLinear1) {
    const uint32_t rows = static_cast<uint32_t>(c.plan.rows[tile.expert]);
    return {local_ptr<uint32_t>(c, arrival_offset(prm.sym, prm.capacity, c.parity, tile.expert)), true,
            c.plan.target[tile.expert] - rows, rows, c.site(Phase::kLinear1, WaitKind::kArrivals, tile.expert)};
  }
  return {c.l1_done + tile.mblock, false, 0u, static_cast<uint32_t>(l1_tiles),
          c.site(Phase::kLinear2, WaitKind::kLinear1, tile.mblock, tile.expert)};
}

// Waits (group g) until a tile's inputs are in (tile_inputs). False when the wait was abandoned
// (recorded).
template <class Transport>
__device__ __forceinline__ bool wait_tile_inputs(const FusedContext<Transport>& c, const ThreadGroup& g, Phase phase,
                                                 const GemmTile& tile, int l1_tiles) {
  const TileInputs t = tile_inputs(c, phase, tile, l1_tiles);
  return group_wait(g, *c.prm, c.ctl, t.site, t.need, [&] { return t.load(c); }, [&](uint32_t v) { return t.in(v); });
}
// Whether a tile's inputs are in now (one poll by g's leader; every thread of g gets the answer).
template <class Transport>
__device__ __forceinline__ bool tile_inputs_in(const FusedContext<Transport>& c, const ThreadGroup& g, Phase phase,
                                               const GemmTile& tile, int l1_tiles) {
  bool in = false;
  if (g.leader()) {
    const TileInputs t = tile_inputs(c, phase, tile, l1_tiles);
    in = t.in(t.load(c));
  }
  return g.sync_or(in);
}

// A tile's operand pipeline ran out of time (one thread calls it): record it and stop; the abort ends
// every other wait.
template <class Transport>
__device__ __forceinline__ void pipeline_failed(const FusedContext<Transport>& c, Phase phase, const GemmTile& tile) {
  report_timeout(c.ctl, c.prm->rank, c.site(phase, WaitKind::kPipeline, tile.mblock, tile.nblock), 0, 0);
}

template <class Gemm>
struct ExpertTiles {
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static_assert(kBlockN % kSignalCols == 0, "a Linear2 tile signals whole column groups");
  static_assert(kBlockM >= kMinBlockM, "l1_done is sized for m-blocks of at least kMinBlockM rows");

  using RowTable = RowTableOf<kBlockM>;  // after the GEMM's smem
  static constexpr int kSmemBytes = Gemm::kSmemBytes + static_cast<int>(sizeof(RowTable));
  using Epilogue = TileEpilogue<Gemm>;

  using Where = TileRows;
  template <class Transport>
  __device__ static Where locate(const FusedContext<Transport>& c, const GemmTile& tile) { return tile_rows(c, tile, kBlockM); }

  template <class Transport>
  __device__ static void load_entries(const FusedContext<Transport>& c, const Where& w, RowTable& t) {
    for (int i = threadIdx.x; i < kBlockM; i += blockDim.x) t.fill(c, w, i);
  }

  template <class Transport>
  __device__ static void linear1(const FusedContext<Transport>& c, const GemmTile& tile, void* smem) {
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden, I = prm.dims.intermediate;
    const Where w = locate(c, tile);
    if (!wait_tile_inputs(c, ThreadGroup::cta(), Phase::kLinear1, tile, 0)) return;
    RowTable& t = *reinterpret_cast<RowTable*>(static_cast<char*>(smem) + Gemm::kSmemBytes);
    load_entries(c, w, t);
    __syncthreads();
    const int n_out0 = tile.nblock * (kBlockN / 2);
    typename Gemm::Accum acc;
    Gemm::mainloop([&](int i) { return t.a[i]; },
                   swiglu_b_row(prm.w13 + static_cast<int64_t>(w.expert) * 2 * I * H, H, I, n_out0), H, smem, acc,
                   weights_read_once(c.plan, w.expert));
    Epilogue::linear1(c, acc, tile, w, t, n_out0, I, smem);
  }

  template <class Transport>
  __device__ static void linear2(const FusedContext<Transport>& c, const GemmTile& tile, void* smem) {
    const FusedParams& prm = *c.prm;
    const FusedDims& d = prm.dims;
    const int H = d.hidden, I = d.intermediate;
    const Where w = locate(c, tile);
    if (!wait_tile_inputs(c, ThreadGroup::cta(), Phase::kLinear2, tile, 2 * I / kBlockN)) return;
    RowTable& t = *reinterpret_cast<RowTable*>(static_cast<char*>(smem) + Gemm::kSmemBytes);
    load_entries(c, w, t);
    const __nv_bfloat16* h = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0) * I;
    for (int i = threadIdx.x; i < kBlockM; i += blockDim.x) t.a[i] = i < w.rows ? h + static_cast<int64_t>(i) * I : nullptr;
    __syncthreads();
    const int n0 = tile.nblock * kBlockN;
    typename Gemm::Accum acc;
    Gemm::mainloop([&](int i) { return t.a[i]; }, dense_b_row(prm.w2 + static_cast<int64_t>(w.expert) * H * I, I, n0),
                   I, smem, acc, weights_read_once(c.plan, w.expert));
    Epilogue::linear2(c, acc, w, t, n0, smem);
  }
};

// The tiles of a warp-specialised tile GEMM (TileGemmTma, gemm_mainloop_tma.cuh), by role
// (fused_kernel.cu runs the roles' loops; scheduler.cuh TaskQueue hands each task from one to the other):
//   producer warpgroup (warps 0-3): prepare (waits for a tile's inputs, fills its row table) and load
//     (issues all its operand loads into the ring);
//   math warpgroups (warps 4-11): linear1 / linear2 (the wgmma k-loop, then the epilogue: epilogue.cuh
//     FragmentStores, from the registers), freeing the task's slot once the epilogue no longer reads
//     the row table.
// WarpSpecialisedTileRoles holds what every operand format shares (the roles, the queue, the math
// k-loop and Linear2); WarpSpecialisedTiles (bf16, below) and WarpSpecialisedFp8Tiles (expert_ffn_fp8.cuh)
// add their operands (prepare, b_operand, load) and their Linear1 epilogue. The kernel runs either through
// the RoleTiles concept (end of this file).
// A block's shared memory on sm_90 (227 KiB), and the part of it the kernel's static shared variables
// (profile, scheduler, combine) may take: the dynamic shared memory's budget is the difference.
inline constexpr int kBlockSmemBytes = 227 * 1024;
inline constexpr int kStaticSmemBytes = 2048;

template <class Gemm_>
struct WarpSpecialisedTileRoles {
  using Gemm = Gemm_;
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static_assert(kBlockN % kSignalCols == 0, "a Linear2 tile signals whole column groups");
  static_assert(kBlockM >= kMinBlockM, "l1_done is sized for m-blocks of at least kMinBlockM rows");
  static_assert(kBlockM <= Gemm::kConsumerThreads, "one math thread signals each tile row");

  // Filled by the producer; the math warps' epilogue reads all but `a`.
  using RowTable = RowTableOf<kBlockM>;
  // A task as handed on, with the tile's geometry, which the producer has read anyway: plan reads after
  // the k-loop would put their latency between the math warps' k-loop and their stores.
  struct Posted {
    Task task;
    int rows;       // the tile's real rows
    int64_t h_row;  // its first row in h
  };
  using Queue = TaskQueue<Posted, RowTable>;
  struct Shared {
    Queue queue;
  };
  static constexpr int kSharedOffset = (Gemm::kSmemBytes + 15) / 16 * 16;
  static constexpr int kSmemBytes = kSharedOffset + static_cast<int>(sizeof(Shared));
  static_assert(kSmemBytes + kStaticSmemBytes <= kBlockSmemBytes, "ring + staging + row tables fit one SM");

  __device__ static Shared& shared(void* smem) { return *reinterpret_cast<Shared*>(static_cast<char*>(smem) + kSharedOffset); }
  __device__ static ThreadGroup producers() { return {0, Gemm::kProducerThreads, 1}; }
  __device__ static ThreadGroup consumers() { return {Gemm::kProducerThreads, Gemm::kConsumerThreads, 2}; }
  __device__ static bool is_gemm(Phase p) { return p == Phase::kLinear1 || p == Phase::kLinear2; }

  // Once per launch, by the whole CTA.
  __device__ static void init(void* smem) {
    if (threadIdx.x == 0) shared(smem).queue.init();
    Gemm::init(smem);  // arms the ring, fences the barriers' init and synchronises the CTA
  }

  // ---- math warpgroups ----
  // The k-loop of a tile of `rows` real rows; false (group-uniform, recorded) when its pipeline ran out
  // of time.
  template <class Transport>
  __device__ static bool mainloop(const FusedContext<Transport>& c, const GemmTile& tile, Phase phase, int K, int rows,
                                  typename Gemm::RingPos& ring, void* smem, typename Gemm::Accum& acc,
                                  const ThreadGroup& g) {
    return run_kloop(c, tile, phase, g, [&](const WaitLimit& limit) { return Gemm::mainloop(ring, K, rows, smem, acc, limit); });
  }
  // A tile's k-loop kloop(limit) (a form of Gemm's), its failure recorded and made group-uniform.
  template <class Transport, class KLoop>
  __device__ static bool run_kloop(const FusedContext<Transport>& c, const GemmTile& tile, Phase phase, const ThreadGroup& g,
                                   KLoop kloop) {
    const bool ok = kloop(c.limit(c.prm->timeout_ns));
    if (!ok) pipeline_failed(c, phase, tile);
    trace::stamp_current(g.leader(), trace::kLoopEnd);
    const bool failed = g.sync_or(!ok);
    trace::stamp_current(g.leader(), trace::kLoopSynced);
    return !failed;
  }

  // The Linear2 tile posted in slot s.
  template <class Transport>
  __device__ static void linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                 typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const GemmTile& tile = posted.task.tile;
    typename Gemm::Accum acc;
    if (!mainloop(c, tile, Phase::kLinear2, c.prm->dims.intermediate, posted.rows, ring, smem, acc, g))
      return sh.queue.release(s, g);
    finish_linear2(c, posted, sh, s, g, [&](const RowTable& t) { FragmentStores<Gemm>::linear2(c, acc, tile, posted.rows, t, g); });
  }
  // A part of a Linear2 tile split over K: the k-loop over its part's K, then, in the part that finishes last,
  // the sum of every part's (split_k.cuh) and the tile's epilogue.
  template <class Transport>
  __device__ static void split_linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                       typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const Linear2Part p = linear2_part(c, posted.task.tile);
    typename Gemm::Accum acc;
    if (!mainloop(c, p.tile, Phase::kLinear2, p.k.k, posted.rows, ring, smem, acc, g)) return sh.queue.release(s, g);
    // A warp of the 64-row layout holds 16 rows (gemm_maps_wgmma.h wgmma_c_coord): of padding, it has no sums.
    const bool active = (g.rank() / 128) * kWgmmaM + (g.rank() % 128) / 32 * 16 < posted.rows;
    if (!split_k_meet(*c.prm, p, c.prm->dims.hidden / kBlockN, acc.v, active, g)) return sh.queue.release(s, g);
    finish_linear2(c, posted, sh, s, g, [&](const RowTable& t) { FragmentStores<Gemm>::linear2(c, acc, p.tile, posted.rows, t, g); });
  }
  // A Linear2 task of the split kernel: its tile and part (task_map.h split_column) and its part's K.
  template <class Transport>
  __device__ static Linear2Part linear2_part(const FusedContext<Transport>& c, const GemmTile& column) {
    const FusedDims& d = c.prm->dims;
    const int parts = linear2_call_parts(c.plan.mb_start[c.local_experts], d.hidden / kBlockN, d.intermediate, split_slot_count(*c.prm));
    const SplitColumn sc = split_column(column, parts);
    return {sc.tile, sc.part, parts, linear2_k_span(d.intermediate, parts, sc.part)};
  }
  // A Linear1 tile after its epilogue's stores (ending in a barrier of g): the slot is freed and the tile
  // counted on its m-block's l1_done.
  template <class Transport>
  __device__ static void finish_linear1(const FusedContext<Transport>& c, const GemmTile& tile, Shared& sh, int s,
                                        const ThreadGroup& g) {
    trace::stamp_current(g.leader(), trace::kEpiStored);
    sh.queue.release(s, g);
    if (g.leader()) l1_tile_done(c, tile);
  }
  // A Linear2 tile after its k-loop: store(t) writes its rows into the combine slots (ending in a barrier
  // of g), then the slot is freed and each row signalled at home.
  template <class Transport, class Store>
  __device__ static void finish_linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                        const ThreadGroup& g, Store store) {
    const int rows = posted.rows;
    const RowTable& t = sh.queue.table[s];
    // Thread r signals row r once the tile's stores are out; read its home and token before the slot goes.
    const int own = g.rank();
    const int home = own < rows ? t.home[own] : 0, token = own < rows ? t.token[own] : 0;
    store(t);
    trace::stamp_current(g.leader(), trace::kEpiStored);
    sh.queue.release(s, g);
    if (own < rows) signal_home(c, home, token, signal_units(kBlockN));
  }
};

// The bf16 operands (TileGemmTma): A = the tile's bf16 rows (x rows for Linear1, h rows for Linear2), B =
// w13's or w2's rows by TMA; Linear1's epilogue is FragmentStores::linear1 (bf16 h).
template <class Gemm_>
struct WarpSpecialisedTiles : WarpSpecialisedTileRoles<Gemm_> {
  using Roles = WarpSpecialisedTileRoles<Gemm_>;
  using Gemm = Gemm_;
  static constexpr bool kSplitLinear2 = false;  // bf16 Linear2 tiles are never split (split_k.cuh)
  using typename Roles::Posted;
  using typename Roles::RowTable;
  using typename Roles::Shared;
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  // A producer thread's A operands of a tile (prepare -> load): its rows.
  using ARows = const __nv_bfloat16* [Gemm::kProducerRows];

  // ---- producer warpgroup ----
  // A GEMM tile whose inputs are in (wait_tile_inputs): fills its row table t, and a_rows with this
  // thread's A rows of it; w: the tile's rows.
  template <class Transport>
  __device__ __forceinline__ static void prepare(const FusedContext<Transport>& c, const ThreadGroup& g, const Task& task,
                                                 int I, RowTable& t, const __nv_bfloat16* (&a_rows)[Gemm::kProducerRows],
                                                 TileRows& w) {
    w = tile_rows(c, task.tile, kBlockM);
    for (int i = g.rank(); i < kBlockM; i += g.count) {
      t.fill(c, w, i);
      // Linear2 reads the tile's rows of h (the entries still give the rows' homes and tokens).
      if (task.phase == Phase::kLinear2 && i < w.rows)
        t.a[i] = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0 + i) * I;
    }
    g.sync();  // the table is complete before it is read and posted
#pragma unroll
    for (int i = 0; i < Gemm::kProducerRows; ++i) a_rows[i] = t.a[Gemm::producer_row(g.rank(), i)];
  }

  // The weight operand of a GEMM tile.
  template <class Transport>
  __device__ static typename Gemm::BOperand b_operand(const FusedContext<Transport>& c, const Task& task) {
    const FusedParams& prm = *c.prm;
    const bool l1 = task.phase == Phase::kLinear1;
    static_assert(kBlockN == 2 * kWeightBoxRows, "two weight boxes per stage (tma_weight_rows)");
    const TmaWeightRows r =
        tma_weight_rows(l1, task.tile.expert, task.tile.nblock, prm.dims.hidden, prm.dims.intermediate);
    return {l1 ? static_cast<const void*>(&prm.w13_map) : static_cast<const void*>(&prm.w2_map), r.row0, r.row1};
  }

  // Issues every operand load of a prepared GEMM tile into the ring, but the weights of its first
  // `preloaded` k-blocks (preload_weights). False (group-uniform, recorded) when a wait for a free stage ran out.
  template <class Transport>
  __device__ __forceinline__ static bool load(const FusedContext<Transport>& c, const ThreadGroup& g, const Task& task,
                                              const __nv_bfloat16* const (&a_rows)[Gemm::kProducerRows], int H, int I,
                                              typename Gemm::RingPos& ring, void* smem, int preloaded) {
    const FusedParams& prm = *c.prm;
    const bool l1 = task.phase == Phase::kLinear1;
    const bool loaded =
        Gemm::load_tile(ring, a_rows, b_operand(c, task), l1 ? H : I, smem, c.limit(prm.timeout_ns), preloaded);
    if (!loaded) pipeline_failed(c, task.phase, task.tile);
    return !g.sync_or(!loaded);
  }

  // ---- math warpgroups (the k-loop and Linear2 are the roles') ----
  // The Linear1 tile posted in slot s.
  template <class Transport>
  __device__ static void linear1(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                 typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const int H = c.prm->dims.hidden, I = c.prm->dims.intermediate;
    const GemmTile& tile = posted.task.tile;
    typename Gemm::Accum acc;
    if (!Roles::mainloop(c, tile, Phase::kLinear1, H, posted.rows, ring, smem, acc, g)) return sh.queue.release(s, g);
    FragmentStores<Gemm>::linear1(c, acc, tile, posted.h_row, I, posted.rows, sh.queue.table[s], g);
    Roles::finish_linear1(c, tile, sh, s, g);
  }
};

// K of a GEMM tile: H for Linear1, I for Linear2 (its part's, where Tiles split Linear2: kSplitLinear2).
template <class Tiles, class Transport>
__device__ __forceinline__ int tile_k(const FusedContext<Transport>& c, const Task& task) {
  if constexpr (Tiles::kSplitLinear2)
    if (task.phase == Phase::kLinear2) return Tiles::linear2_part(c, task.tile).k.k;
  return task.phase == Phase::kLinear1 ? c.prm->dims.hidden : c.prm->dims.intermediate;
}

// Producer warpgroup of a warp-specialised CTA, before it waits for a GEMM tile's inputs: thread 0
// issues the weights of the tile's first k-blocks (Gemm::load_weights), which need no inputs, so that
// they stream while the tile waits for its rows (the dispatch's, or its expert's Linear1 tiles). Returns
// how many k-blocks (load's `preloaded`), or -1 (group-uniform, recorded) when a wait for a free stage
// ran out.
template <class Tiles, class Transport>
__device__ __forceinline__ int preload_weights(const FusedContext<Transport>& c, const ThreadGroup& g, const Task& task,
                                               const typename Tiles::Gemm::RingPos& ring, void* smem) {
  using Gemm = typename Tiles::Gemm;
  const FusedParams& prm = *c.prm;
  const int K = tile_k<Tiles>(c, task);
  bool ok = true;
  if (g.leader()) {
    ok = Gemm::load_weights(ring, Tiles::b_operand(c, task), K, smem, c.limit(prm.timeout_ns));
    if (!ok) pipeline_failed(c, task.phase, task.tile);
  }
  // The leader's warp arrives whole: barrier.red allows a diverged warp, but then compute-sanitizer's
  // synccheck reports every such arrival, and a check that always reports cannot catch a real one.
  return g.sync_or<true>(!ok) ? -1 : Gemm::preload_blocks(K);
}

// Producer warpgroup: after preload_weights, when the tile will not be loaded (its inputs' wait failed).
template <class Tiles, class Transport>
__device__ __forceinline__ void drop_weights(const FusedContext<Transport>& c, const Task& task,
                                             const typename Tiles::Gemm::RingPos& ring, void* smem) {
  const FusedParams& prm = *c.prm;
  Tiles::Gemm::drop_weights(ring, tile_k<Tiles>(c, task), smem, c.limit(prm.timeout_ns));
}

// What the kernel's roles (fused_kernel.cu producer_role / math_role) call on the tiles of a
// warp-specialised tile GEMM, whatever its operand format, checked as the tile GEMM contract is
// (gemm/tile_gemm.cuh).
template <class T, class Transport>
concept RoleTiles =
    requires(const FusedContext<Transport>& c, const ThreadGroup& g, const Task& task, int n, void* smem,
             typename T::RowTable& table, typename T::ARows& a_rows, TileRows& w, typename T::Gemm::RingPos& ring,
             const typename T::Posted& posted, typename T::Shared& sh) {
      { T::init(smem) } -> std::same_as<void>;
      { T::producers() } -> std::same_as<ThreadGroup>;
      { T::consumers() } -> std::same_as<ThreadGroup>;
      { T::is_gemm(task.phase) } -> std::same_as<bool>;
      { T::shared(smem) } -> std::same_as<typename T::Shared&>;
      { T::prepare(c, g, task, n, table, a_rows, w) } -> std::same_as<void>;
      { T::b_operand(c, task) } -> std::same_as<typename T::Gemm::BOperand>;
      { T::load(c, g, task, a_rows, n, n, ring, smem, n) } -> std::same_as<bool>;
      { T::linear1(c, posted, sh, n, ring, smem, g) } -> std::same_as<void>;
      { T::linear2(c, posted, sh, n, ring, smem, g) } -> std::same_as<void>;
    };

}  // namespace epfuse::device
