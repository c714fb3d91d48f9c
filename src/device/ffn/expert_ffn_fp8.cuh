// The expert FFN tiles of the FP8 fused kernel (weight_format fp8-block128): WarpSpecialisedTileRoles'
// roles, queue, row tables and Linear2 epilogue over the FP8 tile TileGemmTmaFp8
// (gemm_mainloop_tma_fp8.cuh), with FP8 operands:
//   Linear1 tile: A = the expert's received FP8 x rows (dispatch_task<true>: a recv_rows slot, or this
//     rank's own row in the private fp8_x region; codes then 1x128 scales, regions.h), B = w13's FP8
//     codes by TMA (gate rows [n0, n0 + 128) and up rows [I + n0, ...)) with their two 128x128 block
//     scales per K block. Epilogue (epilogue.cuh FragmentStores::linear1_fp8): h = silu(min(g, c)) *
//     clamp(u, -c, c) * w_topk in fp32, one 1x128 group per row (a tile's 128 output columns), quantised
//     into FP8 h (codes [N][I] bytes, scales [N][fp8_scale_stride(I)] floats in the private h region,
//     regions.h).
//   Linear2 tile: A = the m-block's FP8 h rows and scales, B = w2's FP8 codes + block scales; the
//     epilogue is the bf16 one (FragmentStores::linear2: bf16 rows into the homes' combine slots).
// The host runs this tile for every FP8 config (also at small T: padding rows are not loaded, and a
// math warpgroup whose 64 rows are all padding runs no MMA), for H % 256 == 0 and I % 128 == 0 (the
// layer refuses others, kUnsupported). In the decode kernel (Gemm::kDecodeForm: TileGemmTmaFp8Decode,
// chosen by the host at small T) a tile of at most Gemm::kSwappedTokens rows runs the decode form
// instead: mainloop_swapped and SwappedStores (epilogue.cuh), the same arithmetic with the weights as the
// MMA's M side.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/ffn/expert_ffn.cuh"
#include "device/gemm/gemm_mainloop_tma_fp8.cuh"
#include "device/protocol/regions.h"

namespace epfuse::device {

template <class Gemm_>
struct WarpSpecialisedFp8Tiles : WarpSpecialisedTileRoles<Gemm_> {
  using Base = WarpSpecialisedTileRoles<Gemm_>;  // roles, queue, the math k-loop, Linear2
  using Gemm = Gemm_;
  using RowTable = typename Base::RowTable;  // a[i]: the row's FP8 codes (as bytes), scales follow (x) or apart (h)
  using Posted = typename Base::Posted;
  using Shared = typename Base::Shared;
  // The split kernel (TileGemmTmaFp8Split: Gemm::kSplitK) splits Linear2 tiles over K where a call has few of
  // them (task_map.h linear2_call_parts, split_k.cuh): a part reads its k-blocks' h codes, h scales, weight
  // boxes and weight scales. A kernel of its own: in the decode kernel the split's code cost qwen3-30b's decode
  // rows 2-4%, in the 64-row kernel it moved its register allocation (82 -> 133 spill instructions) and cost
  // qwen3-30b T = 16384 4% (docs/performance.md#linear2-split-over-k-2026-12-02-the-split-kernel).
  static constexpr bool kSplitLinear2 = Gemm::kSplitK;
  static_assert(Gemm::kBlockK == kSplitKBlock, "a part is whole k-blocks of the tile");
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static constexpr int kOutCols = kBlockN / 2;  // h columns of a Linear1 tile: one 1x128 group per row
  static_assert(kOutCols == fp8::kBlock, "a Linear1 tile's h row is one 1x128 group");
  // In the decode kernel, tiles of at most Gemm::kSwappedTokens rows run the decode form (mainloop_swapped,
  // SwappedStores) at N = kSwappedTokensSmall or kSwappedTokens, the smaller that holds the tile's rows;
  // its Linear1 epilogue reduces each row's amax through shared memory after the roles' queue (the
  // 64-row kernel keeps the roles' size).
  static constexpr int kRowAmaxOffset = (Base::kSmemBytes + 15) / 16 * 16;
  static constexpr int kSmemBytes =
      Gemm::kDecodeForm ? kRowAmaxOffset + SwappedStores<Gemm, Gemm::kSwappedTokens>::kScratchBytes : Base::kSmemBytes;
  static_assert(kSmemBytes + kStaticSmemBytes <= kBlockSmemBytes, "ring + row tables fit one SM");
  // Whether a tile runs the decode form (its rows fit kSwappedTokens in the decode kernel). Callers ask
  // under `if constexpr (Gemm::kDecodeForm)`, so that the 64-row kernel is compiled without the decode
  // form's code: with it there, present but never run, that kernel's SASS changed and its spill
  // instructions went 109 -> 167 (docs/performance.md#the-decode-form-at-32-rows-2026-11-30).
  __device__ static bool decode_form(const Posted& posted) { return posted.rows <= Gemm::kSwappedTokens; }

