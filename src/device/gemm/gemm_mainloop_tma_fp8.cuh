// The FP8 variant of the fused kernel's warp-specialised 128x256 tile (gemm_mainloop_tma.cuh's
// TileGemmTma), weight_format fp8-block128 (common/fp8.h): C[128, 256] = A * B^T over K with e4m3
// codes, 1x128 scales per A row and K block, 128x128 block scales of B, fp32 accumulators.
// A WarpSpecialisedFp8Tile (tile_gemm.cuh): the bf16 tile's roles, ring and accumulator layout, with
// the operands of a k-block (128 elements of K, one scale block) per stage:
//   A: the tile's 128 gathered rows, 128 bytes of K each, in the bf16 tile's swizzled stage layout
//      (a 128-byte row is one swizzle row: 64 bf16 there, 128 e4m3 here), copied by cp.async as there
//      (producer thread p copies chunk p % 8 of rows p / 8 + 16 i), plus each row's scale of that K
//      block: thread p copies the 16-byte aligned group of 4 scales holding it for its row
//      producer_scale_row(p) (cp.async.cg: a scale row written earlier in the call by another CTA or a
//      peer is never read from a stale L1 line), 16 bytes per row per stage.
//   B: two TMA boxes of 128 bytes x 128 rows (weight_tensor_map_fp8), rows [row0, row0 + 128) as tile
//      columns [0, 128) and [row1, row1 + 128) as [128, 256) (Linear1: gate and up), plus the two block
//      scales of that K block (scale0[kb], scale1[kb]; thread 0, 4-byte cp.async through L1: weight
//      scales are never written by the kernel).
// Math: each math warpgroup owns 64 rows; per k-block it runs its 64 x 256 as two n128 halves
// (mainloop_halves; gemm_fp8.cuh fp8_slice_issue / fp8_slice_promote: 4 x wgmma m64n128k32 per half into
// one 64-register scratch, promoted into its 64 accumulators times row scale x block scale once they are
// done). The halves replaced the earlier four n64 quarters (which hid the promotions but read A from shared
// memory twice as often): on an H100 2-5% faster at dsv3 T=4096 and qwen3 T=16384, mixtral (at the
// power cap) unchanged (docs/performance.md#the-fp8-k-loop-what-was-tried). The accumulators are the bf16 tile's: register
// reg of the 128 holds the same (row, column), so the epilogues' visit_cols / visit_gate_up work
// unchanged. The last promotion waits for all the k-block's MMAs, so a stage is free once it is done:
// the math warps release it at once (the bf16 tile keeps one wgmma group in flight and releases the
// previous stage).
// K: any multiple of 64 (supports_k). A last K block of 64 (K = 2880) is loaded as a full one: the TMA
// fills B's columns past K with zeros, the producer zero-fills A's chunks past K (cp.async src-size 0),
// so those MMA steps add zeros; its scales are the partial block's (fp8.h block_extent). In the fused
// kernel this tile's K is a multiple of 128 anyway (H % 256 == 0 and I % 128 == 0 for its N).
// Scale rows of A: ceil(K / 128) floats, 16-byte aligned, readable up to the next multiple of 4 floats
// (regions.h fp8_scale_stride; the producer copies whole 16-byte groups).
// Registers: 384 threads at one CTA per SM leave 168 per thread at entry; setmaxnreg gives the math
// warps kConsumerRegs (128 accumulators + 64 scratch + addresses) and the producer kProducerRegs.
#pragma once
#include <cstdint>

#include "device/diagnostics/trace.cuh"
#include "device/gemm/gemm_fp8.cuh"
#include "device/gemm/gemm_mainloop_tma.cuh"
#include "device/gemm/gemm_maps.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/gemm/mbarrier_ring.cuh"
#include "device/ptx/mbarrier.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/spin_wait.cuh"
#include "device/ptx/wgmma.cuh"

