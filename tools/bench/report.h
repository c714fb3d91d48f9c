// The rows of a bench run: what the rank processes and the PyTorch peer measure, the figures
// derived from them (TFLOP/s, NVLink GB/s, floor, fraction of floor, speedups), the terminal table
// and the JSON document. Pure host code, unit-tested on the CPU.
#pragma once
#include <limits>
#include <istream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/floor.h"
#include "bench/options.h"
#include "bench/record.h"
#include "common/output.h"

namespace epfuse::bench {

inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct BenchRow {
  // What ran.
  std::string config, routing, impl;
  std::string dtype = "bf16";  // expert weights: "bf16" or "fp8" (dtype_name)
  int hidden = 0, intermediate = 0, experts = 0, topk = 0, tokens_per_rank = 0, ranks = 0;
  int iters = 0, sets = 0;
  std::string note;  // non-empty: the row did not run (e.g. implementation not built), and why
  std::string remark;  // what a peer's row measures, when that is not the whole layer (bench/peers.h)
  // Measured: per iteration the slowest rank's ms; statistics over iterations.
  double median_ms = kNaN, p10_ms = kNaN, p90_ms = kNaN;
  double dispatch_ms = kNaN, experts_ms = kNaN, combine_ms = kNaN;  // phase medians, when reported
  // --sustained: the back-to-back run (slowest rank's ms per call; per GPU, mean over ranks, joules per
  // call and watts from the energy counter, NaN without one); sustained_calls 0: not run.
  int sustained_calls = 0;
  double sustained_ms = kNaN, sustained_joules = kNaN, sustained_watts = kNaN;
  double gemm_alone_ms = kNaN;  // the same cuBLAS GEMMs (W13 and W2) alone, same row counts and path
  // Both paths of the unfused expert GEMM alone (bench/gemm_alone.h), and rank 0's choice.
  double gemm_alone_grouped_ms = kNaN, gemm_alone_loop_ms = kNaN;
  std::string gemm_path;  // "grouped" / "loop"; empty when not measured
  std::string tile;       // the fused kernel's tile in the timed calls (EPFUSE_FUSED_TILE's names); else empty
  std::string verified = "n/a";  // yes / no / n/a
  double rel_err = kNaN;
  long long unwritten = -1;
  // Work per GPU (mean over ranks), from the routing that ran (or its expectation: torch rows).
  double flops_per_gpu = kNaN;
  double remote_bytes_per_gpu = kNaN;  // dispatch (token once per remote rank) + combine rows sent
  Floor floor;                         // per term, the slowest rank's
  // Derived by derive_row.
  double tflops_per_gpu = kNaN, nvlink_gbps = kNaN, gemm_alone_tflops = kNaN;
  double floor_ms = kNaN, floor_fraction = kNaN;  // floor_fraction = floor_ms / median_ms
  std::map<std::string, double> speedup_over;     // other impl -> its median / this median

  // --layers: the L-layer decode step beside a fused row (bench/decode_step.h); step_layers 0: not run.
  int step_layers = 0;
  bool step_graph = false;               // captured as one CUDA graph (else launched from the host)
  int step_weight_sets = 0;              // S distinct weight sets, layer i on set i % S (every rank the same)
  double step_weight_set_bytes = kNaN;   // one set's bytes on one GPU (the largest over ranks)
  double step_median_ms = kNaN, step_p10_ms = kNaN, step_p90_ms = kNaN;  // the whole step, slowest rank
  int step_layers_checked = 0;           // layers whose output the verified replay compared
  std::string step_verified = "n/a";     // yes / no
  double step_rel_err = kNaN;       // max over checked layers of the relative Frobenius error (sampled rows)
  double step_row_err = kNaN;       // max over those rows of the per-row error
  double step_norm_rel_err = kNaN;  // max over the L norms of the per-row error of their output (all rows)
  long long step_unwritten = -1;    // NaN elements of the layers' and norms' outputs after the verified replay
  // Derived by derive_row: step_median_ms / step_layers, and that over the single layer's median_ms.
  double step_per_layer_ms = kNaN, step_per_layer_over_single = kNaN;

  bool ran() const { return note.empty(); }
};

// The shape fields of a row from its case.
BenchRow row_for_case(const BenchCase& c, std::string impl, int ranks, Routing routing);
// Work and floor of a row under uniform routing's expectation (the PyTorch peer's rows).
void fill_expected_load(BenchRow& row, const Ceilings& ceilings);
// TFLOP/s, NVLink GB/s, GEMM-alone TFLOP/s, floor_ms and floor_fraction from the measured fields.
void derive_row(BenchRow& row);
// For every pair of rows that ran with the same shape, tokens and routing: speedup_over.
void fill_speedups(std::vector<BenchRow>& rows);

// Between processes.
Record row_record(const BenchRow& row);
BenchRow row_from_record(const Record& rec);
Record ceilings_record(const Ceilings& c, std::string_view source);
Ceilings ceilings_from_record(const Record& rec);

// What the rank processes reported (rank 0's records file): the ceilings, their source and the rows.
struct WorkerRecords {
  std::optional<Ceilings> ceilings;
  std::string ceilings_source;
  std::vector<BenchRow> rows;
};
// Reads the records file's lines. Every line must be a record of a known kind with its fields:
// anything else throws Error(kInvalidArgument) naming the line and why.
WorkerRecords read_worker_records(std::istream& in);

// Output.
std::string render_table(const std::vector<BenchRow>& rows);
// One line per row with a decode step: its time, per layer against the single layer, the weight sets
// (S, bytes each, layer i on set i % S) and the verdict. "" when no row has one.
std::string render_step_lines(const std::vector<BenchRow>& rows);
std::string render_floor_table(const std::vector<BenchCase>& cases, int world, const Ceilings& c);
tools::Json row_json(const BenchRow& row);

// The facts of a run that head its JSON document.
struct RunInfo {
  std::string device, date, commit, command;
  int gpus = 0;
  Ceilings ceilings;
  std::string ceilings_source;  // "measured" or "flags"
  std::string device_uuid;      // GPU 0's (rank 0's), as nvidia-smi -L writes it
};
// How a row's times are taken (bench/README.md "What it measures"), in the JSON as "timing".
inline constexpr const char* kTimingMethod =
    "cudaEvents around each call on its stream, after a stream sync, a barrier of the ranks and a "
    "200 us GPU delay (the host's launch work falls inside the delay); per iteration the slowest rank";
// How the decode step is timed (bench/README.md "The decode step"), in its JSON object as "timing".
inline constexpr const char* kStepTimingMethod =
    "the whole step per iteration (one CUDA graph replay, or the layers and norms launched from the host), "
    "under the row's protocol; per_layer_ms = median_ms / layers";
// {"device", "gpus", "date", "commit", "command", "timing", "ceilings": {...}, "rows": [...]}
tools::Json report_json(const RunInfo& info, const std::vector<BenchRow>& rows);

}  // namespace epfuse::bench
