// EPFUSE_FAULT's parser (src/common/fault.h): the fault-injection hook's one entry point.
#include <gtest/gtest.h>

#include <chrono>
#include <iterator>
#include <string>

#include "common/fault.h"
#include "epfuse/error.h"

namespace epfuse::detail {
namespace {

TEST(Fault, EmptyMeansOff) { EXPECT_FALSE(parse_fault("").has_value()); }

TEST(Fault, ParsesEveryKindWithDefaults) {
  struct Case {
    const char* text;
    FaultKind kind;
  };
  for (const Case& c : {Case{"rank=1,kind=skip", FaultKind::kSkip}, Case{"rank=1,kind=stall", FaultKind::kStall},
                        Case{"rank=1,kind=throw", FaultKind::kThrow}, Case{"rank=1,kind=exit", FaultKind::kExit},
                        Case{"kind=bad_ids,rank=1", FaultKind::kBadIds},
                        Case{"rank=1,kind=fail_create", FaultKind::kFailCreate}}) {
    const std::optional<Fault> f = parse_fault(c.text);
    ASSERT_TRUE(f.has_value()) << c.text;
    EXPECT_EQ(f->kind, c.kind) << c.text;
    EXPECT_EQ(f->rank, 1) << c.text;
    EXPECT_EQ(f->call, 0) << c.text;
    EXPECT_EQ(f->stall_ms, -1) << c.text;
  }
}

// kind=hang names where the kernel stops (common/hang_point.h): every point by its name, and only with it.
TEST(Fault, ParsesEveryHangPoint) {
  for (HangPoint at : kHangPoints) {
    const std::string text = "rank=2,kind=hang,call=1,at=" + std::string(to_string(at));
    const std::optional<Fault> f = parse_fault(text);
    ASSERT_TRUE(f.has_value()) << text;
    EXPECT_EQ(f->kind, FaultKind::kHang) << text;
    EXPECT_EQ(f->hang_at, at) << text;
    EXPECT_TRUE(f->fires(2, 1)) << text;
  }
  EXPECT_EQ(parse_fault("at=scheduler,kind=hang,rank=0")->hang_at, HangPoint::kScheduler);
  EXPECT_EQ(parse_fault("rank=0,kind=stall")->hang_at, HangPoint::kNone);
  EXPECT_EQ(std::size(kHangPoints), 5u);  // a new point needs its name here and a GPU test
}

TEST(Fault, ParsesCallAndStall) {
  const std::optional<Fault> f = parse_fault("rank=3,kind=stall,call=17,ms=250");
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->rank, 3);
  EXPECT_EQ(f->call, 17);
  EXPECT_EQ(f->stall_ms, 250);
  EXPECT_TRUE(f->fires(3, 17));
  EXPECT_FALSE(f->fires(3, 16));
  EXPECT_FALSE(f->fires(3, 18));
  EXPECT_FALSE(f->fires(2, 17));
  EXPECT_FALSE(parse_fault("rank=0,kind=fail_create")->fires(0, 0));  // creation, not a call
}

TEST(Fault, RejectsMalformedTextNamingIt) {
  for (const char* bad : {"rank=1", "kind=skip", "rank=x,kind=skip", "rank=-1,kind=skip", "rank=1,kind=crash",
                          "rank=1,kind=skip,call=", "rank=1,kind=skip,when=2", "rank=1,rank=2,kind=skip",
                          "rank=1,kind=skip,ms=5", "rank=1,kind=skip,", "rank=1 kind=skip", "rank=99999999,kind=skip",
                          "rank=1,kind=hang", "rank=1,kind=hang,at=", "rank=1,kind=hang,at=combine",
                          "rank=1,kind=hang,at=Publish", "rank=1,kind=skip,at=publish",
                          "rank=1,kind=hang,at=publish,ms=5", "rank=1,kind=hang,at=publish,at=dispatch"}) {
    try {
      parse_fault(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << bad;
      EXPECT_EQ(std::string(e.what()).rfind(std::string("EPFUSE_FAULT = '") + bad + "': ", 0), 0u) << e.what();
    }
  }
}

// What a fired fault does on the host, the same for both layers: skip tells the caller to return, stall
// sleeps (its own ms, else the layer's default), throw names the rank, the call and where it stopped.
TEST(Fault, ActsOnTheHost) {
  using std::chrono::milliseconds;
  const auto t0 = std::chrono::steady_clock::now();
  const auto since = [&] { return std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0); };
  EXPECT_TRUE(act_on_fault(*parse_fault("rank=2,kind=skip"), 2, 0, milliseconds(0), "the launch"));
  EXPECT_FALSE(act_on_fault(*parse_fault("rank=2,kind=bad_ids"), 2, 0, milliseconds(0), "the launch"));
  EXPECT_FALSE(act_on_fault(*parse_fault("rank=2,kind=hang,at=dispatch"), 2, 0, milliseconds(0), "the launch"));
  EXPECT_FALSE(act_on_fault(*parse_fault("rank=2,kind=stall"), 2, 0, milliseconds(30), "the launch"));
  EXPECT_GE(since(), milliseconds(30));  // the default applies without ms=
  const auto t1 = since();
  EXPECT_FALSE(act_on_fault(*parse_fault("rank=2,kind=stall,ms=40"), 2, 0, milliseconds(0), "the launch"));
  EXPECT_GE(since() - t1, milliseconds(40));
  try {
    act_on_fault(*parse_fault("rank=2,kind=throw,call=3"), 2, 3, milliseconds(0), "the counts exchange");
    ADD_FAILURE() << "a throw fault returned";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_EQ(std::string(e.what()), "rank 2: EPFUSE_FAULT: throw in forward call 3 (thrown before the counts exchange)");
  }
}

}  // namespace
}  // namespace epfuse::detail
