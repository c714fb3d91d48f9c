// The epilogues of the expert FFN tiles, for every tile GEMM: what a finished tile's accumulators
// become and where they go.
//   Linear1: h = silu(min(gate, c)) * clamp(up, -c, c) (clamp only when c > 0) times the pair's top-k
//     weight, bf16, into h (local, expert-contiguous); then the tile counts itself done for its m-block
//     (l1_tile_done), which Linear2 tiles wait for.
//   Linear2: bf16 rows into their home ranks' combine slots (token, top-k slot) over NVLink; then one
//     release add per row on the token's signal at home (signal_home), which the combine waits for.
// Both write whole 16-byte chunks:
//   - the all-thread tiles (TileGemm, TileGemmWgmma) stage the whole tile in the ring their mainloop
//     left free (store_staged; Linear1: gate and up interleaved per 8 columns, visit_swiglu);
//   - the warp-specialised tiles (TileGemmTma, TileGemmTmaFp8) store straight from the accumulators,
//     a quad of lanes transposing its words (FragmentStores, fragment_store.cuh; gate and up as column
//     halves): no shared memory, no barrier but the one after the stores; the FP8 Linear1 epilogue
//     (linear1_fp8: SwiGLU, then h quantised 1x128 into codes and scales) stores its codes the same way;
//   - the FP8 tile's decode form (mainloop_swapped: at most kSwappedTokens rows, the accumulators
//     transposed) has its own (SwappedStores): a row's amax over 8 lanes and 8 warps (shared memory), codes a
//     byte a store, Linear2's bf16 two columns a store.
// The row table (expert_ffn.cuh RowTableOf: each row's top-k weight, home, token and slot) is the
// caller's.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/diagnostics/trace.cuh"
#include "device/gemm/fp8_quantize.cuh"
#include "device/gemm/fragment_store.cuh"
#include "device/gemm/gemm_maps.h"
#include "device/kernel/context.cuh"
#include "device/protocol/regions.h"
#include "device/protocol/routing.h"
#include "device/ptx/ptx.cuh"
#include "device/ptx/signals.cuh"
#include "device/ptx/thread_group.cuh"

namespace epfuse::device {

// DeepSeek's swiglu_limit: gate = min(gate, c), up = clamp(up, -c, c), only when c > 0.
__device__ __forceinline__ void swiglu_limit(float& gate, float& up, float clamp) {
  if (clamp > 0.0f) {
    gate = fminf(gate, clamp);
    up = fminf(fmaxf(up, -clamp), clamp);
  }
}

// silu(min(gate, c)) * clamp(up, -c, c), clamp only when c > 0, in fp32.
__device__ __forceinline__ float swiglu(float gate, float up, float clamp) {
  swiglu_limit(gate, up, clamp);
  // __fdividef / __expf: approximate division and exponent (a few instructions each; relative error
  // ~1e-6, far below bf16's 4e-3). gate -> -inf: the denominator overflows to inf and the quotient is
  // 0, the limit of silu.
  return __fdividef(gate, 1.0f + __expf(-gate)) * up;
}

// swiglu with silu(g) = g * (0.5 + 0.5 tanh(g / 2)) on tanh.approx: one MUFU an output where swiglu
// takes two (ex2, rcp), in the FP8 Linear1 epilogue, whose SwiGLU the MUFU bounds (docs/performance.md#epilogues,
// 2026-11-27). tanh.approx's error (2^-11 relative) is far below the e4m3 step of the h it feeds
// (2^-4 relative), not below bf16's: FP8 only.
__device__ __forceinline__ float swiglu_fp8(float gate, float up, float clamp) {
  swiglu_limit(gate, up, clamp);
  float t;
  asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(0.5f * gate));
  return gate * fmaf(0.5f, t, 0.5f) * up;
}

