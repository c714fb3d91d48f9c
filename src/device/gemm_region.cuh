// The GEMM region of a warp-specialised CTA (TileGemmTma, gemm_mainloop_tma.cuh). A CTA runs its
// layout / publish / dispatch / collect tasks on all its threads; at its first task from the GEMM phase
// on (task_map.h: GEMM tiles, then combine) it splits for good:
//   producer warpgroup (warps 0-3, kProducerRegs registers): takes task ids, waits for a tile's inputs,
//     reads its row table, issues all its operand loads into the ring, and hands the task to the math
//     warps through a two-slot queue in shared memory; then takes the next id while they compute.
//   math warpgroups (warps 4-11, kConsumerRegs registers): run each handed-on task: a GEMM tile's
//     wgmma k-loop and epilogue (Linear1 -> h, Linear2 -> the home ranks' combine slots), or a combine
//     task (one warp per token); then free the slot.
// The producer runs at most one task ahead (two slots): it claims task n + 1 only after issuing every
// load of task n, so the math warps never wait for a producer stuck in a later task's wait, and taking
// ids in order still cannot deadlock (a task waits only for smaller ids; docs/fused_design.md).
//   slot_full[s]:  the producer posted task[s] (its row table is filled): 1 arrival.
//   slot_empty[s]: the math warps are done with task[s] and table[s]: 1 arrival.
// Epilogues (epilogue.cuh StagedPasses) stage 64 output columns at a time beside the ring, which stays
// busy with the next tile's loads, and write them in 16-byte chunks.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/combine.cuh"
#include "device/context.cuh"
#include "device/epilogue.cuh"
#include "device/wait.cuh"
#include "device/expert_ffn.cuh"
#include "device/mbarrier.cuh"
#include "device/profile.cuh"
#include "device/ptx.cuh"
#include "device/scheduler.cuh"
#include "device/thread_group.cuh"

namespace epfuse::device {

template <class Gemm>
struct GemmRegion {
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static constexpr int kSlots = 2;
  using Epilogue = StagedPasses<Gemm>;
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
  struct Shared {
    __nv_bfloat16 stage[Epilogue::kStageElems];
    RowTable table[kSlots];
    Posted posted[kSlots];
    uint64_t slot_full[kSlots];
    uint64_t slot_empty[kSlots];
  };
  static constexpr int kSharedOffset = (Gemm::kSmemBytes + 15) / 16 * 16;
  static constexpr int kSmemBytes = kSharedOffset + static_cast<int>(sizeof(Shared));
  // 227 KiB per block, less a little for the kernel's static shared variables (profile, scheduler).
  static_assert(kSmemBytes + 1024 <= 227 * 1024, "ring + staging + row tables fit one SM");

  __device__ static Shared& shared(void* smem) { return *reinterpret_cast<Shared*>(static_cast<char*>(smem) + kSharedOffset); }
  __device__ static ThreadGroup producers() { return {0, Gemm::kProducerThreads, 1}; }
  __device__ static ThreadGroup consumers() { return {Gemm::kProducerThreads, Gemm::kConsumerThreads, 2}; }

  // Once per launch, by the whole CTA.
  __device__ static void init(void* smem) {
    if (threadIdx.x == 0) {
      Shared& sh = shared(smem);
      for (int s = 0; s < kSlots; ++s) {
        ptx::mbar_init(ptx::smem_u32(&sh.slot_full[s]), 1);
        ptx::mbar_init(ptx::smem_u32(&sh.slot_empty[s]), 1);
      }
    }
    Gemm::init(smem);  // arms the ring, fences the barriers' init and synchronises the CTA
  }

  // Every thread of the CTA, with its first task from the GEMM phase on; the CTA ends in here.
  template <class Transport>
  __device__ static void run(const FusedContext<Transport>& c, TaskScheduler<Transport>& scheduler, TaskProfiler& profiler, Task first,
                             void* smem) {
    if (threadIdx.x < Gemm::kProducerThreads) {
      ptx::setmaxnreg_dec<Gemm::kProducerRegs>();
      produce(c, scheduler, first, smem);
    } else {
      ptx::setmaxnreg_inc<Gemm::kConsumerRegs>();
      consume(c, scheduler, profiler, smem);
    }
  }

 private:
  template <class Transport>
  __device__ static WaitLimit limit(const FusedContext<Transport>& c, uint64_t timeout_ns) {
    return {globaltimer_ns() + timeout_ns, &c.ctl->abort};
  }
  __device__ static bool is_gemm(Phase p) { return p == Phase::kLinear1 || p == Phase::kLinear2; }

  // A slot barrier's phase (bounded: the other side may sit in a wait of its own bounded by the
  // timeout, so this one allows twice that before it reports the slot).
  template <class Transport>
  __device__ static bool wait_slot(const FusedContext<Transport>& c, uint64_t& bar, uint32_t parity, int slot) {
    return mbar_wait(ptx::smem_u32(&bar), parity, limit(c, 2 * c.prm->timeout_ns),
                     [&] { report_timeout(c.ctl, c.prm->rank, c.site(Phase::kDone, WaitKind::kTaskSlot, slot), 0, 0); });
  }

