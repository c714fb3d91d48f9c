// Floors of one MoE layer forward per GPU (FACTS.md "Floors"): no implementation can be much
// faster than the largest of three times: the expert FLOPs at the measured GEMM rate, the bytes of
// the local experts that receive tokens at the HBM rate, and the remote bytes of dispatch + combine
// (each token sent once per destination rank) at the NVLink rate. Pure host code, unit-tested.
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "epfuse/config.h"

namespace epfuse::bench {

// Rates of one GPU, measured in the same run or given on the command line.
struct Ceilings {
  double gemm_tflops = 0;  // bf16 dense GEMM with fp32 accumulation, 1e12 FLOP/s
  double hbm_gbps = 0;     // device memory, (bytes read + bytes written) / s / 1e9
  double nvlink_gbps = 0;  // bytes stored into peers by SMs, per GPU, / s / 1e9
  // FP8 e4m3 dense GEMM (the compute term of FP8 layers): not measured by the bench; FACTS.md's
  // torch._scaled_mm 8192^3 on H200 unless given (--ceilings ...,fp8=TFLOP/s).
  double fp8_gemm_tflops = kFp8GemmTflopsH200;
  static constexpr double kFp8GemmTflopsH200 = 1447;
};

// What one GPU does in one forward, the quantities the floor is computed from.
struct RankLoad {
  double routed_slots = 0;  // (token, expert) pairs computed by this GPU's experts
  double experts_hit = 0;   // this GPU's experts that receive >= 1 token
  double remote_rows = 0;   // token rows this GPU sends to peers: dispatch + combine
};

struct Floor {
  double compute_ms = 0;
  double weights_ms = 0;
  double comm_ms = 0;
  double floor_ms() const;
  std::string_view bound() const;  // "compute", "weights" or "comm": the largest term
};

// Bytes of one expert's three matrices (W1, W3, W2): bf16, or FP8 codes plus their fp32 128x128 block
// scales (cfg.weight_format); and of one token row in bf16 (the FP8 floor keeps bf16 rows for the
// communication term: dispatch could send FP8, combine returns bf16).
double expert_weight_bytes(const LayerConfig& cfg);
double token_row_bytes(const LayerConfig& cfg);
// FLOPs of `routed_slots` (token, expert) pairs: three GEMMs of H x I per pair, 2 FLOPs per MAC.
double expert_flops(const LayerConfig& cfg, double routed_slots);

// k distinct experts uniformly at random out of E, experts split evenly over `world` ranks.
// Expected number of ranks other than the token's own that hold >= 1 of its experts.
double expected_remote_ranks_per_token(const LayerConfig& cfg, int world);
// Expected number of one rank's experts hit by world * tokens_per_rank such tokens.
double expected_experts_hit(const LayerConfig& cfg, int world, int tokens_per_rank);
// Expected load of one GPU under uniform routing with no dropped slots.
RankLoad expected_uniform_load(const LayerConfig& cfg, int world, int tokens_per_rank);

// FP8 layers (cfg.weight_format): compute at ceilings.fp8_gemm_tflops, weights at FP8 bytes.
Floor layer_floor(const LayerConfig& cfg, const RankLoad& load, const Ceilings& ceilings);

// Routing as it happened, summed over all ranks (each rank counts its own tokens, then the counts
// are summed across ranks), from which every rank's load follows.
struct RoutingCounts {
  std::vector<double> slots_per_expert;  // [E]: routed slots per global expert
  std::vector<double> sends_per_rank;    // [R]: dispatch rows each rank sends (token once per remote rank)
  std::vector<double> recvs_per_rank;    // [R]: dispatch rows each rank receives
};
// The counts of one rank's tokens (topk_idx [T, k], -1 = dropped), in a zeroed RoutingCounts of
// the right sizes; call once per rank and sum, or sum the vectors across ranks with a collective.
RoutingCounts make_routing_counts(const LayerConfig& cfg, int world);
void count_rank_routing(const LayerConfig& cfg, int world, int rank, std::span<const int32_t> topk_idx,
                        RoutingCounts& counts);
// Load of `rank` from the summed counts. Combine returns one row per dispatch row received.
RankLoad rank_load(const LayerConfig& cfg, int world, int rank, const RoutingCounts& counts);

}  // namespace epfuse::bench
