// epfuse/config.h: the shape of one MoE layer and its validation.
#pragma once
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace epfuse {

// Hidden and intermediate sizes are multiples of this many elements. The GPU kernels tile both by 128
// (the fused FP8 kernel H by 256); a layer of another multiple of 64 (e.g. 2880) runs zero-padded to
// those sizes: see "Sizes" below.
inline constexpr int kDimAlign = 64;
// Largest top-k the kernels carry per token (metadata is sized by it).
inline constexpr int kMaxTopk = 16;

// How the expert weights are stored.
//   kBf16: bf16 w13 [E_local, 2I, H] and w2 [E_local, H, I], as today.
//   kFp8Block128: float8 e4m3 (the "fn" variant: no infinities, max 448) with one scale per 128x128
//     block (DeepSeek-V3's weight_scale_inv layout: the real weight is code * scale). H and I are
//     multiples of 64; when one is not a multiple of 128 (e.g. 2880) its last block is 64 wide and its
//     scale covers only those 64 rows/columns, so each dimension n has ceil(n/128) scales:
//       w13 scales [E_local, 2 * ceil(I/128), ceil(H/128)]: the gate rows [0, I) and the up rows
//         [I, 2I) are blocked separately, each with its own partial last block, so no block mixes gate
//         and up rows (a kernel tile pairs gate and up rows for SwiGLU, and checkpoints that store
//         gate_proj and up_proj apart carry ceil(I/128) scale rows each). When I % 128 == 0 this is
//         ceil(2I/128) = 2I/128, the layout of concatenated DeepSeek-V3 weights.
//       w2 scales  [E_local, ceil(H/128), ceil(I/128)].
//     Activations (x at dispatch, h before Linear2) are quantised per token per 128 channels (1x128),
//     with the same partial last group: scales [T, ceil(n/128)]. src/common/fp8.h has the arithmetic
//     and the index functions.
//     Both layers run this format at every size (unfused: cuBLASLt block-scaled FP8 GEMMs,
//     src/unfused/fp8_gemm.h; fused: the FP8 kernel and its decode kernel, docs/fused_design.md "FP8"), the sizes below.
//
// Sizes. H and I are multiples of kDimAlign (64). The kernels tile both by 128 and the fused FP8 kernel
// H by 256; a layer of other sizes (e.g. H = I = 2880) runs zero-padded (src/padding/padding.h): at
// creation it reads the caller's weights once (synchronously: they must be written by then), checks
// them in the caller's layout and keeps zero-padded copies (unfused 2944 x 2944; fused 3072 x 2944, H to
// the 128 x 256 tiles: 5-9% more than the caller's weights at 2880, held besides them); the FP8 scales keep their
// blocks (a partial block pads with zero weights under its own scale; new blocks get scale 1). Each
// forward copies x into padded rows and crops the padded y (two copy kernels on the stream; their rows
// live in the workspace, shared by its layers). Padded layers give the same results as the reference at
// the caller's sizes: the padding adds zeros.
enum class WeightFormat { kBf16, kFp8Block128 };
// How an FP8 scale is represented: kFp32 (amax / 448) or kUe8m0 (amax / 448 rounded up to a power
// of two, an 8-bit exponent, as newer checkpoints use). Only meaningful with FP8 weights.
enum class ScaleFormat { kFp32, kUe8m0 };
std::string_view to_string(WeightFormat format);  // "bf16", "fp8-block128"
std::string_view to_string(ScaleFormat format);   // "fp32", "ue8m0"
std::optional<WeightFormat> parse_weight_format(std::string_view name);
std::optional<ScaleFormat> parse_scale_format(std::string_view name);

struct LayerConfig {
  int hidden = 0;               // H: model dimension
  int intermediate = 0;         // I: expert FFN dimension (W1 and W3 each produce I outputs)
  int num_experts = 0;          // E: experts over all ranks; rank r owns [r*E/R, (r+1)*E/R)
  int topk = 0;                 // k: experts per token
  int max_tokens_per_rank = 0;  // buffers are sized for this many tokens on every rank
  float swiglu_clamp = 0.0f;    // > 0: gate clamped to <= c, up clamped to [-c, c]
  // SM budget: how many CTAs the fused persistent kernel may use on each rank, so that other kernels
  // can run beside the layer. 0: every SM (NCCL), or SMs / ranks in the one-GPU (loopback) mode,
  // where all ranks' kernels share one GPU and must be resident at once. A budget that cannot be
  // resident (budget * ranks on the GPU > SMs * CTAs per SM) is an Error(kUnsupported) at creation.
  // Ignored by the unfused chain.
  int num_sms = 0;
  WeightFormat weight_format = WeightFormat::kBf16;
  ScaleFormat scale_format = ScaleFormat::kFp32;  // kUe8m0 only with kFp8Block128

  int experts_per_rank(int world_size) const { return num_experts / world_size; }
};

// "" when cfg can run on world_size ranks; otherwise one line "field=value: why" for the first problem.
//
// Besides the range of each field, the kernels index with 32-bit integers, so check_config rejects a
// config where any of these element counts reaches 2^31 (kMaxElements):
//   - rows one rank may have to hold for its experts, times the widest row:
//       world_size * max_tokens_per_rank * min(topk, E/R) * max(hidden, 2 * intermediate)
//     (every token of every rank may send all of its slots to one rank's experts; a row is H wide
//     as input and 2I wide after Linear1; this bound also covers the home rank's combine buffer,
//     max_tokens_per_rank * topk * hidden);
//   - one expert's weights: 2 * intermediate * hidden (the base of each expert is a 64-bit offset,
//     so the E/R experts of a rank together may exceed 2^31 elements).
std::string check_config(const LayerConfig& cfg, int world_size);
inline constexpr long long kMaxElements = 1LL << 31;
// Throws Error(kInvalidConfig) with check_config's message.
void validate_config(const LayerConfig& cfg, int world_size);

// Named model shapes (hidden, intermediate, experts, top-k): dsv3 (DeepSeek-V3), qwen3-30b
// (Qwen3-30B-A3B), mixtral (Mixtral 8x7B).
struct ModelShape {
  std::string_view name;
  int hidden, intermediate, num_experts, topk;
};
std::span<const ModelShape> model_shapes();
std::optional<ModelShape> find_model(std::string_view name);
LayerConfig make_config(const ModelShape& shape, int max_tokens_per_rank, float swiglu_clamp = 0.0f);

}  // namespace epfuse
