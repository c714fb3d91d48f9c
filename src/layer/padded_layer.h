// A layer whose hidden or intermediate size the kernels do not tile (a multiple of 64, e.g. 2880):
// the layer it wraps runs at the padded sizes (padding.h) on zero-padded copies of the weights, and
// each forward copies x into padded rows and crops the padded y.
#pragma once
#include <functional>
#include <memory>

#include "common/checked_config.h"
#include "epfuse/communicator.h"
#include "epfuse/config.h"
#include "epfuse/layer.h"
#include "epfuse/types.h"
#include "padding/padding.h"

namespace epfuse {

// Makes the wrapped layer from the padded config and padded weights (collective).
using MakeLayer = std::function<std::unique_ptr<MoeLayer>(const detail::CheckedConfig&, const ExpertWeights&)>;

// Collective. cfg as the caller gave it (checked and agreed on every rank already; the padded sizes are
// checked here, once, and handed to make_inner); `shared_stage`: gives the
// staging rows shared with the other padded layers of a workspace, or is empty for rows of the layer's own. Reads
// the caller's weights once (synchronously: they must be written before the call), checks them like
// the layers do (FP8 scale counts and values against cfg's unpadded shapes) and keeps padded copies.
std::unique_ptr<MoeLayer> make_padded_layer(Impl impl, const detail::CheckedConfig& cfg, Communicator& comm,
                                            const ExpertWeights& weights,
                                            const std::function<std::shared_ptr<padding::Stage>()>& shared_stage,
                                            const MakeLayer& make_inner);

}  // namespace epfuse
