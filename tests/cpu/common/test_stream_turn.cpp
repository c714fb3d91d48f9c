// The host half of the order of forwards (common/stream_turn.h): the mutex a forward holds while it
// enqueues, that a forward's turn never makes its event, the turns shared by key, and which fused
// workspaces share one (fused/workspace_turn.h). The stream half (events, capture nodes) needs a GPU:
// tests/gpu/fused/test_gpu_threads.cpp.
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/stream_turn.h"
#include "epfuse/error.h"
#include "fused/workspace_turn.h"

namespace epfuse::detail {
namespace {

// Four threads, started together, each enter the turn 500 times and, inside, check that nobody else
// is inside and update a plain counter non-atomically (read, sleep, write): without mutual exclusion
// both checks fail.
TEST(StreamTurn, OneHolderAtATime) {
  StreamTurn turn(nullptr);
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> ready{0};
  long counter = 0;
  constexpr int kThreads = 4, kRounds = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();
      for (int i = 0; i < kRounds; ++i) {
        std::unique_lock<std::mutex> held = turn.hold();
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        const long seen = counter;
        std::this_thread::sleep_for(std::chrono::microseconds(20));
        counter = seen + 1;
        inside.fetch_sub(1);
      }
    });
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(counter, long{kThreads} * kRounds);
}

// A second caller waits for the first to let go (it is not refused, and does not pass it).
TEST(StreamTurn, SecondCallerWaitsForTheFirst) {
  StreamTurn turn(nullptr);
  std::atomic<bool> second_in{false};
  std::unique_lock<std::mutex> first = turn.hold();
  std::thread second([&] {
    std::unique_lock<std::mutex> held = turn.hold();
    second_in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(second_in.load()) << "the second caller entered while the first held the turn";
  first.unlock();
  second.join();
  EXPECT_TRUE(second_in.load());
}

// A forward's turn makes nothing on the device: a turn without its event refuses, where taking it
// once made the event (in the one-GPU mode that creation, between the ranks' barrier and this rank's
// launch, could wait for the peers' kernels, which wait for this rank: docs/performance.md).
TEST(StreamTurn, TakeNeverMakesTheEvent) {
  StreamTurn turn(nullptr);
  try {
    turn.take(nullptr);
    ADD_FAILURE() << "take() on a turn without its event went ahead";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal) << e.what();
    EXPECT_NE(std::string(e.what()).find("has no event"), std::string::npos) << e.what();
  }
}

// Stands in for StreamTurn (whose constructor needs a GPU): counts the turns made.
struct CountedTurn {
  static inline std::atomic<int> made{0};
  CountedTurn() { made.fetch_add(1); }
};

TEST(SharedTurns, OneTurnPerLivingKey) {
  using Key = std::pair<int, uintptr_t>;
  SharedTurns<Key, CountedTurn> turns;
  CountedTurn::made = 0;
  std::shared_ptr<CountedTurn> a = turns.turn({0, 0});
  std::shared_ptr<CountedTurn> b = turns.turn({0, 0});
  std::shared_ptr<CountedTurn> c = turns.turn({1, 0});
  EXPECT_EQ(a.get(), b.get()) << "two workspaces of one key must share one turn";
  EXPECT_NE(a.get(), c.get());
  EXPECT_EQ(CountedTurn::made.load(), 2) << "turn() makes a turn (and its event) only for a key without one";
  EXPECT_EQ(turns.size(), 2u);
  a.reset();
  EXPECT_EQ(turns.size(), 2u) << "b still holds device 0's turn";
  b.reset();
  c.reset();
  EXPECT_EQ(turns.size(), 0u);
  // A key whose turn went gets a fresh one (not a dangling pointer), and the gone keys are forgotten.
  std::shared_ptr<CountedTurn> d = turns.turn({0, 0});
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(CountedTurn::made.load(), 3);
  EXPECT_EQ(turns.size(), 1u);
}

// Under NCCL the workspaces of one GPU share a turn whatever the communicator; in the one-GPU mode
// each rank has its own (its kernels must run beside the other ranks'), shared by that rank's
// workspaces, and never by two ranks: not of one world, nor of two worlds on one GPU.
TEST(WorkspaceTurnKey, OnePerGpuUnderNcclOnePerRankInOneGpuMode) {
  using fused::workspace_turn_key;
  int comm[4];  // stand-ins for four ranks' communicators
  EXPECT_EQ(workspace_turn_key(0, false, &comm[0]), workspace_turn_key(0, false, &comm[3]));
  EXPECT_NE(workspace_turn_key(0, false, &comm[0]), workspace_turn_key(1, false, &comm[0]));
  for (int r = 0; r < 4; ++r) {
    for (int q = 0; q < 4; ++q) {
      if (q != r) {
        EXPECT_NE(workspace_turn_key(0, true, &comm[r]), workspace_turn_key(0, true, &comm[q]));
      }
    }
    EXPECT_NE(workspace_turn_key(0, true, &comm[r]), workspace_turn_key(0, false, &comm[r]));
  }
}

}  // namespace
}  // namespace epfuse::detail
