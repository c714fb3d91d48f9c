#include "bench/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

const Ceilings kFacts{812.0, 4250.0, 350.0};

BenchRow measured(const BenchCase& c, std::string impl, double median_ms) {
  BenchRow r = row_for_case(c, std::move(impl), 4, Routing::kUniform);
  fill_expected_load(r, kFacts);
  r.median_ms = median_ms;
  r.p10_ms = median_ms * 0.9;
  r.p90_ms = median_ms * 1.2;
  r.gemm_alone_ms = median_ms / 2;
  r.verified = "yes";
  r.rel_err = 4e-3;
  r.unwritten = 0;
  r.iters = 50;
  r.sets = 4;
  return r;
}

TEST(Report, DerivedFigures) {
  const BenchCase dsv3 = facts_cases()[2];  // dsv3 T=4096
  BenchRow r = measured(dsv3, "unfused", 7.109);
  derive_row(r);
  // 2 * 4096 * 8 * 3 * 7168 * 2048 FLOP in 7.109 ms.
  EXPECT_NEAR(r.tflops_per_gpu, 2.0 * 4096 * 8 * 3 * 7168 * 2048 / 7.109e-3 / 1e12, 1e-9);
  EXPECT_NEAR(r.gemm_alone_tflops, 2 * r.tflops_per_gpu, 1e-9);
  EXPECT_NEAR(r.floor_ms, 3.554, 0.0005);
  EXPECT_NEAR(r.floor_fraction, r.floor_ms / 7.109, 1e-12);
  EXPECT_NEAR(r.nvlink_gbps, r.remote_bytes_per_gpu / 7.109e-3 / 1e9, 1e-9);
  EXPECT_EQ(r.floor.bound(), "compute");
}

TEST(Report, SpeedupsPairRowsOfTheSameProblemOnly) {
  const std::vector<BenchCase> cases = facts_cases();
  std::vector<BenchRow> rows{measured(cases[0], "unfused", 2.0), measured(cases[0], "torch", 3.0),
                             measured(cases[1], "torch", 5.0), row_for_case(cases[0], "fused", 4, Routing::kUniform)};
  rows[3].note = "fused implementation not built yet";
  fill_speedups(rows);
  ASSERT_EQ(rows[0].speedup_over.size(), 1u);
  EXPECT_DOUBLE_EQ(rows[0].speedup_over.at("torch"), 1.5);
  EXPECT_DOUBLE_EQ(rows[1].speedup_over.at("unfused"), 2.0 / 3.0);
  EXPECT_TRUE(rows[2].speedup_over.empty());  // another T
  EXPECT_TRUE(rows[3].speedup_over.empty());  // did not run
}

