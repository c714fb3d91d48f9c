// CPU tests of the fused kernel's protocol arithmetic: epochs, routing/dedup, ticket-dispenser slot
// assignment, buffer offsets, the expert plan and the task map. The slot-assignment test simulates
// the kernel's layout -> dispatch -> collect arithmetic for every rank on the CPU with the same
// EPFUSE_HD functions and checks that every (token, slot) lands on exactly one entry of the right
// expert at its receiver, rows are deduplicated per receiver, and nothing overlaps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "device/buffer_layout.h"
#include "device/epoch.h"
#include "device/routing.h"
#include "device/task_map.h"
#include "routing_sim.h"

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

TEST(FusedEpoch, StaleFlagNeverLooksCurrent) {
  // A flag of parity p holds 0 (never written) or the epoch of the previous call of that parity.
  for (uint32_t start : {1u, 2u, 0xFFFFFFFDu, 0xFFFFFFFEu, 0xFFFFFFFFu, 0u}) {
    uint32_t flag[2] = {0, 0};
    uint32_t e = start;
    for (int call = 0; call < 8; ++call) {
      const uint32_t p = epoch_parity(e);
      // Before this call writes, the flag must not read as current (0 only when e == 0 at the very first
      // use, which the host never does: it starts at 1).
      if (!(flag[p] == 0 && e == 0)) {
        EXPECT_FALSE(flag_is_current(flag[p], e)) << "epoch " << e;
      }
      flag[p] = e;
      EXPECT_TRUE(flag_is_current(flag[p], e));
      e = next_epoch(e);
    }
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
TEST(FusedRouting, OwnerSlotPerRankIsTheSmallestExpert) {
  const int E = 16, L = 4;  // 4 ranks
  const std::vector<int32_t> idx = {5, -1, 6, 0, 13, 4, 3, -1};
  // ranks: 1, -, 1, 0, 3, 1, 0, -
  // Owner at a rank: the smallest expert there (rank 1: 4 at slot 5; rank 0: 0 at slot 3; rank 3: slot 4).
  const int want[8] = {5, -1, 5, 3, 4, 5, 3, -1};
  for (int j = 0; j < 8; ++j) EXPECT_EQ(owner_slot_for_rank(idx.data(), 8, j, E, L), want[j]) << "slot " << j;
  // A repeated expert: its first slot owns the row, unless a smaller expert is there.
  const std::vector<int32_t> dup = {2, 2, 3}, dup_small = {2, 2, 1};
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(owner_slot_for_rank(dup.data(), 3, j, 4, 4), 0);
    EXPECT_EQ(owner_slot_for_rank(dup_small.data(), 3, j, 4, 4), 2);
  }
  EXPECT_EQ(routed_slots(idx.data(), 8, E), 6);
  EXPECT_EQ(token_signal_target(idx.data(), 8, E, 7168), 6u * 56u);
  // Tiles of 128 or 256 columns add up to the same target: the home need not know the expert rank's shape.
  EXPECT_EQ(signal_units(256) * (7168 / 256), signal_units(7168));
  EXPECT_EQ(signal_units(128) * (7168 / 128), signal_units(7168));
  EXPECT_TRUE(slot_is_invalid(16, E));
  EXPECT_TRUE(slot_is_invalid(-2, E));
  EXPECT_FALSE(slot_is_invalid(-1, E));
  EXPECT_FALSE(slot_is_routed(-1, E));
}

// ---- the task map ----
TEST(FusedTaskMap, DecodeCoversEveryTaskOnce) {
  // Per group: dispatch tasks and m-blocks (empty groups and experts included).
  const std::vector<std::pair<std::vector<int>, std::vector<int>>> plans = {
      {{2, 0, 3}, {1, 0, 2}}, {{0, 0}, {0, 0}}, {{1}, {4}}, {{0, 2, 0, 1}, {3, 0, 0, 1}}, {{5, 1}, {0, 2}}};
  const int nb1 = 3, nb2 = 2;
  for (int tokens : {0, 1, 7, 8, 64, 65, 1000}) {
    for (const auto& [dispatch, mblocks] : plans) {
      const int L = static_cast<int>(dispatch.size());
      std::vector<int> ds(L + 1, 0), mb(L + 1, 0);
      for (int g = 0; g < L; ++g) {
        ds[g + 1] = ds[g] + dispatch[g];
        mb[g + 1] = mb[g] + mblocks[g];
      }
      const TaskSpace s = with_plan_tasks(make_task_space(tokens), L, ds.data(), mb.data(), nb1, nb2);
      std::map<Phase, std::vector<int>> seen;
      std::vector<int> dispatch_id(ds[L], -1);  // id of each dispatch task
      for (int id = 0; id < s.total(); ++id) {
        const Task t = decode_task(s, id);
        ASSERT_NE(t.phase, Phase::kDone);
        seen[t.phase].push_back(t.index);
        if (t.phase == Phase::kDispatch) dispatch_id[t.index] = id;
        if (t.phase == Phase::kLinear1) {
          // Every dispatch task of the tile's group and of the groups before it has a smaller id.
          const int e = expert_of_mblock(mb.data(), L, tile_of(t.index, nb1).mblock);
          for (int i = 0; i < ds[e + 1]; ++i) EXPECT_GE(dispatch_id[i], 0) << "linear1 of expert " << e << " before dispatch " << i;
        }
        if (id > 0 && t.phase != Phase::kDispatch && t.phase != Phase::kLinear1) {  // the rest in phase order
          EXPECT_GE(static_cast<int>(t.phase), static_cast<int>(decode_task(s, id - 1).phase));
        }
      }
      EXPECT_EQ(decode_task(s, s.total()).phase, Phase::kDone);
      EXPECT_EQ(decode_task(s, s.total() + 5).phase, Phase::kDone);
      auto expect_range = [&](Phase p, int n) {
        std::vector<int> want(n);
        for (int i = 0; i < n; ++i) want[i] = i;
        EXPECT_EQ(seen[p], want) << "phase " << static_cast<int>(p) << " tokens " << tokens;
      };
      expect_range(Phase::kLayout, (tokens + kLayoutTokens - 1) / kLayoutTokens);
      expect_range(Phase::kPublish, 1);
      expect_range(Phase::kCollect, 1);
      expect_range(Phase::kDispatch, ds[L]);
      expect_range(Phase::kLinear1, mb[L] * nb1);
      expect_range(Phase::kLinear2, mb[L] * nb2);
      expect_range(Phase::kCombine, (tokens + kCombineTokens - 1) / kCombineTokens);
      // Static part before the plan: layout, publish, collect.
      EXPECT_EQ(decode_task(make_task_space(tokens), s.static_tasks() - 1).phase, Phase::kCollect);
    }
  }
}

TEST(FusedTaskMap, DispatchGroupsCoverOwnedRows) {
  // owner_tickets [world=3][L=2]
  const std::vector<uint32_t> owned = {3, 0, 20, 16, 0, 1};
  std::vector<int> ds(3);
  EXPECT_EQ(build_dispatch_groups(owned.data(), 3, 2, ds.data()), 2 + 2);  // 23 rows, 17 rows
  EXPECT_EQ(ds[0], 0);
  EXPECT_EQ(ds[1], 2);
  EXPECT_EQ(group_rows(owned.data(), 3, 2, 0), 23);
  EXPECT_EQ(group_rows(owned.data(), 3, 2, 1), 17);
  for (int g = 0; g < 2; ++g) {
    std::vector<int> per_rank(3, 0);
    for (int p = 0; p < group_rows(owned.data(), 3, 2, g); ++p) {
      const OwnedRow o = owned_row(owned.data(), 3, 2, g, p);
      EXPECT_EQ(o.index, per_rank[o.receiver]++);  // receiver-major, in order
    }
    for (int r = 0; r < 3; ++r) EXPECT_EQ(per_rank[r], static_cast<int>(owned[r * 2 + g]));
  }
  EXPECT_EQ(segment_of(ds.data(), 2, 3), 1);
  EXPECT_EQ(segment_of(ds.data(), 2, 0), 0);
}

TEST(FusedTaskMap, TilesAreMblockMajor) {
  EXPECT_EQ(tile_of(0, 4).mblock, 0);
  EXPECT_EQ(tile_of(3, 4).nblock, 3);
  EXPECT_EQ(tile_of(4, 4).mblock, 1);
  EXPECT_EQ(tile_of(4, 4).nblock, 0);
}

// ---- the expert plan ----
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
  for (int m = 0; m < 3; ++m) EXPECT_EQ(expert_of_mblock(st.plan.mb_start, 2, m), 1);
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

// ---- buffer layout ----
TEST(FusedLayout, RegionsAreDisjointAlignedAndInBounds) {
  for (int world : {1, 2, 4, 8}) {
    const FusedDims d{world, 256, 384, 16 * world, 8, 129};
    const SymLayout s = make_sym_layout(d);
    const std::vector<size_t> starts = {s.recv_rows, s.recv_entries, s.count_msgs, s.count_status, s.count_flags,
                                        s.arrivals, s.combine_rows, s.token_signals, s.total};
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
    EXPECT_LE(recv_entry_offset(s, d, 1, world - 1, int64_t{T} * d.topk - 1) + sizeof(RowEntry), s.count_msgs);
    EXPECT_LE(count_msg_offset(s, d, 1, world - 1, L - 1) + 4, s.count_status);
    EXPECT_LE(count_status_offset(s, d, 1, world - 1) + 4, s.count_flags);
    EXPECT_LE(count_flag_offset(s, d, 1, world - 1) + 4, s.arrivals);
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

    const PrivLayout p = make_priv_layout(d, 64);
    EXPECT_EQ(p.h, 0u);
    EXPECT_GE(p.pair_row - p.h, static_cast<size_t>(world) * T * d.topk * d.intermediate * 2);
    EXPECT_GE(p.plan + plan_ints(d) * 4, p.plan);
    EXPECT_LE(p.plan + plan_ints(d) * 4, p.arrival_base);
    EXPECT_GE(p.total - p.control, 64u);
  }
}

// ---- the whole layout -> dispatch -> collect arithmetic, simulated ----
// Mirrors layout_task (simulate_layout), dispatch_task (groups in expert order, owned rows, entry
// positions) and collect_task (plan, row_source) for every rank, in a scrambled order.
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
    const SenderLayout lay = simulate_layout(sim, src, rng);
    // Rows per receiver never exceed T_max; owned rows per expert neither.
    for (int r = 0; r < R; ++r) ASSERT_LE(lay.row_tickets[r], static_cast<uint32_t>(d.max_tokens));
    for (int e = 0; e < E; ++e) ASSERT_LE(lay.owner_tickets[e], static_cast<uint32_t>(d.max_tokens));
    for (int r = 0; r < R; ++r)
      for (int e = 0; e < L; ++e) counts_at[r][src * L + e] = lay.pair_tickets[r * L + e];
    // Dispatch: every task of every group, in a scrambled order, as dispatch_task does it.
    std::vector<int> dispatch_start(L + 1);
    const int tasks = build_dispatch_groups(lay.owner_tickets.data(), R, L, dispatch_start.data());
    std::vector<int> entry_base(E);
    for (int r = 0; r < R; ++r) exclusive_prefix(lay.pair_tickets.data() + r * L, L, entry_base.data() + r * L);
    std::vector<int> task_order(tasks);
    for (int i = 0; i < tasks; ++i) task_order[i] = i;
    std::shuffle(task_order.begin(), task_order.end(), rng);
    std::set<std::pair<int, int>> sent_rows;  // (token, receiver)
    for (int index : task_order) {
      const int g = segment_of(dispatch_start.data(), L, index);
      const int p0 = (index - dispatch_start[g]) * kDispatchRows;
      const int p1 = std::min(p0 + kDispatchRows, group_rows(lay.owner_tickets.data(), R, L, g));
      ASSERT_LT(p0, p1) << "an empty dispatch task";
      for (int p = p0; p < p1; ++p) {
        const OwnedRow own = owned_row(lay.owner_tickets.data(), R, L, g, p);
        ASSERT_LT(own.index, static_cast<int>(lay.owner_tickets[own.receiver * L + g]));
        const int r = own.receiver;
        const int t = lay.dispatch_order[static_cast<size_t>(r * L + g) * d.max_tokens + own.index];
        ASSERT_GE(t, 0) << "unlisted owned row";
        ASSERT_LT(t, T);
        ASSERT_TRUE(sent_rows.insert({t, r}).second) << "token " << t << " sent twice to rank " << r;
        int row = -1;
        for (int j = 0; j < k; ++j)
          if (id[t * k + j] == r * L + g) {
            row = lay.pair_row[t * k + j];
            break;
          }
        ASSERT_GE(row, 0);
        ASSERT_LT(row, d.max_tokens);
        auto [it, fresh] = rows[r][src].emplace(row, t);
        ASSERT_EQ(it->second, t) << "row slot " << row << " at rank " << r << " shared by two tokens";
        (void)fresh;
        for (int j = 0; j < k; ++j) {
          const int32_t e = id[t * k + j];
          if (!slot_is_routed(e, E) || expert_rank(e, L) != r) continue;
          // Expert order: the pair goes out with a group no later than its own expert's.
          EXPECT_LE(g, expert_local(e, L)) << "pair of local expert " << expert_local(e, L) << " sent in group " << g;
          EXPECT_EQ(lay.pair_row[t * k + j], row);
          const int entry = entry_base[e] + lay.pair_index[t * k + j];
          ASSERT_LT(entry, d.max_tokens * k);
          ASSERT_TRUE(entries[r][src].emplace(entry, std::make_tuple(row, t, j)).second) << "entry collision";
        }
      }
    }
    // Every routed pair was sent exactly once (entries are unique above; count them).
    size_t routed = 0, written = 0;
    for (int i = 0; i < T * k; ++i) routed += slot_is_routed(id[i], E) ? 1 : 0;
    for (int r = 0; r < R; ++r) written += entries[r][src].size();
    EXPECT_EQ(written, routed);
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
      for (int m = st.plan.mb_start[e]; m < st.plan.mb_start[e + 1]; ++m) {
        EXPECT_EQ(expert_of_mblock(st.plan.mb_start, L, m), e);
      }
    }
    size_t total = 0;
    for (int s = 0; s < R; ++s) total += entries[r][s].size();
    EXPECT_EQ(used.size(), total) << "some received entries are never computed";
  }
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

}  // namespace
}  // namespace epfuse::device
