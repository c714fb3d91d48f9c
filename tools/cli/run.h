// The two ways `epfuse run` executes a resolved plan.
#pragma once
#include <string>

#include "cli/run_options.h"
#include "epfuse/communicator.h"

namespace epfuse::tools {

// The float64 CPU reference for every simulated rank's tokens (no GPU involved).
int run_reference(const RunPlan& plan, const std::string& command);
// One rank of a GPU run (RANK set): bootstrap, the layer, the calls, the verdict.
int run_rank(const RunPlan& plan, const BootstrapOptions& boot, const std::string& command);
// Every rank of the plan in this process on GPU 0, one thread each (--one-gpu, LoopbackWorld).
int run_one_gpu(const RunPlan& plan, const std::string& command);

}  // namespace epfuse::tools
