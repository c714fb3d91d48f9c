// The one LayerConfig field list (src/common/config_fields.h) against the C ABI's struct and the
// conversion generated from it (src/capi/config_c.h). config_c.h already static_asserts the layout;
// these tests name the field when it is wrong and check the values both ways.
#include <cstring>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "capi/config_c.h"
#include "common/config_fields.h"
#include "epfuse/c_api.h"
#include "epfuse/config.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

using detail::config_from_c;
using detail::config_to_c;
using detail::kCFieldPlaces;
using detail::kLayerConfigFieldCount;
using detail::kLayerConfigFieldNames;

TEST(ConfigFields, TheListNamesEachFieldOnce) {
  std::set<std::string> names;
  for (const char* name : kLayerConfigFieldNames) EXPECT_TRUE(names.insert(name).second) << name;
  EXPECT_EQ(static_cast<int>(names.size()), kLayerConfigFieldCount);
  EXPECT_EQ(detail::aggregate_member_count<LayerConfig>(), kLayerConfigFieldCount);
  EXPECT_EQ(detail::aggregate_member_count<epfuse_layer_config>(), kLayerConfigFieldCount);
}

TEST(ConfigFields, CStructIsTheListInOrderWithoutGaps) {
  size_t offset = 0;
  for (const detail::CFieldPlace& f : kCFieldPlaces) {
    offset = (offset + f.align - 1) / f.align * f.align;
    EXPECT_EQ(f.offset, offset) << "epfuse_layer_config." << f.name;
    offset += f.size;
  }
  EXPECT_EQ(sizeof(epfuse_layer_config), offset);
  // The ABI as shipped: nine 4-byte fields.
  EXPECT_EQ(sizeof(epfuse_layer_config), 36u);
}

// A config whose every field differs from its default and from every other field's value, so a field
// converted into another's place shows.
LayerConfig distinct_config() {
  LayerConfig cfg;
  cfg.hidden = 7168;
  cfg.intermediate = 2048;
  cfg.num_experts = 256;
  cfg.topk = 8;
  cfg.max_tokens_per_rank = 4096;
  cfg.swiglu_clamp = 7.5f;
  cfg.num_sms = 66;
  cfg.weight_format = WeightFormat::kFp8Block128;
  cfg.scale_format = ScaleFormat::kUe8m0;
  return cfg;
}

TEST(ConfigFields, ToCAndBackKeepsEveryField) {
  const LayerConfig cfg = distinct_config();
  const epfuse_layer_config c = config_to_c(cfg);
  EXPECT_EQ(c.hidden, 7168);
  EXPECT_EQ(c.intermediate, 2048);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.topk, 8);
  EXPECT_EQ(c.max_tokens_per_rank, 4096);
  EXPECT_EQ(c.swiglu_clamp, 7.5f);
  EXPECT_EQ(c.num_sms, 66);
  EXPECT_EQ(c.weight_format, EPFUSE_WEIGHTS_FP8_BLOCK128);
  EXPECT_EQ(c.scale_format, EPFUSE_SCALES_UE8M0);

  const LayerConfig back = config_from_c(c);
#define EXPECT_SAME_FIELD(name, c_type, doc) EXPECT_TRUE(back.name == cfg.name) << #name;
  EPFUSE_LAYER_CONFIG_FIELDS(EXPECT_SAME_FIELD)
#undef EXPECT_SAME_FIELD
}

TEST(ConfigFields, DefaultsAndBf16RoundTrip) {
  const LayerConfig cfg;
  const epfuse_layer_config c = config_to_c(cfg);
  epfuse_layer_config zero;
  std::memset(&zero, 0, sizeof(zero));
  EXPECT_EQ(std::memcmp(&c, &zero, sizeof(c)), 0) << "a default LayerConfig is the all-zero C struct";
  const LayerConfig back = config_from_c(zero);
#define EXPECT_SAME_FIELD(name, c_type, doc) EXPECT_TRUE(back.name == cfg.name) << #name;
  EPFUSE_LAYER_CONFIG_FIELDS(EXPECT_SAME_FIELD)
#undef EXPECT_SAME_FIELD
}

std::string from_c_error(const epfuse_layer_config& c) {
  try {
    config_from_c(c);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
    return e.what();
  }
  return "";
}

TEST(ConfigFields, FormatsCCannotNameAreNamedErrors) {
  epfuse_layer_config c = config_to_c(distinct_config());
  c.weight_format = 7;
  c.scale_format = 9;  // the weight format is checked first
  EXPECT_EQ(from_c_error(c),
            "epfuse_layer_config.weight_format = 7: expected EPFUSE_WEIGHTS_BF16 (0) or EPFUSE_WEIGHTS_FP8_BLOCK128 (1)");
  c.weight_format = EPFUSE_WEIGHTS_BF16;
  EXPECT_EQ(from_c_error(c), "epfuse_layer_config.scale_format = 9: expected EPFUSE_SCALES_FP32 (0) or EPFUSE_SCALES_UE8M0 (1)");
}

}  // namespace
}  // namespace epfuse
