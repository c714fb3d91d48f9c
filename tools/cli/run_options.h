// `epfuse run`'s options: the flags, and their resolution into a layer config, a token plan and
// a verification schedule (pure; checked before any rank starts).
#pragma once
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/flags.h"
#include "common/job.h"
#include "epfuse/config.h"
#include "epfuse/inputs.h"
#include "epfuse/layer.h"

namespace epfuse::tools {

// The flags as given.
struct RunFlags {
  std::string model;
  int hidden = 0, intermediate = 0, experts = 0, topk = 0;
  float clamp = 0.0f;
  std::string tokens = "128";
  int max_tokens = 0;
  int ranks = 0;
  std::string routing = "uniform";
  uint64_t seed = 1;
  std::string impl;
  int iters = 1;
  bool vary = false;
  int verify_every = 1;
  int verify_rows = 0;
  double tolerance = 2e-2;
  std::string json;
  bool one_gpu = false;
  int sms = 0;
  std::string dtype = "bf16";    // expert weights: bf16 or fp8 (LayerConfig::weight_format)
  std::string scales = "fp32";   // FP8 block scales: fp32 or ue8m0 (LayerConfig::scale_format)
  bool x_fp8 = false;            // x quantised by the caller (TokenBatch::x_fp8)
  bool graph = false;            // the soak replays one forward captured in a CUDA graph
  int cycles = 0;                // create/destroy cycles of a workspace and its layers (0: none)
};

// --dtype's names: "bf16" or "fp8" (also the long names of to_string(WeightFormat)); and the short
// name of a format, as bench rows and the run JSON carry it in "dtype".
std::optional<WeightFormat> parse_dtype(std::string_view name);
std::string_view dtype_name(WeightFormat format);

// Registers every `epfuse run` flag on `parser`, writing into `flags`.
void add_run_flags(FlagParser& parser, RunFlags& flags);

// Which `epfuse run` flag sets each LayerConfig field (the list: src/common/config_fields.h), with a
// value that moves the field off its default and the flags that value needs beside it.
// tests/cpu/tools/test_config_flags.cpp checks that every listed field is here or in
// kConfigFieldsWithoutFlag, and that each flag reaches its field and no other.
struct ConfigFieldFlag {
  const char* field;                // LayerConfig member
  const char* flag;                 // the flag that sets it
  const char* value;                // a value for the flag that differs from the field's default
  std::array<const char*, 2> with;  // another flag and value it needs ({} if none)
};
inline constexpr ConfigFieldFlag kConfigFieldFlags[] = {
    {"hidden", "--hidden", "256", {}},
    {"intermediate", "--intermediate", "256", {}},
    {"num_experts", "--experts", "16", {}},
    {"topk", "--topk", "4", {}},
    {"max_tokens_per_rank", "--max-tokens", "16", {}},
    {"swiglu_clamp", "--clamp", "5", {}},
    {"num_sms", "--sms", "12", {}},
    {"weight_format", "--dtype", "fp8", {}},
    {"scale_format", "--scales", "ue8m0", {"--dtype", "fp8"}},
};
// LayerConfig fields `epfuse run` deliberately sets without a flag of their own (none today).
inline constexpr std::array<const char*, 0> kConfigFieldsWithoutFlag{};

// What the run does, resolved.
struct RunPlan {
  std::string model;       // a model name, or "custom"
  LayerConfig cfg;
  int ranks = 1;
  TokenPlan tokens;
  Routing routing = Routing::kUniform;
  uint64_t seed = 1;
  std::optional<Impl> impl;  // nullopt: the CPU reference
  int iters = 1;
  bool vary = false;
  int verify_every = 1;
  int verify_rows = 0;     // 0: sample_rows' default
  double tolerance = 2e-2;
  std::string json;
  bool one_gpu = false;    // every rank a thread of this process on GPU 0 (Transport::kLoopback)
  bool x_fp8 = false;      // the layer gets x as codes and scales (TokenBatch::x_fp8), not bf16
  // --graph: the first forward is captured in a CUDA graph on its input buffers, and every iteration replays
  // it after fresh inputs (seeded from (seed, iteration), the first forward's token counts) are copied into them.
  bool graph = false;
  // --cycles N (0: off): N cycles of a workspace and kCycleLayers fused layers on it created, one
  // forward of each, then destroyed; verify_every counts cycles.
  int cycles = 0;
  static constexpr int kCycleLayers = 3;
  // What device memory may grow from after the first cycle to after the last before --cycles fails:
  // over 1,000 cycles a leak of 8 KiB a cycle exceeds it; above the allocator's 2 MiB granularity.
  static constexpr int64_t kCycleMemoryGrowthBytes = int64_t{8} << 20;

  bool verifies_call(int call) const { return scheduled(call, iters); }
  bool verifies_cycle(int cycle) const { return scheduled(cycle, cycles); }
  // "calls", "graph" or "cycles": what the run repeats (the soak line of the summary, the JSON's "mode").
  const char* mode() const { return cycles > 0 ? "cycles" : graph ? "graph" : "calls"; }
  // The first and the last of n, and every verify_every-th.
  bool scheduled(int i, int n) const { return i == 0 || i == n - 1 || (verify_every > 0 && i % verify_every == 0); }
  // The input seed of a call: fresh per call with --vary, else every call repeats call 0's inputs.
  uint64_t input_seed(int call) const { return call_seed(seed, vary ? call : 0); }
  std::vector<int> token_counts(int call) const {
    return token_counts_for_call(tokens, ranks, seed, call, vary);
  }
};

// Resolves flags for `ranks` ranks (the caller picked it: --ranks, the GPU count, or the token
// list's length). `have_gpu` decides the default impl (fused with --one-gpu). Throws UsageError for
// flag combinations that make no sense, epfuse::Error(kInvalidConfig) for a layer config check_config
// rejects and Error(kUnsupported) for --impl unfused with --one-gpu.
RunPlan resolve_run_plan(const RunFlags& flags, const FlagParser& parser, int ranks, bool have_gpu);

// The number of ranks the flags ask for without looking at GPUs: --ranks, else the length of a
// --tokens list with more than one entry, else 0 (let the caller decide).
int requested_ranks(const RunFlags& flags);

}  // namespace epfuse::tools
