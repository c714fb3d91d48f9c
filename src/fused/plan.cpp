#include "fused/plan.h"

#include <algorithm>
#include <cstdio>
#include <string>

#include "common/check.h"
#include "device/kernel/kernel_params.h"
#include "device/protocol/regions.h"
#include "device/protocol/task_map.h"
#include "epfuse/error.h"
#include "fused/heuristics.h"
#include "padding/padding.h"

namespace epfuse::fused {
namespace {

std::string check_fused(const LayerConfig& cfg, int world) {
  auto bad = [](const char* field, long value, const char* why) {
    return std::string("fused layer: ") + field + " = " + std::to_string(value) + " " + why;
  };
  if (world < 1) return bad("world size", world, "must be >= 1");
  if (cfg.num_experts < 1 || cfg.num_experts % world != 0)
    return bad("num_experts", cfg.num_experts, ("must be a positive multiple of the world size " + std::to_string(world)).c_str());
  if (cfg.topk < 1 || cfg.topk > kMaxTopk) return bad("topk", cfg.topk, "must be in [1, 16]");
  if (cfg.max_tokens_per_rank < 0) return bad("max_tokens_per_rank", cfg.max_tokens_per_rank, "must be >= 0");
  // Other multiples of 64 reach the kernel padded (padding.h).
  if (cfg.hidden <= 0 || cfg.hidden % padding::kTileAlign != 0)
    return bad("hidden", cfg.hidden, "must be a positive multiple of 128");
  if (cfg.intermediate <= 0 || cfg.intermediate % padding::kTileAlign != 0)
    return bad("intermediate", cfg.intermediate, "must be a positive multiple of 128");
  if (supported_fused_tiles(cfg).empty())
    return bad("hidden", cfg.hidden, ("with intermediate = " + std::to_string(cfg.intermediate) +
                                      " cannot be tiled by any fused GEMM tile shape").c_str());
  // Offsets are 32-bit in a few places (row slots, entries, m-blocks).
  const device::FusedDims d{world, cfg.hidden, cfg.intermediate, cfg.num_experts, cfg.topk, cfg.max_tokens_per_rank};
  if (d.max_recv_pairs() > (int64_t{1} << 30))
    return bad("max_tokens_per_rank", cfg.max_tokens_per_rank, "times world times topk exceeds 2^30 received pairs");
  return "";
}

}  // namespace

bool fused_tile_supports(const GemmTileShape& s, const LayerConfig& cfg) {
  return ffn_tile_supports(s, cfg.hidden, cfg.intermediate);
}

std::vector<GemmTileShape> supported_fused_tiles(const LayerConfig& cfg) {
  std::vector<GemmTileShape> out;
  // FP8 runs the FP8 128 x 256 tile (H % 256 == 0, I % 128 == 0), in its three kernels.
  if (cfg.weight_format == WeightFormat::kFp8Block128) {
    if (fused_tile_supports(kTmaFp8M128N256, cfg)) out = {kTmaFp8M128N256, kTmaFp8M128N256Decode, kTmaFp8M128N256Split};
    return out;
  }
  for (const GemmTileShape& s : kFusedTileShapes)
    if (fused_tile_supports(s, cfg)) out.push_back(s);
  return out;
}

GemmTileShape choose_fused_tile(const LayerConfig& cfg, int rows_per_expert, int local_experts, int grid, int split_slots) {
  if (cfg.weight_format == WeightFormat::kFp8Block128) {  // at every T (padding rows are cheap)
    // The split kernel where the call's expected Linear2 tiles leave the grid room for two parts or more of each
    // (the device splits by the call's real m-blocks: one part, the decode kernel, where more arrive).
    const GemmTileShape& s = kTmaFp8M128N256Split;
    const int mblocks = local_experts * std::max(1, device::ceil_div(rows_per_expert, s.block_m));
    const int slots = device::split_task_slots(split_slots, grid);
    if (device::linear2_call_parts(mblocks, cfg.hidden / s.block_n, cfg.intermediate, slots) >= 2) return s;
    return rows_per_expert <= kFp8DecodeRowsPerExpert ? kTmaFp8M128N256Decode : kTmaFp8M128N256;
  }
  const GemmTileShape s = choose_bf16_tile(rows_per_expert, local_experts, grid, cfg.hidden, cfg.intermediate);
  EPFUSE_REQUIRE(s.block_m != 0, ErrorCode::kInternal, "fused layer: no GEMM tile shape for a validated config");
  return s;
}

std::string_view fused_tile_name(const GemmTileShape& s) {
  for (const NamedFusedTile& t : kNamedFusedTiles)
    if (t.shape == s) return t.name;
  return {};
}

GemmTileShape forced_fused_tile(const LayerConfig& cfg, std::string_view name, const std::string& who) {
  const std::vector<GemmTileShape> ok = supported_fused_tiles(cfg);
  std::string names;
  for (const NamedFusedTile& t : kNamedFusedTiles) {
    const bool runs = std::find(ok.begin(), ok.end(), t.shape) != ok.end();
    if (runs && t.name == name) return t.shape;
    if (runs) names += std::string(names.empty() ? "" : ", ") + std::string(t.name);
  }
  throw Error(ErrorCode::kInvalidArgument, who + "EPFUSE_FUSED_TILE = '" + std::string(name) +
                                               "' is not a tile this layer runs (auto or one of " + names + ")");
}

FusedPlan plan_fused(const LayerConfig& cfg, int world) {
  const std::string why = check_fused(cfg, world);
  if (!why.empty()) throw Error(ErrorCode::kInvalidConfig, why);
  FusedPlan p;
  p.dims = device::FusedDims{world, cfg.hidden, cfg.intermediate, cfg.num_experts, cfg.topk, cfg.max_tokens_per_rank};
  p.sym = device::make_sym_regions(p.dims);
  p.priv = device::make_priv_regions(p.dims, sizeof(device::FusedControl));
  const auto& s = p.sym;
  const auto& v = p.priv;
  p.buffers = {
      {"recv_rows", "2*(R-1)*T*H*2", s.recv_entries - s.recv_rows, true},
      {"recv_entries", "2*R*T*k*16", s.count_words - s.recv_entries, true},
      {"count_words", "2*R*(L+2)*8", s.arrivals - s.count_words, true},
      {"arrivals", "2*L*4", s.combine_rows - s.arrivals, true},
      {"combine_rows", "2*T*k*H*2", s.token_signals - s.combine_rows, true},
      {"token_signals", "2*T*4", s.total - s.token_signals, true},
      {"h", "R*T*k*I*2", v.pair_row - v.h, false},
      {"pair_row", "T*k*4", v.pair_index - v.pair_row, false},
      {"pair_index", "T*k*4", v.row_tickets - v.pair_index, false},
      {"row_tickets", "R*4", v.pair_tickets - v.row_tickets, false},
      {"pair_tickets", "E*4", v.counts - v.pair_tickets, false},
      {"counts", "R*L*4", v.plan - v.counts, false},
      {"plan", "(L*(2*R+9)+3)*4", v.arrival_base - v.plan, false},
      {"arrival_base", "2*L*4", v.token_base - v.arrival_base, false},
      {"token_base", "2*T*4", v.l1_done - v.token_base, false},
      {"l1_done", "(min(L,N)+(N-min(L,N))/32)*4, N=R*T*k", v.control - v.l1_done, false},
      {"control", "sizeof(FusedControl)", v.total - v.control, false},
  };
  // FP8: this rank's own rows quantised by dispatch (regions.h fp8_x_bytes); remote rows use the
  // bf16-sized recv_rows slots (an FP8 row fits one) and FP8 h fits the h region (fp8_h_fits).
  if (cfg.weight_format == WeightFormat::kFp8Block128) {
    p.fp8_x = p.priv.total;
    p.priv.total += device::fp8_x_bytes(p.dims);
    p.buffers.push_back({"fp8_x", "T*(H+4*ceil4(H/128)) (FP8)", p.priv.total - p.fp8_x, false});
    // Linear2's K split (task_map.h linear2_parts), where the capacity's I can be split.
    if (const size_t bytes = device::split_k_bytes(p.dims); bytes > 0) {
      p.split_k = p.priv.total;
      p.priv.total += bytes;
      p.buffers.push_back({"split_k", "128*4+128*128K (FP8, I>=4096)", bytes, false});
    }
  }
  return p;
}

std::string format_plan(const FusedPlan& plan) {
  std::string out;
  char line[160];
  for (const BufferBytes& b : plan.buffers) {
    std::snprintf(line, sizeof line, "  %-9s %-14s %-22s %12zu B (%.2f MiB)\n", b.symmetric ? "symmetric" : "private",
                  b.name.c_str(), b.formula.c_str(), b.bytes, b.bytes / 1048576.0);
    out += line;
  }
  std::snprintf(line, sizeof line, "  symmetric total %zu B (%.2f MiB), private total %zu B (%.2f MiB)\n",
                plan.symmetric_bytes(), plan.symmetric_bytes() / 1048576.0, plan.private_bytes(),
                plan.private_bytes() / 1048576.0);
  out += line;
  return out;
}

}  // namespace epfuse::fused