// f(row, out_col, h0, h1): SwiGLU outputs out_col and out_col + 1 (relative to n_out0, out_col even) of
// tile row `row`, for every pair this thread owns. Gemm is a TileGemm / TileGemmWgmma, whose B rows came
// from swiglu_b_row (gemm_maps.h: gate and up interleaved per 8 columns, visit_col16).
template <class Gemm, class F>
__device__ __forceinline__ void visit_swiglu(const typename Gemm::Accum& acc, float clamp, F f) {
  Gemm::visit_col16(acc, [&](int row, int col, float g0, float g1, float u0, float u1) {
    f(row, swiglu_out_col(col), swiglu(g0, u0, clamp), swiglu(g1, u1, clamp));
  });
}

// Row stride (elements) of a bf16 output tile of `cols` columns staged in smem: 8 elements (16 bytes)
// of padding put the 8 rows one accumulator store instruction touches on distinct banks.
constexpr int stage_stride(int cols) { return cols + 8; }

// Writes rows [0, rows) x kChunks 16-byte chunks of a staged tile (row stride kStride elements) to
// dst(row, chunk), chunk q taken by the thread with q % step == first % step.
template <int kChunks, int kStride, class Index, class Dst>
__device__ __forceinline__ void store_staged(const __nv_bfloat16* stage, int rows, Index first, Index step, Dst dst) {
  for (int q = first; q < rows * kChunks; q += step) {
    const int row = q / kChunks, chunk = q % kChunks;
    *dst(row, chunk) = *reinterpret_cast<const int4*>(stage + row * kStride + chunk * kChunkElems);
  }
}

// Where a Linear2 tile's output column `col` of one row goes: the row's combine slot (token, top-k
// slot) at its home rank.
template <class Transport>
__device__ __forceinline__ int4* combine_chunk(const FusedContext<Transport>& c, int home, int token, int slot, int col) {
  const FusedParams& prm = *c.prm;
  return peer_ptr<int4>(c, home, combine_row_offset(prm.sym, prm.capacity, c.parity, token, slot) + static_cast<size_t>(col) * 2);
}
// After a row's stores: `units` more of the token's columns are in its combine slots at home.
template <class Transport>
__device__ __forceinline__ void signal_home(const FusedContext<Transport>& c, int home, int token, uint32_t units) {
  const FusedParams& prm = *c.prm;
  peer_release_add(c, peer_ptr<uint32_t>(c, home, token_signal_offset(prm.sym, prm.capacity, c.parity, token)), units);
}
// After a Linear1 tile's stores (one thread, behind a barrier of the threads that stored).
template <class Transport>
__device__ __forceinline__ void l1_tile_done(const FusedContext<Transport>& c, const GemmTile& tile) {
  red_add_release_gpu(c.l1_done + tile.mblock, 1u);
}

// An FP8 layer's h in the private h region (regions.h): codes [N][I] bytes, then scales
// [N][fp8_scale_stride(I)] floats at fp8_h_scale_offset(capacity).
__device__ __forceinline__ uint8_t* fp8_h_codes(__nv_bfloat16* h) { return reinterpret_cast<uint8_t*>(h); }
__device__ __forceinline__ float* fp8_h_scales(const FusedDims& capacity, __nv_bfloat16* h) {
  return reinterpret_cast<float*>(reinterpret_cast<char*>(h) + fp8_h_scale_offset(capacity));
}

// ---- the all-thread tiles (TileGemm, TileGemmWgmma): the CTA stages the whole tile in the ring ----
template <class Gemm>
struct TileEpilogue {
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static_assert(kBlockM * (kBlockN + 8) * 2 <= Gemm::kSmemBytes, "the staged output tile fits in the GEMM's smem");

