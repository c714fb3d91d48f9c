// src/common/fp8.h on the CPU: e4m3 codes, rounding and saturation checked against brute force over
// all 256 codes (not against the bit arithmetic under test), scale choice, the quantisation error
// bound, partial blocks at 2880, and the scale index functions against an enumeration of the blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/fp8.h"

namespace epfuse::fp8 {
namespace {

bool is_nan_code(int c) { return (c & 0x7f) == 0x7f; }

// The finite value of a code from its definition: (-1)^s * 2^(e-7) * (1 + m/8), or 2^-6 * m/8 when e = 0.
double value_of(int c) {
  const int e = (c >> 3) & 0xf, m = c & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) ? -v : v;
}

// Nearest finite code by brute force; a tie goes to the even code; beyond 448 saturates.
int nearest_code(double v) {
  int best = -1;
  double best_d = 0;
  for (int c = 0; c <= kE4m3MaxCode; ++c) {
    const double d = std::fabs(std::fabs(v) - value_of(c));
    if (best < 0 || d < best_d || (d == best_d && c % 2 == 0)) best = c, best_d = d;
  }
  return (v < 0 || std::signbit(v) ? 0x80 : 0) | best;
}

TEST(Fp8, DecodeMatchesTheDefinition) {
  for (int c = 0; c < 256; ++c) {
    SCOPED_TRACE(c);
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(v));
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), value_of(c));
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0);  // 0x80 is -0
  }
  EXPECT_EQ(e4m3_to_float(kE4m3MaxCode), 448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);  // smallest subnormal
}

// Every code, NaNs and -0 included, comes back: encode keeps the sign of NaN and zero.
TEST(Fp8, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(c))), c) << c;
}

// Midpoints between neighbouring codes (ties: to even), a float step either side of them, and random
// values, against the brute-force nearest code.
TEST(Fp8, EncodeRoundsToNearestEven) {
  std::vector<float> values;
  for (int c = 0; c < kE4m3MaxCode; ++c) {
    const float mid = static_cast<float>((value_of(c) + value_of(c + 1)) / 2);  // exact in float
    ASSERT_EQ(static_cast<double>(mid), (value_of(c) + value_of(c + 1)) / 2);
    values.insert(values.end(), {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1000.0f)});
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i)
    values.push_back(
        std::ldexp(std::uniform_real_distribution<float>(1.0f, 2.0f)(rng), static_cast<int>(rng() % 26) - 17));
  for (float v : values)
    for (float s : {v, -v}) ASSERT_EQ(float_to_e4m3(s), nearest_code(s)) << s;
  EXPECT_EQ(float_to_e4m3(0x1p-10f), 0x00);      // half the smallest subnormal: tie to even (zero)
  EXPECT_EQ(float_to_e4m3(3 * 0x1p-10f), 0x02);  // 1.5 subnormal steps: tie to even (2)
  EXPECT_EQ(float_to_e4m3(7.5f * 0x1p-9f), 0x08);  // between the largest subnormal and 2^-6: to 2^-6
  EXPECT_EQ(float_to_e4m3(0x1p-20f), 0x00);
}

TEST(Fp8, EncodeSaturates) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v : {448.0f, 449.0f, 463.99f, 464.0f, 480.0f, 1e6f, 3e38f, inf}) {
    EXPECT_EQ(float_to_e4m3(v), kE4m3MaxCode) << v;
    EXPECT_EQ(float_to_e4m3(-v), 0x80 | kE4m3MaxCode) << v;
  }
  EXPECT_EQ(float_to_e4m3(std::nanf("")), kE4m3NaN);
  EXPECT_EQ(float_to_e4m3(-std::nanf("")), 0x80 | kE4m3NaN);
}

TEST(Fp8, Fp32ScaleIsAmaxOver448) {
  for (float amax : {1.0f, 448.0f, 3.5e-3f, 1e30f, 1e-40f})
    EXPECT_EQ(group_scale(amax, ScaleFormat::kFp32), amax / 448.0f) << amax;
  EXPECT_EQ(group_scale(0.0f, ScaleFormat::kFp32), 1.0f);  // all-zero group
}

