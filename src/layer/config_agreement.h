// Creation-time agreement of the ranks on a layer's configuration. Ranks created with different
// shapes, experts, top-k, token capacity, clamp or implementation would exchange buffers laid out
// differently and corrupt each other without an error; one small all-gather at creation turns that
// into the same Error on every rank.
#pragma once

#include "common/checked_config.h"
#include "epfuse/config.h"
#include "epfuse/layer.h"

namespace epfuse {

class Communicator;

// Collective: every rank calls it with its own cfg and impl before any other collective of the
// creation (one Communicator::all_gather). Every rank receives every rank's config, so all of them
// compute the same verdict and throw alike, never one rank alone while its peers wait:
//   - a config check_config rejects on any rank: Error(kInvalidConfig) "rank R: <what>: rank Q has an
//     invalid config: <check_config's message for rank Q's config>" (the first such rank Q);
//   - otherwise ranks that differ in hidden, intermediate, num_experts, topk, max_tokens_per_rank,
//     swiglu_clamp (bit for bit) or impl: Error(kInvalidConfig) "rank R: <what>: ranks disagree on
//     <first differing field>: rank 0 = v0, rank 1 = v1, ...".
// num_sms is gathered for check_config but never compared: each rank chooses its own SM budget.
// `what` names the caller, e.g. "MoeLayer::create". Returns cfg as checked for comm.world_size(): the
// one validation of the creation (the layers, plans and workspaces take the CheckedConfig).
detail::CheckedConfig check_same_config_on_every_rank(Communicator& comm, const LayerConfig& cfg, Impl impl,
                                                      const char* what);

}  // namespace epfuse
