// The fused protocol's routing helpers (src/device/protocol/routing.h) and buffer layout (regions.h) on
// the duplicate expert ids that epfuse/types.h allows: a token naming one expert in several slots
// travels ONCE to that expert's rank (first_slot_for_rank: one row per token and receiver), but every
// slot is its own pair there (layout_task gives each routed slot a pair index), its own combine row
// (RowEntry::slot) and its own share of the home's completion count (token_signal_target), so the
// home waits for, and sums, one contribution per slot, as the reference does.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "device/protocol/regions.h"
#include "device/protocol/routing.h"

namespace epfuse::device {
namespace {

// Slot j's owner of the token's row at its receiver, for every slot.
std::vector<int> owners(const std::vector<int32_t>& idx, int E, int L) {
  std::vector<int> out;
  for (int j = 0; j < static_cast<int>(idx.size()); ++j) out.push_back(first_slot_for_rank(idx.data(), j, E, L));
  return out;
}

TEST(FusedRoutingInputs, DuplicateExpertSharesTheRowNotTheContribution) {
  const int E = 16, L = 4, H = 7168;  // 4 ranks; experts 5 and 6 live on rank 1, 13 on rank 3
  const std::vector<int32_t> idx = {5, 5, 13, 6, -1, 5};
  const int k = static_cast<int>(idx.size());
  // One row per (token, receiver): every rank-1 slot uses slot 0's row, the duplicates included.
  EXPECT_EQ(owners(idx, E, L), (std::vector<int>{0, 0, 2, 0, -1, 0}));
  // Every routed slot counts, duplicates too: the home waits for 5 slots' output tiles, not for the
  // 3 distinct experts or the 2 receivers.
  EXPECT_EQ(routed_slots(idx.data(), k, E), 5);
  EXPECT_EQ(token_signal_target(idx.data(), k, E, H), 5u * signal_units(H));
}

TEST(FusedRoutingInputs, EverySlotHasItsOwnCombineRow) {
  // A token whose slots all name one expert: each slot's output lands in a row of its own, so the
  // home's slot-order sum adds the expert's output once per slot.
  const FusedDims d{4, 256, 128, 16, 4, 8};
  const SymRegions s = make_sym_regions(d);
  const int t = d.max_tokens - 1;
  std::set<size_t> starts;
  for (uint32_t parity : {0u, 1u}) {
    for (int j = 0; j < d.topk; ++j) {
      const size_t at = combine_row_offset(s, d, parity, t, j);
      EXPECT_TRUE(starts.insert(at).second) << "slot " << j << " shares a combine row";
      EXPECT_GE(at, s.combine_rows);
      EXPECT_LE(at + static_cast<size_t>(d.hidden) * 2, s.token_signals);
      if (j > 0) {
        EXPECT_EQ(at - combine_row_offset(s, d, parity, t, j - 1), static_cast<size_t>(d.hidden) * 2);
      }
    }
  }
}

TEST(FusedRoutingInputs, AllSlotsOnOneExpertFitTheBuffers) {
  // top-k above the experts per rank (k = 4, one expert per rank), every slot of every token of every
  // sender on expert 3: rows per receiver stay one per token, pairs reach T_max * k per sender and
  // world * T_max * k at the receiver, which is what the buffers hold.
  const FusedDims d{8, 128, 128, 8, 4, 50};
  const int E = d.num_experts, L = d.local_experts(), k = d.topk;
  const std::vector<int32_t> idx(k, 3);
  EXPECT_EQ(owners(idx, E, L), (std::vector<int>(k, 0)));  // one row at rank 3
  const int pairs_per_token = routed_slots(idx.data(), k, E);
  EXPECT_EQ(pairs_per_token, k);

  const SymRegions s = make_sym_regions(d);
  // The last sender's last entry of the last parity ends inside recv_entries.
  const int64_t last_entry = int64_t{d.max_tokens} * pairs_per_token - 1;
  EXPECT_LE(recv_entry_offset(s, d, 1, d.world - 1, last_entry) + sizeof(RowEntry), s.count_words);
  // Every received pair has a row of h and is counted in the m-block bound (all on one expert).
  const int64_t received = int64_t{d.world} * d.max_tokens * pairs_per_token;
  EXPECT_GE(d.max_recv_pairs(), received);
  EXPECT_GE(d.max_mblocks(kMinBlockM), (received + kMinBlockM - 1) / kMinBlockM);
}

}  // namespace
}  // namespace epfuse::device
