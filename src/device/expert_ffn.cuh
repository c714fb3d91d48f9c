// Expert FFN tiles on tensor cores (issue item 3), with a tile GEMM (gemm_mainloop*.cuh) and the SwiGLU
// epilogue (epilogue.cuh) for the math; this file decides which rows a tile reads, what it waits for
// and where its output goes:
//   Linear1 tile (m-block, n-block of 2I): waits for its expert's arrivals, gathers the received rows,
//     SwiGLU with the pair's top-k weight -> h (local, bf16), counts itself done for the m-block.
//   Linear2 tile (m-block, n-block of H): waits for the m-block's Linear1 tiles, stages the bf16 output
//     in smem and writes each row into its home rank's combine slot (token, top-k slot) with 16-byte
//     stores over NVLink, then one release add per row on the token's counter at home.
// With the TMA tile (kPrefetch) a Linear1 tile claims the next task once its output is staged and, when
// that is a GEMM tile whose wait is already satisfied, resolves its rows into the other row table and
// issues the weight tiles of its first k-blocks, so they load while this tile writes h. (Linear1 tiles
// are most of the tiles; a Linear2 tile's staged output needs the whole A-and-B stage memory.)
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/context.cuh"
#include "device/epilogue.cuh"
#include "device/errors.cuh"
#include "device/gemm_mainloop.cuh"
#include "device/ptx.cuh"
#include "device/scheduler.cuh"

namespace epfuse::device {

template <class Gemm>
struct ExpertTiles {
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static_assert(kBlockN % kSignalCols == 0, "a Linear2 tile signals whole column groups");
  static_assert(kBlockM >= kMinBlockM, "l1_done is sized for m-blocks of at least kMinBlockM rows");

  // Weights through TMA tensor maps (TileGemmTma) or through row pointers (the others); only the TMA
  // tile's ring can take the next tile's loads early.
  static constexpr bool kTmaWeights = requires { Gemm::kTmaWeights; };
  static constexpr bool kPrefetch = kTmaWeights;

  // Per tile row, resolved once per tile.
  struct RowTable {
    const __nv_bfloat16* a[kBlockM];
    float weight[kBlockM];
    int home[kBlockM];
    int token[kBlockM];
    int slot[kBlockM];
  };
  // After the GEMM's smem: two row tables (this tile's, and the next one's when it was prefetched).
  struct TileState {
    RowTable table[2];
    int current;     // this tile's table
    int prefetched;  // the current table and the first k-blocks were set up by the previous tile
    int ready;       // broadcast of the prefetch check
  };
  static constexpr int kSmemBytes = Gemm::kSmemBytes + static_cast<int>(sizeof(TileState));

  // Output tiles are staged in smem as bf16 rows of kCols columns, padded by 16 bytes so the 8 rows one
  // accumulator store touches land on different banks (an XOR swizzle instead cost ~35 registers in the
  // unrolled visit: 221 -> 255 and spills). Linear1 stages where the next tile's early weight loads do
  // not write (the TMA tile's A stages); Linear2 from the start of the GEMM's smem.
  template <int kCols>
  __device__ static int stage_at(int row, int col) { return row * (kCols + 8) + col; }
  static constexpr int kLinear1StageBytes = kBlockM * (kBlockN / 2 + 8) * 2;
  static_assert(kBlockM * (kBlockN + 8) * 2 <= Gemm::kSmemBytes, "a staged Linear2 tile fits");
  __device__ static __nv_bfloat16* linear1_stage(void* smem) {
    if constexpr (kPrefetch) {
      static_assert(kLinear1StageBytes <= Gemm::kStagingBytes, "a staged Linear1 tile fits beside the weight loads");
      return reinterpret_cast<__nv_bfloat16*>(Gemm::staging(smem));
    } else {
      return static_cast<__nv_bfloat16*>(smem);
    }
  }

  __device__ static TileState& state(void* smem) {
    return *reinterpret_cast<TileState*>(static_cast<char*>(smem) + Gemm::kSmemBytes);
  }
  // Once per launch, by the whole CTA, before the first task.
  __device__ static void init(void* smem) {
    if constexpr (requires { Gemm::init(smem); }) Gemm::init(smem);  // the ring's barriers
    if (threadIdx.x == 0) {
      state(smem).current = 0;
      state(smem).prefetched = 0;
    }
    __syncthreads();
  }