// UE8M0: the smallest power of two s with amax <= 448 s, checked by stepping through the powers.
TEST(Fp8, Ue8m0ScaleIsTheSmallestPowerOfTwoThatFits) {
  std::vector<float> amaxes = {448.0f, 449.0f, 224.0f, 1.0f, 1e-3f, 7.0f, 0x1p-120f, 3e37f,
                               std::numeric_limits<float>::max()};
  for (int k = -100; k <= 100; ++k) {  // around each power of two times 448, where rounding decides
    const float edge = std::ldexp(448.0f, k);
    amaxes.insert(amaxes.end(), {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, 1e38f)});
  }
  for (float amax : amaxes) {
    SCOPED_TRACE(amax);
    const uint8_t e = ue8m0_scale(amax);
    int want = 1;
    while (!(static_cast<double>(amax) <= 448.0 * std::ldexp(1.0, want - 127))) ++want;
    EXPECT_EQ(e, want);
    EXPECT_EQ(group_scale(amax, ScaleFormat::kUe8m0), std::ldexp(1.0f, want - 127));
  }
  EXPECT_EQ(ue8m0_scale(0.0f), kUe8m0One);
  EXPECT_EQ(ue8m0_to_float(kUe8m0One), 1.0f);
  EXPECT_EQ(ue8m0_scale(1e-44f), 1);  // below the smallest normal scale: clamped to 2^-126
}

// Per element |dequant - x| <= 2^-4 amax: x / scale lies in [-448, 448]; a normal e4m3 value has 3
// mantissa bits, so rounding moves it by at most half a step, 2^-4 of itself (<= 2^-4 of amax / scale);
// a subnormal by at most 2^-10, far less; the float product x * (1/scale) adds a few 2^-24 relative,
// which the bound's slack absorbs except for the top element, which saturates to 448 = amax / scale.
TEST(Fp8, GroupQuantisationErrorIsBoundedByTheGroupAmax) {
  std::mt19937 rng(11);
  for (ScaleFormat format : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) {
    for (int trial = 0; trial < 2000; ++trial) {
      const int width = trial % 2 ? 128 : 64;
      const float magnitude = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
      std::vector<float> x(width), back(width);
      std::normal_distribution<float> normal(0.0f, magnitude);
      for (float& v : x) v = normal(rng) * (trial % 3 == 0 ? std::ldexp(1.0f, -static_cast<int>(rng() % 12)) : 1.0f);
      std::vector<uint8_t> q(width);
      const float scale = quantize_tile(x.data(), 1, width, width, q.data(), width, format);
      dequantize_tile(q.data(), 1, width, width, scale, back.data(), width);
      float amax = 0;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      for (int i = 0; i < width; ++i)
        ASSERT_LE(std::fabs(static_cast<double>(back[i]) - x[i]), std::ldexp(static_cast<double>(amax), -4))
            << "format " << static_cast<int>(format) << " trial " << trial << " element " << i;
    }
  }
  std::vector<float> zeros(128, 0.0f), back(128, 1.0f);
  std::vector<uint8_t> q(128, 0xff);
  EXPECT_EQ(quantize_tile(zeros.data(), 1, 128, 128, q.data(), 128, ScaleFormat::kFp32), 1.0f);
  dequantize_tile(q.data(), 1, 128, 128, 1.0f, back.data(), 128);
  for (float v : back) EXPECT_EQ(v, 0.0f);
}

