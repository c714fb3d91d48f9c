// Internal: counter-based random numbers, identical on host and device. The generator
// (epfuse/inputs.h) defines every input value as a function of (seed, stream, index) through these,
// so no process has to hold or send another's data to reproduce it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define EPFUSE_HD __host__ __device__ __forceinline__
#else
#define EPFUSE_HD inline
#endif

namespace epfuse::detail {

// splitmix64's finaliser: a bijective mix with full avalanche.
EPFUSE_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Named streams keep tensors independent of each other for one seed.
enum class Stream : uint64_t { kX = 1, kW13 = 2, kW2 = 3, kRouting = 4, kTopkWeight = 5, kCounts = 6 };

EPFUSE_HD uint64_t hash_at(uint64_t seed, Stream stream, uint64_t a, uint64_t b = 0) {
  uint64_t h = mix64(seed ^ (static_cast<uint64_t>(stream) * 0x9e3779b97f4a7c15ULL));
  h = mix64(h ^ a);
  return mix64(h ^ (b * 0xd1b54a32d192ed03ULL));
}

// Uniform in [-1, 1) with 24 bits of resolution.
EPFUSE_HD float uniform_pm1(uint64_t h) {
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}
// Uniform in [0, 1).
EPFUSE_HD double uniform01(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace epfuse::detail
