// The fused kernel's large tile GEMM on Hopper, warp-specialised: C[128, 256] = A * B^T over K with
// wgmma.mma_async m64n256k16 (bf16 in, fp32 accumulate), operands in 128-byte-swizzled shared memory,
// fed through a kStages ring of stages, each guarded by two mbarriers:
//   producer warp (warp 8): per k-block waits until the stage is empty, then lane 0 issues the weight
//     tile as two TMA boxes of 64 x 128 (bytes counted on the stage's full barrier) and every lane
//     copies its 4 gathered A rows with cp.async; each lane's arrival on the full barrier fires when
//     its copies have landed (cp.async.mbarrier.arrive.noinc). Full = 32 lane arrivals + 1 TMA arrival.
//   consumer warpgroups (warps 0-7; warpgroup g owns rows [64 g, 64 g + 64) and all 256 columns): per
//     k-block wait for the stage to be full, issue 4 wgmma (one wgmma-group), wait until the previous
//     group is done and release its stage (one arrival per warp: empty = 8 arrivals).
// Compared with TileGemmWgmma (every thread copies and computes, one CTA barrier per k-block, kStages-2
// k-blocks ahead) the loads run kStages k-blocks ahead of the MMAs, the math warps never wait at a CTA
// barrier inside a tile, and the weights move by TMA (one instruction per 16 KiB instead of 1,024
// cp.async). Weights come from a tensor map: the B operand is (map, row of box 0, row of box 1), so a
// Linear1 tile reads gate rows into tile columns [0, 128) and up rows into [128, 256)
// (kGateUpHalves: SwiGLU pairs column c with c + 128, both held by the same thread).
//
// The ring (stage, phase) continues across tiles: both roles derive it from a k-block counter kept in
// shared memory, advanced once per tile, so a persistent CTA runs tile after tile without re-arming
// barriers; init() arms them once per launch. Padding rows (a_row(i) == nullptr) are not loaded: row i
// of C depends only on row i of A, and the callers never store rows past the tile's real rows.
// Every mbarrier wait is bounded by the caller's timeout; mainloop() returns false (CTA-uniform) when one
// ran out, and the caller records the error.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/gemm_layout.h"
#include "device/gemm_layout_wgmma.h"
#include "device/mbarrier.cuh"
#include "device/profile.cuh"  // globaltimer_ns
#include "device/ptx.cuh"
#include "device/wgmma.cuh"

namespace epfuse::device {

template <int kStages_>
struct TileGemmWs {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;
  static constexpr int kBlockK = kWgmmaBlockK;  // 64: one 128-byte swizzle row
  static constexpr int kStages = kStages_;
  static constexpr int kMathThreads = 256;  // two consumer warpgroups
  static constexpr int kThreads = kMathThreads + 32;
  static constexpr int kBoxRows = kWeightBoxRows;  // TMA box of the weight maps (two per stage)
  static constexpr int kKSteps = kBlockK / kWgmmaK;
  static constexpr int kChunksPerRow = kBlockK / kChunkElems;
  static constexpr int kRowsPerLane = kBlockM / 32;
  static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr int kStageBytesB = kBlockN * kBlockK * 2;
  // Stages from the first 1024-byte boundary (one atom of slack), then full[kStages], empty[kStages]
  // and the k-block counter.
  static constexpr int kBarrierOffset = kStages * (kStageBytesA + kStageBytesB) + kSw128AtomBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 * kStages + 1) * 8;
  static constexpr bool kGateUpHalves = true;
  static constexpr bool kTmaWeights = true;

  static_assert(kStages >= 2, "one stage computed while the next one loads");
  static_assert(kBlockN == 2 * kBoxRows, "B is two TMA boxes");

  struct Accum {
    float v[kBlockN / 2];
  };
  // The weight operand: rows [row0, row0 + 128) and [row1, row1 + 128) of `map` (a 2-D bf16 tensor map,
  // K inner, box kBlockK x kBoxRows, 128-byte swizzle) as tile columns [0, 128) and [128, 256).
  struct BOperand {
    const void* map;
    int row0;
    int row1;
  };

