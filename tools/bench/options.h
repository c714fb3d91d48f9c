// `epfuse bench` options and the sweep they describe: which layer shapes, tokens per rank and
// implementations run, with which protocol (warm-up, iterations, rotated input sets) and ceilings.
// Parsing and expansion are pure host code, unit-tested on the CPU.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bench/floor.h"
#include "epfuse/config.h"
#include "epfuse/inputs.h"
#include "epfuse/layer.h"

namespace epfuse::bench {

// One layer shape at one token count per rank (every rank gets the same count).
struct BenchCase {
  std::string config;  // model name, or "custom" for explicit --hidden/--intermediate/...
  LayerConfig layer;   // max_tokens_per_rank = tokens_per_rank
  int tokens_per_rank = 0;
};

enum class TorchMode { kAuto, kOn, kOff };

struct BenchOptions {
  std::vector<BenchCase> cases;
  std::vector<std::string> impls;  // as given ("unfused", "fused"); unknown names rejected
  std::string peers_dir;           // --peers: the DeepGEMM / MegaMoE peers' folder (bench/peers.h)
  std::vector<std::string> peer_steps{"gemm", "megamoe"};  // --peer-steps: run_deepgemm_peers.sh's steps, and routed
  int ranks = 0;                   // 0: every GPU
  Routing routing = Routing::kUniform;
  int warmup = 5;
  int iters = 50;
  int sets = 4;
  double sustained_ms = 0;  // --sustained: a back-to-back run of about this long after the timed calls (0: none)
  uint64_t seed = 1;
  int verify_rows = 8;  // sampled rows per rank compared with the float64 reference
  double tolerance = 2e-2;
  TorchMode torch = TorchMode::kAuto;
  bool x_fp8 = false;  // FP8 rows get x quantised by the caller (TokenBatch::x_fp8)
  std::optional<Ceilings> ceilings;  // nullopt: measure on every GPU in the run
  std::string json_path;
  // --trace: the fused kernel's timeline (a -DEPFUSE_TRACE=ON build) as Chrome trace-event JSON
  // (tools/bench/trace_export.h); the rank processes' CSV stays beside it as FILE.csv.
  std::string trace_path;
  // --layers L: after every fused row, the L-layer decode step of that row's shape (bench/decode_step.h):
  // L layers on one workspace, each with its own routing and weights, RMS-normalised between layers.
  int step_layers = 0;         // 0: no step
  bool step_graph = false;     // --graph: the step captured as one CUDA graph and replayed (else launched)
  int step_weight_sets = 0;    // --weight-sets: at most this many distinct weight sets (0: as many as fit)
  int step_check_layers = 0;   // --check-layers: layers checked against the reference (0: every layer)
  std::string worker_dir;  // internal: set in the rank processes the parent launches
  std::vector<std::string> args;  // as given, so the parent can pass them on to its rank processes
  bool help = false;
  std::string usage;
};

// The seven rows of FACTS.md: dsv3 x {128, 1024, 4096}, qwen3-30b x {128, 4096, 16384}, mixtral x 4096.
std::vector<BenchCase> facts_cases();
// "measure" -> nullopt; "gemm=812,hbm=4250,nvlink=350" (TFLOP/s, GB/s, GB/s; all three) -> rates.
// Throws tools::UsageError naming the item.
std::optional<Ceilings> parse_ceilings(std::string_view text);
// The arguments after "bench". Throws tools::UsageError for bad flags, names or shapes.
BenchOptions parse_bench_options(const std::vector<std::string>& args);

// "bf16" / "fp8": the dtype of a row, the name --dtype takes.
std::string dtype_name(WeightFormat format);

// "dsv3 T=4096" etc. (" fp8" appended for FP8 cases) for progress and tables.
std::string case_label(const BenchCase& c);

}  // namespace epfuse::bench