namespace epfuse::device {

template <int kStages_>
struct TileGemmTmaFp8 {
  // The bf16 tile of the same ring depth: its stage layout, A copy map, accumulators and visitors are these.
  using Bf16 = TileGemmTma<kStages_>;
  static constexpr int kBlockM = Bf16::kBlockM;  // 128
  static constexpr int kBlockN = Bf16::kBlockN;  // 256
  static constexpr int kBlockK = kFp8BlockK;     // 128 e4m3: one 128-byte swizzle row, one scale block
  static constexpr int kStages = kStages_;
  static constexpr int kProducerThreads = Bf16::kProducerThreads;  // warpgroup 0
  static constexpr int kConsumerThreads = Bf16::kConsumerThreads;  // warpgroups 1 and 2
  static constexpr int kThreads = Bf16::kThreads;
  // 72 / 216: the launch's whole 128 * 72 + 256 * 216 = 64,512. In the fused kernel the producer's
  // k-block copies spilled at 64 and more at 56, with its task loop (there the layer ran 7-9% slower,
  // the math warps' k-loop unchanged); at 72 its copies hold no spill and the layer ran 0.2-0.7% faster
  // at the power cap (docs/performance.md#the-producers-registers-in-the-fp8-layer-2026-12-01). The math warps
  // spill at 80 / 200 (128 accumulators + 64 scratch).
  static constexpr int kProducerRegs = 72;
  static constexpr int kConsumerRegs = Bf16::kConsumerRegs;
  static constexpr int kBoxRows = Bf16::kBoxRows;  // TMA box rows of the weight maps (two per stage)
  static constexpr int kChunkBytes = 16;
  // The bf16 stages and A copy map: a row of 128 bytes, 8 chunks, 8 rows per producer thread.
  static constexpr int kChunksPerRow = Bf16::kChunksPerRow;
  static constexpr int kProducerRows = Bf16::kProducerRows;
  static constexpr int kStageBytesA = Bf16::kStageBytesA;
  static constexpr int kStageBytesB = Bf16::kStageBytesB;
  static_assert(kStageBytesA == kBlockM * kSw128RowBytes && kStageBytesB == kBlockN * kSw128RowBytes &&
                    kChunksPerRow * kChunkBytes == kBlockK,
                "a stage row is one 128-K block of e4m3");
  static constexpr int kStageBytesScaleA = kBlockM * 16;  // a 16-byte group of 4 scales per row
  static constexpr int kStageBytesScaleB = 16;            // scale0, scale1 (8 bytes used)
  // From the first 1024-byte boundary: A stages, B stages, A scales, B scales; then one atom of slack,
  // then the ring's barriers.
  static constexpr int kRingBytes = kStages * (kStageBytesA + kStageBytesB + kStageBytesScaleA + kStageBytesScaleB);
  static constexpr int kBarrierOffset = kRingBytes + kSw128AtomBytes;
  // Every math thread releases a stage it read (an arrival each): each reads its rows' scales from the
  // stage with ld.shared, and an arrival per thread orders those reads before the producer's next
  // copies into the stage in a way compute-sanitizer's racecheck follows (with one arrival per warp
  // after __syncwarp, as the bf16 tile, whose math threads read the ring only through wgmma, it
  // reported the scales' reuse as hazards; docs/performance.md#the-fp8-ring-under-racecheck-2026-11-28).
  using Ring = MbarRing<kStages, kBarrierOffset, kProducerThreads + 1, kConsumerThreads>;
  static constexpr int kSmemBytes = kBarrierOffset + Ring::kBarrierBytes;

  static_assert(kBoxRows == 128 && kBlockK == 128, "one B box is one 128 x 128 weight block");
  static_assert(kProducerRows == kChunksPerRow, "thread p copies the scales of its row number p % 8");

  // The bf16 tile's 128 accumulators: registers 32 q .. 32 q + 31 hold columns [64 q, 64 q + 64).
  using Accum = typename Bf16::Accum;
  // The weight operand: rows [row0, row0 + 128) and [row1, row1 + 128) of `map` (a 2-D uint8 tensor map
  // of e4m3 codes, K inner, box 128 x kBoxRows, 128-byte swizzle: weight_tensor_map_fp8) as tile
  // columns [0, 128) and [128, 256); scale0[kb] and scale1[kb] are their block scales for K block kb
  // (each 128-row half is one weight block: row0 and row1 on 128-row block boundaries of the matrix).
  struct BOperand {
    const void* map;
    int row0;
    int row1;
    const float* scale0;
    const float* scale1;
    bool evict_first = false;  // read once this call (weights_read_once): boxes loaded with an L2 evict_first hint
    int k0 = 0;                // the K element of k-block 0 (a part of a K split, task_map.h linear2_k_span); scale0/1 start there
  };
  using RingPos = device::RingPos;

