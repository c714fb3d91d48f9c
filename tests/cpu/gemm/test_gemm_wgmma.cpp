// CPU tests of the wgmma tile GEMM's index arithmetic (src/device/gemm/gemm_maps_wgmma.h) and of the Hopper
// tile-shape choice (src/fused/heuristics.h): descriptor encoding (against an independent bit-field
// view of the PTX ISA table), the 128-byte swizzle against gemm_maps.h's XOR swizzle, accumulator
// ownership (against CUTLASS's CLayout_64xN formula), and an emulation of a whole CTA tile:
// cp.async placement as gemm_mainloop_wgmma.cuh does it, wgmma operand reads through the descriptors
// it builds, accumulators handed out by the PTX fragment layout and read back through visit /
// visit_col16's maps; the epilogues' quad-transposed stores from the registers (quad_send / quad_take).
// A wrong encoding or map gives a wrong matrix, not just a wrong index.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "device/gemm/gemm_maps.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "fused/heuristics.h"

namespace epfuse::device {
namespace {

// The descriptor as the PTX ISA's "Matrix Descriptor Format" table lays it out (GCC allocates
// bit-fields from the least significant bit on x86-64, as CUTLASS's GmmaDescriptor relies on).
struct DescBits {
  uint64_t start : 14, : 2;
  uint64_t leading : 14, : 2;
  uint64_t stride : 14, : 3;
  uint64_t base_offset : 3, : 10;
  uint64_t swizzle : 2;
};
static_assert(sizeof(DescBits) == 8);

DescBits decode(uint64_t desc) {
  DescBits b;
  std::memcpy(&b, &desc, sizeof(b));
  return b;
}

TEST(GemmWgmmaMaps, DescriptorFields) {
  for (uint32_t addr : {0u, 0x400u, 0x4000u, 0x10400u, 0x30000u, 227u * 1024u - 1024u}) {
    const uint64_t desc = make_sw128_kmajor_desc(addr);
    const DescBits b = decode(desc);
    EXPECT_EQ(b.start, addr >> 4) << addr;
    EXPECT_EQ(b.leading, 1u);       // unused for swizzled K-major, "assumed to be 1"
    EXPECT_EQ(b.stride, 1024u >> 4);  // 8 rows x 128 bytes between row groups
    EXPECT_EQ(b.base_offset, 0u);   // atoms start on 1024-byte boundaries
    EXPECT_EQ(b.swizzle, 1u);       // 128-byte swizzle
    DescBits manual{};
    manual.start = addr >> 4;
    manual.leading = 1;
    manual.stride = 64;
    manual.swizzle = 1;
    uint64_t expect = 0;
    std::memcpy(&expect, &manual, sizeof(expect));
    EXPECT_EQ(desc, expect);
  }
  // One literal, worked by hand from the table: start 0x400 >> 4 = 0x40, LBO 1 << 16, SBO 64 << 32,
  // swizzle 1 << 62.
  EXPECT_EQ(make_sw128_kmajor_desc(0x400), 0x4000004000010040ull);
}

TEST(GemmWgmmaMaps, DescriptorAdvanceMovesOnlyTheStart) {
  // Every (stage, k step) start of a 228 KiB shared memory: the start field never carries.
  for (uint32_t base : {0x400u, 0x8000u, 0x1fc00u})
    for (uint32_t bytes : {0u, 32u, 64u, 96u, 1024u, 8192u, 16384u, 3u * 32768u, 3u * 49152u})
      if (base + bytes < 228u * 1024u) {
        EXPECT_EQ(desc_advance(make_sw128_kmajor_desc(base), bytes), make_sw128_kmajor_desc(base + bytes))
            << base << " + " << bytes;
      }
}

TEST(GemmWgmmaMaps, AlignIsTheNextAtomBoundary) {
  EXPECT_EQ(sw128_align(0), 0u);
  EXPECT_EQ(sw128_align(16), 1024u);
  EXPECT_EQ(sw128_align(1024), 1024u);
  EXPECT_EQ(sw128_align(1040), 2048u);
  for (uint32_t a = 0; a < 8192; a += 16) {
    EXPECT_EQ(sw128_align(a) % 1024, 0u);
    EXPECT_GE(sw128_align(a), a);
    EXPECT_LT(sw128_align(a) - a, 1024u);
  }
}

// The cp.async side (gemm_maps.h's XOR swizzle with block_k = 64) and the hardware's 128-byte swizzle
// put every 16-byte chunk of a tile at the same byte, for tiles starting on any atom boundary.
TEST(GemmWgmmaMaps, Sw128MatchesXorSwizzleOfBlockK64) {
  for (uint32_t base : {0u, 1024u, 0x1c000u})
    for (int row = 0; row < 256; ++row)
      for (int chunk = 0; chunk < 8; ++chunk) {
        const uint32_t logical = base + static_cast<uint32_t>(row * kSw128RowBytes + chunk * 16);
        EXPECT_EQ(sw128_physical(logical), base + 2u * static_cast<uint32_t>(smem_chunk_offset(row, chunk, kWgmmaBlockK)))
            << "row " << row << " chunk " << chunk;
      }
  // Within an atom the swizzle is a permutation of the 64 chunks.
  std::set<uint32_t> seen;
  for (uint32_t a = 0; a < 1024; a += 16) seen.insert(sw128_physical(a));
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_EQ(*seen.rbegin(), 1008u);
}

// CUTLASS's CLayout_64xN: (thread (4, 8, 4) : (128, 1, 16), value (2, 2, N/8) : (64, 8, 512)) -> m + 64 n.
TEST(GemmWgmmaMaps, AccumulatorFragmentMatchesClayout64xN) {
  for (int n : {64, 128, 256})
    for (int t = 0; t < 128; ++t)
      for (int reg = 0; reg < n / 2; ++reg) {
        const int t0 = t % 4, t1 = (t / 4) % 8, t2 = t / 32;
        const int v0 = reg % 2, v1 = (reg / 2) % 2, v2 = reg / 4;
        const int offset = t0 * 128 + t1 + t2 * 16 + v0 * 64 + v1 * 8 + v2 * 512;
        const FragCoord c = wgmma_c_coord(t, reg);
        EXPECT_EQ(c.row, offset % 64) << "t " << t << " reg " << reg;
        EXPECT_EQ(c.col, offset / 64) << "t " << t << " reg " << reg;
      }
}

// The epilogues' stores from the registers (fragment_store.cuh): a quad's two shuffle rounds emulated
// with quad_send / quad_take over a warpgroup's 64 x 256 fragment (values laid out by wgmma_c_coord), each
// lane's chunk written where bf16_quad_chunk_col / fp8_quad_chunk_col put it, as the epilogues do. Every
// (row, column) must be written exactly once, with its own value.
void emulate_quad_rounds(std::vector<std::array<uint32_t, 4>>& lanes) {  // one entry per lane of a warp
  for (int round = 0; round < 2; ++round) {
    std::vector<std::array<uint32_t, 2>> sent(lanes.size());
    for (size_t l = 0; l < lanes.size(); ++l) {
      uint32_t w[4] = {lanes[l][0], lanes[l][1], lanes[l][2], lanes[l][3]}, out[2];
      quad_send(w, static_cast<int>(l % 4), round, out);
      sent[l] = {out[0], out[1]};
    }
    for (size_t l = 0; l < lanes.size(); ++l) {
      const size_t partner = l ^ static_cast<size_t>(quad_partner_mask(round));
      uint32_t w[4] = {lanes[l][0], lanes[l][1], lanes[l][2], lanes[l][3]};
      const uint32_t in[2] = {sent[partner][0], sent[partner][1]};
      quad_take(w, static_cast<int>(l % 4), round, in);
      lanes[l] = {w[0], w[1], w[2], w[3]};
    }
  }
}

TEST(GemmWgmmaMaps, QuadStoresPutEveryBf16ValueInItsColumn) {
  constexpr int kN = 256;
  const auto value = [](int row, int col) { return static_cast<uint16_t>(1 + row * kN + col); };  // distinct, never 0
  std::vector<uint16_t> out(64 * kN, 0);
  for (int warp = 0; warp < 4; ++warp)
    for (int h = 0; h < 2; ++h)
      for (int group = 0; group < kN / 32; ++group) {
        std::vector<std::array<uint32_t, 4>> lanes(32);
        for (int lane = 0; lane < 32; ++lane)
          for (int j = 0; j < 4; ++j) {  // the word of block 4 group + j: registers reg, reg + 1
            const int reg = 4 * (4 * group + j) + 2 * h;
            const FragCoord a = wgmma_c_coord(32 * warp + lane, reg), b = wgmma_c_coord(32 * warp + lane, reg + 1);
            ASSERT_EQ(a.row, b.row);
            ASSERT_EQ(b.col, a.col + 1);
            lanes[lane][j] = value(a.row, a.col) | (static_cast<uint32_t>(value(b.row, b.col)) << 16);
          }
        emulate_quad_rounds(lanes);
        for (int lane = 0; lane < 32; ++lane) {
          const int row = wgmma_c_coord(32 * warp + lane, 2 * h).row, col = bf16_quad_chunk_col(lane, group);
          for (int e = 0; e < 8; ++e) {  // the 16-byte chunk: 8 bf16, little-endian words
            uint16_t& slot = out[row * kN + col + e];
            EXPECT_EQ(slot, 0) << "written twice: row " << row << " col " << col + e;
            slot = static_cast<uint16_t>(lanes[lane][e / 2] >> (16 * (e % 2)));
          }
        }
      }
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < kN; ++col) ASSERT_EQ(out[row * kN + col], value(row, col)) << "row " << row << " col " << col;
}

TEST(GemmWgmmaMaps, QuadStoresPutEveryFp8CodeInItsColumn) {
  constexpr int kCols = 128;  // a Linear1 tile's h columns: the gate half's 16 blocks, one code each
  const auto code = [](int row, int col) { return static_cast<uint8_t>(1 + (row * 7 + col * 13) % 251); };
  std::vector<int> out(64 * kCols, -1);
  for (int warp = 0; warp < 4; ++warp)
    for (int h = 0; h < 2; ++h)
      for (int group = 0; group < kCols / 64; ++group) {
        std::vector<std::array<uint32_t, 4>> lanes(32);
        for (int lane = 0; lane < 32; ++lane)
          for (int k = 0; k < 4; ++k) {  // blocks 8 group + 2 k and the next, a row's 2 codes of each
            uint32_t word = 0;
            for (int half = 0; half < 2; ++half) {
              const int reg = 4 * (8 * group + 2 * k + half) + 2 * h;
              const FragCoord a = wgmma_c_coord(32 * warp + lane, reg), b = wgmma_c_coord(32 * warp + lane, reg + 1);
              word |= (static_cast<uint32_t>(code(a.row, a.col)) | (static_cast<uint32_t>(code(b.row, b.col)) << 8)) << (16 * half);
            }
            lanes[lane][k] = word;
          }
        emulate_quad_rounds(lanes);
        for (int lane = 0; lane < 32; ++lane) {
          const uint32_t w[4] = {lanes[lane][0], lanes[lane][1], lanes[lane][2], lanes[lane][3]};
          const Chunk16 chunk = fp8_quad_chunk(w);
          const int row = wgmma_c_coord(32 * warp + lane, 2 * h).row, col = fp8_quad_chunk_col(lane, group);
          for (int e = 0; e < 16; ++e) {
            int& slot = out[row * kCols + col + e];
            EXPECT_EQ(slot, -1) << "written twice: row " << row << " col " << col + e;
            slot = static_cast<int>((chunk.w[e / 4] >> (8 * (e % 4))) & 0xffu);
          }
        }
      }
  for (int row = 0; row < 64; ++row)
    for (int col = 0; col < kCols; ++col) ASSERT_EQ(out[row * kCols + col], code(row, col)) << "row " << row << " col " << col;
}

// The FP8 tile runs a warpgroup's 64 x 256 as two n128 halves (gemm_fp8.cuh
// fp8_block_mma_promote_halves): half h's register i must be register 64 h + i of the 64 x 256
// accumulators (same row, column + 128 h), and B rows [128 h, 128 h + 128) must be what a descriptor
// advanced by 128 h rows of 128 bytes reads as its rows [0, 128).
TEST(GemmWgmmaMaps, N128HalvesAreSlicesOfTheN256Tile) {
  for (int t = 0; t < 128; ++t)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 64; ++i) {
        const FragCoord half = wgmma_c_coord(t, i), whole = wgmma_c_coord(t, 64 * h + i);
        EXPECT_EQ(whole.row, half.row) << "t " << t << " h " << h << " reg " << i;
        EXPECT_EQ(whole.col, half.col + 128 * h) << "t " << t << " h " << h << " reg " << i;
      }
  const uint64_t desc = make_sw128_kmajor_desc(0x8000);
  for (int h = 0; h < 2; ++h)
    for (int row = 0; row < 128; ++row)
      for (int k = 0; k < kWgmmaK; ++k)
        EXPECT_EQ(sw128_kmajor_element_addr(desc_advance(desc, static_cast<uint32_t>(h * 128 * kSw128RowBytes)), row, k),
                  sw128_kmajor_element_addr(desc, 128 * h + row, k))
            << "h " << h << " row " << row << " k " << k;
}

