// Internal: a LayerConfig validated once, at the front door. MoeLayer::create and Workspace::create
// make one (layer/config_agreement.h: after every rank's config is checked and agreed), the padded
// layer one for its padded sizes; the layers, plans and workspaces below take it instead of checking
// again. Only check() makes one, so holding a CheckedConfig means validate_config accepted it for its
// world size. Implemented in src/core/config.cpp.
#pragma once
#include "epfuse/config.h"

namespace epfuse::detail {

class CheckedConfig {
 public:
  // validate_config(cfg, world_size): Error(kInvalidConfig) with check_config's message, or the pair.
  static CheckedConfig check(const LayerConfig& cfg, int world_size);

  const LayerConfig& config() const { return cfg_; }
  int world_size() const { return world_size_; }
  int experts_per_rank() const { return cfg_.experts_per_rank(world_size_); }

 private:
  CheckedConfig(const LayerConfig& cfg, int world_size) : cfg_(cfg), world_size_(world_size) {}
  LayerConfig cfg_;
  int world_size_;
};

}  // namespace epfuse::detail
