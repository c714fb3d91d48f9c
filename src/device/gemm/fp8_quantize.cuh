// Quantisation of activations to e4m3 with 1x128 scales on the device (weight_format fp8-block128):
// the same arithmetic as common/fp8.h's quantize_tile (amax, group_scale, one IEEE reciprocal, the
// product rounded to nearest even and saturated to +-448), with the hardware's cvt instruction for
// the encoding, so the kernels' codes and scales equal the reference's bit for bit (test_fp8_tile
// checks it).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "common/fp8.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/ptx/ptx.cuh"

namespace epfuse::device {

// The e4m3 codes of (a, b), a in the low byte: rounded to nearest even and saturated to +-448, as
// common/fp8.h float_to_e4m3 (the hardware's cvt).
__device__ __forceinline__ uint32_t e4m3x2(float a, float b) {
  return __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}

// A warp quantises one 1x128 group of a row: lane l takes elements 4l .. 4l + 3 of x (bf16) and writes
// their codes to q; `valid` (128, or 64 for the last group of a size that is a multiple of 64 only,
// fp8::block_extent) elements exist, the rest are neither read nor written. x and q 8- and 4-byte
// aligned. Returns the group's scale (every lane).
__device__ __forceinline__ float warp_quantize_group(const __nv_bfloat16* x, int valid, uint8_t* q,
                                                     ScaleFormat format) {
  const int lane = threadIdx.x % 32;
  const bool mine = 4 * lane < valid;
  float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (mine) {
    const uint2 raw = *reinterpret_cast<const uint2*>(x + 4 * lane);
    const __nv_bfloat162 lo = *reinterpret_cast<const __nv_bfloat162*>(&raw.x);
    const __nv_bfloat162 hi = *reinterpret_cast<const __nv_bfloat162*>(&raw.y);
    v[0] = __low2float(lo), v[1] = __high2float(lo), v[2] = __low2float(hi), v[3] = __high2float(hi);
  }
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  const float scale = fp8::group_scale(amax, format);
  const float inv = __frcp_rn(scale);  // = 1.0f / scale of the reference, without depending on -prec-div
  if (mine) {
    *reinterpret_cast<uint32_t*>(q + 4 * lane) = e4m3x2(v[0] * inv, v[1] * inv) | (e4m3x2(v[2] * inv, v[3] * inv) << 16);
  }
  return scale;
}

// The pieces of a 256-column step that warp_quantize_row and warp_quantize_row_compact share: lane l's 8
// bf16 values of a step (16 bytes), and their codes times g, stored as 8 bytes at q.
__device__ __forceinline__ void unpack_bf16x8(const int4& raw, float (&v)[8]) {
  const __nv_bfloat162* pair = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) v[2 * i] = __low2float(pair[i]), v[2 * i + 1] = __high2float(pair[i]);
}
__device__ __forceinline__ void store_codes_x8(const float (&v)[8], float g, uint8_t* q) {
  uint32_t word[2];
#pragma unroll
  for (int w = 0; w < 2; ++w)
    word[w] = e4m3x2(v[4 * w] * g, v[4 * w + 1] * g) | (e4m3x2(v[4 * w + 2] * g, v[4 * w + 3] * g) << 16);
  *reinterpret_cast<uint2*>(q) = make_uint2(word[0], word[1]);
}
// Lane l's 16 bytes of each of the kUnroll steps from s0 (zeros past the row's `steps`), issued at once.
template <int kUnroll>
__device__ __forceinline__ void load_steps(const __nv_bfloat16* x, int s0, int steps, int4 (&raw)[kUnroll]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u)
    raw[u] = s0 + u < steps ? ptx::ld_nc_na_v4(x + (s0 + u) * 2 * fp8::kBlock + 8 * lane) : make_int4(0, 0, 0, 0);
}
// A row's groups after its whole steps (a last 128 or 64 columns), by warp_quantize_group.
__device__ __forceinline__ void warp_quantize_tail_groups(const __nv_bfloat16* x, int n, int steps, uint8_t* q, float* scales,
                                                          ScaleFormat format, int lane) {
  for (int g = 2 * steps; g < fp8::num_blocks(n); ++g) {
    const float scale = warp_quantize_group(x + g * fp8::kBlock, fp8::block_extent(n, g), q + g * fp8::kBlock, format);
    if (lane == 0) scales[g] = scale;
  }
}

