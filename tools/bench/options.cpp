#include "bench/options.h"

#include <algorithm>
#include <map>

#include "common/flags.h"

namespace epfuse::bench {
namespace {

using tools::UsageError;

BenchCase make_case(std::string config, const LayerConfig& shape, int tokens) {
  BenchCase c{std::move(config), shape, tokens};
  c.layer.max_tokens_per_rank = tokens;
  return c;
}

BenchCase model_case(std::string_view name, int tokens) {
  const std::optional<ModelShape> shape = find_model(name);
  if (!shape) {
    std::string known;
    for (const ModelShape& m : model_shapes()) known += (known.empty() ? "" : ", ") + std::string(m.name);
    throw UsageError("--model: unknown model '" + std::string(name) + "' (known: " + known + ")");
  }
  return make_case(std::string(name), make_config(*shape, tokens), tokens);
}

constexpr const char* kDescription =
    "Times the MoE layer over a sweep of shapes x tokens per rank x implementations on N GPUs (one\n"
    "process per GPU), with the PyTorch peer (bench/peers/torch_ep.py) when torch imports. Per row:\n"
    "median/p10/p90 ms of the layer (per iteration the slowest rank), TFLOP/s per GPU, achieved NVLink\n"
    "GB/s, the floor (max of compute at the GEMM ceiling, touched weights at the HBM ceiling,\n"
    "deduplicated remote bytes at the NVLink ceiling), floor/median, speedups, the grouped GEMMs\n"
    "alone, and whether the configuration matched the float64 reference. Without a GPU it prints the\n"
    "floors only. bench/README.md explains every column.";

}  // namespace

std::vector<BenchCase> facts_cases() {
  std::vector<BenchCase> cases;
  for (int t : {128, 1024, 4096}) cases.push_back(model_case("dsv3", t));
  for (int t : {128, 4096, 16384}) cases.push_back(model_case("qwen3-30b", t));
  cases.push_back(model_case("mixtral", 4096));
  return cases;
}

std::optional<Ceilings> parse_ceilings(std::string_view text) {
  if (text == "measure") return std::nullopt;
  std::map<std::string, double> rates;
  for (const std::string& item : tools::split_list(text)) {
    const size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    char* end = nullptr;
    const double v = eq == std::string::npos ? 0.0 : std::strtod(item.c_str() + eq + 1, &end);
    if (eq == std::string::npos || end == item.c_str() + eq + 1 || *end != '\0' || !(v > 0))
      throw UsageError("--ceilings: item '" + item + "' is not name=positive-number");
    if (key != "gemm" && key != "hbm" && key != "nvlink" && key != "fp8")
      throw UsageError("--ceilings: unknown ceiling '" + key + "' (gemm, hbm, nvlink, fp8)");
    rates[key] = v;
  }
  for (const char* key : {"gemm", "hbm", "nvlink"})
    if (!rates.count(key))
      throw UsageError(std::string("--ceilings: missing ") + key +
                       "= (give all of gemm=TFLOP/s,hbm=GB/s,nvlink=GB/s, or 'measure')");
  Ceilings c{rates["gemm"], rates["hbm"], rates["nvlink"]};
  if (rates.count("fp8")) c.fp8_gemm_tflops = rates["fp8"];
  return c;
}

BenchOptions parse_bench_options(const std::vector<std::string>& args) {
  BenchOptions o;
  o.args = args;
  std::vector<std::string> models, impls{"unfused", "fused"}, dtypes{"bf16"};
  std::string scales = "fp32";
  int sms = 0;
  std::vector<int> tokens{128, 1024, 4096};
  std::string configs, routing = "uniform", torch = "auto", ceilings = "measure";
  LayerConfig custom;

  tools::FlagParser p("epfuse bench [flags]", kDescription);
  p.add("--model", models, "models to sweep (dsv3, qwen3-30b, mixtral)")
      .add("--configs", configs, "'facts': the seven rows of FACTS.md (fixes shapes and tokens)")
      .add("--hidden", custom.hidden, "explicit shape (config 'custom'): hidden size H")
      .add("--intermediate", custom.intermediate, "explicit shape: intermediate size I")
      .add("--experts", custom.num_experts, "explicit shape: number of experts E")
      .add("--topk", custom.topk, "explicit shape: experts per token k")
      .add("--clamp", custom.swiglu_clamp, "SwiGLU clamp (0: none), for every shape")
      .add("--tokens", tokens, "tokens per rank to sweep")
      .add("--impl", impls, "implementations (unfused, fused); unbuilt ones are skipped with a note")
      .add("--dtype", dtypes, "expert weights per case: bf16, fp8 (e4m3, 128x128 block scales)")
      .add("--scales", scales, "FP8 block scales: fp32 or ue8m0")
      .add("--x-fp8", o.x_fp8,
           "FP8 rows hand the layer x already quantised (codes and 1x128 scales,\nTokenBatch::x_fp8), as "
           "MegaMoE takes it; the unfused chain refuses it")
      .add("--peers", o.peers_dir,
           "DeepGEMM/MegaMoE peers' folder (../shared/peers/README.md: prepared by\nprepare_deepgemm.sh, scripts "
           "in DIR/scripts): runs its GEMM-alone and\nMegaMoE steps after the layers, their rows in the same table")
      .add("--peer-steps", o.peer_steps, "which of the peers' steps --peers runs: gemm, megamoe, routed (DeepGEMM's\nFP8 GEMMs on routed expert counts, after gemm has built DeepGEMM)")
      .add("--ranks", o.ranks, "GPUs, one process each (0: all)")
      .add("--sms", sms, "the fused kernel's SM budget per rank (LayerConfig::num_sms; 0: every SM)")
      .add("--routing", routing, "uniform, skewed, one-expert, dropped or one-rank (torch runs uniform only)")
      .add("--warmup", o.warmup, "untimed forwards before timing")
      .add("--iters", o.iters, "timed forwards per row")
      .add("--sets", o.sets, "input sets rotated over the iterations, each with fresh routing")
      .add("--sustained", o.sustained_ms,
           "MS: after the timed calls, forwards back to back (no sync between them) for\nabout MS ms: ms per call, and "
           "energy per call and mean power from the GPU's\nenergy counter (NVML) where the driver has one (0: off)")
      .add("--seed", o.seed, "weights and inputs seed")
      .add("--verify-rows", o.verify_rows, "sampled rows per rank checked against the float64 reference")
      .add("--tolerance", o.tolerance, "max relative error for verified=yes (bf16: ~5e-3 expected)")
      .add("--torch", torch, "the PyTorch peer: auto (if `import torch` works), on, off")
      .add("--ceilings", ceilings, "'measure' or gemm=TFLOP/s,hbm=GB/s,nvlink=GB/s (e.g. gemm=812,hbm=4250,nvlink=350)")
      .add("--json", o.json_path, "write every row and the ceilings to this file")
      .add("--trace", o.trace_path,
           "FILE: the fused kernel's timeline of every rank (needs a build with\n-DEPFUSE_TRACE=ON): "
           "trace::kLaunches calls back to back from the 20th of\neach row (EPFUSE_TRACE_LAUNCH), as Chrome trace-event "
           "JSON for Perfetto's\nUI; the raw records in FILE.csv")
      .add("--layers", o.step_layers,
           "L: after every fused row, an L-layer decode step of its shape: L layers on one\n"
           "workspace, each with its own routing and weights, each output RMS-normalised\n"
           "into the next layer's input; per-layer time = step / L beside the row (0: off)")
      .add("--graph", o.step_graph, "--layers: capture the step as one CUDA graph and time its replays")
      .add("--weight-sets", o.step_weight_sets,
           "--layers: at most this many distinct weight sets, layer i on set i % S\n"
           "(0: as many as fit, leaving 10% of the GPU's memory free)")
      .add("--check-layers", o.step_check_layers,
           "--layers: layers whose output the verified replay compares with the\nfloat64 reference, spread "
           "evenly, first and last included (0: every layer)")
      .add("--worker-dir", o.worker_dir, "internal: rank process of a bench run")
      .hide("--worker-dir");
  p.parse(args);
  o.help = p.help_requested();
  o.usage = p.usage();
  if (o.help) return o;

  if (o.ranks < 0) throw UsageError("--ranks: must be >= 0 (0: all GPUs)");
  if (o.warmup < 0) throw UsageError("--warmup: must be >= 0");
  if (o.iters < 1) throw UsageError("--iters: must be >= 1");
  if (o.sets < 1) throw UsageError("--sets: must be >= 1");
  if (!(o.sustained_ms >= 0)) throw UsageError("--sustained: must be >= 0 ms (0: off)");
  if (o.verify_rows < 1) throw UsageError("--verify-rows: must be >= 1");
  if (o.step_layers < 0) throw UsageError("--layers: must be >= 0 (0: no decode step)");
  if (o.step_weight_sets < 0) throw UsageError("--weight-sets: must be >= 0 (0: as many as fit)");
  if (o.step_check_layers < 0) throw UsageError("--check-layers: must be >= 0 (0: every layer)");
  if (o.step_layers == 0)
    for (const char* flag : {"--graph", "--weight-sets", "--check-layers"})
      if (p.seen(flag)) throw UsageError(std::string(flag) + ": only with --layers L");
  // The layers after the first take the norm's bf16 output; a trace would record the step's launches
  // under the single layer's launch numbers.
  if (o.step_layers > 0 && o.x_fp8) throw UsageError("--layers: not with --x-fp8 (layers 2..L take the norm's bf16 output)");
  if (o.step_layers > 0 && !o.trace_path.empty()) throw UsageError("--layers: not with --trace");
  const std::optional<Routing> r = parse_routing(routing);
  if (!r) throw UsageError("--routing: unknown routing '" + routing + "'");
  o.routing = *r;
  if (torch == "auto") o.torch = TorchMode::kAuto;
  else if (torch == "on") o.torch = TorchMode::kOn;
  else if (torch == "off") o.torch = TorchMode::kOff;
  else throw UsageError("--torch: expected auto, on or off, got '" + torch + "'");
  o.ceilings = parse_ceilings(ceilings);

  for (const std::string& name : impls) {
    if (!parse_impl(name)) throw UsageError("--impl: unknown implementation '" + name + "'");
    bool dup = false;
    for (const std::string& seen : o.impls) dup = dup || seen == name;
    if (!dup) o.impls.push_back(name);
  }
  if (o.impls.empty()) throw UsageError("--impl: no implementation given");
  // The step's layers share one workspace, which only the fused layer has.
  if (o.step_layers > 0 && std::find(o.impls.begin(), o.impls.end(), "fused") == o.impls.end())
    throw UsageError("--layers: the decode step runs the fused layer; add fused to --impl");
  for (const std::string& step : o.peer_steps)
    if (step != "gemm" && step != "megamoe" && step != "routed")
      throw UsageError("--peer-steps: unknown step '" + step + "' (gemm, megamoe, routed)");
  if (o.peer_steps.empty()) throw UsageError("--peer-steps: no step given");
  for (int t : tokens)
    if (t < 1) throw UsageError("--tokens: item " + std::to_string(t) + " must be >= 1");

  const bool explicit_shape = p.seen("--hidden") || p.seen("--intermediate") || p.seen("--experts") || p.seen("--topk");
  if (!configs.empty()) {
    if (configs != "facts") throw UsageError("--configs: expected 'facts', got '" + configs + "'");
    if (p.seen("--tokens")) throw UsageError("--tokens: not with --configs facts (it fixes the tokens)");
    o.cases = facts_cases();
  }
  for (const std::string& m : models)
    for (int t : tokens) o.cases.push_back(model_case(m, t));
  if (explicit_shape) {
    if (!(p.seen("--hidden") && p.seen("--intermediate") && p.seen("--experts") && p.seen("--topk")))
      throw UsageError("--hidden, --intermediate, --experts and --topk: give all four for an explicit shape");
    for (int t : tokens) o.cases.push_back(make_case("custom", custom, t));
  }
  if (o.cases.empty()) o.cases = facts_cases();  // no shape asked: the FACTS.md sweep
  if (sms < 0) throw UsageError("--sms: must be >= 0 (0: every SM)");
  for (BenchCase& c : o.cases) c.layer.swiglu_clamp = custom.swiglu_clamp, c.layer.num_sms = sms;

  // --dtype: each case once per weight format, in the order given.
  std::vector<WeightFormat> formats;
  for (const std::string& d : dtypes) {
    WeightFormat f;
    if (d == "bf16") f = WeightFormat::kBf16;
    else if (d == "fp8") f = WeightFormat::kFp8Block128;
    else throw UsageError("--dtype: expected bf16 or fp8, got '" + d + "'");
    if (std::find(formats.begin(), formats.end(), f) == formats.end()) formats.push_back(f);
  }
  if (formats.empty()) throw UsageError("--dtype: no dtype given");
  const std::optional<ScaleFormat> scale_format = parse_scale_format(scales);
  if (!scale_format) throw UsageError("--scales: expected fp32 or ue8m0, got '" + scales + "'");
  std::vector<BenchCase> expanded;
  for (const BenchCase& c : o.cases)
    for (WeightFormat f : formats) {
      BenchCase e = c;
      e.layer.weight_format = f;
      e.layer.scale_format = f == WeightFormat::kFp8Block128 ? *scale_format : ScaleFormat::kFp32;
      expanded.push_back(e);
    }
  o.cases = std::move(expanded);
  return o;
}

std::string dtype_name(WeightFormat format) { return format == WeightFormat::kFp8Block128 ? "fp8" : "bf16"; }

std::string case_label(const BenchCase& c) {
  std::string label = c.config + " T=" + std::to_string(c.tokens_per_rank);
  if (c.layer.weight_format != WeightFormat::kBf16) {
    label += ' ';
    label += dtype_name(c.layer.weight_format);
  }
  return label;
}

}  // namespace epfuse::bench
