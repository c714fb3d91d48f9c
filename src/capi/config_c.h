// Internal: epfuse_layer_config (epfuse/c_api.h) <-> epfuse::LayerConfig (epfuse/config.h), both
// directions generated from the one field list (common/config_fields.h), and compile-time proof that
// the two structs have exactly the list's fields (the C struct also its types, order and offsets: the
// ABI's layout).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/check.h"
#include "common/config_fields.h"
#include "epfuse/c_api.h"
#include "epfuse/config.h"
#include "epfuse/error.h"

namespace epfuse::detail {

// --- one field, by its C++ type: from C (checking what C can get wrong) and back ---

inline void field_from_c(int32_t c, int& out, const char* /*field*/) { out = c; }
inline void field_from_c(float c, float& out, const char* /*field*/) { out = c; }
inline void field_from_c(int32_t c, WeightFormat& out, const char* field) {
  EPFUSE_REQUIRE(c == EPFUSE_WEIGHTS_BF16 || c == EPFUSE_WEIGHTS_FP8_BLOCK128, ErrorCode::kInvalidConfig,
                 std::string(field) + " = " + std::to_string(c) +
                     ": expected EPFUSE_WEIGHTS_BF16 (0) or EPFUSE_WEIGHTS_FP8_BLOCK128 (1)");
  out = c == EPFUSE_WEIGHTS_BF16 ? WeightFormat::kBf16 : WeightFormat::kFp8Block128;
}
inline void field_from_c(int32_t c, ScaleFormat& out, const char* field) {
  EPFUSE_REQUIRE(c == EPFUSE_SCALES_FP32 || c == EPFUSE_SCALES_UE8M0, ErrorCode::kInvalidConfig,
                 std::string(field) + " = " + std::to_string(c) +
                     ": expected EPFUSE_SCALES_FP32 (0) or EPFUSE_SCALES_UE8M0 (1)");
  out = c == EPFUSE_SCALES_FP32 ? ScaleFormat::kFp32 : ScaleFormat::kUe8m0;
}

inline int32_t field_to_c(int v) { return v; }
inline float field_to_c(float v) { return v; }
inline int32_t field_to_c(WeightFormat v) {
  return v == WeightFormat::kBf16 ? EPFUSE_WEIGHTS_BF16 : EPFUSE_WEIGHTS_FP8_BLOCK128;
}
inline int32_t field_to_c(ScaleFormat v) { return v == ScaleFormat::kFp32 ? EPFUSE_SCALES_FP32 : EPFUSE_SCALES_UE8M0; }

// --- the whole struct ---

// Fields in the list's order; a format value C cannot name is an Error(kInvalidConfig)
// "epfuse_layer_config.<field> = <value>: expected ...".
inline LayerConfig config_from_c(const epfuse_layer_config& c) {
  LayerConfig cfg;
#define EPFUSE_CONFIG_FROM_C(name, c_type, doc) field_from_c(c.name, cfg.name, "epfuse_layer_config." #name);
  EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_CONFIG_FROM_C)
#undef EPFUSE_CONFIG_FROM_C
  return cfg;
}

inline epfuse_layer_config config_to_c(const LayerConfig& cfg) {
  epfuse_layer_config c{};
#define EPFUSE_CONFIG_TO_C(name, c_type, doc) c.name = field_to_c(cfg.name);
  EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_CONFIG_TO_C)
#undef EPFUSE_CONFIG_TO_C
  return c;
}

// --- the structs against the list ---

// How many members an aggregate has: the most initialisers T{...} accepts.
struct AnyMember {
  template <class T>
  constexpr operator T() const noexcept;  // never called: only in unevaluated braced initialisers
};
template <class T, class... Inits>
constexpr int aggregate_member_count() {
  if constexpr (requires { T{Inits{}..., AnyMember{}}; }) {
    return aggregate_member_count<T, Inits..., AnyMember>();
  } else {
    return static_cast<int>(sizeof...(Inits));
  }
}

// One C field's place: where the list puts it and where the C struct has it.
struct CFieldPlace {
  const char* name;
  size_t offset;  // offsetof(epfuse_layer_config, name)
  size_t size;    // sizeof(c_type)
  size_t align;   // alignof(c_type)
};
#define EPFUSE_CONFIG_C_PLACE(name, c_type, doc) \
  CFieldPlace{#name, offsetof(epfuse_layer_config, name), sizeof(c_type), alignof(c_type)},
inline constexpr CFieldPlace kCFieldPlaces[] = {EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_CONFIG_C_PLACE)};
#undef EPFUSE_CONFIG_C_PLACE

// The index of the first list field that is not where a struct of exactly the list's fields, in its
// order, would put it; kLayerConfigFieldCount when the whole struct is laid out so (its size
// included: no member after the list's last).
constexpr int first_misplaced_c_field() {
  size_t offset = 0, align = 1;
  for (int i = 0; i < kLayerConfigFieldCount; ++i) {
    const CFieldPlace& f = kCFieldPlaces[i];
    offset = (offset + f.align - 1) / f.align * f.align;
    if (f.offset != offset) return i;
    offset += f.size;
    align = f.align > align ? f.align : align;
  }
  return sizeof(epfuse_layer_config) == (offset + align - 1) / align * align ? kLayerConfigFieldCount : -1;
}

// Each C field has the list's type, and converting a C++ field gives that type.
#define EPFUSE_CONFIG_CHECK_TYPES(name, c_type, doc)                                                     \
  static_assert(std::is_same_v<decltype(epfuse_layer_config::name), c_type>,                            \
                "epfuse_layer_config." #name " is not of the type common/config_fields.h lists");        \
  static_assert(std::is_same_v<decltype(field_to_c(std::declval<const LayerConfig&>().name)), c_type>, \
                "LayerConfig::" #name " does not convert to the C type common/config_fields.h lists");
EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_CONFIG_CHECK_TYPES)
#undef EPFUSE_CONFIG_CHECK_TYPES

static_assert(aggregate_member_count<epfuse_layer_config>() == kLayerConfigFieldCount,
              "epfuse_layer_config (c_api.h) and common/config_fields.h list different numbers of fields");
static_assert(aggregate_member_count<LayerConfig>() == kLayerConfigFieldCount,
              "LayerConfig (config.h) has a field common/config_fields.h does not list (or lists one it lacks)");
static_assert(first_misplaced_c_field() == kLayerConfigFieldCount,
              "epfuse_layer_config's fields are not the list's, in its order, without gaps (the C ABI's layout)");

}  // namespace epfuse::detail
