#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

TEST(Json, NestedDocumentInInsertionOrder) {
  Json doc = Json::object();
  doc.set("b", 1).set("a", "q\"uote\n").set("list", Json::array_of(std::vector<int>{3, 0}));
  doc.set("obj", Json::object().set("x", 1.5).set("nan", std::nan("")).set("t", true).set("n", Json()));
  doc.set("b", int64_t{2});  // replaces, keeps the position
  EXPECT_EQ(doc.dump(0), "{\"b\":2,\"a\":\"q\\\"uote\\n\",\"list\":[3, 0],"
                         "\"obj\":{\"x\":1.5,\"nan\":null,\"t\":true,\"n\":null}}\n");
  EXPECT_EQ(Json::object().dump(2), "{}\n");
  std::string pretty = doc.dump(2);
  EXPECT_NE(pretty.find("\n  \"b\": 2,\n"), std::string::npos);
  EXPECT_NE(pretty.find("\n    \"x\": 1.5,"), std::string::npos);
}

TEST(Json, MisuseThrows) {
  Json a = Json::array();
  EXPECT_THROW(a.set("k", 1), std::logic_error);
  Json o = Json::object();
  EXPECT_THROW(o.push(1), std::logic_error);
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