  __device__ static uint32_t full_bar(uint32_t smem, int s) { return smem + kBarrierOffset + 8u * s; }
  __device__ static uint32_t empty_bar(uint32_t smem, int s) { return smem + kBarrierOffset + 8u * (kStages + s); }
  __device__ static uint32_t* kblock_counter(void* smem) {
    return reinterpret_cast<uint32_t*>(static_cast<char*>(smem) + kBarrierOffset + 16 * kStages);
  }

  // Once per launch, by the whole CTA, before the first tile.
  __device__ static void init(void* smem) {
    if (threadIdx.x == 0) {
      const uint32_t base = ptx::smem_u32(smem);
      for (int s = 0; s < kStages; ++s) {
        ptx::mbar_init(full_bar(base, s), 32 + 1);
        ptx::mbar_init(empty_bar(base, s), kMathThreads / 32);
      }
      *kblock_counter(smem) = 0;
      ptx::fence_mbar_init();
    }
    __syncthreads();
  }

  template <class ARow>
  __device__ static bool mainloop(ARow a_row, const BOperand& b, int K, void* smem, Accum& acc, uint64_t timeout_ns) {
    const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) acc.v[i] = 0.0f;
    __syncthreads();  // the caller's use of smem (a previous epilogue) is over; the counter is stable
    const uint32_t smem_u32 = ptx::smem_u32(smem);
    const uint32_t base_a = sw128_align(smem_u32);
    const uint32_t base_b = base_a + kStages * kStageBytesA;
    const uint32_t kb0 = *kblock_counter(smem);
    const int num_k_blocks = K / kBlockK;
    const uint64_t deadline = globaltimer_ns() + timeout_ns;
    bool ok = true;
    if (tid >= kMathThreads) {
      ok = produce(a_row, b, num_k_blocks, kb0, smem_u32, base_a, base_b, deadline);
    } else {
      ok = consume(num_k_blocks, kb0, smem_u32, base_a, base_b, deadline, acc);
    }
    const bool failed = __syncthreads_or(!ok);  // every stage consumed: smem is the caller's again
    if (tid == 0) *kblock_counter(smem) = kb0 + static_cast<uint32_t>(num_k_blocks);
    return !failed;
  }

  // Consumer threads only: f(row, col, c[row][col], c[row][col + 1]) for every pair this thread owns.
  template <class F>
  __device__ static void visit(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid >= kMathThreads) return;
