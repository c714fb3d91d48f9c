// `epfuse launch -n N [--master-port P] -- CMD...`: the launcher as a command (torchrun-like).
#include <chrono>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "common/flags.h"
#include "launch/launcher.h"

namespace epfuse::tools {

int launch_command(const std::vector<std::string>& args) {
  LaunchOptions opts;
  opts.nprocs = 0;
  int grace_ms = static_cast<int>(opts.grace.count());
  FlagParser flags("epfuse launch -n N [flags] -- CMD [ARGS...]",
                   "Starts N copies of CMD, one per rank, with RANK, WORLD_SIZE, LOCAL_RANK,\n"
                   "LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and EPFUSE_BOOTSTRAP_SECRET (yours, else a\n"
                   "new random one per launch) set, and prefixes each output line with \"[rank r] \".\n"
                   "When a rank fails, the others are stopped (SIGTERM, then SIGKILL after the grace\n"
                   "period) and the launcher exits non-zero naming the rank.");
  flags.add("-n,--nprocs", opts.nprocs, "number of ranks (processes) to start");
  flags.add("--master-addr", opts.master_addr, "address rank 0 serves the bootstrap on");
  flags.add("--master-port", opts.master_port, "port rank 0 serves the bootstrap on; 0 picks a free port");
  flags.add("--grace-ms", grace_ms, "milliseconds between SIGTERM and SIGKILL when stopping ranks");
  std::vector<std::string> command;
  if (auto code = parse_command_flags(flags, "launch", args, &command)) return *code;
  std::string why;
  if (opts.nprocs < 1) why = "-n/--nprocs must be at least 1, got " + std::to_string(opts.nprocs);
  else if (command.empty()) why = "no command given after --";
  else if (opts.master_port < 0 || opts.master_port > 65535)
    why = "--master-port must be in [0, 65535], got " + std::to_string(opts.master_port);
  else if (grace_ms < 0) why = "--grace-ms must be >= 0, got " + std::to_string(grace_ms);
  if (!why.empty()) return usage_error(flags, "launch", why);
  opts.grace = std::chrono::milliseconds(grace_ms);
  return launch(opts, command);
}

}  // namespace epfuse::tools
