// `epfuse <command>`: dispatches to launch, run and bench and turns errors into exit codes.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "common/flags.h"
#include "epfuse/error.h"
#ifdef EPFUSE_HAVE_BENCH
#include "bench/bench.h"
#endif

namespace {

constexpr const char* kUsage =
    "usage: epfuse <command> [flags]\n"
    "\n"
    "An expert-parallel MoE layer across the GPUs of one node.\n"
    "\n"
    "commands:\n"
    "  run      run the layer on every GPU (one process each) and verify it against the float64\n"
    "           CPU reference; without a GPU, run the CPU reference on simulated ranks\n"
    "  bench    time the implementations on a sweep of shapes\n"
    "  launch   start N copies of a command with RANK, WORLD_SIZE, ... set (like torchrun)\n"
    "\n"
    "`epfuse <command> --help` describes a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  using namespace epfuse::tools;
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  std::string_view command = argv[1];
  if (command == "--help" || command == "-h" || command == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "launch") return launch_command(args);
    if (command == "run") return run_command(args);
    if (command == "bench") {
#ifdef EPFUSE_HAVE_BENCH
      return bench_command(argc - 1, argv + 1);
#else
      return fail("bench: not built (this build has no tools/bench)");
#endif
    }
    fmt::print(stderr, "epfuse: unknown command '{}'\n\n{}", command, kUsage);
    return 2;
  } catch (const UsageError& e) {
    // The command printed its usage already when it knows it; this is the fallback.
    fmt::print(stderr, "epfuse {}: {}\n", command, e.what());
    return 2;
  } catch (const epfuse::Error& e) {
    return fail(e.what());
  } catch (const std::exception& e) {
    return fail(e.what());
  }
}