#pragma unroll
    for (int reg = 0; reg < kBlockN / 2; reg += 2) {
      const FragCoord c = wgmma_accum_coord(tid, reg, 1, kBlockN);
      f(c.row, c.col, acc.v[reg], acc.v[reg + 1]);
    }
  }
  // f(row, col, gate[col], gate[col + 1], up[col], up[col + 1]) for col < 128: register reg + 64 holds
  // column col + 128 of the same row (16 n8 blocks further), so no data moves between threads.
  template <class F>
  __device__ static void visit_gate_up(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
    if (tid >= kMathThreads) return;
#pragma unroll
    for (int reg = 0; reg < kBlockN / 4; reg += 2) {
      const FragCoord c = wgmma_accum_coord(tid, reg, 1, kBlockN);
      f(c.row, c.col, acc.v[reg], acc.v[reg + 1], acc.v[reg + kBlockN / 4], acc.v[reg + kBlockN / 4 + 1]);
    }
  }

 private:
  __device__ static bool wait(uint32_t bar, uint32_t parity, uint64_t deadline) {
    for (uint32_t spin = 0;; ++spin) {
      if (ptx::mbar_try_wait(bar, parity)) return true;
      if ((spin & 255u) == 255u && globaltimer_ns() > deadline) return false;
    }
  }

  template <class ARow>
  __device__ static bool produce(ARow a_row, const BOperand& b, int num_k_blocks, uint32_t kb0, uint32_t smem,
                                 uint32_t base_a, uint32_t base_b, uint64_t deadline) {
    const int lane = static_cast<int>(threadIdx.x) - kMathThreads;
    const __nv_bfloat16* rows[kRowsPerLane];
#pragma unroll
    for (int i = 0; i < kRowsPerLane; ++i) rows[i] = a_row(lane + 32 * i);
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      const uint32_t it = kb0 + static_cast<uint32_t>(kb);
      const int s = static_cast<int>(it % kStages);
      // Round r of a stage waits for the consumers' release of round r - 1 (parity (r - 1) & 1; a
      // fresh barrier passes parity 1).
      if (!wait(empty_bar(smem, s), ((it / kStages) & 1u) ^ 1u, deadline)) return false;
      const uint32_t stage_a = base_a + static_cast<uint32_t>(s * kStageBytesA);
      const uint32_t stage_b = base_b + static_cast<uint32_t>(s * kStageBytesB);
      const int k0 = kb * kBlockK;
      if (lane == 0) {
        ptx::mbar_arrive_expect_tx(full_bar(smem, s), kStageBytesB);
        ptx::tma_load_2d(stage_b, b.map, full_bar(smem, s), k0, b.row0);
        ptx::tma_load_2d(stage_b + kBoxRows * kSw128RowBytes, b.map, full_bar(smem, s), k0, b.row1);
      }
#pragma unroll
      for (int i = 0; i < kRowsPerLane; ++i) {
        if (rows[i] == nullptr) continue;
        const int row = lane + 32 * i;
#pragma unroll
        for (int chunk = 0; chunk < kChunksPerRow; ++chunk)
          ptx::cp_async_16(stage_a + 2u * smem_chunk_offset(row, chunk, kBlockK), rows[i] + k0 + chunk * kChunkElems);
      }
      ptx::cp_async_mbar_arrive_noinc(full_bar(smem, s));
    }
    return true;
  }

  __device__ static bool consume(int num_k_blocks, uint32_t kb0, uint32_t smem, uint32_t base_a, uint32_t base_b,
                                 uint64_t deadline, Accum& acc) {
    const int tid = static_cast<int>(threadIdx.x);
    const uint64_t desc_a0 = make_sw128_kmajor_desc(base_a + static_cast<uint32_t>((tid / 128) * kWgmmaM * kSw128RowBytes));
    const uint64_t desc_b0 = make_sw128_kmajor_desc(base_b);
    bool ok = true;
    int held = -1;  // the stage whose MMAs may still be running
    for (int kb = 0; kb < num_k_blocks; ++kb) {
      const uint32_t it = kb0 + static_cast<uint32_t>(kb);
      const int s = static_cast<int>(it % kStages);
      if (!wait(full_bar(smem, s), (it / kStages) & 1u, deadline)) {
        ok = false;
        break;
      }
      // The A rows came through cp.async (generic proxy); wgmma reads through the async proxy.
      ptx::fence_proxy_async_shared();
      ptx::fence_accumulators(acc.v);
      ptx::wgmma_fence();
      const uint64_t desc_a = desc_advance(desc_a0, static_cast<uint32_t>(s * kStageBytesA));
      const uint64_t desc_b = desc_advance(desc_b0, static_cast<uint32_t>(s * kStageBytesB));
#pragma unroll
      for (int ks = 0; ks < kKSteps; ++ks)
        ptx::wgmma_bf16_f32<kBlockN>(acc.v, desc_advance(desc_a, ks * kWgmmaK * 2), desc_advance(desc_b, ks * kWgmmaK * 2), 1);
      ptx::wgmma_commit_group();
      ptx::wgmma_wait_group<1>();  // the previous k-block's MMAs are done: its stage is free
      ptx::fence_accumulators(acc.v);
      if (held >= 0 && tid % 32 == 0) ptx::mbar_arrive(empty_bar(smem, held));
      held = s;
    }
    ptx::wgmma_wait_group<0>();
    ptx::fence_accumulators(acc.v);
    if (held >= 0 && tid % 32 == 0) ptx::mbar_arrive(empty_bar(smem, held));
    return ok;
  }
};

}  // namespace epfuse::device
