// epfuse::Error and the names of its codes.
#include "epfuse/error.h"

namespace epfuse {

const char* to_string(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::kInvalidConfig:
      return "invalid config";
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kCuda:
      return "CUDA error";
    case ErrorCode::kNccl:
      return "NCCL error";
    case ErrorCode::kBootstrap:
      return "bootstrap error";
    case ErrorCode::kTimeout:
      return "timeout";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kInternal:
      return "internal error";
    case ErrorCode::kAborted:
      return "aborted";
  }
  return "unknown error";
}

Error::Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}

}  // namespace epfuse
