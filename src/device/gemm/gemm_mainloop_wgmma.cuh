// The fused kernel's tile GEMM on Hopper tensor cores: one CTA computes C[kBlockM, kBlockN] = A * B^T
// over K with wgmma.mma_async m64nNk16 (bf16 in, fp32 accumulate), both operands read by the tensor
// cores straight from 128-byte-swizzled shared memory, fed by a kStages-deep cp.async pipeline.
// A drop-in for TileGemm (gemm_mainloop.cuh): an AllThreadTile as well (tile_gemm.cuh: gathered A rows,
// nullptr = zero row, named-barrier synchronisation of the GEMM threads only, nothing left pending,
// callable tile after tile inside a persistent kernel), same visit / visit_col16, so epilogue.cuh works
// as is.
//
// Work split: warpgroup g (threads [128 g, 128 g + 128)) owns the 64 x kGroupTileN group tile
// (g / kGroupsN, g % kGroupsN) and issues one m64n{kGroupTileN}k16 per 16 of K. Every GEMM thread also
// copies its share of each stage (no producer warps): A rows are gathered, so TMA would need one
// descriptor per row; cp.async 16 B per thread, written at the swizzled offset wgmma expects, is enough
// to keep the MMAs fed at kStages - 2 k-blocks ahead.
//
// Pipeline per k-block kb (stage s = kb % kStages):
//   wait for this thread's copies of k-block kb; fence.proxy.async (generic -> async proxy); barrier
//   issue the MMAs of k-block kb (one wgmma-group), then the copies of k-block kb + kStages - 2 into the
//   stage k-block kb - 2 used; wgmma_wait<1> (k-block kb - 1's MMAs are done, kb's keep running).
// The stage being overwritten was last read by k-block kb - 2, whose MMAs every warpgroup finished
// (wait<1> in iteration kb - 1) before it arrived at this iteration's barrier: one MMA group stays in
// flight across the barrier, so the tensor cores never wait for the synchronisation.
//
// Index arithmetic (descriptor, swizzle, accumulator ownership) lives in gemm_maps_wgmma.h and
// gemm_maps.h, tested on the CPU (tests/cpu/gemm/test_gemm_wgmma.cpp).
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/gemm/gemm_maps.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/gemm/stage_copies.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/wgmma.cuh"

namespace epfuse::device {

// kWarpsM x kWarpsN warps as in TileGemm's template (so one GemmTileShape names either): kWarpsM / 4
// warpgroups along M (64 rows each), kWarpsN along N.
template <int kBlockM_, int kBlockN_, int kBlockK_, int kStages_, int kWarpsM_, int kWarpsN_>
struct TileGemmWgmma {
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kBlockK = kBlockK_;
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 32 * kWarpsM_ * kWarpsN_;
  static constexpr int kBarrierId = 1;
  static constexpr int kGroupsM = kWarpsM_ / 4;
  static constexpr int kGroupsN = kWarpsN_;
  static constexpr int kGroupTileN = kBlockN / kGroupsN;
  static constexpr int kKSteps = kBlockK / kWgmmaK;
  static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr int kStageBytesB = kBlockN * kBlockK * 2;
  // + one swizzle atom: the stages are placed at the first 1024-byte boundary of the caller's buffer.
  static constexpr int kSmemBytes = kStages * (kStageBytesA + kStageBytesB) + kSw128AtomBytes;
  using Copies = StageCopies<kBlockM, kBlockN, kBlockK, kThreads, kStages>;

  static_assert(kWarpsM_ % 4 == 0 && kBlockM == kGroupsM * kWgmmaM, "one warpgroup (4 warps) per 64 rows");
  static_assert(kGroupTileN == 128 || kGroupTileN == 256, "group tile N must have a wgmma wrapper");
  static_assert(kBlockK == kWgmmaBlockK, "a tile row is one 128-byte swizzle row (64 bf16)");
  static_assert(kStages >= 3, "one stage being read, one MMA group in flight, at least one being loaded");
  static_assert(kStageBytesA % kSw128AtomBytes == 0 && kStageBytesB % kSw128AtomBytes == 0,
                "every stage and group tile must start on a swizzle atom");

  struct Accum {
    float v[kGroupTileN / 2];
  };

