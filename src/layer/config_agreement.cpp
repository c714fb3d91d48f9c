// Creation-time agreement of the ranks on a layer's configuration (config_agreement.h).
#include "layer/config_agreement.h"

#include <array>
#include <bit>
#include <charconv>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/config_fields.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

// What each rank contributes, in this order. Every value is an int or the clamp's 32 float bits,
// exact in a double, so equal configs gather equal values on every transport. The weight and scale
// formats travel as their enum values.
enum Field {
  kHidden, kIntermediate, kNumExperts, kTopk, kMaxTokens, kClampBits, kWeightFormat, kScaleFormat, kImpl, kNumSms,
  kFields
};
constexpr std::array<const char*, kFields> kNames = {
    "hidden", "intermediate", "num_experts", "topk", "max_tokens_per_rank", "swiglu_clamp", "weight_format",
    "scale_format", "impl", "num_sms"};
// Compared between ranks: every field before num_sms (each rank chooses its own SM budget).
constexpr int kCompared = kNumSms;
static_assert(kFields == detail::kLayerConfigFieldCount + 1,
              "pack() and unpack() carry every LayerConfig field of common/config_fields.h, and the impl");

std::array<double, kFields> pack(const LayerConfig& cfg, Impl impl) {
  std::array<double, kFields> v{};
  v[kHidden] = cfg.hidden;
  v[kIntermediate] = cfg.intermediate;
  v[kNumExperts] = cfg.num_experts;
  v[kTopk] = cfg.topk;
  v[kMaxTokens] = cfg.max_tokens_per_rank;
  v[kClampBits] = std::bit_cast<uint32_t>(cfg.swiglu_clamp);  // bits: -0 and 0 differ, as they do on the GPU
  v[kWeightFormat] = static_cast<int>(cfg.weight_format);
  v[kScaleFormat] = static_cast<int>(cfg.scale_format);
  v[kImpl] = static_cast<int>(impl);
  v[kNumSms] = cfg.num_sms;
  return v;
}

float clamp_of(double bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits)); }

// A rank's config back from its gathered values, so that every rank can run check_config on it.
LayerConfig unpack(std::span<const double> v) {
  LayerConfig cfg;
  cfg.hidden = static_cast<int>(v[kHidden]);
  cfg.intermediate = static_cast<int>(v[kIntermediate]);
  cfg.num_experts = static_cast<int>(v[kNumExperts]);
  cfg.topk = static_cast<int>(v[kTopk]);
  cfg.max_tokens_per_rank = static_cast<int>(v[kMaxTokens]);
  cfg.swiglu_clamp = clamp_of(v[kClampBits]);
  cfg.weight_format = static_cast<WeightFormat>(static_cast<int>(v[kWeightFormat]));
  cfg.scale_format = static_cast<ScaleFormat>(static_cast<int>(v[kScaleFormat]));
  cfg.num_sms = static_cast<int>(v[kNumSms]);
  return cfg;
}

std::string show(int field, double v) {
  if (field == kClampBits) {  // the shortest text that reads back as the same float: unequal clamps print unequal
    char text[32];
    return std::string(text, std::to_chars(text, text + sizeof(text), clamp_of(v)).ptr);
  }
  if (field == kWeightFormat) return std::string(to_string(static_cast<WeightFormat>(static_cast<int>(v))));
  if (field == kScaleFormat) return std::string(to_string(static_cast<ScaleFormat>(static_cast<int>(v))));
  if (field == kImpl) return std::string(to_string(static_cast<Impl>(static_cast<int>(v))));
  return std::to_string(static_cast<long long>(v));
}

}  // namespace

detail::CheckedConfig check_same_config_on_every_rank(Communicator& comm, const LayerConfig& cfg, Impl impl,
                                                      const char* what) {
  const std::array<double, kFields> mine = pack(cfg, impl);
  const std::vector<double> all = comm.all_gather(mine);
  const int world = comm.world_size();
  const auto rank_values = [&](int rank) {
    return std::span<const double>(all).subspan(static_cast<size_t>(rank) * kFields, kFields);
  };
  const std::string head = "rank " + std::to_string(comm.rank()) + ": " + what + ": ";
  // Validity first: the reason exists on the invalid rank only, but every rank can recompute it.
  for (int r = 0; r < world; ++r) {
    const std::string problem = check_config(unpack(rank_values(r)), world);
    if (!problem.empty())
      throw Error(ErrorCode::kInvalidConfig, head + "rank " + std::to_string(r) + " has an invalid config: " + problem);
  }
  for (int field = 0; field < kCompared; ++field) {
    bool same = true;
    for (int r = 1; r < world; ++r) same = same && rank_values(r)[field] == rank_values(0)[field];
    if (same) continue;
    std::string listed;
    for (int r = 0; r < world; ++r)
      listed += (r > 0 ? ", rank " : "rank ") + std::to_string(r) + " = " + show(field, rank_values(r)[field]);
    throw Error(ErrorCode::kInvalidConfig, head + "ranks disagree on " + kNames[field] + ": " + listed);
  }
  return detail::CheckedConfig::check(cfg, world);  // valid: checked above as rank comm.rank()'s
}

}  // namespace epfuse
