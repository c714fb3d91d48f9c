// The fused kernel's tensor-core tile GEMM: one CTA computes C[kBlockM, kBlockN] = A * B^T over K with
// mma.sync m16n8k16 (bf16 in, fp32 accumulate), ldmatrix from XOR-swizzled shared memory and a
// kStages-deep cp.async pipeline. Built to be called tile after tile from inside a persistent kernel.
//
// An AllThreadTile (tile_gemm.cuh: the contract, checked by the compiler): all kThreads threads run
// mainloop(a_row, b_row, K, smem, acc), then visit / visit_col16 over the accumulators.
//
// Index arithmetic (swizzle, ldmatrix rows, fragment ownership) lives in gemm_maps.h, tested on the CPU.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/gemm/gemm_maps.h"
#include "device/gemm/stage_copies.cuh"
#include "device/ptx/ptx.cuh"

namespace epfuse::device {

template <int kBlockM_, int kBlockN_, int kBlockK_, int kStages_, int kWarpsM_, int kWarpsN_>
struct TileGemm {
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockK = kBlockK_;
  static constexpr int kStages = kStages_;
  static constexpr int kWarpsM = kWarpsM_;
  static constexpr int kWarpsN = kWarpsN_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBarrierId = 1;
  static constexpr int kWarpTileM = kBlockM / kWarpsM;
  static constexpr int kWarpTileN = kBlockN / kWarpsN;
  static constexpr int kMmaM = kWarpTileM / 16;  // m16 blocks per warp
  static constexpr int kMmaN = kWarpTileN / 8;   // n8 blocks per warp
  static constexpr int kKSteps = kBlockK / 16;   // k16 steps per stage
  static constexpr int kStageElemsA = kBlockM * kBlockK;
  static constexpr int kStageElemsB = kBlockN * kBlockK;
  static constexpr int kSmemBytes = kStages * (kStageElemsA + kStageElemsB) * 2;
  using Copies = StageCopies<kBlockM, kBlockN, kBlockK, kThreads, kStages>;

  static_assert(kBlockM % (16 * kWarpsM) == 0, "warp tile M must be a multiple of the m16 mma");
  // Multiple of 16 (not 8): B is read with ldmatrix.x4 (two n8 blocks) and SwiGLU pairs n8 blocks.
  static_assert(kBlockN % (16 * kWarpsN) == 0, "warp tile N must be a multiple of 16");
  static_assert(kBlockK % 64 == 0, "the 8-row XOR swizzle needs rows of at least 8 chunks (128 bytes)");
  static_assert(kStages >= 2, "a pipeline needs at least two stages");

  struct Accum {
    float v[kMmaM][kMmaN][4];
  };

  // b_read_once: the caller reads these weights once this call (task_map.h weights_read_once): their
  // copies carry an L2 evict_first policy.
  template <class ARow, class BRow>
  __device__ static void mainloop(ARow a_row, BRow b_row, int K, void* smem, Accum& acc, bool b_read_once = false) {
    const int tid = static_cast<int>(threadIdx.x);
    const uint64_t b_policy = ptx::make_l2_evict_first();
    auto* smem_a = static_cast<__nv_bfloat16*>(smem);
    auto* smem_b = smem_a + kStages * kStageElemsA;
    const uint32_t smem_a_u32 = ptx::smem_u32(smem_a);
    const uint32_t smem_b_u32 = ptx::smem_u32(smem_b);

#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int ni = 0; ni < kMmaN; ++ni)
#pragma unroll
        for (int r = 0; r < 4; ++r) acc.v[mi][ni][r] = 0.0f;

    // The caller may have been reading or writing smem (a previous tile's epilogue).
    sync_threads();

    Copies copies;
    copies.resolve(tid, a_row, b_row, smem_a, kStageElemsA);
    const int num_k_blocks = K / kBlockK;
    auto load_stage = [&](int k_block, int stage) {
      copies.load(tid, k_block * kBlockK, smem_a_u32 + stage * kStageElemsA * 2, smem_b_u32 + stage * kStageElemsB * 2,
                  b_read_once, b_policy);
    };

    // Prologue: kStages - 1 k-blocks in flight. Always commit (possibly empty groups) so the group count
    // per iteration is fixed and wait<kStages - 2> means "k-block kb has landed".
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < num_k_blocks) load_stage(s, s);
      ptx::cp_async_commit();
    }

