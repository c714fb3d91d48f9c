#include <gtest/gtest.h>

#include "common/flags.h"

namespace epfuse::tools {
namespace {

struct Parsed {
  int n = 7;
  double x = 0.5;
  uint64_t seed = 1;
  std::string name = "a";
  bool on = false;
  std::vector<int> list{1, 2};
  std::vector<std::string> words;
};

FlagParser make_parser(Parsed& p) {
  FlagParser f("prog [flags]", "what it does");
  f.add("-n,--n", p.n, "a count");
  f.add("--x", p.x, "a number");
  f.add("--seed", p.seed, "a seed");
  f.add("--name", p.name, "a name");
  f.add("--on", p.on, "a switch");
  f.add("--list", p.list, "ints");
  f.add("--words", p.words, "strings");
  return f;
}

TEST(Flags, SpaceAndEqualsForms) {
  Parsed p;
  FlagParser f = make_parser(p);
  auto rest = f.parse({"--n", "12", "--x=2.25", "--seed", "18446744073709551615", "--name=zz", "--on",
                       "--list", "3,0,9", "--words=u,v"});
  EXPECT_TRUE(rest.empty());
  EXPECT_EQ(p.n, 12);
  EXPECT_DOUBLE_EQ(p.x, 2.25);
  EXPECT_EQ(p.seed, 18446744073709551615ULL);
  EXPECT_EQ(p.name, "zz");
  EXPECT_TRUE(p.on);
  EXPECT_EQ(p.list, (std::vector<int>{3, 0, 9}));
  EXPECT_EQ(p.words, (std::vector<std::string>{"u", "v"}));
  EXPECT_TRUE(f.seen("--x"));
  EXPECT_FALSE(f.help_requested());
}

TEST(Flags, DefaultsStayAndSeenIsFalse) {
  Parsed p;
  FlagParser f = make_parser(p);
  f.parse(std::vector<std::string>{});
  EXPECT_EQ(p.n, 7);
  EXPECT_EQ(p.list, (std::vector<int>{1, 2}));
  EXPECT_FALSE(f.seen("--n"));
}

TEST(Flags, ShortAliasAndRestAfterDoubleDash) {
  Parsed p;
  FlagParser f = make_parser(p);
  auto rest = f.parse({"-n", "3", "--", "cmd", "--n", "9"});
  EXPECT_EQ(p.n, 3);
  EXPECT_EQ(rest, (std::vector<std::string>{"cmd", "--n", "9"}));
}

TEST(Flags, SwitchAcceptsExplicitFalse) {
  Parsed p;
  p.on = true;
  FlagParser f = make_parser(p);
  f.parse({"--on=false"});
  EXPECT_FALSE(p.on);
}

// Every error names the flag (by its long name).
TEST(Flags, ErrorsNameTheFlag) {
  auto error_of = [](std::vector<std::string> args) -> std::string {
    Parsed p;
    FlagParser f = make_parser(p);
    try {
      f.parse(args);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of({"--bogus"}).find("unknown flag --bogus"), std::string::npos);
  EXPECT_NE(error_of({"--n"}).find("--n: 1 required N missing"), std::string::npos);  // CLI11's words
  EXPECT_NE(error_of({"--n", "12x"}).find("--n 12x: expected an integer"), std::string::npos);
  EXPECT_NE(error_of({"--n", "99999999999"}).find("out of range"), std::string::npos);
  EXPECT_NE(error_of({"--seed", "-1"}).find("--seed -1"), std::string::npos);
  EXPECT_NE(error_of({"--x", "abc"}).find("--x abc: expected a number"), std::string::npos);
  EXPECT_NE(error_of({"--x", "inf"}).find("finite"), std::string::npos);
  EXPECT_NE(error_of({"--on=maybe"}).find("--on"), std::string::npos);
  EXPECT_NE(error_of({"--list", "1,,2"}).find("--list"), std::string::npos);
  EXPECT_NE(error_of({"--words", "a,"}).find("empty item"), std::string::npos);
  // Given twice: CLI11's "At Most 1 required" ("At most" in later versions).
  EXPECT_NE(error_of({"--n", "1", "--n", "2"}).find("--n: At "), std::string::npos);
  EXPECT_NE(error_of({"--on", "--on"}).find("--on: At "), std::string::npos);
  EXPECT_NE(error_of({"stray"}).find("unexpected argument 'stray'"), std::string::npos);
  EXPECT_NE(error_of({"-q"}).find("unknown flag -q"), std::string::npos);
  EXPECT_NE(error_of({"-n", "x"}).find("--n x: expected an integer"), std::string::npos);
}

TEST(Flags, UsageListsVisibleFlagsWithDefaults) {
  Parsed p;
  int hidden = 0;
  FlagParser f = make_parser(p);
  f.add("--internal", hidden, "not for users").hide("--internal");
  f.parse({"--help"});
  EXPECT_TRUE(f.help_requested());
  std::string u = f.usage();
  EXPECT_NE(u.find("usage: prog [flags]"), std::string::npos);
  EXPECT_NE(u.find("-n, --n N"), std::string::npos);
  EXPECT_NE(u.find("(default: 7)"), std::string::npos);
  EXPECT_NE(u.find("--help"), std::string::npos);
  EXPECT_EQ(u.find("--internal"), std::string::npos);
}

TEST(Flags, SplitListKeepsEmptyItems) {
  EXPECT_EQ(split_list("a,b"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(split_list("a,,b,"), (std::vector<std::string>{"a", "", "b", ""}));
  EXPECT_EQ(split_list(""), (std::vector<std::string>{""}));
}

}  // namespace
}  // namespace epfuse::tools