  // ---- producer warpgroup ----
  template <class Transport>
  __device__ static void produce(const FusedContext<Transport>& c, TaskScheduler<Transport>& scheduler, Task task, void* smem) {
    const ThreadGroup g = producers();
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden, I = prm.dims.intermediate;
    Shared& sh = shared(smem);
    typename Gemm::RingPos ring;
    for (uint32_t n = 0;; ++n) {
      const int s = static_cast<int>(n % kSlots);
      // The math warps are done with the slot's previous task (a fresh barrier passes parity 1).
      if (g.sync_or(!wait_slot(c, sh.slot_empty[s], ((n / kSlots) & 1u) ^ 1u, s))) break;
      const bool gemm = is_gemm(task.phase);
      bool ok = true;
      const __nv_bfloat16* a_rows[Gemm::kProducerRows] = {};  // this thread's A rows of the tile
      TileRows w{};
      if (gemm && (ok = wait_tile_inputs(c, g, task.phase, task.tile, 2 * I / kBlockN))) {
        w = tile_rows(c, task.tile, kBlockM);
        RowTable& t = sh.table[s];
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
      if (g.leader()) {
        sh.posted[s] = {ok ? task : Task{Phase::kDone, 0, {}}, w.rows,
                        gemm ? static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0 : 0};
        ptx::mbar_arrive(ptx::smem_u32(&sh.slot_full[s]));  // release: the table and task go with it
      }
      if (!ok || task.phase == Phase::kDone) break;
      if (gemm) {
        const bool l1 = task.phase == Phase::kLinear1;
        // Rows of prm.w13_map ([L * 2I, H]: gate rows, then up rows I further) or prm.w2_map ([L * H, I]).
        const int row0 = l1 ? task.tile.expert * 2 * I + task.tile.nblock * (kBlockN / 2)
                            : task.tile.expert * H + task.tile.nblock * kBlockN;
        const typename Gemm::BOperand b{l1 ? static_cast<const void*>(&prm.w13_map) : static_cast<const void*>(&prm.w2_map),
                                        row0, row0 + (l1 ? I : kBlockN / 2)};
        const bool loaded = Gemm::load_tile(ring, a_rows, b, l1 ? H : I, smem, limit(c, prm.timeout_ns));
        if (!loaded) pipeline_failed(c, task.phase, task.tile);
        if (g.sync_or(!loaded)) break;
      }
      task = scheduler.next(g);
    }
    ptx::cp_async_wait_all();  // leave no copy in flight behind an exited thread
  }

  // ---- math warpgroups ----
  template <class Transport>
  __device__ static void consume(const FusedContext<Transport>& c, TaskScheduler<Transport>& scheduler, TaskProfiler& profiler, void* smem) {
    const ThreadGroup g = consumers();
    Shared& sh = shared(smem);
    typename Gemm::RingPos ring;
    for (uint32_t n = 0;; ++n) {
      const int s = static_cast<int>(n % kSlots);
      const bool failed = g.sync_or(!wait_slot(c, sh.slot_full[s], (n / kSlots) & 1u, s));
      const Posted posted = sh.posted[s];
      const Task& task = posted.task;
      profiler.after_next(static_cast<int>(Phase::kDone), g);
      if (failed || task.phase == Phase::kDone) break;
      // A GEMM tile frees its slot once its epilogue no longer reads the row table, before its release
      // adds (a gpu / sys scope release waits ~1 us for the CTA's stores; only the adding threads wait).
      switch (task.phase) {
        case Phase::kLinear1: linear1(c, posted, sh, s, ring, smem, g); break;
        case Phase::kLinear2: linear2(c, posted, sh, s, ring, smem, g); break;
        default:
          free_slot(sh, s, g);
          if (task.phase == Phase::kCombine) combine_task(c, task.index, g);
          break;
      }
      profiler.after_task(static_cast<int>(task.phase), g);
    }
    profiler.flush(g);
    scheduler.finish(g);
  }

  __device__ static void free_slot(Shared& sh, int s, const ThreadGroup& g) {
    if (g.leader()) ptx::mbar_arrive(ptx::smem_u32(&sh.slot_empty[s]));
  }

  // The tile's k-loop; false (group-uniform, recorded) when its pipeline ran out of time.
  template <class Transport>
  __device__ static bool mainloop(const FusedContext<Transport>& c, const GemmTile& tile, Phase phase, int K,
                                  typename Gemm::RingPos& ring, void* smem, typename Gemm::Accum& acc,
                                  const ThreadGroup& g) {
    const bool ok = Gemm::mainloop(ring, K, smem, acc, limit(c, c.prm->timeout_ns));
    if (!ok) pipeline_failed(c, phase, tile);
    return !g.sync_or(!ok);
  }

  template <class Transport>
  __device__ static void linear1(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                 typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const int H = c.prm->dims.hidden, I = c.prm->dims.intermediate;
    const GemmTile& tile = posted.task.tile;
    typename Gemm::Accum acc;
    if (!mainloop(c, tile, Phase::kLinear1, H, ring, smem, acc, g)) return free_slot(sh, s, g);
    Epilogue::linear1(c, acc, tile, posted.h_row, I, posted.rows, sh.table[s], sh.stage, g);
    free_slot(sh, s, g);
    if (g.leader()) l1_tile_done(c, tile);
  }

  template <class Transport>
  __device__ static void linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                 typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const GemmTile& tile = posted.task.tile;
    typename Gemm::Accum acc;
    if (!mainloop(c, tile, Phase::kLinear2, c.prm->dims.intermediate, ring, smem, acc, g)) return free_slot(sh, s, g);
    const int rows = posted.rows;
    const RowTable& t = sh.table[s];
    // Thread r signals row r once the tile's stores are out; read its home and token before the slot goes.
    const int own = g.rank();
    const int home = own < rows ? t.home[own] : 0, token = own < rows ? t.token[own] : 0;
    Epilogue::linear2(c, acc, tile, rows, t, sh.stage, g);
    free_slot(sh, s, g);
    if (own < rows) signal_home(c, home, token, signal_units(kBlockN));
  }
};

}  // namespace epfuse::device