  // The K sizes this tile computes: multiples of 64 (a partial last block of 64).
  EPFUSE_HD static constexpr bool supports_k(int K) { return K > 0 && K % 64 == 0; }
  EPFUSE_HD static constexpr int num_k_blocks(int K) { return (K + kBlockK - 1) / kBlockK; }

  __device__ static uint32_t stage_a(uint32_t smem, int s) { return Bf16::stage_a(smem, s); }
  __device__ static uint32_t stage_b(uint32_t smem, int s) { return Bf16::stage_b(smem, s); }
  __device__ static uint32_t stage_scale_a(uint32_t smem, int s) {
    return sw128_align(smem) + static_cast<uint32_t>(kStages * (kStageBytesA + kStageBytesB) + s * kStageBytesScaleA);
  }
  __device__ static uint32_t stage_scale_b(uint32_t smem, int s) {
    return sw128_align(smem) +
           static_cast<uint32_t>(kStages * (kStageBytesA + kStageBytesB + kStageBytesScaleA) + s * kStageBytesScaleB);
  }

  // Once per launch, by the whole CTA, before the first tile.
  __device__ static void init(void* smem) { Ring::init(smem); }

  // The tile rows producer thread p copies (chunk producer_chunk of each; gemm_maps_wgmma.h), and the
  // one whose scales it copies (every row exactly once over the 128 threads).
  __device__ static int producer_row(int p, int i) { return Bf16::producer_row(p, i); }
  __device__ static int producer_scale_row(int p) { return producer_row(p, producer_chunk(p, kChunksPerRow)); }

  // The tile's first k-blocks whose weights load_weights issues ahead of its A rows: as many as the ring
  // holds.
  EPFUSE_HD static constexpr int preload_blocks(int K) { return num_k_blocks(K) < kStages ? num_k_blocks(K) : kStages; }

  // Producer thread 0, before the tile's inputs are in: the weight boxes and block scales of its first
  // preload_blocks(K) k-blocks (weights need no inputs, so they stream while the producer waits for the
  // tile's A rows). pos is not advanced: load_tile(..., preloaded) then adds those k-blocks' A rows.
  // False when a wait for a free stage ran out.
  __device__ static bool load_weights(RingPos pos, const BOperand& b, int K, void* smem, const WaitLimit& limit) {
    const uint32_t base = ptx::smem_u32(smem);
    return Ring::issue_ahead(base, pos, preload_blocks(K), limit, [&](int s, int kb) { load_b(base, s, b, kb); });
  }

  // Every producer thread, when load_weights ran for a tile whose A rows will never come (its inputs'
  // wait failed): Ring::drain_ahead over those stages (the scales' cp.async complete with it).
  __device__ static void drop_weights(RingPos pos, int K, void* smem, const WaitLimit& limit) {
    Ring::drain_ahead(ptx::smem_u32(smem), pos, preload_blocks(K), limit);
  }

