#include "bench/options.h"

#include <gtest/gtest.h>

#include "common/flags.h"

namespace epfuse::bench {
namespace {

using tools::UsageError;
using Args = std::vector<std::string>;

TEST(Options, DefaultIsTheFactsSweep) {
  const BenchOptions o = parse_bench_options({});
  ASSERT_EQ(o.cases.size(), 7u);
  EXPECT_EQ(case_label(o.cases[0]), "dsv3 T=128");
  EXPECT_EQ(case_label(o.cases[5]), "qwen3-30b T=16384");
  EXPECT_EQ(case_label(o.cases[6]), "mixtral T=4096");
  EXPECT_EQ(o.cases[6].layer.num_experts, 8);
  EXPECT_EQ(o.cases[6].layer.max_tokens_per_rank, 4096);
  EXPECT_EQ(o.impls, (std::vector<std::string>{"unfused", "fused"}));
  EXPECT_FALSE(o.ceilings);  // measured
  EXPECT_EQ(o.torch, TorchMode::kAuto);
  EXPECT_EQ(o.routing, Routing::kUniform);
  EXPECT_EQ(parse_bench_options({"--configs", "facts"}).cases.size(), 7u);
}

// --dtype: every case once per dtype, in the order given; --scales sets the FP8 cases' scale format.
TEST(Options, DtypesMultiplyTheCases) {
  const BenchOptions o = parse_bench_options({"--model", "qwen3-30b", "--tokens", "128,4096", "--dtype", "bf16,fp8",
                                              "--scales", "ue8m0", "--peers", "/tmp/p"});
  ASSERT_EQ(o.cases.size(), 4u);
  EXPECT_EQ(case_label(o.cases[0]), "qwen3-30b T=128");
  EXPECT_EQ(case_label(o.cases[1]), "qwen3-30b T=128 fp8");
  EXPECT_EQ(o.cases[1].layer.weight_format, WeightFormat::kFp8Block128);
  EXPECT_EQ(o.cases[1].layer.scale_format, ScaleFormat::kUe8m0);
  EXPECT_EQ(o.cases[2].layer.weight_format, WeightFormat::kBf16);
  EXPECT_EQ(o.cases[2].layer.scale_format, ScaleFormat::kFp32);
  EXPECT_EQ(o.peers_dir, "/tmp/p");
  EXPECT_EQ(o.peer_steps, (std::vector<std::string>{"gemm", "megamoe"}));
  EXPECT_EQ(parse_bench_options({"--peer-steps", "megamoe"}).peer_steps, std::vector<std::string>{"megamoe"});
  EXPECT_EQ(parse_bench_options({"--peer-steps", "gemm,routed"}).peer_steps,
            (std::vector<std::string>{"gemm", "routed"}));
  EXPECT_THROW(parse_bench_options({"--peer-steps", "gemm,torch"}), UsageError);
  EXPECT_EQ(parse_bench_options({}).cases[0].layer.weight_format, WeightFormat::kBf16);  // default bf16
  EXPECT_THROW(parse_bench_options({"--dtype", "fp16"}), UsageError);
  EXPECT_THROW(parse_bench_options({"--dtype", "fp8", "--scales", "e8"}), UsageError);
  EXPECT_THROW(parse_bench_options({"--sms", "-1"}), UsageError);
  const auto c = parse_ceilings("gemm=812,hbm=4250,nvlink=350,fp8=1400");
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->fp8_gemm_tflops, 1400);
  EXPECT_DOUBLE_EQ(parse_ceilings("gemm=812,hbm=4250,nvlink=350")->fp8_gemm_tflops, 1447);
}

TEST(Options, ModelsTimesTokensAndAnExplicitShape) {
  const BenchOptions o = parse_bench_options({"--model", "dsv3,mixtral", "--tokens", "64,256", "--hidden", "256",
                                              "--intermediate", "128", "--experts", "16", "--topk", "4",
                                              "--clamp=7", "--impl", "unfused", "--ranks", "2", "--sms", "64"});
  ASSERT_EQ(o.cases.size(), 6u);
  EXPECT_EQ(case_label(o.cases[1]), "dsv3 T=256");
  EXPECT_EQ(case_label(o.cases[2]), "mixtral T=64");
  EXPECT_EQ(o.cases[4].config, "custom");
  EXPECT_EQ(o.cases[4].layer.hidden, 256);
  EXPECT_EQ(o.cases[5].layer.max_tokens_per_rank, 256);
  for (const BenchCase& c : o.cases) EXPECT_FLOAT_EQ(c.layer.swiglu_clamp, 7.0f);
  for (const BenchCase& c : o.cases) EXPECT_EQ(c.layer.num_sms, 64);
  EXPECT_EQ(o.impls, (std::vector<std::string>{"unfused"}));
  EXPECT_EQ(o.ranks, 2);
  EXPECT_EQ(o.args.size(), 19u);  // kept verbatim for the rank processes
}

TEST(Options, Ceilings) {
  const std::optional<Ceilings> c = parse_ceilings("gemm=812,hbm=4250,nvlink=350");
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->gemm_tflops, 812);
  EXPECT_DOUBLE_EQ(c->hbm_gbps, 4250);
  EXPECT_DOUBLE_EQ(c->nvlink_gbps, 350);
  EXPECT_FALSE(parse_ceilings("measure"));
  EXPECT_THROW(parse_ceilings("gemm=812,hbm=4250"), UsageError);
  EXPECT_THROW(parse_ceilings("gemm=812,hbm=4250,nvlink=x"), UsageError);
  EXPECT_THROW(parse_ceilings("gemm=812,hbm=4250,nvlink=-1"), UsageError);
  EXPECT_THROW(parse_ceilings("gemm=812,hbm=4250,nvlink=350,l2=9"), UsageError);
  EXPECT_TRUE(parse_bench_options({"--ceilings=gemm=812,hbm=4250,nvlink=350"}).ceilings);
}