// The FP8 tile's decode form (TileGemmTmaFp8::mainloop_swapped) at each token count it can run (8, 16,
// 32): C^T's m64nN fragments, block m of math warpgroup g read from B rows [128 m + 64 g, ...) through a
// descriptor advanced by that many rows. Each (tile row < N, column < 256) must be held once over the 256
// math threads; register i + N / 2 must be register i's column + 128 (gate and up of one h column, in
// one thread); the mapping must be the PTX m64nN fragment with M and N exchanged (written out here from
// the ISA's figure: D row 16 w + l / 4 + 8 (i / 2 % 2), column 8 (i / 4) + 2 (l % 4) + i % 2); and the
// row slots (swapped_row_slot, swapped_slot_row) must name each register's row.
template <int kTokens>
void check_swapped_fragment() {
  constexpr int kBlockRegs = kTokens / 2;
  std::vector<int> seen(kTokens * 256, 0);
  for (int ct = 0; ct < 256; ++ct)
    for (int i = 0; i < kTokens; ++i) {
      const FragCoord c = swapped_coord<kTokens>(ct, i);
      const int g = ct / 128, w = (ct % 128) / 32, l = ct % 32, m = i / kBlockRegs, r = i % kBlockRegs;
      EXPECT_EQ(c.row, 8 * (r / 4) + 2 * (l % 4) + r % 2) << "N " << kTokens << " ct " << ct << " reg " << i;
      EXPECT_EQ(c.col, 128 * m + 64 * g + 16 * w + l / 4 + 8 * (r / 2 % 2)) << "N " << kTokens << " ct " << ct << " reg " << i;
      EXPECT_EQ(swapped_slot_row(swapped_row_slot(r), l), c.row) << "N " << kTokens << " ct " << ct << " reg " << i;
      ASSERT_TRUE(c.row >= 0 && c.row < kTokens && c.col >= 0 && c.col < 256);
      ++seen[c.row * 256 + c.col];
      if (m == 0) {
        const FragCoord up = swapped_coord<kTokens>(ct, i + kBlockRegs);
        EXPECT_EQ(up.row, c.row);
        EXPECT_EQ(up.col, c.col + 128);
      }
    }
  for (int e = 0; e < kTokens * 256; ++e) EXPECT_EQ(seen[e], 1) << "N " << kTokens << " row " << e / 256 << " col " << e % 256;
}
TEST(GemmWgmmaMaps, SwappedFragmentCoversDecodeTileOnce) {
  check_swapped_fragment<8>();
  check_swapped_fragment<16>();
  check_swapped_fragment<32>();
  const uint64_t desc = make_sw128_kmajor_desc(0x8000);
  for (int g = 0; g < 2; ++g)
    for (int m = 0; m < 2; ++m)
      for (int row = 0; row < kWgmmaM; ++row)
        for (int k = 0; k < kWgmmaK; ++k)
          EXPECT_EQ(sw128_kmajor_element_addr(desc_advance(desc, static_cast<uint32_t>((128 * m + 64 * g) * kSw128RowBytes)), row, k),
                    sw128_kmajor_element_addr(desc, 128 * m + 64 * g + row, k))
              << "g " << g << " m " << m << " row " << row << " k " << k;
}

