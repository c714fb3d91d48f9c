// The FP8 unfused chain's host arithmetic: the activation-scale layouts and row padding cuBLASLt reads
// (fp8_layout.h). The weights' block-scale layout and checks are tests/cpu/weights'.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "common/fp8.h"
#include "epfuse/error.h"
#include "unfused/fp8_layout.h"

namespace epfuse::unfused {
namespace {

TEST(Fp8Layout, PaddedRows) {
  EXPECT_EQ(fp8_layout::kFp8GemmRowAlign, 16);
  EXPECT_EQ(fp8_layout::padded_rows(0), 0);
  EXPECT_EQ(fp8_layout::padded_rows(1), 16);
  EXPECT_EQ(fp8_layout::padded_rows(7), 16);
  EXPECT_EQ(fp8_layout::padded_rows(15), 16);
  EXPECT_EQ(fp8_layout::padded_rows(16), 16);
  EXPECT_EQ(fp8_layout::padded_rows(17), 32);
  EXPECT_EQ(fp8_layout::padded_rows(27), 32);
  EXPECT_EQ(fp8_layout::padded_rows(128), 128);
  EXPECT_EQ(fp8_layout::padded_rows(955), 960);
  for (int n = 0; n < 1000; ++n) {
    const int p = fp8_layout::padded_rows(n);
    EXPECT_EQ(p % 16, 0) << n;
    EXPECT_GE(p, n);
    EXPECT_LT(p - n, 16) << n;
  }
}

// Every split of at most max_rows rows over the experts fits padded_row_capacity, and the bound is met
// (one row per expert).
TEST(Fp8Layout, PaddedRowCapacityBoundsEverySplit) {
  EXPECT_EQ(fp8_layout::padded_row_capacity(0, 4), 0);
  EXPECT_EQ(fp8_layout::padded_row_capacity(1, 4), 16);
  EXPECT_EQ(fp8_layout::padded_row_capacity(4, 4), 64);
  EXPECT_EQ(fp8_layout::padded_row_capacity(100, 4), 160);
  EXPECT_EQ(fp8_layout::padded_row_capacity(int64_t{1} << 30, 256), (int64_t{1} << 30) + 256 * 15);
  for (int experts = 1; experts <= 4; ++experts)
    for (int max_rows = 0; max_rows <= 40; ++max_rows) {
      int64_t worst = 0;
      std::vector<int> rows(experts, 0);
      // Every rows vector with entries in [0, max_rows] and sum <= max_rows (odometer).
      while (true) {
        int sum = 0;
        int64_t padded = 0;
        for (int r : rows) {
          sum += r;
          padded += fp8_layout::padded_rows(r);
        }
        if (sum <= max_rows) worst = std::max(worst, padded);
        int e = 0;
        while (e < experts && ++rows[e] > max_rows) rows[e++] = 0;
        if (e == experts) break;
      }
      EXPECT_LE(worst, fp8_layout::padded_row_capacity(max_rows, experts)) << experts << " " << max_rows;
      if (max_rows <= experts) {
        EXPECT_EQ(worst, fp8_layout::padded_row_capacity(max_rows, experts));
      }
    }
}

// The row map: real rows [expert_first[e], +rows[e]), GEMM rows [padded_first[e], +padded_rows(rows[e])),
// every real row at one padded row of its expert and back, the padding rows marked -1.
TEST(Fp8Layout, RowMapPadsEveryExpertTo16) {
  const std::vector<int> rows = {0, 1, 7, 0, 16, 27, 128, 3, 0};
  const int experts = static_cast<int>(rows.size());
  std::vector<int32_t> first(experts + 1), padded(experts + 1);
  fp8_layout::fill_row_map(rows.data(), experts, first.data(), padded.data());
  EXPECT_EQ(first, (std::vector<int32_t>{0, 0, 1, 8, 8, 24, 51, 179, 182, 182}));
  EXPECT_EQ(padded, (std::vector<int32_t>{0, 0, 16, 32, 32, 48, 80, 208, 224, 224}));
  EXPECT_EQ(first.back(), 182);
  std::vector<int> real_seen(first.back(), 0);
  for (int64_t p = 0; p < padded.back(); ++p) {
    const fp8_layout::PaddedRow r = fp8_layout::padded_row(first.data(), padded.data(), experts, p);
    ASSERT_GE(r.expert, 0);
    ASSERT_LT(r.expert, experts);
    EXPECT_GT(rows[r.expert], 0) << "padded row " << p << " in empty expert " << r.expert;
    EXPECT_EQ(r.local, p - padded[r.expert]);
    EXPECT_EQ(r.gemm_rows, fp8_layout::padded_rows(rows[r.expert]));
    EXPECT_LT(r.local, r.gemm_rows);
    if (r.local < rows[r.expert]) {
      EXPECT_EQ(r.real, first[r.expert] + r.local) << p;
      ++real_seen[r.real];
      EXPECT_EQ(fp8_layout::padded_row_of(first.data(), padded.data(), experts, r.real), p);
    } else {
      EXPECT_EQ(r.real, -1) << p;
    }
  }
  for (size_t i = 0; i < real_seen.size(); ++i) EXPECT_EQ(real_seen[i], 1) << "real row " << i;
  // Every real row's padded row: strictly increasing, inside its expert's GEMM rows.
  int64_t last = -1;
  for (int64_t real = 0; real < first.back(); ++real) {
    const int64_t p = fp8_layout::padded_row_of(first.data(), padded.data(), experts, real);
    EXPECT_GT(p, last);
    last = p;
    const int e = fp8_layout::expert_of_row(first.data(), experts, real);
    EXPECT_GE(p, padded[e]);
    EXPECT_LT(p, padded[e] + rows[e]);
  }
}

TEST(Fp8Layout, ExpertOfRowSkipsEmptyExperts) {
  const std::vector<int32_t> first = {0, 0, 16, 16, 16, 48};  // experts 0, 2, 3 empty
  EXPECT_EQ(fp8_layout::expert_of_row(first.data(), 5, 0), 1);
  EXPECT_EQ(fp8_layout::expert_of_row(first.data(), 5, 15), 1);
  EXPECT_EQ(fp8_layout::expert_of_row(first.data(), 5, 16), 4);
  EXPECT_EQ(fp8_layout::expert_of_row(first.data(), 5, 47), 4);
  const std::vector<int32_t> one = {0, 5};
  EXPECT_EQ(fp8_layout::expert_of_row(one.data(), 1, 4), 0);
}

// Each expert's activation scales: [ceil(k/128), padded rows] token-fastest with leading dimension the
// GEMM's (padded) row count, regions packed at act_scale_start(padded_first, k), 16-byte aligned and
// disjoint, every (expert, padded row, k-block) a distinct float inside the buffer the layer allocates.
TEST(Fp8Layout, ActivationScaleRegionsArePaddedAlignedAndDisjoint) {
  const std::vector<int> rows = {0, 1, 7, 3, 128, 0, 5, 27, 16};
  const int experts = static_cast<int>(rows.size());
  std::vector<int32_t> first(experts + 1), padded(experts + 1);
  fp8_layout::fill_row_map(rows.data(), experts, first.data(), padded.data());
  for (int k : {128, 192, 256, 768, 2880}) {
    const int kb_count = fp8::num_blocks(k);
    const int64_t buffer = fp8_layout::act_scale_start(padded.back(), k);
    EXPECT_EQ(buffer, int64_t{padded.back()} * kb_count);
    std::set<int64_t> used;
    int64_t start = 0;
    for (int e = 0; e < experts; ++e) {
      EXPECT_EQ(start, fp8_layout::act_scale_start(padded[e], k)) << "k=" << k << " expert " << e;
      EXPECT_EQ(start % 4, 0) << "k=" << k;
      const int n = fp8_layout::padded_rows(rows[e]);
      EXPECT_EQ(fp8_layout::act_scale_region(rows[e], k), int64_t{n} * kb_count);
      for (int row = 0; row < n; ++row)
        for (int kb = 0; kb < kb_count; ++kb) {
          const int64_t at = fp8_layout::act_scale_offset(start, n, row, kb);
          EXPECT_GE(at, start);
          EXPECT_LT(at, start + fp8_layout::act_scale_region(rows[e], k));
          EXPECT_LT(at, buffer);
          EXPECT_TRUE(used.insert(at).second) << "k=" << k << " row " << row << " kb " << kb;
          if (kb > 0) {
            EXPECT_EQ(at - fp8_layout::act_scale_offset(start, n, row, kb - 1), n);  // ld = padded n
          }
        }
      if (n > 0) {
        EXPECT_EQ(fp8_layout::act_scale_offset(start, n, n - 1, 0), start + n - 1);  // token fastest
      }
      start += fp8_layout::act_scale_region(rows[e], k);
    }
    EXPECT_EQ(start, buffer);
    EXPECT_EQ(static_cast<int64_t>(used.size()), buffer);  // dense: every float of the buffer is a scale
  }
}

}  // namespace
}  // namespace epfuse::unfused
