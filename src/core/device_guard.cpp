#include "common/device_guard.h"

#include <string>

#include <cuda_runtime.h>

#include "epfuse/error.h"

namespace epfuse::detail {
namespace {

void check(cudaError_t err, const char* call, int rank) {
  if (err == cudaSuccess) return;
  const std::string prefix = rank >= 0 ? "rank " + std::to_string(rank) + ": " : "";
  throw Error(ErrorCode::kCuda,
              prefix + call + " failed: " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

}  // namespace

DeviceGuard::DeviceGuard(int device, int rank) : device_(device) {
  check(cudaGetDevice(&previous_), "cudaGetDevice", rank);
  if (previous_ != device_) check(cudaSetDevice(device_), "cudaSetDevice", rank);
}

// Restoring cannot fail for a device that was current a moment ago.
DeviceGuard::~DeviceGuard() {
  if (previous_ != device_) cudaSetDevice(previous_);
}

}  // namespace epfuse::detail
