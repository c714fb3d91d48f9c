// Expert FFN tiles on tensor cores (issue item 3), with TileGemm (gemm_mainloop.cuh) and the SwiGLU
// epilogue (epilogue.cuh) for the math; this file decides which rows a tile reads, what it waits for
// and where its output goes:
//   Linear1 tile (m-block, n-block of 2I): waits for its expert's arrivals, gathers the received rows,
//     SwiGLU with the pair's top-k weight -> h (local, bf16), counts itself done for the m-block.
//   Linear2 tile (m-block, n-block of H): waits for the m-block's Linear1 tiles, stages the bf16 output
//     in smem and writes each row into its home rank's combine slot (token, top-k slot) with 16-byte
//     stores over NVLink, then one release add per row on the token's counter at home.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/context.cuh"
#include "device/epilogue.cuh"
#include "device/errors.cuh"
#include "device/gemm_mainloop.cuh"
#include "device/ptx.cuh"

namespace epfuse::device {

template <class Gemm>
struct ExpertTiles {
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static_assert(kBlockN % kSignalCols == 0, "a Linear2 tile signals whole column groups");
  static_assert(kBlockM >= kMinBlockM, "l1_done is sized for m-blocks of at least kMinBlockM rows");

  // Per tile row, resolved once per tile (after the GEMM's smem).
  struct RowTable {
    const __nv_bfloat16* a[kBlockM];
    float weight[kBlockM];
    int home[kBlockM];
    int token[kBlockM];
    int slot[kBlockM];
  };
  static constexpr int kSmemBytes = Gemm::kSmemBytes + static_cast<int>(sizeof(RowTable));
  // Weights through TMA tensor maps (TileGemmTma) or through row pointers (the others).
  static constexpr bool kTmaWeights = requires { Gemm::kTmaWeights; };

  // Row stride (elements) of a bf16 output tile staged in smem: 8 elements (16 bytes) of padding put
  // the 8 rows one accumulator store instruction touches on distinct banks.
  static constexpr int stage_stride(int cols) { return cols + 8; }
  static_assert(kBlockM * (kBlockN + 8) * 2 <= Gemm::kSmemBytes, "the staged output tile fits in the GEMM's smem");

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

  // Fills the entry-derived columns of the table (home, token, slot, weight) and returns the entry's
  // row pointer into the receive region (or x for this rank's own tokens).
  __device__ static void load_entries(const FusedContext& c, const Where& w, RowTable& t) {
    const FusedParams& prm = *c.prm;
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
      t.a[i] = src.src == prm.rank
                   ? prm.x + static_cast<int64_t>(entry.row) * prm.dims.hidden
                   : c.local<const __nv_bfloat16>(recv_row_offset(prm.sym, prm.dims, c.parity, prm.rank, src.src, entry.row));
    }
  }

