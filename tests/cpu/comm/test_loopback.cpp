// CPU tests of the one-GPU world (LoopbackWorld, src/comm/loopback_hub.h): host collectives between
// rank threads that arrive in random order, their timeouts and aborts, run()'s per-rank messages,
// and the checks alloc_symmetric makes before any CUDA call. No GPU needed.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/collective_step.h"
#include "comm/loopback_hub.h"
#include "common/hash.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace {

using epfuse::Communicator;
using epfuse::Error;
using epfuse::ErrorCode;
using epfuse::LoopbackWorld;
using epfuse::detail::mix64;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kLong{30000};  // long enough that a test passing early cannot be a timeout

// A value in [0, 1) from (seed, a, b): every rank can recompute every other rank's values.
double unit(uint64_t seed, uint64_t a, uint64_t b) {
  return static_cast<double>(mix64(mix64(mix64(seed) ^ a) ^ b) >> 11) * 0x1.0p-53;
}

// Up to `max_us` of sleep, different per (rank, round): threads reach each collective in random order.
void jitter(uint64_t seed, int rank, int round, int max_us) {
  std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int>(unit(seed, rank, round) * max_us)));
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

struct Caught {
  bool thrown = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string what;
};

Caught catch_error(const std::function<void()>& f) {
  Caught c;
  try {
    f();
  } catch (const Error& e) {
    c = {true, e.code(), e.what()};
  }
  return c;
}

bool starts_with(const std::string& text, const std::string& head) { return text.rfind(head, 0) == 0; }
bool ends_with(const std::string& text, const std::string& tail) {
  return text.size() >= tail.size() && text.compare(text.size() - tail.size(), tail.size(), tail) == 0;
}
bool contains(const std::string& text, const std::string& piece) { return text.find(piece) != std::string::npos; }

std::string rank_head(int rank) { return "rank " + std::to_string(rank) + ": "; }

