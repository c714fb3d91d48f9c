// The unfused implementation of MoeLayer (Impl::kUnfused): layout, NCCL all-to-all, permute, cuBLAS
// grouped GEMMs, SwiGLU, pre-reduce, reverse all-to-all, reduce at home. src/layer creates it.
#pragma once
#include <memory>

#include "common/checked_config.h"
#include "epfuse/communicator.h"
#include "epfuse/layer.h"

namespace epfuse::unfused {

// cfg checked for comm.world_size() (MoeLayer::create). Allocates every buffer now (plan.h); no
// collective call.
std::unique_ptr<MoeLayer> make_unfused_layer(const detail::CheckedConfig& cfg, Communicator& comm,
                                             const ExpertWeights& weights);

}  // namespace epfuse::unfused