  // Producer thread p (0..127): issues every k-block of one tile, copying its chunk of A rows
  // producer_row(p, i) from a_rows[i] (nullptr: a padding row), the scales of row producer_scale_row(p)
  // from a_scale_row (its ceil(K/128) scales, padded to fp8_scale_stride(K); nullptr: a padding row) and,
  // thread 0, the weight boxes and their scales, but for the first `preloaded` k-blocks (load_weights
  // issued them). K: supports_k. False when a wait for a free stage ran out.
  __device__ static bool load_tile(RingPos& pos, const uint8_t* const (&a_rows)[kProducerRows], const float* a_scale_row,
                                   const BOperand& b, int K, void* smem, const WaitLimit& limit, int preloaded = 0) {
    const int p = static_cast<int>(threadIdx.x);
    const int chunk = producer_chunk(p, kChunksPerRow);
    const uint32_t base = ptx::smem_u32(smem);
    const uint32_t scale_dst = static_cast<uint32_t>(producer_scale_row(p) * 16);
    const int num_kb = num_k_blocks(K);
    for (int kb = 0; kb < num_kb; ++kb, ++pos.kb) {
      const int s = Ring::stage(pos);
      if (!Ring::wait_free(base, pos, limit)) return false;
      if (p == 0 && kb >= preloaded) load_b(base, s, b, kb);
      const uint32_t sa = stage_a(base, s);
      const int k = kb * kBlockK + chunk * kChunkBytes;
      const uint32_t src_bytes = k < K ? kChunkBytes : 0u;  // the second half of a last block of 64: zeros
#pragma unroll
      for (int i = 0; i < kProducerRows; ++i) {
        const int row = producer_row(p, i);
        if (a_rows[i] != nullptr)
          ptx::cp_async_16_zfill(sa + static_cast<uint32_t>(row * kSw128RowBytes + swizzled_chunk(row, chunk) * kChunkBytes),
                                 a_rows[i] + k, src_bytes);
      }
      if (a_scale_row != nullptr) ptx::cp_async_16(stage_scale_a(base, s) + scale_dst, a_scale_row + (kb & ~3));
      ptx::cp_async_mbar_arrive_noinc(Ring::full_bar(base, s));
    }
    return true;
  }

  // Math thread (threads kProducerThreads..): acc = the tile's product over K (supports_k), for a tile
  // of `rows` real rows (the rest padding): a warpgroup whose 64 rows are all padding runs no MMA and
  // only passes the stages through (Ring::pass; its acc stays zero), which leaves the tensor cores to
  // the other at small T, where the tile is a weight stream. False (in this thread) when a wait for a
  // stage ran out; the caller makes that group-uniform.
  // kQuarters: the k-block in n64 quarters (fp8_block_mma_promote<4>, the decode kernel's); otherwise
  // n128 halves (mainloop_halves).
  template <bool kQuarters = false>
  __device__ static bool mainloop(RingPos& pos, int K, int rows, void* smem, Accum& acc, const WaitLimit& limit) {
    if constexpr (!kQuarters) return mainloop_halves(pos, K, rows, smem, acc, limit);
    const auto [ct, base, desc_a0, desc_b0] = Bf16::start_math(smem, acc);
    float scratch[kBlockN / 8];
    const int group_row0 = (ct / 128) * kWgmmaM;
    const int num_kb = num_k_blocks(K);
    if (Bf16::padding_group(ct, rows)) return Ring::pass(base, pos, num_kb, true, limit);
    // This thread's accumulator rows (wgmma_c_coord: r and r + 8) within the tile: their scale groups.
    const int row = group_row0 + wgmma_c_coord(ct % 128, 0).row;
    const uint32_t scale_a0 = stage_scale_a(base, 0) + static_cast<uint32_t>(row * 16);
    bool ok = true;
    for (int kb = 0; kb < num_kb; ++kb, ++pos.kb) {
      const int s = Ring::stage(pos);
      if (!(ok = Ring::wait_full(base, pos, limit))) break;
      trace::first_full(ct, kb);
      // The A rows came through cp.async (generic proxy); wgmma reads through the async proxy.
      ptx::fence_proxy_async_shared();
      const BlockScales sc = block_scales(base, scale_a0, s, kb);
      const uint64_t desc_a = uniform_u64(desc_advance(desc_a0, static_cast<uint32_t>(s * kStageBytesA)));
      const uint64_t desc_b = uniform_u64(desc_advance(desc_b0, static_cast<uint32_t>(s * kStageBytesB)));
      fp8_block_mma_promote<4>(acc.v, scratch, desc_a, desc_b, sc.row, sc.col0, sc.col1);
      // All the k-block's MMAs finished (its last promotion waits for them) and this thread's scale
      // reads are done: its release of the stage.
      ptx::mbar_arrive(Ring::empty_bar(base, s));
    }
    return ok;
  }

