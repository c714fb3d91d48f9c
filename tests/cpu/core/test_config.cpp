// check_config / validate_config: every rejection names its field; the named model shapes.
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "epfuse/config.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

LayerConfig small_config() {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = 128;
  cfg.num_experts = 8;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = 64;
  return cfg;
}

// check_config rejects cfg, and validate_config throws kInvalidConfig with the same message, which
// starts with "field=value: ".
void expect_rejected(const LayerConfig& cfg, int world, const std::string& field_eq_value) {
  const std::string message = check_config(cfg, world);
  EXPECT_EQ(message.rfind(field_eq_value + ": ", 0), 0u) << "message: " << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  try {
    validate_config(cfg, world);
    ADD_FAILURE() << "validate_config accepted " << field_eq_value;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidConfig);
    EXPECT_EQ(std::string(e.what()), message);
  }
}

TEST(Config, SmallConfigIsValid) {
  EXPECT_EQ(check_config(small_config(), 2), "");
  EXPECT_NO_THROW(validate_config(small_config(), 2));
}

TEST(Config, ModelShapesAreValidOnOneToEightRanks) {
  for (const ModelShape& shape : model_shapes())
    for (int world : {1, 2, 4, 8})
      EXPECT_EQ(check_config(make_config(shape, 4096), world), "") << shape.name << " world " << world;
}

TEST(Config, RejectsHidden) {
  for (int h : {0, -128, 100, 129}) {
    LayerConfig cfg = small_config();
    cfg.hidden = h;
    expect_rejected(cfg, 2, "hidden=" + std::to_string(h));
  }
  LayerConfig cfg = small_config();
  cfg.hidden = 100;
  EXPECT_NE(check_config(cfg, 2).find("128"), std::string::npos);  // says why
}

TEST(Config, RejectsIntermediate) {
  for (int i : {0, -256, 32, 200}) {
    LayerConfig cfg = small_config();
    cfg.intermediate = i;
    expect_rejected(cfg, 2, "intermediate=" + std::to_string(i));
  }
}

TEST(Config, RejectsNumExperts) {
  LayerConfig cfg = small_config();
  cfg.num_experts = 0;
  expect_rejected(cfg, 1, "num_experts=0");
  cfg.num_experts = -4;
  expect_rejected(cfg, 1, "num_experts=-4");
}

TEST(Config, RejectsWorldSize) {
  expect_rejected(small_config(), 0, "world_size=0");
  expect_rejected(small_config(), -2, "world_size=-2");
}

TEST(Config, RejectsExpertsNotDivisibleByWorld) {
  LayerConfig cfg = small_config();
  cfg.num_experts = 10;
  expect_rejected(cfg, 4, "num_experts=10");
  EXPECT_NE(check_config(cfg, 4).find("world_size=4"), std::string::npos);
}

TEST(Config, RejectsTopk) {
  LayerConfig cfg = small_config();
  cfg.topk = 0;
  expect_rejected(cfg, 2, "topk=0");
  cfg.topk = -1;
  expect_rejected(cfg, 2, "topk=-1");
  cfg.topk = 9;  // more than the 8 experts
  expect_rejected(cfg, 2, "topk=9");
  EXPECT_NE(check_config(cfg, 2).find("num_experts=8"), std::string::npos);
  cfg.num_experts = 64;
  cfg.topk = kMaxTopk + 1;
  expect_rejected(cfg, 2, "topk=" + std::to_string(kMaxTopk + 1));
  EXPECT_NE(check_config(cfg, 2).find("kMaxTopk"), std::string::npos);
  cfg.topk = kMaxTopk;
  EXPECT_EQ(check_config(cfg, 2), "");
}

