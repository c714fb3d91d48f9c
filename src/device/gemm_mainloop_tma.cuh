// The fused kernel's large tile GEMM on Hopper: C[128, 256] = A * B^T over K with wgmma.mma_async
// m64n256k16 (bf16 in, fp32 accumulate), operands in 128-byte-swizzled shared memory, fed through a
// kStages ring whose stages are guarded by mbarriers instead of CTA barriers:
//   full[s]:  the stage's weight tile arrived (two TMA boxes of 64 x 128, bytes counted on the barrier)
//             and every thread's cp.async copies of the gathered A rows landed (one noinc arrival per
//             thread): kThreads + 1 arrivals.
//   empty[s]: both warpgroups' MMAs that read the stage finished (one arrival per warp): 8 arrivals.
// Per k-block kb every thread waits full, the warpgroup issues its 4 wgmma (warpgroup g owns rows
// [64 g, 64 g + 64) and all 256 columns), waits until its previous group is done, releases that stage,
// and refills it with k-block kb + kStages - 1 once both warpgroups released it. So kStages - 1 k-blocks
// load while one computes (TileGemmWgmma: kStages - 2 behind a CTA barrier per k-block), the math warps
// meet no CTA barrier inside a tile, and the weights move by TMA (one instruction per 16 KiB instead of
// 1,024 cp.async); each thread copies 4 chunks of A per k-block.
// (A warp-specialised variant with a dedicated producer warp was measured first and was 20-50% slower:
// 9 warps cap ptxas at 168 registers (3 warps on one SM sub-partition), which spills the 128
// accumulators; bench/NOTES.md.)
// Weights come from a tensor map: the B operand is (map, row of box 0, row of box 1), so a Linear1 tile
// reads gate rows into tile columns [0, 128) and up rows into [128, 256) (kGateUpHalves: SwiGLU pairs
// column c with c + 128, both held by the same thread).
//
// The ring (stage, round) continues across tiles: every thread derives it from a k-block counter kept
// in shared memory and advanced once per tile, so a persistent CTA runs tile after tile without
// re-arming barriers; init() arms them once per launch. Padding rows (a_row(i) == nullptr) are not
// loaded: row i of C depends only on row i of A, and the callers never store rows past the tile's real
// rows. Every mbarrier wait is bounded by the caller's timeout; mainloop() returns false (CTA-uniform)
// when one ran out, and the caller records the error.
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
struct TileGemmTma {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;
  static constexpr int kBlockK = kWgmmaBlockK;  // 64: one 128-byte swizzle row
  static constexpr int kStages = kStages_;
  static constexpr int kThreads = 256;  // two warpgroups
  static constexpr int kBoxRows = kWeightBoxRows;  // TMA box of the weight maps (two per stage)
  static constexpr int kKSteps = kBlockK / kWgmmaK;
  static constexpr int kChunksPerRow = kBlockK / kChunkElems;
  static constexpr int kLoadsA = kBlockM * kChunksPerRow / kThreads;  // A chunks per thread per k-block
  static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr int kStageBytesB = kBlockN * kBlockK * 2;
  // Stages from the first 1024-byte boundary (one atom of slack), then full[kStages], empty[kStages]
  // and the k-block counter.
  static constexpr int kBarrierOffset = kStages * (kStageBytesA + kStageBytesB) + kSw128AtomBytes;
  static constexpr int kSmemBytes = kBarrierOffset + (2 * kStages + 1) * 8;
  static constexpr bool kGateUpHalves = true;
  static constexpr bool kTmaWeights = true;

