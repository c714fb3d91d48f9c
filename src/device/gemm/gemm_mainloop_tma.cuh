// The fused kernel's large tile GEMM on Hopper, a WarpSpecialisedTile (tile_gemm.cuh): C[128, 256] =
// A * B^T over K with wgmma.mma_async m64n256k16 (bf16 in, fp32 accumulate), operands in
// 128-byte-swizzled shared memory, warp-specialised:
// a producer warpgroup fills a kStages ring of operand stages and two math warpgroups consume it
// (warpgroup g owns rows [64 g, 64 g + 64) and all 256 columns: 128 fp32 accumulators per thread).
//   full[s]:  the stage's weight tile arrived (two TMA boxes of 64 x 128, bytes counted on the barrier)
//             and every producer thread's cp.async copies of its gathered A row landed (one noinc
//             arrival per thread): kProducerThreads + 1 arrivals.
//   empty[s]: both math warpgroups' MMAs that read the stage finished (one arrival per math warp).
// The producer issues every k-block of a tile as soon as its stage is free and then moves on to the
// next task (waits for its rows, reads its row table, issues its first k-blocks), so that work and the
// first loads' latency hide under the math warps' last k-blocks and epilogue. Each producer thread
// copies chunk p % 8 of rows p / 8 + 16 i (i < 8), so one warp instruction covers 4 whole 128-byte
// rows (one row per thread, 16 bytes of 32 rows per instruction, ran the layer 15-35% slower); the
// weights move by TMA (one instruction per 16 KiB).
// Registers: 384 threads at one CTA per SM leave 168 per thread; setmaxnreg moves them to the math
// warps (kConsumerRegs, the 128 accumulators and the epilogue) from the producer (kProducerRegs). An
// earlier producer-warp variant without setmaxnreg capped every thread at 168 and spilled the
// accumulators (docs/performance.md#expert-gemms-bf16); the all-thread ring that followed paid ~5 us per tile outside the
// k-loop (entries, first loads, epilogue) that only a producer running ahead can hide.
// Weights come from a tensor map: the B operand is (map, row of box 0, row of box 1), so a Linear1 tile
// reads gate rows into tile columns [0, 128) and up rows into [128, 256) (SwiGLU pairs column c with
// c + 128, both held by the same thread: visit_gate_up).
//
// Both sides keep their own position in the ring (a k-block counter in a register, carried from tile
// to tile); init() arms the barriers once per launch. Padding rows (a null A row) are not loaded: row i
// of C depends only on row i of A, and the callers never store rows past the tile's real rows. Every
// mbarrier wait is mbar_wait (ptx/spin_wait.cuh): bounded by the caller's deadline, ended early by an abort.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/diagnostics/trace.cuh"
#include "device/gemm/gemm_maps.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/gemm/mbarrier_ring.cuh"
#include "device/ptx/mbarrier.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/spin_wait.cuh"
#include "device/ptx/wgmma.cuh"

namespace epfuse::device {

template <int kStages_>
struct TileGemmTma {
  static constexpr int kBlockM = 128;
  static constexpr int kBlockN = 256;
  static constexpr int kBlockK = kWgmmaBlockK;  // 64: one 128-byte swizzle row
  static constexpr int kStages = kStages_;
  static constexpr int kProducerThreads = 128;  // warpgroup 0
  static constexpr int kConsumerThreads = 256;  // warpgroups 1 and 2
  static constexpr int kThreads = kProducerThreads + kConsumerThreads;
  // 128 * 64 + 256 * 216 = 63,488 of the 64,512 the CTA starts with (tile_gemm.cuh
  // launch_registers_per_thread; ptxas: no spills; 56 / 224 and 40 / 232 spilled a few bytes in the producer).
  static constexpr int kProducerRegs = 64;
  static constexpr int kConsumerRegs = 216;
  static constexpr int kBoxRows = kWeightBoxRows;  // TMA box of the weight maps (two per stage)
  static constexpr int kKSteps = kBlockK / kWgmmaK;
  static constexpr int kChunksPerRow = kBlockK / kChunkElems;
  static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr int kStageBytesB = kBlockN * kBlockK * 2;
  // Stages from the first 1024-byte boundary (one atom of slack), then full[kStages], empty[kStages].
  static constexpr int kBarrierOffset = kStages * (kStageBytesA + kStageBytesB) + kSw128AtomBytes;
  using Ring = MbarRing<kStages, kBarrierOffset, kProducerThreads + 1, kConsumerThreads / 32>;
  static constexpr int kSmemBytes = kBarrierOffset + Ring::kBarrierBytes;