TEST(GemmWgmmaMaps, AccumulatorsCoverTileOnce) {
  for (const fused::GemmTileShape& s : fused::kWgmmaTileShapes) {
    const int groups_n = s.warps_n, group_tile_n = s.block_n / groups_n;
    std::vector<int> hits(s.block_m * s.block_n, 0);
    for (int tid = 0; tid < s.threads(); ++tid)
      for (int reg = 0; reg < group_tile_n / 2; ++reg) {
        const FragCoord c = wgmma_accum_coord(tid, reg, groups_n, group_tile_n);
        ASSERT_GE(c.row, 0);
        ASSERT_LT(c.row, s.block_m);
        ASSERT_GE(c.col, 0);
        ASSERT_LT(c.col, s.block_n);
        ++hits[c.row * s.block_n + c.col];
      }
    for (int i = 0; i < s.block_m * s.block_n; ++i) ASSERT_EQ(hits[i], 1) << "element " << i;
  }
}

// A CTA tile of one wgmma shape, emulated end to end (see the file comment). kGroupsN = warps_n,
// warpgroups along M = warps_m / 4; the kernel's loops (load slots, k steps, registers) are mirrored.
void emulate_tile(const fused::GemmTileShape& s, int K, int valid_rows, uint32_t caller_smem) {
  ASSERT_EQ(s.block_k, kWgmmaBlockK);
  const int threads = s.threads(), groups_n = s.warps_n, group_tile_n = s.block_n / groups_n;
  const int chunks_per_row = s.block_k / kChunkElems;
  const int stage_bytes_a = s.block_m * s.block_k * 2, stage_bytes_b = s.block_n * s.block_k * 2;
  std::mt19937 rng(777 + s.block_n + K);
  std::uniform_int_distribution<int> dist(-4, 4);
  std::vector<float> a(s.block_m * K), b(s.block_n * K);
  for (auto& v : a) v = static_cast<float>(dist(rng));
  for (auto& v : b) v = static_cast<float>(dist(rng));

  // Shared memory as bytes, each 2-byte slot holding the index+1 of the element there (0 = zeros).
  const uint32_t base_a = sw128_align(caller_smem);
  const uint32_t base_b = base_a + s.stages * stage_bytes_a;
  const uint32_t smem_end = caller_smem + static_cast<uint32_t>(s.smem_bytes());
  ASSERT_LE(base_b + s.stages * stage_bytes_b, smem_end);
  std::vector<float> smem(smem_end / 2, std::nanf(""));
  auto put = [&](uint32_t byte, float v) {
    ASSERT_EQ(byte % 2, 0u);
    ASSERT_GE(byte, caller_smem);
    ASSERT_LT(byte, smem_end);
    smem[byte / 2] = v;
  };
  auto get = [&](uint32_t byte) { return smem[byte / 2]; };

  std::vector<double> d(s.block_m * s.block_n, 0.0);  // what the accumulators hold, by tile element
  const int stages_used = K / s.block_k;
  for (int kb = 0; kb < stages_used; ++kb) {
    const int stage = kb % s.stages;
    // Copies: slot index = tid + i * threads -> (row, chunk), 16 bytes at 2 * smem_chunk_offset.
    for (int index = 0; index < s.block_m * chunks_per_row; ++index) {
      const int row = load_row(index, s.block_k), chunk = load_chunk(index, s.block_k);
      const uint32_t dst = base_a + stage * stage_bytes_a + 2u * smem_chunk_offset(row, chunk, s.block_k);
      for (int e = 0; e < kChunkElems; ++e)
        put(dst + 2 * e, row < valid_rows ? a[row * K + kb * s.block_k + chunk * kChunkElems + e] : 0.0f);
    }
    for (int index = 0; index < s.block_n * chunks_per_row; ++index) {
      const int row = load_row(index, s.block_k), chunk = load_chunk(index, s.block_k);
      const uint32_t dst = base_b + stage * stage_bytes_b + 2u * smem_chunk_offset(row, chunk, s.block_k);
      for (int e = 0; e < kChunkElems; ++e) put(dst + 2 * e, b[row * K + kb * s.block_k + chunk * kChunkElems + e]);
    }
    // MMAs: warpgroup g, descriptors exactly as the mainloop builds them.
    for (int g = 0; g < threads / 128; ++g) {
      const uint64_t desc_a0 = make_sw128_kmajor_desc(base_a + (g / groups_n) * kWgmmaM * kSw128RowBytes);
      const uint64_t desc_b0 = make_sw128_kmajor_desc(base_b + (g % groups_n) * group_tile_n * kSw128RowBytes);
      const uint64_t desc_a = desc_advance(desc_a0, stage * stage_bytes_a);
      const uint64_t desc_b = desc_advance(desc_b0, stage * stage_bytes_b);
      for (int ks = 0; ks < s.block_k / kWgmmaK; ++ks) {
        const uint64_t da = desc_advance(desc_a, ks * kWgmmaK * 2), db = desc_advance(desc_b, ks * kWgmmaK * 2);
        for (int m = 0; m < kWgmmaM; ++m)
          for (int n = 0; n < group_tile_n; ++n) {
            double sum = 0;
            for (int k = 0; k < kWgmmaK; ++k)
              sum += double(get(sw128_kmajor_element_addr(da, m, k))) * double(get(sw128_kmajor_element_addr(db, n, k)));
            d[((g / groups_n) * kWgmmaM + m) * s.block_n + (g % groups_n) * group_tile_n + n] += sum;
          }
      }
    }
  }
  // Registers by the PTX fragment layout (wgmma_c_coord within the warpgroup's own tile).
  std::vector<std::vector<double>> regs(threads, std::vector<double>(group_tile_n / 2));
  for (int tid = 0; tid < threads; ++tid) {
    const int g = tid / 128;
    for (int reg = 0; reg < group_tile_n / 2; ++reg) {
      const FragCoord c = wgmma_c_coord(tid % 128, reg);
      regs[tid][reg] = d[((g / groups_n) * kWgmmaM + c.row) * s.block_n + (g % groups_n) * group_tile_n + c.col];
    }
  }
  auto expect = [&](int row, int col) {
    double sum = 0;
    if (row < valid_rows)
      for (int k = 0; k < K; ++k) sum += double(a[row * K + k]) * double(b[col * K + k]);
    return sum;
  };
  // visit: (row, col, v[reg], v[reg + 1]) for even reg.
  std::vector<int> seen(s.block_m * s.block_n, 0);
  for (int tid = 0; tid < threads; ++tid)
    for (int reg = 0; reg < group_tile_n / 2; reg += 2) {
      const FragCoord c = wgmma_accum_coord(tid, reg, groups_n, group_tile_n);
      ASSERT_EQ(c.col % 2, 0);
      ASSERT_EQ(regs[tid][reg], expect(c.row, c.col)) << "tid " << tid << " reg " << reg;
      ASSERT_EQ(regs[tid][reg + 1], expect(c.row, c.col + 1)) << "tid " << tid << " reg " << reg + 1;
      seen[c.row * s.block_n + c.col] += 1;
      seen[c.row * s.block_n + c.col + 1] += 1;
    }
  for (int v : seen) ASSERT_EQ(v, 1);
  // visit_col16: (row, col, v[lo], v[lo + 1], v[hi], v[hi + 1]), lo = 8 np + 2 half, hi = lo + 4 is
  // column col + 8; and the SwiGLU pairing (gate, up of one output) holds.
  for (int tid = 0; tid < threads; ++tid)
    for (int np = 0; np < group_tile_n / 16; ++np)
      for (int half = 0; half < 2; ++half) {
        const int lo = 8 * np + 2 * half, hi = lo + 4;
        const FragCoord c = wgmma_accum_coord(tid, lo, groups_n, group_tile_n);
        ASSERT_EQ(regs[tid][lo], expect(c.row, c.col));
        ASSERT_EQ(regs[tid][lo + 1], expect(c.row, c.col + 1));
        ASSERT_EQ(regs[tid][hi], expect(c.row, c.col + 8));
        ASSERT_EQ(regs[tid][hi + 1], expect(c.row, c.col + 9));
        ASSERT_FALSE(swiglu_is_up(c.col));
        ASSERT_TRUE(swiglu_is_up(c.col + 8));
        ASSERT_EQ(swiglu_out_col(c.col), swiglu_out_col(c.col + 8));
      }
}