  // A producer thread's A operands: its rows' codes and the scales of its scale row.
  struct ARows {
    const uint8_t* a[Gemm::kProducerRows];
    const float* scale;
  };

  // ---- producer warpgroup ----
  template <class Transport>
  __device__ __forceinline__ static void prepare(const FusedContext<Transport>& c, const ThreadGroup& g, const Task& task,
                                                 int I, RowTable& t, ARows& a_rows, TileRows& w) {
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden;
    w = tile_rows(c, task.tile, kBlockM);
    const int64_t h_row0 = static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0;
    for (int i = g.rank(); i < kBlockM; i += g.count) {
      t.fill(c, w, i);
      if (i >= w.rows) continue;
      const uint8_t* a;
      if (task.phase == Phase::kLinear2) a = fp8_h_codes(c.h) + (h_row0 + i) * I;
      else if (t.home[i] == prm.rank)  // own row: its FP8 copy in fp8_x (RowEntry row = token)
        a = reinterpret_cast<const uint8_t*>(prm.workspace + prm.fp8.x_offset) + t.token[i] * fp8_x_row_bytes(H);
      else a = reinterpret_cast<const uint8_t*>(t.a[i]);  // the recv_rows slot holds the FP8 row
      t.a[i] = reinterpret_cast<const __nv_bfloat16*>(a);
    }
    g.sync();  // the table is complete before it is read and posted
#pragma unroll
    for (int i = 0; i < Gemm::kProducerRows; ++i)
      a_rows.a[i] = reinterpret_cast<const uint8_t*>(t.a[Gemm::producer_row(g.rank(), i)]);
    const int sr = Gemm::producer_scale_row(g.rank());
    const uint8_t* srow = reinterpret_cast<const uint8_t*>(t.a[sr]);
    a_rows.scale = srow == nullptr ? nullptr
                   : task.phase == Phase::kLinear2
                       ? fp8_h_scales(prm.capacity, c.h) + (h_row0 + sr) * fp8_scale_stride(I)
                       : reinterpret_cast<const float*>(srow + fp8_x_scale_offset(H));
    // A Linear2 part of the split kernel starts at its first K element (a multiple of 4 scale blocks: the
    // scale groups stay 16-byte aligned).
    if constexpr (kSplitLinear2)
      if (task.phase == Phase::kLinear2) {
        const int k0 = Base::linear2_part(c, task.tile).k.k0;
#pragma unroll
        for (int i = 0; i < Gemm::kProducerRows; ++i)
          if (a_rows.a[i] != nullptr) a_rows.a[i] += k0;
        if (a_rows.scale != nullptr) a_rows.scale += k0 / fp8::kBlock;
      }
  }

