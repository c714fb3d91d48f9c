#include "fp8_layer_rank.h"

#include <cstdio>

#include <gtest/gtest.h>

#include "common/job.h"

namespace epfuse::testing {

LayerConfig fp8_layer_config(ScaleFormat scales, float clamp) {
  LayerConfig cfg = small_layer_config(384, clamp);
  cfg.max_tokens_per_rank = 128;
  cfg.weight_format = WeightFormat::kFp8Block128;
  cfg.scale_format = scales;
  return cfg;
}

namespace {
int failures_so_far() { return ::testing::UnitTest::GetInstance()->current_test_info()->result()->total_part_count(); }
}  // namespace

std::optional<Fp8LayerRank::Checked> Fp8LayerRank::check(const HostTokens& in, const std::string& what) {
  Checked c;
  try {
    c.got = forward(in);
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": " << e.what();
    return std::nullopt;
  }
  const int failures_before = failures_so_far();
  c.want = expect_close_to_reference(in, c.got, what);
  if (in.num_tokens == 0) return std::nullopt;
  LayerConfig bf16_cfg = cfg_;
  bf16_cfg.weight_format = WeightFormat::kBf16;
  bf16_cfg.scale_format = ScaleFormat::kFp32;
  const std::vector<double> exact = reference_forward(bf16_cfg, in, GeneratedExperts(bf16_cfg, kWeightSeed));
  c.row_errors = tools::row_errors(c.want, c.got, static_cast<size_t>(cfg_.hidden));
  double worst = 0.0;
  size_t worst_row = 0;
  for (size_t i = 0; i < c.row_errors.size(); ++i)
    if (!(c.row_errors[i] <= worst)) worst = c.row_errors[i], worst_row = i;
  std::printf("[fp8 %s] rank %d %s (scales %s): vs FP8 reference %.3e (worst row %zu: %.3e); "
              "vs bf16 reference %.3e (FP8 reference vs bf16: %.3e)\n",
              std::string(to_string(impl_)).c_str(), rank(), what.c_str(),
              std::string(to_string(cfg_.scale_format)).c_str(), relative_error(c.want, c.got), worst_row, worst,
              relative_error(exact, c.got), relative_error(exact, c.want));
  c.failed = failures_so_far() > failures_before;
  return c;
}

}  // namespace epfuse::testing