  __device__ static void linear1(const FusedContext& c, const GemmTile& tile, void* smem) {
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden, I = prm.dims.intermediate;
    const Where w = locate(c, tile);
    const uint32_t rows = static_cast<uint32_t>(c.plan.rows[w.expert]);
    const uint32_t base = c.plan.target[w.expert] - rows;
    const uint32_t* arrived = c.local<uint32_t>(arrival_offset(prm.sym, prm.dims, c.parity, w.expert));
    if (!cta_wait(prm, c.ctl, c.site(Phase::kLinear1, WaitKind::kArrivals, w.expert), rows,
                  [&] { return ld_acquire_sys(arrived); },
                  [&](uint32_t v) { return counter_reached(v, base, rows); }))
      return;
    RowTable& t = *reinterpret_cast<RowTable*>(static_cast<char*>(smem) + Gemm::kSmemBytes);
    load_entries(c, w, t);
    __syncthreads();
    const int n_out0 = tile.nblock * (kBlockN / 2);
    typename Gemm::Accum acc;
    bool ok = true;
    if constexpr (kTmaWeights) {
      const int gate = w.expert * 2 * I + n_out0;  // row of prm.w13_map ([L * 2I, H])
      ok = Gemm::mainloop([&](int i) { return t.a[i]; }, typename Gemm::BOperand{&prm.w13_map, gate, gate + I}, H,
                          smem, acc, prm.timeout_ns);
    } else {
      Gemm::mainloop([&](int i) { return t.a[i]; },
                     swiglu_b_row(prm.w13 + static_cast<int64_t>(w.expert) * 2 * I * H, H, I, n_out0), H, smem, acc);
    }
    if (!ok) return pipeline_failed(c, Phase::kLinear1, tile);
    // mainloop left smem free: stage the bf16 outputs so h is written in whole 16-byte chunks.
    constexpr int kOutCols = kBlockN / 2;
    auto* stage = static_cast<__nv_bfloat16*>(smem);
    visit_swiglu<Gemm>(acc, prm.swiglu_clamp, [&](int row, int col, float h0, float h1) {
      const float weight = row < w.rows ? t.weight[row] : 0.0f;
      *reinterpret_cast<uint32_t*>(stage + row * stage_stride(kOutCols) + col) = ptx::pack_bf16x2(h0 * weight, h1 * weight);
    });
    __syncthreads();
    __nv_bfloat16* h = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0) * I + n_out0;
    constexpr int kChunks = kOutCols / 8;
    for (int q = threadIdx.x; q < w.rows * kChunks; q += blockDim.x) {
      const int row = q / kChunks, chunk = q % kChunks;
      *reinterpret_cast<int4*>(h + static_cast<int64_t>(row) * I + chunk * 8) =
          *reinterpret_cast<const int4*>(stage + row * stage_stride(kOutCols) + chunk * 8);
    }
    __syncthreads();
    if (threadIdx.x == 0) red_add_release_gpu(c.l1_done + tile.mblock, 1u);
  }

  __device__ static void linear2(const FusedContext& c, const GemmTile& tile, void* smem) {
    const FusedParams& prm = *c.prm;
    const FusedDims& d = prm.dims;
    const int H = d.hidden, I = d.intermediate;
    const uint32_t l1_tiles = static_cast<uint32_t>(2 * I / kBlockN);
    const Where w = locate(c, tile);
    const uint32_t* done = c.l1_done + tile.mblock;
    if (!cta_wait(prm, c.ctl, c.site(Phase::kLinear2, WaitKind::kLinear1, tile.mblock, w.expert), l1_tiles,
                  [&] { return ld_acquire_gpu(done); }, [&](uint32_t v) { return v >= l1_tiles; }))
      return;
    RowTable& t = *reinterpret_cast<RowTable*>(static_cast<char*>(smem) + Gemm::kSmemBytes);
    load_entries(c, w, t);
    const __nv_bfloat16* h = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0) * I;
    for (int i = threadIdx.x; i < kBlockM; i += blockDim.x) t.a[i] = i < w.rows ? h + static_cast<int64_t>(i) * I : nullptr;
    __syncthreads();
    const int n0 = tile.nblock * kBlockN;
    typename Gemm::Accum acc;
    bool ok = true;
    if constexpr (kTmaWeights) {
      const int row = w.expert * H + n0;  // row of prm.w2_map ([L * H, I])
      ok = Gemm::mainloop([&](int i) { return t.a[i]; }, typename Gemm::BOperand{&prm.w2_map, row, row + kBlockN / 2}, I,
                          smem, acc, prm.timeout_ns);
    } else {
      Gemm::mainloop([&](int i) { return t.a[i]; }, dense_b_row(prm.w2 + static_cast<int64_t>(w.expert) * H * I, I, n0),
                     I, smem, acc);
    }
    if (!ok) return pipeline_failed(c, Phase::kLinear2, tile);
    // mainloop left smem free: stage the bf16 tile so the remote writes are whole 16-byte chunks.
    auto* stage = static_cast<__nv_bfloat16*>(smem);
    Gemm::visit(acc, [&](int row, int col, float v0, float v1) {
      *reinterpret_cast<uint32_t*>(stage + row * stage_stride(kBlockN) + col) = ptx::pack_bf16x2(v0, v1);
    });
    __syncthreads();
    constexpr int kChunks = kBlockN / 8;
    for (int q = threadIdx.x; q < w.rows * kChunks; q += blockDim.x) {
      const int row = q / kChunks, chunk = q % kChunks;
      int4* dst = c.peer<int4>(t.home[row], combine_row_offset(prm.sym, d, c.parity, t.token[row], t.slot[row]) +
                                                static_cast<size_t>(n0 + chunk * 8) * 2);
      *dst = *reinterpret_cast<const int4*>(stage + row * stage_stride(kBlockN) + chunk * 8);
    }
    __syncthreads();
    for (int row = threadIdx.x; row < w.rows; row += blockDim.x)
      red_add_release_sys(c.peer<uint32_t>(t.home[row], token_signal_offset(prm.sym, d, c.parity, t.token[row])),
                          signal_units(kBlockN));
    __syncthreads();  // the row table and stage are reused by the next task
  }
};

}  // namespace epfuse::device
