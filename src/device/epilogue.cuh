// The epilogues of the expert FFN tiles, for every tile GEMM: what a finished tile's accumulators
// become and where they go.
//   Linear1: h = silu(min(gate, c)) * clamp(up, -c, c) (clamp only when c > 0) times the pair's top-k
//     weight, bf16, into h (local, expert-contiguous); then the tile counts itself done for its m-block
//     (l1_tile_done), which Linear2 tiles wait for.
//   Linear2: bf16 rows into their home ranks' combine slots (token, top-k slot) over NVLink; then one
//     release add per row on the token's signal at home (signal_home), which the combine waits for.
// Both stage the bf16 outputs in shared memory and write whole 16-byte chunks (store_staged):
//   - the all-thread tiles (TileGemm, TileGemmWgmma) stage the whole tile in the ring their mainloop
//     left free (Linear1: gate and up interleaved per 8 columns, visit_swiglu);
//   - the warp-specialised tile (TileGemmTma) stages 64 columns a pass beside the ring, which stays busy
//     with the next tile's loads (StagedPasses; gate and up as column halves, visit_gate_up).
// The row table (expert_ffn.cuh RowTableOf: each row's top-k weight, home, token and slot) is the
// caller's.
#pragma once
#include <cstdint>
#include <utility>

#include <cuda_bf16.h>

#include "device/context.cuh"
#include "device/gemm_maps.h"
#include "device/ptx.cuh"
#include "device/routing.h"
#include "device/signals.cuh"
#include "device/thread_group.cuh"

namespace epfuse::device {

// silu(min(gate, c)) * clamp(up, -c, c), clamp only when c > 0 (DeepSeek's swiglu_limit), in fp32.
__device__ __forceinline__ float swiglu(float gate, float up, float clamp) {
  if (clamp > 0.0f) {
    gate = fminf(gate, clamp);
    up = fminf(fmaxf(up, -clamp), clamp);
  }
  // __fdividef / __expf: approximate division and exponent (a few instructions each; relative error
  // ~1e-6, far below bf16's 4e-3). gate -> -inf: the denominator overflows to inf and the quotient is
  // 0, the limit of silu.
  return __fdividef(gate, 1.0f + __expf(-gate)) * up;
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

// f.template operator()<I>() for I = 0 .. kN - 1: passes over accumulator registers need compile-time
// register indices.
template <int kN, class F>
__device__ __forceinline__ void static_for(F&& f) {
  [&]<int... Is>(std::integer_sequence<int, Is...>) { (f.template operator()<Is>(), ...); }(std::make_integer_sequence<int, kN>{});
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

// ---- the warp-specialised tile (TileGemmTma): the math warps stage 64 columns a pass ----
// The caller frees its task slot between the stores and the signals (the release adds wait ~1 us for
// the CTA's stores; only the adding threads wait).
// kPassCols_: 64 for TileGemmTma; the FP8 kernel (expert_ffn_fp8.cuh) stages 32 a pass, as its larger
// ring leaves less shared memory.
template <class Gemm, int kPassCols_ = 64>
struct StagedPasses {
  static constexpr int kBlockM = Gemm::kBlockM;
  static constexpr int kBlockN = Gemm::kBlockN;
  static constexpr int kPassCols = kPassCols_;                    // output columns per pass
  static constexpr int kStageStride = stage_stride(kPassCols);   // padded: one accumulator store's 8 rows on distinct banks
  static constexpr int kPassChunks = kPassCols / kChunkElems;
  static constexpr int kStageElems = kBlockM * kStageStride;     // the staging tile, beside the ring

  // Writes one staged pass (rows x kPassCols) in 16-byte chunks to dst(row, chunk), then frees the
  // staging tile.
  template <class Dst>
  __device__ static void store_pass(const __nv_bfloat16* stage, int rows, const ThreadGroup& g, Dst dst) {
    g.sync();  // the pass is staged
    store_staged<kPassChunks, kStageStride>(stage, rows, g.rank(), g.count, dst);
    g.sync();
  }

  // Rows [0, rows) of h from row h_row on (row stride I), output columns [nblock * kBlockN / 2, ...):
  // gate in tile columns [0, kBlockN / 2), up in [kBlockN / 2, kBlockN).
  template <class Transport, class Table>
  __device__ static void linear1(const FusedContext<Transport>& c, const typename Gemm::Accum& acc, const GemmTile& tile,
                                 int64_t h_row, int I, int rows, const Table& t, __nv_bfloat16* stage, const ThreadGroup& g) {
    const FusedParams& prm = *c.prm;
    const float clamp = prm.swiglu_clamp;
    __nv_bfloat16* h = c.h + h_row * I + tile.nblock * (kBlockN / 2);
    static_for<kBlockN / 2 / kPassCols>([&]<int P>() {
      Gemm::template visit_gate_up<P * kPassCols, (P + 1) * kPassCols>(
          acc, [&](int row, int col, float g0, float g1, float u0, float u1) {
            const float weight = row < rows ? t.weight[row] : 0.0f;
            *reinterpret_cast<uint32_t*>(stage + row * kStageStride + col - P * kPassCols) =
                ptx::pack_bf16x2(swiglu(g0, u0, clamp) * weight, swiglu(g1, u1, clamp) * weight);
          });
      store_pass(stage, rows, g, [&](int row, int chunk) {
        return reinterpret_cast<int4*>(h + static_cast<int64_t>(row) * I + P * kPassCols + chunk * kChunkElems);
      });
    });
  }

  // Rows [0, rows), output columns [nblock * kBlockN, ...) of each row's combine slot.
  template <class Transport, class Table>
  __device__ static void linear2(const FusedContext<Transport>& c, const typename Gemm::Accum& acc, const GemmTile& tile,
                                 int rows, const Table& t, __nv_bfloat16* stage, const ThreadGroup& g) {
    const int n0 = tile.nblock * kBlockN;
    static_for<kBlockN / kPassCols>([&]<int P>() {
      Gemm::template visit_cols<P * kPassCols, (P + 1) * kPassCols>(acc, [&](int row, int col, float v0, float v1) {
        *reinterpret_cast<uint32_t*>(stage + row * kStageStride + col - P * kPassCols) = ptx::pack_bf16x2(v0, v1);
      });
      store_pass(stage, rows, g, [&](int row, int chunk) {
        return combine_chunk(c, t.home[row], t.token[row], t.slot[row], n0 + P * kPassCols + chunk * kChunkElems);
      });
    });
  }
};

}  // namespace epfuse::device
