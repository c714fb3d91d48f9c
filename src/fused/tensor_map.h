// TMA tensor maps of the expert weights for the warp-specialised tile GEMM (device/gemm_mainloop_tma.cuh).
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

}  // namespace epfuse::fused
