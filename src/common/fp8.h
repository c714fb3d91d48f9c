// Internal: FP8 arithmetic of the kFp8Block128 weight format (epfuse/config.h), host and device, so
// that the CPU tests and the float64 reference run the very code the kernels will run.
//
// Element format: e4m3 "fn" (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no infinities;
// 0x7f and 0xff are NaN; the largest finite value is 448 = 0x7e). Encoding rounds to nearest even and
// saturates to +-448 (an infinity too), keeps the sign of zero and of NaN, so decode then encode gives
// back every one of the 256 codes.
//
// Scales: a group (1x128 of a token's channels) or block (128x128 of a weight) is stored as
// code = encode(x * (1 / scale)) and read as decode(code) * scale. The reciprocal is taken once per
// group, in float, rounded to nearest (the kernels must do the same: 1.0f / scale without fast math,
// or __frcp_rn), so the reference and the kernels produce the same codes.
//   kFp32:  scale = amax / 448.
//   kUe8m0: scale = the smallest power of two with amax <= 448 * scale, stored as its biased exponent
//           byte e (scale = 2^(e - 127), as a float's exponent field); then 1 / scale is exact.
// An all-zero group (amax = 0) has scale 1 (e = 127), so it encodes to zeros without 0 / 0. amax must
// be finite (the layer rejects non-finite inputs before quantising).
//
// Sizes that are a multiple of 64 but not of 128 (e.g. 2880): groups and blocks are 128 wide with a
// partial last one of 64, whose scale covers only those 64 rows/columns (block_extent); a dimension
// of n elements has ceil(n / 128) scales (num_blocks).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/host_device.h"
#include "epfuse/config.h"

namespace epfuse::fp8 {

inline constexpr int kBlock = 128;         // group width and weight block side
inline constexpr float kE4m3Max = 448.0f;  // largest finite e4m3 value
inline constexpr uint8_t kE4m3MaxCode = 0x7e;
inline constexpr uint8_t kE4m3NaN = 0x7f;  // | 0x80 for the negative NaN
inline constexpr uint8_t kUe8m0One = 127;  // the exponent byte of scale 1

EPFUSE_HD uint32_t float_bits(float v) {
  uint32_t u;
  memcpy(&u, &v, sizeof(u));
  return u;
}
EPFUSE_HD float bits_float(uint32_t u) {
  float v;
  memcpy(&v, &u, sizeof(v));
  return v;
}

EPFUSE_HD float e4m3_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exp = (code >> 3) & 0xf, man = code & 0x7;
  if (exp == 0xf && man == 0x7) return bits_float(sign | 0x7fc00000u);  // NaN, sign kept
  if (exp == 0) return bits_float(sign | float_bits(static_cast<float>(man) * (1.0f / 512.0f)));  // man * 2^-9
  return bits_float(sign | ((exp - 7 + 127) << 23) | (man << 20));
}

EPFUSE_HD uint8_t float_to_e4m3(float v) {
  const uint32_t bits = float_bits(v);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t mag = bits & 0x7fffffffu;
  if (mag > 0x7f800000u) return sign | kE4m3NaN;
  const float a = bits_float(mag);
  if (a > kE4m3Max) return sign | kE4m3MaxCode;  // every value above 448 rounds to 448 or beyond: saturate
  if (a < 0.015625f) {  // below 2^-6, the smallest normal: subnormal m * 2^-9, m = 8 is code 0x08 = 2^-6
    return sign | static_cast<uint8_t>(rintf(a * 512.0f));  // exact product; rintf rounds half to even
  }
  // Normal: keep 3 of the float's 23 mantissa bits, rounding the 20 dropped bits to nearest even
  // (a carry moves into the exponent, which is right), then rebias the exponent from 127 to 7.
  const uint32_t rounded = (mag + 0x7ffffu + ((mag >> 20) & 1u)) >> 20;
  return sign | static_cast<uint8_t>(rounded - ((127u - 7u) << 3));
}

// --- scales

EPFUSE_HD float ue8m0_to_float(uint8_t e) { return bits_float(static_cast<uint32_t>(e) << 23); }

// The UE8M0 exponent byte for a group of largest magnitude amax (see the top of this file): the float
// amax / 448 rounded up to a power of two. The quotient's rounding cannot land on a power of two
// 2^k from above (the float after 448 * 2^k exceeds it by 2^-23 / 1.75 relative, over half a step of
// 2^k), so this is the exact smallest power; the tests check it against stepping through the powers.
EPFUSE_HD uint8_t ue8m0_scale(float amax) {
  if (!(amax > 0.0f)) return kUe8m0One;
  const uint32_t s = float_bits(amax / kE4m3Max);
  uint32_t e = (s >> 23) + ((s & 0x7fffffu) != 0 ? 1u : 0u);
  // amax / 448 underflowed to 0: the smallest normal scale. No upper clamp is needed: the largest
  // float / 448 is below 2^120, so e <= 247 for every finite amax.
  return static_cast<uint8_t>(e < 1 ? 1 : e);
}