TEST(Report, RowRecordRoundTrips) {
  BenchRow r = measured(facts_cases()[4], "unfused", 1.25);
  r.dispatch_ms = 0.25;
  r.gemm_alone_grouped_ms = 0.75;
  r.gemm_alone_loop_ms = 0.5;
  r.gemm_path = "loop";
  r.tile = "fp8-decode";
  const BenchRow back = row_from_record(parse_record(row_record(r).format()));
  EXPECT_EQ(back.config, "qwen3-30b");
  EXPECT_EQ(back.tokens_per_rank, 4096);
  EXPECT_EQ(back.ranks, 4);
  EXPECT_DOUBLE_EQ(back.median_ms, 1.25);
  EXPECT_DOUBLE_EQ(back.dispatch_ms, 0.25);
  EXPECT_TRUE(std::isnan(back.combine_ms));
  EXPECT_DOUBLE_EQ(back.gemm_alone_grouped_ms, 0.75);
  EXPECT_DOUBLE_EQ(back.gemm_alone_loop_ms, 0.5);
  EXPECT_EQ(back.gemm_path, "loop");
  EXPECT_EQ(back.tile, "fp8-decode");
  EXPECT_DOUBLE_EQ(back.floor.compute_ms, r.floor.compute_ms);
  EXPECT_DOUBLE_EQ(back.remote_bytes_per_gpu, r.remote_bytes_per_gpu);
  EXPECT_EQ(back.verified, "yes");
  EXPECT_EQ(back.unwritten, 0);

  EXPECT_EQ(back.dtype, "bf16");
  EXPECT_EQ(back.sustained_calls, 0);  // no --sustained run
  EXPECT_TRUE(std::isnan(back.sustained_ms));

  r.sustained_calls = 500;
  r.sustained_ms = 3.0;
  r.sustained_joules = 2.1;
  r.sustained_watts = 700;
  const BenchRow sustained = row_from_record(parse_record(row_record(r).format()));
  EXPECT_EQ(sustained.sustained_calls, 500);
  EXPECT_DOUBLE_EQ(sustained.sustained_ms, 3.0);
  EXPECT_DOUBLE_EQ(sustained.sustained_joules, 2.1);
  EXPECT_DOUBLE_EQ(sustained.sustained_watts, 700);
  EXPECT_EQ(row_json(r)["sustained"]["joules_per_call"], 2.1);
  EXPECT_FALSE(row_json(back).contains("sustained"));

  BenchCase fp8_case = facts_cases()[0];
  fp8_case.layer.weight_format = WeightFormat::kFp8Block128;
  BenchRow fp8 = row_for_case(fp8_case, "unfused", 4, Routing::kUniform);
  EXPECT_EQ(fp8.dtype, "fp8");
  EXPECT_EQ(row_from_record(parse_record(row_record(fp8).format())).dtype, "fp8");
  EXPECT_EQ(row_json(fp8)["dtype"], "fp8");

  BenchRow skipped = row_for_case(facts_cases()[0], "fused", 4, Routing::kUniform);
  skipped.note = "not built";
  const BenchRow skipped_back = row_from_record(parse_record(row_record(skipped).format()));
  EXPECT_FALSE(skipped_back.ran());
  EXPECT_EQ(skipped_back.note, "not built");
}

