// Hopper (sm_90a) FP8 warpgroup MMA and the per-128-K scale promotion of block-scaled FP8 GEMMs
// (weight_format fp8-block128, common/fp8.h): wgmma.mma_async e4m3 x e4m3 -> fp32, both operands
// K-major in shared memory under the 128-byte swizzle. An FP8 row of 128 bytes is 128 elements of K,
// one scale block: the bf16 tiles' shared-memory layout and descriptors (gemm_maps_wgmma.h) apply
// unchanged, each k32 step reading 32 bytes of a row as a bf16 k16 step does.
//
// Why promotion: Hopper's FP8 MMA keeps a narrower accumulator than fp32 across its K steps, and the
// operands of different K blocks carry different scales. So each 128-K block is accumulated alone
// (4 MMAs of k32 into a scratch accumulator) and then added into the fp32 result times its scales,
// as DeepGEMM's SM90 FP8 kernels do.
#pragma once
#include <cstdint>

#include "device/gemm/gemm_maps_wgmma.h"
#include "device/ptx/wgmma.cuh"

namespace epfuse::device {

inline constexpr int kFp8WgmmaK = 32;      // K of one wgmma.m64nNk32 e4m3 (32 bytes of a row)
inline constexpr int kFp8BlockK = kSw128RowBytes;  // FP8 elements of K per swizzled row: one scale block

namespace ptx {

// D[64 x 128] (+)= A[64 x 32] * B[128 x 32]^T, e4m3 operands K-major in shared memory (descriptors);
// FP8 wgmma has no transpose immediates. scale_d = 0 overwrites D.
__device__ __forceinline__ void wgmma_m64n128k32_e4m3_f32(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                          int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T, e4m3, as above (the decode kernel's 64-row form).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_f32(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// D[64 x 8] (+)= A[64 x 32] * B[8 x 32]^T, e4m3, as above (the decode form: A the weights, B the tokens).
__device__ __forceinline__ void wgmma_m64n8k32_e4m3_f32(float (&d)[4], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %6, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// D[64 x 16] and D[64 x 32], the same with 16 and 32 tokens.
__device__ __forceinline__ void wgmma_m64n16k32_e4m3_f32(float (&d)[8], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n32k32_e4m3_f32(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// The m64nNk32 e4m3 MMA for a compile-time N of 8, 16 or 32 (the decode form's token count).
template <int kN>
__device__ __forceinline__ void wgmma_e4m3_f32(float (&d)[kN / 2], uint64_t desc_a, uint64_t desc_b, int scale_d) {
  static_assert(kN == 8 || kN == 16 || kN == 32, "add a wgmma_m64nNk32 e4m3 wrapper for this N");
  if constexpr (kN == 8) wgmma_m64n8k32_e4m3_f32(d, desc_a, desc_b, scale_d);
  else if constexpr (kN == 16) wgmma_m64n16k32_e4m3_f32(d, desc_a, desc_b, scale_d);
  else wgmma_m64n32k32_e4m3_f32(d, desc_a, desc_b, scale_d);
}

}  // namespace ptx

// The two steps of one slice h of fp8_block_mma_promote (below; mainloop_halves runs them apart): its 4
// MMAs into the scratch as one wgmma group (committed, not waited for), and, once that group is done
// (wgmma_wait_group), the scratch times its scales added into the slice's accumulators (s0 for the
// thread's first row, s1 for its row + 8).
template <int kSlices>
__device__ __forceinline__ void fp8_slice_issue(float (&scratch)[128 / kSlices], uint64_t desc_a, uint64_t desc_b, int h) {
  constexpr uint32_t kSliceBytes = 2 * (128 / kSlices) * kSw128RowBytes;
  ptx::fence_accumulators(scratch);
  ptx::wgmma_fence();
#pragma unroll
  for (int k = 0; k < kFp8BlockK / kFp8WgmmaK; ++k) {
    const uint64_t a = desc_advance(desc_a, k * kFp8WgmmaK), b = desc_advance(desc_b, h * kSliceBytes + k * kFp8WgmmaK);
    if constexpr (kSlices == 2) ptx::wgmma_m64n128k32_e4m3_f32(scratch, a, b, k > 0 ? 1 : 0);
    else ptx::wgmma_m64n64k32_e4m3_f32(scratch, a, b, k > 0 ? 1 : 0);
  }
  ptx::wgmma_commit_group();
}
template <int kSlices>
__device__ __forceinline__ void fp8_slice_promote(float (&acc)[128], float (&scratch)[128 / kSlices], int h, float s0, float s1) {
  constexpr int kRegs = 128 / kSlices;
  ptx::fence_accumulators(scratch);
#pragma unroll
  for (int i = 0; i < kRegs; ++i) acc[kRegs * h + i] = fmaf(scratch[i], ((i >> 1) & 1) ? s1 : s0, acc[kRegs * h + i]);
}

// One warpgroup, one 128-K block of a 64 x 256 tile in kSlices slices of N (2: n128 halves, 4: n64
// quarters): acc[kRegs s + i] += (A_block . B_rows[n s, n s + n)^T)[i] * row_scale * (the slice's half
// of B: col_scale0 or col_scale1), n = 256 / kSlices, kRegs = n / 2, with B's 256 rows at desc_b
// (K-major, 128-byte swizzle, row r at 128 r bytes). Each slice's 4 MMAs go into one kRegs-register
// scratch, which is then promoted with the group's MMAs drained (the other math warpgroup's MMAs can run
// meanwhile); slice s's register i is register kRegs s + i of the 64 x 256 accumulators (same columns).
// Halves (the 64-row kernel's): 128 accumulators + 64 scratch. Four n64 quarters through two 32-register
// scratches that took turns hid the promotions behind the group's own MMAs but read A from shared
// memory four times a k-block instead of twice; on an H100 the halves were 5% faster at dsv3 T=4096 and
// 2% at qwen3 T=16384, mixtral (at the board's power cap) unchanged
// (docs/performance.md#the-fp8-k-loop-what-was-tried). Quarters through one scratch (the decode kernel's
// tiles of more than 16 rows): half the scratch registers for twice the drains, which keeps that kernel's
// register peak below the 64-row kernel's (docs/performance.md#the-decode-form-in-the-layer-2026-11-29).
// Waits for all its MMAs (the stage is free on return). tests/gpu/gemm/test_fp8_tile.cu checks the
// halves alone against a float64 reference, test_fp8_tma_tile both in the tile.
template <int kSlices>
__device__ __forceinline__ void fp8_block_mma_promote(float (&acc)[128], float (&scratch)[128 / kSlices], uint64_t desc_a,
                                                      uint64_t desc_b, const float (&row_scale)[2], float col_scale0,
                                                      float col_scale1) {
  static_assert(kSlices == 2 || kSlices == 4, "n128 halves or n64 quarters");
#pragma unroll
  for (int h = 0; h < kSlices; ++h) {
    fp8_slice_issue<kSlices>(scratch, desc_a, desc_b, h);
    ptx::wgmma_wait_group<0>();
    const float col_scale = h < kSlices / 2 ? col_scale0 : col_scale1;
    fp8_slice_promote<kSlices>(acc, scratch, h, row_scale[0] * col_scale, row_scale[1] * col_scale);
  }
}
__device__ __forceinline__ void fp8_block_mma_promote_halves(float (&acc)[128], float (&scratch)[64], uint64_t desc_a,
                                                             uint64_t desc_b, const float (&row_scale)[2],
                                                             float col_scale0, float col_scale1) {
  fp8_block_mma_promote<2>(acc, scratch, desc_a, desc_b, row_scale, col_scale0, col_scale1);
}

// The decode form of one 128-K block (operands swapped: tokens are few, weights many): one warpgroup,
// two m64nN blocks (N = kTokens) of C^T[weight rows x kTokens tokens], block m from the 64 weight rows at
// desc_w[m] (K-major, 128-byte swizzle) with block scale w_scale[m], the tokens at desc_x (the stage's
// first kTokens A rows): acc[kTokens / 2 m + r] += (W_m . X_rows[0, kTokens)^T)[r] * w_scale[m] *
// tok_scale[swapped_row_slot(r)] (this thread's rows' scales, gemm_maps_wgmma.h). Register coordinates:
// swapped_coord<kTokens>. At 8 tokens an eighth of the tensor work of fp8_block_mma_promote_halves's
// 64 x 256. Waits for all its MMAs.
template <int kTokens>
__device__ __forceinline__ void fp8_block_mma_promote_swapped(float (&acc)[kTokens], float (&scratch)[kTokens],
                                                              const uint64_t (&desc_w)[2], uint64_t desc_x,
                                                              const float (&w_scale)[2], const float (&tok_scale)[kTokens / 4]) {
  constexpr int kBlockRegs = kTokens / 2;
  float (&s0)[kBlockRegs] = *reinterpret_cast<float (*)[kBlockRegs]>(&scratch[0]);
  float (&s1)[kBlockRegs] = *reinterpret_cast<float (*)[kBlockRegs]>(&scratch[kBlockRegs]);
  ptx::fence_accumulators(scratch);
  ptx::wgmma_fence();
#pragma unroll
  for (int k = 0; k < kFp8BlockK / kFp8WgmmaK; ++k)
    ptx::wgmma_e4m3_f32<kTokens>(s0, desc_advance(desc_w[0], k * kFp8WgmmaK), desc_advance(desc_x, k * kFp8WgmmaK), k > 0 ? 1 : 0);
#pragma unroll
  for (int k = 0; k < kFp8BlockK / kFp8WgmmaK; ++k)
    ptx::wgmma_e4m3_f32<kTokens>(s1, desc_advance(desc_w[1], k * kFp8WgmmaK), desc_advance(desc_x, k * kFp8WgmmaK), k > 0 ? 1 : 0);
  ptx::wgmma_commit_group();
  ptx::wgmma_wait_group<0>();
  ptx::fence_accumulators(scratch);
#pragma unroll
  for (int i = 0; i < kTokens; ++i)
    acc[i] = fmaf(scratch[i], w_scale[i / kBlockRegs] * tok_scale[swapped_row_slot(i % kBlockRegs)], acc[i]);
}

}  // namespace epfuse::device
