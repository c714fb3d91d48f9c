// `epfuse run`'s soak modes as the flags resolve them (tools/cli/run_options.h): --graph (one forward
// captured in a CUDA graph, replayed --iters times) and --cycles N (create/destroy cycles of a
// workspace and its layers), their defaults, their schedule of checks and the combinations refused;
// the summary's machine-readable soak line.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cli/run_options.h"
#include "cli/run_report.h"

namespace epfuse::tools {
namespace {

// The plan for `args` after a small valid shape, at two ranks.
RunPlan plan_for(std::vector<std::string> args, bool have_gpu = true) {
  RunFlags f;
  FlagParser parser("epfuse run [flags]", "");
  add_run_flags(parser, f);
  std::vector<std::string> all = {"--hidden", "128", "--intermediate", "128", "--experts", "8", "--topk", "2"};
  all.insert(all.end(), args.begin(), args.end());
  parser.parse(all);
  return resolve_run_plan(f, parser, /*ranks=*/2, have_gpu);
}

// The UsageError message for `args`, or "" when they resolve.
std::string usage_error(std::vector<std::string> args) {
  try {
    plan_for(std::move(args));
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(RunSoakOptions, PlainRunsRepeatCalls) {
  const RunPlan plan = plan_for({"--iters", "5"});
  EXPECT_FALSE(plan.graph);
  EXPECT_EQ(plan.cycles, 0);
  EXPECT_STREQ(plan.mode(), "calls");
  EXPECT_TRUE(plan.impl == Impl::kFused);  // the default with GPUs, unchanged by the soak flags
  EXPECT_TRUE(plan_for({"--impl", "unfused"}).impl == Impl::kUnfused);
  EXPECT_FALSE(plan_for({}, /*have_gpu=*/false).impl.has_value());  // the CPU reference
}

TEST(RunSoakOptions, GraphRunsTheFusedLayer) {
  const RunPlan plan = plan_for({"--graph", "--iters", "10000", "--verify-every", "500"});
  EXPECT_TRUE(plan.graph);
  EXPECT_STREQ(plan.mode(), "graph");
  EXPECT_TRUE(plan.impl == Impl::kFused);
  EXPECT_EQ(plan.iters, 10000);
  int checked = 0;
  for (int call = 0; call < plan.iters; ++call) checked += plan.verifies_call(call);
  EXPECT_EQ(checked, 21);  // 0, 500, ..., 9500 and the last
  // Without a GPU too (then `epfuse run` says the fused layer needs one, or skips under the tests).
  EXPECT_TRUE(plan_for({"--graph"}, /*have_gpu=*/false).impl == Impl::kFused);
  EXPECT_TRUE(plan_for({"--graph", "--impl", "fused"}).impl == Impl::kFused);
}

TEST(RunSoakOptions, CyclesCountAndCheckCycles) {
  const RunPlan plan = plan_for({"--cycles", "1000", "--verify-every", "100"});
  EXPECT_EQ(plan.cycles, 1000);
  EXPECT_STREQ(plan.mode(), "cycles");
  EXPECT_TRUE(plan.impl == Impl::kFused);
  EXPECT_EQ(plan.iters, 1);
  std::vector<int> checked;
  for (int c = 0; c < plan.cycles; ++c)
    if (plan.verifies_cycle(c)) checked.push_back(c);
  ASSERT_EQ(checked.size(), 11u);  // 0, 100, ..., 900 and 999
  EXPECT_EQ(checked.front(), 0);
  EXPECT_EQ(checked[1], 100);
  EXPECT_EQ(checked.back(), 999);
  EXPECT_TRUE(plan_for({"--cycles", "3"}).verifies_cycle(1));  // --verify-every 1: every cycle
  EXPECT_EQ(plan_for({"--cycles", "2", "--vary"}).cycles, 2);   // fresh token counts per cycle
}

TEST(RunSoakOptions, RefusedCombinationsSayWhy) {
  EXPECT_NE(usage_error({"--graph", "--impl", "unfused"}).find("--graph runs the fused layer"), std::string::npos);
  EXPECT_NE(usage_error({"--graph", "--impl", "reference"}).find("--graph runs the fused layer"), std::string::npos);
  EXPECT_NE(usage_error({"--cycles", "4", "--impl", "unfused"}).find("--cycles runs the fused layer"),
            std::string::npos);
  EXPECT_NE(usage_error({"--graph", "--cycles", "4"}).find("exclude each other"), std::string::npos);
  EXPECT_NE(usage_error({"--graph", "--vary"}).find("without --vary"), std::string::npos);
  EXPECT_NE(usage_error({"--cycles", "4", "--iters", "10"}).find("leave --iters out"), std::string::npos);
  EXPECT_NE(usage_error({"--cycles", "-1"}).find("--cycles must be >= 0"), std::string::npos);
  EXPECT_EQ(usage_error({"--cycles", "0", "--iters", "10"}), "");  // 0: off
}

TEST(RunSoakOptions, SoakLineIsOneParsableLine) {
  RunResult r;
  r.calls = 30;
  r.calls_verified = 11;
  r.max_rel_err = 3.25e-3;
  r.worst_row = {1, 7, 5.5e-3};
  r.device_used_start = int64_t{1000} << 20;
  r.device_used_end = (int64_t{1000} << 20) + (int64_t{1} << 19);
  r.verified = true;
  EXPECT_EQ(soak_line(plan_for({"--graph", "--iters", "30"}), r),
            "soak: mode=graph calls=30 checked=11 max_rel_err=3.25e-03 max_row_rel_err=5.50e-03 unwritten=0 "
            "memory_start_mib=1000.0 memory_end_mib=1000.5 verified=yes\n");
  r.memory_flat = false;
  r.verified = false;
  EXPECT_EQ(soak_line(plan_for({"--cycles", "10"}), r),
            "soak: mode=cycles cycles=10 calls=30 checked=11 max_rel_err=3.25e-03 max_row_rel_err=5.50e-03 "
            "unwritten=0 memory_start_mib=1000.0 memory_end_mib=1000.5 verified=no memory_flat=no\n");
  r.device_used_start = r.device_used_end = -1;  // not measured
  EXPECT_NE(soak_line(plan_for({}), r).find("mode=calls calls=30"), std::string::npos);
  EXPECT_NE(soak_line(plan_for({}), r).find("memory_start_mib=-1.0 memory_end_mib=-1.0"), std::string::npos);
}

}  // namespace
}  // namespace epfuse::tools
