// The frame of a GPU test or benchmark that is its own program (no GoogleTest): ctest reads exit code
// kSkipped as "skipped" (SKIP_RETURN_CODE), and a randomised test prints the seed to rerun it with.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>

namespace epfuse::testing {

inline constexpr int kSkipped = 77;

// True when a GPU is present; otherwise prints why the program skips (the caller returns kSkipped).
inline bool have_gpu() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (devices < 1) std::printf("SKIPPED: needs 1 GPU, found %d\n", devices);
  return devices >= 1;
}

// argv[1] when given, else a fresh seed; printed with the command that reruns it.
inline uint64_t test_seed(int argc, char** argv, const char* program) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 0) : std::random_device{}();
  std::printf("seed %llu (rerun: %s %llu)\n", static_cast<unsigned long long>(seed), program,
              static_cast<unsigned long long>(seed));
  return seed;
}

}  // namespace epfuse::testing
