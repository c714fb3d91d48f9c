// LayerConfig validation and the model shapes the tools and tests name (dsv3, qwen3-30b, mixtral).
#include "epfuse/config.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <sstream>

#include "common/checked_config.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

constexpr int kMaxTokensPerRank = 1 << 20;

template <typename T>
std::string problem(std::string_view field, T value, std::string_view why) {
  std::ostringstream os;
  os << field << '=' << value << ": " << why;
  return os.str();
}

// a * b * c * d, exact: each factor is a positive int, so the product fits in 128 bits.
using Wide = unsigned __int128;
Wide product(std::initializer_list<long long> factors) {
  Wide p = 1;
  for (long long f : factors) p *= static_cast<Wide>(f);
  return p;
}

std::string to_decimal(Wide v) {
  std::string s;
  do {
    s.insert(s.begin(), static_cast<char>('0' + static_cast<int>(v % 10)));
    v /= 10;
  } while (v != 0);
  return s;
}

constexpr std::array<ModelShape, 3> kModelShapes{{
    {"dsv3", 7168, 2048, 256, 8},
    {"qwen3-30b", 2048, 768, 128, 8},
    {"mixtral", 4096, 14336, 8, 2},
}};

}  // namespace

std::string_view to_string(WeightFormat format) {
  switch (format) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kFp8Block128: return "fp8-block128";
  }
  return "unknown";
}

std::string_view to_string(ScaleFormat format) {
  switch (format) {
    case ScaleFormat::kFp32: return "fp32";
    case ScaleFormat::kUe8m0: return "ue8m0";
  }
  return "unknown";
}

namespace {
// The enumerator among `all` whose to_string is `name`.
template <typename Enum>
std::optional<Enum> parse_name(std::string_view name, std::initializer_list<Enum> all) {
  for (Enum value : all)
    if (name == to_string(value)) return value;
  return std::nullopt;
}
}  // namespace

std::optional<WeightFormat> parse_weight_format(std::string_view name) {
  return parse_name(name, {WeightFormat::kBf16, WeightFormat::kFp8Block128});
}

std::optional<ScaleFormat> parse_scale_format(std::string_view name) {
  return parse_name(name, {ScaleFormat::kFp32, ScaleFormat::kUe8m0});
}

std::string check_config(const LayerConfig& cfg, int world_size) {
  constexpr std::string_view kTiling =
      "must be a positive multiple of 64 (the GPU kernels tile H and I by 128 and run other multiples of 64 "
      "zero-padded)";
  if (cfg.hidden <= 0 || cfg.hidden % kDimAlign != 0) return problem("hidden", cfg.hidden, kTiling);
  if (cfg.intermediate <= 0 || cfg.intermediate % kDimAlign != 0)
    return problem("intermediate", cfg.intermediate, kTiling);
  if (cfg.num_experts < 1) return problem("num_experts", cfg.num_experts, "must be at least 1");
  if (world_size < 1) return problem("world_size", world_size, "must be at least 1");
  if (cfg.num_experts % world_size != 0)
    return problem("num_experts", cfg.num_experts,
                   "must be divisible by world_size=" + std::to_string(world_size) +
                       " (every rank owns the same number of experts)");
  if (cfg.topk < 1) return problem("topk", cfg.topk, "must be at least 1");
  if (cfg.topk > cfg.num_experts)
    return problem("topk", cfg.topk,
                   "exceeds num_experts=" + std::to_string(cfg.num_experts) + " (a token's experts are distinct)");
  if (cfg.topk > kMaxTopk)
    return problem("topk", cfg.topk, "exceeds kMaxTopk=" + std::to_string(kMaxTopk) + " (per-token metadata size)");
  if (cfg.max_tokens_per_rank < 1 || cfg.max_tokens_per_rank > kMaxTokensPerRank)
    return problem("max_tokens_per_rank", cfg.max_tokens_per_rank, "must be in [1, 2^20]");
  if (!std::isfinite(cfg.swiglu_clamp) || cfg.swiglu_clamp < 0.0f)
    return problem("swiglu_clamp", cfg.swiglu_clamp, "must be 0 (no clamp) or a positive finite value");
  if (cfg.num_sms < 0) return problem("num_sms", cfg.num_sms, "must be 0 (every SM) or a positive SM budget");
  if (to_string(cfg.weight_format) == "unknown")
    return problem("weight_format", static_cast<int>(cfg.weight_format), "is not a WeightFormat");
  if (to_string(cfg.scale_format) == "unknown")
    return problem("scale_format", static_cast<int>(cfg.scale_format), "is not a ScaleFormat");
  if (cfg.scale_format != ScaleFormat::kFp32 && cfg.weight_format != WeightFormat::kFp8Block128)
    return problem("scale_format", to_string(cfg.scale_format),
                   "needs weight_format=fp8-block128 (bf16 weights have no scales)");

  // 32-bit indexing limits; the rule is documented with check_config in config.h.
  const long long local_experts = cfg.num_experts / world_size;
  const long long widest_row = std::max<long long>(cfg.hidden, 2LL * cfg.intermediate);
  const Wide rank_rows_elems =
      product({world_size, cfg.max_tokens_per_rank, std::min<long long>(cfg.topk, local_experts), widest_row});
  if (rank_rows_elems >= static_cast<Wide>(kMaxElements))
    return problem("max_tokens_per_rank", cfg.max_tokens_per_rank,
                   "world_size*max_tokens_per_rank*min(topk, E/R)*max(hidden, 2*intermediate) = " +
                       to_decimal(rank_rows_elems) + " elements reaches 2^31 (the kernels index with int32)");
  const Wide expert_elems = product({2, cfg.intermediate, cfg.hidden});
  if (expert_elems >= static_cast<Wide>(kMaxElements))
    return problem("intermediate", cfg.intermediate,
                   "one expert's w13 holds 2*intermediate*hidden = " + to_decimal(expert_elems) +
                       " elements, reaching 2^31 (the kernels index with int32)");
  return "";
}

void validate_config(const LayerConfig& cfg, int world_size) {
  std::string message = check_config(cfg, world_size);
  if (!message.empty()) throw Error(ErrorCode::kInvalidConfig, message);
}

detail::CheckedConfig detail::CheckedConfig::check(const LayerConfig& cfg, int world_size) {
  validate_config(cfg, world_size);
  return CheckedConfig(cfg, world_size);
}

std::span<const ModelShape> model_shapes() { return kModelShapes; }

std::optional<ModelShape> find_model(std::string_view name) {
  for (const ModelShape& shape : kModelShapes)
    if (shape.name == name) return shape;
  return std::nullopt;
}

LayerConfig make_config(const ModelShape& shape, int max_tokens_per_rank, float swiglu_clamp) {
  LayerConfig cfg;
  cfg.hidden = shape.hidden;
  cfg.intermediate = shape.intermediate;
  cfg.num_experts = shape.num_experts;
  cfg.topk = shape.topk;
  cfg.max_tokens_per_rank = max_tokens_per_rank;
  cfg.swiglu_clamp = swiglu_clamp;
  return cfg;
}

}  // namespace epfuse