  // A mainloop wait ran out (CTA-uniform): record it and stop; the abort ends every other wait.
  __device__ static void pipeline_failed(const FusedContext& c, Phase phase, const GemmTile& tile) {
    if (threadIdx.x == 0) {
      record_error(c.ctl, ErrorRecord{static_cast<int32_t>(ErrorKind::kTimeout), c.prm->rank, static_cast<int32_t>(phase),
                                      static_cast<int32_t>(WaitKind::kPipeline), tile.mblock, tile.nblock, 0, 0});
      raise_abort(c.ctl);
    }
  }

  struct Where {
    int expert, row0, rows;  // the tile's expert rows [row0, row0 + rows)
  };
  __device__ static Where locate(const FusedContext& c, const GemmTile& tile) {
    const int row0 = (tile.mblock - c.plan.mb_start[tile.expert]) * kBlockM;
    return {tile.expert, row0, min(kBlockM, c.plan.rows[tile.expert] - row0)};
  }

  // ---- what each kind of tile waits for: one word, a base and a target ----
  struct Gate {
    const uint32_t* word;
    uint32_t base, target;
    bool sys;  // arrivals come from peers (system scope); Linear1 counters from this GPU
  };
  __device__ static Gate gate_of(const FusedContext& c, Phase phase, const GemmTile& tile) {
    const FusedParams& prm = *c.prm;
    if (phase == Phase::kLinear1) {
      const uint32_t rows = static_cast<uint32_t>(c.plan.rows[tile.expert]);
      return {c.local<uint32_t>(arrival_offset(prm.sym, prm.dims, c.parity, tile.expert)),
              c.plan.target[tile.expert] - rows, rows, true};
    }
    return {c.l1_done + tile.mblock, 0u, static_cast<uint32_t>(2 * prm.dims.intermediate / kBlockN), false};
  }
  __device__ static uint32_t gate_load(const Gate& g) { return g.sys ? ld_acquire_sys(g.word) : ld_acquire_gpu(g.word); }
  __device__ static bool gate_open(const Gate& g, uint32_t v) { return counter_reached(v, g.base, g.target); }
  __device__ static bool wait_gate(const FusedContext& c, Phase phase, const GemmTile& tile) {
    const Gate g = gate_of(c, phase, tile);
    const WaitSite site = phase == Phase::kLinear1 ? c.site(phase, WaitKind::kArrivals, tile.expert)
                                                   : c.site(phase, WaitKind::kLinear1, tile.mblock, tile.expert);
    return cta_wait(*c.prm, c.ctl, site, g.target, [&] { return gate_load(g); },
                    [&](uint32_t v) { return gate_open(g, v); });
  }

  // Fills the entry-derived columns of the table (home, token, slot, weight) and the A row pointers:
  // the received row (or x for this rank's own tokens) for Linear1, the pair's h row for Linear2.
  __device__ static void load_rows(const FusedContext& c, Phase phase, const Where& w, RowTable& t) {
    const FusedParams& prm = *c.prm;
    const int I = prm.dims.intermediate;
    const __nv_bfloat16* h = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0) * I;
    for (int i = threadIdx.x; i < kBlockM; i += blockDim.x) {
      t.a[i] = nullptr;
      if (i >= w.rows) continue;
      const RowSource src = row_source(c.plan, prm.dims.world, c.local_experts, w.expert, w.row0 + i);
      const int4 raw = __ldcg(c.local<int4>(recv_entry_offset(prm.sym, prm.dims, c.parity, src.src, src.entry)));
      const RowEntry entry = *reinterpret_cast<const RowEntry*>(&raw);
      t.home[i] = src.src;
      t.token[i] = entry.token;
      t.slot[i] = entry.slot;
      t.weight[i] = entry.weight;
      if (phase == Phase::kLinear2) {
        t.a[i] = h + static_cast<int64_t>(i) * I;
      } else {
        t.a[i] = src.src == prm.rank
                     ? prm.x + static_cast<int64_t>(entry.row) * prm.dims.hidden
                     : c.local<const __nv_bfloat16>(recv_row_offset(prm.sym, prm.dims, c.parity, prm.rank, src.src, entry.row));
      }
    }
  }