  // Tile rows [0, w.rows) of expert w.expert from row w.row0 on, output columns [n_out0, n_out0 + kBlockN / 2)
  // of h (row stride I: the caller's, read before its k-loop as the tile was written before).
  template <class Transport, class Rows, class Table>
  __device__ static void linear1(const FusedContext<Transport>& c, const typename Gemm::Accum& acc, const GemmTile& tile,
                                 const Rows& w, const Table& t, int n_out0, int I, void* smem) {
    const FusedParams& prm = *c.prm;
    // mainloop left smem free: stage the bf16 outputs so h is written in whole 16-byte chunks.
    constexpr int kOutCols = kBlockN / 2;
    auto* stage = static_cast<__nv_bfloat16*>(smem);
    visit_swiglu<Gemm>(acc, prm.swiglu_clamp, [&](int row, int col, float h0, float h1) {
      const float weight = row < w.rows ? t.weight[row] : 0.0f;
      *reinterpret_cast<uint32_t*>(stage + row * stage_stride(kOutCols) + col) = ptx::pack_bf16x2(h0 * weight, h1 * weight);
    });
    __syncthreads();
    __nv_bfloat16* h = c.h + (static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0) * I + n_out0;
    store_staged<kOutCols / kChunkElems, stage_stride(kOutCols)>(stage, w.rows, threadIdx.x, blockDim.x, [&](int row, int chunk) {
      return reinterpret_cast<int4*>(h + static_cast<int64_t>(row) * I + chunk * kChunkElems);
    });
    __syncthreads();
    if (threadIdx.x == 0) l1_tile_done(c, tile);
  }

  // Tile rows [0, w.rows), output columns [n0, n0 + kBlockN) of each row's combine slot.
  template <class Transport, class Rows, class Table>
  __device__ static void linear2(const FusedContext<Transport>& c, const typename Gemm::Accum& acc, const Rows& w,
                                 const Table& t, int n0, void* smem) {
    // mainloop left smem free: stage the bf16 tile so the remote writes are whole 16-byte chunks.
    auto* stage = static_cast<__nv_bfloat16*>(smem);
    Gemm::visit(acc, [&](int row, int col, float v0, float v1) {
      *reinterpret_cast<uint32_t*>(stage + row * stage_stride(kBlockN) + col) = ptx::pack_bf16x2(v0, v1);
    });
    __syncthreads();
    store_staged<kBlockN / kChunkElems, stage_stride(kBlockN)>(stage, w.rows, threadIdx.x, blockDim.x, [&](int row, int chunk) {
      return combine_chunk(c, t.home[row], t.token[row], t.slot[row], n0 + chunk * kChunkElems);
    });
    __syncthreads();
    for (int row = threadIdx.x; row < w.rows; row += blockDim.x) signal_home(c, t.home[row], t.token[row], signal_units(kBlockN));
    __syncthreads();  // the row table and stage are reused by the next task
  }
};

// ---- the warp-specialised tiles' stores straight from the accumulators (fragment_store.cuh) ----
// Gemm: a tile whose math warpgroup t / 128 holds rows [64 t, 64 t + 64) x kBlockN columns in the
// wgmma_c_coord layout (TileGemmTma, TileGemmTmaFp8): register 4 b + 2 h + e is column 8 b + 2 (lane % 4)
// + e of row r + 8 h (r: this thread's first row).
template <class Gemm>
struct FragmentStores {
  static constexpr int kBlockN = Gemm::kBlockN;

  // Rows [0, rows) of h from row h_row on (row stride I), output columns [nblock * kBlockN / 2, ...): gate in
  // tile columns [0, kBlockN / 2), up in [kBlockN / 2, kBlockN) (register reg + kBlockN / 4 is reg's up
  // value), times each row's top-k weight (row table t); then a barrier of g.
  template <class Transport, class Table>
  __device__ static void linear1(const FusedContext<Transport>& c, const typename Gemm::Accum& acc, const GemmTile& tile,
                                 int64_t h_row, int I, int rows, const Table& t, const ThreadGroup& g) {
    const int ct = static_cast<int>(threadIdx.x) - Gemm::kProducerThreads, lane = ct % 32;
    const float clamp = c.prm->swiglu_clamp;
    __nv_bfloat16* h = c.h + h_row * I + tile.nblock * (kBlockN / 2);
    float weight[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = fragment_row<kBlockN>(ct, half);
      weight[half] = row < rows ? t.weight[row] : 0.0f;
    }
    store_fragment_rows<kBlockN, kBlockN / 64>(
        ct, rows,
        [&](int half, int group, int j) {
          const int reg = 4 * (4 * group + j) + 2 * half, up = reg + kBlockN / 4;
          return ptx::pack_bf16x2(swiglu(acc.v[reg], acc.v[up], clamp) * weight[half],
                                  swiglu(acc.v[reg + 1], acc.v[up + 1], clamp) * weight[half]);
        },
        [&](int, int row, int group, const uint32_t (&w)[4]) {
          store_chunk(h + static_cast<int64_t>(row) * I + bf16_quad_chunk_col(lane, group), w);
        });
    g.sync();
  }