TEST(GemmWgmmaMaps, EmulatedTileMatchesProduct) {
  for (const fused::GemmTileShape& s : fused::kWgmmaTileShapes) {
    // K over more k-blocks than stages (stage reuse); a full tile and a ragged one (zero padding rows);
    // a caller buffer that is not atom-aligned.
    emulate_tile(s, s.block_k * (s.stages + 2), s.block_m, 0x10);
    emulate_tile(s, s.block_k * 2, 77, 0x400);
  }
}

// The warp-specialised tile's producer copies: every (row, chunk) of a 128-row A stage exactly once, and
// each warp instruction (fixed i) covers whole rows (4 rows of 8 chunks: whole 128-byte lines).
TEST(GemmTmaMaps, ProducerCopiesCoverStageOnceInWholeRows) {
  constexpr int kProducers = 128, kChunks = kWgmmaBlockK / kChunkElems, kRows = 128;
  constexpr int kPerThread = kRows * kChunks / kProducers;
  std::vector<int> hits(kRows * kChunks, 0);
  for (int p = 0; p < kProducers; ++p)
    for (int i = 0; i < kPerThread; ++i) {
      const int row = producer_row(p, i, kProducers, kChunks), chunk = producer_chunk(p, kChunks);
      ASSERT_GE(row, 0);
      ASSERT_LT(row, kRows);
      ++hits[row * kChunks + chunk];
    }
  for (int h : hits) EXPECT_EQ(h, 1);
  for (int warp = 0; warp < kProducers / 32; ++warp)
    for (int i = 0; i < kPerThread; ++i) {
      std::set<int> rows;
      std::vector<int> chunks_of_row(kRows, 0);
      for (int lane = 0; lane < 32; ++lane) {
        const int row = producer_row(warp * 32 + lane, i, kProducers, kChunks);
        rows.insert(row);
        ++chunks_of_row[row];
      }
      EXPECT_EQ(rows.size(), 32u / kChunks) << "warp " << warp << " copy " << i;
      for (int r : rows) EXPECT_EQ(chunks_of_row[r], kChunks) << "row " << r << " split across instructions";
    }
}

