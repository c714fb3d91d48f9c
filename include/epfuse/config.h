// epfuse/config.h: the shape of one MoE layer and its validation.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace epfuse {

// The GPU kernels tile the hidden and intermediate dimensions in blocks of this many elements.
inline constexpr int kDimAlign = 128;
// Largest top-k the kernels carry per token (metadata is sized by it).
inline constexpr int kMaxTopk = 16;

struct LayerConfig {
  int hidden = 0;               // H: model dimension
  int intermediate = 0;         // I: expert FFN dimension (W1 and W3 each produce I outputs)
  int num_experts = 0;          // E: experts over all ranks; rank r owns [r*E/R, (r+1)*E/R)
  int topk = 0;                 // k: experts per token
  int max_tokens_per_rank = 0;  // buffers are sized for this many tokens on every rank
  float swiglu_clamp = 0.0f;    // > 0: gate clamped to <= c, up clamped to [-c, c] (seed 000)

  int experts_per_rank(int world_size) const { return num_experts / world_size; }
};

// "" when cfg can run on world_size ranks; otherwise one line naming the field, its value and why.
std::string check_config(const LayerConfig& cfg, int world_size);
// Throws Error(kInvalidConfig) with check_config's message.
void validate_config(const LayerConfig& cfg, int world_size);

// The model shapes of FACTS.md (hidden, intermediate, experts, top-k).
struct ModelShape {
  std::string_view name;
  int hidden, intermediate, num_experts, topk;
};
std::span<const ModelShape> model_shapes();
std::optional<ModelShape> find_model(std::string_view name);
LayerConfig make_config(const ModelShape& shape, int max_tokens_per_rank, float swiglu_clamp = 0.0f);

}  // namespace epfuse