  // Tile rows [0, rows), output columns [nblock * kBlockN, ...) of each row's combine slot (row table t),
  // bf16; then a barrier of g (every store issued: the caller's release adds and slot release follow).
  template <class Transport, class Table>
  __device__ static void linear2(const FusedContext<Transport>& c, const typename Gemm::Accum& acc, const GemmTile& tile,
                                 int rows, const Table& t, const ThreadGroup& g) {
    const int ct = static_cast<int>(threadIdx.x) - Gemm::kProducerThreads, lane = ct % 32;
    const int n0 = tile.nblock * kBlockN;
    int4* dst[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int row = fragment_row<kBlockN>(ct, half);
      dst[half] = row < rows ? combine_chunk(c, t.home[row], t.token[row], t.slot[row], n0) : nullptr;
    }
    store_fragment_rows<kBlockN, kBlockN / 32>(
        ct, rows,
        [&](int half, int group, int j) {
          const int reg = 4 * (4 * group + j) + 2 * half;
          return ptx::pack_bf16x2(acc.v[reg], acc.v[reg + 1]);
        },
        [&](int half, int, int group, const uint32_t (&w)[4]) {
          store_chunk(dst[half] + bf16_quad_chunk_col(lane, group) / kChunkElems, w);
        });
    g.sync();
  }

  // The FP8 tile's Linear1 (TileGemmTmaFp8, kBlockN / 2 = one 1x128 group per row): h = swiglu_fp8 times each
  // row's top-k weight in fp32, quantised per row group (quantize_fragment_rows: common/fp8.h's
  // arithmetic) into rows [0, rows) of FP8 h from row h_row on, column group tile.nblock (the private h
  // region, regions.h: codes [N][I] bytes, then scales [N][fp8_scale_stride(I)] floats at
  // fp8_h_scale_offset). Then a barrier of g.
  template <class Transport, class Table>
  __device__ __forceinline__ static void linear1_fp8(const FusedContext<Transport>& c, const typename Gemm::Accum& acc,
                                                     const GemmTile& tile, int64_t h_row, int I, int rows, const Table& t,
                                                     const ThreadGroup& g) {
    constexpr int kOutCols = kBlockN / 2;
    const float clamp = c.prm->swiglu_clamp;
    // hv[i]: the m64n128 fragment's value i (wgmma_accum_coord(ct, i, 1, kBlockN)): visit_gate_up visits
    // registers 0, 2, ... of the gate half in order.
    float hv[kOutCols / 2];
    int j = 0;
    Gemm::template visit_gate_up<0, kOutCols>(acc, [&](int row, int, float g0, float g1, float u0, float u1) {
      const float weight = row < rows ? t.weight[row] : 0.0f;
      hv[j] = swiglu_fp8(g0, u0, clamp) * weight;
      hv[j + 1] = swiglu_fp8(g1, u1, clamp) * weight;
      j += 2;
    });
    trace::stamp_current(g.leader(), trace::kEpiSwiglu);
    uint8_t code[kOutCols / 2];
    float scale[2];
    quantize_fragment_rows(hv, c.prm->fp8.scale_format, code, scale);
    trace::stamp_current(g.leader(), trace::kEpiMath);
    float* hs = fp8_h_scales(c.prm->capacity, c.h) + h_row * fp8_scale_stride(I) + tile.nblock;
    uint8_t* hq = fp8_h_codes(c.h) + h_row * I + tile.nblock * kOutCols;
    const int ct = static_cast<int>(threadIdx.x) - Gemm::kProducerThreads, lane = ct % 32;
    // Code 4 b + 2 h + e is column 8 b + 2 (lane % 4) + e of row r + 8 h; a word holds a row's two codes
    // of blocks 2 m and 2 m + 1.
    const auto pair = [&](int b, int h) {
      return static_cast<uint32_t>(code[4 * b + 2 * h]) | (static_cast<uint32_t>(code[4 * b + 2 * h + 1]) << 8);
    };
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = fragment_row<kBlockN>(ct, h);
      if (row < rows && lane % 4 == 0) hs[static_cast<int64_t>(row) * fp8_scale_stride(I)] = scale[h];
    }
    store_fragment_rows<kBlockN, kOutCols / 64>(
        ct, rows, [&](int h, int group, int k) { return pair(8 * group + 2 * k, h) | (pair(8 * group + 2 * k + 1, h) << 16); },
        [&](int, int row, int group, const uint32_t (&w)[4]) {
          store_chunk(hq + static_cast<int64_t>(row) * I + fp8_quad_chunk_col(lane, group), fp8_quad_chunk(w).w);
        });
    g.sync();  // every store issued (ordered before the caller's release) and the row table read
  }
};