  static_assert(kStages >= 3, "one stage computing, one finishing, at least one loading");
  static_assert(kBlockN == 2 * kBoxRows, "B is two TMA boxes");
  static constexpr int kProducerRows = kBlockM * kChunksPerRow / kProducerThreads;  // A rows per producer thread
  static_assert(kBlockM * kChunksPerRow % kProducerThreads == 0 && kProducerThreads % kChunksPerRow == 0,
                "A chunks spread evenly, whole rows per warp");

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
  // A side's position in the ring: k-blocks it has passed since init() (mbarrier_ring.cuh).
  using RingPos = device::RingPos;

  __device__ static uint32_t stage_a(uint32_t smem, int s) { return sw128_align(smem) + static_cast<uint32_t>(s * kStageBytesA); }
  __device__ static uint32_t stage_b(uint32_t smem, int s) {
    return sw128_align(smem) + static_cast<uint32_t>(kStages * kStageBytesA + s * kStageBytesB);
  }

  // Once per launch, by the whole CTA, before the first tile.
  __device__ static void init(void* smem) { Ring::init(smem); }

  // The tile rows producer thread p copies (chunk producer_chunk of each; gemm_maps_wgmma.h).
  __device__ static int producer_row(int p, int i) { return device::producer_row(p, i, kProducerThreads, kChunksPerRow); }

  // The tile's first k-blocks whose weights load_weights issues ahead of its A rows: as many as the ring
  // holds.
  EPFUSE_HD static constexpr int preload_blocks(int K) { return K / kBlockK < kStages ? K / kBlockK : kStages; }

  // Producer thread 0, before the tile's inputs are in: the weight boxes of its first preload_blocks(K)
  // k-blocks (weights need no inputs, so they stream while the producer waits for the tile's A rows).
  // pos is not advanced: load_tile(..., preloaded) then adds those k-blocks' A rows. False when a wait
  // for a free stage ran out.
  __device__ static bool load_weights(RingPos pos, const BOperand& b, int K, void* smem, const WaitLimit& limit) {
    const uint32_t base = ptx::smem_u32(smem);
    return Ring::issue_ahead(base, pos, preload_blocks(K), limit, [&](int s, int kb) { load_b(base, s, b, kb); });
  }

  // Every producer thread, when load_weights ran for a tile whose A rows will never come (its inputs'
  // wait failed): Ring::drain_ahead over those stages.
  __device__ static void drop_weights(RingPos pos, int K, void* smem, const WaitLimit& limit) {
    Ring::drain_ahead(ptx::smem_u32(smem), pos, preload_blocks(K), limit);
  }

  // Producer thread p (0..127): issues every k-block of one tile, copying its chunk of A rows
  // producer_row(p, i) from a_rows[i] (nullptr: a padding row) and, thread 0, the weight boxes but for
  // the first `preloaded` k-blocks (load_weights issued them). False when a wait for a free stage ran out.
  __device__ static bool load_tile(RingPos& pos, const __nv_bfloat16* const (&a_rows)[kProducerRows], const BOperand& b,
                                   int K, void* smem, const WaitLimit& limit, int preloaded = 0) {
    const int p = static_cast<int>(threadIdx.x);
    const int chunk = producer_chunk(p, kChunksPerRow);
    const uint32_t base = ptx::smem_u32(smem);
    for (int kb = 0; kb < K / kBlockK; ++kb, ++pos.kb) {
      const int s = Ring::stage(pos);
      if (!Ring::wait_free(base, pos, limit)) return false;
      if (p == 0 && kb >= preloaded) load_b(base, s, b, kb);
      const uint32_t sa = stage_a(base, s);
#pragma unroll
      for (int i = 0; i < kProducerRows; ++i)
        if (a_rows[i] != nullptr)
          ptx::cp_async_16(sa + 2u * static_cast<uint32_t>(smem_chunk_offset(producer_row(p, i), chunk, kBlockK)),
                           a_rows[i] + kb * kBlockK + chunk * kChunkElems);
      ptx::cp_async_mbar_arrive_noinc(Ring::full_bar(base, s));
    }
    return true;
  }

  // Thread 0 of the producers: k-block kb's weight boxes into stage s (the expect_tx arrival is one of
  // the stage's full arrivals).
  __device__ static void load_b(uint32_t base, int s, const BOperand& b, int kb) {
    const uint32_t full = Ring::full_bar(base, s);
    const uint32_t sb = stage_b(base, s);
    ptx::mbar_arrive_expect_tx(full, kStageBytesB);
    ptx::tma_load_2d(sb, b.map, full, kb * kBlockK, b.row0);
    ptx::tma_load_2d(sb + kBoxRows * kSw128RowBytes, b.map, full, kb * kBlockK, b.row1);
  }

