#include "common/process.h"

#include <unistd.h>

#include <cstdlib>

#include <cuda_runtime.h>

namespace epfuse::tools {

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::string(v) == value;
}

int visible_gpus() {
  if (env_is("EPFUSE_FORCE_CPU", "1")) return 0;
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: a machine without a GPU is not an error here
    return 0;
  }
  return n;
}

std::string device_name() {
  cudaDeviceProp prop{};
  return cudaGetDeviceProperties(&prop, 0) == cudaSuccess ? prop.name : "unknown";
}

std::string format_gpu_uuid(const unsigned char (&bytes)[16]) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += kHex[bytes[i] >> 4];
    out += kHex[bytes[i] & 15];
  }
  return out;
}

std::string device_uuid() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "unknown";
  unsigned char bytes[16];
  for (int i = 0; i < 16; ++i) bytes[i] = static_cast<unsigned char>(prop.uuid.bytes[i]);
  return format_gpu_uuid(bytes);
}

std::string self_executable() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "epfuse";
}

}  // namespace epfuse::tools
