// Buffer sizing of the unfused chain: a pure function of the config, so memory is allocated once at
// creation and the bounds are unit-tested on the CPU.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/checked_config.h"
#include "epfuse/config.h"

namespace epfuse::unfused {

struct UnfusedPlan {
  int world_size = 0;
  int experts_per_rank = 0;
  int counts_words = 0;        // words per row of the counts matrix (protocol.h CountsRow)
  int64_t record_bytes = 0;    // one dispatched token: row + routing (protocol.h)

  // Tight bounds with T = max_tokens_per_rank, R = world, El = E/R:
  int64_t max_send_records = 0;  // T * min(k, R): a token goes to at most min(k, R) ranks
  int64_t max_recv_records = 0;  // R * T: every sender sends a token here at most once
  int64_t max_expert_rows = 0;   // R * T * min(k, El): a received token asks for <= min(k, El) experts

  // Bytes of each device buffer.
  size_t send_bytes = 0;        // my records, by destination; then the combine rows coming back
  size_t recv_bytes = 0;        // records received, by sender; then the pre-reduced rows going back
  size_t rows_bytes = 0;        // expert-contiguous rows [rows, H]: Linear1 input, then Linear2 output
  size_t inter_bytes = 0;       // Linear1 output [rows, 2I]; SwiGLU writes h over its gate half
  size_t row_weight_bytes = 0;  // top-k weight of each expert row (fp32)
  size_t token_rows_bytes = 0;  // per received token and slot: its expert row, -1 if none (int32)
  size_t send_slot_bytes = 0;   // per own token and destination: its record in that block (int32)
  size_t counts_bytes = 0;      // zeroed per call: send and receive counts, expert tickets, error key
  size_t total_bytes = 0;       // sum of the above

  // Inside counts_bytes, in this order (send and receive adjacent: one copy to the host).
  size_t send_counts_offset = 0;
  size_t recv_counts_offset = 0;
  size_t expert_fill_offset = 0;  // int32 per local expert: rows handed out so far (ticket dispenser)
  size_t error_key_offset = 0;    // uint64: protocol.h bad_expert_key, atomicMax
};

// For a checked config (checked_config.h: validated once, at creation). Throws Error(kUnsupported)
// when a bound does not fit the kernels' 32-bit row indices.
UnfusedPlan plan_unfused(const detail::CheckedConfig& checked);

}  // namespace epfuse::unfused