// The 128x256 tile's epilogue passes: gate pair j of a math thread (registers 2j, 2j + 1; up at + 64)
// lies in output pass j / 16 (64 columns each), so a pass stages exactly registers of that pass, and
// every gate column of the tile is owned once over the 256 math threads.
// The FP8 kernel's Linear1 epilogue (expert_ffn_fp8.cuh) on the 128 x 256 tile's gate half: math thread
// ct's fragment value i (i < 64, wgmma_accum_coord(ct, i, 1, 256)) is column c < 128 of row r; values
// [32 P, 32 P + 32) are the columns [64 P, 64 P + 64) (its two staging passes); values with
// (i >> 1) & 1 == 0 are the thread's first row and 1 its second (quantize_fragment_rows' scale[0/1]); a
// row's 128 columns are the 4 threads of one quad (its amax shuffles 1 and 2); column 0 of each row is
// written by exactly one thread (its scale store), and every (row, column) once.
TEST(GemmTmaMaps, Fp8HEpilogueFragmentMap) {
  std::vector<int> seen(128 * 128, 0), scale_writers(128, 0);
  for (int ct = 0; ct < 256; ++ct) {
    const int row0 = wgmma_accum_coord(ct, 0, 1, 256).row;
    for (int i = 0; i < 64; ++i) {
      const FragCoord f = wgmma_accum_coord(ct, i, 1, 256);
      ASSERT_LT(f.col, 128);
      EXPECT_EQ(f.col / 64, i / 32) << ct << " " << i;
      EXPECT_EQ(f.row, row0 + 8 * ((i >> 1) & 1)) << ct << " " << i;
      EXPECT_EQ(wgmma_accum_coord(ct ^ 1, i, 1, 256).row, f.row);  // quad partners: same rows
      EXPECT_EQ(wgmma_accum_coord(ct ^ 2, i, 1, 256).row, f.row);
      if (i % 2 == 0) {
        EXPECT_EQ(wgmma_accum_coord(ct, i + 1, 1, 256).col, f.col + 1);
      }
      ++seen[f.row * 128 + f.col];
      if (f.col == 0) ++scale_writers[f.row];
    }
  }
  for (int v : seen) EXPECT_EQ(v, 1);
  for (int v : scale_writers) EXPECT_EQ(v, 1);
}

