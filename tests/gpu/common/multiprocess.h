// Multi-process GPU tests: one process per GPU, a bootstrapped Communicator for each gtest test.
//
//   int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 2); }
//
// Started without RANK (by ctest or by hand), the executable checks that the machine has enough
// GPUs (else prints "SKIPPED: needs W GPUs, found M" and returns kSkipExitCode), then starts W
// copies of itself through the launcher (tools/launch) and returns 0 only if all of them pass.
// Each copy (RANK set) bootstraps a Communicator from the environment and runs RUN_ALL_TESTS.
// `--world=N` (or `--world N`) on the command line overrides the default world size, so that one
// executable can be registered for several worlds (see epfuse_add_gpu_test in CMakeLists.txt).
//
// Tests run on every rank in the same order; a test that makes collective calls must make all of
// them on every rank even after a failed check (EXPECT_*, not ASSERT_*, before a collective), or
// the other ranks wait for it until the launcher stops them.
//
// One-GPU mode (`--one-gpu`, registered by epfuse_add_gpu_test's ONE_GPU_WORLDS): one process on GPU 0
// runs gtest once, and each test written with EPFUSE_RANK_TEST runs its body on `world` threads, one
// per rank, each with its rank's loopback Communicator (a fresh LoopbackWorld per test, so one test's
// failure cannot poison the next). A body that throws fails the test with the rank's message and
// aborts that test's world, so the other ranks' host collectives fail instead of waiting.
#pragma once
#include <functional>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace epfuse::testing {

inline constexpr int kSkipExitCode = 77;  // ctest's SKIP_RETURN_CODE for these tests

// The whole main() of a multi-process GPU test. Never throws: errors are printed, return 1.
int run_multiprocess(int argc, char** argv, int default_world);

// The communicator of this rank, valid while the tests run (inside run_multiprocess; in one-GPU
// mode inside an EPFUSE_RANK_TEST body, where it is the calling thread's rank).
Communicator& comm();

// A communicator of the calling test's own over the same ranks (NCCL, one process per GPU: an id from
// rank 0 gathered through comm()), with its own collective timeout: a fault test may abort it and
// leave comm() untouched. Collective over comm().
std::unique_ptr<Communicator> own_communicator(std::chrono::milliseconds collective_timeout);

// The world size this run was started with (--world or the default).
int world();

// Whether this run is in one-GPU mode (--one-gpu).
bool one_gpu();

// Runs `body` as every rank of this process: once (one process per GPU), or once per rank on its own
// thread (one-GPU mode). EPFUSE_RANK_TEST wraps a test body in it.
void on_every_rank(const std::function<void()>& body);

// A collective creation that one rank fails: create() must throw on every rank, on rank `faulty`
// Error(code, message) exactly, on every other rank Error(kAborted) "rank R: <creator>: rank <faulty>
// failed: <message>" (the failure agreed, nobody left waiting for the faulty rank).
void expect_creation_fails_everywhere(const std::function<void()>& create, int faulty, ErrorCode code,
                                      const std::string& message, const std::string& creator);

}  // namespace epfuse::testing

// TEST(suite, name) whose body runs on every rank (on_every_rank).
#define EPFUSE_RANK_TEST(suite, name)                                                   \
  static void suite##_##name##_rank_body();                                             \
  TEST(suite, name) { ::epfuse::testing::on_every_rank(&suite##_##name##_rank_body); } \
  static void suite##_##name##_rank_body()

namespace epfuse::testing {

}  // namespace epfuse::testing
