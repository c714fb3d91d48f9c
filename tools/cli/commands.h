// The `epfuse` subcommands. Each returns the process exit code: 0 success, 1 failure (after
// printing "epfuse: <reason>"), 2 usage error; they throw UsageError for bad flags.
#pragma once
#include <string>
#include <vector>

namespace epfuse::tools {

int launch_command(const std::vector<std::string>& args);
int run_command(const std::vector<std::string>& args);

// Prints "epfuse: <reason>" on stderr and returns 1.
int fail(const std::string& reason);

}  // namespace epfuse::tools
