// The tile GEMM contract, as C++20 concepts the compiler checks: every mainloop variant the fused kernel
// instantiates (heuristics.h kFusedTileShapes) satisfies TileGemmKind, and the kernel picks its CTA
// program by the concept (fused_kernel.cu): an AllThreadTile runs every task on all threads, a
// WarpSpecialisedTile splits the CTA into producer and math roles.
//
// Every tile GEMM computes C[kBlockM, kBlockN] = A * B^T over K (bf16 in, fp32 accumulators in Accum),
// A rows gathered (a row pointer per tile row, nullptr = a padding row, never read: row i of C depends
// only on row i of A, and callers never store rows past the tile's real rows), callable tile after tile
// inside a persistent kernel. kThreads threads, kSmemBytes of dynamic shared memory (16-byte aligned).
//
// AllThreadTile (TileGemm: mma.sync, gemm_mainloop.cuh; TileGemmWgmma: wgmma, gemm_mainloop_wgmma.cuh):
//   mainloop(a_row, b_row, K, smem, acc): all kThreads threads together; a_row(i), i < kBlockM: row i of
//     A (K contiguous, 16-byte aligned) or nullptr; b_row(j), j < kBlockN: the weight row feeding tile
//     column j (gemm_maps.h DenseBRow / SwigluBRow); both evaluated before the first load, by every
//     thread that copies part of that row: keep them cheap and pure. K % kBlockK == 0. Synchronises the
//     GEMM threads (named barrier kBarrierId) on entry (the caller may have used smem just before) and
//     on exit (smem free for the caller's epilogue); leaves no cp.async groups pending.
//   visit(acc, f): f(row, col, C[row][col], C[row][col + 1]) for every pair this thread owns (col even).
//   visit_col16(acc, f): f(row, col, C[row][col..col+1], C[row][col+8..col+9]) for col in the lower 8
//     columns of each 16-column group (SwiGLU with gate and up interleaved per 8 columns, epilogue.cuh).
//
// WarpSpecialisedTile (TileGemmTma: wgmma fed by an mbarrier ring, gemm_mainloop_tma.cuh):
//   init(smem): once per launch, by the whole CTA (arms the ring; synchronises the CTA).
//   load_tile(pos, a_rows, b, K, smem, limit, preloaded): producer thread p < kProducerThreads issues
//     every k-block of one tile: its kProducerRows A rows (producer_row(p, i); nullptr: padding) and,
//     thread 0, the weight boxes of BOperand b but for the first `preloaded` k-blocks. False when a wait
//     for a free stage ran out (limit, ptx/spin_wait.cuh).
//   load_weights(pos, b, K, smem, limit): producer thread 0, before a tile's inputs are in: the weights
//     of its first preload_blocks(K) k-blocks (then load_tile with preloaded = preload_blocks(K));
//     drop_weights(pos, K, smem, limit): every producer thread, when those k-blocks' A rows never come.
//   mainloop(pos, K, rows, smem, acc, limit): the math threads (kProducerThreads ..) consume the ring
//     for a tile of `rows` real rows (a math warpgroup with none runs no MMA). False (in this thread)
//     when a wait for a stage ran out.
//   visit_cols<c0, c1>(acc, f), visit_gate_up<c0, c1>(acc, f): the accumulators of columns [c0, c1),
//     pairs as visit's, and gate column col with up column col + kBlockN / 2 (SwiGLU, epilogue.cuh).
//   Each side keeps its own RingPos, carried from tile to tile.
// WarpSpecialisedFp8Tile (TileGemmTmaFp8, gemm_mainloop_tma_fp8.cuh): the same roles over e4m3 codes with
//   block scales; load_tile(pos, a_rows, a_scale_row, b, K, smem, limit, preloaded) also copies the 1x128 scales
//   of row producer_scale_row(p), b carries the two weight blocks' scales; K: supports_k (multiples of 64).
#pragma once
#include <concepts>
#include <cstdint>

#include <cuda_bf16.h>

#include "device/gemm/gemm_maps.h"
#include "device/ptx/spin_wait.cuh"

