#include "cli/run_options.h"

#include <algorithm>
#include <charconv>

#include "epfuse/error.h"

namespace epfuse::tools {
namespace {

std::string model_names() {
  std::string names;
  for (const ModelShape& m : model_shapes()) {
    if (!names.empty()) names += '|';
    names += m.name;
  }
  return names;
}

// --tokens: "N", "N,N,...", or "random".
std::vector<int> parse_token_list(const std::string& text) {
  std::vector<int> counts;
  for (const std::string& item : split_list(text)) {
    int v = -1;
    auto [ptr, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (ec != std::errc() || ptr != item.data() + item.size() || v < 0)
      throw UsageError("--tokens " + text + ": '" + item +
                       "' is not a token count (expected N, N,N,... one per rank, or random)");
    counts.push_back(v);
  }
  return counts;
}

}  // namespace

std::optional<WeightFormat> parse_dtype(std::string_view name) {
  if (name == "fp8") return WeightFormat::kFp8Block128;
  return parse_weight_format(name);
}

std::string_view dtype_name(WeightFormat format) {
  return format == WeightFormat::kFp8Block128 ? "fp8" : "bf16";
}

void add_run_flags(FlagParser& p, RunFlags& f) {
  p.add("--model", f.model, "model shape: " + model_names() + " (or give the four shape flags below)");
  p.add("--hidden", f.hidden, "H, model dimension (instead of --model)");
  p.add("--intermediate", f.intermediate, "I, expert FFN dimension (instead of --model)");
  p.add("--experts", f.experts, "E, experts over all ranks (instead of --model)");
  p.add("--topk", f.topk, "k, experts per token (instead of --model)");
  p.add("--clamp", f.clamp, "SwiGLU clamp c > 0: gate <= c, up in [-c, c]; 0 = off");
  p.add("--tokens", f.tokens,
        "tokens per rank: N for every rank, N,N,... one per rank,\nor random (per rank in [0, --max-tokens])");
  p.add("--max-tokens", f.max_tokens,
        "tokens per rank the buffers are sized for (default: the largest\nrequested; 128 with --tokens random)");
  p.add("--ranks", f.ranks, "ranks (GPUs); default: every GPU, or the --tokens list's length");
  p.add("--routing", f.routing, "uniform|skewed|one-expert|dropped|one-rank");
  p.add("--seed", f.seed, "weight seed; each call's inputs are seeded from (seed, call)");
  p.add("--impl", f.impl, "reference|unfused|fused (default: fused with GPUs,\nreference without)");
  p.add("--iters", f.iters, "consecutive forward calls");
  p.add("--vary", f.vary, "fresh routing and token counts in [0, max] for every call after the first");
  p.add("--verify-every", f.verify_every, "compare with the reference every K-th call (first and last always)");
  p.add("--verify-rows", f.verify_rows,
        "rows per rank compared with the reference; 0 = all rows up to " + std::to_string(kAllRowsUpTo) +
            "\ntokens, else " + std::to_string(kSampledRows) + " spread rows incl. the first and last");
  p.add("--tolerance", f.tolerance,
        "max relative Frobenius error vs the float64 reference (bf16 inputs\nand a bf16 intermediate give ~5e-3)");
  p.add("--json", f.json, "write the result as JSON to this file");
  p.add("--one-gpu", f.one_gpu,
        "run every rank in this process on GPU 0, one thread each (tests the\nmulti-rank protocol on one GPU; "
        "fused only; timings mean nothing)");
  p.add("--dtype", f.dtype,
        "expert weights: bf16, or fp8 (e4m3, one scale per 128x128 block; x and h\nquantised 1x128)");
  p.add("--scales", f.scales, "FP8 block scales: fp32 or ue8m0 (powers of two); with --dtype fp8");
  p.add("--x-fp8", f.x_fp8,
        "hand the layer x already quantised (e4m3 codes and 1x128 scales, TokenBatch::x_fp8)\ninstead of "
        "bf16 x; with --dtype fp8");
  p.add("--graph", f.graph,
        "capture the first forward in a CUDA graph and replay it --iters times, fresh\ninputs (its token "
        "counts) copied into the captured buffers before each (fused)");
  p.add("--cycles", f.cycles,
        "create and destroy a workspace with " + std::to_string(RunPlan::kCycleLayers) +
            " layers N times, one forward of each\nper cycle; device memory must stay flat (fused)");
  p.add("--sms", f.sms, "SM budget of the fused kernel per rank (default: every SM,\nor SMs / ranks with --one-gpu)");
  // 0 means "not given" for these: their help says what happens then.
  for (const char* name : {"--hidden", "--intermediate", "--experts", "--topk", "--max-tokens", "--ranks",
                           "--verify-rows", "--sms", "--cycles"})
    p.default_text(name, "");
}

int requested_ranks(const RunFlags& f) {
  if (f.ranks != 0) return f.ranks;
  if (f.tokens != "random") {
    size_t n = split_list(f.tokens).size();
    if (n > 1) return static_cast<int>(n);
  }
  return 0;
}

RunPlan resolve_run_plan(const RunFlags& f, const FlagParser& parser, int ranks, bool have_gpu) {
  RunPlan plan;
  if (ranks < 1) throw UsageError("--ranks must be at least 1, got " + std::to_string(ranks));
  plan.ranks = ranks;

  // Shape: a model, or all four explicit dimensions.
  const char* shape_flags[] = {"--hidden", "--intermediate", "--experts", "--topk"};
  bool any_explicit = std::any_of(std::begin(shape_flags), std::end(shape_flags),
                                  [&](const char* n) { return parser.seen(n); });
  std::optional<ModelShape> shape;
  if (!f.model.empty()) {
    if (any_explicit) throw UsageError("--model and --hidden/--intermediate/--experts/--topk exclude each other");
    shape = find_model(f.model);
    if (!shape) throw UsageError("--model " + f.model + ": unknown model (known: " + model_names() + ")");
    plan.model = f.model;
  } else {
    for (const char* n : shape_flags)
      if (!parser.seen(n))
        throw UsageError(any_explicit ? std::string(n) + " is missing (an explicit shape needs all four)"
                                      : "give --model or --hidden, --intermediate, --experts and --topk");
    shape = ModelShape{"custom", f.hidden, f.intermediate, f.experts, f.topk};
    plan.model = "custom";
  }

  // Tokens per rank and the buffer size.
  int largest = 0;
  if (f.tokens == "random") {
    plan.tokens.random = true;
    largest = f.max_tokens > 0 ? f.max_tokens : 128;
  } else {
    std::vector<int> counts = parse_token_list(f.tokens);
    if (counts.size() == 1) counts.assign(static_cast<size_t>(ranks), counts[0]);
    if (static_cast<int>(counts.size()) != ranks)
      throw UsageError("--tokens " + f.tokens + " has " + std::to_string(counts.size()) + " counts for " +
                       std::to_string(ranks) + " ranks");
    largest = *std::max_element(counts.begin(), counts.end());
    plan.tokens.per_rank = std::move(counts);
  }
  int max_tokens = parser.seen("--max-tokens") ? f.max_tokens : std::max(largest, 1);
  if (parser.seen("--max-tokens") && max_tokens < largest)
    throw Error(ErrorCode::kInvalidConfig, "--max-tokens " + std::to_string(max_tokens) + " is less than the " +
                                               std::to_string(largest) + " tokens requested per rank");
  plan.tokens.max_tokens = max_tokens;

  auto routing = parse_routing(f.routing);
  if (!routing) throw UsageError("--routing " + f.routing + ": expected uniform, skewed, one-expert, dropped or one-rank");
  plan.routing = *routing;

  if (f.impl.empty()) {
    plan.impl = have_gpu ? std::optional(Impl::kFused) : std::nullopt;  // the product; the unfused chain by --impl
  } else if (f.impl != "reference") {
    plan.impl = parse_impl(f.impl);
    if (!plan.impl) throw UsageError("--impl " + f.impl + ": expected reference, unfused or fused");
  }
  if (f.cycles < 0) throw UsageError("--cycles must be >= 0 (0 = off), got " + std::to_string(f.cycles));
  if (f.graph || f.cycles > 0) {
    const std::string mode = f.graph ? "--graph" : "--cycles";
    // Workspaces are the fused layer's; the unfused chain waits on the host inside its forward, which
    // a stream capture cannot hold.
    if (!f.impl.empty() && plan.impl != Impl::kFused)
      throw UsageError(mode + " runs the fused layer: give --impl fused or leave --impl out");
    plan.impl = Impl::kFused;
    if (f.graph && f.cycles > 0) throw UsageError("--graph and --cycles exclude each other");
    if (f.graph && f.vary)
      throw UsageError("--graph replays the first forward's token counts; every replay gets fresh inputs without --vary");
    if (f.cycles > 0 && parser.seen("--iters"))
      throw UsageError("--cycles runs one forward of each layer per cycle: leave --iters out");
  }
  plan.graph = f.graph;
  plan.cycles = f.cycles;
  plan.one_gpu = f.one_gpu;
  if (f.one_gpu && plan.impl == Impl::kUnfused)
    throw Error(ErrorCode::kUnsupported,
                "--impl unfused is unsupported in one-GPU mode (its all-to-alls are NCCL collectives, which need "
                "one GPU per rank); use --impl fused");
  if (f.sms < 0) throw UsageError("--sms must be >= 0 (0 = the default budget), got " + std::to_string(f.sms));

  if (f.iters < 1) throw UsageError("--iters must be at least 1, got " + std::to_string(f.iters));
  if (f.verify_every < 1) throw UsageError("--verify-every must be at least 1, got " + std::to_string(f.verify_every));
  if (f.verify_rows < 0) throw UsageError("--verify-rows must be >= 0, got " + std::to_string(f.verify_rows));
  if (!(f.tolerance > 0)) throw UsageError("--tolerance must be > 0");
  if (f.clamp < 0) throw UsageError("--clamp must be >= 0 (0 = off)");
  plan.seed = f.seed;
  plan.iters = f.iters;
  plan.vary = f.vary;
  plan.verify_every = f.verify_every;
  plan.verify_rows = f.verify_rows;
  plan.tolerance = f.tolerance;
  plan.json = f.json;

  plan.cfg = make_config(*shape, max_tokens, f.clamp);
  plan.cfg.num_sms = f.sms;
  const std::optional<WeightFormat> weights = parse_dtype(f.dtype);
  if (!weights) throw UsageError("--dtype " + f.dtype + ": expected bf16 or fp8");
  plan.cfg.weight_format = *weights;
  const std::optional<ScaleFormat> scales = parse_scale_format(f.scales);
  if (!scales) throw UsageError("--scales " + f.scales + ": expected fp32 or ue8m0");
  if (parser.seen("--scales") && *weights != WeightFormat::kFp8Block128)
    throw UsageError("--scales " + f.scales + ": only with --dtype fp8 (bf16 weights have no scales)");
  plan.cfg.scale_format = *scales;
  if (f.x_fp8 && *weights != WeightFormat::kFp8Block128)
    throw UsageError("--x-fp8: only with --dtype fp8 (x is quantised for FP8 layers)");
  plan.x_fp8 = f.x_fp8;
  validate_config(plan.cfg, ranks);  // Error(kInvalidConfig) naming the field
  return plan;
}

}  // namespace epfuse::tools
