// The fused implementation of MoeLayer (--impl fused): one persistent kernel launch per forward.
#pragma once
#include <memory>

#include "epfuse/communicator.h"
#include "epfuse/config.h"
#include "epfuse/layer.h"
#include "epfuse/types.h"

namespace epfuse::fused {

// Collective (allocates the symmetric window). Throws Error(kInvalidConfig) for shapes the kernel
// cannot tile, Error(kUnsupported) when the kernel cannot be resident on this GPU.
// Environment: EPFUSE_TIMEOUT_MS bounds every device-side wait (default 20000).
std::unique_ptr<MoeLayer> make_fused_layer(const LayerConfig& cfg, Communicator& comm, const ExpertWeights& weights);

}  // namespace epfuse::fused