  // The weight operand of a GEMM tile: w13's or w2's codes and the block scales of its two 128-row halves
  // (evict_first when this call reads the expert's weights once).
  template <class Transport>
  __device__ static typename Gemm::BOperand b_operand(const FusedContext<Transport>& c, const Task& task) {
    const FusedParams& prm = *c.prm;
    const bool l1 = task.phase == Phase::kLinear1;
    // Every 128-row half of a tile is one weight block row (I % 128 == 0, H % 256 == 0).
    static_assert(kBlockN == 2 * kWeightBoxRows && kWeightBoxRows == fp8::kBlock, "a box is one weight block row");
    GemmTile tile = task.tile;
    int k0 = 0;  // the split kernel's Linear2 part: its tile, from its first K element
    if constexpr (kSplitLinear2)
      if (!l1) {
        const Linear2Part p = Base::linear2_part(c, task.tile);
        tile = p.tile;
        k0 = p.k.k0;
      }
    const auto [row0, row1] = tma_weight_rows(l1, tile.expert, tile.nblock, prm.dims.hidden, prm.dims.intermediate);
    const float* scales = (l1 ? prm.fp8.w13_scales : prm.fp8.w2_scales) + k0 / fp8::kBlock;
    const int kb = l1 ? prm.fp8.w13_kb : prm.fp8.w2_kb;
    return {l1 ? static_cast<const void*>(&prm.w13_map) : static_cast<const void*>(&prm.w2_map), row0, row1,
            scales + static_cast<int64_t>(row0 / fp8::kBlock) * kb, scales + static_cast<int64_t>(row1 / fp8::kBlock) * kb,
            weights_read_once(c.plan, tile.expert), k0};
  }

  // Issues every operand load of a prepared GEMM tile into the ring, but the weights of its first
  // `preloaded` k-blocks (preload_weights). False (group-uniform, recorded) when a wait for a free stage
  // ran out.
  template <class Transport>
  __device__ __forceinline__ static bool load(const FusedContext<Transport>& c, const ThreadGroup& g, const Task& task,
                                              const ARows& a_rows, int H, int I, typename Gemm::RingPos& ring,
                                              void* smem, int preloaded) {
    const FusedParams& prm = *c.prm;
    const bool l1 = task.phase == Phase::kLinear1;
    const bool loaded = Gemm::load_tile(ring, a_rows.a, a_rows.scale, b_operand(c, task), l1 ? H : linear2_k(c, task, I), smem,
                                        c.limit(prm.timeout_ns), preloaded);
    if (!loaded) pipeline_failed(c, task.phase, task.tile);
    return !g.sync_or(!loaded);
  }

  // A Linear2 task's K: I, or its part's in the split kernel. (Computed where the argument was, `l1 ? H : I`,
  // so that the other kernels' instructions stay as they were, scripts/sass_compare.py.)
  template <class Transport>
  __device__ static int linear2_k(const FusedContext<Transport>& c, const Task& task, int I) {
    if constexpr (kSplitLinear2) return Base::linear2_part(c, task.tile).k.k;
    else return I;
  }

  // ---- math warpgroups (the k-loop wrapper and the 64-row form's Linear2 are the bf16 tiles') ----
  // The Linear1 tile posted in slot s: FP8 h rows [h_row, h_row + rows), group tile.nblock of each.
  template <class Transport>
  __device__ static void linear1(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                 typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    if constexpr (Gemm::kDecodeForm) {
      if (decode_form(posted)) {
        if (posted.rows <= Gemm::kSwappedTokensSmall) return decode_linear1<Gemm::kSwappedTokensSmall>(c, posted, sh, s, ring, smem, g);
        return decode_linear1<Gemm::kSwappedTokens>(c, posted, sh, s, ring, smem, g);
      }
    }
    const FusedParams& prm = *c.prm;
    const int H = prm.dims.hidden, I = prm.dims.intermediate;
    const GemmTile& tile = posted.task.tile;
    typename Gemm::Accum acc;
    const int rows = posted.rows;
    if (!Base::mainloop(c, tile, Phase::kLinear1, H, rows, ring, smem, acc, g)) return sh.queue.release(s, g);
    FragmentStores<Gemm>::linear1_fp8(c, acc, tile, posted.h_row, I, rows, sh.queue.table[s], g);
    Base::finish_linear1(c, tile, sh, s, g);
  }