TEST(Config, RejectsMaxTokens) {
  LayerConfig cfg = small_config();
  cfg.max_tokens_per_rank = 0;
  expect_rejected(cfg, 2, "max_tokens_per_rank=0");
  cfg.max_tokens_per_rank = -5;
  expect_rejected(cfg, 2, "max_tokens_per_rank=-5");
  cfg.max_tokens_per_rank = (1 << 20) + 1;
  expect_rejected(cfg, 2, "max_tokens_per_rank=1048577");
  cfg.max_tokens_per_rank = 1 << 20;
  EXPECT_EQ(check_config(cfg, 2), "");
}

TEST(Config, RejectsSwigluClamp) {
  LayerConfig cfg = small_config();
  cfg.swiglu_clamp = -1.0f;
  expect_rejected(cfg, 2, "swiglu_clamp=-1");
  cfg.swiglu_clamp = std::numeric_limits<float>::quiet_NaN();
  expect_rejected(cfg, 2, "swiglu_clamp=nan");
  cfg.swiglu_clamp = std::numeric_limits<float>::infinity();
  expect_rejected(cfg, 2, "swiglu_clamp=inf");
  cfg.swiglu_clamp = 7.0f;
  EXPECT_EQ(check_config(cfg, 2), "");
}

TEST(Config, RejectsNegativeSmBudget) {
  LayerConfig cfg = small_config();
  cfg.num_sms = -1;
  expect_rejected(cfg, 2, "num_sms=-1");
  cfg.num_sms = 0;  // every SM
  EXPECT_EQ(check_config(cfg, 2), "");
  cfg.num_sms = 17;  // residency depends on the GPU: checked when the layer is created
  EXPECT_EQ(check_config(cfg, 2), "");
}

// world * max_tokens * min(topk, E/R) * max(H, 2I) must stay below 2^31.
TEST(Config, WeightAndScaleFormats) {
  EXPECT_EQ(small_config().weight_format, WeightFormat::kBf16);  // defaults: today's layer
  EXPECT_EQ(small_config().scale_format, ScaleFormat::kFp32);
  for (WeightFormat w : {WeightFormat::kBf16, WeightFormat::kFp8Block128})
    EXPECT_EQ(parse_weight_format(to_string(w)), w);
  for (ScaleFormat f : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) EXPECT_EQ(parse_scale_format(to_string(f)), f);
  EXPECT_EQ(to_string(WeightFormat::kFp8Block128), "fp8-block128");
  EXPECT_EQ(to_string(ScaleFormat::kUe8m0), "ue8m0");
  EXPECT_EQ(parse_weight_format("fp8"), std::nullopt);
  EXPECT_EQ(parse_scale_format("FP32"), std::nullopt);

  LayerConfig cfg = small_config();
  cfg.weight_format = WeightFormat::kFp8Block128;
  EXPECT_EQ(check_config(cfg, 2), "");
  cfg.scale_format = ScaleFormat::kUe8m0;
  EXPECT_EQ(check_config(cfg, 2), "");
  cfg.weight_format = WeightFormat::kBf16;  // UE8M0 scales without FP8 weights: nothing to scale
  expect_rejected(cfg, 2, "scale_format=ue8m0");
  cfg.scale_format = static_cast<ScaleFormat>(7);
  expect_rejected(cfg, 2, "scale_format=7");
  cfg = small_config();
  cfg.weight_format = static_cast<WeightFormat>(-1);
  expect_rejected(cfg, 2, "weight_format=-1");
}

TEST(Config, RejectsRankRowsBeyondInt32AtTheExactBound) {
  LayerConfig cfg;
  cfg.hidden = 16384;  // widest row: 2^14
  cfg.intermediate = 128;
  cfg.num_experts = 1;
  cfg.topk = 1;
  cfg.max_tokens_per_rank = (1 << 17) - 1;
  EXPECT_EQ(check_config(cfg, 1), "");
  cfg.max_tokens_per_rank = 1 << 17;  // 2^17 * 2^14 = 2^31
  expect_rejected(cfg, 1, "max_tokens_per_rank=131072");
  EXPECT_NE(check_config(cfg, 1).find("2147483648"), std::string::npos) << check_config(cfg, 1);
}