// Rank 0's records file as the parent reads it: progress, ceilings and rows; a line that is not a
// record of a known kind is an error naming the line.
TEST(Report, ReadsTheWorkerRecords) {
  const BenchRow row = measured(facts_cases()[0], "fused", 1.5);
  std::stringstream file;
  Record progress(kProgressTag);
  file << progress.set("done", 0).set("total", 2).set("label", "ceilings").format() << "\n";
  file << ceilings_record(kFacts, "measured").format() << "\n" << row_record(row).format() << "\n";
  const WorkerRecords records = read_worker_records(file);
  ASSERT_TRUE(records.ceilings);
  EXPECT_EQ(records.ceilings->nvlink_gbps, kFacts.nvlink_gbps);
  EXPECT_EQ(records.ceilings_source, "measured");
  ASSERT_EQ(records.rows.size(), 1u);
  EXPECT_EQ(records.rows[0].median_ms, 1.5);

  auto error_of = [](const std::string& text) {
    std::stringstream in(text);
    try {
      read_worker_records(in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string good = row_record(row).format() + "\n";
  EXPECT_NE(error_of(good + "EPFUSE_ROW\tconfig=dsv3\n").find("rank 0's records, line 2: not a bench record"),
            std::string::npos);
  EXPECT_NE(error_of(good + R"({"record": "EPFUSE_ROW", "config": "dsv3"})").find("line 2: EPFUSE_ROW record has no field"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"record": "EPFUSE_SURPRISE"})").find("line 1: unknown record kind 'EPFUSE_SURPRISE'"),
            std::string::npos);
  EXPECT_EQ(error_of(""), "no error");  // the ranks failed before writing anything
}

// A row as bench/peers/torch_ep.py prints it (its fields and number formats).
TEST(Report, ReadsThePyTorchPeersRow) {
  const std::string line =
      R"({"record": "EPFUSE_ROW", "config": "mixtral", "hidden": 4096, "intermediate": 14336, "experts": 8, )"
      R"("topk": 2, "tokens_per_rank": 4096, "routing": "uniform", "impl": "torch", "median_ms": 7.078, )"
      R"("p10_ms": 7.001, "p90_ms": 7.2, "dispatch_ms": 0.538, "experts_ms": 5.912, "combine_ms": 0.885, )"
      R"("verified": "yes", "rel_err": 0.004512, "iters": 50, "sets": 4})";
  BenchRow r = row_from_record(parse_record(line));
  r.ranks = 4;
  fill_expected_load(r, kFacts);
  derive_row(r);
  EXPECT_EQ(r.impl, "torch");
  EXPECT_DOUBLE_EQ(r.experts_ms, 5.912);
  EXPECT_DOUBLE_EQ(r.rel_err, 4.512e-3);
  EXPECT_EQ(r.unwritten, -1);  // the peer counts NaNs into its verdict instead
  EXPECT_NEAR(r.floor_ms, 3.554, 0.0005);
  EXPECT_NEAR(r.floor_fraction, 3.554 / 7.078, 1e-3);
}

TEST(Report, TableAndJsonCarryEveryRow) {
  const std::vector<BenchCase> cases = facts_cases();
  std::vector<BenchRow> rows{measured(cases[0], "unfused", 2.0), measured(cases[0], "torch", 3.0),
                             row_for_case(cases[0], "fused", 4, Routing::kUniform)};
  rows[2].note = "fused not built";
  for (BenchRow& r : rows) derive_row(r);
  fill_speedups(rows);
  const std::string table = render_table(rows);
  for (const char* text : {"median ms", "x vs torch", "floor/median", "1.50x", "skipped: fused not built", "yes"})
    EXPECT_NE(table.find(text), std::string::npos) << text << "\n" << table;

  RunInfo info{"NVIDIA H200", "2026-11-21T10:00:00Z", "abc1234", "epfuse bench", 4, kFacts, "flags",
               "GPU-209d824b-d3cb-2590-bd57-8e49e31f4abf"};
  const std::string json = tools::dump_json(report_json(info, rows));
  for (const char* key : {"\"device\"", "\"gpus\"", "\"date\"", "\"commit\"", "\"command\"", "\"timing\"", "\"ceilings\"",
                          "\"rows\"", "\"config\"", "\"hidden\"", "\"intermediate\"", "\"experts\"", "\"topk\"",
                          "\"tokens_per_rank\"", "\"routing\"", "\"impl\"", "\"median_ms\"", "\"p10_ms\"",
                          "\"p90_ms\"", "\"tflops_per_gpu\"", "\"nvlink_gbps\"", "\"floor_ms\"", "\"verified\"",
                          "\"rel_err\"", "\"speedup_over\"", "\"gemm_alone_ms\"", "\"gemm_alone_grouped_ms\"",
                          "\"gemm_alone_loop_ms\"", "\"gemm_path\"", "\"tile\"", "\"skipped\""})
    EXPECT_NE(json.find(key), std::string::npos) << key;
  EXPECT_NE(json.find("\"verified\": true"), std::string::npos) << json;
  EXPECT_NE(json.find("\"nvlink_gbps\": 350"), std::string::npos) << json;
  EXPECT_NE(json.find("\"device_uuid\": \"GPU-209d824b-d3cb-2590-bd57-8e49e31f4abf\""), std::string::npos) << json;
  EXPECT_EQ(table.find("sustained"), std::string::npos) << "no --sustained run, no column";

  rows[0].sustained_calls = 500;
  rows[0].sustained_ms = 2.25;
  rows[0].sustained_joules = 1.5;
  rows[0].sustained_watts = 667;
  const std::string with_sustained = render_table(rows);
  for (const char* text : {"sustained ms / J / W", "2.250 / 1.50 / 667"})
    EXPECT_NE(with_sustained.find(text), std::string::npos) << text << "\n" << with_sustained;
}

// --layers: the decode step's fields travel from the rank process to the table and the JSON, and
// derive_row gives the per-layer time beside the single layer's.
TEST(Report, DecodeStepFields) {
  BenchCase c = facts_cases()[0];
  c.layer.weight_format = WeightFormat::kFp8Block128;
  BenchRow r = measured(c, "fused", 0.2);
  EXPECT_FALSE(row_json(r).contains("decode_step"));  // no step: no object
  EXPECT_FALSE(row_from_record(parse_record(row_record(r).format())).step_layers);
  r.step_layers = 58;
  r.step_graph = true;
  r.step_weight_sets = 39;
  r.step_weight_set_bytes = 2.82e9;
  r.step_median_ms = 12.18;
  r.step_p10_ms = 12.0;
  r.step_p90_ms = 12.5;
  r.step_layers_checked = 58;
  r.step_verified = "yes";
  r.step_rel_err = 9e-3;
  r.step_row_err = 1.5e-2;
  r.step_norm_rel_err = 2e-3;
  r.step_unwritten = 0;
  BenchRow back = row_from_record(parse_record(row_record(r).format()));
  EXPECT_EQ(back.step_layers, 58);
  EXPECT_TRUE(back.step_graph);
  EXPECT_EQ(back.step_weight_sets, 39);
  EXPECT_DOUBLE_EQ(back.step_weight_set_bytes, 2.82e9);
  EXPECT_DOUBLE_EQ(back.step_median_ms, 12.18);
  EXPECT_DOUBLE_EQ(back.step_p90_ms, 12.5);
  EXPECT_EQ(back.step_layers_checked, 58);
  EXPECT_EQ(back.step_verified, "yes");
  EXPECT_DOUBLE_EQ(back.step_row_err, 1.5e-2);
  EXPECT_DOUBLE_EQ(back.step_norm_rel_err, 2e-3);
  EXPECT_EQ(back.step_unwritten, 0);
  derive_row(back);
  EXPECT_DOUBLE_EQ(back.step_per_layer_ms, 12.18 / 58);
  EXPECT_DOUBLE_EQ(back.step_per_layer_over_single, 12.18 / 58 / 0.2);

  const tools::Json j = row_json(back)["decode_step"];
  EXPECT_EQ(j["layers"], 58);
  EXPECT_EQ(j["graph"], true);
  EXPECT_EQ(j["weight_sets"], 39);
  EXPECT_EQ(j["weight_set_bytes"], 2.82e9);
  EXPECT_DOUBLE_EQ(j["per_layer_ms"].get<double>(), 12.18 / 58);
  EXPECT_DOUBLE_EQ(j["per_layer_over_single"].get<double>(), 12.18 / 58 / 0.2);
  EXPECT_EQ(j["verified"], true);
  EXPECT_EQ(j["layers_checked"], 58);
  for (const char* key : {"median_ms", "p10_ms", "p90_ms", "rel_err", "row_err", "norm_rel_err", "unwritten", "timing"})
    EXPECT_TRUE(j.contains(key)) << key;

  // The table shows the step's columns only when a row has one; the lines below it name S.
  std::vector<BenchRow> rows{back, measured(facts_cases()[0], "unfused", 0.3)};
  for (BenchRow& row : rows) derive_row(row);
  const std::string table = render_table(rows);
  for (const char* text : {"step ms (layers, weight sets)", "12.180 (58, S=39, graph)", "step/L ms", "0.210", "1.050x",
                           "step verified"})
    EXPECT_NE(table.find(text), std::string::npos) << text << "\n" << table;
  EXPECT_EQ(render_table({rows[1]}).find("step"), std::string::npos);
  const std::string lines = render_step_lines(rows);
  for (const char* text : {"dsv3 T=128 fused fp8: 58 layers 12.180 ms = 0.2100 ms per layer, 1.050x the single layer's "
                           "0.2000 ms; S=39 weight sets of 2.820 GB per GPU (layer i on set i % 39); verified yes"})
    EXPECT_NE(lines.find(text), std::string::npos) << text << "\n" << lines;
  EXPECT_EQ(lines.find("unfused"), std::string::npos) << "a row without a step has no line";

  back.step_verified = "no";
  EXPECT_EQ(row_json(back)["decode_step"]["verified"], false);
}

TEST(Report, FloorTableWithoutGpu) {
  const std::string table = render_floor_table(facts_cases(), 4, kFacts);
  EXPECT_NE(table.find("3.554"), std::string::npos) << table;
  EXPECT_NE(table.find("1.326"), std::string::npos) << table;
  EXPECT_NE(table.find("weights"), std::string::npos) << table;
  const std::string odd = render_floor_table(facts_cases(), 3, kFacts);  // 256 experts over 3 ranks
  EXPECT_NE(odd.find("not divisible"), std::string::npos) << odd;
}

}  // namespace
}  // namespace epfuse::bench
