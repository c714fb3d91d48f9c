// Where everything lives: byte offsets of every region of the fused kernel's symmetric window (what
// peers write) and of its private workspace (what only this GPU touches), as pure functions of the
// layer shape. The host sizes its allocations with them and the kernel addresses with them, so there is
// one definition of each region. Formulas and why each bound is tight: docs/fused_design.md.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/host_device.h"
#include "device/protocol/task_map.h"

namespace epfuse::device {

inline constexpr size_t kRegionAlign = 256;
// The smallest GEMM m-block any tile shape uses: sizes the per-m-block counters.
inline constexpr int kMinBlockM = 32;

struct FusedDims {
  int world = 1;
  int hidden = 0;        // H
  int intermediate = 0;  // I
  int num_experts = 0;   // E
  int topk = 0;          // k
  int max_tokens = 0;    // T_max per rank

  EPFUSE_HD constexpr int local_experts() const { return num_experts / world; }
  // (token, local expert) pairs one receiver can get in one call: every rank's every slot.
  EPFUSE_HD int64_t max_recv_pairs() const { return static_cast<int64_t>(world) * max_tokens * topk; }
  // Tight upper bound on sum_e ceil(n_e / block_m) over local experts with sum_e n_e <= N pairs: with j
  // non-empty experts it is at most j + (N - j) / block_m, largest at j = min(L, N). Non-increasing in
  // block_m, so sizing for the smallest m-block covers every tile shape.
  EPFUSE_HD int64_t max_mblocks(int block_m) const {
    const int64_t n = max_recv_pairs(), l = local_experts();
    const int64_t j = n < l ? n : l;
    return j + (n - j) / block_m;
  }
};

// One received (token, local expert) pair: written by the sender next to its row.
struct RowEntry {
  int32_t row;    // row slot in the sender's region of recv_rows (or the token index when sender == receiver)
  int32_t token;  // token index at the sender (its home)
  int32_t slot;   // top-k slot j at the sender: the combine slot this pair's output goes to
  float weight;   // top-k weight, applied in the Linear1 epilogue
};
static_assert(sizeof(RowEntry) == 16, "one 16-byte store per entry");

EPFUSE_HD size_t align_region(size_t bytes) { return (bytes + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

// Symmetric window, every region [2 parities][...]:
//   recv_rows     [2][world-1][T_max][H] bf16      token rows pushed by each remote sender (one per token
//                                                   and receiver; this rank's own rows are read from x)
//   recv_entries  [2][world(src)][T_max*k] RowEntry src's pairs, grouped by local expert
//   count_words   [2][world(src)][L+2] u64         src's count message, tagged words (epoch.h): words
//                                                   [0, L) the pairs per local expert src sends this call,
//                                                   word L its input status (0 or an ErrorKind), word L+1
//                                                   its layer identity this call (FusedParams::layer_id)
//   arrivals      [2][L] u32                        monotonic: pairs of local expert e arrived
//   combine_rows  [2][T_max][k][H] bf16             expert outputs for (token, top-k slot)
//   token_signals [2][T_max] u32                    monotonic: output tiles arrived for the token
struct SymRegions {
  size_t recv_rows = 0, recv_entries = 0, count_words = 0;
  size_t arrivals = 0, combine_rows = 0, token_signals = 0, total = 0;
};

EPFUSE_HD SymRegions make_sym_regions(const FusedDims& d) {
  const size_t w = d.world, t = d.max_tokens, h = d.hidden, k = d.topk, l = d.local_experts();
  SymRegions s;
  size_t at = 0;
  s.recv_rows = at;     at += align_region(2 * (w - 1) * t * h * 2);
  s.recv_entries = at;  at += align_region(2 * w * t * k * sizeof(RowEntry));
  s.count_words = at;   at += align_region(2 * w * (l + 2) * 8);
  s.arrivals = at;      at += align_region(2 * l * 4);
  s.combine_rows = at;  at += align_region(2 * t * k * h * 2);
  s.token_signals = at; at += align_region(2 * t * 4);
  s.total = at;
  return s;
}

// A receiver keeps rows from its world - 1 remote senders: sender src is region src, or src - 1 when
// it comes after the receiver (src != receiver).
EPFUSE_HD int remote_sender_index(int src, int receiver) { return src < receiver ? src : src - 1; }

// Offsets inside the symmetric regions (bytes from the window start).
EPFUSE_HD size_t recv_row_offset(const SymRegions& s, const FusedDims& d, uint32_t parity, int receiver, int src,
                                 int row) {
  const size_t region = static_cast<size_t>(parity) * (d.world - 1) + remote_sender_index(src, receiver);
  return s.recv_rows + (region * d.max_tokens + row) * d.hidden * 2;
}
EPFUSE_HD size_t recv_entry_offset(const SymRegions& s, const FusedDims& d, uint32_t parity, int src, int64_t entry) {
  return s.recv_entries +
         ((static_cast<size_t>(parity) * d.world + src) * d.max_tokens * d.topk + entry) * sizeof(RowEntry);
}
// A count message's words: [0, L) the counts (a layer of fewer local experts than the window's sends
// zeros past its own), then the status and the layer identity.
EPFUSE_HD int count_words_per_sender(const FusedDims& d) { return d.local_experts() + 2; }
EPFUSE_HD int count_status_word(const FusedDims& d) { return d.local_experts(); }
EPFUSE_HD int count_layer_word(const FusedDims& d) { return d.local_experts() + 1; }
EPFUSE_HD size_t count_word_offset(const SymRegions& s, const FusedDims& d, uint32_t parity, int src, int word) {
  return s.count_words + ((static_cast<size_t>(parity) * d.world + src) * count_words_per_sender(d) + word) * 8;
}
EPFUSE_HD size_t arrival_offset(const SymRegions& s, const FusedDims& d, uint32_t parity, int local_expert) {
  return s.arrivals + (static_cast<size_t>(parity) * d.local_experts() + local_expert) * 4;
}
EPFUSE_HD size_t combine_row_offset(const SymRegions& s, const FusedDims& d, uint32_t parity, int token, int slot) {
  return s.combine_rows + ((static_cast<size_t>(parity) * d.max_tokens + token) * d.topk + slot) * d.hidden * 2;
}
EPFUSE_HD size_t token_signal_offset(const SymRegions& s, const FusedDims& d, uint32_t parity, int token) {
  return s.token_signals + (static_cast<size_t>(parity) * d.max_tokens + token) * 4;
}

// Private workspace (this GPU only):
//   h             [world*T_max*k][I] bf16  Linear1+SwiGLU output (weighted), one row per received pair,
//                                          expert-contiguous, unpadded
//   pair_row      [T_max][k] i32           layout -> dispatch: row slot at the slot's receiver
//   pair_index    [T_max][k] i32           layout -> dispatch: index among this rank's pairs of that expert
//   row_tickets   [world] u32              ticket dispenser: rows reserved per receiver (zeroed at exit)
//   pair_tickets  [E] u32                  ticket dispenser: pairs reserved per global expert (same)
//   counts        [world][L] u32           the count messages' values, when the collect builds its plan
//                                          outside shared memory (layout.cuh collect_task)
//   plan          ints                     this call's expert plan (task_map.h ExpertPlan)
//   arrival_base  [2][L] u32               arrivals' value before the current call of each parity
//   token_base    [2][T_max] u32           token_signals' value before the current call of each parity
//   l1_done       [max m-blocks] u32       finished Linear1 tiles per m-block (zeroed at exit)
//   control       FusedControl             task counter, flags, the error record
struct PrivRegions {
  size_t h = 0, pair_row = 0, pair_index = 0, row_tickets = 0, pair_tickets = 0, counts = 0, plan = 0;
  size_t arrival_base = 0, token_base = 0, l1_done = 0, control = 0, total = 0;
};

// Ints of the expert plan (task_map.h plan_view): rows[L], pair_off[L], mb_start[L+1],
// src_prefix[L][world+1], entry_off[world][L], arrival_target[L], and the GEMM schedule: segments[1],
// seg_start[2L+1], seg_code[2L].
EPFUSE_HD constexpr size_t plan_ints(const FusedDims& d) {
  const size_t l = d.local_experts(), w = d.world;
  return l + l + (l + 1) + l * (w + 1) + w * l + l + 1 + (2 * l + 1) + 2 * l;
}

// The plan's bytes as a CTA copies them whole into its shared memory (scheduler.cuh: one bulk copy, whose
// size is a multiple of 16; the plan region is padded past them by align_region).
EPFUSE_HD constexpr size_t plan_copy_bytes16(const FusedDims& d) { return (plan_ints(d) * 4 + 15) / 16 * 16; }
static_assert(kRegionAlign % 16 == 0, "align_region(plan bytes) covers plan_copy_bytes16");

// control_bytes: sizeof(FusedControl) (kernel_params.h), passed in to keep this header free of it.
EPFUSE_HD PrivRegions make_priv_regions(const FusedDims& d, size_t control_bytes) {
  const size_t t = d.max_tokens, k = d.topk, l = d.local_experts();
  PrivRegions p;
  size_t at = 0;
  p.h = at;            at += align_region(static_cast<size_t>(d.max_recv_pairs()) * d.intermediate * 2);
  p.pair_row = at;     at += align_region(t * k * 4);
  p.pair_index = at;   at += align_region(t * k * 4);
  p.row_tickets = at;  at += align_region(static_cast<size_t>(d.world) * 4);
  p.pair_tickets = at; at += align_region(static_cast<size_t>(d.num_experts) * 4);
  p.counts = at;       at += align_region(static_cast<size_t>(d.world) * l * 4);
  p.plan = at;         at += align_region(plan_ints(d) * 4);
  p.arrival_base = at; at += align_region(2 * l * 4);
  p.token_base = at;   at += align_region(2 * t * 4);
  p.l1_done = at;      at += align_region(static_cast<size_t>(d.max_mblocks(kMinBlockM)) * 4);
  p.control = at;      at += align_region(control_bytes);
  p.total = at;
  return p;
}

// ---- FP8 (weight_format fp8-block128, the warp-specialised TileGemmTmaFp8 kernel only) ----
// Activations travel and are stored as e4m3 codes with one float scale per 1x128 group (common/fp8.h).
// An FP8 x row (what dispatch writes into a receiver's recv_rows slot, or into this rank's private
// fp8_x region for its own tokens): H code bytes, then the row's ceil(H/128) scales padded to a multiple
// of 4 floats (the FP8 tile, gemm_mainloop_tma_fp8.cuh, copies 16-byte groups of scales). It fits a
// bf16 slot (H * 2 bytes) for every H % 128 == 0, so the symmetric window keeps its bf16 layout and
// strides; only the bytes sent shrink (about half).
EPFUSE_HD int fp8_scale_stride(int n) { return ((n + 127) / 128 + 3) / 4 * 4; }
EPFUSE_HD size_t fp8_x_scale_offset(int hidden) { return static_cast<size_t>(hidden); }
EPFUSE_HD size_t fp8_x_row_bytes(int hidden) { return fp8_x_scale_offset(hidden) + 4u * fp8_scale_stride(hidden); }
// FP8 h inside the private h region (sized N I 2 bytes for bf16, N = capacity's max_recv_pairs): codes
// [N][I] bytes from h, then scales [N][fp8_scale_stride(I)] floats from h + fp8_h_scale_offset(capacity).
// Both fit the region for I % 128 == 0 (4 * stride <= I): fp8_h_fits checks it.
EPFUSE_HD size_t fp8_h_scale_offset(const FusedDims& capacity) {
  return static_cast<size_t>(capacity.max_recv_pairs()) * capacity.intermediate;
}
EPFUSE_HD bool fp8_h_fits(const FusedDims& capacity, const FusedDims& layer) {
  const size_t region = static_cast<size_t>(capacity.max_recv_pairs()) * capacity.intermediate * 2;
  const size_t n = static_cast<size_t>(layer.max_recv_pairs());
  return n * layer.intermediate <= fp8_h_scale_offset(capacity) &&
         fp8_h_scale_offset(capacity) + n * fp8_scale_stride(layer.intermediate) * 4 <= region;
}
// The private split region (FP8 workspaces whose capacity's I can be split, task_map.h linear2_parts;
// after fp8_x): kSplitSlots u32 counters (one a split Linear2 tile, zero between calls: the last part
// resets its tile's), then kSplitSlots slots of kSplitSlotBytes, one a part's fp32 sums (device/ffn/split_k.cuh:
// 256 math threads x the 64-row tile's 128 accumulators). A call splits its tiles over at most
// min(CTAs, kSplitSlots) parts.
inline constexpr int kSplitSlots = 128;
inline constexpr size_t kSplitSlotBytes = 256 * 128 * 4;
EPFUSE_HD bool split_k_possible(const FusedDims& d) { return d.intermediate >= 2 * kSplitMinKBlocks * kSplitKBlock; }
EPFUSE_HD size_t split_counter_bytes() { return align_region(kSplitSlots * 4); }
EPFUSE_HD size_t split_k_bytes(const FusedDims& d) {
  return split_k_possible(d) ? split_counter_bytes() + kSplitSlots * kSplitSlotBytes : 0;
}

// The private fp8_x region (this rank's own token rows, quantised by dispatch): [T_max] FP8 x rows,
// after every other private region (PrivRegions::total of a bf16 workspace), present only in
// workspaces made for an FP8 capacity.
EPFUSE_HD size_t fp8_x_bytes(const FusedDims& d) {
  return align_region(static_cast<size_t>(d.max_tokens) * fp8_x_row_bytes(d.hidden));
}

}  // namespace epfuse::device
