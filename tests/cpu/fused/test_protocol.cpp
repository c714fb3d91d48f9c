// CPU tests of the fused kernel's protocol arithmetic: epochs, routing/dedup, slot assignment,
// buffer offsets, the expert plan and the task map, all through the EPFUSE_HD functions the kernel
// itself calls (src/device/*.h). The slot-assignment test takes any numbering the layout's ticket
// dispenser may produce, follows dispatch and collect through those functions for every rank, and
// checks against topk_idx alone that every (token, slot) lands on exactly one entry of the right
// expert at its receiver, rows are deduplicated per receiver, and nothing overlaps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "device/protocol/epoch.h"
#include "device/protocol/regions.h"
#include "device/protocol/routing.h"
#include "device/protocol/task_map.h"

namespace epfuse::device {
namespace {

// ---- epochs ----
TEST(FusedEpoch, ParityAlternatesAcrossWrap) {
  uint32_t e = 0xFFFFFFF0u;
  for (int i = 0; i < 40; ++i) {
    const uint32_t n = next_epoch(e);
    EXPECT_NE(epoch_parity(e), epoch_parity(n)) << "epoch " << e;
    e = n;
  }
}

// What a reader at call c finds in the flag of its parity: the epoch of the last call of that parity
// that wrote it (c once this call's sender has written, c - 2 before), or 0 before the parity's first
// use. The truth comes from call indices; the function sees only 32-bit epochs, across the wrap. Calls
// of the other parity (c - 1, c + 1: a peer one call behind or ahead) must not look current either.
TEST(FusedEpoch, FlagIsCurrentExactlyWhenWrittenInThisCall) {
  constexpr int kCalls = 40;
  for (uint32_t first : {1u, 0xFFFFFFF0u, 0xFFFFFFFFu}) {  // a fresh workspace's first epoch; the wrap
    std::vector<uint32_t> epoch{first};
    while (epoch.size() < kCalls) epoch.push_back(next_epoch(epoch.back()));
    for (int reader = 0; reader < kCalls; ++reader) {
      for (int writer = std::max(0, reader - 4); writer <= std::min(kCalls - 1, reader + 1); ++writer) {
        EXPECT_EQ(flag_is_current(epoch[writer], epoch[reader]), writer == reader)
            << "flag of call " << writer << " (epoch " << epoch[writer] << ") read in call " << reader << " (epoch "
            << epoch[reader] << ")";
      }
      if (first == 1u && reader < 2) {  // this parity never written yet
        EXPECT_FALSE(flag_is_current(0u, epoch[reader])) << "call " << reader;
      }
    }
  }
}

// A tagged word carries its whole 32-bit value and is current exactly when its tag is this call's
// epoch, whatever the value (zero, all ones, the epoch itself) and across the wrap; a zeroed word (a
// fresh window) is current in no call.
TEST(FusedEpoch, TaggedWordKeepsItsValueAndIsCurrentOnlyInItsCall) {
  for (uint32_t first : {1u, 0xFFFFFFFEu}) {
    const uint32_t epochs[] = {first, next_epoch(first), next_epoch(next_epoch(first))};
    for (uint32_t value : {0u, 1u, 0x7FFFFFFFu, 0xFFFFFFFFu, first}) {
      for (uint32_t writer : epochs) {
        const uint64_t w = tagged_word(writer, value);
        EXPECT_EQ(word_value(w), value);
        for (uint32_t reader : epochs) EXPECT_EQ(word_is_current(w, reader), writer == reader) << writer << " " << reader;
      }
    }
    EXPECT_FALSE(word_is_current(0u, first));
  }
}

TEST(FusedEpoch, MonotonicCounterAcrossWrap) {
  uint32_t counter = 0xFFFFFF00u, base = counter;
  for (uint32_t expected : {0u, 1u, 300u, 70000u}) {
    for (uint32_t i = 0; i < expected; ++i) {
      EXPECT_FALSE(counter_reached(counter, base, expected));
      counter += 1;
    }
    EXPECT_TRUE(counter_reached(counter, base, expected));
    EXPECT_EQ(counter_progress(counter, base), expected);
    base += expected;
  }
}

// ---- routing ----
TEST(FusedRouting, FirstSlotPerRankDeduplicates) {
  const int E = 16, L = 4;  // 4 ranks
  const std::vector<int32_t> idx = {5, -1, 6, 0, 13, 4, 3, -1};
  // ranks: 1, -, 1, 0, 3, 1, 0, -
  EXPECT_EQ(first_slot_for_rank(idx.data(), 0, E, L), 0);
  EXPECT_EQ(first_slot_for_rank(idx.data(), 1, E, L), -1);
  EXPECT_EQ(first_slot_for_rank(idx.data(), 2, E, L), 0);
  EXPECT_EQ(first_slot_for_rank(idx.data(), 3, E, L), 3);
  EXPECT_EQ(first_slot_for_rank(idx.data(), 4, E, L), 4);
  EXPECT_EQ(first_slot_for_rank(idx.data(), 5, E, L), 0);
  EXPECT_EQ(first_slot_for_rank(idx.data(), 6, E, L), 3);
  EXPECT_EQ(routed_slots(idx.data(), 8, E), 6);
  // The combine's mask: bits of the routed slots only (slots 1 and 7 dropped), a prefix of k slots.
  EXPECT_EQ(routed_slot_mask(idx.data(), 8, E), 0b01111101u);
  EXPECT_EQ(routed_slot_mask(idx.data(), 2, E), 0b01u);
  EXPECT_EQ(routed_slot_mask(idx.data(), 0, E), 0u);
  const std::vector<int32_t> wide(32, E - 1);  // k = 32: the top bit too
  EXPECT_EQ(routed_slot_mask(wide.data(), 32, E), 0xffffffffu);
  // Ticket draws: a pair for every routed slot, a row at the receiver only for the owning slot.
  const std::vector<bool> owns_row = {true, false, false, true, true, false, false, false};
  for (int j = 0; j < 8; ++j) {
    const SlotTickets s = slot_tickets(idx.data(), j, E, L);
    EXPECT_EQ(s.routed, slot_is_routed(idx[j], E)) << "slot " << j;
    EXPECT_EQ(s.owns_row, owns_row[j]) << "slot " << j;
    if (s.routed) {
      EXPECT_EQ(s.pair_expert, idx[j]);
      EXPECT_EQ(s.row_rank, expert_rank(idx[j], L));
    }
  }
  EXPECT_EQ(token_signal_target(idx.data(), 8, E, 7168), 6u * 56u);
  // Tiles of 128 or 256 columns add up to the same target: the home need not know the expert rank's shape.
  EXPECT_EQ(signal_units(256) * (7168 / 256), signal_units(7168));
  EXPECT_EQ(signal_units(128) * (7168 / 128), signal_units(7168));
  EXPECT_TRUE(slot_is_invalid(16, E));
  EXPECT_TRUE(slot_is_invalid(-2, E));
  EXPECT_FALSE(slot_is_invalid(-1, E));
  EXPECT_FALSE(slot_is_routed(-1, E));
}

// ---- the expert plan ----
struct PlanStore {
  std::vector<int> ints;
  ExpertPlan plan;
  PlanStore(const FusedDims& d) : ints(plan_ints(d), -7) { plan = plan_view(ints.data(), d.world, d.local_experts()); }
};

// A plan whose experts have the given m-block counts (block_m 1: one row per m-block).
struct MblockPlan : PlanStore {
  explicit MblockPlan(const std::vector<int>& mblocks)
      : PlanStore(FusedDims{1, 128, 128, static_cast<int>(mblocks.size()), 1, 1 << 20}) {
    std::vector<uint32_t> counts(mblocks.begin(), mblocks.end());
    build_expert_plan(counts.data(), 1, static_cast<int>(mblocks.size()), 1, plan);
  }
};

// ---- the task map ----
TEST(FusedTaskMap, DecodeCoversEveryTaskOnce) {
  for (int tokens : {0, 1, 7, 8, 64, 65, 1000})
  for (int ctas : {1, 132})  // one CTA: 32-token dispatch tasks; 132: 8-token ones and fewer (up to 1000 tokens)
  for (int world : {1, 2}) {
    for (const std::vector<int>& mblocks : {std::vector<int>{0}, {1}, {2, 0, 3}, {0, 0}}) {
      MblockPlan st(mblocks);
      const int L = static_cast<int>(mblocks.size());
      const int total_mb = st.plan.mb_start[L];
      std::vector<int> placed(L);
      const TaskSpace s =
          with_gemm_tasks(make_task_space(tokens, ctas, world), build_gemm_schedule(st.plan, L, 3, 2, 4, placed.data()));
      ASSERT_EQ(s.gemm, total_mb * 5);
      std::map<Phase, std::vector<int>> seen;
      std::set<std::tuple<Phase, int, int>> tiles;
      // Ids run layout, publish, collect, dispatch, GEMM (Linear1 and Linear2 interleaved), combine.
      auto rank = [](Phase p) {
        switch (p) {
          case Phase::kLayout: return 0;
          case Phase::kPublish: return 1;
          case Phase::kCollect: return 2;
          case Phase::kDispatch: return 3;
          case Phase::kLinear1:
          case Phase::kLinear2: return 4;
          case Phase::kCombine: return 5;
          case Phase::kDone: return 6;
        }
        return 7;
      };
      for (int id = 0; id < s.total(); ++id) {
        const Task t = decode_task(s, st.plan, id);
        ASSERT_NE(t.phase, Phase::kDone);
        if (t.phase == Phase::kLinear1 || t.phase == Phase::kLinear2) {
          EXPECT_TRUE(tiles.insert({t.phase, t.tile.mblock, t.tile.nblock}).second) << "tile taken twice";
          EXPECT_LT(t.tile.nblock, t.phase == Phase::kLinear1 ? 3 : 2);
          EXPECT_GE(t.tile.mblock, st.plan.mb_start[t.tile.expert]);
          EXPECT_LT(t.tile.mblock, st.plan.mb_start[t.tile.expert + 1]);
        } else {
          seen[t.phase].push_back(t.index);
        }
        if (id > 0) {
          EXPECT_GE(rank(t.phase), rank(decode_task(s, st.plan, id - 1).phase));
        }
      }
      EXPECT_EQ(static_cast<int>(tiles.size()), total_mb * 5);
      EXPECT_EQ(decode_task(s, st.plan, s.total()).phase, Phase::kDone);
      EXPECT_EQ(decode_task(s, st.plan, s.total() + 5).phase, Phase::kDone);
      auto expect_range = [&](Phase p, int n) {
        std::vector<int> want(n);
        for (int i = 0; i < n; ++i) want[i] = i;
        EXPECT_EQ(seen[p], want) << "phase " << static_cast<int>(p) << " tokens " << tokens;
      };
      expect_range(Phase::kLayout, (tokens + kLayoutTokens - 1) / kLayoutTokens);
      expect_range(Phase::kPublish, 1);
      expect_range(Phase::kDispatch, (tokens + s.dispatch_tokens - 1) / s.dispatch_tokens);
      expect_range(Phase::kCollect, 1);
      expect_range(Phase::kCombine, (tokens + s.combine_tokens - 1) / s.combine_tokens);
    }
  }
}

// Tokens of a dispatch task (dispatch_tokens): 8, 16 or 32, the largest that leaves at least 7/8 of the
// CTAs a task; below 8-token tasks on 7/8 of the CTAs, the smallest power of two down to 1 whose tasks
// stay within a quarter of the CTAs at world 1 and within the CTAs at worlds > 1; never smaller for more
// tokens. The figures: the per-GPU shapes on 132 CTAs (world 2: one token a task up to T = 132, T = 256 at
// 2, 512 at 4; world 1: one up to T = 33, T = 128 at 4; both 1024 at 8, 4096 and 16384 at 32).
TEST(FusedTaskMap, DispatchTokensKeepTheCtasBusy) {
  for (int world : {1, 2, 4}) {
    EXPECT_EQ(dispatch_tokens(1, 132, world), 1);
    EXPECT_EQ(dispatch_tokens(8, 132, world), 1);
    EXPECT_EQ(dispatch_tokens(32, 132, world), 1);
    EXPECT_EQ(dispatch_tokens(1024, 132, world), 8);
    EXPECT_EQ(dispatch_tokens(2048, 132, world), 16);
    EXPECT_EQ(dispatch_tokens(4096, 132, world), 32);
    EXPECT_EQ(dispatch_tokens(16384, 132, world), 32);
  }
  EXPECT_EQ(dispatch_tokens(128, 132, 2), 1);
  EXPECT_EQ(dispatch_tokens(133, 132, 2), 2);
  EXPECT_EQ(dispatch_tokens(256, 132, 2), 2);
  EXPECT_EQ(dispatch_tokens(512, 132, 4), 4);
  EXPECT_EQ(dispatch_tokens(34, 132, 1), 2);
  EXPECT_EQ(dispatch_tokens(128, 132, 1), 4);
  EXPECT_EQ(dispatch_tokens(512, 132, 1), 8);
  for (int world : {1, 2})
  for (int ctas : {1, 2, 33, 66, 132})
    for (int tokens = 0, last = 1; tokens <= 8192; tokens += 1 + tokens / 16) {
      SCOPED_TRACE("tokens " + std::to_string(tokens) + " ctas " + std::to_string(ctas) + " world " + std::to_string(world));
      const int size = dispatch_tokens(tokens, ctas, world), bound = world > 1 ? ctas : std::max(ctas / 4, 1);
      EXPECT_TRUE(size == 1 || size == 2 || size == 4 || size == 8 || size == 16 || size == 32);
      EXPECT_GE(size, last);
      last = size;
      const int tasks = ceil_div(tokens, size);
      if (size > kDispatchTokensMin) {
        EXPECT_GE(tasks, ctas - ctas / 8);
      }
      if (size < kDispatchTokensMax && size >= kDispatchTokensMin) {
        EXPECT_LT(ceil_div(tokens, 2 * size), ctas - ctas / 8);
      }
      if (size < kDispatchTokensMin) {  // within the bound, and the next size up was not
        EXPECT_LE(tasks, bound);
        EXPECT_LE(ceil_div(tokens, 2 * size), bound);
      }
      if (size == kDispatchTokensMin && tokens > 0) {
        EXPECT_GT(ceil_div(tokens, size / 2), bound);
      }
      if (size > 1 && size < kDispatchTokensMin) {
        EXPECT_GT(ceil_div(tokens, size / 2), bound);
      }
      const TaskSpace s = make_task_space(tokens, ctas, world);
      EXPECT_EQ(s.dispatch_tokens, size);
      EXPECT_EQ(s.dispatch, tasks);
    }
}

// Tokens of a combine task (combine_tokens): kCombineTokens, halved at small T down to one while the tasks
// stay within a quarter of the CTAs (at worlds > 1 the dispatch's may take every CTA); never smaller for more tokens.
TEST(FusedTaskMap, CombineTokensGoToMoreCtasAtSmallT) {
  EXPECT_EQ(combine_tokens(1, 132), 1);
  EXPECT_EQ(combine_tokens(8, 132), 1);
  EXPECT_EQ(combine_tokens(32, 132), 1);
  EXPECT_EQ(combine_tokens(128, 132), 4);
  EXPECT_EQ(combine_tokens(4096, 132), kCombineTokens);
  for (int ctas : {1, 2, 33, 66, 132})
    for (int tokens = 0, last = 1; tokens <= 8192; tokens += 1 + tokens / 16) {
      SCOPED_TRACE("tokens " + std::to_string(tokens) + " ctas " + std::to_string(ctas));
      const int size = combine_tokens(tokens, ctas), quarter = std::max(ctas / 4, 1);
      EXPECT_TRUE(size == 1 || size == 2 || size == 4 || size == 8);
      EXPECT_GE(size, last);
      last = size;
      if (size < kCombineTokens) {
        EXPECT_LE(ceil_div(tokens, size), quarter);
      }
      if (size > 1 && tokens > 0) {
        EXPECT_GT(ceil_div(tokens, size / 2), quarter);
      }
      const TaskSpace s = make_task_space(tokens, ctas, 2);
      EXPECT_EQ(s.combine_tokens, size);
      EXPECT_EQ(s.combine, ceil_div(tokens, size));
    }
}

// A dispatch row's column chunks (dispatch_row_chunks, kDispatchChunk): one per row in a task of 8 or more
// tokens; in a smaller task the chunks cover the row's columns once, each starting on a quantiser batch
// (8 steps of 256 columns) and so on a 128-column scale group, the last holding the row's tail.
TEST(FusedDispatch, RowChunksCoverTheColumnsOnceOnScaleGroups) {
  EXPECT_EQ(dispatch_row_chunks(kDispatchTokensMin, 7168), 1);
  EXPECT_EQ(dispatch_row_chunks(kDispatchTokensMax, 7168), 1);
  EXPECT_EQ(dispatch_row_chunks(1, 7168), 4);
  EXPECT_EQ(dispatch_row_chunks(1, 2048), 1);
  EXPECT_EQ(kDispatchChunk % (8 * 256), 0);
  for (int tokens : {1, 2, 4})
    for (int hidden : {64, 128, 192, 2048, 2112, 4096, 7168, 8192}) {
      const int chunks = dispatch_row_chunks(tokens, hidden);
      int covered = 0;
      for (int c = 0; c < chunks; ++c) {
        const ColumnRange cols = dispatch_chunk(c, chunks, hidden);
        const int c0 = cols.first, n = cols.count;
        EXPECT_EQ(c0, covered) << hidden;
        EXPECT_GT(n, 0) << hidden;
        EXPECT_EQ(c0 % 128, 0);
        if (c + 1 < chunks) {
          EXPECT_EQ(n, kDispatchChunk);
        }
        covered += n;
      }
      EXPECT_EQ(covered, hidden);
    }
}

// The dispatch task's row items (dispatch_item): every (token, slot) pair of a task exactly once; and
// at world 1, where every token's row travels with slot 0, a full task's rows land on as many distinct
// warps as there are rows, or on every warp when there are more rows (items go to warps round-robin: item
// q on warp q % warps). Token-major items put them on 3 warps of 12 at top-8.
TEST(FusedDispatch, ItemsCoverEveryPairOnceAndSpreadRowsOverWarps) {
  for (int tokens : {1, 3, kDispatchTokensMin, kDispatchTokensMax})
    for (int k : {1, 2, 8}) {
      std::set<std::pair<int, int>> seen;
      for (int q = 0; q < tokens * k; ++q) {
        const DispatchItem item = dispatch_item(q, tokens);
        ASSERT_GE(item.token, 0);
        ASSERT_LT(item.token, tokens);
        ASSERT_GE(item.slot, 0);
        ASSERT_LT(item.slot, k);
        EXPECT_TRUE(seen.insert({item.token, item.slot}).second) << "tokens " << tokens << " k " << k << " q " << q;
      }
      EXPECT_EQ(static_cast<int>(seen.size()), tokens * k);
    }
  for (int warps : {4, 12}) {  // 12: the warp-specialised kernels' 384 threads
    for (int tokens : {kDispatchTokensMin, kDispatchTokensMax}) {
      std::set<int> row_warps;
      for (int q = 0; q < tokens * 8; ++q)
        if (dispatch_item(q, tokens).slot == 0) row_warps.insert(q % warps);
      EXPECT_EQ(static_cast<int>(row_warps.size()), std::min(tokens, warps)) << warps << " warps, " << tokens << " tokens";
    }
  }
}

// The row items a dispatch pass walks (dispatch_row_items): at worlds > 1 every (token, slot) item of every
// chunk; at world 1 FP8's own-rows pass walks exactly each token's slot-0 item once per column chunk (the
// row each token sends: items q < the count, chunk-major as dispatch.cuh walks them), bf16 and a pass of
// other ranks' rows none.
TEST(FusedDispatch, WorldOneWalksEachTokensSlotZeroOnce) {
  for (int tokens : {1, 3, kDispatchTokensMin, kDispatchTokensMax})
    for (int k : {1, 2, 8})
      for (int hidden : {2048, 7168}) {
        const int chunks = dispatch_row_chunks(tokens, hidden);
        EXPECT_EQ(dispatch_row_items(false, true, true, tokens, tokens * k, chunks), tokens * k * chunks);
        EXPECT_EQ(dispatch_row_items(false, false, false, tokens, tokens * k, chunks), tokens * k * chunks);
        EXPECT_EQ(dispatch_row_items(true, false, true, tokens, tokens * k, chunks), 0);
        EXPECT_EQ(dispatch_row_items(true, true, false, tokens, tokens * k, chunks), 0);
        const int items = dispatch_row_items(true, true, true, tokens, tokens * k, chunks);
        std::set<std::pair<int, int>> rows;  // (token, chunk)
        for (int q = 0; q < items; ++q) {
          const DispatchItem item = dispatch_item(q / chunks, tokens);
          EXPECT_EQ(item.slot, 0) << "tokens " << tokens << " k " << k << " q " << q;
          EXPECT_TRUE(rows.insert({item.token, q % chunks}).second) << "tokens " << tokens << " k " << k << " q " << q;
        }
        EXPECT_EQ(static_cast<int>(rows.size()), tokens * chunks) << "tokens " << tokens << " k " << k;
      }
}

// The world-1 schedule (schedule_lag: kLinear1First, linear1_first_segments) is the lagged steps' with a
// lag past every task, task for task, on plans with experts without rows; worlds > 1 ask for it at a
// decode step's shapes too, and the lag of a wave and a half they ask for otherwise does put Linear2 tiles
// ahead of Linear1 ones.
TEST(FusedSchedule, Linear1FirstIsTheSerialScheduleWithoutLag) {
  std::mt19937 rng(7);
  for (int L : {1, 2, 3, 8, 64}) {
    for (int trial = 0; trial < 6; ++trial) {
      std::vector<int> mblocks(L);
      for (int& m : mblocks) m = rng() % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % 9);
      if (trial == 5) std::fill(mblocks.begin(), mblocks.end(), 0);
      const int nb1 = 1 + static_cast<int>(rng() % 6), nb2 = 1 + static_cast<int>(rng() % 6);
      MblockPlan serial(mblocks), first(mblocks);
      std::vector<int> placed(L);
      const int total = build_gemm_schedule(serial.plan, L, nb1, nb2, 1 << 20, placed.data());
      ASSERT_EQ(build_gemm_schedule(first.plan, L, nb1, nb2, schedule_lag(1, 132, total, 1, 1, true), placed.data()), total);
      ASSERT_EQ(first.plan.seg_start[*first.plan.segments], total);
      // At world 4 a phase of at most a lag's Linear1 tasks asks for the same order, and the lagged pass
      // with the smallest such lag (the Linear1 task count) builds it too.
      const int linear1_tasks = serial.plan.mb_start[L] * nb1;
      if (total > 0) {
        MblockPlan least_lag(mblocks);
        ASSERT_EQ(build_gemm_schedule(least_lag.plan, L, nb1, nb2, linear1_tasks, placed.data()), total);
        for (int i = 0; i < total; ++i) {
          int kind_s = -1, kind_w = -1;
          const GemmTile a = gemm_tile(serial.plan, i, &kind_s), w = gemm_tile(least_lag.plan, i, &kind_w);
          ASSERT_TRUE(kind_w == kind_s && w.expert == a.expert && w.mblock == a.mblock && w.nblock == a.nblock)
              << "L " << L << " task " << i;
        }
      }
      bool in_linear2 = false;
      for (int i = 0; i < total; ++i) {
        int kind_s = -1, kind_p = -1;
        const GemmTile a = gemm_tile(serial.plan, i, &kind_s), b = gemm_tile(first.plan, i, &kind_p);
        ASSERT_EQ(kind_p, kind_s) << "L " << L << " task " << i;
        ASSERT_EQ(b.expert, a.expert) << "L " << L << " task " << i;
        ASSERT_EQ(b.mblock, a.mblock) << "L " << L << " task " << i;
        ASSERT_EQ(b.nblock, a.nblock) << "L " << L << " task " << i;
        EXPECT_FALSE(in_linear2 && kind_p == kSegLinear1) << "a Linear1 tile after a Linear2 one";
        in_linear2 = in_linear2 || kind_p == kSegLinear2;
      }
    }
  }
  // The lag is a wave of CTAs; at world 2 with at most two m-blocks an expert on average, a wave and a
  // half (132 -> 198 Linear1 tasks). A phase of at most the lag's Linear1 tasks takes Linear1 first.
  EXPECT_EQ(schedule_lag(4, 132, 132, 1, 0, true), kLinear1First);
  EXPECT_EQ(schedule_lag(4, 132, 133, 1, 0, true), 132);
  EXPECT_EQ(schedule_lag(4, 132, 64, 6, 32, true), 132);
  EXPECT_EQ(schedule_lag(8, 132, 64, 6, 32, true), 132);
  EXPECT_EQ(schedule_lag(2, 132, 33, 6, 32, true), kLinear1First);  // 198 Linear1 tasks
  EXPECT_EQ(schedule_lag(2, 132, 34, 6, 32, true), 198);
  EXPECT_EQ(schedule_lag(2, 132, 64, 6, 32, true), 198);
  EXPECT_EQ(schedule_lag(2, 133, 64, 6, 32, true), 199);
  EXPECT_EQ(schedule_lag(2, 132, 65, 6, 32, true), 132);            // more than two m-blocks an expert
  EXPECT_EQ(schedule_lag(2, 132, 512, 6, 32, true), 132);
  EXPECT_EQ(schedule_lag(1, 132, 64, 6, 32, true), kLinear1First);
  // qwen3-30b's per-GPU decode shape at world 4 (32 experts of one m-block, 6 and 8 n-blocks, 132 CTAs:
  // 192 Linear1 tasks) asks for the Linear1-first order too; three m-blocks an expert ask for the lag,
  // which puts Linear2 tiles ahead of Linear1 ones.
  EXPECT_EQ(schedule_lag(4, 132, 32, 6, 32, true), kLinear1First);
  EXPECT_EQ(schedule_lag(4, 132, 31, 6, 32, true), kLinear1First);
  ASSERT_EQ(schedule_lag(4, 132, 96, 6, 32, true), 132);
  MblockPlan prefill(std::vector<int>(32, 3));
  std::vector<int> placed(32);
  const int total = build_gemm_schedule(prefill.plan, 32, 6, 8, schedule_lag(4, 132, 96, 6, 32, true), placed.data());
  int last_l1 = -1, first_l2 = total;
  for (int i = 0; i < total; ++i) {
    int kind = -1;
    gemm_tile(prefill.plan, i, &kind);
    if (kind == kSegLinear1) last_l1 = i;
    if (kind == kSegLinear2) first_l2 = std::min(first_l2, i);
  }
  EXPECT_GE(first_l2, 132);
  EXPECT_LT(first_l2, last_l1);
  // The same m-blocks where the GEMMs cover the combine: Linear1 first. Which layers those are: the lag
  // stays for qwen3-30b FP8 (I = 768), not for dsv3 (2048) nor mixtral (14336), nor a bf16 qwen3-30b.
  EXPECT_EQ(schedule_lag(4, 132, 96, 6, 32, false), kLinear1First);
  EXPECT_TRUE(combine_wants_lag(768, true));
  EXPECT_FALSE(combine_wants_lag(2048, true));
  EXPECT_FALSE(combine_wants_lag(14336, true));
  EXPECT_FALSE(combine_wants_lag(768, false));
  EXPECT_TRUE(combine_wants_lag(512, false));
  // EPFUSE_SCHEDULE_LAG's lags: Linear1 first, quarter waves, never below one task.
  EXPECT_EQ(forced_lag(0, 132), kLinear1First);
  EXPECT_EQ(forced_lag(4, 132), 132);
  EXPECT_EQ(forced_lag(2, 132), 66);
  EXPECT_EQ(forced_lag(64, 132), 16 * 132);
  EXPECT_EQ(forced_lag(1, 2), 1);
}

// Linear2's K split (task_map.h linear2_parts, split_part_range, linear2_k_span): the parts of a tile fit the
// slots, none shorter than kSplitMinKBlocks but where there is no split, every part's first k-block a multiple
// of 4 (the FP8 scale groups), the parts in order, non-empty and covering [0, k_blocks) exactly once.
TEST(FusedSplitK, PartsCoverKInAlignedRuns) {
  for (int k_blocks = 1; k_blocks <= 300; ++k_blocks) {
    for (int tiles : {1, 2, 7, 16, 32, 33, 64, 65, 132, 500}) {
      for (int slots : {0, 1, 64, 128, 132}) {
        const int parts = linear2_parts(tiles, k_blocks, slots);
        ASSERT_GE(parts, 1);
        if (parts == 1) {
          const KBlockRange r = split_part_range(k_blocks, 1, 0);
          EXPECT_EQ(r.first, 0);
          EXPECT_EQ(r.count, k_blocks);
          continue;
        }
        EXPECT_LE(tiles * parts, slots) << "k_blocks " << k_blocks << " tiles " << tiles;
        int next = 0;
        for (int part = 0; part < parts; ++part) {
          const KBlockRange r = split_part_range(k_blocks, parts, part);
          EXPECT_EQ(r.first, next) << "k_blocks " << k_blocks << " parts " << parts << " part " << part;
          EXPECT_EQ(r.first % 4, 0);
          EXPECT_GE(r.count, 1);
          EXPECT_GE(r.count, part + 1 < parts ? kSplitMinKBlocks : 1);
          next = r.first + r.count;
        }
        EXPECT_EQ(next, k_blocks) << "k_blocks " << k_blocks << " parts " << parts;
      }
    }
  }
  // The shapes it is for: mixtral's 112 k-blocks (I = 14336) over 32 tiles on 132 CTAs: 4 parts of 28; qwen3-30b's
  // 6 and dsv3's 16 never split.
  EXPECT_EQ(linear2_parts(32, 112, 132), 4);
  EXPECT_EQ(split_part_range(112, 4, 3).first, 84);
  EXPECT_EQ(linear2_parts(64, 112, 132), 2);
  EXPECT_EQ(linear2_parts(1024, 112, 132), 1);
  EXPECT_EQ(linear2_parts(8, 6, 132), 1);
  EXPECT_EQ(linear2_parts(8, 16, 132), 1);
  EXPECT_EQ(linear2_call_parts(2, 16, 14336, 132), 4);  // mixtral's 2 experts x 16 n-blocks of H 4096
  // K elements: the parts of I = 14336 tile it; an I that is not a multiple of kSplitKBlock ends at I.
  for (int I : {14336, 4096, 8192 + 64}) {
    const int kb = (I + kSplitKBlock - 1) / kSplitKBlock, parts = linear2_parts(4, kb, 132);
    int next = 0;
    for (int part = 0; part < parts; ++part) {
      const KSpan k = linear2_k_span(I, parts, part);
      EXPECT_EQ(k.k0, next);
      EXPECT_EQ(k.k0 % (4 * kSplitKBlock), 0);
      next = k.k0 + k.k;
    }
    EXPECT_EQ(next, I);
  }
}

// The schedule of split Linear2 tiles (the collect task's: the unsplit schedule over nblocks2 x parts
// columns, split_column): every (m-block, n-block) of each expert's Linear2 appears with each of its parts
// exactly once, a tile's parts one after another, and the Linear1 tasks as without the split.
TEST(FusedSplitK, ScheduleHoldsEveryPartOnce) {
  std::mt19937 rng(7);
  for (int L : {1, 2, 5}) {
    for (int parts : {1, 2, 4, 7}) {
      for (int lag : {1, 132, kLinear1First}) {
        std::vector<int> mblocks(L);
        for (int& m : mblocks) m = rng() % 4 == 0 ? 0 : 1 + static_cast<int>(rng() % 3);
        MblockPlan split(mblocks), plain(mblocks);
        const int nb1 = 1 + static_cast<int>(rng() % 5), nb2 = 1 + static_cast<int>(rng() % 5);
        std::vector<int> placed(L);
        const int total = build_gemm_schedule(split.plan, L, nb1, nb2 * parts, lag, placed.data());
        const int total1 = build_gemm_schedule(plain.plan, L, nb1, nb2, lag, placed.data());
        ASSERT_EQ(total, split.plan.mb_start[L] * (nb1 + nb2 * parts));
        std::set<std::tuple<int, int, int>> l2;
        std::vector<GemmTile> l1_split, l1_plain;
        SplitColumn prev{};
        int prev_kind = -1;
        for (int i = 0; i < total; ++i) {
          int kind = -1;
          const GemmTile t = gemm_tile(split.plan, i, &kind);
          if (kind == kSegLinear1) {
            l1_split.push_back(t);
            prev_kind = kind;
            continue;
          }
          const SplitColumn c = split_column(t, parts);
          ASSERT_LT(c.tile.nblock, nb2);
          ASSERT_LT(c.part, parts);
          EXPECT_EQ(c.tile.expert, t.expert);
          EXPECT_EQ(c.tile.mblock, t.mblock);
          EXPECT_TRUE(l2.insert({c.tile.mblock, c.tile.nblock, c.part}).second);
          const int mb = split.plan.mb_start[t.expert + 1] - split.plan.mb_start[t.expert];
          if (mb == 1 && prev_kind == kSegLinear2 && prev.tile.expert == t.expert && c.part > 0) {
            EXPECT_EQ(prev.tile.nblock, c.tile.nblock);  // one m-block: a tile's parts are consecutive tasks
            EXPECT_EQ(prev.part, c.part - 1);
          }
          prev = c, prev_kind = kind;
        }
        EXPECT_EQ(static_cast<int>(l2.size()), split.plan.mb_start[L] * nb2 * parts);
        for (int i = 0; i < total1; ++i) {
          int kind = -1;
          const GemmTile t = gemm_tile(plain.plan, i, &kind);
          if (kind == kSegLinear1) l1_plain.push_back(t);
        }
        ASSERT_EQ(l1_split.size(), l1_plain.size());
        for (size_t i = 0; i < l1_split.size(); ++i)
          EXPECT_TRUE(l1_split[i].expert == l1_plain[i].expert && l1_split[i].mblock == l1_plain[i].mblock &&
                      l1_split[i].nblock == l1_plain[i].nblock);
      }
    }
  }
}

// The schedule's promises (task_map.h): a bijection onto the tiles, n-block major within a segment,
// every Linear2 tile after all Linear1 tiles of its expert, Linear2 segments in expert order, each at
// least `lag` Linear1 tasks past the end of its Linear1 or after the last Linear1 segment, and right after
// the first Linear1 segment that puts it there: the one before that ends fewer than `lag` Linear1 tasks
// past it.
TEST(FusedSchedule, BijectiveNblockMajorAndLagged) {
  std::mt19937 rng(99);
  for (int L : {1, 2, 3, 8, 64}) {
    for (int lag : {0, 1, 7, 132, 1 << 20, kLinear1First}) {
      for (int trial = 0; trial < 4; ++trial) {
        std::vector<int> mblocks(L);
        for (int& m : mblocks) m = rng() % 3 == 0 ? 0 : 1 + static_cast<int>(rng() % 9);
        if (trial == 3) std::fill(mblocks.begin(), mblocks.end(), 4);
        MblockPlan st(mblocks);
        const int nb1 = 1 + static_cast<int>(rng() % 6), nb2 = 1 + static_cast<int>(rng() % 6);
        std::vector<int> placed(L);
        const int total = build_gemm_schedule(st.plan, L, nb1, nb2, lag, placed.data());
        ASSERT_EQ(total, st.plan.mb_start[L] * (nb1 + nb2));
        std::set<std::tuple<int, int, int>> tiles;
        std::vector<int> l1_first(L, -1), l1_last(L, -1), l2_first(L, -1);
        std::vector<int> l1_before(total + 1, 0), l1_expert(total, -1);  // Linear1 tasks before task i
        int prev_kind = -1;
        GemmTile prev{};
        for (int i = 0; i < total; ++i) {
          int kind = -1;
          const GemmTile t = gemm_tile(st.plan, i, &kind);
          l1_before[i + 1] = l1_before[i] + (kind == kSegLinear1 ? 1 : 0);
          if (kind == kSegLinear1) {
            l1_expert[i] = t.expert;
            if (l1_first[t.expert] < 0) l1_first[t.expert] = i;
          }
          ASSERT_TRUE(kind == kSegLinear1 || kind == kSegLinear2);
          ASSERT_GE(t.mblock, st.plan.mb_start[t.expert]);
          ASSERT_LT(t.mblock, st.plan.mb_start[t.expert + 1]);
          ASSERT_LT(t.nblock, kind == kSegLinear1 ? nb1 : nb2);
          EXPECT_TRUE(tiles.insert({kind, t.mblock, t.nblock}).second);
          if (kind == kSegLinear1) l1_last[t.expert] = i;
          if (kind == kSegLinear2 && l2_first[t.expert] < 0) {
            l2_first[t.expert] = i;
            EXPECT_GT(i, l1_last[t.expert]) << "Linear2 of expert " << t.expert << " before its Linear1 ended";
          }
          if (kind == kSegLinear2) {
            EXPECT_GE(l1_last[t.expert], 0);
          }
          if (i > 0 && kind == prev_kind && t.expert == prev.expert) {  // n-block major
            const bool next_m = t.nblock == prev.nblock && t.mblock == prev.mblock + 1;
            const bool next_n = t.nblock == prev.nblock + 1 && t.mblock == st.plan.mb_start[t.expert];
            EXPECT_TRUE(next_m || next_n) << "task " << i;
          }
          prev_kind = kind;
          prev = t;
        }
        EXPECT_EQ(static_cast<int>(tiles.size()), total);
        int last_l1_end = 0;
        for (int e = 0; e < L; ++e) last_l1_end = std::max(last_l1_end, l1_last[e] + 1);
        int prev_l2 = -1;
        for (int e = 0; e < L; ++e) {
          if (mblocks[e] == 0) continue;
          const int gap = l2_first[e] - (l1_last[e] + 1);
          const int l1_gap = l1_before[l2_first[e]] - l1_before[l1_last[e] + 1];
          EXPECT_TRUE(l1_gap >= lag || l2_first[e] >= last_l1_end) << "expert " << e << " Linear1 gap " << l1_gap;
          // The Linear1 segment just before it: the earlier one did not end `lag` Linear1 tasks past.
          int q = l2_first[e] - 1;
          while (l1_expert[q] < 0) --q;
          if (l1_expert[q] != e) {
            EXPECT_LT(l1_before[l1_first[l1_expert[q]]] - l1_before[l1_last[e] + 1], lag)
                << "expert " << e << " placed after expert " << l1_expert[q] << "'s Linear1, later than its lag asks";
          }
          if (lag == 0) {
            EXPECT_EQ(gap, 0) << "with no lag Linear2 follows its Linear1";
          }
          EXPECT_GT(l2_first[e], prev_l2) << "Linear2 segments in expert order";
          prev_l2 = l2_first[e];
        }
      }
    }
  }
}


TEST(FusedPlan, EmptyHotAndMixedExperts) {
  const FusedDims d{3, 128, 128, 6, 2, 100};  // L = 2
  PlanStore st(d);
  // counts[src][e]: expert 0 empty; expert 1 gets 5, 0 and 70 rows.
  const std::vector<uint32_t> counts = {0, 5, 0, 0, 0, 70};
  const int mb = build_expert_plan(counts.data(), d.world, 2, 32, st.plan);
  EXPECT_EQ(mb, 3);  // ceil(75 / 32)
  EXPECT_EQ(st.plan.rows[0], 0);
  EXPECT_EQ(st.plan.rows[1], 75);
  EXPECT_EQ(st.plan.mb_start[0], 0);
  EXPECT_EQ(st.plan.mb_start[1], 0);
  EXPECT_EQ(st.plan.mb_start[2], 3);
  // Row 4 comes from sender 0 (its 5th entry of expert 1, after its 0 entries of expert 0); rows 5.. from sender 2.
  RowSource r = row_source(st.plan, d.world, 2, 1, 4);
  EXPECT_EQ(r.src, 0);
  EXPECT_EQ(r.entry, 4);
  r = row_source(st.plan, d.world, 2, 1, 5);
  EXPECT_EQ(r.src, 2);
  EXPECT_EQ(r.entry, 0);
  r = row_source(st.plan, d.world, 2, 1, 74);
  EXPECT_EQ(r.src, 2);
  EXPECT_EQ(r.entry, 69);
}

TEST(FusedPlan, WeightsReadOnceExactlyForOneMblock) {
  const MblockPlan st({0, 1, 2, 1, 5});
  const bool expected[] = {false, true, false, true, false};
  for (int e = 0; e < 5; ++e) EXPECT_EQ(weights_read_once(st.plan, e), expected[e]) << "expert " << e;
}

TEST(FusedPlan, AllEmpty) {
  const FusedDims d{2, 128, 128, 8, 1, 0};
  PlanStore st(d);
  const std::vector<uint32_t> counts(8, 0);
  EXPECT_EQ(build_expert_plan(counts.data(), 2, 4, 64, st.plan), 0);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(st.plan.mb_start[e], 0);
}

TEST(FusedPlan, MblockBoundHolds) {
  std::mt19937 rng(7);
  for (int world : {1, 2, 4, 8}) {
    for (int E : {8, 64, 256}) {
      for (int k : {1, 2, 8}) {
        for (int block_m : {32, 64, 128}) {
          const FusedDims d{world, 128, 128, E, k, 37};
          const int L = E / world;
          // Worst case for m-blocks: every pair on one expert, or spread to maximise padding.
          for (int pattern = 0; pattern < 3; ++pattern) {
            std::vector<uint32_t> counts(world * L, 0);
            const int64_t pairs = d.max_recv_pairs();
            for (int64_t p = 0; p < pairs; ++p) {
              // 1: one pair on each of experts 1..L-1 and the rest on expert 0, the worst case.
              const int e = pattern == 0 ? 0 : pattern == 1 ? (p < L - 1 ? static_cast<int>(p) + 1 : 0) : static_cast<int>(rng() % L);
              counts[(p % world) * L + e] += 1;
            }
            PlanStore st(d);
            const int mb = build_expert_plan(counts.data(), world, L, block_m, st.plan);
            EXPECT_LE(mb, d.max_mblocks(block_m));
            EXPECT_LE(d.max_mblocks(block_m), d.max_mblocks(kMinBlockM));  // l1_done is sized for kMinBlockM
            if (pattern == 1) {
              EXPECT_EQ(mb, d.max_mblocks(block_m)) << "the bound is tight";
            }
            EXPECT_EQ(st.plan.pair_off[L - 1] + st.plan.rows[L - 1], pairs);
          }
        }
      }
    }
  }
}

// The collect task's construction (layout.cuh): plan_expert one expert per thread, plan_prefixes over
// a warp's scan (the decode kernels': each lane sums its chunk of consecutive elements, scan_lane_chunk;
// the lanes' sums scanned by doubling rounds; each lane stores its chunk's sums; the prefill kernels':
// 32 elements a step), then the world-1 schedule
// (linear1_first_segments) and the targets one expert per lane, or the lagged schedule of worlds > 1 on
// one lane. Here the experts go in a random order; the plan must equal, int for int, that of one thread
// in expert order (the prefixes as plan_prefixes computed them before the scans, spelled out below),
// over random counts at worlds 1-8, 1-300 local experts, count strides past L and empty experts.
// WarpScan's doubling rounds of shuffles (layout.cuh inclusive_lanes), lane by lane: each lane's value
// becomes the sum over lanes 0 .. lane.
void inclusive_over_lanes(int (&inclusive)[32]) {
  for (int d = 1; d < 32; d *= 2) {
    int below[32];
    for (int lane = 0; lane < 32; ++lane) below[lane] = inclusive[(lane - d + 32) % 32];
    for (int lane = d; lane < 32; ++lane) inclusive[lane] += below[lane];
  }
}

struct LaneChunkScan {  // WarpScan<true>'s arithmetic (layout.cuh; the decode kernels), lane by lane
  template <class Load, class Store>
  int operator()(int n, Load&& load, Store&& store) const {
    int sum[32], inclusive[32];
    for (int lane = 0; lane < 32; ++lane) {
      const LaneChunk c = scan_lane_chunk(n, lane);
      sum[lane] = 0;
      for (int i = c.begin; i < c.end; ++i) sum[lane] += load(i);
      inclusive[lane] = sum[lane];
    }
    inclusive_over_lanes(inclusive);
    for (int lane = 0; lane < 32; ++lane) {
      const LaneChunk c = scan_lane_chunk(n, lane);
      int run = inclusive[lane] - sum[lane];
      for (int i = c.begin; i < c.end; ++i) {
        const int v = load(i);
        store(i, run);
        run += v;
      }
    }
    return inclusive[31];
  }
};

struct LaneStepScan {  // WarpScan<false>'s arithmetic (the prefill kernels): 32 elements a step
  template <class Load, class Store>
  int operator()(int n, Load&& load, Store&& store) const {
    int carry = 0;
    for (int base = 0; base < n; base += 32) {
      int v[32], inclusive[32];
      for (int lane = 0; lane < 32; ++lane) inclusive[lane] = v[lane] = base + lane < n ? load(base + lane) : 0;
      inclusive_over_lanes(inclusive);
      for (int lane = 0; lane < 32 && base + lane < n; ++lane) store(base + lane, carry + inclusive[lane] - v[lane]);
      carry += inclusive[31];
    }
    return carry;
  }
};

// Every element in exactly one lane's chunk, in lane order, and every chunk at most ceil(n / 32) long.
TEST(FusedPlan, LaneChunksCoverTheScanOnce) {
  for (int n = 0; n <= 1100; ++n) {
    int next = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const LaneChunk c = scan_lane_chunk(n, lane);
      ASSERT_EQ(c.begin, next) << "n " << n << " lane " << lane;
      ASSERT_LE(c.begin, c.end);
      ASSERT_LE(c.end - c.begin, (n + 31) / 32);
      next = c.end;
    }
    ASSERT_EQ(next, n) << "n " << n;
  }
}

