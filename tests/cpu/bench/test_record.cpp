#include "bench/record.h"

#include <gtest/gtest.h>

#include <cmath>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

TEST(Record, RoundTripsThroughALine) {
  Record r{std::string(kRowTag)};
  r.set("config", "dsv3").set("tokens_per_rank", 4096).set("median_ms", 1.0 / 3).set("rel_err", std::nan(""));
  const std::string line = r.format();
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const std::optional<Record> back = parse_record("[rank 0] " + line + "\n", kRowTag);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->text("config"), "dsv3");
  EXPECT_EQ(back->integer("tokens_per_rank"), 4096);
  EXPECT_DOUBLE_EQ(back->number("median_ms"), 1.0 / 3);  // %.17g round-trips
  EXPECT_TRUE(std::isnan(back->number("rel_err")));
  EXPECT_EQ(back->fields(), r.fields());
}

TEST(Record, SetReplacesAField) {
  Record r{"T"};
  r.set("a", 1).set("a", 2);
  EXPECT_EQ(r.fields().size(), 1u);
  EXPECT_EQ(r.integer("a"), 2);
}

TEST(Record, OtherLinesAreNotRecords) {
  EXPECT_FALSE(parse_record("NCCL INFO something", kRowTag));
  EXPECT_FALSE(parse_record("EPFUSE_ROWS\tconfig=x", kRowTag));  // another tag that starts the same
  EXPECT_FALSE(parse_record("EPFUSE_ROW\tno equals sign", kRowTag));
  EXPECT_FALSE(parse_record(std::string(kProgressTag) + "\tdone=1", kRowTag));
  const std::optional<Record> empty = parse_record(kRowTag, kRowTag);
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->fields().empty());
}

TEST(Record, RejectsSeparatorsAndBadNumbers) {
  Record r{"T"};
  EXPECT_THROW(r.set("k", "a\tb"), Error);
  EXPECT_THROW(r.set("k=v", "x"), Error);
  EXPECT_THROW(r.set("k", "line\n"), Error);
  r.set("label", "dsv3 T=128");  // '=' in a value is fine: the key ends at the first one
  EXPECT_EQ(parse_record(r.format(), "T")->text("label"), "dsv3 T=128");
  r.set("x", "12abc");
  EXPECT_THROW(r.number("x"), Error);
  EXPECT_THROW(r.integer("x"), Error);
  EXPECT_THROW(r.text("missing"), Error);
  EXPECT_DOUBLE_EQ(r.number_or("missing", 4.5), 4.5);
}

}  // namespace
}  // namespace epfuse::bench
