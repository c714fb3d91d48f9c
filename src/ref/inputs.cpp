// The seeded input generator: tokens, routing, top-k weights, token counts and expert weights.
#include "epfuse/inputs.h"

#include <algorithm>
#include <array>
#include <string>

#include "epfuse/error.h"
#include "ref/generator.h"

namespace epfuse {
namespace {

using detail::hash_key;
using detail::hash_next;
using detail::Stream;
using detail::uniform_below;

constexpr std::array<std::pair<Routing, std::string_view>, 5> kRoutingNames{{
    {Routing::kUniform, "uniform"},
    {Routing::kSkewed, "skewed"},
    {Routing::kOneExpert, "one-expert"},
    {Routing::kDropped, "dropped"},
    {Routing::kOneRank, "one-rank"},
}};

// A token's key in a stream: tokens are named by (rank, index on that rank).
uint64_t token_key(uint64_t seed, Stream stream, int rank, int token) {
  return hash_next(hash_next(hash_key(seed, stream), static_cast<uint64_t>(rank)), static_cast<uint64_t>(token));
}

// The i-th element of [0, pool) not in `taken` (ascending, all < pool).
int nth_free(int i, const int* taken, int num_taken) {
  for (int t = 0; t < num_taken && taken[t] <= i; ++t) ++i;
  return i;
}
void insert_sorted(int value, int* taken, int& num_taken) {
  int pos = num_taken++;
  for (; pos > 0 && taken[pos - 1] > value; --pos) taken[pos] = taken[pos - 1];
  taken[pos] = value;
}

// Skewed routing: `count` hot experts, drawn `weight` times as often as each other expert.
struct HotExperts {
  std::array<int, 4> sorted{};  // ascending expert ids
  int count = 0;
  int64_t weight = 1;  // integer selection weight of a hot expert; cold experts have 1
  int first = 0;       // the first one drawn: the target of one-expert routing
};

// Hot experts of a seed (identical on every rank); the first drawn is also the one-expert target.
HotExperts hot_experts(uint64_t seed, int num_experts) {
  HotExperts hot;
  const int count = std::min(4, std::max(1, num_experts / 4));
  // Hot mass three times the cold mass: with 4 hot experts and top-8, nearly every token takes
  // most of them, so they get close to half of all slots.
  const uint64_t key = hash_key(seed, Stream::kHotExperts);
  for (int i = 0; i < count; ++i) {
    int e = nth_free(static_cast<int>(uniform_below(hash_next(key, i), static_cast<uint64_t>(num_experts - i))),
                     hot.sorted.data(), i);
    if (i == 0) hot.first = e;
    int n = i;
    insert_sorted(e, hot.sorted.data(), n);
  }
  hot.count = count;
  hot.weight = std::max<int64_t>(1, 3 * (static_cast<int64_t>(num_experts) - count) / count);
  return hot;
}

// k distinct experts for one token by sequential weighted draws without replacement, in integers
// (no floating point, so every machine agrees). `hot` empty: uniform.
void draw_experts(uint64_t key, int num_experts, int k, const HotExperts& hot, int32_t* out) {
  std::array<int, kMaxTopk> taken_hot{}, taken_cold{};  // pool indices
  int num_hot = 0, num_cold = 0;
  const int cold_pool = num_experts - hot.count;
  for (int j = 0; j < k; ++j) {
    const uint64_t hot_mass = static_cast<uint64_t>(hot.count - num_hot) * static_cast<uint64_t>(hot.weight);
    const uint64_t total = hot_mass + static_cast<uint64_t>(cold_pool - num_cold);
    const uint64_t r = uniform_below(hash_next(key, j), total);
    if (r < hot_mass) {
      const int i = nth_free(static_cast<int>(r / static_cast<uint64_t>(hot.weight)), taken_hot.data(), num_hot);
      insert_sorted(i, taken_hot.data(), num_hot);
      out[j] = hot.sorted[i];
    } else {
      const int i = nth_free(static_cast<int>(r - hot_mass), taken_cold.data(), num_cold);
      insert_sorted(i, taken_cold.data(), num_cold);
      out[j] = nth_free(i, hot.sorted.data(), hot.count);  // the i-th expert that is not hot
    }
  }
}

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ErrorCode::kInvalidArgument, message);
}

}  // namespace

std::string_view to_string(Routing routing) {
  for (const auto& [r, name] : kRoutingNames)
    if (r == routing) return name;
  return "unknown";
}

std::optional<Routing> parse_routing(std::string_view name) {
  for (const auto& [r, n] : kRoutingNames)
    if (n == name) return r;
  return std::nullopt;
}

