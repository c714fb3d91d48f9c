// Routing of one token's top-k slots to ranks and local experts: which slots are routed, which rank
// owns an expert, and which slot of a token carries its row to a rank (a token travels once per
// destination rank even when several of its experts live there).
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace epfuse::device {

// A slot is routed when its expert id is a valid global expert; -1 marks a dropped slot.
EPFUSE_HD bool slot_is_routed(int32_t expert, int num_experts) { return expert >= 0 && expert < num_experts; }
// Anything else than -1 or a valid id is bad input (reported as Error(kInvalidArgument)).
EPFUSE_HD bool slot_is_invalid(int32_t expert, int num_experts) { return expert < -1 || expert >= num_experts; }

EPFUSE_HD int expert_rank(int expert, int local_experts) { return expert / local_experts; }
EPFUSE_HD int expert_local(int expert, int local_experts) { return expert % local_experts; }

// The first routed slot of the token (slots idx[0, k)) whose expert lives on the same rank as slot j's,
// or -1 when slot j is not routed. That slot owns the token's row slot in the receiver's buffer.
EPFUSE_HD int first_slot_for_rank(const int32_t* idx, int j, int num_experts, int local_experts) {
  if (!slot_is_routed(idx[j], num_experts)) return -1;
  const int rank = expert_rank(idx[j], local_experts);
  for (int i = 0; i < j; ++i)
    if (slot_is_routed(idx[i], num_experts) && expert_rank(idx[i], local_experts) == rank) return i;
  return j;
}

// What routed slot j of a token draws from the layout's ticket dispenser (layout_task): a pair index
// at its expert, and a row slot at its receiver when it owns the token's row there
// (first_slot_for_rank). An unrouted slot draws nothing.
struct SlotTickets {
  bool routed = false;    // draws a pair index at pair_expert
  bool owns_row = false;  // draws a row slot at row_rank
  int32_t pair_expert = -1;
  int row_rank = -1;
};
EPFUSE_HD SlotTickets slot_tickets(const int32_t* idx, int j, int num_experts, int local_experts) {
  SlotTickets s;
  s.routed = slot_is_routed(idx[j], num_experts);
  if (!s.routed) return s;
  s.pair_expert = idx[j];
  s.row_rank = expert_rank(idx[j], local_experts);
  s.owns_row = first_slot_for_rank(idx, j, num_experts, local_experts) == j;
  return s;
}

// Number of routed slots of a token: the contributions its home rank waits for.
EPFUSE_HD int routed_slots(const int32_t* idx, int k, int num_experts) {
  int n = 0;
  for (int j = 0; j < k; ++j) n += slot_is_routed(idx[j], num_experts) ? 1 : 0;
  return n;
}

// The token's routed slots as a mask, bit j for slot j (k <= 32): the slots whose rows the combine adds.
EPFUSE_HD uint32_t routed_slot_mask(const int32_t* idx, int k, int num_experts) {
  uint32_t mask = 0;
  for (int j = 0; j < k; ++j) mask |= slot_is_routed(idx[j], num_experts) ? 1u << j : 0u;
  return mask;
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
