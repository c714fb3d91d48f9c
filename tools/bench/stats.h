// Summaries of timing samples: median and the 10th / 90th percentiles, and the per-iteration layer
// time of a multi-rank run (the slowest rank decides when the layer is done).
#pragma once
#include <cstddef>
#include <span>
#include <vector>

namespace epfuse::bench {

struct Summary {
  size_t count = 0;
  double median = 0, p10 = 0, p90 = 0, min = 0, max = 0, mean = 0;
};

// q in [0, 1]; linear interpolation between the two nearest order statistics (numpy's default), so
// percentile(v, 0.5) is the usual median. Throws Error(kInvalidArgument) on an empty sample.
double percentile(std::span<const double> samples, double q);
Summary summarize(std::span<const double> samples);

// per_rank_ms: [world][iters] row-major. Returns [iters]: for each iteration, the max over ranks.
std::vector<double> max_over_ranks(std::span<const double> per_rank_ms, int world);

}  // namespace epfuse::bench