TEST(Config, RankRowsCountMinOfTopkAndLocalExperts) {
  LayerConfig cfg;
  cfg.hidden = 16384;  // widest row: 2^14
  cfg.intermediate = 128;
  // E/R = 1: a token sends at most one row to a rank however large topk is: rows = 8 * T.
  cfg.num_experts = 8;
  cfg.topk = 8;
  cfg.max_tokens_per_rank = (1 << 14) - 1;
  EXPECT_EQ(check_config(cfg, 8), "");  // 8 * (2^14 - 1) * 1 * 2^14 < 2^31 (world * T * topk would not be)
  cfg.max_tokens_per_rank = 1 << 14;
  expect_rejected(cfg, 8, "max_tokens_per_rank=16384");
  // topk < E/R: rows = T * topk on one rank.
  cfg.num_experts = 64;
  cfg.topk = 2;
  cfg.max_tokens_per_rank = (1 << 16) - 1;
  EXPECT_EQ(check_config(cfg, 1), "");
  cfg.max_tokens_per_rank = 1 << 16;
  expect_rejected(cfg, 1, "max_tokens_per_rank=65536");
}

TEST(Config, RejectsDsv3WithAMillionTokensOnEightRanks) {
  expect_rejected(make_config(*find_model("dsv3"), 1 << 20), 8, "max_tokens_per_rank=1048576");
}

TEST(Config, RejectsAnExpertBeyondInt32) {
  LayerConfig cfg = small_config();
  cfg.hidden = 32768;
  cfg.intermediate = 32768;  // 2 * 2^15 * 2^15 = 2^31
  cfg.max_tokens_per_rank = 1;
  cfg.topk = 1;
  expect_rejected(cfg, 1, "intermediate=32768");
  cfg.intermediate = 32768 - 128;
  EXPECT_EQ(check_config(cfg, 1), "");
}

TEST(Models, ShapesOfFacts) {
  ASSERT_EQ(model_shapes().size(), 3u);
  const auto dsv3 = find_model("dsv3");
  ASSERT_TRUE(dsv3);
  EXPECT_EQ(dsv3->hidden, 7168);
  EXPECT_EQ(dsv3->intermediate, 2048);
  EXPECT_EQ(dsv3->num_experts, 256);
  EXPECT_EQ(dsv3->topk, 8);
  const auto qwen = find_model("qwen3-30b");
  ASSERT_TRUE(qwen);
  EXPECT_EQ(qwen->hidden, 2048);
  EXPECT_EQ(qwen->intermediate, 768);
  EXPECT_EQ(qwen->num_experts, 128);
  EXPECT_EQ(qwen->topk, 8);
  const auto mixtral = find_model("mixtral");
  ASSERT_TRUE(mixtral);
  EXPECT_EQ(mixtral->hidden, 4096);
  EXPECT_EQ(mixtral->intermediate, 14336);
  EXPECT_EQ(mixtral->num_experts, 8);
  EXPECT_EQ(mixtral->topk, 2);
  EXPECT_FALSE(find_model("gpt-5"));
  EXPECT_FALSE(find_model(""));
}

TEST(Models, MakeConfigCopiesShapeAndArguments) {
  const LayerConfig cfg = make_config(*find_model("qwen3-30b"), 512, 7.5f);
  EXPECT_EQ(cfg.hidden, 2048);
  EXPECT_EQ(cfg.intermediate, 768);
  EXPECT_EQ(cfg.num_experts, 128);
  EXPECT_EQ(cfg.topk, 8);
  EXPECT_EQ(cfg.max_tokens_per_rank, 512);
  EXPECT_EQ(cfg.swiglu_clamp, 7.5f);
  EXPECT_EQ(cfg.experts_per_rank(4), 32);
}

}  // namespace
}  // namespace epfuse
