// Internal: counter-based random numbers, identical on host and device. The generator
// (epfuse/inputs.h) defines every input value as a function of (seed, stream, index) through these,
// so no process has to hold or send another's data to reproduce it.
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace epfuse::detail {

// splitmix64's finaliser: a bijective mix with full avalanche.
EPFUSE_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Named streams keep tensors independent of each other for one seed.
enum class Stream : uint64_t {
  kX = 1,
  kW13 = 2,
  kW2 = 3,
  kRouting = 4,     // per-expert selection keys of a token
  kTopkWeight = 5,  // a token's raw top-k weights
  kCounts = 6,      // per-rank token counts
  kDrop = 7,        // which slots of a token are dropped
  kHotExperts = 8,  // which experts are hot (skewed) or the one expert (one-expert)
};

// Keys chain: key(seed, stream) -> next(key, a) -> next(.., b) ... Each step is one mix64, so a
// caller that walks a row hashes its prefix once and pays one mix64 per element.
EPFUSE_HD uint64_t hash_key(uint64_t seed, Stream stream) {
  return mix64(seed ^ (static_cast<uint64_t>(stream) * 0x9e3779b97f4a7c15ULL));
}
EPFUSE_HD uint64_t hash_next(uint64_t key, uint64_t index) {
  // The odd multiplier spreads small consecutive indices over all bits before the mix.
  return mix64(key ^ (index * 0xd1b54a32d192ed03ULL));
}
EPFUSE_HD uint64_t hash_at(uint64_t seed, Stream stream, uint64_t a, uint64_t b = 0) {
  return hash_next(hash_next(hash_key(seed, stream), a), b);
}

// Uniform in [-1, 1) with 24 bits of resolution: every value is exact in float.
EPFUSE_HD float uniform_pm1(uint64_t h) {
  return static_cast<float>(static_cast<int32_t>(h >> 40) - (1 << 23)) * (1.0f / (1 << 23));
}
// Uniform in [0, 1) with 53 bits of resolution.
EPFUSE_HD double uniform01(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

// Uniform integer in [0, n): the high 64 bits of h * n (bias below n / 2^64).
EPFUSE_HD uint64_t uniform_below(uint64_t h, uint64_t n) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(h, n);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
#endif
}

}  // namespace epfuse::detail
