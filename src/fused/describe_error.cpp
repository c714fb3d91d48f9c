#include "fused/describe_error.h"

#include <string>

#include "device/protocol/task_map.h"

namespace epfuse::fused {
namespace {

const char* phase_name(int phase) {
  switch (static_cast<device::Phase>(phase)) {
    case device::Phase::kLayout: return "layout";
    case device::Phase::kPublish: return "publish counts";
    case device::Phase::kDispatch: return "dispatch";
    case device::Phase::kCollect: return "collect counts";
    case device::Phase::kLinear1: return "linear1";
    case device::Phase::kLinear2: return "linear2";
    case device::Phase::kCombine: return "combine";
    case device::Phase::kDone: break;
  }
  return "unknown phase";
}

std::string what_text(const device::ErrorRecord& r) {
  using device::WaitKind;
  const std::string a = std::to_string(r.a), b = std::to_string(r.b);
  switch (static_cast<WaitKind>(r.what)) {
    case WaitKind::kLayoutDone: return "this rank's layout tasks";
    case WaitKind::kCounts: return "the count message of rank " + a;
    case WaitKind::kArrivals: return "arrivals of local expert " + a + " from all senders";
    case WaitKind::kPlan: return "this rank's expert plan (collect task)";
    case WaitKind::kLinear1: return "linear1 tiles of m-block " + a + " (local expert " + b + ")";
    case WaitKind::kTokenTiles: return "output tiles of token " + a + " from its experts' ranks";
    case WaitKind::kPipeline: return "the operand pipeline of GEMM tile (m-block " + a + ", n-block " + b + ")";
    case WaitKind::kTaskSlot: return "the next task from this CTA's producer warps (task slot " + a + ")";
    case WaitKind::kNone: break;
  }
  return "unknown wait " + std::to_string(r.what);
}

std::string input_problem(uint32_t kind) {
  switch (static_cast<device::ErrorKind>(kind)) {
    case device::ErrorKind::kBadExpert: return "an expert id out of range";
    case device::ErrorKind::kBadTokenCount: return "num_tokens out of range";
    case device::ErrorKind::kBadPointer: return "a null, misaligned or aliased pointer";
    default: break;
  }
  return "status " + std::to_string(kind);
}

}  // namespace

ErrorCode error_code(const device::ErrorRecord& rec) {
  switch (static_cast<device::ErrorKind>(rec.kind)) {
    case device::ErrorKind::kTimeout: return ErrorCode::kTimeout;
    case device::ErrorKind::kBadExpert:
    case device::ErrorKind::kPeerBadInput:
    case device::ErrorKind::kBadTokenCount:
    case device::ErrorKind::kBadPointer:
    case device::ErrorKind::kPeerOtherLayer: return ErrorCode::kInvalidArgument;
    case device::ErrorKind::kNone: break;
  }
  return ErrorCode::kInternal;
}

std::string describe_error(const device::ErrorRecord& r) {
  const std::string rank = "rank " + std::to_string(r.rank) + ": ";
  switch (static_cast<device::ErrorKind>(r.kind)) {
    case device::ErrorKind::kTimeout:
      return rank + "timed out in " + phase_name(r.phase) + " waiting for " + what_text(r) + " (expected " +
             std::to_string(r.expected) + ", saw " + std::to_string(r.seen) + ")";
    case device::ErrorKind::kBadExpert:
      return rank + "topk_idx[" + std::to_string(r.a) + "][" + std::to_string(r.b) + "] = " +
             std::to_string(static_cast<int32_t>(r.expected)) + " is not a valid expert id (-1 or [0, E))";
    case device::ErrorKind::kPeerBadInput:
      return rank + "rank " + std::to_string(r.a) + " reported invalid input (" + input_problem(r.seen) + ")";
    case device::ErrorKind::kBadTokenCount:
    case device::ErrorKind::kBadPointer:
      return rank + "invalid input (" + input_problem(static_cast<uint32_t>(r.kind)) + ")";
    case device::ErrorKind::kPeerOtherLayer:
      return rank + "rank " + std::to_string(r.a) + " called another layer in this call (its layer " +
             std::to_string(r.seen) + ", this rank's " + std::to_string(r.expected) +
             ", by creation order on the workspace): every rank must call the same layer in the same order";
    case device::ErrorKind::kNone: return rank + "no error";
  }
  return rank + "unknown device error kind " + std::to_string(r.kind);
}

}  // namespace epfuse::fused