  // The Linear2 tile posted in slot s: the bf16 tiles' (Base::linear2), or the decode form's.
  template <class Transport>
  __device__ static void linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                 typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    if constexpr (Gemm::kDecodeForm) {
      if (decode_form(posted)) {
        if constexpr (kSplitLinear2) {
          if (posted.rows <= Gemm::kSwappedTokensSmall)
            return split_decode_linear2<Gemm::kSwappedTokensSmall>(c, posted, sh, s, ring, smem, g);
          return split_decode_linear2<Gemm::kSwappedTokens>(c, posted, sh, s, ring, smem, g);
        }
        if (posted.rows <= Gemm::kSwappedTokensSmall) return decode_linear2<Gemm::kSwappedTokensSmall>(c, posted, sh, s, ring, smem, g);
        return decode_linear2<Gemm::kSwappedTokens>(c, posted, sh, s, ring, smem, g);
      }
    }
    if constexpr (kSplitLinear2) Base::split_linear2(c, posted, sh, s, ring, smem, g);
    else Base::linear2(c, posted, sh, s, ring, smem, g);
  }

  // The decode form's tiles (at most kTokens rows): mainloop_swapped<kTokens> and SwappedStores.
  template <int kTokens, class Transport>
  __device__ static void decode_linear1(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                        typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const GemmTile& tile = posted.task.tile;
    float acc[kTokens];
    if (!Base::run_kloop(c, tile, Phase::kLinear1, g, [&](const WaitLimit& limit) {
          return Gemm::template mainloop_swapped<kTokens>(ring, c.prm->dims.hidden, smem, acc, limit);
        }))
      return sh.queue.release(s, g);
    SwappedStores<Gemm, kTokens>::linear1_fp8(c, acc, tile, posted.h_row, c.prm->dims.intermediate, posted.rows, sh.queue.table[s], row_amax(smem), g);
    Base::finish_linear1(c, tile, sh, s, g);
  }
  template <int kTokens, class Transport>
  __device__ static void decode_linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                        typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const GemmTile& tile = posted.task.tile;
    float acc[kTokens];
    if (!Base::run_kloop(c, tile, Phase::kLinear2, g, [&](const WaitLimit& limit) {
          return Gemm::template mainloop_swapped<kTokens>(ring, c.prm->dims.intermediate, smem, acc, limit);
        }))
      return sh.queue.release(s, g);
    Base::finish_linear2(c, posted, sh, s, g,
                         [&](const RowTable& t) { SwappedStores<Gemm, kTokens>::linear2(c, acc, tile, posted.rows, t, g); });
  }
  // The same for a part of a tile split over K (Base::split_linear2).
  template <int kTokens, class Transport>
  __device__ static void split_decode_linear2(const FusedContext<Transport>& c, const Posted& posted, Shared& sh, int s,
                                              typename Gemm::RingPos& ring, void* smem, const ThreadGroup& g) {
    const Linear2Part p = Base::linear2_part(c, posted.task.tile);
    float acc[kTokens];
    if (!Base::run_kloop(c, p.tile, Phase::kLinear2, g, [&](const WaitLimit& limit) {
          return Gemm::template mainloop_swapped<kTokens>(ring, p.k.k, smem, acc, limit);
        }))
      return sh.queue.release(s, g);
    // Every thread's registers hold tile columns (the weights' rows) of all kTokens rows: all of them take part.
    if (!split_k_meet(*c.prm, p, c.prm->dims.hidden / kBlockN, acc, true, g)) return sh.queue.release(s, g);
    Base::finish_linear2(c, posted, sh, s, g,
                         [&](const RowTable& t) { SwappedStores<Gemm, kTokens>::linear2(c, acc, p.tile, posted.rows, t, g); });
  }

 private:
  __device__ static float* row_amax(void* smem) { return reinterpret_cast<float*>(static_cast<char*>(smem) + kRowAmaxOffset); }
};

}  // namespace epfuse::device
