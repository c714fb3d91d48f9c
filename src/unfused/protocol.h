// Protocol arithmetic of the unfused chain, shared by its kernels and its CPU tests: where a token
// goes (once per destination rank), what it carries there, and the counts every rank exchanges
// before any row moves. Plain __host__ __device__ functions so the CPU tests check the exact code
// the kernels run.
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace epfuse::unfused {

EPFUSE_HD int64_t round_up(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
EPFUSE_HD int64_t ceil_div(int64_t value, int64_t divisor) { return (value + divisor - 1) / divisor; }

// ---- Routing of one token -----------------------------------------------------------------------

// Ids outside [0, E) (the dropped slot -1 and bad ids) route nowhere; bad ids are reported as errors
// before any data moves, so the kernels may simply skip them.
EPFUSE_HD bool routed(int32_t expert, int num_experts) { return expert >= 0 && expert < num_experts; }
EPFUSE_HD int rank_of_expert(int32_t expert, int experts_per_rank) { return expert / experts_per_rank; }
EPFUSE_HD int local_expert_of(int32_t expert, int experts_per_rank) { return expert % experts_per_rank; }

// Slot j carries the token to its expert's rank iff no earlier slot already goes there: a token is
// sent ONCE per destination rank however many of its experts live there.
EPFUSE_HD bool first_slot_for_rank(const int32_t* token_experts, int slot, int num_experts,
                                   int experts_per_rank) {
  const int32_t expert = token_experts[slot];
  if (!routed(expert, num_experts)) return false;
  const int dest = rank_of_expert(expert, experts_per_rank);
  for (int j = 0; j < slot; ++j)
    if (routed(token_experts[j], num_experts) && rank_of_expert(token_experts[j], experts_per_rank) == dest)
      return false;
  return true;
}

// The local expert that slot j asks for on rank `dest`, or -1 when the slot goes elsewhere.
EPFUSE_HD int32_t local_expert_at(const int32_t* token_experts, int slot, int dest, int num_experts,
                                  int experts_per_rank) {
  const int32_t expert = token_experts[slot];
  if (!routed(expert, num_experts) || rank_of_expert(expert, experts_per_rank) != dest) return -1;
  return local_expert_of(expert, experts_per_rank);
}

// ---- A dispatched token: its row, then its routing on the destination ------------------------------
// [x row: H bf16][local expert per slot: k int32, -1 = not here][top-k weight per slot: k float][pad]
// One record per (token, destination rank), so one ncclSend per peer moves rows and routing together.

EPFUSE_HD int64_t record_meta_offset(int hidden) { return int64_t{hidden} * 2; }
// 16-byte multiple so every record's row starts 16-byte aligned for vector copies.
EPFUSE_HD int64_t record_bytes(int hidden, int topk) {
  return record_meta_offset(hidden) + round_up(int64_t{topk} * 8, 16);
}

// ---- The counts matrix: one row of words per (sender, destination) pair -------------------------------
// Exchanged with one small all-to-all before the rows; the host reads it once (the forward's only
// host synchronisation). The error words are the same in every row of a sender, so every rank
// learns every rank's input error and all of them throw the same Error before any row is sent.
struct CountsRow {
  static constexpr int kTokens = 0;      // records sent to this destination
  static constexpr int kErrorCode = 1;   // InputError of the sender
  static constexpr int kErrorToken = 2;  // first offending token (or the token count)
  static constexpr int kErrorSlot = 3;   // its slot
  static constexpr int kErrorValue = 4;  // the offending value
  static constexpr int kExpertRows = 5;  // + local expert: rows (token, slot) for it
};
EPFUSE_HD int counts_words(int experts_per_rank) { return CountsRow::kExpertRows + experts_per_rank; }

enum class InputError : int32_t {
  kNone = 0,
  kExpertOutOfRange = 1,  // topk_idx[token][slot] = value outside [-1, E)
  kTokenCount = 2,        // num_tokens = value outside [0, max_tokens_per_rank]
  kNullPointer = 3,       // value = bitmask of null pointers (NullPointer bits) with num_tokens > 0
  kMisaligned = 4,        // value = bitmask (NullPointer bits) of x / y not 16-byte aligned, num_tokens > 0
  kCallerFp8X = 5,        // TokenBatch::x_fp8 / x_scales set: the chain sends bf16 rows (fused layer only)
  kAliased = 6,           // value = bitmask (NullPointer bits) of the inputs y overlaps, num_tokens > 0
};
struct NullPointer {
  static constexpr int32_t kX = 1, kTopkIdx = 2, kTopkWeights = 4, kOutput = 8;
};

// The first bad expert id wins: keys are ordered by (token, slot) with the value carried along,
// inverted so that an atomicMax over a zero-initialised word keeps the smallest, and 0 means none.
EPFUSE_HD uint64_t bad_expert_key(int token, int slot, int topk, int32_t value) {
  const uint64_t flat = static_cast<uint64_t>(token) * static_cast<uint64_t>(topk) + static_cast<uint64_t>(slot);
  return ~((flat << 32) | static_cast<uint32_t>(value));
}
struct BadExpert {
  int token, slot;
  int32_t value;
};
EPFUSE_HD BadExpert decode_bad_expert(uint64_t key, int topk) {
  const uint64_t raw = ~key;
  const uint64_t flat = raw >> 32;
  return {static_cast<int>(flat / static_cast<uint64_t>(topk)), static_cast<int>(flat % static_cast<uint64_t>(topk)),
          static_cast<int32_t>(static_cast<uint32_t>(raw & 0xffffffffu))};
}

// ---- Offsets from counts -----------------------------------------------------------------------------

// First record of peer p's block in a buffer laid out peer after peer: sum over q < p of row q's
// kTokens word (send side: my rows; receive side: the rows peers sent me).
EPFUSE_HD int64_t peer_record_offset(const int32_t* counts, int words, int peer) {
  int64_t offset = 0;
  for (int q = 0; q < peer; ++q) offset += counts[q * words + CountsRow::kTokens];
  return offset;
}
// Rows of local expert `local` received from all `world` senders.
EPFUSE_HD int64_t expert_rows(const int32_t* recv_counts, int words, int world, int local) {
  int64_t rows = 0;
  for (int s = 0; s < world; ++s) rows += recv_counts[s * words + CountsRow::kExpertRows + local];
  return rows;
}

// ---- Launch geometry ---------------------------------------------------------------------------------

// Blocks for `work_items` independent items handled `items_per_block` at a time: enough to fill every
// SM `blocks_per_sm` times, never more than there is work, at least one (a launch with no work is
// still valid: the pack kernel always writes the error words).
EPFUSE_HD int grid_blocks(int64_t work_items, int items_per_block, int sm_count, int blocks_per_sm) {
  const int64_t needed = ceil_div(work_items, items_per_block);
  const int64_t cap = int64_t{sm_count} * blocks_per_sm;
  const int64_t blocks = needed < cap ? needed : cap;
  return blocks < 1 ? 1 : static_cast<int>(blocks);
}

// A grid-stride walk over the flat index row * row_vecs + vec of a [rows, row_vecs] array, kept as a
// (row, vec) pair so that a step needs no division (64-bit division is a long software routine on
// the GPU): one division per thread at the start, then an add and at most one carry per step.
struct RowVecWalk {
  int64_t row;
  int vec;
  int64_t stride_rows;
  int stride_vecs;  // < row_vecs
  int row_vecs;
};
EPFUSE_HD RowVecWalk row_vec_walk(int64_t start, int64_t stride, int row_vecs) {
  return {start / row_vecs, static_cast<int>(start % row_vecs), stride / row_vecs,
          static_cast<int>(stride % row_vecs), row_vecs};
}
EPFUSE_HD void advance(RowVecWalk& w) {
  w.row += w.stride_rows;
  w.vec += w.stride_vecs;
  if (w.vec >= w.row_vecs) {
    w.vec -= w.row_vecs;
    ++w.row;
  }
}

}  // namespace epfuse::unfused
