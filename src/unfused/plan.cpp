#include "unfused/plan.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "epfuse/error.h"
#include "unfused/protocol.h"

namespace epfuse::unfused {
namespace {
// cudaMalloc aligns to 256 bytes; keep sub-buffers of the counts block 16-byte aligned for memset.
constexpr size_t kAlign = 16;
size_t aligned(size_t bytes) { return static_cast<size_t>(round_up(static_cast<int64_t>(bytes), kAlign)); }
}  // namespace

UnfusedPlan plan_unfused(const detail::CheckedConfig& checked) {
  const LayerConfig& cfg = checked.config();
  const int world_size = checked.world_size();
  UnfusedPlan p;
  p.world_size = world_size;
  p.experts_per_rank = cfg.experts_per_rank(world_size);
  p.counts_words = counts_words(p.experts_per_rank);
  p.record_bytes = record_bytes(cfg.hidden, cfg.topk);

  const int64_t tokens = cfg.max_tokens_per_rank;
  p.max_send_records = tokens * std::min(cfg.topk, world_size);
  p.max_recv_records = int64_t{world_size} * tokens;
  p.max_expert_rows = p.max_recv_records * std::min(cfg.topk, p.experts_per_rank);
  // Row and slot indices are int32 in the kernels.
  if (p.max_expert_rows > std::numeric_limits<int32_t>::max() ||
      p.max_recv_records * cfg.topk > std::numeric_limits<int32_t>::max())
    throw Error(ErrorCode::kUnsupported,
                "unfused: max_tokens_per_rank=" + std::to_string(tokens) + " on " + std::to_string(world_size) +
                    " ranks gives " + std::to_string(p.max_expert_rows) +
                    " expert rows; the unfused kernels index rows with int32");

  const auto bf16_bytes = [](int64_t rows, int64_t cols) { return static_cast<size_t>(rows * cols * 2); };
  // The combine rows ([records, H] bf16) come back into the send buffer and leave from the receive
  // buffer: both are smaller than the records they replace.
  p.send_bytes = static_cast<size_t>(p.max_send_records * p.record_bytes);
  p.recv_bytes = static_cast<size_t>(p.max_recv_records * p.record_bytes);
  p.rows_bytes = bf16_bytes(p.max_expert_rows, cfg.hidden);
  p.inter_bytes = bf16_bytes(p.max_expert_rows, 2 * int64_t{cfg.intermediate});
  p.row_weight_bytes = static_cast<size_t>(p.max_expert_rows) * sizeof(float);
  p.token_rows_bytes = static_cast<size_t>(p.max_recv_records * cfg.topk) * sizeof(int32_t);
  p.send_slot_bytes = static_cast<size_t>(tokens * world_size) * sizeof(int32_t);

  const size_t matrix_bytes = static_cast<size_t>(world_size) * p.counts_words * sizeof(int32_t);
  p.send_counts_offset = 0;
  p.recv_counts_offset = p.send_counts_offset + matrix_bytes;  // adjacent: one device-to-host copy
  p.expert_fill_offset = aligned(p.recv_counts_offset + matrix_bytes);
  p.error_key_offset = aligned(p.expert_fill_offset + static_cast<size_t>(p.experts_per_rank) * sizeof(int32_t));
  p.counts_bytes = aligned(p.error_key_offset + sizeof(uint64_t));

  p.total_bytes = p.send_bytes + p.recv_bytes + p.rows_bytes + p.inter_bytes + p.row_weight_bytes +
                  p.token_rows_bytes + p.send_slot_bytes + p.counts_bytes;
  return p;
}

}  // namespace epfuse::unfused
