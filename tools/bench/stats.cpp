#include "bench/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

double percentile_sorted(const std::vector<double>& sorted, double q) {
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

std::vector<double> sorted_copy(std::span<const double> samples, double q) {
  if (samples.empty() || !(q >= 0.0 && q <= 1.0))
    throw Error(ErrorCode::kInvalidArgument, "percentile " + std::to_string(q) + " of " +
                                                 std::to_string(samples.size()) +
                                                 " samples: need >= 1 sample and q in [0, 1]");
  std::vector<double> sorted(samples.begin(), samples.end());
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

}  // namespace

double percentile(std::span<const double> samples, double q) {
  return percentile_sorted(sorted_copy(samples, q), q);
}

Summary summarize(std::span<const double> samples) {
  const std::vector<double> sorted = sorted_copy(samples, 0.5);
  Summary s;
  s.count = sorted.size();
  s.median = percentile_sorted(sorted, 0.5);
  s.p10 = percentile_sorted(sorted, 0.1);
  s.p90 = percentile_sorted(sorted, 0.9);
  s.min = sorted.front();
  s.max = sorted.back();
  s.mean = std::accumulate(sorted.begin(), sorted.end(), 0.0) / static_cast<double>(s.count);
  return s;
}

std::vector<double> max_over_ranks(std::span<const double> per_rank_ms, int world) {
  if (world <= 0 || per_rank_ms.size() % world != 0)
    throw Error(ErrorCode::kInvalidArgument, "max_over_ranks: " + std::to_string(per_rank_ms.size()) +
                                                 " samples do not split over " + std::to_string(world) +
                                                 " ranks");
  const size_t iters = per_rank_ms.size() / world;
  std::vector<double> out(per_rank_ms.begin(), per_rank_ms.begin() + iters);
  for (int r = 1; r < world; ++r)
    for (size_t i = 0; i < iters; ++i) out[i] = std::max(out[i], per_rank_ms[r * iters + i]);
  return out;
}

SustainedFigures sustained_figures(double elapsed_ms, int calls, double joules) {
  if (!(calls > 0 && elapsed_ms > 0))
    throw Error(ErrorCode::kInvalidArgument, "sustained_figures: need calls > 0 and elapsed_ms > 0");
  return {elapsed_ms / calls, joules / calls, joules / (elapsed_ms * 1e-3)};
}

int sustained_calls(double target_ms, double median_ms) {
  if (!(target_ms > 0 && median_ms > 0))
    throw Error(ErrorCode::kInvalidArgument, "sustained_calls: need target_ms > 0 and median_ms > 0");
  const double calls = std::ceil(target_ms / median_ms);
  return calls < 10 ? 10 : calls > 1e6 ? 1000000 : static_cast<int>(calls);
}

}  // namespace epfuse::bench
