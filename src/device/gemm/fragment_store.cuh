// The epilogues' stores straight from a warpgroup's wgmma accumulator fragment, without staging it in
// shared memory: a 4 x 4 transpose of 32-bit words across each quad of lanes (gemm_maps_wgmma.h
// quad_send / quad_take, two shuffle rounds) gives every lane 16 contiguous bytes of its row, stored as
// one 16-byte chunk; a quad writes 64 contiguous bytes of a row. Why: the staged passes cost two barriers
// of the 256 math threads a pass, 16 for a Linear2 tile of the FP8 kernel, with the tensor cores idle
// (docs/performance.md#epilogues: 7-8 us a Linear2 tile).
#pragma once
#include <cstdint>

#include "device/gemm/gemm_maps_wgmma.h"

namespace epfuse::device {

// Lane q (= lane % 4) of each quad: w[j] is its word of block j; on return w[i] is lane i's word of
// block q. Every lane of the warp calls it.
__device__ __forceinline__ void quad_transpose(uint32_t (&w)[4]) {
  const int q = static_cast<int>(threadIdx.x % 4);
#pragma unroll
  for (int round = 0; round < 2; ++round) {
    uint32_t out[2];
    quad_send(w, q, round, out);
    const uint32_t in[2] = {__shfl_xor_sync(~0u, out[0], quad_partner_mask(round)),
                            __shfl_xor_sync(~0u, out[1], quad_partner_mask(round))};
    quad_take(w, q, round, in);
  }
}

// The tile row of this thread's accumulator half (half 0: r, half 1: r + 8; wgmma_c_coord) in a tile of
// kBlockN columns: what store_fragment_rows stores, and what its callers look up per row beforehand.
template <int kBlockN>
__device__ __forceinline__ int fragment_row(int ct, int half) {
  return wgmma_accum_coord(ct, 2 * half, 1, kBlockN).row;
}

// The stores of this thread's part of a warpgroup's 64 x kBlockN accumulator tile: for each of its two
// rows (half 0: r, half 1: r + 8; wgmma_c_coord) and each group of 4 words, word(half, group, j) gives
// word j, the quad transposes them (every lane takes part) and, when the row is one of the tile's `rows`
// real rows, store(half, row, group, w) writes the lane's 16 bytes. ct: the thread within the math
// warpgroups.
template <int kBlockN, int kGroups, class Word, class Store>
__device__ __forceinline__ void store_fragment_rows(int ct, int rows, Word word, Store store) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = fragment_row<kBlockN>(ct, half);
#pragma unroll
    for (int group = 0; group < kGroups; ++group) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = word(half, group, j);
      quad_transpose(w);
      if (row < rows) store(half, row, group, w);
    }
  }
}

__device__ __forceinline__ void store_chunk(void* dst, const uint32_t (&w)[4]) {
  *reinterpret_cast<int4*>(dst) = make_int4(static_cast<int>(w[0]), static_cast<int>(w[1]), static_cast<int>(w[2]),
                                            static_cast<int>(w[3]));
}

}  // namespace epfuse::device