  // The tile's weight operand and K, for the TMA tile: rows of prm.w13_map ([L * 2I, H]: gate rows, then
  // up rows I further) or prm.w2_map ([L * H, I]).
  __device__ static int k_of(const FusedContext& c, Phase phase) {
    return phase == Phase::kLinear1 ? c.prm->dims.hidden : c.prm->dims.intermediate;
  }
  template <class G = Gemm>
  __device__ static typename G::BOperand tma_b(const FusedContext& c, Phase phase, const GemmTile& tile) {
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden, I = prm.dims.intermediate;
    if (phase == Phase::kLinear1) {
      const int gate = tile.expert * 2 * I + tile.nblock * (kBlockN / 2);
      return {&prm.w13_map, gate, gate + I};
    }
    const int row = tile.expert * H + tile.nblock * kBlockN;
    return {&prm.w2_map, row, row + kBlockN / 2};
  }

  // Runs the mainloop of a tile whose rows are in t; false (after recording it) on a pipeline timeout.
  __device__ static bool run_mainloop(const FusedContext& c, Phase phase, const GemmTile& tile, const RowTable& t,
                                      bool weights_issued, void* smem, typename Gemm::Accum& acc) {
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden, I = prm.dims.intermediate;
    auto a_row = [&](int i) { return t.a[i]; };
    bool ok = true;
    if constexpr (kTmaWeights) {
      ok = Gemm::mainloop(a_row, tma_b(c, phase, tile), k_of(c, phase), smem, acc, prm.timeout_ns, weights_issued);
    } else if (phase == Phase::kLinear1) {
      Gemm::mainloop(a_row, swiglu_b_row(prm.w13 + static_cast<int64_t>(tile.expert) * 2 * I * H, H, I, tile.nblock * (kBlockN / 2)),
                     H, smem, acc);
    } else {
      Gemm::mainloop(a_row, dense_b_row(prm.w2 + static_cast<int64_t>(tile.expert) * H * I, I, tile.nblock * kBlockN), I,
                     smem, acc);
    }
    if (!ok) pipeline_failed(c, phase, tile);
    return ok;
  }

  // Once a Linear1 tile's output is staged: claim the next task and, when it is a GEMM tile that need
  // not wait, set up its rows in the other table and issue the weights of its first k-blocks, which
  // then load while this tile writes h. CTA-uniform. Not inlined: its registers stay out of the tile's.
  __device__ __noinline__ static void prefetch_next(const FusedContext& c, TaskScheduler& scheduler, void* smem) {
    if constexpr (kPrefetch) {
      const Task next = scheduler.claim();
      if (next.phase != Phase::kLinear1 && next.phase != Phase::kLinear2) return;
      TileState& s = state(smem);
      if (threadIdx.x == 0) {
        const Gate g = gate_of(c, next.phase, next.tile);
        s.ready = gate_open(g, gate_load(g)) ? 1 : 0;
      }
      __syncthreads();
      if (!s.ready) return;
      load_rows(c, next.phase, locate(c, next.tile), s.table[s.current ^ 1]);
      // A timeout here leaves the ring inconsistent; the recorded abort ends the call (the next tile's
      // own waits then time out or see the abort).
      if (!Gemm::prologue_weights(tma_b(c, next.phase, next.tile), k_of(c, next.phase), smem, c.prm->timeout_ns)) {
        pipeline_failed(c, next.phase, next.tile);
        return;
      }
      if (threadIdx.x == 0) {
        s.current ^= 1;
        s.prefetched = 1;
      }
      // No barrier needed here: every thread reads the state again only after the next tile's wait.
    }
  }

  // Common start of a tile: wait for its inputs, take (or build) its row table. Returns nullptr when the
  // wait was abandoned.
  __device__ static const RowTable* begin(const FusedContext& c, Phase phase, const GemmTile& tile, const Where& w,
                                          void* smem, bool* weights_issued) {
    if (!wait_gate(c, phase, tile)) return nullptr;  // ends with a CTA barrier: the state below is settled
    TileState& s = state(smem);
    *weights_issued = s.prefetched != 0;
    RowTable& t = s.table[s.current];
    if (!*weights_issued) load_rows(c, phase, w, t);
    __syncthreads();
    if (threadIdx.x == 0) s.prefetched = 0;
    return &t;
  }

