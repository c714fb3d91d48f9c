// src/common/overlap.h: the byte-range test the front doors use to refuse y aliasing an input.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/overlap.h"

namespace epfuse::detail {
namespace {

TEST(Overlap, SharedBytesOverlapAdjacentOnesDoNot) {
  alignas(16) static char buf[256];
  const ByteRange x{"x", buf, 64};
  EXPECT_TRUE(overlaps(x, {"y", buf, 64}));           // the same rows
  EXPECT_TRUE(overlaps(x, {"y", buf + 63, 1}));       // the last byte
  EXPECT_TRUE(overlaps({"y", buf + 32, 64}, x));      // a partial overlap, either order
  EXPECT_TRUE(overlaps(x, {"y", buf + 16, 8}));       // inside
  EXPECT_FALSE(overlaps(x, {"y", buf + 64, 64}));     // adjacent after
  EXPECT_FALSE(overlaps({"y", buf + 64, 64}, {"x", buf, 64}));
  EXPECT_FALSE(overlaps(x, {"y", buf, 0}));           // empty: no tokens
  EXPECT_FALSE(overlaps(x, {"y", nullptr, 64}));      // null (the pointer checks report it)
}

TEST(Overlap, FirstOverlapNamesTheInput) {
  alignas(16) static char buf[512];
  const ByteRange y{"y", buf + 128, 128};
  const char* hit = first_overlap(y, {{"x", buf, 128}, {"topk_idx", buf + 200, 16}, {"topk_weights", buf + 128, 8}});
  ASSERT_NE(hit, nullptr);
  EXPECT_EQ(std::string(hit), "topk_idx");
  EXPECT_EQ(first_overlap(y, {{"x", buf, 128}, {"topk_idx", buf + 256, 16}}), nullptr);
}

}  // namespace
}  // namespace epfuse::detail
