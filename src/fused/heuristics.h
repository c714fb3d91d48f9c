// Tile shapes of the fused kernel's expert GEMMs, chosen from the problem shape: pure functions (host
// and device), so they can be unit-tested and printed. A shape names a TileGemm (mma.sync,
// src/device/gemm/gemm_mainloop.cuh) or, for the kWgmma shapes, a TileGemmWgmma
// (src/device/gemm/gemm_mainloop_wgmma.cuh); it is a compile-time property of a kernel. The fused kernel is
// instantiated for kFusedTileShapes only (picked by choose_bf16_tile); kWgmmaM128N256 is the
// all-thread twin of kTmaM128N256's math side, for the tile tests and benchmarks (tests/gpu/gemm).
#pragma once
#include "common/host_device.h"

namespace epfuse::fused {

// Which tile GEMM runs a shape: TileGemm (mma.sync, gemm_mainloop.cuh) or TileGemmWgmma (Hopper
// wgmma, gemm_mainloop_wgmma.cuh). Both take the same template arguments.
// kWgmmaTma: TileGemmTma (gemm_mainloop_tma.cuh): wgmma fed through an mbarrier ring, weights by TMA;
// only the 128x256 shape.
// kWgmmaTmaFp8: TileGemmTmaFp8 (gemm_mainloop_tma_fp8.cuh), the FP8 variant (weight_format fp8-block128
// only; block_k 128 e4m3 = one 128-byte row, as kWgmmaTma's 64 bf16).
// kWgmmaTmaFp8Decode: TileGemmTmaFp8Decode, the same tile whose tiles of at most 16 rows run its decode
// form (mainloop_swapped); a kernel of its own, so that kWgmmaTmaFp8's registers stay as they are.
// kWgmmaTmaFp8Split: TileGemmTmaFp8Split, the decode kernel with Linear2's tiles split over K.
enum class GemmMma : int { kMmaSync = 0, kWgmma = 1, kWgmmaTma = 2, kWgmmaTmaFp8 = 3, kWgmmaTmaFp8Decode = 4, kWgmmaTmaFp8Split = 5 };

struct GemmTileShape {
  int block_m;
  int block_n;
  int block_k;
  int stages;
  int warps_m;
  int warps_n;
  GemmMma mma = GemmMma::kMmaSync;

