// 16-byte vectors of 8 bf16, converted to and from fp32 for the chain's elementwise kernels.
#pragma once
#include <cstddef>
#include <cstdint>

#include <cuda_bf16.h>

namespace epfuse::unfused {

inline constexpr int kVec = 8;  // bf16 per 16-byte access
inline constexpr int kWarp = 32;
inline constexpr size_t kDefaultSharedMemory = 48 * 1024;  // more needs cudaFuncSetAttribute

struct Vec8 {
  float v[kVec];
};

__device__ __forceinline__ Vec8 to_float(uint4 raw) {
  Vec8 out;
  const __nv_bfloat162* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out.v[2 * i] = f.x;
    out.v[2 * i + 1] = f.y;
  }
  return out;
}

__device__ __forceinline__ uint4 to_bf16(const Vec8& in) {
  uint4 raw;
  __nv_bfloat162* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < kVec / 2; ++i) pairs[i] = __floats2bfloat162_rn(in.v[2 * i], in.v[2 * i + 1]);
  return raw;
}

__device__ __forceinline__ void add(Vec8& acc, uint4 raw) {
  const Vec8 f = to_float(raw);
#pragma unroll
  for (int i = 0; i < kVec; ++i) acc.v[i] += f.v[i];
}

}  // namespace epfuse::unfused
