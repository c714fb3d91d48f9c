// MoeLayer::create: checks that every rank has the same valid config, then picks the implementation.
#include "epfuse/layer.h"

#include <string>

#include "comm/agree.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"
#include "epfuse/workspace.h"
#include "fused/fused_layer.h"
#include "layer/agreement.h"
#include "unfused/unfused_layer.h"

namespace epfuse {

std::string_view to_string(Impl impl) {
  switch (impl) {
    case Impl::kUnfused: return "unfused";
    case Impl::kFused: return "fused";
  }
  return "unknown";
}

std::optional<Impl> parse_impl(std::string_view name) {
  for (Impl impl : {Impl::kUnfused, Impl::kFused})
    if (name == to_string(impl)) return impl;
  return std::nullopt;
}

namespace {

// Called after the agreement, so every rank refuses together (the configs are equal by then). The
// unfused layer runs FP8 weights (cuBLASLt block-scaled GEMMs) at every valid size; the fused kernel's
// FP8 tile (128 x 256, k-block 128) only where hidden % 256 == 0 and intermediate % 128 == 0.
void refuse_fp8_until_implemented(const Communicator& comm, const LayerConfig& cfg, Impl impl) {
  if (cfg.weight_format == WeightFormat::kBf16 || impl == Impl::kUnfused) return;
  if (cfg.hidden % 256 == 0 && cfg.intermediate % 128 == 0) return;
  throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(comm.rank()) + ": FP8 weights (weight_format=" +
                                           std::string(to_string(cfg.weight_format)) + ") in the " +
                                           std::string(to_string(impl)) +
                                           " layer need hidden % 256 == 0 and intermediate % 128 == 0 (hidden=" +
                                           std::to_string(cfg.hidden) + ", intermediate=" +
                                           std::to_string(cfg.intermediate) + "); the unfused layer runs them");
}

// FP8 weights are checked by the layer that runs them (unfused/fp8_weights.h), which reads their scales.
void require_weights(const Communicator& comm, const LayerConfig& cfg, const ExpertWeights& weights) {
  if (cfg.weight_format == WeightFormat::kBf16 && (weights.w13 == nullptr || weights.w2 == nullptr))
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(comm.rank()) +
                                                 ": MoeLayer::create: expert weights w13/w2 must not be null");
}

}  // namespace

std::unique_ptr<MoeLayer> MoeLayer::create(Impl impl, const LayerConfig& cfg, Communicator& comm,
                                           const ExpertWeights& weights) {
  check_same_config_on_every_rank(comm, cfg, impl, "MoeLayer::create");
  refuse_fp8_until_implemented(comm, cfg, impl);
  // One rank's null weights fail every rank (its peers would otherwise wait in the next collective).
  detail::agree_on_step(comm, "MoeLayer::create", [&] { require_weights(comm, cfg, weights); });
  switch (impl) {
    case Impl::kUnfused: {
      // Its creation has no collective of its own: agree that every rank's succeeded, so that no rank
      // enters the first forward's NCCL all-to-all while a peer's creation failed.
      std::unique_ptr<MoeLayer> layer;
      detail::agree_on_step(comm, "MoeLayer::create (unfused)",
                            [&] { layer = unfused::make_unfused_layer(cfg, comm, weights); });
      return layer;
    }
    case Impl::kFused: return fused::make_fused_layer(cfg, comm, weights);
  }
  throw Error(ErrorCode::kInvalidArgument, "MoeLayer::create: unknown impl " + std::to_string(static_cast<int>(impl)));
}

std::unique_ptr<MoeLayer> MoeLayer::create(const LayerConfig& cfg, Workspace& workspace, const ExpertWeights& weights) {
  Communicator& comm = workspace.comm();
  check_same_config_on_every_rank(comm, cfg, Impl::kFused, "MoeLayer::create");
  refuse_fp8_until_implemented(comm, cfg, Impl::kFused);
  detail::agree_on_step(comm, "MoeLayer::create", [&] { require_weights(comm, cfg, weights); });
  return fused::make_fused_layer(cfg, workspace, weights);
}

std::unique_ptr<Workspace> Workspace::create(Communicator& comm, const LayerConfig& capacity) {
  check_same_config_on_every_rank(comm, capacity, Impl::kFused, "Workspace::create");
  refuse_fp8_until_implemented(comm, capacity, Impl::kFused);
  return fused::make_fused_workspace(comm, capacity);
}

}  // namespace epfuse