// 2880 = 22 * 128 + 64: 23 groups/blocks per dimension, the last covering 64. Each block's values
// differ in magnitude, so a scale taken over the wrong elements shows.
TEST(Fp8, PartialBlocksAt2880) {
  constexpr int n = 2880;
  EXPECT_EQ(num_blocks(n), 23);
  EXPECT_EQ(block_extent(n, 21), 128);
  EXPECT_EQ(block_extent(n, 22), 64);
  EXPECT_EQ(num_blocks(128), 1);
  EXPECT_EQ(num_blocks(64), 1);
  // Magnitudes fall from block column 0 (so a last block reaching into the next row would take that
  // row's larger values) and rise down each block's rows (so an amax over fewer rows is too small).
  const auto value = [](int r, int c) {
    const float pattern = (((r * 7 + c * 3) % 11) - 5) / 5.0f * (1.0f + (r % 128) / 64.0f);
    return std::ldexp(pattern * 448.0f, r / 128 - c / 128);
  };
  for (int block_rows : {1, 128}) {
    const int rows = block_rows == 1 ? 3 : n;
    std::vector<float> x(static_cast<size_t>(rows) * n);
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < n; ++c) x[static_cast<size_t>(r) * n + c] = value(r, c);
    std::vector<uint8_t> q(x.size());
    const int row_blocks = (rows + block_rows - 1) / block_rows;
    std::vector<float> scales(static_cast<size_t>(row_blocks) * 23, -1.0f);
    quantize_matrix(x.data(), rows, n, block_rows, q.data(), scales.data(), ScaleFormat::kFp32);
    for (int br = 0; br < row_blocks; ++br)
      for (int bc = 0; bc < 23; ++bc) {
        float amax = 0;  // over the block's own elements only
        for (int r = br * block_rows; r < std::min(rows, (br + 1) * block_rows); ++r)
          for (int c = bc * 128; c < std::min(n, (bc + 1) * 128); ++c)
            amax = std::max(amax, std::fabs(x[static_cast<size_t>(r) * n + c]));
        ASSERT_EQ(scales[static_cast<size_t>(br) * 23 + bc], amax / 448.0f) << block_rows << ": " << br << "," << bc;
      }
    for (size_t i = 0; i < x.size(); ++i) {  // every element coded with its own block's scale
      const int r = static_cast<int>(i / n), c = static_cast<int>(i % n);
      const float scale = scales[static_cast<size_t>(r / block_rows) * 23 + c / 128];
      ASSERT_EQ(q[i], float_to_e4m3(x[i] * (1.0f / scale))) << r << "," << c;
    }
  }
}

// Walks the blocks of `matrices` [rows, cols] matrices in storage order with a counter, and checks that
// index(matrix, row, col) gives every element of the k-th block the value k.
template <typename Index>
void expect_enumeration(int matrices, int rows, int cols, int block_rows, const Index& index) {
  long k = 0;
  for (int m = 0; m < matrices; ++m)
    for (int r0 = 0; r0 < rows; r0 += block_rows)
      for (int c0 = 0; c0 < cols; c0 += 128, ++k)
        for (int r = r0; r < std::min(rows, r0 + block_rows); ++r)
          for (int c = c0; c < std::min(cols, c0 + 128); ++c)
            ASSERT_EQ(index(m, r, c), k) << "matrix " << m << " row " << r << " col " << c;
}

TEST(Fp8, ScaleIndicesEnumerateTheBlocks) {
  for (int hidden : {128, 192, 320, 2880})
    for (int inter : {64, 128, 192, 2880}) {
      if (static_cast<long>(hidden) * inter > 2880L * 320) continue;  // keep the walk short
      SCOPED_TRACE("H " + std::to_string(hidden) + " I " + std::to_string(inter));
      constexpr int experts = 3;
      // w13: expert e's gate half is matrix 2e, its up half 2e + 1, each [I, H].
      expect_enumeration(2 * experts, inter, hidden, 128, [&](int m, int r, int c) {
        return w13_scale_index(m / 2, (m % 2) * inter + r, c, inter, hidden);
      });
      EXPECT_EQ(w13_scale_rows(inter), 2 * ((inter + 127) / 128));
      expect_enumeration(experts, hidden, inter, 128,
                         [&](int m, int r, int c) { return w2_scale_index(m, r, c, hidden, inter); });
      expect_enumeration(1, 5, hidden, 1, [&](int, int t, int c) { return act_scale_index(t, c, hidden); });
    }
  // Multiples of 128: the w13 scales are DeepSeek-V3's [2I/128, H/128], gate then up.
  EXPECT_EQ(w13_scale_index(1, 2048 + 130, 7168 - 1, 2048, 7168), (1 * 32 + 16 + 1) * 56 + 55);
}

}  // namespace
}  // namespace epfuse::fp8
