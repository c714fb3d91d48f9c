// run_multiprocess (multiprocess.h): parent = GPU count check + launcher; child = bootstrap + gtest.
#include "multiprocess.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/check.h"
#include "epfuse/error.h"
#include "launch/launcher.h"

namespace epfuse::testing {
namespace {

std::unique_ptr<Communicator> g_comm;
int g_world = 0;
bool g_one_gpu = false;
thread_local Communicator* t_rank_comm = nullptr;  // one-GPU mode: this thread's rank

struct Args {
  int world = 0;
  bool one_gpu = false;
  std::vector<char*> for_gtest;  // argv without --world and --one-gpu
};

int parse_world(std::string_view text) {
  size_t used = 0;
  int world = 0;
  try {
    world = std::stoi(std::string(text), &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || world < 1) {
    throw Error(ErrorCode::kInvalidArgument, "--world='" + std::string(text) + "' is not a positive integer");
  }
  return world;
}

Args parse_args(int argc, char** argv, int default_world) {
  Args args{default_world, false, {argv[0]}};
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--world=")) {
      args.world = parse_world(arg.substr(8));
    } else if (arg == "--world") {
      if (i + 1 >= argc) throw Error(ErrorCode::kInvalidArgument, "--world needs a value");
      args.world = parse_world(argv[++i]);
    } else if (arg == "--one-gpu") {
      args.one_gpu = true;
    } else {
      args.for_gtest.push_back(argv[i]);
    }
  }
  args.for_gtest.push_back(nullptr);
  return args;
}

// A failing cudaGetDeviceCount (no driver, no device) means no GPU, not an error.
int gpu_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
}

int run_rank(Args& args) {
  int gtest_argc = static_cast<int>(args.for_gtest.size()) - 1;
  ::testing::InitGoogleTest(&gtest_argc, args.for_gtest.data());
  const BootstrapOptions opts = BootstrapOptions::from_env();
  if (opts.world_size != args.world) {
    throw Error(ErrorCode::kInvalidArgument, "WORLD_SIZE=" + std::to_string(opts.world_size) +
                                                 " but the test was started for --world=" + std::to_string(args.world));
  }
  g_comm = Communicator::bootstrap(opts);
  const int result = RUN_ALL_TESTS();
  // Leave together: a rank tearing down NCCL while a peer is still inside a test would turn that
  // peer's ordinary failure into a hang.
  g_comm->barrier();
  g_comm.reset();
  return result;
}

// Every rank in this process on GPU 0: gtest runs once; EPFUSE_RANK_TEST bodies fan out to threads.
int run_one_gpu(Args& args) {
  // One hardware queue per rank's stream (LoopbackWorld); CUDA reads it at its first call.
  setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(LoopbackWorld::kMaxConnections).c_str(), 0);
  if (gpu_count() < 1) {
    std::printf("SKIPPED: needs 1 GPU, found 0\n");
    std::fflush(stdout);
    return kSkipExitCode;
  }
  int gtest_argc = static_cast<int>(args.for_gtest.size()) - 1;
  ::testing::InitGoogleTest(&gtest_argc, args.for_gtest.data());
  EPFUSE_CUDA_CHECK(cudaSetDevice(0));
  g_one_gpu = true;
  const int result = RUN_ALL_TESTS();
  return result == kSkipExitCode ? 1 : result;
}

int launch_ranks(const Args& args, int argc, char** argv) {
  const int found = gpu_count();
  if (found < args.world) {
    std::printf("SKIPPED: needs %d GPUs, found %d\n", args.world, found);
    std::fflush(stdout);
    return kSkipExitCode;
  }
  // NVLink multicast stays off on our machines (DESIGN.md); a user's explicit setting wins.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<std::string> command{std::filesystem::read_symlink("/proc/self/exe").string()};
  for (int i = 1; i < argc; ++i) command.emplace_back(argv[i]);
  tools::LaunchOptions opts;
  opts.nprocs = args.world;
  const int result = tools::launch(opts, command);
  // A rank's own exit code passes through the launcher; never let one read as "skipped".
  return result == kSkipExitCode ? 1 : result;
}

}  // namespace

int run_multiprocess(int argc, char** argv, int default_world) {
  try {
    Args args = parse_args(argc, argv, default_world);
    g_world = args.world;
    const bool listing = std::any_of(args.for_gtest.begin(), args.for_gtest.end() - 1, [](const char* a) {
      return std::string_view(a).starts_with("--gtest_list_tests");
    });
    if (listing) {
      int gtest_argc = static_cast<int>(args.for_gtest.size()) - 1;
      ::testing::InitGoogleTest(&gtest_argc, args.for_gtest.data());
      return RUN_ALL_TESTS();
    }
    if (args.one_gpu) return run_one_gpu(args);
    return std::getenv("RANK") != nullptr ? run_rank(args) : launch_ranks(args, argc, argv);
  } catch (const std::exception& e) {
    const char* rank = std::getenv("RANK");
    std::fprintf(stderr, "%s%s\n", rank != nullptr ? "" : "launcher: ", e.what());
    g_comm.reset();
    return 1;
  }
}

std::unique_ptr<Communicator> own_communicator(std::chrono::milliseconds collective_timeout) {
  Communicator& world = comm();
  ncclUniqueId id{};
  if (world.rank() == 0) EPFUSE_NCCL_CHECK(ncclGetUniqueId(&id));
  constexpr size_t kWords = sizeof(ncclUniqueId) / sizeof(double);
  static_assert(kWords * sizeof(double) == sizeof(ncclUniqueId));
  double words[kWords];
  std::memcpy(words, &id, sizeof id);
  const std::vector<double> all = world.all_gather(std::span<const double>(words, kWords));
  std::memcpy(&id, all.data(), sizeof id);  // rank 0's
  return Communicator::init_rank(id, world.world_size(), world.rank(), world.device(), collective_timeout);
}

Communicator& comm() {
  if (g_one_gpu) {
    if (t_rank_comm == nullptr)
      throw Error(ErrorCode::kInternal, "epfuse::testing::comm() in one-GPU mode outside an EPFUSE_RANK_TEST body");
    return *t_rank_comm;
  }
  if (g_comm == nullptr) {
    throw Error(ErrorCode::kInternal, "epfuse::testing::comm() outside a rank started by run_multiprocess");
  }
  return *g_comm;
}

int world() { return g_world; }

bool one_gpu() { return g_one_gpu; }

void on_every_rank(const std::function<void()>& body) {
  if (!g_one_gpu) return body();
  LoopbackWorld ranks(g_world, /*device=*/0);
  const std::vector<std::string> errors = ranks.run([&](Communicator& c) {
    t_rank_comm = &c;
    try {
      body();
    } catch (...) {
      t_rank_comm = nullptr;
      throw;
    }
    t_rank_comm = nullptr;
  });
  for (const std::string& e : errors)
    if (!e.empty()) ADD_FAILURE() << e;
}

void expect_creation_fails_everywhere(const std::function<void()>& create, int faulty, ErrorCode code,
                                      const std::string& message, const std::string& creator) {
  const int rank = comm().rank();
  const std::string me = "rank " + std::to_string(rank) + ": ";
  try {
    create();
    ADD_FAILURE() << me << creator << " succeeded although rank " << faulty << "'s failed";
  } catch (const Error& e) {
    if (rank == faulty) {
      EXPECT_EQ(e.code(), code) << e.what();
      EXPECT_EQ(std::string(e.what()), message);
    } else {
      EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
      EXPECT_EQ(std::string(e.what()), me + creator + ": rank " + std::to_string(faulty) + " failed: " + message);
    }
  }
}

}  // namespace epfuse::testing
