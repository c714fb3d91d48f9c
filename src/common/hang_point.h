// Where EPFUSE_FAULT's kind=hang (common/fault.h) stops one rank's fused kernel: a plain enum shared by
// the parser (src/core/fault.cpp) and the kernel (FusedParams::fault_hang, device/kernel/wait.cuh
// hang_here), so that the host's name and the device's test are one list. What each point leaves the
// ranks waiting for is docs/fused_design.md's EPFUSE_FAULT entry.
#pragma once
#include <cstdint>
#include <string_view>

namespace epfuse {

enum class HangPoint : int32_t {
  kNone = 0,
  kPublish = 1,    // the publish task, before it writes this rank's count messages
  kDispatch = 2,   // every dispatch task, before it sends a row, an entry or an arrival
  kCollect = 3,    // the collect task, before it reads the counts: this rank's plan never comes
  kProducer = 4,   // a warp-specialised CTA's producer warps, after posting a GEMM tile, before its loads
  kScheduler = 5,  // a warp-specialised CTA's producer warps, before posting the end of its task stream
};
inline constexpr HangPoint kHangPoints[] = {HangPoint::kPublish, HangPoint::kDispatch, HangPoint::kCollect,
                                            HangPoint::kProducer, HangPoint::kScheduler};

constexpr std::string_view to_string(HangPoint at) {
  switch (at) {
    case HangPoint::kPublish: return "publish";
    case HangPoint::kDispatch: return "dispatch";
    case HangPoint::kCollect: return "collect";
    case HangPoint::kProducer: return "producer";
    case HangPoint::kScheduler: return "scheduler";
    case HangPoint::kNone: break;
  }
  return "none";
}

}  // namespace epfuse