  __device__ static void linear1(const FusedContext& c, const GemmTile& tile, void* smem, TaskScheduler& scheduler) {
    const FusedParams& prm = *c.prm;
    const int I = prm.dims.intermediate;
    const Where w = locate(c, tile);
    bool issued = false;
    const RowTable* tp = begin(c, Phase::kLinear1, tile, w, smem, &issued);
    if (tp == nullptr) return;
    const RowTable& t = *tp;
    typename Gemm::Accum acc;
    if (!run_mainloop(c, Phase::kLinear1, tile, t, issued, smem, acc)) return;
    constexpr int kOutCols = kBlockN / 2;
    __nv_bfloat16* stage = linear1_stage(smem);
    visit_swiglu<Gemm>(acc, prm.swiglu_clamp, [&](int row, int col, float h0, float h1) {
      const float weight = row < w.rows ? t.weight[row] : 0.0f;
      *reinterpret_cast<uint32_t*>(stage + stage_at<kOutCols>(row, col)) = ptx::pack_bf16x2(h0 * weight, h1 * weight);
    });
    // The accumulators are in smem now (prefetch_next's work would otherwise keep them live and spill).
    prefetch_next(c, scheduler, smem);
    __syncthreads();
    __nv_bfloat16* h = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0) * I + tile.nblock * kOutCols;
    constexpr int kChunks = kOutCols / 8;
    for (int q = threadIdx.x; q < w.rows * kChunks; q += blockDim.x) {
      const int row = q / kChunks, chunk = q % kChunks;
      *reinterpret_cast<int4*>(h + static_cast<int64_t>(row) * I + chunk * 8) =
          *reinterpret_cast<const int4*>(stage + stage_at<kOutCols>(row, chunk * 8));
    }
    __syncthreads();
    if (threadIdx.x == 0) red_add_release_gpu(c.l1_done + tile.mblock, 1u);
  }

  __device__ static void linear2(const FusedContext& c, const GemmTile& tile, void* smem) {
    const FusedParams& prm = *c.prm;
    const FusedDims& d = prm.dims;
    const Where w = locate(c, tile);
    bool issued = false;
    const RowTable* tp = begin(c, Phase::kLinear2, tile, w, smem, &issued);
    if (tp == nullptr) return;
    const RowTable& t = *tp;
    typename Gemm::Accum acc;
    if (!run_mainloop(c, Phase::kLinear2, tile, t, issued, smem, acc)) return;
    // Stage the bf16 tile so the remote writes are whole 16-byte chunks.
    auto* stage = static_cast<__nv_bfloat16*>(smem);
    Gemm::visit(acc, [&](int row, int col, float v0, float v1) {
      *reinterpret_cast<uint32_t*>(stage + stage_at<kBlockN>(row, col)) = ptx::pack_bf16x2(v0, v1);
    });
    __syncthreads();
    const int n0 = tile.nblock * kBlockN;
    constexpr int kChunks = kBlockN / 8;
    for (int q = threadIdx.x; q < w.rows * kChunks; q += blockDim.x) {
      const int row = q / kChunks, chunk = q % kChunks;
      int4* dst = c.peer<int4>(t.home[row], combine_row_offset(prm.sym, d, c.parity, t.token[row], t.slot[row]) +
                                                static_cast<size_t>(n0 + chunk * 8) * 2);
      *dst = *reinterpret_cast<const int4*>(stage + stage_at<kBlockN>(row, chunk * 8));
    }
    __syncthreads();
    for (int row = threadIdx.x; row < w.rows; row += blockDim.x)
      red_add_release_sys(c.peer<uint32_t>(t.home[row], token_signal_offset(prm.sym, d, c.parity, t.token[row])),
                          signal_units(kBlockN));
    __syncthreads();  // the row table and stage are reused by the next task
  }
};

}  // namespace epfuse::device