TEST(FusedPlan, WarpConstructionIsTheOneThreadPlan) {
  std::mt19937 rng(4242);
  int checked = 0;
  for (int world : {1, 2, 4, 8}) {
    for (int L : {1, 3, 31, 32, 33, 64, 100, 300}) {
      for (int trial = 0; trial < 12; ++trial) {
        const FusedDims d{world, 128, 128, L * world, 8, 1 << 12};
        const int stride = L + static_cast<int>(rng() % 3);
        const int block_m = trial % 3 == 0 ? 64 : 128;
        std::vector<uint32_t> counts(static_cast<size_t>(world) * stride, 0xdeadu);  // past L: never read
        for (int s = 0; s < world; ++s)
          for (int e = 0; e < L; ++e)
            counts[s * stride + e] = rng() % 4 == 0 ? 0 : trial % 2 ? rng() % 3 : rng() % 300;
        std::vector<uint32_t> bases0(L);
        for (uint32_t& b : bases0) b = static_cast<uint32_t>(rng());
        const int nb1 = 1 + static_cast<int>(rng() % 8), nb2 = 1 + static_cast<int>(rng() % 8);
        const int lag = world == 1 ? schedule_lag(1, 132, 0, 1, 1, true) : 1 + static_cast<int>(rng() % 200);

        // One thread, expert order (the collect task before the warp).
        PlanStore one(d);
        std::vector<uint32_t> bases1 = bases0;
        for (int e = 0; e < L; ++e) plan_expert(counts.data(), stride, world, e, block_m, one.plan);
        for (int s = 0; s < world; ++s) {
          int sum = 0;
          for (int e = 0; e < L; ++e) {
            one.plan.entry_off[s * L + e] = sum;
            sum += static_cast<int>(counts[s * stride + e]);
          }
        }
        int pairs = 0, mb1 = 0;
        for (int e = 0; e < L; ++e) {
          const int rows = one.plan.rows[e], mb = one.plan.mb_start[e];
          one.plan.pair_off[e] = pairs;
          one.plan.mb_start[e] = mb1;
          pairs += rows;
          mb1 += mb;
        }
        one.plan.mb_start[L] = mb1;
        std::vector<int> placed(L);
        const int total1 = build_gemm_schedule(one.plan, L, nb1, nb2, lag, placed.data());
        for (int e = 0; e < L; ++e) {
          one.plan.target[e] = bases1[e] + static_cast<uint32_t>(one.plan.rows[e]);
          bases1[e] = one.plan.target[e];
        }

        // The warp's construction, experts in a random order.
        PlanStore warp(d);
        std::vector<uint32_t> bases2 = bases0;
        std::vector<int> order(L);
        for (int e = 0; e < L; ++e) order[e] = e;
        std::shuffle(order.begin(), order.end(), rng);
        for (int e : order) plan_expert(counts.data(), stride, world, e, block_m, warp.plan);
        const int mb2 = plan_prefixes(counts.data(), stride, world, L, warp.plan, LaneChunkScan{});
        ASSERT_EQ(mb2, mb1);
        std::shuffle(order.begin(), order.end(), rng);
        int total2 = 0;
        if (lag == kLinear1First) {
          for (int e : order) linear1_first_segments(warp.plan, L, nb1, nb2, e);
          total2 = warp.plan.seg_start[*warp.plan.segments];
        } else {
          total2 = build_gemm_schedule(warp.plan, L, nb1, nb2, lag, reinterpret_cast<int*>(warp.plan.target));
        }
        ASSERT_EQ(total2, total1);
        for (int e : order) plan_target(warp.plan, bases2.data(), e);

        ASSERT_EQ(warp.ints, one.ints) << "world " << world << ", L " << L << ", trial " << trial;
        ASSERT_EQ(bases2, bases1);
        const auto same_prefixes = [&](const PlanStore& other) {
          for (int i = 0; i < L + 1; ++i) ASSERT_EQ(other.plan.mb_start[i], one.plan.mb_start[i]);
          for (int i = 0; i < world * L; ++i) ASSERT_EQ(other.plan.entry_off[i], one.plan.entry_off[i]);
          for (int i = 0; i < L; ++i) ASSERT_EQ(other.plan.pair_off[i], one.plan.pair_off[i]);
        };
        // The one-thread path of the library (SerialScan) is the same plan too, and so are the prefill
        // kernels' scans by steps of 32.
        PlanStore lib(d);
        ASSERT_EQ(build_expert_plan(counts.data(), stride, world, L, block_m, lib.plan), mb1);
        same_prefixes(lib);
        PlanStore steps(d);
        for (int e = 0; e < L; ++e) plan_expert(counts.data(), stride, world, e, block_m, steps.plan);
        ASSERT_EQ(plan_prefixes(counts.data(), stride, world, L, steps.plan, LaneStepScan{}), mb1);
        same_prefixes(steps);
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 4 * 8 * 12);
}

// ---- regions of the symmetric window and the private workspace ----
TEST(FusedRegions, RegionsAreDisjointAlignedAndInBounds) {
  for (int world : {1, 2, 4, 8}) {
    const FusedDims d{world, 256, 384, 16 * world, 8, 129};
    const SymRegions s = make_sym_regions(d);
    const std::vector<size_t> starts = {s.recv_rows,   s.recv_entries, s.count_words, s.arrivals,
                                        s.combine_rows, s.token_signals, s.total};
    for (size_t i = 0; i + 1 < starts.size(); ++i) {
      EXPECT_LE(starts[i], starts[i + 1]);  // recv_rows is empty at world 1
      EXPECT_EQ(starts[i] % kRegionAlign, 0u);
    }
    // The last element of each region ends at or before the next region.
    const int T = d.max_tokens, L = d.local_experts();
    // Each remote sender's rows at each receiver: disjoint, inside the region, parities apart.
    std::set<size_t> row_starts;
    for (uint32_t p = 0; p < 2; ++p)
      for (int recv = 0; recv < world; ++recv)
        for (int src = 0; src < world; ++src) {
          if (src == recv) continue;
          const size_t first = recv_row_offset(s, d, p, recv, src, 0), last = recv_row_offset(s, d, p, recv, src, T - 1);
          EXPECT_GE(first, s.recv_rows);
          EXPECT_LE(last + d.hidden * 2, s.recv_entries);
          EXPECT_EQ(last - first, static_cast<size_t>(T - 1) * d.hidden * 2);
          if (recv == 0) {
            EXPECT_TRUE(row_starts.insert(first).second) << "two senders share rows";
          }
        }
    EXPECT_EQ(row_starts.size(), static_cast<size_t>(2 * (world - 1)));
    EXPECT_LE(recv_entry_offset(s, d, 1, world - 1, int64_t{T} * d.topk - 1) + sizeof(RowEntry), s.count_words);
    // Count messages: every (parity, sender, word) its own 8-byte aligned word inside the region, the
    // status and layer words after the counts.
    std::set<size_t> word_starts;
    for (uint32_t p = 0; p < 2; ++p)
      for (int src = 0; src < world; ++src)
        for (int j = 0; j < count_words_per_sender(d); ++j) {
          const size_t at = count_word_offset(s, d, p, src, j);
          EXPECT_GE(at, s.count_words);
          EXPECT_LE(at + 8, s.arrivals);
          EXPECT_EQ(at % 8, 0u);
          EXPECT_TRUE(word_starts.insert(at).second) << "two words share bytes";
        }
    EXPECT_EQ(word_starts.size(), static_cast<size_t>(2 * world * (L + 2)));
    EXPECT_EQ(count_status_word(d), L);
    EXPECT_EQ(count_layer_word(d), L + 1);
    EXPECT_LE(arrival_offset(s, d, 1, L - 1) + 4, s.combine_rows);
    EXPECT_LE(combine_row_offset(s, d, 1, T - 1, d.topk - 1) + d.hidden * 2, s.token_signals);
    EXPECT_LE(token_signal_offset(s, d, 1, T - 1) + 4, s.total);
    // Parities never share bytes.
    EXPECT_LE(combine_row_offset(s, d, 0, T - 1, d.topk - 1) + d.hidden * 2, combine_row_offset(s, d, 1, 0, 0));
    // 16-byte stores need 16-byte aligned rows and entries.
    if (world > 1) {
      EXPECT_EQ(recv_row_offset(s, d, 1, 0, world - 1, 3) % 16, 0u);
    }
    EXPECT_EQ(combine_row_offset(s, d, 1, 5, 3) % 16, 0u);
    EXPECT_EQ(recv_entry_offset(s, d, 1, 0, 7) % 16, 0u);

    // Private regions, in order: each holds what regions.h's table says, aligned, before the next.
    const size_t control_bytes = 64;
    const PrivRegions p = make_priv_regions(d, control_bytes);
    const size_t tk = static_cast<size_t>(T) * d.topk;
    const std::vector<std::pair<size_t, size_t>> regions = {  // start, bytes it must hold
        {p.h, static_cast<size_t>(world) * tk * d.intermediate * 2},
        {p.pair_row, tk * 4},
        {p.pair_index, tk * 4},
        {p.row_tickets, static_cast<size_t>(world) * 4},
        {p.pair_tickets, static_cast<size_t>(d.num_experts) * 4},
        {p.counts, static_cast<size_t>(world) * L * 4},
        {p.plan, plan_ints(d) * 4},
        {p.arrival_base, static_cast<size_t>(2 * L) * 4},
        {p.token_base, static_cast<size_t>(2 * T) * 4},
        {p.l1_done, static_cast<size_t>(d.max_mblocks(kMinBlockM)) * 4},
        {p.control, control_bytes}};
    EXPECT_EQ(p.h, 0u);
    for (size_t i = 0; i < regions.size(); ++i) {
      const size_t next = i + 1 < regions.size() ? regions[i + 1].first : p.total;
      EXPECT_EQ(regions[i].first % kRegionAlign, 0u) << "private region " << i;
      EXPECT_LE(regions[i].first + regions[i].second, next) << "private region " << i << " overlaps the next";
    }
  }
}

// plan_view carves the plan's arrays out of plan_ints ints (the two must stay in step): every array
// as long as ExpertPlan documents, none overlapping, the last ending exactly at the end.
TEST(FusedPlan, ViewFitsPlanInts) {
  for (int world : {1, 2, 3, 8}) {
    for (int L : {1, 2, 5, 32}) {
      const FusedDims d{world, 128, 128, world * L, 2, 16};
      std::vector<int> ints(plan_ints(d));
      const ExpertPlan p = plan_view(ints.data(), world, L);
      const int* arrays[] = {p.rows, p.pair_off, p.mb_start, p.src_prefix, p.entry_off,
                             reinterpret_cast<const int*>(p.target), p.segments, p.seg_start, p.seg_code};
      const int lengths[] = {L, L, L + 1, L * (world + 1), world * L, L, 1, 2 * L + 1, 2 * L};
      const int* at = ints.data();
      for (size_t i = 0; i < std::size(arrays); ++i) {
        EXPECT_GE(arrays[i], at) << "array " << i << " overlaps the one before (world " << world << ", L " << L << ")";
        at = arrays[i] + lengths[i];
      }
      EXPECT_EQ(at, ints.data() + ints.size()) << "world " << world << ", L " << L;
    }
  }
}

// ---- layout -> dispatch -> collect, through the shared functions ----
// layout_task (layout.cuh, device code) hands out with its ticket dispenser, per receiver, distinct row
// slots [0, n) to the slots that own a token's row there and copies the owner's row to the token's
// other slots for that receiver; per expert, distinct pair indices [0, n). Which slot draws what is
// slot_tickets (routing.h), which both layout_task and this test call. Which slot gets which number
// depends on scheduling, so the test deals the numbers at random (what the dispenser promises, not
// how it works), then follows dispatch_task and collect_task through the
// shared functions (first_slot_for_rank, expert_rank, exclusive_prefix, build_expert_plan,
// row_source), and checks against routing derived from topk_idx alone that every routed (token, slot)
// lands once at the right expert of the right receiver and each token travels once per receiver.
struct Sim {
  FusedDims d;
  std::vector<std::vector<int32_t>> idx;  // per rank [T_r * k]
  std::vector<int> tokens;
};

// Numbers 0..n-1 in a random order for the n items of each key (the ticket dispenser's promise).
template <class Key>
std::map<std::pair<int, int>, int> deal(const std::map<Key, std::vector<std::pair<int, int>>>& items, std::mt19937& rng) {
  std::map<std::pair<int, int>, int> out;
  for (auto [key, list] : items) {
    std::shuffle(list.begin(), list.end(), rng);
    for (size_t i = 0; i < list.size(); ++i) out[list[i]] = static_cast<int>(i);
  }
  return out;
}

void simulate(const Sim& sim, std::mt19937& rng) {
  const FusedDims& d = sim.d;
  const int R = d.world, k = d.topk, E = d.num_experts, L = d.local_experts();
  // What each receiver holds: entries[receiver][src][entry] = (row, token, slot); rows[receiver][src] = row -> token.
  std::vector<std::vector<std::map<int, std::tuple<int, int, int>>>> entries(R, std::vector<std::map<int, std::tuple<int, int, int>>>(R));
  std::vector<std::vector<std::map<int, int>>> rows(R, std::vector<std::map<int, int>>(R));
  std::vector<std::vector<uint32_t>> counts_at(R, std::vector<uint32_t>(R * L, 0));  // [receiver][src][e]
  for (int src = 0; src < R; ++src) {
    const int T = sim.tokens[src];
    const int32_t* id = sim.idx[src].data();
    // Layout: the owning slots per receiver and the pairs per expert, then numbers dealt to them.
    std::map<int, std::vector<std::pair<int, int>>> owners, pairs;
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) {
        const SlotTickets draws = slot_tickets(id + t * k, j, E, L);  // as layout_task draws
        if (draws.owns_row) owners[draws.row_rank].push_back({t, j});
        if (draws.routed) pairs[draws.pair_expert].push_back({t, j});
      }
    const std::map<std::pair<int, int>, int> owner_row = deal(owners, rng), pair_index = deal(pairs, rng);
    std::vector<uint32_t> row_tickets(R, 0), pair_tickets(E, 0);
    for (const auto& [r, list] : owners) row_tickets[r] = static_cast<uint32_t>(list.size());
    for (const auto& [e, list] : pairs) pair_tickets[e] = static_cast<uint32_t>(list.size());
    // Rows per receiver never exceed T_max; pairs never exceed T_max * k.
    for (int r = 0; r < R; ++r) ASSERT_LE(row_tickets[r], static_cast<uint32_t>(d.max_tokens));
    // Dispatch: entry positions from the sender's own totals.
    std::vector<int> entry_base(E);
    for (int r = 0; r < R; ++r) exclusive_prefix(pair_tickets.data() + r * L, L, entry_base.data() + r * L);
    for (int r = 0; r < R; ++r)
      for (int e = 0; e < L; ++e) counts_at[r][src * L + e] = pair_tickets[r * L + e];
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < k; ++j) {
        const int32_t e = id[t * k + j];
        if (!slot_is_routed(e, E)) continue;
        const int r = expert_rank(e, L);
        // The token's row at r is its owning slot's (layout_task copies it to the other slots).
        const auto owner = owner_row.find({t, first_slot_for_rank(id + t * k, j, E, L)});
        ASSERT_NE(owner, owner_row.end()) << "token " << t << " slot " << j << " has no row at rank " << r;
        const int row = owner->second;
        ASSERT_GE(row, 0);
        ASSERT_LT(row, d.max_tokens);
        auto [it, fresh] = rows[r][src].emplace(row, t);
        ASSERT_EQ(it->second, t) << "row slot " << row << " at rank " << r << " shared by two tokens";
        const int entry = entry_base[e] + pair_index.at({t, j});
        ASSERT_LT(entry, d.max_tokens * k);
        ASSERT_TRUE(entries[r][src].emplace(entry, std::make_tuple(row, t, j)).second) << "entry collision";
        (void)fresh;
      }
    // Dedup: exactly one row per (token, receiver).
    for (int r = 0; r < R; ++r) {
      std::set<int> want;
      for (int t = 0; t < T; ++t)
        for (int j = 0; j < k; ++j)
          if (slot_is_routed(id[t * k + j], E) && expert_rank(id[t * k + j], L) == r) want.insert(t);
      std::set<int> got;
      for (auto& [row, t] : rows[r][src]) got.insert(t);
      EXPECT_EQ(got, want);
      EXPECT_EQ(rows[r][src].size(), want.size());
    }
  }
  // Collect at each receiver: every expert row maps to an entry of that expert, each entry once.
  for (int r = 0; r < R; ++r) {
    PlanStore st(d);
    const int mb = build_expert_plan(counts_at[r].data(), R, L, 32, st.plan);
    ASSERT_LE(mb, d.max_mblocks(32));
    std::set<std::pair<int, int>> used;
    for (int e = 0; e < L; ++e) {
      for (int row = 0; row < st.plan.rows[e]; ++row) {
        const RowSource rs = row_source(st.plan, R, L, e, row);
        const auto it = entries[r][rs.src].find(rs.entry);
        ASSERT_NE(it, entries[r][rs.src].end()) << "row " << row << " of expert " << e << " maps to an unwritten entry";
        const auto [prow, token, slot] = it->second;
        EXPECT_EQ(sim.idx[rs.src][token * k + slot], r * L + e) << "entry of the wrong expert";
        EXPECT_TRUE(used.insert({rs.src, rs.entry}).second);
      }
      EXPECT_EQ(st.plan.mb_start[e + 1] - st.plan.mb_start[e], (st.plan.rows[e] + 31) / 32);
    }
    size_t total = 0;
    for (int s = 0; s < R; ++s) total += entries[r][s].size();
    EXPECT_EQ(used.size(), total) << "some received entries are never computed";
  }
}

