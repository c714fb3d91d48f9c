// The throwing halves of src/common/check.h's macros: one message format for every failed call,
// "<call> failed at <file>:<line> on device <d>: <description> (<name>)".
#include "common/check.h"

#include <cstring>
#include <string>

namespace epfuse::detail {
namespace {

// Paths from __FILE__ are absolute in most builds; from the project's top folders on is enough.
const char* short_path(const char* file) {
  const char* best = file;
  for (const char* top : {"/src/", "/tests/", "/tools/", "/include/"}) {
    for (const char* p = std::strstr(file, top); p != nullptr; p = std::strstr(p + 1, top)) best = p + 1;
  }
  return best;
}

// The current device, when the runtime can still say (it cannot on a machine without a driver).
std::string device_clause() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();  // do not leave our query's failure behind as the "last error"
    return "";
  }
  return " on device " + std::to_string(device);
}

std::string where(const char* call, const char* file, int line) {
  return std::string(call) + " failed at " + short_path(file) + ":" + std::to_string(line) + device_clause();
}

}  // namespace

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  // Reported here, so cleared: a failed launch's error would otherwise come back from the next
  // cudaGetLastError (EPFUSE_CUDA_CHECK_LAUNCH), in another call. A sticky error stays the context's.
  (void)cudaGetLastError();
  throw Error(ErrorCode::kCuda,
              where(call, file, line) + ": " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(ErrorCode::kCuda,
              where(call, file, line) + ": " + cublasGetStatusString(st) + " (" + cublasGetStatusName(st) + ")");
}

void throw_nccl(ncclResult_t res, const char* call, const char* file, int line) {
  std::string message = where(call, file, line) + ": " + ncclGetErrorString(res);
  // NCCL keeps a more specific reason per thread (e.g. which argument was invalid).
  const char* detail = ncclGetLastError(nullptr);
  if (detail != nullptr && detail[0] != '\0') message += std::string("; last NCCL error: ") + detail;
  throw Error(ErrorCode::kNccl, message);
}

}  // namespace epfuse::detail
