// MoeLayer::create: checks that every rank has the same valid config, then picks the implementation.
#include "epfuse/layer.h"

#include <string>

#include "comm/collective_step.h"
#include "epfuse/communicator.h"
#include "common/check.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"
#include "epfuse/workspace.h"
#include "fused/fused_layer.h"
#include "layer/config_agreement.h"
#include "layer/padded_layer.h"
#include "padding/padding.h"
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

// FP8 weights are checked by the layer that runs them (weights/fp8_weights.h), which reads their scales.
void require_weights(const Communicator& comm, const LayerConfig& cfg, const ExpertWeights& weights) {
  if (cfg.weight_format == WeightFormat::kBf16 && (weights.w13 == nullptr || weights.w2 == nullptr))
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(comm.rank()) +
                                                 ": MoeLayer::create: expert weights w13/w2 must not be null");
}

}  // namespace

std::unique_ptr<MoeLayer> MoeLayer::create(Impl impl, const LayerConfig& cfg, Communicator& comm,
                                           const ExpertWeights& weights) {
  const detail::CheckedConfig checked = check_same_config_on_every_rank(comm, cfg, impl, "MoeLayer::create");
  // One rank's null weights fail every rank (its peers would otherwise wait in the next collective).
  detail::agree_on_step(comm, "MoeLayer::create", [&] { require_weights(comm, cfg, weights); });
  const MakeLayer make = [&](const detail::CheckedConfig& c, const ExpertWeights& w) -> std::unique_ptr<MoeLayer> {
    switch (impl) {
      case Impl::kUnfused: {
        // Its creation has no collective of its own: agree that every rank's succeeded, so that no rank
        // enters the first forward's NCCL all-to-all while a peer's creation failed.
        std::unique_ptr<MoeLayer> layer;
        detail::agree_on_step(comm, "MoeLayer::create (unfused)", [&] { layer = unfused::make_unfused_layer(c, comm, w); });
        return layer;
      }
      case Impl::kFused: return fused::make_fused_layer(c, comm, w);
    }
    throw Error(ErrorCode::kInvalidArgument, "MoeLayer::create: unknown impl " + std::to_string(static_cast<int>(impl)));
  };
  if (padding::needs_padding(cfg, impl)) return make_padded_layer(impl, checked, comm, weights, nullptr, make);
  return make(checked, weights);
}

std::unique_ptr<MoeLayer> MoeLayer::create(const LayerConfig& cfg, Workspace& workspace, const ExpertWeights& weights) {
  Communicator& comm = workspace.comm();
  const detail::CheckedConfig checked =
      check_same_config_on_every_rank(comm, cfg, Impl::kFused, "MoeLayer::create");
  detail::agree_on_step(comm, "MoeLayer::create", [&] { require_weights(comm, cfg, weights); });
  const MakeLayer make = [&](const detail::CheckedConfig& c, const ExpertWeights& w) {
    return fused::make_fused_layer(c, workspace, w);
  };
  if (!padding::needs_padding(cfg, Impl::kFused)) return make(checked, weights);
  // Checked before the padded copies are made: the wrapped layer's own check names padded sizes.
  detail::agree_on_step(comm, "MoeLayer::create", [&] {
    const std::string fits = workspace.check_fits(cfg);
    EPFUSE_REQUIRE(fits.empty(), ErrorCode::kInvalidConfig,
                   "rank " + std::to_string(comm.rank()) + ": the layer does not fit its workspace: " + fits);
  });
  return make_padded_layer(Impl::kFused, checked, comm, weights, [&] { return fused::fused_pad_stage(workspace); },
                           make);
}

std::unique_ptr<Workspace> Workspace::create(Communicator& comm, const LayerConfig& capacity) {
  return fused::make_fused_workspace(comm,
                                     check_same_config_on_every_rank(comm, capacity, Impl::kFused, "Workspace::create"));
}

}  // namespace epfuse