enum class Pattern { kUniform, kOneExpert, kDropped, kDuplicates };

Sim make_sim(int world, int E, int k, int T_max, Pattern pattern, std::mt19937& rng) {
  Sim s{FusedDims{world, 128, 128, E, k, T_max}, {}, {}};
  for (int r = 0; r < world; ++r) {
    const int T = (r == 1) ? 0 : static_cast<int>(rng() % (T_max + 1));  // rank 1 has no tokens
    s.tokens.push_back(T);
    std::vector<int32_t> idx(T * k);
    for (int t = 0; t < T; ++t) {
      std::vector<int> perm(E);
      for (int e = 0; e < E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < k; ++j) {
        int32_t e = perm[j % E];
        if (pattern == Pattern::kOneExpert) e = j == 0 ? E - 1 : -1;
        if (pattern == Pattern::kDropped && rng() % 4 == 0) e = -1;
        if (pattern == Pattern::kDropped && t % 5 == 0) e = -1;  // whole tokens dropped
        if (pattern == Pattern::kDuplicates && j > 0 && rng() % 3 == 0) e = idx[t * k];
        idx[t * k + j] = e;
      }
    }
    s.idx.push_back(std::move(idx));
  }
  return s;
}

TEST(FusedSlots, EveryPairLandsOnceAtTheRightExpert) {
  std::mt19937 rng(1234);
  for (int world : {1, 2, 4, 8}) {
    for (int E : {8, 32, 256}) {
      if (E % world != 0) continue;
      for (int k : {1, 2, 4, 8}) {
        if (k > E) continue;
        for (Pattern p : {Pattern::kUniform, Pattern::kOneExpert, Pattern::kDropped, Pattern::kDuplicates}) {
          const Sim s = make_sim(world, E, k, 150, p, rng);
          SCOPED_TRACE(testing::Message() << "world " << world << " E " << E << " k " << k << " pattern "
                                          << static_cast<int>(p));
          simulate(s, rng);
          if (testing::Test::HasFatalFailure()) return;
        }
      }
    }
  }
}

