// Internal: the one list of epfuse::LayerConfig's fields (epfuse/config.h), in the order of the C
// ABI's epfuse_layer_config (epfuse/c_api.h). Everything else that copies the fields follows it:
//   - src/capi/config_c.h generates the C <-> C++ conversion from it and static_asserts that both
//     structs have exactly these fields (the C struct: these names, types and offsets);
//   - tests/python/test_config_fields.py parses this file and checks c_api.h's struct and
//     python/epfuse/_lib.py's LayerConfig._fields_ against it (names, order, types);
//   - tests/cpu/tools/test_config_flags.cpp checks that `epfuse run` has a flag for every field
//     (tools/cli/run_options.h: kConfigFieldFlags) or lists it as deliberately without one.
// A new LayerConfig field is added here first; the checks above then say what else must follow.
//
// X(name, c_type, doc): `name` is the member in both structs, `c_type` its type in the C struct
// (int32_t or float: the ABI's layout), `doc` one line. Keep one entry per line, in this form: the
// Python test reads the list with a regular expression.
#pragma once

#define EPFUSE_LAYER_CONFIG_FIELDS(X)                                                                 \
  X(hidden, int32_t, "H: model dimension")                                                            \
  X(intermediate, int32_t, "I: expert FFN dimension (W1 and W3 each produce I outputs)")              \
  X(num_experts, int32_t, "E: experts over all ranks; rank r owns [r*E/R, (r+1)*E/R)")                \
  X(topk, int32_t, "k: experts per token")                                                            \
  X(max_tokens_per_rank, int32_t, "buffers are sized for this many tokens on every rank")             \
  X(swiglu_clamp, float, "> 0: gate clamped to <= c, up clamped to [-c, c]")                          \
  X(num_sms, int32_t, "SM budget of the fused kernel per rank; 0: the default")                       \
  X(weight_format, int32_t, "expert weights: EPFUSE_WEIGHTS_* (epfuse::WeightFormat)")                \
  X(scale_format, int32_t, "FP8 block scales: EPFUSE_SCALES_* (epfuse::ScaleFormat); FP8 weights only")

namespace epfuse::detail {

// How many fields the list has.
#define EPFUSE_LAYER_CONFIG_COUNT_FIELD(name, c_type, doc) +1
inline constexpr int kLayerConfigFieldCount = 0 EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_LAYER_CONFIG_COUNT_FIELD);
#undef EPFUSE_LAYER_CONFIG_COUNT_FIELD

// The fields' names, in the list's order.
#define EPFUSE_LAYER_CONFIG_FIELD_NAME(name, c_type, doc) #name,
inline constexpr const char* kLayerConfigFieldNames[] = {EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_LAYER_CONFIG_FIELD_NAME)};
#undef EPFUSE_LAYER_CONFIG_FIELD_NAME

}  // namespace epfuse::detail