// ---- the FP8 tile's decode form (TileGemmTmaFp8::mainloop_swapped<kTokens>): at most kTokens rows a tile ----
// Register i of math thread ct is (row, column) swapped_coord<kRows>(ct, i): a row's columns spread over
// the 8 lanes of a warp that share lane % 4, and over the 8 math warps; a thread holds kRows / 4 rows
// (swapped_row_slot).
template <class Gemm, int kTokens>
struct SwappedStores {
  static constexpr int kRows = kTokens;
  static constexpr int kBlockRegs = kRows / 2;  // a block's registers; i and i + kBlockRegs: gate and up
  static constexpr int kSlots = kRows / 4;      // this thread's rows
  static constexpr int kMathWarps = Gemm::kConsumerThreads / 32;
  static constexpr int kOutCols = Gemm::kBlockN / 2;  // Linear1's h columns: one 1x128 group per row
  // The Linear1 epilogue's shared scratch: each math warp's amax of each row.
  static constexpr int kScratchBytes = kMathWarps * kRows * static_cast<int>(sizeof(float));
  using Acc = float[kRows];

  // Linear1 (FragmentStores::linear1_fp8's arithmetic: h = swiglu_fp8 times the row's top-k weight, one
  // 1x128 group per row quantised with common/fp8.h's scale) for rows [0, rows) of FP8 h from row h_row
  // on, column group tile.nblock. Registers i and i + kBlockRegs hold a row's gate and up of one h
  // column; a row's amax is reduced over its 8 lanes and then over the math warps through row_amax
  // (shared, kScratchBytes). Codes are stored a byte each (kBlockRegs a thread, a tile's kRows rows x 128
  // bytes). Then a barrier of g.
  template <class Transport, class Table>
  __device__ static void linear1_fp8(const FusedContext<Transport>& c, const Acc& acc, const GemmTile& tile, int64_t h_row,
                                     int I, int rows, const Table& t, float* row_amax, const ThreadGroup& g) {
    const int ct = static_cast<int>(threadIdx.x) - Gemm::kProducerThreads, lane = ct % 32, warp = ct / 32;
    const float clamp = c.prm->swiglu_clamp;
    float hv[kBlockRegs];
    float amax[kSlots];
#pragma unroll
    for (int e = 0; e < kSlots; ++e) amax[e] = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlockRegs; ++i) {
      const int row = swapped_coord<kRows>(ct, i).row;
      // Rows past `rows` read stale stage rows: no value of theirs may reach a real row's amax.
      hv[i] = row < rows ? swiglu_fp8(acc[i], acc[i + kBlockRegs], clamp) * t.weight[row] : 0.0f;
      amax[swapped_row_slot(i)] = fmaxf(amax[swapped_row_slot(i)], fabsf(hv[i]));
    }
#pragma unroll
    for (int e = 0; e < kSlots; ++e)
#pragma unroll
      for (int offset = 4; offset < 32; offset *= 2) amax[e] = fmaxf(amax[e], __shfl_xor_sync(~0u, amax[e], offset));
    trace::stamp_current(g.leader(), trace::kEpiSwiglu);
    if (lane < 4)
#pragma unroll
      for (int e = 0; e < kSlots; ++e) row_amax[warp * kRows + swapped_slot_row(e, lane)] = amax[e];
    g.sync();
    float scale[kSlots], inv[kSlots];
#pragma unroll
    for (int e = 0; e < kSlots; ++e) {
      float m = 0.0f;
#pragma unroll
      for (int w = 0; w < kMathWarps; ++w) m = fmaxf(m, row_amax[w * kRows + swapped_slot_row(e, lane)]);
      scale[e] = fp8::group_scale(m, c.prm->fp8.scale_format);
      inv[e] = __frcp_rn(scale[e]);  // as quantize_fragment_rows
    }
    trace::stamp_current(g.leader(), trace::kEpiMath);
    uint8_t* hq = fp8_h_codes(c.h) + h_row * I + tile.nblock * kOutCols;
#pragma unroll
    for (int i = 0; i < kBlockRegs; i += 2) {
      const uint32_t code = e4m3x2(hv[i] * inv[swapped_row_slot(i)], hv[i + 1] * inv[swapped_row_slot(i + 1)]);
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        const FragCoord at = swapped_coord<kRows>(ct, i + b);
        if (at.row < rows) hq[static_cast<int64_t>(at.row) * I + at.col] = static_cast<uint8_t>(code >> (8 * b));
      }
    }
    if (warp == 0 && lane < 4) {
      float* hs = fp8_h_scales(c.prm->capacity, c.h) + h_row * fp8_scale_stride(I) + tile.nblock;
#pragma unroll
      for (int e = 0; e < kSlots; ++e) {
        const int row = swapped_slot_row(e, lane);
        if (row < rows) hs[static_cast<int64_t>(row) * fp8_scale_stride(I)] = scale[e];
      }
    }
    g.sync();  // every store issued (ordered before the caller's release), row_amax and the row table read
  }

  // Linear2: rows [0, rows), output columns [nblock * kBlockN, ...) of each row's combine slot (row table
  // t), bf16, two columns a 4-byte store: lanes l and l ^ 4 hold a row's neighbouring columns (the lane
  // with the even one stores block 0's pair, the other block 1's). Then a barrier of g.
  template <class Transport, class Table>
  __device__ static void linear2(const FusedContext<Transport>& c, const Acc& acc, const GemmTile& tile, int rows,
                                 const Table& t, const ThreadGroup& g) {
    const int ct = static_cast<int>(threadIdx.x) - Gemm::kProducerThreads, lane = ct % 32;
    const int n0 = tile.nblock * Gemm::kBlockN;
    const bool even = ((lane / 4) & 1) == 0;  // this lane's columns are even
    __nv_bfloat16* dst[kSlots];
#pragma unroll
    for (int e = 0; e < kSlots; ++e) {
      const int row = swapped_slot_row(e, lane);
      dst[e] = row < rows ? reinterpret_cast<__nv_bfloat16*>(combine_chunk(c, t.home[row], t.token[row], t.slot[row], n0))
                          : nullptr;
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const float other = __shfl_xor_sync(~0u, acc[i], 4);
      const FragCoord at = swapped_coord<kRows>(ct, i);
      if ((i < kBlockRegs) == even && at.row < rows) {
        const uint32_t pair = even ? ptx::pack_bf16x2(acc[i], other) : ptx::pack_bf16x2(other, acc[i]);
        *reinterpret_cast<uint32_t*>(dst[swapped_row_slot(i % kBlockRegs)] + (even ? at.col : at.col - 1)) = pair;
      }
    }
    g.sync();
  }
};

}  // namespace epfuse::device
