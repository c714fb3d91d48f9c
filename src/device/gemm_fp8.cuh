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

#include "device/gemm_maps_wgmma.h"
#include "device/wgmma.cuh"

namespace epfuse::device {

inline constexpr int kFp8WgmmaK = 32;      // K of one wgmma.m64nNk32 e4m3 (32 bytes of a row)
inline constexpr int kFp8BlockK = kSw128RowBytes;  // FP8 elements of K per swizzled row: one scale block

namespace ptx {

// D[64 x 64] (+)= A[64 x 32] * B[64 x 32]^T, e4m3 operands K-major in shared memory (descriptors).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_f32(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                         int scale_d) {
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

}  // namespace ptx

// One warpgroup, one 128-K block of a 64 x 256 tile in four n64 quarters: acc[32 q + i] += (A_block .
// B_rows[64 q, 64 q + 64)^T)[i] * row_scale * (q < 2 ? col_scale0 : col_scale1), with B's 256 rows at
// desc_b (K-major, 128-byte swizzle, row r at 128 r bytes). Two 32-register scratch accumulators take
// turns, so each quarter's MMAs run while the quarter before is promoted and only the last promotion
// waits with the tensor cores idle (two n128 halves into one 64-register scratch, measured 1-3% slower,
// left them idle through both: bench/NOTES.md, session 16). Same registers: 128 accumulators + 2 x 32
// scratch. Waits for all its MMAs (the stage is free on return). tests/gpu/gemm/test_fp8_tile.cu
// checks it alone against a float64 reference.
__device__ __forceinline__ void fp8_block_mma_promote_quarters(float (&acc)[128], float (&scratch_a)[32],
                                                               float (&scratch_b)[32], uint64_t desc_a,
                                                               uint64_t desc_b, const float (&row_scale)[2],
                                                               float col_scale0, float col_scale1) {
  constexpr uint32_t kQuarterBytes = 64 * kSw128RowBytes;
  const auto issue = [&](float (&d)[32], int q) {
#pragma unroll
    for (int k = 0; k < kFp8BlockK / kFp8WgmmaK; ++k)
      ptx::wgmma_m64n64k32_e4m3_f32(d, desc_advance(desc_a, k * kFp8WgmmaK),
                                    desc_advance(desc_b, q * kQuarterBytes + k * kFp8WgmmaK), k > 0 ? 1 : 0);
    ptx::wgmma_commit_group();
  };
  const auto promote = [&](float (&d)[32], int q, float col_scale) {
    ptx::fence_accumulators(d);
    const float s0 = row_scale[0] * col_scale, s1 = row_scale[1] * col_scale;
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[32 * q + i] = fmaf(d[i], ((i >> 1) & 1) ? s1 : s0, acc[32 * q + i]);
  };
  ptx::fence_accumulators(scratch_a);
  ptx::fence_accumulators(scratch_b);
  ptx::wgmma_fence();
  issue(scratch_a, 0);
  issue(scratch_b, 1);
  ptx::wgmma_wait_group<1>();
  promote(scratch_a, 0, col_scale0);
  ptx::wgmma_fence();  // scratch_a was read by the promotion: order it before the MMAs that overwrite it
  issue(scratch_a, 2);
  ptx::wgmma_wait_group<1>();
  promote(scratch_b, 1, col_scale0);
  ptx::wgmma_fence();
  issue(scratch_b, 3);
  ptx::wgmma_wait_group<1>();
  promote(scratch_a, 2, col_scale1);
  ptx::wgmma_wait_group<0>();
  promote(scratch_b, 3, col_scale1);
}

}  // namespace epfuse::device
