// The rank process of `epfuse bench` (one per GPU, started by the parent through the launcher with
// the parent's flags plus --worker-dir): measures the ceilings once, then for every case and
// implementation creates the weights and the layer, verifies one forward against the float64
// reference, times the grouped GEMMs alone and the layer over rotated input sets, and rank 0 appends
// the results as records (bench/record.h: JSON Lines) to <worker-dir>/records.jsonl, with progress
// records.
#pragma once
#include <string>

#include "bench/options.h"

namespace epfuse::bench {

inline constexpr const char* kRecordsFile = "records.jsonl";

// Collective over the ranks of the launch (RANK, WORLD_SIZE, ... in the environment).
void run_worker(const BenchOptions& opts);

}  // namespace epfuse::bench