// A warp quantises a row of n bf16 elements (n % 64 == 0): codes to q, the scale of group g to
// scales[g]. A step is 256 elements, two groups (a half-warp each, 16-byte loads); kUnroll steps' loads
// are issued before any is reduced, and their work is laid out so that no step waits for another:
// the steps' amax reductions run side by side, then each lane computes one (step, group)'s scale and
// reciprocal (a division and a reciprocal a lane, not a serial chain of them a step), which the
// encoding takes back by shuffle; a step at a time waited on each step's shuffles, division and
// reciprocal (on an H100 the dispatch phase 6-16% shorter, 16 steps a batch spilled: docs/performance.md#dispatch,
// 2026-11-27). x 16-byte, q 8-byte aligned. A last group of 128 or 64 elements goes through
// warp_quantize_group.
template <int kUnroll = 8>
__device__ __forceinline__ void warp_quantize_row(const __nv_bfloat16* x, int n, uint8_t* q, float* scales,
                                                  ScaleFormat format) {
  static_assert(kUnroll >= 1 && kUnroll <= 16, "one lane per (step, group) of a batch");
  constexpr int kStep = 2 * fp8::kBlock;
  const int lane = threadIdx.x % 32, steps = n / kStep;
  for (int s0 = 0; s0 < steps; s0 += kUnroll) {
    int4 raw[kUnroll];
    load_steps(x, s0, steps, raw);
    // Each step's group amax over its half-warp (steps past the row reduce zeros and are not stored).
    float amax[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float v[8];
      unpack_bf16x8(raw[u], v);
      amax[u] = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) amax[u] = fmaxf(amax[u], fabsf(v[i]));
    }
#pragma unroll
    for (int offset = 8; offset > 0; offset /= 2)
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) amax[u] = fmaxf(amax[u], __shfl_xor_sync(0xffffffffu, amax[u], offset));
    // Lane 2 u + h takes step u's group h: lane 16 h + u of half h holds it.
    float mine = amax[0];
#pragma unroll
    for (int u = 1; u < kUnroll; ++u)
      if ((lane & 15) == u) mine = amax[u];
    mine = __shfl_sync(0xffffffffu, mine, 16 * (lane & 1) + (lane >> 1));
    const float scale = fp8::group_scale(mine, format);
    const float inv = __frcp_rn(scale);  // = 1.0f / scale of the reference, without depending on -prec-div
    if (lane < 2 * min(kUnroll, steps - s0)) scales[2 * s0 + lane] = scale;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (s0 + u >= steps) break;
      const float g = __shfl_sync(0xffffffffu, inv, 2 * u + lane / 16);
      float v[8];
      unpack_bf16x8(raw[u], v);
      store_codes_x8(v, g, q + (s0 + u) * kStep + 8 * lane);
    }
  }
  warp_quantize_tail_groups(x, n, steps, q, scales, format, lane);
}

