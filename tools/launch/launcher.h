// The process launcher behind `epfuse launch` (and the multi-process GPU tests): N copies of a
// command with the torchrun environment set, output prefixed by rank, failure of one stops all.
#pragma once
#include <chrono>
#include <string>
#include <vector>

namespace epfuse::tools {

struct LaunchOptions {
  int nprocs = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                     // 0: pick a free port
  bool prefix_output = true;               // "[rank r] " before each line of each child
  std::chrono::milliseconds grace{3000};   // SIGTERM, then SIGKILL after this long
};

// Starts opts.nprocs copies of argv (argv[0] is looked up in PATH) with RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and EPFUSE_BOOTSTRAP_SECRET set (the
// launcher's own EPFUSE_BOOTSTRAP_SECRET when it has one, else 64 random hex digits, new per
// launch). Returns 0 when every child exits 0. When a child fails, stops the others and returns
// non-zero after printing to stderr one line naming the rank and its exit status or signal. Never
// calls exit().
int launch(const LaunchOptions& opts, const std::vector<std::string>& argv);

}  // namespace epfuse::tools