TEST(GemmTmaMaps, GatePairsFallInTheirPass) {
  constexpr int kMath = 256, kPairs = 32, kPassPairs = 16, kPassCols = 64, kN = 256;
  std::vector<int> hits(128 * 128, 0);
  for (int t = 0; t < kMath; ++t)
    for (int pair = 0; pair < kPairs; ++pair) {
      const FragCoord gate = wgmma_accum_coord(t, 2 * pair, 1, kN);
      const FragCoord up = wgmma_accum_coord(t, 2 * pair + kN / 4, 1, kN);
      EXPECT_EQ(up.row, gate.row);
      EXPECT_EQ(up.col, gate.col + kN / 2);
      EXPECT_EQ(gate.col / kPassCols, pair / kPassPairs) << "thread " << t << " pair " << pair;
      ASSERT_LT(gate.col, kN / 2);
      ++hits[gate.row * 128 + gate.col];
      ++hits[gate.row * 128 + gate.col + 1];
    }
  for (int h : hits) EXPECT_EQ(h, 1);
}

TEST(GemmWgmmaHeuristics, TmaShapeHasAProducerWarpgroup) {
  EXPECT_EQ(fused::kTmaM128N256.threads(), 384);
  EXPECT_EQ(fused::kWgmmaM128N256.threads(), 256);
}

