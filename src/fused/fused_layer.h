// The fused implementation of MoeLayer (--impl fused): one persistent kernel launch per forward.
#pragma once
#include <memory>
#include <optional>

#include "common/checked_config.h"
#include "epfuse/communicator.h"
#include "epfuse/config.h"
#include "epfuse/layer.h"
#include "epfuse/types.h"
#include "epfuse/workspace.h"
#include "fused/heuristics.h"
#include "padding/padding.h"

namespace epfuse::fused {

// Collective (allocates the symmetric window). Throws Error(kInvalidConfig) for shapes the kernel
// cannot tile, Error(kUnsupported) when the kernel cannot be resident on this GPU.
// Environment: EPFUSE_TIMEOUT_MS bounds every device-side wait (default 20000).
// Configs arrive checked for comm's world size (checked_config.h: MoeLayer::create, Workspace::create).
// A layer with a workspace of its own (sized for cfg).
std::unique_ptr<MoeLayer> make_fused_layer(const detail::CheckedConfig& cfg, Communicator& comm,
                                           const ExpertWeights& weights);
// Collective: a workspace for layers up to `capacity` (Workspace::create).
std::unique_ptr<Workspace> make_fused_workspace(Communicator& comm, const detail::CheckedConfig& capacity);
// Collective: a layer on a shared workspace made by make_fused_workspace; Error(kInvalidConfig) when
// it does not fit.
std::unique_ptr<MoeLayer> make_fused_layer(const detail::CheckedConfig& cfg, Workspace& workspace,
                                           const ExpertWeights& weights);

// The staging rows the padded layers on a fused workspace share (padding.h), allocated on the first
// call; call it inside an agreed creation step (it allocates).
std::shared_ptr<padding::Stage> fused_pad_stage(Workspace& workspace);

// The tile shape (kernel instantiation) the fused layer's last forward launched; nullopt before its
// first launch or for a layer that is not fused. For tests: what ran, not what a formula predicts.
std::optional<GemmTileShape> last_launched_tile(const MoeLayer& layer);

}  // namespace epfuse::fused
