#include "unfused/counts.h"

#include "unfused/protocol.h"

namespace epfuse::unfused {
namespace {

std::string pointer_names(int32_t mask) {
  std::string names;
  const std::pair<int32_t, const char*> pointers[] = {{NullPointer::kX, "x"},
                                                      {NullPointer::kTopkIdx, "topk_idx"},
                                                      {NullPointer::kTopkWeights, "topk_weights"},
                                                      {NullPointer::kOutput, "y"}};
  for (const auto& [bit, name] : pointers) {
    if ((mask & bit) == 0) continue;
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

}  // namespace

std::optional<std::string> first_input_error(const int32_t* recv_counts, int world_size, int words,
                                             const LayerConfig& cfg) {
  for (int sender = 0; sender < world_size; ++sender) {
    const int32_t* row = recv_counts + sender * words;
    const auto code = static_cast<InputError>(row[CountsRow::kErrorCode]);
    const int32_t token = row[CountsRow::kErrorToken], slot = row[CountsRow::kErrorSlot],
                  value = row[CountsRow::kErrorValue];
    const std::string rank = "rank " + std::to_string(sender) + ": ";
    switch (code) {
      case InputError::kNone:
        continue;
      case InputError::kExpertOutOfRange:
        return rank + "topk_idx[" + std::to_string(token) + "][" + std::to_string(slot) + "] = " +
               std::to_string(value) + " out of range [-1, " + std::to_string(cfg.num_experts) + ")";
      case InputError::kTokenCount:
        return rank + "num_tokens = " + std::to_string(value) + " out of range [0, max_tokens_per_rank = " +
               std::to_string(cfg.max_tokens_per_rank) + "]";
      case InputError::kNullPointer:
        return rank + "null pointer(s) " + pointer_names(value) + " with num_tokens = " + std::to_string(token);
      case InputError::kMisaligned:
        return rank + "misaligned pointer(s) " + pointer_names(value) + " with num_tokens = " + std::to_string(token) +
               " (x and y must be 16-byte aligned)";
      case InputError::kAliased:
        return rank + "y overlaps " + pointer_names(value) + " with num_tokens = " + std::to_string(token) +
               " (the output must not alias an input; give y its own memory)";
      case InputError::kCallerFp8X:
        return rank + "x quantised by the caller (TokenBatch::x_fp8) is not supported by the unfused chain, "
                      "which sends bf16 rows: pass x, or use the fused layer";
    }
    return rank + "unknown input error code " + std::to_string(row[CountsRow::kErrorCode]);
  }
  return std::nullopt;
}

void read_traffic(const int32_t* send_counts, const int32_t* recv_counts, int world_size, int words,
                  int experts_per_rank, Traffic& out) {
  out.send_records.assign(world_size, 0);
  out.recv_records.assign(world_size, 0);
  out.expert_rows.assign(experts_per_rank, 0);
  out.total_send = out.total_recv = out.total_rows = 0;
  for (int peer = 0; peer < world_size; ++peer) {
    out.send_records[peer] = send_counts[peer * words + CountsRow::kTokens];
    out.recv_records[peer] = recv_counts[peer * words + CountsRow::kTokens];
    out.total_send += out.send_records[peer];
    out.total_recv += out.recv_records[peer];
  }
  for (int e = 0; e < experts_per_rank; ++e) {
    out.expert_rows[e] = static_cast<int>(expert_rows(recv_counts, words, world_size, e));
    out.total_rows += out.expert_rows[e];
  }
}

}  // namespace epfuse::unfused