// The UsageError a parse gives, or "no error".
std::string message(const Args& args) {
  try {
    parse_bench_options(args);
  } catch (const UsageError& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

TEST(Options, RejectsBadValuesNamingTheFlag) {
  EXPECT_NE(message({"--model", "gpt5"}).find("--model"), std::string::npos);
  EXPECT_NE(message({"--impl", "fast"}).find("--impl"), std::string::npos);
  EXPECT_NE(message({"--configs", "facts", "--tokens", "5"}).find("--tokens"), std::string::npos);
  EXPECT_NE(message({"--configs", "all"}).find("--configs"), std::string::npos);
  EXPECT_NE(message({"--hidden", "256"}).find("all four"), std::string::npos);
  EXPECT_NE(message({"--iters", "0"}).find("--iters"), std::string::npos);
  EXPECT_NE(message({"--sets", "0"}).find("--sets"), std::string::npos);
  EXPECT_NE(message({"--sustained", "-1"}).find("--sustained"), std::string::npos);
  EXPECT_NE(message({"--tokens", "0"}).find("--tokens"), std::string::npos);
  EXPECT_NE(message({"--torch", "maybe"}).find("--torch"), std::string::npos);
  EXPECT_NE(message({"--routing", "zipf"}).find("--routing"), std::string::npos);
  EXPECT_EQ(message({"--routing", "skewed", "--torch", "off"}), "no error");
}

// --layers L [--graph] [--weight-sets S] [--check-layers K]: the decode step beside the fused rows.
TEST(Options, DecodeStep) {
  const BenchOptions off = parse_bench_options({});
  EXPECT_EQ(off.step_layers, 0);
  EXPECT_FALSE(off.step_graph);
  const BenchOptions o = parse_bench_options({"--model", "dsv3", "--tokens", "1,8,32", "--impl", "fused", "--dtype",
                                              "fp8,bf16", "--layers", "58", "--graph", "--weight-sets", "4",
                                              "--check-layers", "8"});
  EXPECT_EQ(o.step_layers, 58);
  EXPECT_TRUE(o.step_graph);
  EXPECT_EQ(o.step_weight_sets, 4);
  EXPECT_EQ(o.step_check_layers, 8);
  EXPECT_EQ(o.cases.size(), 6u);
  const BenchOptions launched = parse_bench_options({"--layers", "3"});  // default impls include fused
  EXPECT_EQ(launched.step_layers, 3);
  EXPECT_FALSE(launched.step_graph);
  EXPECT_EQ(launched.step_weight_sets, 0);  // as many as fit
  EXPECT_EQ(launched.step_check_layers, 0);  // every layer

  EXPECT_NE(message({"--layers", "-1"}).find("--layers: must be >= 0"), std::string::npos);
  EXPECT_NE(message({"--graph"}).find("--graph: only with --layers"), std::string::npos);
  EXPECT_NE(message({"--weight-sets", "2"}).find("--weight-sets: only with --layers"), std::string::npos);
  EXPECT_NE(message({"--check-layers", "2"}).find("--check-layers: only with --layers"), std::string::npos);
  EXPECT_NE(message({"--layers", "4", "--weight-sets", "-1"}).find("--weight-sets: must be >= 0"), std::string::npos);
  EXPECT_NE(message({"--layers", "4", "--check-layers", "-2"}).find("--check-layers: must be >= 0"), std::string::npos);
  EXPECT_NE(message({"--layers", "4", "--impl", "unfused"}).find("add fused to --impl"), std::string::npos);
  EXPECT_NE(message({"--layers", "4", "--x-fp8"}).find("not with --x-fp8"), std::string::npos);
  EXPECT_NE(message({"--layers", "4", "--trace", "t.json"}).find("not with --trace"), std::string::npos);
  EXPECT_NE(parse_bench_options({"--help"}).usage.find("--layers"), std::string::npos);
}

TEST(Options, HelpShowsUsageButNotTheInternalFlag) {
  const BenchOptions o = parse_bench_options({"--help"});
  EXPECT_TRUE(o.help);
  EXPECT_NE(o.usage.find("--ceilings"), std::string::npos);
  EXPECT_EQ(o.usage.find("--worker-dir"), std::string::npos);
  // Hidden, not gone: the parent passes it to the rank processes it launches.
  EXPECT_EQ(parse_bench_options({"--ranks", "2", "--worker-dir", "/tmp/w"}).worker_dir, "/tmp/w");
}

}  // namespace
}  // namespace epfuse::bench