  // b_read_once: the caller reads these weights once this call (task_map.h weights_read_once): their
  // copies carry an L2 evict_first policy.
  template <class ARow, class BRow>
  __device__ static void mainloop(ARow a_row, BRow b_row, int K, void* smem, Accum& acc, bool b_read_once = false) {
    const int tid = static_cast<int>(threadIdx.x);
    const uint64_t b_policy = ptx::make_l2_evict_first();
    // Stages from the first 1024-byte boundary: the swizzle works on absolute address bits.
    const uint32_t smem_u32 = ptx::smem_u32(smem);
    const uint32_t base_a = sw128_align(smem_u32);
    const uint32_t base_b = base_a + kStages * kStageBytesA;
    char* const smem_a = static_cast<char*>(smem) + (base_a - smem_u32);

#pragma unroll
    for (int i = 0; i < kGroupTileN / 2; ++i) acc.v[i] = 0.0f;

    // The caller may have been reading or writing smem (a previous tile's epilogue).
    sync_threads();

    Copies copies;
    copies.resolve(tid, a_row, b_row, smem_a, kStageBytesA);
    const int num_k_blocks = K / kBlockK;
    auto load_stage = [&](int k_block, int stage) {
      copies.load(tid, k_block * kBlockK, base_a + stage * kStageBytesA, base_b + stage * kStageBytesB, b_read_once,
                  b_policy);
    };

    // Prologue: kStages - 2 k-blocks in flight. Always commit (possibly empty groups) so that
    // wait<kStages - 3> at iteration kb always means "k-block kb has landed".
    constexpr int kAhead = kStages - 2;
#pragma unroll
    for (int s = 0; s < kAhead; ++s) {
      if (s < num_k_blocks) load_stage(s, s);
      ptx::cp_async_commit();
    }

    // This warpgroup's operands in stage 0, k step 0: A rows [64 gm, 64 gm + 64), B rows of its N slice.
    const int group = tid / 128;
    const uint64_t desc_a0 =
        make_sw128_kmajor_desc(base_a + static_cast<uint32_t>((group / kGroupsN) * kWgmmaM * kSw128RowBytes));
    const uint64_t desc_b0 =
        make_sw128_kmajor_desc(base_b + static_cast<uint32_t>((group % kGroupsN) * kGroupTileN * kSw128RowBytes));

    int read_stage = 0;
    int write_stage = kAhead;
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      ptx::cp_async_wait<kStages - 3>();
      ptx::fence_proxy_async_shared();
      sync_threads();

      ptx::fence_accumulators(acc.v);
      ptx::wgmma_fence();
      const uint64_t desc_a = desc_advance(desc_a0, static_cast<uint32_t>(read_stage * kStageBytesA));
      const uint64_t desc_b = desc_advance(desc_b0, static_cast<uint32_t>(read_stage * kStageBytesB));
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks) {
        // k step ks: 16 elements = 32 bytes further along every row; the hardware applies the swizzle.
        ptx::wgmma_bf16_f32<kGroupTileN>(acc.v, desc_advance(desc_a, ks * kWgmmaK * 2),
                                         desc_advance(desc_b, ks * kWgmmaK * 2), 1);
      }
      ptx::wgmma_commit_group();

      const int next = kb + kAhead;
      if (next < num_k_blocks) load_stage(next, write_stage);
      ptx::cp_async_commit();

      ptx::wgmma_wait_group<1>();
      ptx::fence_accumulators(acc.v);
      read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
      write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
    }
    ptx::wgmma_wait_group<0>();
    ptx::fence_accumulators(acc.v);
    // Only empty groups can remain; drain them, and free smem for the caller's epilogue.
    ptx::cp_async_wait<0>();
    sync_threads();
  }

  __device__ static void sync_threads() { ptx::named_barrier_sync(kBarrierId, kThreads); }

  template <class F>
  __device__ static void visit(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int reg = 0; reg < kGroupTileN / 2; reg += 2) {
      const FragCoord c = wgmma_accum_coord(tid, reg, kGroupsN, kGroupTileN);
      f(c.row, c.col, acc.v[reg], acc.v[reg + 1]);
    }
  }

  template <class F>
  __device__ static void visit_col16(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
    // n8 blocks 2p (columns 16p .. 16p + 7) and 2p + 1 (16p + 8 ..): registers 8p + r and 8p + 4 + r.
#pragma unroll
    for (int np = 0; np < kGroupTileN / 16; ++np)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int lo = 8 * np + 2 * half, hi = lo + 4;
        const FragCoord c = wgmma_accum_coord(tid, lo, kGroupsN, kGroupTileN);
        f(c.row, c.col, acc.v[lo], acc.v[lo + 1], acc.v[hi], acc.v[hi + 1]);
      }
  }
};

}  // namespace epfuse::device