TEST(GemmWgmmaHeuristics, WgmmaShapesFitAndTile) {
  for (const fused::GemmTileShape& s : fused::kWgmmaTileShapes) {
    EXPECT_EQ(s.mma, fused::GemmMma::kWgmma);
    EXPECT_EQ(s.block_k, kWgmmaBlockK);
    EXPECT_EQ(s.block_m, (s.warps_m / 4) * kWgmmaM);
    EXPECT_EQ(s.smem_bytes(), s.stages * (s.block_m + s.block_n) * s.block_k * 2 + kSw128AtomBytes);
    // + the fused kernel's per-tile row table (a few KiB) must still fit the 227 KiB opt-in limit.
    EXPECT_LE(s.smem_bytes() + 8 * 1024, 227 * 1024);
    // A wgmma shape is never mistaken for an mma.sync one (the dispatch compares whole shapes).
    EXPECT_FALSE(s == fused::kTileM32);
  }
}

TEST(GemmWgmmaHeuristics, Bf16Choice) {
  using fused::choose_bf16_tile;
  // (rows an expert, local experts, grid, H, I): dsv3, qwen3-30b and mixtral at world 4 on 132 SMs.
  EXPECT_EQ(choose_bf16_tile(512, 64, 132, 7168, 2048), fused::kTmaM128N256);   // dsv3 T=4096
  EXPECT_EQ(choose_bf16_tile(128, 64, 132, 7168, 2048), fused::kTmaM128N256);   // dsv3 T=1024
  EXPECT_EQ(choose_bf16_tile(33, 64, 132, 7168, 2048), fused::kTmaM128N256);
  EXPECT_EQ(choose_bf16_tile(25, 64, 132, 7168, 2048), fused::kTmaM128N256);    // 64 x 16 n-blocks of Linear1
  EXPECT_EQ(choose_bf16_tile(24, 64, 132, 7168, 2048), fused::kTileM32);        // dsv3 T=192: a weight stream
  EXPECT_EQ(choose_bf16_tile(16, 64, 132, 7168, 2048), fused::kTileM32);        // dsv3 T=128
  EXPECT_EQ(choose_bf16_tile(32, 32, 132, 2048, 768), fused::kTmaM128N256);     // qwen3-30b T=128: 32 x 6 tiles
  EXPECT_EQ(choose_bf16_tile(32, 16, 132, 2048, 768), fused::kTileM32);         // 16 x 6 < 132
  EXPECT_EQ(choose_bf16_tile(4096, 2, 132, 4096, 14336), fused::kTmaM128N256);  // mixtral T=4096
  EXPECT_EQ(choose_bf16_tile(512, 2, 132, 4096, 14336), fused::kWgmmaM128N128); // 2 x 4 x 16 Linear2 tiles < 132
  EXPECT_EQ(choose_bf16_tile(640, 2, 132, 4096, 14336), fused::kTmaM128N256);   // 2 x 5 x 16 >= 132
  EXPECT_EQ(choose_bf16_tile(64, 2, 132, 4096, 14336), fused::kWgmmaM128N128);
  EXPECT_EQ(choose_bf16_tile(32, 2, 132, 4096, 14336), fused::kTileM32);
  EXPECT_EQ(choose_bf16_tile(0, 2, 132, 4096, 14336), fused::kTileM32);
  EXPECT_EQ(choose_bf16_tile(512, 64, 132, 7168 + 128, 2048), fused::kWgmmaM128N128);  // H % 256 != 0
  EXPECT_EQ(choose_bf16_tile(16, 32, 132, 2048, 192), fused::kWgmmaM128N128);   // I % 128 != 0: no M32
  EXPECT_EQ(choose_bf16_tile(16, 32, 132, 1000, 2048).block_m, 0);
  for (int rows : {0, 1, 16, 24, 25, 33, 64, 128, 255, 512, 4096})
    for (int experts : {1, 2, 32, 64})
      for (int grid : {1, 8, 132})
        for (int H : {128, 256, 384, 2048, 7168})
          for (int I : {64, 128, 768, 2048, 14336}) {
            const fused::GemmTileShape s = choose_bf16_tile(rows, experts, grid, H, I);
            // Every layer whose dimensions are multiples of 128 and 64 tiles, with a shape the kernel has.
            ASSERT_NE(s.block_m, 0) << H << " " << I;
            EXPECT_TRUE(fused::ffn_tile_supports(s, H, I));
            bool fused_shape = false;
            for (const fused::GemmTileShape& f : fused::kFusedTileShapes) fused_shape = fused_shape || f == s;
            EXPECT_TRUE(fused_shape);
          }
}

