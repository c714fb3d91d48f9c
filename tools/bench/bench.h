// `epfuse bench`: the benchmark sweep (bench/README.md). The CLI calls bench_command with argv[0]
// the command name ("bench") and the flags after it. Returns the process exit code: 0 success,
// 1 failure (a one-line reason "epfuse bench: ..." on stderr), 2 usage error, 77 when
// EPFUSE_SKIP_IF_FEWER_GPUS=1 and --ranks exceeds the GPUs.
#pragma once

namespace epfuse::tools {

int bench_command(int argc, char** argv);

}  // namespace epfuse::tools