    // This thread's ldmatrix row addresses (bytes, stage 0, logical chunk 0): the row part never
    // changes; the swizzled chunk depends only on lane % 8 (every fragment base row is a multiple of 8).
    const int lane = tid % 32, warp = tid / 32;
    const int warp_row = (warp / kWarpsN) * kWarpTileM, warp_col = (warp % kWarpsN) * kWarpTileN;
    const int a_row0 = warp_row + ldsm_a_row(lane), b_row0 = warp_col + ldsm_b_row(lane);

    for (int kb = 0; kb < num_k_blocks; ++kb) {
      ptx::cp_async_wait<kStages - 2>();
      // Makes k-block kb visible to all warps, and guarantees every warp finished reading k-block
      // kb - 1, whose stage the next load overwrites.
      sync_threads();
      const int next = kb + kStages - 1;
      if (next < num_k_blocks) load_stage(next, next % kStages);
      ptx::cp_async_commit();

      const int stage = kb % kStages;
      const uint32_t stage_a = smem_a_u32 + stage * kStageElemsA * 2;
      const uint32_t stage_b = smem_b_u32 + stage * kStageElemsB * 2;
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t frag_a[kMmaM][4];
        uint32_t frag_b[kMmaN][2];
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi) {
          const int row = a_row0 + mi * 16;
          ptx::ldmatrix_x4(frag_a[mi], stage_a + 2u * smem_chunk_offset(row, ks * 2 + ldsm_a_chunk(lane), kBlockK));
        }
#pragma unroll
        for (int nj = 0; nj < kMmaN / 2; ++nj) {
          const int row = b_row0 + nj * 16;
          uint32_t r[4];
          ptx::ldmatrix_x4(r, stage_b + 2u * smem_chunk_offset(row, ks * 2 + ldsm_b_chunk(lane), kBlockK));
          frag_b[2 * nj][0] = r[0];
          frag_b[2 * nj][1] = r[1];
          frag_b[2 * nj + 1][0] = r[2];
          frag_b[2 * nj + 1][1] = r[3];
        }
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
          for (int ni = 0; ni < kMmaN; ++ni) {
            // Serpentine order over n reuses the B fragment just used across an m change.
            const int n = (mi % 2 == 0) ? ni : kMmaN - 1 - ni;
            ptx::mma_bf16_16816(acc.v[mi][n], frag_a[mi], frag_b[n]);
          }
      }
    }
    // Only empty groups can remain, but drain them so the caller starts from a clean slate, and free
    // smem for the caller's epilogue.
    ptx::cp_async_wait<0>();
    sync_threads();
  }

  __device__ static void sync_threads() { ptx::named_barrier_sync(kBarrierId, kThreads); }

  template <class F>
  __device__ static void visit(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int ni = 0; ni < kMmaN; ++ni)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const FragCoord c = accum_coord(tid, mi, ni, 2 * half, kWarpsN, kWarpTileM, kWarpTileN);
          f(c.row, c.col, acc.v[mi][ni][2 * half], acc.v[mi][ni][2 * half + 1]);
        }
  }

  template <class F>
  __device__ static void visit_col16(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int np = 0; np < kMmaN / 2; ++np)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const FragCoord c = accum_coord(tid, mi, 2 * np, 2 * half, kWarpsN, kWarpTileM, kWarpTileN);
          const float* lo = acc.v[mi][2 * np] + 2 * half;
          const float* hi = acc.v[mi][2 * np + 1] + 2 * half;
          f(c.row, c.col, lo[0], lo[1], hi[0], hi[1]);
        }
  }
};

}  // namespace epfuse::device