// The scale of a group as a float, in either format (for kUe8m0 the power of two of ue8m0_scale).
EPFUSE_HD float group_scale(float amax, ScaleFormat format) {
  if (format == ScaleFormat::kUe8m0) return ue8m0_to_float(ue8m0_scale(amax));
  const float s = amax / kE4m3Max;
  return s > 0.0f ? s : 1.0f;  // amax = 0 (or so small that amax / 448 underflows): zeros stay zeros
}

// --- blocks and where their scales sit (scale indices)

EPFUSE_HD int num_blocks(int n) { return (n + kBlock - 1) / kBlock; }
// Elements of block b of a dimension of n: 128, or what is left for the last one.
EPFUSE_HD int block_extent(int n, int b) { return n - b * kBlock < kBlock ? n - b * kBlock : kBlock; }

// Quantise the rows x cols tile at x (row stride ldx) into q (row stride ldq) with one scale, returned
// as a float: a 1x128 activation group is rows = 1, a weight block rows = cols = 128 (less at the edges).
EPFUSE_HD float quantize_tile(const float* x, int rows, int cols, long ldx, uint8_t* q, long ldq, ScaleFormat format) {
  float amax = 0.0f;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) amax = fmaxf(amax, fabsf(x[r * ldx + c]));
  const float scale = group_scale(amax, format);
  const float inv = 1.0f / scale;
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) q[r * ldq + c] = float_to_e4m3(x[r * ldx + c] * inv);
  return scale;
}

EPFUSE_HD void dequantize_tile(const uint8_t* q, int rows, int cols, long ldq, float scale, float* x, long ldx) {
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) x[r * ldx + c] = e4m3_to_float(q[r * ldq + c]) * scale;
}

// Quantise a [rows, cols] matrix (row-major, contiguous) into codes q (same shape) and scales blocked
// block_rows x 128 ([ceil(rows / block_rows), ceil(cols / 128)], see blocked_scale_index).
EPFUSE_HD void quantize_matrix(const float* x, int rows, int cols, int block_rows, uint8_t* q, float* scales,
                               ScaleFormat format) {
  for (int r = 0; r < rows; r += block_rows)
    for (int c = 0; c < cols; c += kBlock) {
      const int h = rows - r < block_rows ? rows - r : block_rows;
      const long at = static_cast<long>(r) * cols + c;
      scales[(r / block_rows) * num_blocks(cols) + c / kBlock] =
          quantize_tile(x + at, h, block_extent(cols, c / kBlock), cols, q + at, cols, format);
    }
}

// Scale of element (row, col) of a [rows, cols] matrix blocked block_rows x 128 (128 for weights, 1
// for activations), matrix after matrix: scales [matrices, ceil(rows / block_rows), ceil(cols / 128)].
EPFUSE_HD long blocked_scale_index(int matrix, int row, int col, int rows, int cols, int block_rows) {
  const long row_blocks = (rows + block_rows - 1) / block_rows;
  return (static_cast<long>(matrix) * row_blocks + row / block_rows) * num_blocks(cols) + col / kBlock;
}

// w13 [E_local, 2I, H]: gate rows [0, I) and up rows [I, 2I) are blocked apart (config.h says why),
// scales [E_local, 2 * ceil(I/128), ceil(H/128)].
EPFUSE_HD int w13_scale_rows(int intermediate) { return 2 * num_blocks(intermediate); }
EPFUSE_HD long w13_scale_index(int expert, int row, int col, int intermediate, int hidden) {
  const bool up = row >= intermediate;  // each half is one [I, H] matrix of blocked scales
  return blocked_scale_index(2 * expert + (up ? 1 : 0), up ? row - intermediate : row, col, intermediate, hidden,
                             kBlock);
}

// w2 [E_local, H, I]: scales [E_local, ceil(H/128), ceil(I/128)].
EPFUSE_HD long w2_scale_index(int expert, int row, int col, int hidden, int intermediate) {
  return blocked_scale_index(expert, row, col, hidden, intermediate, kBlock);
}

// Activations x [T, n] (n = H at dispatch, I for h): scales [T, ceil(n/128)], token-major, as this
// reference and the dispatch write them. A TMA-fed SM90 GEMM will likely want them transposed (K-major
// scale blocks, token index fastest: [ceil(n/128), T rounded up to 4 floats = 16 bytes]) so one TMA
// box brings a tile's scales for one K block; that is a kernel-side copy in that order, not this one.
EPFUSE_HD long act_scale_index(int token, int col, int n) {
  return static_cast<long>(token) * num_blocks(n) + col / kBlock;
}

}  // namespace epfuse::fp8