namespace epfuse::device {

// What every tile GEMM declares.
template <class G>
concept TileGemmConstants = requires {
  { G::kBlockM } -> std::convertible_to<int>;
  { G::kBlockN } -> std::convertible_to<int>;
  { G::kBlockK } -> std::convertible_to<int>;
  { G::kStages } -> std::convertible_to<int>;
  { G::kThreads } -> std::convertible_to<int>;
  { G::kSmemBytes } -> std::convertible_to<int>;
  typename G::Accum;
};

namespace tile_concept {
using ARow = const __nv_bfloat16* (*)(int);
using PairVisitor = void (*)(int, int, float, float);
using QuadVisitor = void (*)(int, int, float, float, float, float);
}  // namespace tile_concept

template <class G>
concept AllThreadTile =
    TileGemmConstants<G> &&
    requires(tile_concept::ARow a_row, DenseBRow<__nv_bfloat16> dense, SwigluBRow<__nv_bfloat16> swiglu_rows, int K,
             void* smem, typename G::Accum& acc, const typename G::Accum& cacc, tile_concept::PairVisitor pair,
             tile_concept::QuadVisitor quad) {
      { G::kBarrierId } -> std::convertible_to<int>;
      { G::mainloop(a_row, dense, K, smem, acc) } -> std::same_as<void>;
      { G::mainloop(a_row, swiglu_rows, K, smem, acc) } -> std::same_as<void>;
      { G::visit(cacc, pair) } -> std::same_as<void>;
      { G::visit_col16(cacc, quad) } -> std::same_as<void>;
    };

// Registers a thread holds at launch with `threads` threads a CTA, one CTA an SM: the register file's 65,536
// in the allocator's units of 8 (168 at 384 threads). The roles' setmaxnreg split moves registers between
// warps within that pool only: 64 / 224 at 384 threads (65,536 in all, over the pool) hung.
constexpr int launch_registers_per_thread(int threads) { return 65536 / threads / 8 * 8; }

// What both warp-specialised tiles (bf16 TileGemmTma, FP8 TileGemmTmaFp8) share: the roles, the ring,
// the math side and the accumulator visitors; they differ in the producer's operands (load_tile). Their
// register split (kProducerRegs, kConsumerRegs) fits the pool the CTA starts with.
template <class G>
concept WarpSpecialisedRoles =
    TileGemmConstants<G> &&
    requires(typename G::RingPos& pos, const typename G::BOperand& b, int K, int rows, void* smem,
             typename G::Accum& acc, const typename G::Accum& cacc, const WaitLimit& limit,
             tile_concept::PairVisitor pair, tile_concept::QuadVisitor quad) {
      { G::kProducerThreads } -> std::convertible_to<int>;
      { G::kConsumerThreads } -> std::convertible_to<int>;
      { G::kProducerRegs } -> std::convertible_to<int>;
      { G::kConsumerRegs } -> std::convertible_to<int>;
      { G::kProducerRows } -> std::convertible_to<int>;
      { G::producer_row(0, 0) } -> std::same_as<int>;
      { G::init(smem) } -> std::same_as<void>;
      { G::preload_blocks(K) } -> std::same_as<int>;
      { G::load_weights(pos, b, K, smem, limit) } -> std::same_as<bool>;
      { G::drop_weights(pos, K, smem, limit) } -> std::same_as<void>;
      { G::mainloop(pos, K, rows, smem, acc, limit) } -> std::same_as<bool>;
      { G::template visit_cols<0, 8>(cacc, pair) } -> std::same_as<void>;
      { G::template visit_gate_up<0, 8>(cacc, quad) } -> std::same_as<void>;
    } &&
    (G::kProducerThreads * G::kProducerRegs + G::kConsumerThreads * G::kConsumerRegs <=
     G::kThreads * launch_registers_per_thread(G::kThreads));

template <class G>
concept WarpSpecialisedTile =
    WarpSpecialisedRoles<G> &&
    requires(typename G::RingPos& pos, const __nv_bfloat16* const (&a_rows)[G::kProducerRows],
             const typename G::BOperand& b, int K, void* smem, const WaitLimit& limit) {
      { G::load_tile(pos, a_rows, b, K, smem, limit, 0) } -> std::same_as<bool>;
    };

// The FP8 tile (gemm_mainloop_tma_fp8.cuh): A rows are e4m3 codes, and producer thread p also copies
// the 1x128 scales of tile row producer_scale_row(p) (a_scale_row); BOperand carries the weight block
// scales. The fused kernel runs it for weight_format fp8-block128 (expert_ffn_fp8.cuh, dispatch_task<true>).
template <class G>
concept WarpSpecialisedFp8Tile =
    WarpSpecialisedRoles<G> &&
    requires(typename G::RingPos& pos, const uint8_t* const (&a_rows)[G::kProducerRows], const float* a_scale_row,
             const typename G::BOperand& b, int K, void* smem, const WaitLimit& limit) {
      { G::producer_scale_row(0) } -> std::same_as<int>;
      { G::supports_k(K) } -> std::same_as<bool>;
      { G::load_tile(pos, a_rows, a_scale_row, b, K, smem, limit, 0) } -> std::same_as<bool>;
    };

// A tile GEMM the fused kernel can run: exactly one of the three kinds.
template <class G>
concept TileGemmKind =
    (static_cast<int>(AllThreadTile<G>) + static_cast<int>(WarpSpecialisedTile<G>) + static_cast<int>(WarpSpecialisedFp8Tile<G>)) == 1;

}  // namespace epfuse::device
