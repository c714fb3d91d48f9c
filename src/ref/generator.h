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
EPFUSE_HD __nv_bfloat16 uniform_bf16(uint64_t row_key, int col, float scale) {
  return __ushort_as_bfloat16(uniform_bf16_bits(row_key, col, scale));
}

// 1/sqrt(fan_in) as the float both sides multiply by; computed once on the host and passed to the
// GPU, so no device sqrt or division enters the bits.
inline float weight_scale(int fan_in) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(fan_in))); }

}  // namespace epfuse::detail