// run() and expects every rank to succeed.
void run_ok(LoopbackWorld& world, const std::function<void(Communicator&)>& fn) {
  const std::vector<std::string> errors = world.run(fn);
  ASSERT_EQ(errors.size(), static_cast<size_t>(world.world_size()));
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

bool have_gpu() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

class LoopbackWorlds : public ::testing::TestWithParam<int> {};

TEST_P(LoopbackWorlds, BarrierLetsNoRankPassARoundEarly) {
  const int world_size = GetParam();
  constexpr int kRounds = 40;
  LoopbackWorld world(world_size, 0, kLong);
  std::vector<std::atomic<int>> arrived(kRounds);
  std::atomic<int> early{0};
  run_ok(world, [&](Communicator& comm) {
    for (int round = 0; round < kRounds; ++round) {
      jitter(11, comm.rank(), round, 300);
      arrived[round].fetch_add(1);
      comm.barrier();
      // Every rank must have arrived at this round before any rank leaves it.
      if (arrived[round].load() != world_size) early.fetch_add(1);
    }
  });
  EXPECT_EQ(early.load(), 0);
  for (int round = 0; round < kRounds; ++round) EXPECT_EQ(arrived[round].load(), world_size) << "round " << round;
}

// Each round a different collective with fresh per-rank values, so a result of one round that
// leaked into the next (a fast rank overwriting what a slow one still reads) shows as a mismatch.
TEST_P(LoopbackWorlds, CollectivesReturnEveryRanksValues) {
  const int world_size = GetParam();
  constexpr int kRounds = 60;
  LoopbackWorld world(world_size, 0, kLong);
  auto value = [](int rank, int round, int i) { return (unit(7, rank, round * 64 + i) - 0.5) * 1e6; };
  auto count = [](int round) { return round % 4; };  // 0 included: an all_gather of nothing
  std::atomic<int> bad{0};
  run_ok(world, [&](Communicator& comm) {
    const int me = comm.rank();
    for (int round = 0; round < kRounds; ++round) {
      jitter(13, me, round, round % 3 == 0 ? 0 : 200);  // some rounds back to back, no sleep
      switch (round % 3) {
        case 0: {
          std::vector<double> mine;
          for (int i = 0; i < count(round); ++i) mine.push_back(value(me, round, i));
          std::vector<double> want;
          for (int r = 0; r < world_size; ++r)
            for (int i = 0; i < count(round); ++i) want.push_back(value(r, round, i));
          if (comm.all_gather(mine) != want) bad.fetch_add(1);
          break;
        }
        case 1: {
          // Every value negative in odd rounds: a max that starts from 0 would be caught.
          const double shift = round % 2 ? -2e6 : 0.0;
          double want = -std::numeric_limits<double>::infinity();
          for (int r = 0; r < world_size; ++r) want = std::max(want, value(r, round, 0) + shift);
          if (comm.all_reduce_max(value(me, round, 0) + shift) != want) bad.fetch_add(1);
          break;
        }
        default: {
          auto term = [&](int r) { return static_cast<int64_t>(mix64(r * 1000 + round)) >> 20; };  // +/- 2^43
          int64_t want = 0;
          for (int r = 0; r < world_size; ++r) want += term(r);
          if (comm.all_reduce_sum(term(me)) != want) bad.fetch_add(1);
        }
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, LoopbackWorlds, ::testing::Values(1, 2, 3, 8, 16));

TEST(Loopback, BackToBackGathersNeverMixRounds) {
  constexpr int kWorld = 8;
  constexpr int kRounds = 500;
  LoopbackWorld world(kWorld, 0, kLong);
  std::atomic<int> bad{0};
  run_ok(world, [&](Communicator& comm) {
    for (int round = 0; round < kRounds; ++round) {
      const double mine[2] = {static_cast<double>(round), static_cast<double>(comm.rank())};
      const std::vector<double> all = comm.all_gather(mine);
      for (int r = 0; r < kWorld; ++r) {
        if (all[2 * r] != round || all[2 * r + 1] != r) {
          bad.fetch_add(1);
          break;
        }
      }
    }
  });
  EXPECT_EQ(bad.load(), 0);
}

TEST(Loopback, MaxIsNanIfAnyRankIsNan) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  struct Case {
    std::vector<double> per_rank;
    double want;  // NaN: expect NaN
  };
  const std::vector<Case> cases = {
      {{1.0, 2.0, kNaN, 3.0}, kNaN},  // NaN on one rank beats larger values elsewhere
      {{kNaN, -5.0, -6.0, 1e300}, kNaN},
      {{1.0, 2.0, 3.0, kNaN}, kNaN},  // on the last rank
      {{kNaN, kNaN, kNaN, kNaN}, kNaN},
      {{1.0, kInf, 3.0, 2.0}, kInf},
      {{-kInf, -kInf, -kInf, -kInf}, -kInf},
      {{-3.0, -1.5, -2.0, -7.0}, -1.5},
  };
  LoopbackWorld world(4, 0, kLong);
  std::vector<std::vector<double>> got(4);
  run_ok(world, [&](Communicator& comm) {
    for (const Case& c : cases) got[comm.rank()].push_back(comm.all_reduce_max(c.per_rank[comm.rank()]));
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(got[r].size(), cases.size());
    for (size_t i = 0; i < cases.size(); ++i) {
      if (std::isnan(cases[i].want)) {
        EXPECT_TRUE(std::isnan(got[r][i])) << "case " << i << " rank " << r << " got " << got[r][i];
      } else {
        EXPECT_EQ(got[r][i], cases[i].want) << "case " << i << " rank " << r;
      }
    }
  }
}

// Ranks listed in `missing` never call; the others wait in a barrier and must all time out.
void expect_timeout_naming(int world_size, const std::vector<int>& missing, const std::string& named) {
  constexpr milliseconds kTimeout{200};
  LoopbackWorld world(world_size, 0, kTimeout);
  std::vector<Caught> caught(world_size), later(world_size);
  std::vector<double> waited(world_size, 0.0), later_ms(world_size, 0.0);
  run_ok(world, [&](Communicator& comm) {
    const int me = comm.rank();
    if (std::find(missing.begin(), missing.end(), me) != missing.end()) return;
    const auto start = Clock::now();
    caught[me] = catch_error([&] { comm.barrier(); });
    waited[me] = ms_since(start);
    const auto again = Clock::now();
    later[me] = catch_error([&] { comm.all_reduce_sum(1); });
    later_ms[me] = ms_since(again);
  });
  EXPECT_TRUE(world.aborted());
  // The bound runs from each rank's arrival: the first to arrive waits it out in full, and its
  // timeout releases the others.
  EXPECT_GE(*std::max_element(waited.begin(), waited.end()), 199.0) << "no rank waited out the timeout";
  for (int r = 0; r < world_size; ++r) {
    if (std::find(missing.begin(), missing.end(), r) != missing.end()) continue;
    ASSERT_TRUE(caught[r].thrown) << "rank " << r;
    EXPECT_EQ(caught[r].code, ErrorCode::kTimeout) << caught[r].what;
    EXPECT_TRUE(starts_with(caught[r].what, rank_head(r) + "one-GPU world: barrier timed out after 200 ms"))
        << caught[r].what;
    EXPECT_TRUE(ends_with(caught[r].what, "waiting for rank(s) " + named)) << caught[r].what;
    EXPECT_LT(waited[r], 2000.0) << "rank " << r;
    // The world has failed: the next collective does not wait again.
    ASSERT_TRUE(later[r].thrown) << "rank " << r;
    EXPECT_EQ(later[r].code, ErrorCode::kAborted) << later[r].what;
    EXPECT_TRUE(starts_with(later[r].what, rank_head(r) + "all_reduce_sum: rank ")) << later[r].what;
    EXPECT_TRUE(contains(later[r].what, "waiting for rank(s) " + named)) << later[r].what;
    EXPECT_LT(later_ms[r], 100.0) << "rank " << r;
  }
}

TEST(Loopback, MissingRankTimesOutNamingIt) { expect_timeout_naming(4, {2}, "2"); }

TEST(Loopback, MissingRanksTimeOutNamingExactlyThem) { expect_timeout_naming(5, {1, 3}, "1, 3"); }

TEST(Loopback, MissingRankZeroTimesOut) { expect_timeout_naming(2, {0}, "0"); }

TEST(Loopback, AbortWakesWaitersAndFailsLaterCollectives) {
  LoopbackWorld world(3, 0, kLong);
  std::unique_ptr<Communicator> c0 = world.communicator(0), c1 = world.communicator(1);
  std::vector<Caught> waiting(2), later(2);
  std::vector<double> waited(2);
  auto rank = [&](Communicator& comm) {
    const auto start = Clock::now();
    waiting[comm.rank()] = catch_error([&] { comm.barrier(); });
    waited[comm.rank()] = ms_since(start);
    later[comm.rank()] = catch_error([&] { comm.all_gather(std::vector<double>{1.0}); });
  };
  std::thread t0(rank, std::ref(*c0)), t1(rank, std::ref(*c1));
  std::this_thread::sleep_for(milliseconds(100));  // both are waiting for rank 2
  EXPECT_FALSE(world.aborted());
  world.abort(2, "rank 2: the disk is on fire");
  world.abort(1, "a second abort");  // ignored: the first one's rank and reason stay
  t0.join();
  t1.join();
  EXPECT_TRUE(world.aborted());
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(waiting[r].thrown) << "rank " << r;
    EXPECT_EQ(waiting[r].code, ErrorCode::kAborted) << waiting[r].what;
    EXPECT_EQ(waiting[r].what, rank_head(r) + "barrier: rank 2 failed: the disk is on fire");
    EXPECT_LT(waited[r], 2000.0) << "woken by the abort, not by the timeout";
    ASSERT_TRUE(later[r].thrown) << "rank " << r;
    EXPECT_EQ(later[r].code, ErrorCode::kAborted) << later[r].what;
    EXPECT_EQ(later[r].what, rank_head(r) + "all_gather: rank 2 failed: the disk is on fire");
  }
  // Rank 2's communicator, taken after the abort, fails at once too.
  const Caught late = catch_error([&] { world.communicator(2)->barrier(); });
  EXPECT_EQ(late.code, ErrorCode::kAborted) << late.what;
  EXPECT_EQ(late.what, "rank 2: barrier: rank 2 failed: the disk is on fire");
}

TEST(Loopback, RunReportsTheFailedRankAndNobodyHangs) {
  LoopbackWorld world(4, 0, kLong);
  const auto start = Clock::now();
  std::atomic<int> first_barrier{0};
  const std::vector<std::string> errors = world.run([&](Communicator& comm) {
    comm.barrier();
    first_barrier.fetch_add(1);
    if (comm.rank() == 1) throw std::runtime_error("boom");
    comm.barrier();  // rank 1 never comes: the abort must release the others
    comm.barrier();
  });
  EXPECT_LT(ms_since(start), 2000.0);
  EXPECT_EQ(first_barrier.load(), 4);
  ASSERT_EQ(errors.size(), 4u);
  EXPECT_EQ(errors[1], "rank 1: boom");
  for (int r : {0, 2, 3}) EXPECT_EQ(errors[r], rank_head(r) + "barrier: rank 1 failed: boom");
  EXPECT_TRUE(world.aborted());
}

TEST(Loopback, RunKeepsMessagesThatAlreadyNameTheRank) {
  LoopbackWorld world(3, 0, kLong);
  const std::vector<std::string> errors = world.run([&](Communicator& comm) {
    if (comm.rank() == 2) throw Error(ErrorCode::kInvalidArgument, "rank 2: bad shape");
    if (comm.rank() == 0) throw 42;  // not a std::exception: still reported, still aborts
  });
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_EQ(errors[2], "rank 2: bad shape");
  EXPECT_TRUE(starts_with(errors[0], "rank 0: ")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "not derived from std::exception")) << errors[0];
  EXPECT_EQ(errors[1], "");  // made no collective call: nothing to fail
  EXPECT_TRUE(world.aborted());
}

TEST(Loopback, RunGivesEachRankItsOwnCommunicator) {
  LoopbackWorld world(5, 3, kLong);
  std::vector<int> seen(5, -1);
  std::mutex mutex;
  run_ok(world, [&](Communicator& comm) {
    EXPECT_EQ(comm.transport(), epfuse::Transport::kLoopback);
    EXPECT_EQ(comm.world_size(), 5);
    EXPECT_EQ(comm.device(), 3);
    EXPECT_EQ(comm.ranks_per_device(), 5);
    EXPECT_EQ(comm.nccl(), nullptr);
    std::lock_guard<std::mutex> lock(mutex);
    seen[comm.rank()] = comm.rank();
  });
  EXPECT_EQ(seen, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_FALSE(world.aborted());
  // Every rank's communicator is now taken: a second run cannot have them.
  const Caught again = catch_error([&] { world.run([](Communicator&) {}); });
  EXPECT_EQ(again.code, ErrorCode::kInvalidArgument) << again.what;
}

TEST(Loopback, CommunicatorOncePerRankInRange) {
  LoopbackWorld world(3, 0, kLong);
  std::unique_ptr<Communicator> one = world.communicator(1);
  EXPECT_EQ(one->rank(), 1);
  const Caught twice = catch_error([&] { world.communicator(1); });
  EXPECT_EQ(twice.code, ErrorCode::kInvalidArgument);
  EXPECT_TRUE(starts_with(twice.what, "rank 1: ")) << twice.what;
  EXPECT_TRUE(contains(twice.what, "already")) << twice.what;
  for (int bad : {-1, 3, 100}) {
    const Caught out = catch_error([&] { world.communicator(bad); });
    EXPECT_EQ(out.code, ErrorCode::kInvalidArgument) << "rank " << bad << ": " << out.what;
    EXPECT_TRUE(out.thrown) << "rank " << bad;
  }
  EXPECT_NE(world.communicator(0), nullptr);  // the failed calls took nothing
  EXPECT_NE(world.communicator(2), nullptr);
}

TEST(Loopback, ConstructorValidatesWithoutAGpu) {
  struct Bad {
    int world_size, device;
    milliseconds timeout;
    std::string named;
  };
  for (const Bad& b : {Bad{0, 0, kLong, "world_size=0"}, Bad{-3, 0, kLong, "world_size=-3"},
                       Bad{2, -1, kLong, "device=-1"}, Bad{2, 0, milliseconds(0), "timeout=0"},
                       Bad{LoopbackWorld::kMaxConnections + 1, 0, kLong, "CUDA_DEVICE_MAX_CONNECTIONS"}}) {
    const Caught c = catch_error([&] { LoopbackWorld world(b.world_size, b.device, b.timeout); });
    EXPECT_TRUE(c.thrown) << b.named;
    EXPECT_EQ(c.code, ErrorCode::kInvalidArgument) << c.what;
    EXPECT_TRUE(contains(c.what, b.named)) << c.what;
  }
  LoopbackWorld fine(16, 7, milliseconds(1));  // a device this machine need not have
  EXPECT_EQ(fine.world_size(), 16);
  LoopbackWorld widest(LoopbackWorld::kMaxConnections, 0, milliseconds(1));
  EXPECT_EQ(widest.world_size(), LoopbackWorld::kMaxConnections);
  EXPECT_EQ(fine.device(), 7);
  EXPECT_FALSE(fine.aborted());
}

TEST(Loopback, CommunicatorOutlivesItsWorld) {
  std::unique_ptr<Communicator> comm;
  {
    LoopbackWorld world(1, 0, kLong);
    comm = world.communicator(0);
  }
  comm->barrier();
  EXPECT_EQ(comm->all_reduce_sum(-5), -5);
  EXPECT_EQ(comm->all_gather(std::vector<double>{2.5, -1.0}), (std::vector<double>{2.5, -1.0}));
}

TEST(Loopback, CollectivesInDifferentOrdersFailTheWorld) {
  LoopbackWorld world(2, 0, kLong);
  std::vector<Caught> caught(2);
  const auto start = Clock::now();
  run_ok(world, [&](Communicator& comm) {
    caught[comm.rank()] = catch_error([&] {
      if (comm.rank() == 0) {
        comm.barrier();
      } else {
        comm.all_reduce_sum(1);
      }
    });
  });
  EXPECT_LT(ms_since(start), 2000.0);
  // The second to arrive sees the mismatch; the first is woken by the failure it causes.
  ASSERT_TRUE(caught[0].thrown && caught[1].thrown);
  const int second = caught[0].code == ErrorCode::kInvalidArgument ? 0 : 1;
  EXPECT_EQ(caught[second].code, ErrorCode::kInvalidArgument) << caught[second].what;
  EXPECT_TRUE(contains(caught[second].what, "same order")) << caught[second].what;
  EXPECT_EQ(caught[1 - second].code, ErrorCode::kAborted) << caught[1 - second].what;
  EXPECT_TRUE(contains(caught[1 - second].what, "rank " + std::to_string(second) + " failed"))
      << caught[1 - second].what;
}

TEST(Loopback, GatherOfDifferentCountsFailsEveryRank) {
  LoopbackWorld world(3, 0, kLong);
  std::vector<Caught> caught(3);
  std::vector<int64_t> after(3, 0);
  run_ok(world, [&](Communicator& comm) {
    const std::vector<double> mine(comm.rank() == 1 ? 2 : 3, 1.0);
    caught[comm.rank()] = catch_error([&] { comm.all_gather(mine); });
    after[comm.rank()] = comm.all_reduce_sum(comm.rank());  // every rank threw alike: the world goes on
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(caught[r].code, ErrorCode::kInvalidArgument) << caught[r].what;
    EXPECT_TRUE(starts_with(caught[r].what, rank_head(r) + "all_gather: ")) << caught[r].what;
    EXPECT_TRUE(contains(caught[r].what, "rank 0: 3 values, rank 1: 2 values, rank 2: 3 values")) << caught[r].what;
    EXPECT_EQ(after[r], 3);
  }
}

TEST(Loopback, AllocSymmetricOfDifferentSizesFailsEveryRankBeforeCuda) {
  LoopbackWorld world(3, 0, kLong);
  std::vector<Caught> mismatch(3), zero(3), one_zero(3);
  run_ok(world, [&](Communicator& comm) {
    const int me = comm.rank();
    mismatch[me] = catch_error([&] { comm.alloc_symmetric(me == 1 ? 8192 : 4096); });
    zero[me] = catch_error([&] { comm.alloc_symmetric(0); });
    one_zero[me] = catch_error([&] { comm.alloc_symmetric(me == 2 ? 0 : 4096); });
    comm.barrier();  // nobody went on alone: the world still works
  });
  EXPECT_FALSE(world.aborted());
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(mismatch[r].code, ErrorCode::kInvalidArgument) << mismatch[r].what;
    EXPECT_TRUE(starts_with(mismatch[r].what, rank_head(r) + "alloc_symmetric: ")) << mismatch[r].what;
    EXPECT_TRUE(contains(mismatch[r].what, "rank 0: 4096 bytes, rank 1: 8192 bytes, rank 2: 4096 bytes"))
        << mismatch[r].what;
    EXPECT_EQ(zero[r].code, ErrorCode::kInvalidArgument) << zero[r].what;
    EXPECT_TRUE(contains(zero[r].what, "size 0")) << zero[r].what;
    EXPECT_EQ(one_zero[r].code, ErrorCode::kInvalidArgument) << one_zero[r].what;
    EXPECT_TRUE(contains(one_zero[r].what, "rank 2: 0 bytes")) << one_zero[r].what;
  }
}

// With a GPU: one allocation, rank r's slice at base + r * stride. Without one: rank 0's cudaMalloc
// fails and every rank reports that same failure (none goes on alone).
TEST(Loopback, AllocSymmetricSlicesOneAllocationOrFailsAlike) {
  constexpr int kWorld = 3;
  LoopbackWorld world(kWorld, 0, kLong);
  std::vector<Caught> caught(kWorld);
  std::vector<void*> base(kWorld), local(kWorld);
  std::vector<size_t> stride(kWorld), bytes(kWorld);
  run_ok(world, [&](Communicator& comm) {
    const int me = comm.rank();
    caught[me] = catch_error([&] {
      epfuse::SymmetricBuffer buffer = comm.alloc_symmetric(5000);
      base[me] = buffer.slices_base();
      local[me] = buffer.local();
      stride[me] = buffer.stride();
      bytes[me] = buffer.bytes();
      EXPECT_EQ(buffer.window(), nullptr);
      epfuse::SymmetricBuffer moved = std::move(buffer);
      EXPECT_EQ(buffer.local(), nullptr);
      EXPECT_EQ(moved.local(), local[me]);
      moved.reset();  // drops this rank's share only: not collective
      EXPECT_EQ(moved.local(), nullptr);
      EXPECT_EQ(moved.slices_base(), nullptr);
    });
    comm.barrier();
  });
  if (have_gpu()) {
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_FALSE(caught[r].thrown) << caught[r].what;
      EXPECT_EQ(base[r], base[0]);
      EXPECT_EQ(stride[r], 8192u);
      EXPECT_EQ(bytes[r], 5000u);
      EXPECT_EQ(local[r], static_cast<char*>(base[0]) + r * 8192);
    }
    return;
  }
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(caught[r].thrown) << "rank " << r;
    EXPECT_EQ(caught[r].code, ErrorCode::kCuda) << caught[r].what;
    EXPECT_TRUE(starts_with(caught[r].what, rank_head(r) + "alloc_symmetric: rank 0 could not allocate the " +
                                                std::to_string(3 * 8192) + " bytes"))
        << caught[r].what;
    EXPECT_TRUE(contains(caught[r].what, ": rank 0: cuda")) << caught[r].what;  // rank 0's own error
  }
}

TEST(Loopback, DeviceCommIsUnsupported) {
  LoopbackWorld world(2, 0, kLong);
  const Caught c = catch_error([&] { world.communicator(1)->create_device_comm(4); });
  EXPECT_EQ(c.code, ErrorCode::kUnsupported) << c.what;
  EXPECT_TRUE(starts_with(c.what, "rank 1: create_device_comm: ")) << c.what;
  EXPECT_TRUE(contains(c.what, "loopback")) << c.what;
}

// The hub hands a shared handle to every rank and keeps no reference once all have their copy, and
// drops a deposited handle when the round fails, so an allocation's lifetime is the ranks' alone.
// agree_on_step (src/comm/collective_step.h): a setup step's local failure on one rank fails every rank, with
// the failed rank's own message, instead of leaving the others in the next collective.
TEST(Agree, EveryRankSucceedsAndGoesOn) {
  LoopbackWorld world(3, 0, kLong);
  std::atomic<int> ran{0};
  const std::vector<std::string> errors = world.run([&](Communicator& comm) {
    epfuse::detail::agree_on_step(comm, "step", [&] { ran.fetch_add(1); });
    comm.barrier();  // everyone is still in step: no abort happened
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(world.aborted());
}

TEST(Agree, OneRanksFailureFailsEveryRankNamingItAndItsMessage) {
  LoopbackWorld world(4, 0, kLong);
  const auto start = Clock::now();
  std::vector<Caught> caught(4);
  const std::vector<std::string> errors = world.run([&](Communicator& comm) {
    caught[static_cast<size_t>(comm.rank())] = catch_error([&] {
      epfuse::detail::agree_on_step(comm, "Workspace::create", [&] {
        if (comm.rank() == 2)
          throw Error(ErrorCode::kInvalidArgument, "rank 2: EPFUSE_TIMEOUT_MS = 'x' is not a whole number");
      });
    });
    // Every rank threw alike, so the world is still in step for the next collective.
    comm.barrier();
  });
  EXPECT_LT(ms_since(start), 2000.0);
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  for (int r = 0; r < 4; ++r) {
    const Caught& c = caught[static_cast<size_t>(r)];
    ASSERT_TRUE(c.thrown) << "rank " << r << " went on past a failed step";
    if (r == 2) {
      EXPECT_EQ(c.code, ErrorCode::kInvalidArgument);
      EXPECT_EQ(c.what, "rank 2: EPFUSE_TIMEOUT_MS = 'x' is not a whole number");
    } else {
      EXPECT_EQ(c.code, ErrorCode::kAborted);
      EXPECT_EQ(c.what, "rank " + std::to_string(r) +
                            ": Workspace::create: rank 2 failed: rank 2: EPFUSE_TIMEOUT_MS = 'x' is not a whole number");
    }
  }
}

TEST(Agree, TheLowestFailedRankIsNamedAndLongMessagesAreCut) {
  LoopbackWorld world(3, 0, kLong);
  const std::string long_text(2000, 'z');
  std::vector<Caught> caught(3);
  world.run([&](Communicator& comm) {
    caught[static_cast<size_t>(comm.rank())] = catch_error([&] {
      epfuse::detail::agree_on_step(comm, "s", [&] {
        if (comm.rank() >= 1) throw Error(ErrorCode::kCuda, comm.rank() == 1 ? long_text : "other");
      });
    });
  });
  EXPECT_EQ(caught[0].code, ErrorCode::kAborted);
  EXPECT_EQ(caught[0].what, "rank 0: s: rank 1 failed: " + std::string(epfuse::detail::kAgreedMessageBytes, 'z'));
  EXPECT_EQ(caught[1].what, long_text);  // its own exception, whole
  EXPECT_EQ(caught[2].what, "other");
}

// A local failure that also stops the agreement (a sticky CUDA error fails the host collective too; here an
// abort) reaches the caller as itself, code and message first, never as the agreement's error alone.
TEST(Agree, ALocalFailureThatStopsTheAgreementStaysTheCause) {
  LoopbackWorld world(3, 0, kLong);
  std::vector<Caught> caught(3);
  world.run([&](Communicator& comm) {
    caught[static_cast<size_t>(comm.rank())] = catch_error([&] {
      epfuse::detail::agree_on_step(comm, "Workspace::create (buffers)", [&] {
        if (comm.rank() != 1) return;
        comm.abort("the device is gone");
        throw Error(ErrorCode::kCuda, "rank 1: probe: an illegal memory access was encountered");
      });
    });
  });
  EXPECT_EQ(caught[1].code, ErrorCode::kCuda);
  EXPECT_TRUE(starts_with(caught[1].what, "rank 1: probe: an illegal memory access was encountered (then agreeing on "
                                          "Workspace::create (buffers) failed: "))
      << caught[1].what;
  for (int r : {0, 2}) {  // the peers: the abort, naming rank 1
    EXPECT_EQ(caught[static_cast<size_t>(r)].code, ErrorCode::kAborted) << r;
    EXPECT_TRUE(contains(caught[static_cast<size_t>(r)].what, "rank 1 failed: the device is gone")) << caught[static_cast<size_t>(r)].what;
  }
}

// Communicator::abort on a loopback rank: every peer's current and later collective fails naming it.
TEST(Loopback, CommunicatorAbortFailsThePeers) {
  LoopbackWorld world(3, 0, kLong);
  const auto start = Clock::now();
  std::vector<Caught> caught(3);
  world.run([&](Communicator& comm) {
    if (comm.rank() == 1) {
      EXPECT_FALSE(comm.aborted());
      comm.abort("a peer timed out");
      EXPECT_TRUE(comm.aborted());
      comm.abort("second reason is ignored");
    }
    caught[static_cast<size_t>(comm.rank())] = catch_error([&] { comm.barrier(); });
  });
  EXPECT_LT(ms_since(start), 2000.0);
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(caught[static_cast<size_t>(r)].code, ErrorCode::kAborted) << r;
    EXPECT_EQ(caught[static_cast<size_t>(r)].what, rank_head(r) + "barrier: rank 1 failed: a peer timed out");
  }
  EXPECT_TRUE(world.aborted());
}

TEST(LoopbackHub, HandlesLiveOnlyInTheRanks) {
  constexpr int kWorld = 4;
  epfuse::detail::LoopbackHub hub(kWorld, 0, kLong);
  std::atomic<int> deleted{0};
  std::vector<std::shared_ptr<void>> held(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      epfuse::detail::LoopbackHub::Contribution mine;
      if (r == 2) mine.handle = std::shared_ptr<void>(new int(5), [&](void* p) {
        delete static_cast<int*>(p);
        deleted.fetch_add(1);
      });
      jitter(3, r, 0, 2000);
      held[r] = hub.exchange(r, "share", std::move(mine))[2].handle;
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_NE(held[0], nullptr);
  EXPECT_EQ(held[0].use_count(), kWorld);  // one per rank, none in the hub
  for (std::shared_ptr<void>& h : held) h.reset();
  EXPECT_EQ(deleted.load(), 1);

  epfuse::detail::LoopbackHub failing(2, 0, milliseconds(50));
  epfuse::detail::LoopbackHub::Contribution mine;
  mine.handle = std::shared_ptr<void>(new int(6), [&](void* p) {
    delete static_cast<int*>(p);
    deleted.fetch_add(1);
  });
  const Caught c = catch_error([&] { failing.exchange(0, "share", std::move(mine)); });
  EXPECT_EQ(c.code, ErrorCode::kTimeout) << c.what;
  EXPECT_EQ(deleted.load(), 2) << "the failed round's deposit is still held";
}

}  // namespace
