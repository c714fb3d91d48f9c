#include "bench/floor.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "epfuse/error.h"
#include "epfuse/types.h"

namespace epfuse::bench {

double Floor::floor_ms() const { return std::max({compute_ms, weights_ms, comm_ms}); }

std::string_view Floor::bound() const {
  if (compute_ms >= weights_ms && compute_ms >= comm_ms) return "compute";
  return weights_ms >= comm_ms ? "weights" : "comm";
}

double expert_weight_bytes(const LayerConfig& cfg) {
  if (cfg.weight_format == WeightFormat::kFp8Block128) {
    const double h_blocks = std::ceil(cfg.hidden / 128.0), i_blocks = std::ceil(cfg.intermediate / 128.0);
    return 3.0 * cfg.hidden * cfg.intermediate + 3.0 * h_blocks * i_blocks * sizeof(float);
  }
  return 3.0 * cfg.hidden * cfg.intermediate * sizeof(bf16);
}

double token_row_bytes(const LayerConfig& cfg) { return static_cast<double>(cfg.hidden) * sizeof(bf16); }

double expert_flops(const LayerConfig& cfg, double routed_slots) {
  return 2.0 * routed_slots * 3.0 * cfg.hidden * cfg.intermediate;
}

double expected_remote_ranks_per_token(const LayerConfig& cfg, int world) {
  const int per_rank = cfg.experts_per_rank(world);
  // P(a given rank holds none of the k distinct experts) = C(E - E/R, k) / C(E, k).
  double none = 1.0;
  for (int i = 0; i < cfg.topk; ++i)
    none *= std::max(0.0, static_cast<double>(cfg.num_experts - per_rank - i)) / (cfg.num_experts - i);
  return (world - 1) * (1.0 - none);
}

double expected_experts_hit(const LayerConfig& cfg, int world, int tokens_per_rank) {
  // Each token hits a given expert with probability k/E, independently of the other tokens.
  const double miss = std::pow(1.0 - static_cast<double>(cfg.topk) / cfg.num_experts,
                               static_cast<double>(world) * tokens_per_rank);
  return cfg.experts_per_rank(world) * (1.0 - miss);
}

RankLoad expected_uniform_load(const LayerConfig& cfg, int world, int tokens_per_rank) {
  RankLoad load;
  load.routed_slots = static_cast<double>(tokens_per_rank) * cfg.topk;  // E/R experts x (R T k / E)
  load.experts_hit = expected_experts_hit(cfg, world, tokens_per_rank);
  // Dispatch sends T * D rows; by symmetry as many arrive, and combine sends each of them back.
  load.remote_rows = 2.0 * tokens_per_rank * expected_remote_ranks_per_token(cfg, world);
  return load;
}

Floor layer_floor(const LayerConfig& cfg, const RankLoad& load, const Ceilings& ceilings) {
  if (!(ceilings.gemm_tflops > 0 && ceilings.hbm_gbps > 0))
    throw Error(ErrorCode::kInvalidArgument, "floor: GEMM and HBM ceilings must be > 0 (gemm " +
                                                 std::to_string(ceilings.gemm_tflops) + " TFLOP/s, hbm " +
                                                 std::to_string(ceilings.hbm_gbps) + " GB/s)");
  Floor f;
  const double tflops =
      cfg.weight_format == WeightFormat::kFp8Block128 && ceilings.fp8_gemm_tflops > 0 ? ceilings.fp8_gemm_tflops
                                                                                      : ceilings.gemm_tflops;
  f.compute_ms = expert_flops(cfg, load.routed_slots) / (tflops * 1e12) * 1e3;
  f.weights_ms = load.experts_hit * expert_weight_bytes(cfg) / (ceilings.hbm_gbps * 1e9) * 1e3;
  if (load.remote_rows > 0) {
    if (!(ceilings.nvlink_gbps > 0))
      throw Error(ErrorCode::kInvalidArgument, "floor: remote rows to send but the NVLink ceiling is " +
                                                   std::to_string(ceilings.nvlink_gbps) + " GB/s");
    f.comm_ms = load.remote_rows * token_row_bytes(cfg) / (ceilings.nvlink_gbps * 1e9) * 1e3;
  }
  return f;
}

RoutingCounts make_routing_counts(const LayerConfig& cfg, int world) {
  RoutingCounts c;
  c.slots_per_expert.assign(cfg.num_experts, 0.0);
  c.sends_per_rank.assign(world, 0.0);
  c.recvs_per_rank.assign(world, 0.0);
  return c;
}

void count_rank_routing(const LayerConfig& cfg, int world, int rank, std::span<const int32_t> topk_idx,
                        RoutingCounts& counts) {
  const int k = cfg.topk;
  const int per_rank = cfg.experts_per_rank(world);
  if (topk_idx.size() % k != 0)
    throw Error(ErrorCode::kInvalidArgument, "routing counts: topk_idx has " + std::to_string(topk_idx.size()) +
                                                 " entries, not a multiple of top-k " + std::to_string(k));
  std::vector<char> hit(world);
  for (size_t t = 0; t < topk_idx.size() / k; ++t) {
    std::fill(hit.begin(), hit.end(), 0);
    for (int j = 0; j < k; ++j) {
      const int32_t e = topk_idx[t * k + j];
      if (e < 0) continue;
      if (e >= cfg.num_experts)
        throw Error(ErrorCode::kInvalidArgument, "routing counts: topk_idx[" + std::to_string(t) + "][" +
                                                     std::to_string(j) + "] = " + std::to_string(e) +
                                                     " out of range [-1, " + std::to_string(cfg.num_experts) + ")");
      counts.slots_per_expert[e] += 1;
      hit[e / per_rank] = 1;
    }
    for (int dst = 0; dst < world; ++dst) {
      if (dst == rank || !hit[dst]) continue;
      counts.sends_per_rank[rank] += 1;
      counts.recvs_per_rank[dst] += 1;
    }
  }
}

RankLoad rank_load(const LayerConfig& cfg, int world, int rank, const RoutingCounts& counts) {
  const int per_rank = cfg.experts_per_rank(world);
  RankLoad load;
  for (int e = rank * per_rank; e < (rank + 1) * per_rank; ++e) {
    load.routed_slots += counts.slots_per_expert[e];
    load.experts_hit += counts.slots_per_expert[e] > 0 ? 1 : 0;
  }
  load.remote_rows = counts.sends_per_rank[rank] + counts.recvs_per_rank[rank];
  return load;
}

}  // namespace epfuse::bench