  // The 64-row k-loop in n128 halves (the prefill kernels'): per k-block half 0's MMAs and promotion, then
  // half 1's MMAs, and under those one look at the next k-block's stage (a try-wait, no spin beside the
  // MMAs), so that a stage already full is not waited for again at the next k-block's top. Its scales and
  // descriptors are read at the top: held across half 1's promotion they cost the epilogues registers,
  // and the proxy fence, run while a group is in flight, waits for it
  // (docs/performance.md#the-next-k-blocks-stage-under-the-second-half-2026-12-01).
  __device__ static bool mainloop_halves(RingPos& pos, int K, int rows, void* smem, Accum& acc, const WaitLimit& limit) {
    const auto [ct, base, desc_a0, desc_b0] = Bf16::start_math(smem, acc);
    // The preamble is mainloop's: folded into one helper it moved both FP8 kernels' register allocation
    // (2026-12-01, scripts/sass_compare.py), so it stays apart until a GPU run can time the fold.
    float scratch[kBlockN / 4];
    const int group_row0 = (ct / 128) * kWgmmaM;
    const int num_kb = num_k_blocks(K);
    if (Bf16::padding_group(ct, rows)) return Ring::pass(base, pos, num_kb, true, limit);
    const int row = group_row0 + wgmma_c_coord(ct % 128, 0).row;
    const uint32_t scale_a0 = stage_scale_a(base, 0) + static_cast<uint32_t>(row * 16);
    bool ok = true, have = false;  // have: the k-block's stage was seen full
    for (int kb = 0; kb < num_kb; ++kb, ++pos.kb) {
      const int s = Ring::stage(pos);
      if (!have) {
        if (!(ok = Ring::wait_full(base, pos, limit))) break;
        trace::first_full(ct, kb);
      }
      const BlockScales sc = block_scales(base, scale_a0, s, kb);
      // The A rows came through cp.async (generic proxy); wgmma reads through the async proxy.
      ptx::fence_proxy_async_shared();
      // Uniform: ptxas keeps them in uniform registers.
      const uint64_t desc_a = uniform_u64(desc_advance(desc_a0, static_cast<uint32_t>(s * kStageBytesA)));
      const uint64_t desc_b = uniform_u64(desc_advance(desc_b0, static_cast<uint32_t>(s * kStageBytesB)));
      fp8_slice_issue<2>(scratch, desc_a, desc_b, 0);
      ptx::wgmma_wait_group<0>();
      fp8_slice_promote<2>(acc.v, scratch, 0, sc.row[0] * sc.col0, sc.row[1] * sc.col0);
      fp8_slice_issue<2>(scratch, desc_a, desc_b, 1);
      const float s0 = sc.row[0] * sc.col1, s1 = sc.row[1] * sc.col1;
      // Under half 1's MMAs: a stage not yet full is waited for at the loop's top.
      const RingPos next{pos.kb + 1};
      have = kb + 1 < num_kb && ptx::mbar_try_wait(Ring::full_bar(base, Ring::stage(next)), (next.kb / kStages) & 1u);
      if (have) trace::first_full(ct, kb + 1);
      ptx::wgmma_wait_group<0>();
      fp8_slice_promote<2>(acc.v, scratch, 1, s0, s1);
      // All the k-block's MMAs finished and this thread's scale reads of it are done: its release.
      ptx::mbar_arrive(Ring::empty_bar(base, s));
    }
    return ok;
  }

