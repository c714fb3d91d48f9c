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
#pragma once
#include "epfuse/communicator.h"

namespace epfuse::testing {

inline constexpr int kSkipExitCode = 77;  // ctest's SKIP_RETURN_CODE for these tests

// The whole main() of a multi-process GPU test. Never throws: errors are printed, return 1.
int run_multiprocess(int argc, char** argv, int default_world);

// The communicator of this rank, valid while the tests run (inside run_multiprocess).
Communicator& comm();

// The world size this run was started with (--world or the default).
int world();

}  // namespace epfuse::testing
