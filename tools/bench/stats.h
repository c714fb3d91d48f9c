// Summaries of timing samples: median and the 10th / 90th percentiles, and the per-iteration layer
// time of a multi-rank run (the slowest rank decides when the layer is done), and the figures of a
// sustained (back-to-back) run.
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

// `epfuse bench --sustained`: what a back-to-back run of `calls` forwards that took elapsed_ms gives:
// ms per call, and from the energy counter's difference over the run (energy.h; NaN without one)
// joules per call and the mean power in watts.
struct SustainedFigures {
  double ms_per_call;
  double joules_per_call;
  double watts;
};
SustainedFigures sustained_figures(double elapsed_ms, int calls, double joules);

// Forwards for a back-to-back run of about target_ms, given one call's median: at least 10.
int sustained_calls(double target_ms, double median_ms);

}  // namespace epfuse::bench
