// CPU simulation of the fused kernel's schedule over all ranks: CTAs take task ids in order
// (decode_task: dispatch groups interleaved with Linear1 in expert order), block in the kernel's waits
// (layout done, every sender's counts, the plan, an expert's arrivals, an m-block's Linear1 tiles, a
// token's combine signals) and move in a random interleaving. Dispatch tasks write entries where
// dispatch_task does (simulate_layout's tickets); a tile that reads an unwritten entry fails. Linear2 tiles hold their combine signals as the kernel does: released after the CTA's
// next Linear2 wait and mainloop, or before any task that may_hold_signals_into refuses. Each rank
// picks its own tile shape (the home cannot know it). Checks: every run ends (no deadlock); a token's
// counter never passes its target and reaches it only when every routed slot's columns are stored.
// A negative case shows the simulation does find the deadlock of a wrong hold rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <random>
#include <utility>
#include <vector>

#include "device/routing.h"
#include "device/task_map.h"
#include "routing_sim.h"

namespace epfuse::device {
namespace {

struct Shape {
  int block_m, block_n;
};
constexpr Shape kShapes[] = {{32, 128}, {128, 128}, {128, 256}};

using HoldRule = bool (*)(Phase);

class ScheduleSim {
 public:
  ScheduleSim(const Sim& sim, const std::vector<Shape>& shapes, int ctas_per_rank, HoldRule rule, std::mt19937& rng)
      : d_(sim.d), L_(sim.d.local_experts()), rule_(rule) {
    const int R = d_.world;
    ranks_.reserve(R);  // Rank's plan points into its own storage: never copied
    for (int r = 0; r < R; ++r) ranks_.emplace_back(sim, shapes[r], r, simulate_layout(sim, r, rng));
    for (int s = 0; s < R; ++s) {
      Rank& sender = ranks_[s];
      for (int r = 0; r < R; ++r) exclusive_prefix(sender.lay.pair_tickets.data() + r * L_, L_, sender.entry_base.data() + r * L_);
      for (int r = 0; r < R; ++r) {
        uint32_t pairs = 0;
        for (int e = 0; e < L_; ++e) pairs += sender.lay.pair_tickets[r * L_ + e];
        ranks_[r].entries[s].assign(pairs, {-1, -1});  // unwritten
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < ctas_per_rank; ++i) ctas_.emplace_back(r);
  }

  // Runs until every CTA has taken kDone; false when no CTA can move before that (deadlock).
  bool run(std::mt19937& rng) {
    for (;;) {
      std::vector<Cta*> ready;
      bool all_done = true;
      for (Cta& c : ctas_) {
        all_done = all_done && c.state == State::kFinished;
        if (is_ready(c)) ready.push_back(&c);
      }
      if (all_done) return true;
      if (ready.empty()) return false;
      advance(*ready[rng() % ready.size()]);
      if (testing::Test::HasFatalFailure()) return true;
    }
  }

  // After a run that ended: every token complete, every slot stored once per column, nothing held.
  void check_complete() const {
    const int k = d_.topk, units = static_cast<int>(signal_units(d_.hidden));
    for (const Rank& rk : ranks_) {
      for (int t = 0; t < rk.T; ++t) {
        EXPECT_EQ(rk.token_signal[t], target(rk, t)) << "token " << t;
        for (int j = 0; j < k; ++j)
          EXPECT_EQ(rk.stored[t * k + j], slot_is_routed(rk.idx[t * k + j], d_.num_experts) ? units : 0);
      }
    }
    for (const Cta& c : ctas_) EXPECT_TRUE(c.held.empty());
  }

 private:
  enum class State { kIdle, kTaken, kWaiting, kFinished };
  struct Cta {
    explicit Cta(int r) : rank(r) {}
    int rank;
    State state = State::kIdle;
    int id = -1;
    Task task{Phase::kDone, 0};
    std::vector<std::pair<int, int>> held;  // (home, token) of the last Linear2 tile's rows
    uint32_t held_units = 0;
  };
  struct Rank {
    int T;
    const int32_t* idx;
    Shape shape;
    int nblocks1, nblocks2;
    TaskSpace space;
    int next_id = 0, layout_done = 0, mblocks = 0;
    bool have_plan = false;
    SenderLayout lay;                                          // what layout_task left
    std::vector<int> entry_base;                               // [world][L] my first entry per expert
    std::vector<char> flag;                                    // [src] count message current
    std::vector<uint32_t> counts;                              // [src][L] as received
    std::vector<int> arrivals, l1_done;                        // [L], [m-blocks]
    std::vector<uint32_t> token_signal;                        // [T]
    std::vector<int> stored;                                   // [T][k] 128-column units stored at home
    std::vector<std::vector<std::pair<int, int>>> entries;     // [src] entry -> (token, slot)
    PlanStore plan;
    Rank(const Sim& sim, Shape s, int r, SenderLayout layout)
        : T(sim.tokens[r]), idx(sim.idx[r].data()), shape(s), nblocks1(2 * sim.d.intermediate / s.block_n),
          nblocks2(sim.d.hidden / s.block_n), space(make_task_space(sim.tokens[r])), lay(std::move(layout)),
          entry_base(sim.d.num_experts, 0), flag(sim.d.world, 0), counts(sim.d.num_experts, 0),
          arrivals(sim.d.local_experts(), 0), token_signal(sim.tokens[r], 0), stored(sim.tokens[r] * sim.d.topk, 0),
          entries(sim.d.world), plan(sim.d) {}
  };

  uint32_t target(const Rank& rk, int t) const {
    return token_signal_target(rk.idx + t * d_.topk, d_.topk, d_.num_experts, d_.hidden);
  }

  bool is_ready(const Cta& c) const {
    const Rank& rk = ranks_[c.rank];
    switch (c.state) {
      case State::kIdle: return true;
      case State::kTaken: return c.id < rk.space.static_tasks() || rk.have_plan;  // the scheduler's plan wait
      case State::kWaiting: return wait_met(rk, c.task);
      case State::kFinished: return false;
    }
    return false;
  }

  bool wait_met(const Rank& rk, const Task& task) const {
    switch (task.phase) {
      case Phase::kPublish: return rk.layout_done == rk.space.layout;
      case Phase::kCollect:
        for (char f : rk.flag)
          if (!f) return false;
        return true;
      case Phase::kLinear1: {
        const int e = expert_of_mblock(rk.plan.plan.mb_start, L_, tile_of(task.index, rk.nblocks1).mblock);
        return rk.arrivals[e] == rk.plan.plan.rows[e];
      }
      case Phase::kLinear2: return rk.l1_done[tile_of(task.index, rk.nblocks2).mblock] == rk.nblocks1;
      case Phase::kCombine:
        for (int t = task.index * kCombineTokens; t < std::min(rk.T, (task.index + 1) * kCombineTokens); ++t)
          if (rk.token_signal[t] != target(rk, t)) return false;
        return true;
      default: return true;
    }
  }

  void release(Cta& c) {
    for (const auto& [home, token] : c.held) {
      Rank& h = ranks_[home];
      h.token_signal[token] += c.held_units;
      EXPECT_LE(h.token_signal[token], target(h, token)) << "token " << token << " of rank " << home << " over-signalled";
    }
    c.held.clear();
  }

  void advance(Cta& c) {
    Rank& rk = ranks_[c.rank];
    switch (c.state) {
      case State::kIdle:
        c.id = rk.next_id++;
        c.state = State::kTaken;
        return;
      case State::kTaken:
        c.task = decode_task(rk.space, c.id);
        if (!rule_(c.task.phase)) release(c);
        c.state = c.task.phase == Phase::kDone ? State::kFinished : State::kWaiting;
        return;
      case State::kWaiting:
        run_task(c, rk);
        c.state = State::kIdle;
        return;
      case State::kFinished: return;
    }
  }

  void run_task(Cta& c, Rank& rk) {
    const int k = d_.topk, r = c.rank;
    const Task& task = c.task;
    switch (task.phase) {
      case Phase::kLayout: ++rk.layout_done; break;
      case Phase::kPublish:
        for (int dst = 0; dst < d_.world; ++dst) {
          for (int e = 0; e < L_; ++e) ranks_[dst].counts[r * L_ + e] = rk.lay.pair_tickets[dst * L_ + e];
          ranks_[dst].flag[r] = 1;
        }
        break;
      case Phase::kDispatch: {
        // As dispatch_task: the task's owned rows, each with the entries of all its pairs there.
        const int g = segment_of(rk.plan.plan.dispatch_start, L_, task.index);
        const int p0 = (task.index - rk.plan.plan.dispatch_start[g]) * kDispatchRows;
        const int p1 = std::min(p0 + kDispatchRows, group_rows(rk.lay.owner_tickets.data(), d_.world, L_, g));
        for (int p = p0; p < p1; ++p) {
          const OwnedRow own = owned_row(rk.lay.owner_tickets.data(), d_.world, L_, g, p);
          const int dst = own.receiver;
          const int t = rk.lay.dispatch_order[static_cast<size_t>(dst * L_ + g) * d_.max_tokens + own.index];
          ASSERT_GE(t, 0);
          for (int j = 0; j < k; ++j) {
            const int32_t e = rk.idx[t * k + j];
            if (!slot_is_routed(e, d_.num_experts) || expert_rank(e, L_) != dst) continue;
            auto& slot = ranks_[dst].entries[r][rk.entry_base[e] + rk.lay.pair_index[t * k + j]];
            EXPECT_EQ(slot.first, -1) << "entry written twice";
            slot = {t, j};
            ++ranks_[dst].arrivals[expert_local(e, L_)];
          }
        }
        break;
      }
      case Phase::kCollect:
        rk.mblocks = build_expert_plan(rk.counts.data(), d_.world, L_, rk.shape.block_m, rk.plan.plan);
        build_dispatch_groups(rk.lay.owner_tickets.data(), d_.world, L_, rk.plan.plan.dispatch_start);
        rk.space = with_plan_tasks(rk.space, L_, rk.plan.plan.dispatch_start, rk.plan.plan.mb_start, rk.nblocks1,
                                   rk.nblocks2);
        rk.l1_done.assign(rk.mblocks, 0);
        rk.have_plan = true;
        break;
      case Phase::kLinear1: {
        // The tile gathers its rows through their entries: all must be written by now.
        const Tile tile = tile_of(task.index, rk.nblocks1);
        const int e = expert_of_mblock(rk.plan.plan.mb_start, L_, tile.mblock);
        const int row0 = (tile.mblock - rk.plan.plan.mb_start[e]) * rk.shape.block_m;
        for (int i = row0; i < std::min(row0 + rk.shape.block_m, rk.plan.plan.rows[e]); ++i) {
          const RowSource src = row_source(rk.plan.plan, d_.world, L_, e, i);
          ASSERT_LT(src.entry, static_cast<int>(rk.entries[src.src].size()));
          EXPECT_GE(rk.entries[src.src][src.entry].first, 0) << "linear1 reads an unwritten entry";
        }
        ++rk.l1_done[tile.mblock];
        break;
      }
      case Phase::kLinear2: {
        const Tile tile = tile_of(task.index, rk.nblocks2);
        const int e = expert_of_mblock(rk.plan.plan.mb_start, L_, tile.mblock);
        const int row0 = (tile.mblock - rk.plan.plan.mb_start[e]) * rk.shape.block_m;
        const int rows = std::min(rk.shape.block_m, rk.plan.plan.rows[e] - row0);
        release(c);  // the previous tile's signals, after this tile's mainloop
        for (int i = 0; i < rows; ++i) {
          const RowSource src = row_source(rk.plan.plan, d_.world, L_, e, row0 + i);
          ASSERT_LT(src.entry, static_cast<int>(rk.entries[src.src].size()));
          const auto [token, slot] = rk.entries[src.src][src.entry];
          ASSERT_GE(token, 0);
          ranks_[src.src].stored[token * k + slot] += static_cast<int>(signal_units(rk.shape.block_n));
          c.held.push_back({src.src, token});
        }
        c.held_units = signal_units(rk.shape.block_n);
        break;
      }
      case Phase::kCombine:
        // The home reads a token's slots once its counter is complete: they must all be stored.
        for (int t = task.index * kCombineTokens; t < std::min(rk.T, (task.index + 1) * kCombineTokens); ++t)
          for (int j = 0; j < k; ++j)
            EXPECT_EQ(rk.stored[t * k + j],
                      slot_is_routed(rk.idx[t * k + j], d_.num_experts) ? static_cast<int>(signal_units(d_.hidden)) : 0)
                << "rank " << r << " token " << t << " slot " << j << " read before all its columns arrived";
        break;
      default: break;
    }
  }

  FusedDims d_;
  int L_;
  HoldRule rule_;
  std::vector<Rank> ranks_;
  std::vector<Cta> ctas_;
};

Sim schedule_sim(int world, int E, int k, Pattern p, std::mt19937& rng) {
  Sim s = make_sim(world, E, k, 40, p, rng);
  s.d.hidden = 512;        // 4 signal units; 128- and 256-column tiles
  s.d.intermediate = 256;  // Linear1: 2I = 512
  return s;
}

TEST(FusedSchedule, HoldingSignalsIntoLinear2Only) {
  EXPECT_TRUE(may_hold_signals_into(Phase::kLinear2));
  for (Phase p : {Phase::kLayout, Phase::kPublish, Phase::kDispatch, Phase::kCollect, Phase::kLinear1,
                  Phase::kCombine, Phase::kDone})
    EXPECT_FALSE(may_hold_signals_into(p));
}

TEST(FusedSchedule, EveryInterleavingCompletes) {
  std::mt19937 rng(77);
  for (int world : {1, 2, 4, 8}) {
    for (int E : {8, 32}) {
      for (int k : {1, 2, 4, 8}) {
        if (k > E) continue;
        for (Pattern p : {Pattern::kUniform, Pattern::kOneExpert, Pattern::kDropped, Pattern::kDuplicates}) {
          for (int ctas : {1, 2, 5}) {
            const Sim s = schedule_sim(world, E, k, p, rng);
            std::vector<Shape> shapes;
            for (int r = 0; r < world; ++r) shapes.push_back(kShapes[rng() % std::size(kShapes)]);
            SCOPED_TRACE(testing::Message() << "world " << world << " E " << E << " k " << k << " pattern "
                                            << static_cast<int>(p) << " ctas/rank " << ctas);
            ScheduleSim sim(s, shapes, ctas, may_hold_signals_into, rng);
            ASSERT_TRUE(sim.run(rng)) << "deadlock";
            sim.check_complete();
            if (testing::Test::HasFailure()) return;
          }
        }
      }
    }
  }
}

// Holding signals into a combine task deadlocks one CTA that waits for its own held tile: the
// simulation must see it (else the test above could not fail for that reason).
TEST(FusedSchedule, HoldingIntoCombineDeadlocks) {
  std::mt19937 rng(5);
  Sim s{FusedDims{1, 512, 256, 4, 2, 20}, {std::vector<int32_t>(40)}, {20}};
  for (int t = 0; t < 20; ++t) {
    s.idx[0][2 * t] = t % 4;
    s.idx[0][2 * t + 1] = (t + 1) % 4;
  }
  ScheduleSim sim(s, {kShapes[0]}, 1, [](Phase p) { return p != Phase::kDone; }, rng);
  EXPECT_FALSE(sim.run(rng));
  ScheduleSim fixed(s, {kShapes[0]}, 1, may_hold_signals_into, rng);
  EXPECT_TRUE(fixed.run(rng));
  fixed.check_complete();
}

}  // namespace
}  // namespace epfuse::device
