// `epfuse run`: parses and checks the flags, then either runs the CPU reference (no GPU, or
// --impl reference), re-executes itself on every rank through the launcher (GPUs, RANK unset),
// or runs one rank (RANK set).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/run.h"
#include "cli/run_options.h"
#include "common/flags.h"
#include "common/output.h"
#include "common/process.h"
#include "launch/launcher.h"

namespace epfuse::tools {
namespace {

constexpr const char* kDescription =
    "Runs the MoE layer on R ranks (one process per GPU) and compares every rank's output with the\n"
    "float64 CPU reference on fresh seeded inputs. Without a GPU (or with --impl reference) it runs\n"
    "the CPU reference on R simulated ranks instead. Exit code 0 when every checked call is within\n"
    "--tolerance and every output element was written, 1 otherwise, 2 for bad flags.\n"
    "With --one-gpu every rank runs in this process on GPU 0 (one thread per rank, the loopback\n"
    "transport): the fused kernel's multi-rank protocol checked at any --ranks on one GPU.\n"
    "Environment: EPFUSE_FORCE_CPU=1 ignores GPUs; EPFUSE_SKIP_IF_FEWER_GPUS=1 makes a run that\n"
    "needs more GPUs than present exit 77 (skipped) instead of failing.";

}  // namespace

int fail(const std::string& reason) {
  std::fflush(stdout);
  fmt::print(stderr, "epfuse: {}\n", reason);
  return 1;
}

int run_command(const std::vector<std::string>& args) {
  RunFlags f;
  FlagParser parser("epfuse run [flags]", kDescription);
  add_run_flags(parser, f);
  if (auto code = parse_command_flags(parser, "run", args)) return *code;
  std::vector<std::string> full = {"epfuse", "run"};
  full.insert(full.end(), args.begin(), args.end());
  const std::string command = command_line(full);

  // One hardware queue per rank's stream (LoopbackWorld); CUDA reads it at its first call.
  if (f.one_gpu) ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(LoopbackWorld::kMaxConnections).c_str(), 0);
  const int gpus = visible_gpus();
  const char* rank_env = std::getenv("RANK");
  const bool in_rank = rank_env != nullptr && gpus > 0 && !f.one_gpu;
  if (f.one_gpu && rank_env != nullptr && gpus > 0)
    return usage_error(parser, "run", "--one-gpu runs every rank in this process: start it once, not per rank");
  if (f.one_gpu && requested_ranks(f) == 0)
    return usage_error(parser, "run", "--one-gpu needs --ranks R (or a --tokens list with one count per rank)");
  std::optional<BootstrapOptions> boot;
  int ranks = requested_ranks(f);
  if (in_rank) {
    boot = BootstrapOptions::from_env();
    if (f.ranks != 0 && f.ranks != boot->world_size)
      return fail("--ranks " + std::to_string(f.ranks) + " disagrees with WORLD_SIZE=" +
                  std::to_string(boot->world_size));
    ranks = boot->world_size;
  } else if (ranks == 0) {
    ranks = gpus > 0 ? gpus : 1;
  }

  RunPlan plan;
  try {
    plan = resolve_run_plan(f, parser, ranks, gpus > 0);
  } catch (const UsageError& e) {
    return usage_error(parser, "run", e.what());
  }

  if (!plan.impl) {
    // In a launched job only rank 0 computes the reference; the others have nothing to add.
    if (in_rank && boot->rank != 0) return 0;
    fmt::print("epfuse run: {}: running the CPU reference (float64) with {} simulated ranks\n",
               gpus == 0 ? "no GPU found" : "--impl reference", plan.ranks);
    std::fflush(stdout);
    return run_reference(plan, command);
  }
  if (in_rank) return run_rank(plan, *boot, command);
  const int needed = plan.one_gpu ? 1 : plan.ranks;
  if (needed > gpus) {
    // Tests ask for a skip (ctest's SKIP_RETURN_CODE) where a user gets an error.
    if (env_is("EPFUSE_SKIP_IF_FEWER_GPUS", "1")) {
      fmt::print("SKIPPED: needs {} GPU{}, found {}\n", needed, needed == 1 ? "" : "s", gpus);
      return 77;
    }
    if (gpus == 0)
      return fail("--impl " + std::string(to_string(*plan.impl)) +
                  " needs a GPU and none was found (--impl reference runs the CPU reference)");
    return fail("--ranks " + std::to_string(plan.ranks) + " needs " + std::to_string(plan.ranks) +
                " GPUs, found " + std::to_string(gpus) + " (--one-gpu runs them all on one)");
  }
  if (plan.one_gpu) return run_one_gpu(plan, command);
  LaunchOptions opts;
  opts.nprocs = plan.ranks;
  std::vector<std::string> argv = {self_executable(), "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (!parser.seen("--ranks")) argv.push_back("--ranks=" + std::to_string(plan.ranks));
  int rc = launch(opts, argv);
  if (rc != 0) return fail("run failed on " + std::to_string(plan.ranks) + " ranks (see the rank output above)");
  return 0;
}

}  // namespace epfuse::tools