HostTokens make_tokens(const LayerConfig& cfg, int world_size, int rank, int num_tokens, Routing routing,
                       uint64_t seed) {
  validate_config(cfg, world_size);
  require(rank >= 0 && rank < world_size,
          "make_tokens: rank=" + std::to_string(rank) + " outside [0, world_size=" + std::to_string(world_size) + ")");
  require(num_tokens >= 0, "make_tokens: num_tokens=" + std::to_string(num_tokens) + " is negative");
  const int H = cfg.hidden, k = cfg.topk, E = cfg.num_experts;

  HostTokens in;
  in.num_tokens = num_tokens;
  in.x.resize(static_cast<size_t>(num_tokens) * H);
  in.topk_idx.resize(static_cast<size_t>(num_tokens) * k);
  in.topk_weights.resize(static_cast<size_t>(num_tokens) * k);

  const HotExperts hot = hot_experts(seed, E);
  const HotExperts none{};

  for (int t = 0; t < num_tokens; ++t) {
    const uint64_t x_key = detail::token_row_key(seed, rank, t);
    bf16* x = &in.x[static_cast<size_t>(t) * H];
    for (int h = 0; h < H; ++h) x[h] = __ushort_as_bfloat16(detail::token_bf16_bits(x_key, h));

    int32_t* idx = &in.topk_idx[static_cast<size_t>(t) * k];
    const uint64_t route_key = token_key(seed, Stream::kRouting, rank, t);
    switch (routing) {
      case Routing::kOneExpert:
        idx[0] = hot.first;
        std::fill(idx + 1, idx + k, -1);
        break;
      case Routing::kSkewed:
        draw_experts(route_key, E, k, hot, idx);
        break;
      case Routing::kUniform:
      case Routing::kDropped:
        draw_experts(route_key, E, k, none, idx);
        break;
      case Routing::kOneRank: {
        const int L = E / world_size;
        const int home = static_cast<int>(uniform_below(hash_next(route_key, kMaxTopk), static_cast<uint64_t>(world_size)));
        const int on_home = std::min(k, L);
        draw_experts(route_key, L, on_home, none, idx);
        for (int j = 0; j < on_home; ++j) idx[j] += home * L;
        // The other slots among the E - L experts of the other ranks, skipping `home`'s range.
        draw_experts(hash_next(route_key, kMaxTopk + 1), E - L, k - on_home, none, idx + on_home);
        for (int j = on_home; j < k; ++j)
          if (idx[j] >= home * L) idx[j] += L;
        break;
      }
    }
    if (routing == Routing::kDropped) {
      // 1 token in 16 loses every slot; the others lose each slot with probability 1/5: ~1/4 overall.
      const uint64_t drop_key = token_key(seed, Stream::kDrop, rank, t);
      const bool whole_token = uniform_below(drop_key, 16) == 0;
      for (int j = 0; j < k; ++j)
        if (whole_token || uniform_below(hash_next(drop_key, j), 5) == 0) idx[j] = -1;
    }

    // Raw weights in [0.25, 1.25), normalised over the kept slots. Dropped slots keep their raw,
    // non-zero value, so a consumer that forgets to skip them gets a visibly wrong answer.
    float* w = &in.topk_weights[static_cast<size_t>(t) * k];
    const uint64_t weight_key = token_key(seed, Stream::kTopkWeight, rank, t);
    std::array<double, kMaxTopk> raw{};
    double kept = 0.0;
    for (int j = 0; j < k; ++j) {
      raw[j] = 0.25 + detail::uniform01(hash_next(weight_key, j));
      if (idx[j] >= 0) kept += raw[j];
    }
    for (int j = 0; j < k; ++j) w[j] = static_cast<float>(idx[j] >= 0 ? raw[j] / kept : raw[j]);
  }
  return in;
}

std::vector<int> make_token_counts(int world_size, int max_tokens, uint64_t seed) {
  require(world_size >= 1, "make_token_counts: world_size=" + std::to_string(world_size) + " must be at least 1");
  require(max_tokens >= 0, "make_token_counts: max_tokens=" + std::to_string(max_tokens) + " is negative");
  std::vector<int> counts(world_size);
  const uint64_t key = hash_key(seed, Stream::kCounts);
  for (int r = 0; r < world_size; ++r) {
    // The edges are what break kernels: 1 rank in 8 gets 0 tokens, 1 in 8 the maximum.
    const uint64_t h = hash_next(key, static_cast<uint64_t>(r));
    switch (uniform_below(h, 8)) {
      case 0:
        counts[r] = 0;
        break;
      case 1:
        counts[r] = max_tokens;
        break;
      default:
        counts[r] = static_cast<int>(uniform_below(hash_next(h, 1), static_cast<uint64_t>(max_tokens) + 1));
    }
  }
  return counts;
}

bf16 weight_w13(const LayerConfig& cfg, uint64_t seed, int expert, int row, int col) {
  return __ushort_as_bfloat16(detail::weight_bf16_bits(detail::weight_row_key(seed, Stream::kW13, expert, row),
                                                         detail::weight_block_key(seed, Stream::kW13, expert, row), col,
                                                         detail::weight_scale(cfg.hidden)));
}

bf16 weight_w2(const LayerConfig& cfg, uint64_t seed, int expert, int row, int col) {
  return __ushort_as_bfloat16(detail::weight_bf16_bits(detail::weight_row_key(seed, Stream::kW2, expert, row),
                                                         detail::weight_block_key(seed, Stream::kW2, expert, row), col,
                                                         detail::weight_scale(cfg.intermediate)));
}

}  // namespace epfuse