// The weight rows of the 128x256 TMA tiles (tma_weight_rows): over an expert's n-blocks, Linear1's
// first boxes cover its gate rows [2 I e, 2 I e + I) once and its second boxes the up rows I further,
// with the same outputs in both (row1 - row0 = I); Linear2's two boxes cover w2's rows [H e, H e + H) once.
TEST(GemmTmaMaps, WeightRowsCoverEachExpertOnce) {
  for (const auto& [H, I] : {std::pair{7168, 2048}, std::pair{2048, 768}, std::pair{4096, 14336}, std::pair{256, 128}})
    for (int e : {0, 1, 5}) {
      std::set<int> gate, up, w2;
      for (int nb = 0; nb < 2 * I / 256; ++nb) {
        const TmaWeightRows r = tma_weight_rows(true, e, nb, H, I);
        EXPECT_EQ(r.row1 - r.row0, I);
        for (int j = 0; j < kWeightBoxRows; ++j) {
          EXPECT_TRUE(gate.insert(r.row0 + j).second);
          EXPECT_TRUE(up.insert(r.row1 + j).second);
        }
      }
      for (int nb = 0; nb < H / 256; ++nb) {
        const TmaWeightRows r = tma_weight_rows(false, e, nb, H, I);
        for (int j = 0; j < kWeightBoxRows; ++j) {
          EXPECT_TRUE(w2.insert(r.row0 + j).second);
          EXPECT_TRUE(w2.insert(r.row1 + j).second);
        }
      }
      ASSERT_EQ(static_cast<int>(gate.size()), I);
      EXPECT_EQ(*gate.begin(), 2 * I * e);
      EXPECT_EQ(*gate.rbegin(), 2 * I * e + I - 1);
      EXPECT_EQ(*up.begin(), 2 * I * e + I);
      EXPECT_EQ(*up.rbegin(), 2 * I * (e + 1) - 1);
      ASSERT_EQ(static_cast<int>(w2.size()), H);
      EXPECT_EQ(*w2.begin(), H * e);
      EXPECT_EQ(*w2.rbegin(), H * (e + 1) - 1);
    }
}

}  // namespace
}  // namespace epfuse::device
