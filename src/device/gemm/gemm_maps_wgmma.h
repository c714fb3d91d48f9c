// Index maps of the Hopper wgmma tile GEMM (gemm_mainloop_wgmma.cuh): the shared-memory matrix
// descriptor, the 128-byte swizzle that descriptor names, and the wgmma accumulator fragment.
// Plain arithmetic, identical on host and device, so the CPU tests (tests/cpu/gemm) check exactly what
// the kernel computes. Sources: PTX ISA "Asynchronous Warpgroup Level Matrix Shared Memory Layout"
// (matrix descriptor format, canonical K-major layouts) and "Matrix Fragments for wgmma.m64nNk16".
#pragma once
#include <cstdint>

#include "common/host_device.h"
#include "device/gemm/gemm_maps.h"

namespace epfuse::device {

// ---- 128-byte swizzle (descriptor layout type 1), K-major operands ----
// A K-major tile is stored as rows of kSw128RowBytes (64 bf16 of K): the hardware reads 8-row x 128-byte
// atoms (1024 bytes, which must start on a 1024-byte boundary for base_offset 0) and XORs the 16-byte
// chunk index (address bits 4-6) with the row within the atom (address bits 7-9). With block_k = 64
// that is exactly gemm_maps.h's swizzled_chunk (chunk ^ row % 8), so cp.async writes each chunk with
// smem_chunk_offset(row, chunk, 64) and wgmma reads it back through the descriptor.
inline constexpr int kSw128RowBytes = 128;
inline constexpr int kSw128AtomBytes = 8 * kSw128RowBytes;  // 8 rows: the descriptor's stride byte offset
inline constexpr int kWgmmaBlockK = kSw128RowBytes / 2;     // bf16 elements of K per tile row (one atom wide)
inline constexpr int kWgmmaK = 16;                           // K of one wgmma.m64nNk16 (32 bytes of a row)
inline constexpr int kWgmmaM = 64;                           // rows of one wgmma (one warpgroup)
// TMA box of the weight tensor maps (src/fused/tensor_map.h): kWgmmaBlockK x kWeightBoxRows; the
// warp-specialised 128x256 tile loads two per stage.
inline constexpr int kWeightBoxRows = 128;

// The weight rows of a warp-specialised 128x256 tile, two boxes of kWeightBoxRows per stage: tile columns
// [0, 128) from rows [row0, row0 + 128) and [128, 256) from [row1, row1 + 128). Linear1 (w13 as
// [L * 2I, H]: an expert's gate rows, then its up rows I further): n-block nblock's gate rows and the
// same outputs' up rows; Linear2 (w2 as [L * H, I]): 256 consecutive rows.
struct TmaWeightRows {
  int row0;
  int row1;
};
EPFUSE_HD TmaWeightRows tma_weight_rows(bool linear1, int expert, int nblock, int H, int I) {
  const int row0 = linear1 ? (expert * 2 * I + nblock * kWeightBoxRows) : (expert * H + nblock * 2 * kWeightBoxRows);
  return {row0, row0 + (linear1 ? I : kWeightBoxRows)};
}

// The hardware's view: the physical shared-memory byte address of logical byte address `addr` under
// the 128-byte swizzle (absolute address bits, hence the 1024-byte alignment of every atom).
EPFUSE_HD uint32_t sw128_physical(uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

// The first swizzle-atom boundary at or after shared address `addr`: where the stages start.
EPFUSE_HD uint32_t sw128_align(uint32_t addr) {
  return (addr + kSw128AtomBytes - 1) & ~static_cast<uint32_t>(kSw128AtomBytes - 1);
}

// ---- shared-memory matrix descriptor (PTX ISA "Matrix Descriptor Format") ----
//   bits  0-13: start address >> 4        bits 16-29: leading dimension byte offset >> 4
//   bits 32-45: stride dimension byte offset >> 4
//   bits 49-51: base offset (0: every swizzle atom starts on a 1024-byte boundary)
//   bits 62-63: swizzle mode (1 = 128-byte)
// For a K-major swizzled operand the leading byte offset is unused ("assumed to be 1"): one wgmma reads
// 16 elements of K, which never leave a 128-byte row. The stride byte offset is the distance between
// 8-row groups: kSw128AtomBytes for rows packed back to back.
inline constexpr uint64_t kDescSwizzle128B = 1;
EPFUSE_HD uint64_t desc_encode(uint32_t bytes) { return (bytes & 0x3FFFFu) >> 4; }
EPFUSE_HD uint64_t make_sw128_kmajor_desc(uint32_t smem_addr) {
  return desc_encode(smem_addr) | (uint64_t{1} << 16) | (desc_encode(kSw128AtomBytes) << 32) |
         (kDescSwizzle128B << 62);
}
// Descriptor of the same operand `bytes` further on (k steps within a row: +32 bytes; row groups:
// +1024). Only the start-address field changes; shared addresses (< 228 KiB) never carry out of it.
EPFUSE_HD uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// What wgmma reads for element (row, k) (k < kWgmmaK) of a K-major operand with 128-byte swizzle,
// from the descriptor alone: the canonical layout ((8, m), (T, 2)) : ((8T, SBO), (1, T)), T = 8 bf16,
// i.e. byte (row % 8) * 128 + (row / 8) * SBO + 2k from the start address, then swizzled. The CPU
// tests emulate wgmma with this; the kernel never calls it.
EPFUSE_HD uint32_t sw128_kmajor_element_addr(uint64_t desc, int row, int k) {
  const uint32_t start = static_cast<uint32_t>(desc & 0x3FFFu) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3FFFu) << 4;
  return sw128_physical(start + static_cast<uint32_t>(row % 8) * kSw128RowBytes + static_cast<uint32_t>(row / 8) * sbo +
                        2u * static_cast<uint32_t>(k));
}

// ---- wgmma.m64nNk16 fp32 accumulator fragment ----
// Register reg (0 .. N/2 - 1) of thread t of a warpgroup: warp t / 32 owns rows [16 w, 16 w + 16); within
// each n8 block (4 registers, reg / 4) the layout is mma.m16n8's C fragment (mma_c_coord). So n8 blocks
// 2p and 2p + 1 (gate and up of swiglu_w13_row) are owned by the same thread, as for TileGemm.
EPFUSE_HD FragCoord wgmma_c_coord(int thread_in_group, int reg) {
  const FragCoord c = mma_c_coord(thread_in_group % 32, reg % 4);
  return FragCoord{(thread_in_group / 32) * 16 + c.row, (reg / 4) * 8 + c.col};
}

// ---- the decode form's accumulators (TileGemmTmaFp8::mainloop_swapped) ----
// The FP8 tile's decode form runs wgmma with the weights as M and at most kTokens tile rows as N
// (m64nNk32, N = kTokens: 8, 16 or 32): math warpgroup g's two m64 blocks are the tile's columns
// [64 g, 64 g + 64) (block 0) and [128 + 64 g, 192 + 64 g) (block 1), so that register i of block 0 and
// register i + kTokens / 2 of block 1 hold one row's columns col and col + 128: Linear1's gate and up of
// one h column, in one thread. Within a block, register r is wgmma_c_coord's (weight row, tile row).
// Register reg (0..kTokens - 1: two blocks of kTokens / 2) of math thread ct (0..255): (tile row, tile column).
template <int kTokens>
EPFUSE_HD FragCoord swapped_coord(int ct, int reg) {
  static_assert(kTokens == 8 || kTokens == 16 || kTokens == 32, "an m64nNk32 the decode form issues");
  constexpr int kBlockRegs = kTokens / 2;
  const FragCoord c = wgmma_c_coord(ct % 128, reg % kBlockRegs);  // row: the weight row in the block, col: the tile row
  return FragCoord{c.col, (reg / kBlockRegs) * 128 + (ct / 128) * 64 + c.row};
}
// The tile rows of a thread's decode-form registers: register r of a block (r < kTokens / 2) is row
// 8 (r / 4) + 2 (lane % 4) + r % 2, so a thread holds kTokens / 4 rows; swapped_row_slot numbers them
// (row 8 j + 2 (lane % 4) + e is slot 2 j + e).
EPFUSE_HD constexpr int swapped_row_slot(int block_reg) { return 2 * (block_reg / 4) + block_reg % 2; }
EPFUSE_HD constexpr int swapped_slot_row(int slot, int lane) { return 8 * (slot / 2) + 2 * (lane % 4) + slot % 2; }

// ---- the epilogues' stores straight from the accumulator fragment (fragment_store.cuh) ----
// Within an n8 block the 4 lanes of a quad hold one row's 8 columns, 2 each (wgmma_c_coord). A 4 x 4
// transpose of 32-bit words across the quad, in two shuffle rounds, leaves each lane 16 contiguous bytes
// of the row. Lane q (= lane % 4) starts with w[j], its word of block j of a group of 4; round r
// exchanges two words with lane q ^ (2 >> r): quad_send picks them, quad_take puts the partner's in
// place. After both rounds w[i] is lane i's word of block q.
EPFUSE_HD void quad_send(const uint32_t (&w)[4], int q, int round, uint32_t (&out)[2]) {
  const bool high = round == 0 ? (q & 2) != 0 : (q & 1) != 0;
  // Round 0: lanes 0, 1 send blocks 2, 3 (lanes 2, 3: blocks 0, 1). Round 1: even lanes send words 1, 3
  // (odd lanes: 0, 2).
  out[0] = round == 0 ? (high ? w[0] : w[2]) : (high ? w[0] : w[1]);
  out[1] = round == 0 ? (high ? w[1] : w[3]) : (high ? w[2] : w[3]);
}
EPFUSE_HD void quad_take(uint32_t (&w)[4], int q, int round, const uint32_t (&in)[2]) {
  const bool high = round == 0 ? (q & 2) != 0 : (q & 1) != 0;
  // Selects, not indices computed at run time: w stays in registers.
  const int a = round == 0 ? 1 : 2;  // the other word the high lane takes, besides w[0]
  w[0] = high ? in[0] : w[0];
  w[a] = high ? in[1] : w[a];
  w[3 - a] = high ? w[3 - a] : in[0];  // round 0: w[2]; round 1: w[1]
  w[3] = high ? w[3] : in[1];
}
// The lane each round exchanges with (shuffle xor).
EPFUSE_HD int quad_partner_mask(int round) { return round == 0 ? 2 : 1; }

// bf16 (one word = a row's 2 columns of one block): after the transpose of blocks [4 g, 4 g + 4) lane l
// holds the 8 columns (16 bytes) of block 4 g + l % 4.
EPFUSE_HD int bf16_quad_chunk_col(int lane, int group) { return 8 * (4 * group + lane % 4); }
// FP8 codes (one word = a row's 2 codes of block 2 m, then 2 of block 2 m + 1): after the transpose of
// words [4 g, 4 g + 4) (blocks [8 g, 8 g + 8)) lane l holds the words of blocks 8 g + 2 (l % 4) and the
// next; fp8_quad_chunk orders their bytes into columns [64 g + 16 (l % 4), + 16).
EPFUSE_HD int fp8_quad_chunk_col(int lane, int group) { return 64 * group + 16 * (lane % 4); }
EPFUSE_HD uint32_t low_halves(uint32_t a, uint32_t b) { return (a & 0xffffu) | (b << 16); }
EPFUSE_HD uint32_t high_halves(uint32_t a, uint32_t b) { return (a >> 16) | (b & 0xffff0000u); }
struct Chunk16 {
  uint32_t w[4];
};
EPFUSE_HD Chunk16 fp8_quad_chunk(const uint32_t (&w)[4]) {
  return {{low_halves(w[0], w[1]), low_halves(w[2], w[3]), high_halves(w[0], w[1]), high_halves(w[2], w[3])}};
}

// Tile coordinates of accumulator register reg of CTA thread tid when warpgroup g = tid / 128 owns the
// group tile (g / groups_n, g % groups_n) of kWgmmaM x group_tile_n elements.
EPFUSE_HD FragCoord wgmma_accum_coord(int tid, int reg, int groups_n, int group_tile_n) {
  const int group = tid / 128;
  const FragCoord c = wgmma_c_coord(tid % 128, reg);
  return FragCoord{(group / groups_n) * kWgmmaM + c.row, (group % groups_n) * group_tile_n + c.col};
}

// ---- the warp-specialised tile's A copies (gemm_mainloop_tma.cuh) ----
// Producer thread p of `producers` copies chunk producer_chunk(p) of rows producer_row(p, i),
// i < block_m * chunks_per_row / producers: consecutive threads take consecutive chunks of one row, so
// a warp's i-th cp.async covers 32 / chunks_per_row whole rows (whole 128-byte lines at block_k 64).
EPFUSE_HD int producer_chunk(int p, int chunks_per_row) { return p % chunks_per_row; }
EPFUSE_HD int producer_row(int p, int i, int producers, int chunks_per_row) {
  return p / chunks_per_row + i * (producers / chunks_per_row);
}

}  // namespace epfuse::device
