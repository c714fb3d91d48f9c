// Routing of one token's top-k slots to ranks and local experts: which slots are routed, which rank
// owns an expert, and which slot of a token owns its row at a rank (a token travels once per
// destination rank even when several of its experts live there).
#pragma once
#include <cstdint>

#include "common/hash.h"  // EPFUSE_HD

namespace epfuse::device {

// A slot is routed when its expert id is a valid global expert; -1 marks a dropped slot.
EPFUSE_HD bool slot_is_routed(int32_t expert, int num_experts) { return expert >= 0 && expert < num_experts; }
// Anything else than -1 or a valid id is bad input (reported as Error(kInvalidArgument)).
EPFUSE_HD bool slot_is_invalid(int32_t expert, int num_experts) { return expert < -1 || expert >= num_experts; }

EPFUSE_HD int expert_rank(int expert, int local_experts) { return expert / local_experts; }
EPFUSE_HD int expert_local(int expert, int local_experts) { return expert % local_experts; }

// The slot of a token (slots idx[0, k)) that owns its row slot at the rank of slot j's expert, or -1
// when slot j is not routed: the routed slot there with the smallest expert id (the first of them when
// an expert repeats). Owning by the smallest expert lets dispatch go in expert order (task_map.h): the
// row of any pair of local expert g at a receiver travels with the rows owned by experts <= g, so an
// expert's pairs are complete once the dispatch groups up to it are done.
EPFUSE_HD int owner_slot_for_rank(const int32_t* idx, int k, int j, int num_experts, int local_experts) {
  if (!slot_is_routed(idx[j], num_experts)) return -1;
  const int rank = expert_rank(idx[j], local_experts);
  int owner = j;
  for (int i = 0; i < k; ++i) {
    if (!slot_is_routed(idx[i], num_experts) || expert_rank(idx[i], local_experts) != rank) continue;
    if (idx[i] < idx[owner] || (idx[i] == idx[owner] && i < owner)) owner = i;
  }
  return owner;
}

// Number of routed slots of a token: the contributions its home rank waits for.
EPFUSE_HD int routed_slots(const int32_t* idx, int k, int num_experts) {
  int n = 0;
  for (int j = 0; j < k; ++j) n += slot_is_routed(idx[j], num_experts) ? 1 : 0;
  return n;
}

// The home rank cannot know the tile shape the expert ranks chose (a per-rank choice), so output
// tiles signal in units of kSignalCols columns: a token is complete when its counter advanced by
// routed slots x H / kSignalCols.
inline constexpr int kSignalCols = 128;
EPFUSE_HD uint32_t signal_units(int cols) { return static_cast<uint32_t>(cols / kSignalCols); }
EPFUSE_HD uint32_t token_signal_target(const int32_t* idx, int k, int num_experts, int hidden) {
  return static_cast<uint32_t>(routed_slots(idx, k, num_experts)) * signal_units(hidden);
}

}  // namespace epfuse::device
