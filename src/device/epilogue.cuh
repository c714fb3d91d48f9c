// Epilogues of the expert FFN tiles, on top of TileGemm's accumulator visitors (gemm_mainloop.cuh):
//  - B-row maps: which weight row feeds each tile column (plain Linear, and Linear1 with gate/up
//    interleaved per 8 columns so SwiGLU needs no data exchange between threads);
//  - visit_swiglu: h = silu(min(gate, c)) * clamp(up, -c, c) (clamp only when c > 0) for pairs of
//    output columns; the caller applies the row's top-k weight and stores bf16 (pack_bf16x2).
// Stores stay with the caller: where a row goes (local h, a peer's combine buffer) is protocol.
#pragma once
#include <cuda_bf16.h>

#include "device/gemm_maps.h"
#include "device/ptx.cuh"

namespace epfuse::device {

// B rows for a plain Linear y = x W^T with W [N, K] row-major: tile column j reads row n0 + j.
struct DenseBRow {
  const __nv_bfloat16* weight;
  int K;
  int n0;
  __device__ const __nv_bfloat16* operator()(int j) const {
    return weight + static_cast<int64_t>(n0 + j) * K;
  }
};
__device__ __forceinline__ DenseBRow dense_b_row(const __nv_bfloat16* weight, int K, int n0) {
  return DenseBRow{weight, K, n0};
}

// B rows for Linear1 + SwiGLU over one expert's w13 [2I, H] (rows [0, I) gate, [I, 2I) up): a tile of
// block_n columns computes outputs [n_out0, n_out0 + block_n / 2); n_out0 % 8 == 0 (swiglu_w13_row).
struct SwigluBRow {
  const __nv_bfloat16* w13;
  int H;
  int I;
  int n_out0;
  __device__ const __nv_bfloat16* operator()(int j) const {
    return w13 + static_cast<int64_t>(swiglu_w13_row(j, n_out0, I)) * H;
  }
};
__device__ __forceinline__ SwigluBRow swiglu_b_row(const __nv_bfloat16* w13_expert, int H, int I, int n_out0) {
  return SwigluBRow{w13_expert, H, I, n_out0};
}

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
// from swiglu_b_row (gate and up interleaved per 8 columns, visit_col16). (TileGemmTma loads gate and up
// as column halves; its epilogue is in gemm_region.cuh.)
template <class Gemm, class F>
__device__ __forceinline__ void visit_swiglu(const typename Gemm::Accum& acc, float clamp, F f) {
  Gemm::visit_col16(acc, [&](int row, int col, float g0, float g1, float u0, float u1) {
    f(row, swiglu_out_col(col), swiglu(g0, u0, clamp), swiglu(g1, u1, clamp));
  });
}

}  // namespace epfuse::device