  // What a math thread's k-loop starts from (this tile's and the FP8 tile's): its index among the math
  // threads, the shared-memory base, and the descriptors of stage 0's A rows of its warpgroup and of B.
  struct MathStart {
    int ct;
    uint32_t base;
    uint64_t desc_a0;
    uint64_t desc_b0;
  };
  // Zeroes acc and returns the start of this math thread's k-loop.
  __device__ static MathStart start_math(void* smem, Accum& acc) {
    const int ct = static_cast<int>(threadIdx.x) - kProducerThreads;
    const uint32_t base = ptx::smem_u32(smem);
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) acc.v[i] = 0.0f;
    return {ct, base,
            make_sw128_kmajor_desc(stage_a(base, 0) + static_cast<uint32_t>((ct / 128) * kWgmmaM * kSw128RowBytes)),
            make_sw128_kmajor_desc(stage_b(base, 0))};
  }

  // Whether math thread ct's warpgroup holds only padding in a tile of `rows` real rows (its 64 rows all
  // at or past `rows`): such a warpgroup runs no MMA and passes the stages through (Ring::pass).
  __device__ static bool padding_group(int ct, int rows) { return (ct / 128) * kWgmmaM >= rows; }

  // Math thread (threads kProducerThreads..): acc = the tile's product over K, for a tile of `rows` real
  // rows (the rest padding): a warpgroup whose 64 rows are all padding runs no MMA (Ring::pass; its acc
  // stays zero). False (in this thread) when a wait for a stage ran out; the caller makes that
  // group-uniform.
  __device__ static bool mainloop(RingPos& pos, int K, int rows, void* smem, Accum& acc, const WaitLimit& limit) {
    const auto [ct, base, desc_a0, desc_b0] = start_math(smem, acc);
    const int num_k_blocks = K / kBlockK;
    if (padding_group(ct, rows)) return Ring::pass(base, pos, num_k_blocks, ct % 32 == 0, limit);
    bool ok = true;
    int held = -1;  // the stage whose MMAs may still be running
    for (int kb = 0; kb < num_k_blocks; ++kb, ++pos.kb) {
      const int s = Ring::stage(pos);
      if (!(ok = Ring::wait_full(base, pos, limit))) break;
      trace::first_full(ct, kb);
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
      if (held >= 0 && ct % 32 == 0) ptx::mbar_arrive(Ring::empty_bar(base, held));
      held = s;
    }
    ptx::wgmma_wait_group<0>();
    ptx::fence_accumulators(acc.v);
    if (held >= 0 && ct % 32 == 0) ptx::mbar_arrive(Ring::empty_bar(base, held));
    return ok;
  }

  // f(row, col, c[row][col], c[row][col + 1]) for every pair this math thread owns in columns
  // [kColBegin, kColEnd) (multiples of 8: registers 4 j .. 4 j + 3 hold n8 block j).
  template <int kColBegin, int kColEnd, class F>
  __device__ static void visit_cols(const Accum& acc, F f) {
    const int ct = static_cast<int>(threadIdx.x) - kProducerThreads;
#pragma unroll
    for (int reg = kColBegin / 2; reg < kColEnd / 2; reg += 2) {
      const FragCoord c = wgmma_accum_coord(ct, reg, 1, kBlockN);
      f(c.row, c.col, acc.v[reg], acc.v[reg + 1]);
    }
  }
  // f(row, col, gate[col], gate[col + 1], up[col], up[col + 1]) for col in [kColBegin, kColEnd) within
  // [0, 128): register reg + 64 holds column col + 128 of the same row, so no data moves between threads.
  template <int kColBegin, int kColEnd, class F>
  __device__ static void visit_gate_up(const Accum& acc, F f) {
    static_assert(kColEnd <= kBlockN / 2, "gate columns");
    const int ct = static_cast<int>(threadIdx.x) - kProducerThreads;
#pragma unroll
    for (int reg = kColBegin / 2; reg < kColEnd / 2; reg += 2) {
      const FragCoord c = wgmma_accum_coord(ct, reg, 1, kBlockN);
      f(c.row, c.col, acc.v[reg], acc.v[reg + 1], acc.v[reg + kBlockN / 4], acc.v[reg + kBlockN / 4 + 1]);
    }
  }
};

}  // namespace epfuse::device
