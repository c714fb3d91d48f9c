// The environment module (src/common/env.h): README's "Environment variables" table lists exactly
// env::kEnvironment (names, meanings and defaults, in order), reads go through the table, and the
// parsers keep their errors.
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/env.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

struct Row {
  std::string name, meaning, fallback;
};

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(' '), e = s.find_last_not_of(' ');
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// The rows of the table under README's "## Environment variables" (up to the next "## ").
std::vector<Row> readme_rows() {
  std::ifstream in(EPFUSE_SOURCE_DIR "/README.md");
  EXPECT_TRUE(in.good()) << "cannot read " EPFUSE_SOURCE_DIR "/README.md";
  std::vector<Row> rows;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("## ", 0) == 0) {
      if (inside) break;
      inside = line == "## Environment variables";
      continue;
    }
    if (!inside || line.rfind("| `", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream ss(line.substr(1));
    for (std::string cell; std::getline(ss, cell, '|');) cells.push_back(trim(cell));
    EXPECT_EQ(cells.size(), 3u) << line;
    if (cells.size() != 3) continue;
    EXPECT_TRUE(cells[0].size() > 2 && cells[0].front() == '`' && cells[0].back() == '`') << line;
    rows.push_back({cells[0].substr(1, cells[0].size() - 2), cells[1], cells[2]});
  }
  return rows;
}

TEST(Env, ReadmeTableMatchesTheModule) {
  const std::vector<Row> rows = readme_rows();
  ASSERT_EQ(rows.size(), std::size(env::kEnvironment)) << "README's table and env::kEnvironment differ in length";
  for (size_t i = 0; i < rows.size(); ++i) {
    const env::Variable& v = env::kEnvironment[i];
    EXPECT_EQ(rows[i].name, v.name) << "row " << i;
    EXPECT_EQ(rows[i].meaning, v.meaning) << v.name;
    EXPECT_EQ(rows[i].fallback, v.fallback) << v.name;
  }
}

TEST(Env, ReadsOnlyListedVariables) {
  try {
    env::text("EPFUSE_NOT_A_KNOB");
    ADD_FAILURE() << "an unlisted variable was read";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
  }
  ::setenv("EPFUSE_PROFILE", "1", 1);
  EXPECT_EQ(env::text("EPFUSE_PROFILE"), std::optional<std::string>("1"));
  EXPECT_TRUE(env::profile_print());
  ::setenv("EPFUSE_PROFILE", "yes", 1);
  EXPECT_FALSE(env::profile_print());
  ::unsetenv("EPFUSE_PROFILE");
  EXPECT_FALSE(env::text("EPFUSE_PROFILE").has_value());
}

TEST(Env, Parsers) {
  ::unsetenv("EPFUSE_TIMEOUT_MS");
  EXPECT_EQ(env::fused_timeout_ms(0), 20000u);
  ::setenv("EPFUSE_TIMEOUT_MS", "1500", 1);
  EXPECT_EQ(env::fused_timeout_ms(0), 1500u);
  ::setenv("EPFUSE_TIMEOUT_MS", "-3", 1);
  try {
    env::fused_timeout_ms(2);
    ADD_FAILURE() << "EPFUSE_TIMEOUT_MS=-3 accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()),
              "rank 2: EPFUSE_TIMEOUT_MS = '-3' is not a whole number of milliseconds in [1, 86400000]");
  }
  ::unsetenv("EPFUSE_TIMEOUT_MS");

  ::unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");
  EXPECT_EQ(env::device_max_connections(), 8);
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "64", 1);
  EXPECT_EQ(env::device_max_connections(), 32);
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", "x", 1);
  EXPECT_EQ(env::device_max_connections(), 8);
  ::unsetenv("CUDA_DEVICE_MAX_CONNECTIONS");

  ::unsetenv("EPFUSE_TRACE_LAUNCH");
  EXPECT_EQ(env::trace_launch(), 20);

  ::unsetenv("EPFUSE_PDL");
  EXPECT_TRUE(env::programmatic_launch());
  ::setenv("EPFUSE_PDL", "0", 1);
  EXPECT_FALSE(env::programmatic_launch());
  ::setenv("EPFUSE_PDL", "1", 1);
  EXPECT_TRUE(env::programmatic_launch());
  ::setenv("EPFUSE_PDL", "off", 1);
  try {
    env::programmatic_launch();
    ADD_FAILURE() << "EPFUSE_PDL=off accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), "EPFUSE_PDL = 'off' is neither 0 nor 1");
  }
  ::unsetenv("EPFUSE_PDL");

  ::unsetenv("EPFUSE_SCHEDULE_LAG");
  EXPECT_EQ(env::schedule_lag_quarters(), -1);
  ::setenv("EPFUSE_SCHEDULE_LAG", "auto", 1);
  EXPECT_EQ(env::schedule_lag_quarters(), -1);
  ::setenv("EPFUSE_SCHEDULE_LAG", "first", 1);
  EXPECT_EQ(env::schedule_lag_quarters(), 0);
  ::setenv("EPFUSE_SCHEDULE_LAG", "0.5", 1);
  EXPECT_EQ(env::schedule_lag_quarters(), 2);
  ::setenv("EPFUSE_SCHEDULE_LAG", "16", 1);
  EXPECT_EQ(env::schedule_lag_quarters(), 64);
  for (const char* bad : {"0", "0.3", "17", "-1", "1x", "nan", "inf"}) {
    ::setenv("EPFUSE_SCHEDULE_LAG", bad, 1);
    try {
      env::schedule_lag_quarters();
      ADD_FAILURE() << "EPFUSE_SCHEDULE_LAG=" << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("EPFUSE_SCHEDULE_LAG = '") + bad + "'"), std::string::npos) << e.what();
    }
  }
  ::unsetenv("EPFUSE_SCHEDULE_LAG");

  ::unsetenv("EPFUSE_FUSED_TILE");
  EXPECT_EQ(env::fused_tile(), std::nullopt);
  for (const char* automatic : {"", "auto"}) {
    ::setenv("EPFUSE_FUSED_TILE", automatic, 1);
    EXPECT_EQ(env::fused_tile(), std::nullopt) << automatic;
  }
  ::setenv("EPFUSE_FUSED_TILE", "fp8-decode", 1);
  EXPECT_EQ(env::fused_tile(), std::optional<std::string>("fp8-decode"));
  ::unsetenv("EPFUSE_FUSED_TILE");

  ::setenv("EPFUSE_JOB_ID", "a", 1);
  ::setenv("TORCHELASTIC_RUN_ID", "b", 1);
  EXPECT_EQ(env::job_id(), std::optional<std::string>("a"));
  ::unsetenv("EPFUSE_JOB_ID");
  EXPECT_EQ(env::job_id(), std::optional<std::string>("b"));
  ::unsetenv("TORCHELASTIC_RUN_ID");
  EXPECT_FALSE(env::job_id().has_value());
}

}  // namespace
}  // namespace epfuse
