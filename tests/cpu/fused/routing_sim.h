// Shared by the fused CPU tests: random routings of every rank (Sim, make_sim), storage for an
// ExpertPlan (PlanStore), and one sender's layout as layout_task computes it (simulate_layout).
#pragma once
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "device/buffer_layout.h"
#include "device/routing.h"
#include "device/task_map.h"

namespace epfuse::device {

struct PlanStore {
  std::vector<int> ints;
  ExpertPlan plan;
  explicit PlanStore(const FusedDims& d) : ints(plan_ints(d), -7) { plan = plan_view(ints.data(), d.world, d.local_experts()); }
};

struct Sim {
  FusedDims d;
  std::vector<std::vector<int32_t>> idx;  // per rank [T_r * k]
  std::vector<int> tokens;
};

enum class Pattern { kUniform, kOneExpert, kDropped, kDuplicates };

inline Sim make_sim(int world, int E, int k, int T_max, Pattern pattern, std::mt19937& rng) {
  Sim s{FusedDims{world, 128, 128, E, k, T_max}, {}, {}};
  for (int r = 0; r < world; ++r) {
    const int T = (r == 1) ? 0 : static_cast<int>(rng() % (T_max + 1));  // rank 1 has no tokens
    s.tokens.push_back(T);
    std::vector<int32_t> idx(T * k);
    for (int t = 0; t < T; ++t) {
      std::vector<int> perm(E);
      for (int e = 0; e < E; ++e) perm[e] = e;
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int j = 0; j < k; ++j) {
        int32_t e = perm[j % E];
        if (pattern == Pattern::kOneExpert) e = j == 0 ? E - 1 : -1;
        if (pattern == Pattern::kDropped && rng() % 4 == 0) e = -1;
        if (pattern == Pattern::kDropped && t % 5 == 0) e = -1;  // whole tokens dropped
        if (pattern == Pattern::kDuplicates && j > 0 && rng() % 3 == 0) e = idx[t * k];
        idx[t * k + j] = e;
      }
    }
    s.idx.push_back(std::move(idx));
  }
  return s;
}

// What layout_task leaves for dispatch on one sender (the kernel's private arrays, same names).
struct SenderLayout {
  std::vector<int32_t> pair_row, pair_index;  // [T][k]
  std::vector<uint32_t> row_tickets;          // [world]
  std::vector<uint32_t> pair_tickets;         // [E]
  std::vector<uint32_t> owner_tickets;        // [E]
  std::vector<int32_t> dispatch_order;        // [E][T_max]
};

// Mirrors layout_task for every token block of sender src, blocks and threads' smem atomics in a
// random order (the CTAs and threads of the kernel take tickets in any order).
inline SenderLayout simulate_layout(const Sim& sim, int src, std::mt19937& rng) {
  const FusedDims& d = sim.d;
  const int R = d.world, k = d.topk, E = d.num_experts, L = d.local_experts(), T = sim.tokens[src];
  const int32_t* id = sim.idx[src].data();
  SenderLayout out{std::vector<int32_t>(T * k, -1), std::vector<int32_t>(T * k, -1), std::vector<uint32_t>(R, 0),
                   std::vector<uint32_t>(E, 0), std::vector<uint32_t>(E, 0),
                   std::vector<int32_t>(static_cast<size_t>(E) * d.max_tokens, -1)};
  const int blocks = (T + kLayoutTokens - 1) / kLayoutTokens;
  std::vector<int> order(blocks);
  for (int b = 0; b < blocks; ++b) order[b] = b;
  std::shuffle(order.begin(), order.end(), rng);
  for (int b : order) {
    std::vector<uint32_t> cnt_rows(R, 0), cnt_pairs(E, 0), cnt_owned(E, 0);
    const int t0 = b * kLayoutTokens, t1 = std::min(T, t0 + kLayoutTokens);
    std::vector<int> qs;
    for (int q = 0; q < (t1 - t0) * k; ++q) qs.push_back(q);
    std::shuffle(qs.begin(), qs.end(), rng);
    for (int q : qs) {
      const int t = t0 + q / k, j = q % k;
      const int32_t e = id[t * k + j];
      if (!slot_is_routed(e, E)) continue;
      if (owner_slot_for_rank(id + t * k, k, j, E, L) == j) {
        out.pair_row[t * k + j] = static_cast<int32_t>(cnt_rows[expert_rank(e, L)]++);
        ++cnt_owned[e];
      }
      out.pair_index[t * k + j] = static_cast<int32_t>(cnt_pairs[e]++);
    }
    for (int r = 0; r < R; ++r) { const uint32_t n = cnt_rows[r]; cnt_rows[r] = out.row_tickets[r]; out.row_tickets[r] += n; }
    for (int e = 0; e < E; ++e) {
      uint32_t n = cnt_pairs[e];
      cnt_pairs[e] = out.pair_tickets[e];
      out.pair_tickets[e] += n;
      n = cnt_owned[e];
      cnt_owned[e] = out.owner_tickets[e];
      out.owner_tickets[e] += n;
    }
    std::shuffle(qs.begin(), qs.end(), rng);
    for (int q : qs) {
      const int t = t0 + q / k, j = q % k;
      const int32_t e = id[t * k + j];
      if (!slot_is_routed(e, E)) continue;
      out.pair_index[t * k + j] += static_cast<int32_t>(cnt_pairs[e]);
      if (out.pair_row[t * k + j] >= 0) {
        out.pair_row[t * k + j] += static_cast<int32_t>(cnt_rows[expert_rank(e, L)]);
        out.dispatch_order[static_cast<size_t>(e) * d.max_tokens + cnt_owned[e]++] = t;
      }
    }
    for (int t = t0; t < t1; ++t)
      for (int j = 0; j < k; ++j) {
        const int owner = owner_slot_for_rank(id + t * k, k, j, E, L);
        if (owner >= 0 && owner != j) out.pair_row[t * k + j] = out.pair_row[t * k + owner];
      }
  }
  return out;
}

}  // namespace epfuse::device
