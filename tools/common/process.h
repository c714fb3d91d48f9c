// What the `run` and `bench` commands ask of the machine and the process before starting ranks.
#pragma once
#include <string>

namespace epfuse::tools {

// True when environment variable `name` is set to exactly `value`.
bool env_is(const char* name, const char* value);
// GPUs usable by this process: 0 with no driver, CUDA_VISIBLE_DEVICES="" or EPFUSE_FORCE_CPU=1.
int visible_gpus();
// The name of GPU 0, or "unknown".
std::string device_name();
// GPU 0's UUID as nvidia-smi -L writes it ("GPU-" and 16 bytes of hex in 8-4-4-4-12 groups), or
// "unknown": which machine a result came from, when two of one model behave differently.
std::string device_uuid();
// The nvidia-smi spelling of a 16-byte UUID (cudaDeviceProp::uuid).
std::string format_gpu_uuid(const unsigned char (&bytes)[16]);
// This executable's path, so a command can start its ranks as copies of itself ("epfuse" if unknown:
// a PATH lookup).
std::string self_executable();

}  // namespace epfuse::tools