  static_assert(kStages >= 3, "one stage computing, one finishing, at least one loading");
  static_assert(kBlockN == 2 * kBoxRows, "B is two TMA boxes");
  static_assert(kBlockM * kChunksPerRow % kThreads == 0, "A chunks spread evenly");

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
        ptx::mbar_init(full_bar(base, s), kThreads + 1);
        ptx::mbar_init(empty_bar(base, s), kThreads / 32);
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
    Ring r;
    r.smem = ptx::smem_u32(smem);
    r.base_a = sw128_align(r.smem);
    r.base_b = r.base_a + kStages * kStageBytesA;
    r.kb0 = *kblock_counter(smem);
    r.deadline = globaltimer_ns() + timeout_ns;
    r.b = b;
    // Fixed copy slots per thread (as TileGemmWgmma), row pointers resolved once per tile.
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int index = tid + i * kThreads;
      const __nv_bfloat16* src = a_row(load_row(index, kBlockK));
      r.src_a[i] = src == nullptr ? nullptr : src + load_chunk(index, kBlockK) * kChunkElems;
      r.dst_a[i] = 2u * static_cast<uint32_t>(smem_chunk_offset(load_row(index, kBlockK), load_chunk(index, kBlockK), kBlockK));
    }
    const int num_k_blocks = K / kBlockK;
    bool ok = true;
    for (int kb = 0; kb < kStages - 1 && kb < num_k_blocks && ok; ++kb) ok = r.load(kb);

    const uint64_t desc_a0 = make_sw128_kmajor_desc(r.base_a + static_cast<uint32_t>((tid / 128) * kWgmmaM * kSw128RowBytes));
    const uint64_t desc_b0 = make_sw128_kmajor_desc(r.base_b);
    int held = -1;  // the stage whose MMAs may still be running
    for (int kb = 0; kb < num_k_blocks && ok; ++kb) {
      const uint32_t it = r.kb0 + static_cast<uint32_t>(kb);
      const int s = static_cast<int>(it % kStages);
      if (!(ok = r.wait(full_bar(r.smem, s), (it / kStages) & 1u))) break;
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
      ptx::wgmma_wait_group<1>();  // this warpgroup's previous k-block is done: release its stage
      ptx::fence_accumulators(acc.v);
      if (held >= 0 && tid % 32 == 0) ptx::mbar_arrive(empty_bar(r.smem, held));
      held = s;
      // Refill the stage just released (k-block kb - 1's) with k-block kb + kStages - 1.
      if (kb + kStages - 1 < num_k_blocks) ok = r.load(kb + kStages - 1);
    }
    ptx::wgmma_wait_group<0>();
    ptx::fence_accumulators(acc.v);
    if (held >= 0 && tid % 32 == 0) ptx::mbar_arrive(empty_bar(r.smem, held));
    // On a timeout some loads may still be in flight into smem: leave none behind.
    ptx::cp_async_wait<0>();
    const bool failed = __syncthreads_or(!ok);  // every stage consumed: smem is the caller's again
    if (tid == 0) *kblock_counter(smem) = r.kb0 + static_cast<uint32_t>(num_k_blocks);
    return !failed;
  }

  // f(row, col, c[row][col], c[row][col + 1]) for every pair this thread owns.
  template <class F>
  __device__ static void visit(const Accum& acc, F f) {
    const int tid = static_cast<int>(threadIdx.x);
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
#pragma unroll
    for (int reg = 0; reg < kBlockN / 4; reg += 2) {
      const FragCoord c = wgmma_accum_coord(tid, reg, 1, kBlockN);
      f(c.row, c.col, acc.v[reg], acc.v[reg + 1], acc.v[reg + kBlockN / 4], acc.v[reg + kBlockN / 4 + 1]);
    }
  }

 private:
  // One tile's view of the ring and this thread's copy slots.
  struct Ring {
    uint32_t smem, base_a, base_b, kb0;
    uint64_t deadline;
    BOperand b;
    const __nv_bfloat16* src_a[kLoadsA];
    uint32_t dst_a[kLoadsA];

    __device__ bool wait(uint32_t bar, uint32_t parity) const {
      for (uint32_t spin = 0;; ++spin) {
        if (ptx::mbar_try_wait(bar, parity)) return true;
        if ((spin & 255u) == 255u && globaltimer_ns() > deadline) return false;
      }
    }
    // Issues k-block kb of this tile into its stage once both warpgroups released the stage's previous
    // round (round r waits for the release of round r - 1; a fresh barrier passes parity 1).
    __device__ bool load(int kb) const {
      const uint32_t it = kb0 + static_cast<uint32_t>(kb);
      const int s = static_cast<int>(it % kStages);
      if (!wait(empty_bar(smem, s), ((it / kStages) & 1u) ^ 1u)) return false;
      const int k0 = kb * kBlockK;
      if (threadIdx.x == 0) {
        const uint32_t stage_b = base_b + static_cast<uint32_t>(s * kStageBytesB);
        ptx::mbar_arrive_expect_tx(full_bar(smem, s), kStageBytesB);
        ptx::tma_load_2d(stage_b, b.map, full_bar(smem, s), k0, b.row0);
        ptx::tma_load_2d(stage_b + kBoxRows * kSw128RowBytes, b.map, full_bar(smem, s), k0, b.row1);
      }
      const uint32_t stage_a = base_a + static_cast<uint32_t>(s * kStageBytesA);
#pragma unroll
      for (int i = 0; i < kLoadsA; ++i)
        if (src_a[i] != nullptr) ptx::cp_async_16(stage_a + dst_a[i], src_a[i] + k0);
      ptx::cp_async_mbar_arrive_noinc(full_bar(smem, s));
      return true;
    }
  };
};

}  // namespace epfuse::device