  // The decode form of mainloop (at most kTokens real rows): the weights as the MMA's M side and the rows
  // as N (fp8_block_mma_promote_swapped, m64nNk32 with N = kTokens), so that the tensor work follows the
  // rows rather than the 64 of a warpgroup. Math warpgroup g computes tile columns [64 g, 64 g + 64) and
  // [128 + 64 g, 192 + 64 g) (B's rows of each 128-row half, with that half's block scale) for rows
  // [0, kTokens): register i of math thread ct is swapped_coord<kTokens>(ct, i) (gemm_maps_wgmma.h), so
  // Linear1's gate and up of an h column meet in one thread. Rows [rows, kTokens) of a stage hold whatever
  // was there before (the producer loads real rows only): their columns of C are not results and the
  // caller drops them. Same ring, same loads as mainloop.
  // The decode kernel's two N: tiles of at most kSwappedTokensSmall rows run m64n8, larger ones up to
  // kSwappedTokens m64n16 (m64n16 took 4% longer a k-block at one row, and the layer 4-5% at qwen3-30b
  // T = 1 and 8: docs/performance.md#the-decode-form-at-16-rows-2026-11-30).
  static constexpr int kSwappedTokensSmall = 8;
  static constexpr int kSwappedTokens = 16;
  static constexpr bool kDecodeForm = false;  // whether the fused kernel runs its tiles of <= kSwappedTokens rows this way
  static constexpr bool kSplitK = false;      // whether the fused kernel splits its Linear2 tiles over K (TileGemmTmaFp8Split)
  template <int kTokens>
  __device__ static bool mainloop_swapped(RingPos& pos, int K, void* smem, float (&acc)[kTokens], const WaitLimit& limit) {
    const int ct = static_cast<int>(threadIdx.x) - kProducerThreads, g = ct / 128, lane = ct % 32;
    const uint32_t base = ptx::smem_u32(smem);
#pragma unroll
    for (int i = 0; i < kTokens; ++i) acc[i] = 0.0f;
    float scratch[kTokens];
    constexpr uint32_t kHalfBytes = kBoxRows * kSw128RowBytes, kBlockBytes = kWgmmaM * kSw128RowBytes;
    const uint64_t desc_x0 = make_sw128_kmajor_desc(stage_a(base, 0));
    const uint64_t desc_w0 = make_sw128_kmajor_desc(stage_b(base, 0) + static_cast<uint32_t>(g) * kBlockBytes);
    // This thread's rows' scales: slot j is row swapped_slot_row(j, lane) (gemm_maps_wgmma.h), the lane's
    // part (swapped_slot_row(0, lane)) here and the slot's in the k-loop.
    const uint32_t tok_scale0 = stage_scale_a(base, 0) + static_cast<uint32_t>(swapped_slot_row(0, lane) * 16);
    const int num_kb = num_k_blocks(K);
    bool ok = true;
    for (int kb = 0; kb < num_kb; ++kb, ++pos.kb) {
      const int s = Ring::stage(pos);
      if (!(ok = Ring::wait_full(base, pos, limit))) break;
      trace::first_full(ct, kb);
      ptx::fence_proxy_async_shared();
      const uint32_t sa = tok_scale0 + static_cast<uint32_t>(s * kStageBytesScaleA + (kb & 3) * 4);
      float tok_scale[kTokens / 4];
#pragma unroll
      for (int j = 0; j < kTokens / 4; ++j)
        tok_scale[j] = ld_shared_f32(sa + static_cast<uint32_t>((swapped_slot_row(j, lane) - swapped_slot_row(0, lane)) * 16));
      const float w_scale[2] = {ld_shared_f32(stage_scale_b(base, s)), ld_shared_f32(stage_scale_b(base, s) + 4u)};
      const uint64_t desc_x = uniform_u64(desc_advance(desc_x0, static_cast<uint32_t>(s * kStageBytesA)));
      const uint64_t desc_w = uniform_u64(desc_advance(desc_w0, static_cast<uint32_t>(s * kStageBytesB)));
      const uint64_t desc_wm[2] = {desc_w, desc_advance(desc_w, kHalfBytes)};
      fp8_block_mma_promote_swapped<kTokens>(acc, scratch, desc_wm, desc_x, w_scale, tok_scale);
      ptx::mbar_arrive(Ring::empty_bar(base, s));
    }
    return ok;
  }

  // The epilogues' views of the accumulators, the bf16 tile's (same registers, same columns).
  template <int kColBegin, int kColEnd, class F>
  __device__ static void visit_cols(const Accum& acc, F f) {
    Bf16::template visit_cols<kColBegin, kColEnd>(acc, f);
  }
  template <int kColBegin, int kColEnd, class F>
  __device__ static void visit_gate_up(const Accum& acc, F f) {
    Bf16::template visit_gate_up<kColBegin, kColEnd>(acc, f);
  }

