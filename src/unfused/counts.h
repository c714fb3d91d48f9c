// What the host reads from the exchanged counts matrices (protocol.h CountsRow), once per forward:
// the input errors of every rank, and the traffic (records per peer, rows per local expert).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "epfuse/config.h"

namespace epfuse::unfused {

// The message every rank throws (as Error(kInvalidArgument)) when some rank reported an input error:
// the lowest such rank's, from the rows received from each sender. nullopt when none did.
std::optional<std::string> first_input_error(const int32_t* recv_counts, int world_size, int words,
                                             const LayerConfig& cfg);

struct Traffic {
  std::vector<int64_t> send_records;  // per peer: records I send it (and rows it returns)
  std::vector<int64_t> recv_records;  // per peer: records it sends me (and rows I return)
  std::vector<int> expert_rows;       // per local expert: rows it computes
  int64_t total_send = 0, total_recv = 0, total_rows = 0;
};

// Fills `out` (reusing its storage) from my send counts and the counts received from every peer.
void read_traffic(const int32_t* send_counts, const int32_t* recv_counts, int world_size, int words,
                  int experts_per_rank, Traffic& out);

}  // namespace epfuse::unfused
