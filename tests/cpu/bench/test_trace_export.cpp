// The fused kernel's timeline as Chrome trace-event JSON (tools/bench/trace_export.h), on rows written
// the way src/fused/fused_kernel.cu LaunchTrace writes them.
#include "bench/trace_export.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace epfuse::bench {
namespace {

// rank,H,I,E,T,mma,launch,cta,smid,rec,phase,index,expert,mblock,nblock, then 15 stamps (-1 = none).
std::string row(int rank, int launch, int cta, int rec, int phase, const std::string& stamps) {
  return std::to_string(rank) + ",2048,768,32,1,3," + std::to_string(launch) + "," + std::to_string(cta) + ",7," +
         std::to_string(rec) + "," + std::to_string(phase) + ",0,5,0,1," + stamps + "\n";
}

const char* kNone = "-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1,-1";

std::string two_launches() {
  std::string csv;
  // launch 0: CTA 0 runs 1000..21000 ns: a dispatch task (waits for the layout 2000..5000), then a
  // Linear1 tile on its roles (the plan seen at 8200, the roles split at 8800); launch 1 starts 30000 ns
  // after launch 0 ended.
  csv += row(0, 0, 0, -1, -1, "1000,-1,-1,-1,-1,-1,-1,-1,21000,-1,-1,-1,-1,-1,-1");
  csv += row(0, 0, 0, 0, 2, "-1,-1,5000,-1,-1,2000,-1,-1,8000,-1,7000,-1,-1,-1,-1");
  csv += row(0, 0, 0, 8, 4, "9000,9500,10000,10200,11000,10300,12000,18000,20000,-1,-1,-1,-1,8200,8800");
  csv += row(0, 0, 0, 9, 7, "-1,-1,-1,-1,-1,20500,-1,-1,-1,-1,-1,-1,-1,-1,-1");  // kDone: no end stamp
  csv += row(0, 1, 0, -1, -1, "51000,-1,-1,-1,-1,-1,-1,-1,61000,-1,-1,-1,-1,-1,-1");
  csv += row(0, 1, 1, -1, -1, "52000,-1,-1,-1,-1,-1,-1,-1,62000,-1,-1,-1,-1,-1,-1");
  return csv;
}

const nlohmann::json* find(const nlohmann::json& events, const std::string& name, int tid) {
  for (const nlohmann::json& e : events)
    if (e["ph"] == "X" && e["name"] == name && e["tid"] == tid) return &e;
  return nullptr;
}

TEST(TraceExport, ParsesRowsAndRejectsMalformedOnes) {
  const std::vector<TraceRow> rows = parse_trace_csv(two_launches());
  ASSERT_EQ(rows.size(), 6u);
  EXPECT_TRUE(rows[0].kernel_span());
  EXPECT_EQ(rows[2].phase, 4);
  EXPECT_EQ(rows[2].t[7], 18000);
  EXPECT_EQ(rows[4].launch, 1);
  EXPECT_THROW(parse_trace_csv("1,2,3\n"), std::runtime_error);
  EXPECT_THROW(parse_trace_csv(row(0, 0, 0, 0, 2, "1,2,3,4,5,6,7,8,9,10,11,12,x")), std::runtime_error);
}

TEST(TraceExport, ChromeJsonHasTasksStepsAndLaunchGaps) {
  const nlohmann::json j = nlohmann::json::parse(chrome_trace_json(parse_trace_csv(two_launches())));
  const nlohmann::json& ev = j.at("traceEvents");
  // Times in us from the earliest stamp (1000 ns).
  const nlohmann::json* kernel = find(ev, "kernel (launch 0)", 0);
  ASSERT_NE(kernel, nullptr);
  EXPECT_DOUBLE_EQ((*kernel)["ts"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ((*kernel)["dur"].get<double>(), 20.0);
  const nlohmann::json* wait = find(ev, "wait: layout done", 0);
  ASSERT_NE(wait, nullptr);
  EXPECT_DOUBLE_EQ((*wait)["ts"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ((*wait)["dur"].get<double>(), 3.0);
  // The CTA's way from the plan to its roles, on its own thread (tid 0).
  const nlohmann::json* plan = find(ev, "plan: copy, decode, split", 0);
  ASSERT_NE(plan, nullptr);
  EXPECT_DOUBLE_EQ((*plan)["ts"].get<double>(), 7.2);
  EXPECT_DOUBLE_EQ((*plan)["dur"].get<double>(), 0.6);
  // The Linear1 tile: producer steps on tid 1, math steps on tid 2.
  ASSERT_NE(find(ev, "wait: inputs", 1), nullptr);
  const nlohmann::json* kloop = find(ev, "k-loop", 2);
  ASSERT_NE(kloop, nullptr);
  EXPECT_DOUBLE_EQ((*kloop)["dur"].get<double>(), 6.0);
  EXPECT_EQ(find(ev, "linear1", 2)->at("args").at("expert"), 5);
  // The gap between launch 0's end (21000) and launch 1's first CTA (51000).
  const nlohmann::json* gap = find(ev, "between launches", -1);
  ASSERT_NE(gap, nullptr);
  EXPECT_DOUBLE_EQ((*gap)["dur"].get<double>(), 30.0);
  // Named tracks for Perfetto.
  bool named = false;
  for (const nlohmann::json& e : ev)
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["tid"] == 2) named = e["args"]["name"] == "CTA 0 math";
  EXPECT_TRUE(named);
}

TEST(TraceExport, SummaryGivesSpansGapsAndPhases) {
  const std::vector<LaunchSummary> s = summarise_launches(parse_trace_csv(two_launches()));
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].ctas, 1);
  EXPECT_DOUBLE_EQ(s[0].span_us, 20.0);
  EXPECT_DOUBLE_EQ(s[0].gap_before_us, -1.0);
  EXPECT_EQ(s[1].ctas, 2);
  EXPECT_DOUBLE_EQ(s[1].span_us, 11.0);
  EXPECT_DOUBLE_EQ(s[1].gap_before_us, 30.0);
  ASSERT_EQ(s[0].phases.size(), 2u);  // dispatch, linear1: the kDone record is the CTA's span
  EXPECT_EQ(s[0].phases[0].phase, 2);
  EXPECT_DOUBLE_EQ(s[0].phases[0].first_start_us, 1.0);
  EXPECT_DOUBLE_EQ(s[0].phases[1].last_end_us, 19.0);
  EXPECT_NE(format_launch_summaries(s).find("30.0 us after the previous launch ended"), std::string::npos);
}

}  // namespace
}  // namespace epfuse::bench