 private:
  // Thread 0 of the producers: k-block kb's weight boxes and their block scales into stage s (the
  // expect_tx arrival is one of the stage's full arrivals; the scales' cp.async complete with this
  // thread's cp.async arrival).
  __device__ static void load_b(uint32_t base, int s, const BOperand& b, int kb) {
    const uint32_t full = Ring::full_bar(base, s);
    const uint32_t sb = stage_b(base, s);
    const int k0 = b.k0 + kb * kBlockK;
    ptx::mbar_arrive_expect_tx(full, kStageBytesB);  // box bytes, zero-filled columns included
    if (b.evict_first) {
      ptx::tma_load_2d_evict_first(sb, b.map, full, k0, b.row0);
      ptx::tma_load_2d_evict_first(sb + kBoxRows * kSw128RowBytes, b.map, full, k0, b.row1);
    } else {
      ptx::tma_load_2d(sb, b.map, full, k0, b.row0);
      ptx::tma_load_2d(sb + kBoxRows * kSw128RowBytes, b.map, full, k0, b.row1);
    }
    ptx::cp_async_4(stage_scale_b(base, s), b.scale0 + kb);
    ptx::cp_async_4(stage_scale_b(base, s) + 4u, b.scale1 + kb);
  }
  // A k-block's scales, from its stage: this thread's two rows' (scale_a0: its rows' group in stage 0)
  // and the two weight blocks'.
  struct BlockScales {
    float row[2];
    float col0, col1;
  };
  __device__ static BlockScales block_scales(uint32_t base, uint32_t scale_a0, int s, int kb) {
    const uint32_t sa = scale_a0 + static_cast<uint32_t>(s * kStageBytesScaleA + (kb & 3) * 4);
    return {{ld_shared_f32(sa), ld_shared_f32(sa + 8u * 16u)},
            ld_shared_f32(stage_scale_b(base, s)),
            ld_shared_f32(stage_scale_b(base, s) + 4u)};
  }
  // v as one value of the warp (lane 0's; every lane holds the same): ptxas then keeps the k-block's
  // descriptor arithmetic in uniform registers. Without it the n64 quarters' 16 descriptors
  // took math registers and 12 accumulators spilled around the k-loop (docs/performance.md#the-fp8-k-loop-what-was-tried).
  __device__ static uint64_t uniform_u64(uint64_t v) {
    return (static_cast<uint64_t>(__shfl_sync(~0u, static_cast<uint32_t>(v >> 32), 0)) << 32) |
           __shfl_sync(~0u, static_cast<uint32_t>(v), 0);
  }
  __device__ static float ld_shared_f32(uint32_t addr) {
    float v;
    asm volatile("ld.shared.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
    return v;
  }
};

// The same tile in the fused kernel's decode kernel (heuristics.h kTmaFp8M128N256Decode): its tiles of at
// most kSwappedTokens rows run mainloop_swapped (expert_ffn_fp8.cuh), larger ones the 64-row k-loop in
// n64 quarters. A kernel apart, because the decode form's code beside the 64-row k-loop in one kernel
// changed that loop's registers (spills in it); the quarters' smaller scratch keeps this kernel's
// register peak below that loop's (docs/performance.md#the-decode-form-in-the-layer-2026-11-29).
template <int kStages_>
struct TileGemmTmaFp8Decode : TileGemmTmaFp8<kStages_> {
  using Base = TileGemmTmaFp8<kStages_>;
  static constexpr bool kDecodeForm = true;
  // The producer's task decoding, inlined with the roles, spilled at 64 registers (69 spill instructions
  // against 40 at 72; docs/performance.md#the-fp8-decode-kernels-producer-at-72-registers-2026-12-01); at
  // 88, the launch's whole budget with the math warps' 208, the kernel has none
  // (docs/performance.md#the-fp8-decode-kernels-producer-at-88-registers-2026-12-01).
  static constexpr int kProducerRegs = 88;
  static constexpr int kConsumerRegs = 208;
  __device__ static bool mainloop(typename Base::RingPos& pos, int K, int rows, void* smem, typename Base::Accum& acc,
                                  const WaitLimit& limit) {
    return Base::template mainloop<true>(pos, K, rows, smem, acc, limit);
  }
};

// The decode kernel whose Linear2 tiles split over K where a call has few of them (heuristics.h
// kTmaFp8M128N256Split; expert_ffn_fp8.cuh kSplitLinear2, split_k.cuh): the same tile and forms. A kernel of its
// own, so that the decode kernel keeps the instructions its rows were measured with.
template <int kStages_>
struct TileGemmTmaFp8Split : TileGemmTmaFp8Decode<kStages_> {
  static constexpr bool kSplitK = true;
};

}  // namespace epfuse::device