  // Math warps (warps_m x warps_n), plus the producer warpgroup of the warp-specialised kWgmmaTma.
  constexpr bool fp8() const {
    return mma == GemmMma::kWgmmaTmaFp8 || mma == GemmMma::kWgmmaTmaFp8Decode || mma == GemmMma::kWgmmaTmaFp8Split;
  }
  constexpr bool warp_specialised() const { return mma == GemmMma::kWgmmaTma || fp8(); }
  constexpr int threads() const { return 32 * warps_m * warps_n + (warp_specialised() ? 128 : 0); }
  // The wgmma stages start on a 1024-byte boundary (128-byte swizzle atoms): one atom of slack; the
  // mbarrier ring adds two barriers per stage. (The fused kernel adds its row tables and staging:
  // ExpertTiles / WarpSpecialisedTiles::kSmemBytes, expert_ffn.cuh.)
  constexpr int smem_bytes() const {
    return stages * (block_m + block_n) * block_k * (fp8() ? 1 : 2) +
           (mma == GemmMma::kMmaSync ? 0 : 1024) + (warp_specialised() ? 2 * stages * 8 : 0);
  }
  constexpr bool operator==(const GemmTileShape&) const = default;
};

// Decode (<= 32 rows per expert): the layer is bound by weight bytes (1.3 ms of weights vs 0.1 ms of
// math at dsv3 T=128 on an H200; tools/bench/floor.h computes both), so the tile is shaped for bytes in flight, not for math: M = 32
// (the mma m16 pair), K-block 128 so each stage moves 32 KiB of weights, 4 stages = 160 KiB of smem,
// ~96 KiB of weights in flight per SM (132 SMs x 96 KiB / ~2 us latency ~ 6 TB/s > HBM). 8 warps as
// 1x8 (32x16 warp tiles) so many threads issue copies.
inline constexpr GemmTileShape kTileM32{32, 128, 128, 4, 1, 8};

// Hopper wgmma shapes (TileGemmWgmma): 2 warpgroups of 64 rows (warps 8 x 1), K-block 64 = one 128-byte
// swizzle row. The tensor cores read both operands from shared memory, so unlike mma.sync there is no
// ldmatrix traffic through the register file; what limits is keeping the MMAs fed.
//  - 128x256: each warpgroup one m64n256k16 per k16 (128 accumulators per thread); 4 stages = 192 KiB
//    (+1 KiB alignment), 2 k-blocks loading while one is computed and one finishes.
//  - 128x128: m64n128k16 (64 accumulators); 6 stages = 192 KiB, 4 k-blocks loading. Twice the tiles
//    of 128x256, for 65..255 rows per expert or few experts.
inline constexpr GemmTileShape kWgmmaM128N256{128, 256, 64, 4, 8, 1, GemmMma::kWgmma};
inline constexpr GemmTileShape kWgmmaM128N128{128, 128, 64, 6, 8, 1, GemmMma::kWgmma};
inline constexpr GemmTileShape kWgmmaTileShapes[] = {kWgmmaM128N256, kWgmmaM128N128};
// The 128x256 tile through an mbarrier ring (TileGemmTma): same math warps and stages as kWgmmaM128N256,
// plus a producer warpgroup that loads ahead (weights by TMA, gathered rows by cp.async), 3 k-blocks in
// flight, no CTA barrier per k-block.
inline constexpr GemmTileShape kTmaM128N256{128, 256, 64, 4, 8, 1, GemmMma::kWgmmaTma};

// Can this shape run a GEMM with n output columns (tile columns: 2 * outputs for Linear1 + SwiGLU) over
// k? The mainloop has no K tail and no N tail: k % block_k == 0, n % block_n == 0.
EPFUSE_HD bool gemm_tile_supports(GemmTileShape s, int n, int k) {
  return n > 0 && k > 0 && n % s.block_n == 0 && k % s.block_k == 0;
}

// Can this shape run both expert GEMMs of a layer (Linear1: n = 2I, k = H; Linear2: n = H, k = I)?
EPFUSE_HD bool ffn_tile_supports(GemmTileShape s, int hidden, int intermediate) {
  return gemm_tile_supports(s, 2 * intermediate, hidden) && gemm_tile_supports(s, hidden, intermediate);
}

// The bf16 layer's tile, measured in the layer at qwen3-30b's, dsv3's and mixtral's per-GPU shapes
// (docs/performance.md#the-bf16-tile-choice-in-the-layer-2026-11-30), from the rows a local expert gets,
// the local experts and the grid (CTAs):
//  1. <= 24 rows: kTileM32 (mma.sync), a weight stream: 4-5% ahead of the 128-row tiles at qwen3-30b from
//     16 to 24 rows, even at dsv3; at 28 rows 5-6% behind.
//  2. more, when the 128x256 TMA tile gives the GEMM of fewer n-blocks at least a grid of tiles:
//     kTmaM128N256, 5-17% ahead of the others from 28 rows at qwen3-30b and dsv3 (a warpgroup of padding
//     rows runs no MMA).
//  3. else (few experts, as mixtral's two a GPU): kTileM32 up to 32 rows, kWgmmaM128N128 above, with twice
//     the tiles of 128x256 (mixtral at 128 rows: 20% ahead).
// A shape that cannot tile the layer (H % 256, I % 128, ...) gives way to kWgmmaM128N128, then
// kTmaM128N256, then kTileM32; block_m == 0 when none fits. Only these three shapes: each is one
// instantiation of the fused kernel (kFusedTileShapes), and compile time counts.
EPFUSE_HD GemmTileShape choose_bf16_tile(int rows_per_expert, int local_experts, int grid, int hidden, int intermediate) {
  // Local copies: device code cannot refer to the namespace-scope (host) constants.
  constexpr GemmTileShape m32 = kTileM32, wide = kTmaM128N256, n128 = kWgmmaM128N128;
  const long long rows = rows_per_expert > 1 ? rows_per_expert : 1;
  const long long narrow_n = 2 * intermediate < hidden ? 2 * intermediate : hidden;
  const long long wide_tiles = local_experts * ((rows + wide.block_m - 1) / wide.block_m) * (narrow_n / wide.block_n);
  const GemmTileShape preferred = rows_per_expert <= 24 ? m32 : wide_tiles >= grid ? wide : rows_per_expert <= 32 ? m32 : n128;
  if (ffn_tile_supports(preferred, hidden, intermediate)) return preferred;
  if (ffn_tile_supports(n128, hidden, intermediate)) return n128;
  if (ffn_tile_supports(wide, hidden, intermediate)) return wide;
  if (ffn_tile_supports(m32, hidden, intermediate)) return m32;
  return GemmTileShape{0, 0, 0, 0, 0, 0};
}

// The shapes the fused kernel is instantiated for: everything choose_bf16_tile can return.
// The FP8 fused kernel's tile (TileGemmTmaFp8): 128 x 256, k-block 128 e4m3 (one scale block), 4 stages.
// Every weight_format fp8-block128 config runs it, whatever T (padding rows are not loaded); not in
// kFusedTileShapes (those are the bf16 kernels).
inline constexpr GemmTileShape kTmaFp8M128N256{128, 256, 128, 4, 8, 1, GemmMma::kWgmmaTmaFp8};
// Its decode kernel (TileGemmTmaFp8Decode): the call's tiles of at most 16 rows (kSwappedTokens) in the
// decode form, the others in the 64-row form as n64 quarters (a lower register peak than kTmaFp8M128N256's
// halves). Chosen when a local expert gets at most kFp8DecodeRowsPerExpert rows on average
// (choose_fused_tile): up to 16 it was 1-4% faster than the 64-row kernel at qwen3-30b's and dsv3's
// per-GPU shapes, at 32 rows even (docs/performance.md#the-fp8-decode-kernel-up-to-more-rows-an-expert-2026-11-30).
inline constexpr GemmTileShape kTmaFp8M128N256Decode{128, 256, 128, 4, 8, 1, GemmMma::kWgmmaTmaFp8Decode};
inline constexpr int kFp8DecodeRowsPerExpert = 16;
// The decode kernel with Linear2's K split (TileGemmTmaFp8Split; task_map.h linear2_call_parts): where a call
// has at most half the grid's Linear2 tiles and a long I (mixtral: 2 experts a GPU, I = 14336), each tile's K
// in parts on CTAs of their own. Chosen where the call's expected tiles take two parts or more
// (choose_fused_tile): on an H200 mixtral T = 1-128 13-16% faster than the kernel chosen before (4 parts),
// T = 256 5% (2 parts) (docs/performance.md#linear2-split-over-k-2026-12-02-the-split-kernel).
inline constexpr GemmTileShape kTmaFp8M128N256Split{128, 256, 128, 4, 8, 1, GemmMma::kWgmmaTmaFp8Split};
inline constexpr GemmTileShape kFusedTileShapes[] = {kTmaM128N256, kWgmmaM128N128, kTileM32};

}  // namespace epfuse::fused
