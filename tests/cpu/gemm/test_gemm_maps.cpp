// CPU tests of the tile GEMM's index arithmetic (src/device/gemm/gemm_maps.h) and tile-shape heuristics
// (src/fused/heuristics.h): swizzle, ldmatrix rows, mma fragment ownership, load coverage, the gate/up
// interleave. The fragment test emulates a warp's ldmatrix + mma.m16n8k16 from the PTX ISA's fragment
// definitions and checks the product, so a wrong map gives a wrong matrix, not just a wrong index.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "device/gemm/gemm_maps.h"
#include "fused/heuristics.h"

namespace epfuse::device {
namespace {

TEST(GemmMaps, SwizzleIsAPermutationOfEachRow) {
  for (int block_k : {64, 128, 256}) {
    const int chunks = block_k / kChunkElems;
    for (int row = 0; row < 64; ++row) {
      std::set<int> seen;
      for (int c = 0; c < chunks; ++c) {
        const int s = swizzled_chunk(row, c);
        ASSERT_GE(s, 0);
        ASSERT_LT(s, chunks);
        seen.insert(s);
      }
      EXPECT_EQ(static_cast<int>(seen.size()), chunks) << "row " << row << " block_k " << block_k;
    }
  }
}

// One ldmatrix phase reads one 16-byte chunk from each of 8 rows (the rows of one 8x8 matrix). Bank of a
// 4-byte word = (byte offset / 4) % 32; the 8 chunks must cover all 32 banks exactly once.
TEST(GemmMaps, LdmatrixPhasesAreBankConflictFree) {
  for (int block_k : {64, 128}) {
    for (int base_row = 0; base_row < 128; base_row += 8) {
      for (int chunk = 0; chunk < block_k / kChunkElems; ++chunk) {
        std::set<int> banks;
        for (int r = 0; r < 8; ++r) {
          const int byte = 2 * smem_chunk_offset(base_row + r, chunk, block_k);
          for (int w = 0; w < 4; ++w) banks.insert((byte / 4 + w) % 32);
        }
        EXPECT_EQ(banks.size(), 32u) << "rows " << base_row << ".. chunk " << chunk << " block_k " << block_k;
      }
    }
  }
}

TEST(GemmMaps, FragmentOwnershipCoversTileOnce) {
  for (const fused::GemmTileShape& s : {fused::kTileM32}) {  // the kernel's mma.sync shape
    const int wtm = s.block_m / s.warps_m, wtn = s.block_n / s.warps_n;
    std::vector<int> hits(s.block_m * s.block_n, 0);
    for (int tid = 0; tid < s.threads(); ++tid)
      for (int mi = 0; mi < wtm / 16; ++mi)
        for (int ni = 0; ni < wtn / 8; ++ni)
          for (int reg = 0; reg < 4; ++reg) {
            const FragCoord c = accum_coord(tid, mi, ni, reg, s.warps_n, wtm, wtn);
            ASSERT_GE(c.row, 0);
            ASSERT_LT(c.row, s.block_m);
            ASSERT_GE(c.col, 0);
            ASSERT_LT(c.col, s.block_n);
            ++hits[c.row * s.block_n + c.col];
          }
    for (int i = 0; i < s.block_m * s.block_n; ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
  }
}

TEST(GemmMaps, LoadsCoverTileOnce) {
  for (const fused::GemmTileShape& s : {fused::kTileM32}) {  // the kernel's mma.sync shape
    for (int rows : {s.block_m, s.block_n}) {
      const int chunks = rows * s.block_k / kChunkElems;
      std::vector<int> hits(chunks, 0);
      for (int index = 0; index < chunks; ++index) {
        const int r = load_row(index, s.block_k), c = load_chunk(index, s.block_k);
        ASSERT_LT(r, rows);
        ++hits[r * (s.block_k / kChunkElems) + c];
      }
      for (int h : hits) ASSERT_EQ(h, 1);
    }
  }
}

// Emulates one warp computing a 16x16 (two n8) x k16 product through swizzled shared memory exactly as
// gemm_mainloop.cuh does: ldmatrix.x4 with the lane addresses of ldsm_a_row/chunk and ldsm_b_row/chunk,
// then mma.m16n8k16 with the PTX fragment definitions, then accumulators read back via mma_c_coord.
TEST(GemmMaps, EmulatedWarpMmaMatchesProduct) {
  constexpr int kBlockK = 64, kRows = 32;
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> dist(-8, 8);
  std::vector<float> a(kRows * kBlockK), b(kRows * kBlockK);  // logical [row][k]
  for (auto& v : a) v = static_cast<float>(dist(rng));
  for (auto& v : b) v = static_cast<float>(dist(rng));
  std::vector<float> smem_a(kRows * kBlockK), smem_b(kRows * kBlockK);
  for (int r = 0; r < kRows; ++r)
    for (int k = 0; k < kBlockK; ++k) {
      smem_a[smem_chunk_offset(r, k / 8, kBlockK) + k % 8] = a[r * kBlockK + k];
      smem_b[smem_chunk_offset(r, k / 8, kBlockK) + k % 8] = b[r * kBlockK + k];
    }
  // ldmatrix.x4: matrix m's row q comes from the address of lane 8m + q; lane l receives elements
  // (l % 4) * 2, +1 of row l / 4 of every matrix, as register m.
  auto ldmatrix_x4 = [](const std::vector<float>& smem, auto lane_offset, float (&frag)[32][4][2]) {
    for (int lane = 0; lane < 32; ++lane)
      for (int m = 0; m < 4; ++m) {
        const int src = lane_offset(8 * m + lane / 4);
        frag[lane][m][0] = smem[src + (lane % 4) * 2];
        frag[lane][m][1] = smem[src + (lane % 4) * 2 + 1];
      }
  };
  for (int row0 : {0, 16})
    for (int col0 : {0, 16})
      for (int ks = 0; ks < kBlockK / 16; ++ks) {
        float fa[32][4][2], fb[32][4][2];
        ldmatrix_x4(smem_a, [&](int l) { return smem_chunk_offset(row0 + ldsm_a_row(l), 2 * ks + ldsm_a_chunk(l), kBlockK); }, fa);
        ldmatrix_x4(smem_b, [&](int l) { return smem_chunk_offset(col0 + ldsm_b_row(l), 2 * ks + ldsm_b_chunk(l), kBlockK); }, fb);
        for (int nh = 0; nh < 2; ++nh) {
          // PTX m16n8k16 .bf16: A reg i of lane (g = lane/4, t = lane%4) holds row g + 8*(i%2), k = 2t + 8*(i/2)
          // (+0, +1); B reg j holds k = 2t + 8j (+0, +1), n = g. Gather them into logical matrices.
          float am[16][16], bm[16][8];
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4, t = lane % 4;
            for (int i = 0; i < 4; ++i)
              for (int e = 0; e < 2; ++e) am[g + 8 * (i % 2)][2 * t + 8 * (i / 2) + e] = fa[lane][i][e];
            for (int j = 0; j < 2; ++j)
              for (int e = 0; e < 2; ++e) bm[2 * t + 8 * j + e][g] = fb[lane][2 * nh + j][e];
          }
          for (int lane = 0; lane < 32; ++lane)
            for (int reg = 0; reg < 4; ++reg) {
              const FragCoord c = mma_c_coord(lane, reg);
              float d = 0;
              for (int k = 0; k < 16; ++k) d += am[c.row][k] * bm[k][c.col];
              float expect = 0;
              for (int k = 0; k < 16; ++k)
                expect += a[(row0 + c.row) * kBlockK + 16 * ks + k] * b[(col0 + 8 * nh + c.col) * kBlockK + 16 * ks + k];
              ASSERT_EQ(d, expect) << "row0 " << row0 << " col0 " << col0 << " ks " << ks << " lane " << lane;
            }
        }
      }
}

TEST(GemmMaps, SwigluInterleavePairsGateAndUpInOneThread) {
  constexpr int kInter = 768;
  for (const fused::GemmTileShape& s : {fused::kTileM32}) {  // the kernel's mma.sync shape
    const int wtm = s.block_m / s.warps_m, wtn = s.block_n / s.warps_n;
    for (int n_block = 0; n_block < 2 * kInter / s.block_n; ++n_block) {
      const int n_out0 = n_block * s.block_n / 2;
      // The tile reads exactly gate rows [n_out0, n_out0 + block_n/2) and the matching up rows.
      std::set<int> rows;
      for (int j = 0; j < s.block_n; ++j) {
        const int w = swiglu_w13_row(j, n_out0, kInter);
        const int out = n_out0 + swiglu_out_col(j);
        EXPECT_EQ(w, swiglu_is_up(j) ? kInter + out : out);
        rows.insert(w);
      }
      ASSERT_EQ(static_cast<int>(rows.size()), s.block_n);
      EXPECT_EQ(*rows.begin(), n_out0);
      EXPECT_EQ(*rows.rbegin(), kInter + n_out0 + s.block_n / 2 - 1);
      // Gate in n8 block 2p and up in 2p + 1 of the same thread, same row, column + 8: one output.
      for (int tid = 0; tid < s.threads(); ++tid)
        for (int mi = 0; mi < wtm / 16; ++mi)
          for (int np = 0; np < wtn / 16; ++np)
            for (int reg = 0; reg < 4; ++reg) {
              const FragCoord g = accum_coord(tid, mi, 2 * np, reg, s.warps_n, wtm, wtn);
              const FragCoord u = accum_coord(tid, mi, 2 * np + 1, reg, s.warps_n, wtm, wtn);
              ASSERT_EQ(g.row, u.row);
              ASSERT_FALSE(swiglu_is_up(g.col));
              ASSERT_TRUE(swiglu_is_up(u.col));
              ASSERT_EQ(swiglu_out_col(g.col), swiglu_out_col(u.col));
              ASSERT_EQ(swiglu_w13_row(u.col, n_out0, kInter), kInter + swiglu_w13_row(g.col, n_out0, kInter));
            }
    }
  }
}

}  // namespace
}  // namespace epfuse::device
