// `epfuse bench --peers DIR`: the rows read from run_deepgemm_peers.sh's output (the formats of
// deepgemm_gemm_alone.py and of MegaMoE's fused-only sweep) and the EXTRA shapes passed to it.
#include "bench/peers.h"

#include <cmath>

#include <gtest/gtest.h>

namespace epfuse::bench {
namespace {

// As the two steps print them (the megamoe step greps its output for "tokens=|MegaMoE|Error|error").
constexpr const char* kOutput =
    "dsv3       H=7168 I=2048 E=256 k=8 T=   128 rows/expert=   16: torch 1.690 ms (333 TF/s) | deepgemm-bf16 "
    "1.690 ms (333) | deepgemm-fp8 0.930 ms (606; rel err L1 3.7e-02 L2 3.7e-02)\n"
    "mixtral    H=4096 I=14336 E=8 k=2 T=  4096 rows/expert= 4096: torch 3.700 ms (800 TF/s) | deepgemm-bf16 "
    "3.600 ms (802) | deepgemm-fp8 nan ms (nan; rel err L1 nan L2 nan)\n"
    "  fp8 failed for mixtral L1: something\n"
    "SM90 MegaMoE fused-only sweep: ranks=1 hidden=7168 ih=2048 experts=64 topk=8 masked_ratio=0.0 fast_math=True\n"
    " tokens= 128  recv= 1024  experts=  64    769.0 us   55.3 TFLOPS    2400 GB/s  (rank0)\n"
    " tokens=4096  recv=32768  experts=  64   3382.4 us  400.1 TFLOPS    2000 GB/s  (rank0)\n"
    "SM90 MegaMoE fused-only sweep: ranks=1 hidden=2048 ih=768 experts=32 topk=8 masked_ratio=0.0 fast_math=True\n"
    " tokens=16384  recv=131072  experts=  32   2238.0 us  300.0 TFLOPS    1000 GB/s  (rank0)\n"
    "RuntimeError: something broke\n";

TEST(Peers, ParsesGemmAloneAndMegaMoeRows) {
  const PeerOutput out = parse_peer_output(kOutput, 1);
  ASSERT_EQ(out.rows.size(), 7u);
  const BenchRow& bf16 = out.rows[0];
  EXPECT_EQ(bf16.impl, "deepgemm-bf16-gemm");
  EXPECT_EQ(bf16.dtype, "bf16");
  EXPECT_EQ(bf16.config, "dsv3");
  EXPECT_EQ(bf16.hidden, 7168);
  EXPECT_EQ(bf16.intermediate, 2048);
  EXPECT_EQ(bf16.experts, 64);  // one GPU's share of E = 256 at world 4, as a world-1 layer
  EXPECT_EQ(bf16.topk, 8);
  EXPECT_EQ(bf16.tokens_per_rank, 128);
  EXPECT_EQ(bf16.ranks, 1);
  EXPECT_DOUBLE_EQ(bf16.median_ms, 1.690);
  EXPECT_TRUE(bf16.ran());
  const BenchRow& fp8 = out.rows[1];
  EXPECT_EQ(fp8.impl, "deepgemm-fp8-gemm");
  EXPECT_EQ(fp8.dtype, "fp8");
  EXPECT_DOUBLE_EQ(fp8.median_ms, 0.930);
  // Mixtral: E = 8 at world 4 is 2 local experts; the FP8 GEMM printed nan: a row that did not run.
  EXPECT_EQ(out.rows[2].experts, 2);
  EXPECT_TRUE(out.rows[2].ran());
  EXPECT_FALSE(out.rows[3].ran());
  const BenchRow& mega = out.rows[4];
  EXPECT_EQ(mega.impl, "megamoe-sm90-fp8");
  EXPECT_EQ(mega.dtype, "fp8");
  EXPECT_EQ(mega.config, "dsv3");
  EXPECT_EQ(mega.experts, 64);
  EXPECT_EQ(mega.ranks, 1);
  EXPECT_EQ(mega.tokens_per_rank, 128);
  EXPECT_DOUBLE_EQ(mega.median_ms, 0.769);
  EXPECT_FALSE(mega.remark.empty());
  EXPECT_DOUBLE_EQ(out.rows[5].median_ms, 3.3824);
  EXPECT_EQ(out.rows[6].config, "qwen3-30b");
  EXPECT_EQ(out.rows[6].tokens_per_rank, 16384);
  EXPECT_EQ(out.rows[6].experts, 32);
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_EQ(out.errors[0], "RuntimeError: something broke");
}

TEST(Peers, WorldFourKeepsTheGlobalShape) {
  const PeerOutput out = parse_peer_output(kOutput, 4);
  EXPECT_EQ(out.rows[0].experts, 256);
  EXPECT_EQ(out.rows[0].ranks, 4);
}

// One GPU's share of dsv3 at world 4 (E = 64 of 256).
LayerConfig dsv3_per_gpu() {
  LayerConfig l = make_config(*find_model("dsv3"), 4096);
  l.num_experts /= 4;
  return l;
}

TEST(Peers, ExtraShapesAreTheCasesTheScriptLacks) {
  const LayerConfig dsv3_gpu = dsv3_per_gpu();  // the built-in shape at world 4
  LayerConfig small = dsv3_gpu;
  small.hidden = 1024;
  small.num_experts = 16;
  const std::vector<BenchCase> cases = {{"custom", dsv3_gpu, 128}, {"custom", small, 64}, {"custom", small, 64}};
  EXPECT_EQ(gemm_alone_extra_shapes(cases, 1), "custom,1024,2048,64,8,64");
  EXPECT_EQ(gemm_alone_extra_shapes({}, 1), "");
}

// MegaMoE's token counts follow the cases of its two shapes (by H, I and k: one GPU's dsv3 at world 1
// counts), each count once, in order; other shapes add nothing, and no case of a shape leaves its variable out.
TEST(Peers, MegaMoeBatchesAreTheCasesTokens) {
  const auto config = [](std::string_view name) { return make_config(*find_model(name), 4096); };
  const LayerConfig dsv3 = config("dsv3"), qwen3 = config("qwen3-30b"), mixtral = config("mixtral");
  LayerConfig dsv3_gpu = dsv3;
  dsv3_gpu.num_experts = dsv3.num_experts / 4;
  const std::vector<BenchCase> cases = {{"dsv3", dsv3, 1},       {"qwen3-30b", qwen3, 8}, {"dsv3", dsv3, 32},
                                        {"custom", dsv3_gpu, 1}, {"mixtral", mixtral, 4096}, {"qwen3-30b", qwen3, 1}};
  const std::vector<std::pair<std::string, std::string>> want = {{"MEGAMOE_DSV3_BATCHES", "1 32"},
                                                                 {"MEGAMOE_QWEN3_BATCHES", "8 1"}};
  EXPECT_EQ(megamoe_batches(cases), want);
  const std::vector<BenchCase> only_mixtral = {{"mixtral", mixtral, 4096}};
  EXPECT_TRUE(megamoe_batches(only_mixtral).empty());
}

// deepgemm_routed.py's lines (bench/peers/deepgemm_routed.py): the routed time as the row, at the line's
// world (1 when the line has none), the even time and block count in its remark; nan is a row that did
// not run; other lines ignored, error lines collected.
TEST(Peers, ParsesRoutedRows) {
  const char* text =
      "deepgemm-routed dsv3 H=7168 I=2048 E=64 k=8 T=1024: even 0.992 ms (727 TF/s, 64 blocks of 128) | routed "
      "1.274 ms (566 TF/s, 100 blocks; rows per expert 101-149) | routed / even 1.284\n"
      "some warning line\n"
      "deepgemm-routed dsv3 H=7168 I=2048 E=256 k=8 T=4096 world=4: even 2.384 ms (1211 TF/s, 256 blocks of 128) | "
      "routed nan ms (nan TF/s, 286 blocks; rows per expert 453-548) | routed / even nan\n"
      "RuntimeError: out of memory\n";
  const PeerOutput out = parse_routed_output(text);
  ASSERT_EQ(out.rows.size(), 2u);
  const BenchRow& a = out.rows[0];
  EXPECT_EQ(a.impl, "deepgemm-fp8-gemm-routed");
  EXPECT_EQ(a.dtype, "fp8");
  EXPECT_EQ(a.config, "dsv3");
  EXPECT_EQ(a.hidden, 7168);
  EXPECT_EQ(a.intermediate, 2048);
  EXPECT_EQ(a.experts, 64);
  EXPECT_EQ(a.topk, 8);
  EXPECT_EQ(a.tokens_per_rank, 1024);
  EXPECT_EQ(a.ranks, 1);
  EXPECT_DOUBLE_EQ(a.median_ms, 1.274);
  EXPECT_TRUE(a.ran());
  EXPECT_NE(a.remark.find("100 blocks"), std::string::npos);
  EXPECT_NE(a.remark.find("0.992 ms"), std::string::npos);
  const BenchRow& b = out.rows[1];
  EXPECT_EQ(b.experts, 256);
  EXPECT_EQ(b.ranks, 4);
  EXPECT_EQ(b.tokens_per_rank, 4096);
  EXPECT_FALSE(b.ran());
  ASSERT_EQ(out.errors.size(), 1u);
  EXPECT_EQ(out.errors[0], "RuntimeError: out of memory");
}

// The routed step's shapes: the FP8 cases, each (H, I, E, k, T) once, in order; none without an FP8 case.
TEST(Peers, RoutedShapesAreTheFp8Cases) {
  LayerConfig fp8 = dsv3_per_gpu();
  fp8.weight_format = WeightFormat::kFp8Block128;
  LayerConfig bf16 = fp8;
  bf16.weight_format = WeightFormat::kBf16;
  const std::vector<BenchCase> cases = {{"custom", bf16, 128}, {"custom", fp8, 128}, {"custom", fp8, 4096},
                                        {"custom", fp8, 128}};
  EXPECT_EQ(routed_shapes(cases), "custom,7168,2048,64,8,128;custom,7168,2048,64,8,4096");
  const std::vector<BenchCase> only_bf16 = {{"custom", bf16, 128}};
  EXPECT_EQ(routed_shapes(only_bf16), "");
}

}  // namespace
}  // namespace epfuse::bench
