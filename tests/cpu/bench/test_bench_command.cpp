#include "bench/bench.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace epfuse::tools {
namespace {

struct Outcome {
  int code;
  std::string out, err;
};

Outcome run(std::vector<std::string> args) {
  ::setenv("EPFUSE_FORCE_CPU", "1", 1);
  args.insert(args.begin(), "bench");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  const int code = bench_command(static_cast<int>(argv.size()), argv.data());
  return {code, testing::internal::GetCapturedStdout(), testing::internal::GetCapturedStderr()};
}

TEST(BenchCommand, WithoutGpuPrintsTheFactsFloors) {
  const Outcome o = run({});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out.rfind("epfuse bench: no GPU found: printing the floors only (4 ranks", 0), 0u) << o.out;
  for (const char* text : {"dsv3", "qwen3-30b", "mixtral", "16384", "1.326", "3.554", "1.523", "0.071"})
    EXPECT_NE(o.out.find(text), std::string::npos) << text << "\n" << o.out;
}

TEST(BenchCommand, FloorsFollowTheGivenCeilingsAndRanks) {
  // qwen3-30b T=4096 on 2 ranks at half FACTS.md's GEMM rate: compute 0.381 * 2 * 2 = 1.523 ms.
  const Outcome o = run({"--model", "qwen3-30b", "--tokens", "2048", "--ranks", "2", "--ceilings",
                         "gemm=406,hbm=4250,nvlink=350"});
  EXPECT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("(2 ranks"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("0.381"), std::string::npos) << o.out;  // 2 * 2048 * 8 * 3 * 2048 * 768 / 406e12
}

TEST(BenchCommand, FloorsOnlyJson) {
  const std::string path = testing::TempDir() + "bench_floors.json";
  const Outcome o = run({"--model", "mixtral", "--tokens", "4096", "--json", path});
  ASSERT_EQ(o.code, 0) << o.err;
  std::ifstream in(path);
  const std::string json((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* text : {"\"rows\"", "\"config\": \"mixtral\"", "\"floor_ms\": 3.55", "\"median_ms\": null",
                           "\"source\": \"FACTS.md\"", "\"command\": \"epfuse bench"})
    EXPECT_NE(json.find(text), std::string::npos) << text << "\n" << json;
}

TEST(BenchCommand, UsageErrorsExitTwo) {
  const Outcome o = run({"--iters", "0"});
  EXPECT_EQ(o.code, 2);
  EXPECT_NE(o.err.find("--iters"), std::string::npos) << o.err;
  EXPECT_NE(o.err.find("usage: epfuse bench"), std::string::npos) << o.err;
  EXPECT_EQ(run({"--no-such-flag"}).code, 2);
}

TEST(BenchCommand, HelpExitsZero) {
  const Outcome o = run({"--help"});
  EXPECT_EQ(o.code, 0);
  EXPECT_NE(o.out.find("--ceilings"), std::string::npos);
}

}  // namespace
}  // namespace epfuse::tools
