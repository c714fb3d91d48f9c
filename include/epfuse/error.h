// epfuse/error.h: the one error type the library throws. The library never calls exit() or abort().
#pragma once
#include <stdexcept>
#include <string>

namespace epfuse {

enum class ErrorCode {
  kInvalidConfig,    // a LayerConfig field is out of range or cannot be tiled
  kInvalidArgument,  // bad input to a call: shapes, expert ids, token counts, pointers
  kCuda,             // a CUDA runtime or cuBLAS call failed
  kNccl,             // an NCCL call failed
  kBootstrap,        // rendezvous over TCP failed or timed out
  kTimeout,          // a bounded wait ran past its bound: on the device (rank, phase and flag in the
                     // message) or a host collective of a LoopbackWorld (the ranks that did not arrive)
  kUnsupported,      // a feature or shape this build does not implement
  kInternal,         // a broken invariant inside epfuse
  kAborted,          // another rank of the world failed first (the message names it and why)
};

const char* to_string(ErrorCode code) noexcept;

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message);
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace epfuse