// warp_quantize_row's codes and scales, for the decode kernels' dispatch: the same loads (kUnroll 16-byte
// loads a lane issued at once), then one 256-column step a round of a loop that is not unrolled, the step's
// registers picked by a chain of selects (an array indexed at run time would go to local memory): a
// half-warp's amax, scale, reciprocal and codes, as warp_quantize_group's. Its steps wait on each other's
// shuffles and divisions (a row's ~2 us slower than warp_quantize_row's side by side), but without the
// unrolled steps the decode kernel's registers fit with 40 spill instructions instead of 105, which took
// 1-2.5% off its calls at world 1; the unrolled layout in this loop form gave qwen3-30b back 1-6%
// (docs/performance.md#the-dispatchs-quantiser-in-the-decode-kernels-2026-12-01). n % 64 == 0; x 16-byte,
// q 8-byte aligned.
template <int kUnroll = 8>
__device__ __forceinline__ void warp_quantize_row_compact(const __nv_bfloat16* x, int n, uint8_t* q, float* scales,
                                                          ScaleFormat format) {
  constexpr int kStep = 2 * fp8::kBlock;
  const int lane = threadIdx.x % 32, steps = n / kStep;
  for (int s0 = 0; s0 < steps; s0 += kUnroll) {
    int4 raw[kUnroll];
    load_steps(x, s0, steps, raw);
#pragma unroll 1
    for (int u = 0; u < min(kUnroll, steps - s0); ++u) {
      int4 r = raw[0];
#pragma unroll
      for (int j = 1; j < kUnroll; ++j)
        if (u == j) r = raw[j];
      float v[8];
      unpack_bf16x8(r, v);
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = fmaxf(amax, fabsf(v[i]));
#pragma unroll
      for (int offset = 8; offset > 0; offset /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
      const float scale = fp8::group_scale(amax, format);
      const float g = __frcp_rn(scale);  // = 1.0f / scale of the reference, without depending on -prec-div
      if ((lane & 15) == 0) scales[2 * (s0 + u) + lane / 16] = scale;
      store_codes_x8(v, g, q + (s0 + u) * kStep + 8 * lane);
    }
  }
  warp_quantize_tail_groups(x, n, steps, q, scales, format, lane);
}

// Linear1's h in the epilogue of a warpgroup's 64 x 128 outputs (one 1x128 group per row): value i of
// h is the output at wgmma_c_coord(thread, i) (rows r and r + 8 alternate in pairs of registers, a row's
// 128 columns spread over the 4 threads of a quad). Each row's amax is reduced over its quad, then its
// 32 values per thread are encoded; code i belongs to the same element as h[i]. The whole warpgroup
// calls it (shuffles); scale[j] is the scale of this thread's row j (r, r + 8).
__device__ __forceinline__ void quantize_fragment_rows(const float (&h)[64], ScaleFormat format, uint8_t (&code)[64],
                                                       float (&scale)[2]) {
  float amax[2] = {0.0f, 0.0f};
#pragma unroll
  for (int i = 0; i < 64; ++i) amax[(i >> 1) & 1] = fmaxf(amax[(i >> 1) & 1], fabsf(h[i]));
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 1));
    amax[j] = fmaxf(amax[j], __shfl_xor_sync(0xffffffffu, amax[j], 2));
    scale[j] = fp8::group_scale(amax[j], format);
  }
  const float inv[2] = {__frcp_rn(scale[0]), __frcp_rn(scale[1])};
#pragma unroll
  for (int i = 0; i < 64; i += 2) {
    const float s = inv[(i >> 1) & 1];
    const uint32_t c = e4m3x2(h[i] * s, h[i + 1] * s);
    code[i] = static_cast<uint8_t>(c & 0xff);
    code[i + 1] = static_cast<uint8_t>(c >> 8);
  }
}

// A warp copies a row the caller quantised (TokenBatch::x_fp8): n code bytes (n % 16 == 0, both
// 16-byte aligned) and its ceil(n / 128) scales, into the layout warp_quantize_row writes.
__device__ __forceinline__ void warp_copy_fp8_row(const uint8_t* codes, const float* scales, int n, uint8_t* q,
                                                  float* q_scales) {
  const int lane = threadIdx.x % 32;
  for (int v = lane; v < n / 16; v += 32)
    reinterpret_cast<int4*>(q)[v] = ptx::ld_nc_na_v4(reinterpret_cast<const int4*>(codes) + v);
  for (int g = lane; g < fp8::num_blocks(n); g += 32) q_scales[g] = __ldg(scales + g);
}

}  // namespace epfuse::device
