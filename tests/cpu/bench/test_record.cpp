#include "bench/record.h"

#include <gtest/gtest.h>

#include <cmath>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

std::string error_of(std::string_view line) {
  try {
    parse_record(line);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Record, RoundTripsThroughALine) {
  Record r(kRowTag);
  r.set("config", "dsv3").set("tokens_per_rank", 4096).set("median_ms", 1.0 / 3).set("rel_err", std::nan(""));
  r.set("p90_ms", INFINITY).set("note", "tab\there, \"quoted\"\nnext line, label=dsv3 T=128");
  const std::string line = r.format();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  // The wire format: one JSON object, the kind first, then the fields in the order set.
  EXPECT_EQ(line.rfind(R"({"record":"EPFUSE_ROW","config":"dsv3","tokens_per_rank":4096,)", 0), 0u) << line;
  const Record back = parse_record(line + "\n");
  EXPECT_EQ(back.tag(), kRowTag);
  EXPECT_EQ(back.text("config"), "dsv3");
  EXPECT_EQ(back.integer("tokens_per_rank"), 4096);
  EXPECT_EQ(back.number("median_ms"), 1.0 / 3);  // shortest round-trip form: exact
  EXPECT_TRUE(std::isnan(back.number("rel_err")));
  EXPECT_EQ(back.number("p90_ms"), INFINITY);
  EXPECT_EQ(back.text("note"), "tab\there, \"quoted\"\nnext line, label=dsv3 T=128");
  EXPECT_EQ(back.json(), r.json());
}

TEST(Record, SetReplacesAField) {
  Record r("T");
  r.set("a", 1).set("a", 2);
  EXPECT_EQ(r.json().size(), 2u);  // the kind and one field
  EXPECT_EQ(r.integer("a"), 2);
  EXPECT_THROW(r.set("record", "x"), Error);  // the kind is not a field
  EXPECT_FALSE(r.has("record"));
}

// What the PyTorch peer prints: Python's json.dumps, with its spacing.
TEST(Record, ReadsPythonsJsonDumps) {
  const Record r = parse_record(R"({"record": "EPFUSE_PROGRESS", "done": 1, "total": 7, "label": "torch dsv3 T=128"})");
  EXPECT_EQ(r.tag(), kProgressTag);
  EXPECT_EQ(r.integer("done"), 1);
  EXPECT_EQ(r.text("label"), "torch dsv3 T=128");
  EXPECT_TRUE(std::isnan(parse_record(R"({"record": "T", "rel_err": "nan"})").number("rel_err")));
}

// The parent's error for a line that is not a record says why and shows the line.
TEST(Record, LinesThatAreNotRecords) {
  EXPECT_NE(error_of("NCCL INFO something").find("not JSON): NCCL INFO something"), std::string::npos);
  EXPECT_NE(error_of(R"({"record":"EPFUSE_ROW","config":)").find("not JSON"), std::string::npos);  // cut short
  EXPECT_NE(error_of("[1, 2]").find("no \"record\""), std::string::npos);
  EXPECT_NE(error_of(R"({"config": "x"})").find("no \"record\""), std::string::npos);
  EXPECT_NE(error_of(R"({"record": 5})").find("no \"record\""), std::string::npos);
  EXPECT_FALSE(find_record("NCCL INFO something"));
  EXPECT_FALSE(find_record(R"({"config": "x"})"));
  const std::optional<Record> empty = find_record(R"({"record":"EPFUSE_ROW"})" "\r\n");
  ASSERT_TRUE(empty);
  EXPECT_EQ(empty->tag(), kRowTag);
  EXPECT_FALSE(empty->has("config"));
}

TEST(Record, TypedFieldsNameTheTagAndKey) {
  Record r("T");
  r.set("x", "12abc").set("f", 1.5).set("n", 3);
  EXPECT_THROW(r.number("x"), Error);
  EXPECT_THROW(r.integer("x"), Error);
  EXPECT_THROW(r.integer("f"), Error);
  EXPECT_THROW(r.text("n"), Error);
  EXPECT_EQ(r.number("n"), 3.0);  // an integer is a number too
  auto message = [&](auto read) {
    try {
      read();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { r.text("missing"); }).find("T record has no field 'missing'"), std::string::npos);
  EXPECT_NE(message([&] { r.integer("f"); }).find("field 'f' = 1.5 is not an integer"), std::string::npos);
  EXPECT_DOUBLE_EQ(r.number_or("missing", 4.5), 4.5);
}

}  // namespace
}  // namespace epfuse::bench
