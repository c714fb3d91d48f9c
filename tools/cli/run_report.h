// `epfuse run`'s results: per-rank statistics, the summary table and the JSON document, shared by
// the GPU ranks and the CPU reference path.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epfuse/layer.h"

#include "cli/run_options.h"
#include "common/job.h"

namespace epfuse::tools {

struct RankStats {
  int64_t tokens = 0;        // summed over calls
  int64_t routed = 0;        // (token, slot) pairs with an expert
  int64_t dropped = 0;       // slots with -1
  int64_t rows_checked = 0;  // rows compared with the reference, over verified calls
  int64_t unwritten = 0;     // poisoned/NaN output elements, over verified calls
  double rel_err = 0.0;      // the largest over verified calls
  double output_norm = 0.0;  // ||y||_F over the rows computed/checked, all calls
  double seconds = 0.0;      // forward time (GPU: event-timed forwards; CPU: the reference)

  // Fixed-size form for all-gathering as doubles (counts stay exact below 2^53).
  static constexpr int kFields = 8;
  std::vector<double> pack() const;
  static RankStats unpack(const double* v);
};

// Counts the routed and dropped slots of a rank's tokens into `s`.
void count_slots(const HostTokens& tokens, RankStats& s);

struct RunResult {
  std::string device;            // the GPU's name, or "cpu"
  int gpus = 0;
  std::vector<RankStats> ranks;
  std::vector<int> first_call_tokens;
  int calls = 0;                 // calls run
  int calls_verified = 0;
  double max_rel_err = 0.0;
  WorstRow worst_row;            // over verified calls: the row with the largest per-row error
  int64_t unwritten = 0;
  bool verified = false;         // every verified call passed (false for the CPU reference alone)
  MemoryFootprint memory;        // the layer's device buffers on rank 0 (weights not included)
  // GPU runs: rank 0's GPU's memory in use (cudaMemGetInfo) before the first call and after the last,
  // and rank 0's time per call (-1 / empty for the CPU reference).
  int64_t device_used_start = -1;
  int64_t device_used_end = -1;
  CallTimes call_times;
  // --cycles: whether device memory grew by at most RunPlan::kCycleMemoryGrowthBytes on every rank.
  std::optional<bool> memory_flat;
};

// The summary table with a header line naming the config; for the CPU reference the error
// columns are replaced by the output norm.
std::string summary(const RunPlan& plan, const RunResult& result, bool reference_only);
// One line a script can read: "soak: mode=... calls=... checked=... max_rel_err=... max_row_rel_err=...
// unwritten=... memory_start_mib=... memory_end_mib=... verified=yes|no" (with --cycles also cycles=N
// after mode and memory_flat=yes|no at the end; the memory fields -1 where not measured). Part of summary() for GPU runs.
std::string soak_line(const RunPlan& plan, const RunResult& result);
// The --json document (see README.md for its fields).
std::string result_json(const RunPlan& plan, const RunResult& result, const std::string& command);

}  // namespace epfuse::tools
