// Index maps of the tensor-core tile GEMM (gemm_mainloop.cuh) and the SwiGLU epilogue (epilogue.cuh):
// shared-memory swizzle, ldmatrix source rows, mma.m16n8k16 fragment ownership, the gate/up
// interleave of w13 rows and the all-thread tiles' B-row maps (which weight row feeds each tile
// column). Plain arithmetic, identical on host and device, so the CPU tests (tests/cpu/gemm) check
// exactly what the kernels compute.
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace epfuse::device {

inline constexpr int kChunkElems = 8;  // bf16 elements per 16-byte chunk (one cp.async, one ldmatrix row)
inline constexpr int kSwizzleRows = 8; // 8 rows x 16 B cover the 32 four-byte shared-memory banks

// ---- shared memory: XOR swizzle of 16-byte chunks ----
// A shared tile row holds block_k bf16 (block_k / 8 chunks, block_k % 64 == 0). Logical chunk c of row
// r is stored at chunk c ^ (r % 8). An ldmatrix phase reads one chunk from each of 8 consecutive rows;
// unswizzled, rows of 128 or 256 bytes put all 8 in the same banks (8-way conflict); swizzled, the 8
// chunks land in 8 distinct bank groups. cp.async writes whole chunks, so it is conflict-free too.
EPFUSE_HD int swizzled_chunk(int row, int chunk) { return chunk ^ (row % kSwizzleRows); }

// Element offset of (row, chunk) in a [rows][block_k] bf16 tile.
EPFUSE_HD int smem_chunk_offset(int row, int chunk, int block_k) {
  return row * block_k + swizzled_chunk(row, chunk) * kChunkElems;
}

// ---- ldmatrix.x4 source addresses (lane l supplies the address of one 8-element row) ----
// A operand, a 16x16 (rows x k) block, matrices in mma order a0..a3 = (rows 0-7, k 0-7),
// (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15).
EPFUSE_HD int ldsm_a_row(int lane) { return lane % 16; }
EPFUSE_HD int ldsm_a_chunk(int lane) { return lane / 16; }
// B operand stored [n][k], a 16x16 (n x k) block: matrices = (n 0-7, k 0-7) -> b0 of the first n8,
// (n 0-7, k 8-15) -> b1 of the first n8, (n 8-15, k 0-7) -> b0 of the second, (n 8-15, k 8-15) -> b1.
EPFUSE_HD int ldsm_b_row(int lane) { return lane % 8 + (lane / 16) * 8; }
EPFUSE_HD int ldsm_b_chunk(int lane) { return (lane / 8) % 2; }

// ---- mma.m16n8k16 accumulator fragment (PTX ISA "Matrix Fragments for mma.m16n8k16") ----
// Register reg (0..3) of lane holds C[row][col] of the 16x8 tile.
struct FragCoord {
  int row;
  int col;
};
EPFUSE_HD FragCoord mma_c_coord(int lane, int reg) {
  return FragCoord{lane / 4 + (reg / 2) * 8, (lane % 4) * 2 + reg % 2};
}

// Tile coordinates of accumulator register (mi, ni, reg) of thread tid in a CTA of warps_m x warps_n
// warps (warp w owns warp tile (w / warps_n, w % warps_n) of warp_tile_m x warp_tile_n elements).
EPFUSE_HD FragCoord accum_coord(int tid, int mi, int ni, int reg, int warps_n, int warp_tile_m,
                                int warp_tile_n) {
  const int warp = tid / 32;
  const FragCoord c = mma_c_coord(tid % 32, reg);
  return FragCoord{(warp / warps_n) * warp_tile_m + mi * 16 + c.row,
                   (warp % warps_n) * warp_tile_n + ni * 8 + c.col};
}

// ---- global -> shared loads: chunk `index` of a [rows][block_k] tile, index = tid + i * threads ----
EPFUSE_HD int load_row(int index, int block_k) { return index / (block_k / kChunkElems); }
EPFUSE_HD int load_chunk(int index, int block_k) { return index % (block_k / kChunkElems); }

// ---- Linear1 + SwiGLU: gate/up interleave per 8-column group ----
// Tile column j of a SwiGLU tile reads w13 row swiglu_w13_row(j): within each 16 columns, the first 8
// are gate rows (W1, rows [0, I)) and the next 8 the up rows (W3, rows [I, 2I)) of the SAME 8 output
// columns. An mma n8 block is owned column-for-column by the same lanes, so gate and up of one output
// land in one thread (n8 blocks 2p and 2p+1), and a tile of block_n columns yields block_n / 2 outputs
// with no data exchange. The same holds for wgmma accumulators, whose n8 blocks repeat this layout.
EPFUSE_HD int swiglu_w13_row(int tile_col, int n_out0, int inter) {
  return n_out0 + (tile_col / 16) * 8 + tile_col % 8 + ((tile_col % 16) >= 8 ? inter : 0);
}
// Output column (relative to n_out0) computed from tile column tile_col (gate or up).
EPFUSE_HD int swiglu_out_col(int tile_col) { return (tile_col / 16) * 8 + tile_col % 8; }
EPFUSE_HD bool swiglu_is_up(int tile_col) { return (tile_col % 16) >= 8; }

// ---- B-row maps: the b_row operand of TileGemm / TileGemmWgmma's mainloop (T: the weight element) ----
// A plain Linear y = x W^T with W [N, K] row-major: tile column j reads row n0 + j.
template <class T>
struct DenseBRow {
  const T* weight;
  int K;
  int n0;
  EPFUSE_HD const T* operator()(int j) const { return weight + static_cast<int64_t>(n0 + j) * K; }
};
template <class T>
EPFUSE_HD DenseBRow<T> dense_b_row(const T* weight, int K, int n0) {
  return DenseBRow<T>{weight, K, n0};
}

// Linear1 + SwiGLU over one expert's w13 [2I, H] (rows [0, I) gate, [I, 2I) up): a tile of block_n
// columns computes outputs [n_out0, n_out0 + block_n / 2); n_out0 % 8 == 0 (swiglu_w13_row).
template <class T>
struct SwigluBRow {
  const T* w13;
  int H;
  int I;
  int n_out0;
  EPFUSE_HD const T* operator()(int j) const { return w13 + static_cast<int64_t>(swiglu_w13_row(j, n_out0, I)) * H; }
};
template <class T>
EPFUSE_HD SwigluBRow<T> swiglu_b_row(const T* w13_expert, int H, int I, int n_out0) {
  return SwigluBRow<T>{w13_expert, H, I, n_out0};
}

}  // namespace epfuse::device
