#include "bench/decode_step.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

// SplitMix64's finaliser: distinct inputs give unrelated 64-bit outputs.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Keeps the step's seeds apart from tools::call_seed's (the single layer's input sets).
constexpr uint64_t kWeightSalt = 0x57e1647a5e75ULL;
constexpr uint64_t kInputSalt = 0x1a7e5def00dULL;

}  // namespace

int weight_sets_that_fit(size_t free_bytes, size_t total_bytes, size_t set_bytes, size_t reserve_bytes,
                         double keep_free_fraction, int layers, int cap) {
  const double usable = static_cast<double>(free_bytes) - keep_free_fraction * static_cast<double>(total_bytes) -
                        static_cast<double>(reserve_bytes);
  const double fit = set_bytes == 0 ? static_cast<double>(layers) : std::floor(usable / static_cast<double>(set_bytes));
  int sets = static_cast<int>(std::clamp(fit, 1.0, static_cast<double>(std::max(layers, 1))));
  if (cap > 0) sets = std::min(sets, cap);
  return sets;
}

uint64_t weight_set_seed(uint64_t seed, int set) {
  if (set == 0) return seed;
  return mix(seed ^ mix(kWeightSalt + static_cast<uint64_t>(set)));
}

uint64_t step_input_seed(uint64_t seed, int replay, int layer) {
  return mix(seed ^ mix(kInputSalt + (static_cast<uint64_t>(replay) << 32) + static_cast<uint64_t>(layer)));
}

std::vector<int> checked_layers(int layers, int check) {
  std::vector<int> out;
  if (layers <= 0) return out;
  const int n = check <= 0 ? layers : std::min(check, layers);
  if (n == 1) return {layers - 1};  // one layer: the step's output
  // Layer i of n at round(i * (L-1) / (n-1)): first and last included, distinct since n <= L.
  for (int i = 0; i < n; ++i)
    out.push_back(static_cast<int>((static_cast<int64_t>(i) * (layers - 1) + (n - 1) / 2) / (n - 1)));
  return out;
}

std::vector<double> rms_norm_reference(std::span<const double> y, size_t H, double eps) {
  if (H == 0 || y.size() % H != 0)
    throw Error(ErrorCode::kInvalidArgument, "rms_norm_reference: " + std::to_string(y.size()) +
                                                 " values are not rows of " + std::to_string(H));
  std::vector<double> x(y.size());
  for (size_t r = 0; r < y.size() / H; ++r) {
    double sq = 0.0;
    for (size_t h = r * H; h < (r + 1) * H; ++h) sq += y[h] * y[h];
    const double inv = 1.0 / std::sqrt(sq / static_cast<double>(H) + eps);
    for (size_t h = r * H; h < (r + 1) * H; ++h) x[h] = y[h] * inv;
  }
  return x;
}

}  // namespace epfuse::bench