// FP8 activation layouts (regions.h): an FP8 x row (codes, then 16-byte aligned scales) fits a bf16
// recv_rows slot, its scale stride is what the FP8 tile copies (ceil(n/128) rounded up to
// 4 floats), and FP8 h (codes + scales) fits the bf16 h region, also for a smaller layer on a workspace.
TEST(FusedFp8Regions, XRowFitsBf16SlotAndHFitsRegion) {
  for (int H : {256, 512, 768, 2048, 2816, 4096, 7168, 8192}) {
    EXPECT_EQ(fp8_scale_stride(H), ((H + 127) / 128 + 3) / 4 * 4) << H;
    EXPECT_EQ(fp8_x_scale_offset(H) % 16, 0u) << H;
    EXPECT_EQ(fp8_x_row_bytes(H) % 16, 0u) << H;
    EXPECT_GE(4 * fp8_scale_stride(H), 4 * ((H + 127) / 128)) << H;
    EXPECT_LE(fp8_x_row_bytes(H), static_cast<size_t>(H) * 2) << H;
  }
  EXPECT_EQ(fp8_scale_stride(128), 4);
  EXPECT_EQ(fp8_scale_stride(640), 8);
  for (int I : {128, 256, 384, 768, 1408, 2048, 14336})
    for (int world : {1, 2, 8})
      for (int T : {0, 1, 7, 128, 4096}) {
        const FusedDims cap{world, 2048, I, 8 * world, 8, T};
        EXPECT_TRUE(fp8_h_fits(cap, cap)) << I << " " << world << " " << T;
        const FusedDims small{world, 1024, 128, 4 * world, 2, T / 2};
        EXPECT_TRUE(fp8_h_fits(cap, small)) << I << " " << world << " " << T;
        EXPECT_EQ(fp8_x_bytes(cap) % kRegionAlign, 0u);
        EXPECT_GE(fp8_x_bytes(cap), static_cast<size_t>(T) * fp8_x_row_bytes(2048));
      }
}

}  // namespace
}  // namespace epfuse::device
