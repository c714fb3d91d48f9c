// TMA tensor maps of the expert weights for the warp-specialised tile GEMM (device/gemm/gemm_mainloop_tma.cuh).
#pragma once
#include <cstdint>

#include <cuda.h>
#include <cuda_bf16.h>

namespace epfuse::fused {

// A 2-D view of a row-major bf16 matrix [rows, cols] (cols contiguous, cols * 2 a multiple of 16 bytes,
// base 16-byte aligned): box of 64 columns (one 128-byte swizzle row) x box_rows rows, 128-byte
// swizzle, so a box lands in shared memory exactly as wgmma's K-major swizzled operand expects.
// Throws Error(kCuda) when the driver refuses it.
CUtensorMap weight_tensor_map(const __nv_bfloat16* base, int64_t rows, int64_t cols, int box_rows);

// The same view of a row-major matrix of FP8 (e4m3) codes [rows, cols] (one byte each; cols a multiple
// of 16, base 16-byte aligned) for the FP8 tile (device/gemm/gemm_mainloop_tma_fp8.cuh): box of 128 columns
// (128 bytes, one swizzle row: one 128-K scale block) x box_rows rows, 128-byte swizzle. Columns past
// `cols` (the partial last K block of a size that is a multiple of 64 only) arrive as zeros.
CUtensorMap weight_tensor_map_fp8(const uint8_t* base, int64_t rows, int64_t cols, int box_rows);

}  // namespace epfuse::fused
