// Internal: the generator's element values as __host__ __device__ functions, so the host
// (weight_w13/weight_w2, the reference) and the GPU (generate_expert_weights) compute the same bits.
//
// A row of a matrix has a key hashed once from (seed, stream, index...); an element is one more
// mix64 of the key with its column. The float value u * scale (u in [-1, 1), exact in float, one
// IEEE multiply) is rounded to bf16 by the bit arithmetic below, the same code on both sides (and
// the same result as __float2bfloat16_rn for finite values; tests/cpu/ref checks that).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include <cuda_bf16.h>

#include "common/hash.h"

namespace epfuse::detail {

// Expert weights: stream kW13 or kW2, global expert id, row of that expert's matrix.
EPFUSE_HD uint64_t weight_row_key(uint64_t seed, Stream stream, int expert, int row) {
  return hash_next(hash_next(hash_key(seed, stream), static_cast<uint64_t>(expert)), static_cast<uint64_t>(row));
}
// Tokens: row t of rank `rank`'s x.
EPFUSE_HD uint64_t token_row_key(uint64_t seed, int rank, int token) {
  return hash_next(hash_next(hash_key(seed, Stream::kX), static_cast<uint64_t>(rank)), static_cast<uint64_t>(token));
}

// Round-to-nearest-even of a finite float to bf16, as raw bits. Spelled out rather than calling
// __float2bfloat16_rn, whose host version is several times slower than the hash itself.
EPFUSE_HD uint16_t bf16_bits_rn(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof(bits));
  bits += 0x7fffu + ((bits >> 16) & 1u);  // ties go to the even neighbour
  return static_cast<uint16_t>(bits >> 16);
}
// The float a bf16 bit pattern stands for (exact).
EPFUSE_HD float bf16_bits_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float value;
  memcpy(&value, &wide, sizeof(value));
  return value;
}

// The generator's element at column `col` of the row with key `row_key`, as bf16 bits.
EPFUSE_HD uint16_t uniform_bf16_bits(uint64_t row_key, int col, float scale) {
  return bf16_bits_rn(uniform_pm1(hash_next(row_key, static_cast<uint64_t>(col))) * scale);
}

// Magnitudes that differ between FP8 scale groups: each 128-element group of a token row and each
// 128 x 128 block of an expert matrix is scaled by 2^-j, j in {0, 1, 2} from a hash. Uniform values
// alone give every group nearly the same largest magnitude, so a scale taken from the wrong group or
// block would pass every check; powers of two keep an element one exact product (the multiply by
// `scale` above stays exact in its rounding).
EPFUSE_HD float group_magnitude(uint64_t key, int col) {
  constexpr uint64_t kGroupTag = 0x67726f7570ULL;  // keeps these draws apart from the element draws
  return 1.0f / static_cast<float>(1u << (hash_next(key ^ kGroupTag, static_cast<uint64_t>(col / 128)) % 3));
}
// The key of an expert matrix's 128-row block holding `row` (group_magnitude's key for weights).
EPFUSE_HD uint64_t weight_block_key(uint64_t seed, Stream stream, int expert, int row) {
  return weight_row_key(seed, stream, expert, -1 - row / 128);  // negative rows: never an element row's key
}
// The weight element (expert, row, col) of `stream` as bf16 bits: uniform * scale * its block's magnitude.
EPFUSE_HD uint16_t weight_bf16_bits(uint64_t row_key, uint64_t block_key, int col, float scale) {
  return uniform_bf16_bits(row_key, col, scale * group_magnitude(block_key, col));
}
// Token element col of the row with key `x_key` as bf16 bits: uniform * its group's magnitude.
EPFUSE_HD uint16_t token_bf16_bits(uint64_t x_key, int col) {
  return uniform_bf16_bits(x_key, col, group_magnitude(x_key, col));
}

// 1/sqrt(fan_in) as the float both sides multiply by; computed once on the host and passed to the
// GPU, so no device sqrt or division enters the bits.
inline float weight_scale(int fan_in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))); }

}  // namespace epfuse::detail
