#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "common/output.h"

namespace epfuse::tools {
namespace {

TEST(Table, AlignsColumnsAndRightAlignsNumbers) {
  Table t({"rank", "name"});
  t.add_row({"7", "x"});
  t.add_row({"12345", "longer"});
  EXPECT_EQ(t.render(),
            "rank   name\n"
            "-------------\n"
            "    7  x\n"
            "12345  longer\n");
}

// The files' layout: insertion order, two-space indentation, arrays of scalars on one line, NaN as null.
TEST(Json, DocumentLayout) {
  Json doc = {{"b", 1}, {"a", "q\"uote\n"}, {"list", std::vector<int>{3, 0}}};
  doc["obj"] = {{"x", 1.5}, {"nan", std::nan("")}, {"t", true}, {"n", nullptr}};
  doc["rows"] = Json::array({Json{{"k", 1}}});
  doc["empty"] = Json::object();
  doc["b"] = 2;  // replaces, keeps the position
  EXPECT_EQ(dump_json(doc),
            "{\n"
            "  \"b\": 2,\n"
            "  \"a\": \"q\\\"uote\\n\",\n"
            "  \"list\": [3, 0],\n"
            "  \"obj\": {\n"
            "    \"x\": 1.5,\n"
            "    \"nan\": null,\n"
            "    \"t\": true,\n"
            "    \"n\": null\n"
            "  },\n"
            "  \"rows\": [\n"
            "    {\n"
            "      \"k\": 1\n"
            "    }\n"
            "  ],\n"
            "  \"empty\": {}\n"
            "}\n");
  EXPECT_EQ(dump_json(Json::object()), "{}\n");
  EXPECT_EQ(dump_json(Json::array()), "[]\n");
}

TEST(Json, LayoutParsesBackToTheDocument) {
  const Json doc = {{"s", "x"}, {"n", -3}, {"u", uint64_t{18446744073709551615ULL}}, {"d", 0.1},
                    {"list", {1.5, 2.5}}, {"nested", {{"rows", Json::array({Json{{"k", "v"}}})}}}};
  EXPECT_EQ(Json::parse(dump_json(doc)), doc);
}

TEST(Format, NumbersAndCommandLine) {
  EXPECT_EQ(format_fixed(3.14159, 2), "3.14");
  EXPECT_EQ(format_sci(0.00123, 2), "1.23e-03");
  EXPECT_EQ(format_sci(std::nan(""), 2), "nan");
  EXPECT_EQ(command_line({"epfuse", "run", "--tokens", "1,2", "a b", "it's"}),
            "epfuse run --tokens 1,2 'a b' 'it'\\''s'");
  EXPECT_FALSE(git_commit().empty());
  EXPECT_EQ(utc_timestamp().size(), 20u);
}

TEST(WriteFile, ReportsUnwritablePath) {
  EXPECT_THROW(write_file("/nonexistent-dir/x.json", "{}"), std::runtime_error);
}

}  // namespace
}  // namespace epfuse::tools
