#include "bench/peers.h"

#include <cmath>
#include <cstdlib>
#include <regex>
#include <set>
#include <sstream>
#include <tuple>

namespace epfuse::bench {
namespace {

double number(const std::string& text) {
  if (text == "nan") return kNaN;
  return std::strtod(text.c_str(), nullptr);
}

// A model name for a shape (hidden, intermediate, top-k), else "custom".
std::string model_name(int hidden, int intermediate, int topk) {
  for (const ModelShape& m : model_shapes())
    if (m.hidden == hidden && m.intermediate == intermediate && m.topk == topk) return std::string(m.name);
  return "custom";
}

BenchRow peer_row(std::string config, int hidden, int intermediate, int experts, int topk, int tokens, int ranks,
                  std::string impl, std::string dtype, double ms, std::string remark) {
  BenchRow r;
  r.config = std::move(config);
  r.routing = "uniform";
  r.impl = std::move(impl);
  r.dtype = std::move(dtype);
  r.hidden = hidden;
  r.intermediate = intermediate;
  r.experts = experts;
  r.topk = topk;
  r.tokens_per_rank = tokens;
  r.ranks = ranks;
  r.median_ms = ms;
  r.p10_ms = r.p90_ms = kNaN;  // the peers print one median
  r.remark = std::move(remark);
  if (!std::isfinite(ms)) r.note = "the peer printed no time (nan): " + r.remark;
  return r;
}

// deepgemm_gemm_alone.py's built-in shapes: (name, H, I, E, k, T), E at world 4.
const std::set<std::tuple<int, int, int, int, int>>& builtin_gemm_shapes() {
  static const std::set<std::tuple<int, int, int, int, int>> shapes = {
      {7168, 2048, 256, 8, 128},    {7168, 2048, 256, 8, 1024}, {7168, 2048, 256, 8, 4096},
      {2048, 768, 128, 8, 128},     {2048, 768, 128, 8, 4096},  {2048, 768, 128, 8, 16384},
      {4096, 14336, 8, 2, 4096}};
  return shapes;
}

}  // namespace

PeerOutput parse_peer_output(std::string_view text, int world) {
  static const std::regex gemm(
      R"(^(\S+)\s+H=(\d+) I=(\d+) E=(\d+) k=(\d+) T=\s*(\d+) rows/expert=\s*(\d+): torch (\S+) ms.*\| deepgemm-bf16 (\S+) ms.*\| deepgemm-fp8 (\S+) ms)");
  static const std::regex mega_header(
      R"(MegaMoE fused-only sweep: ranks=(\d+) hidden=(\d+) ih=(\d+) experts=(\d+) topk=(\d+))");
  static const std::regex mega_line(R"(^\s*tokens=\s*(\d+)\s+recv=\s*(\d+)\s+experts=\s*(\d+)\s+(\S+) us)");
  PeerOutput out;
  int mega_ranks = 0, mega_hidden = 0, mega_ih = 0, mega_experts = 0, mega_topk = 0;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, gemm)) {
      const int hidden = std::stoi(m[2]), intermediate = std::stoi(m[3]), experts = std::stoi(m[4]);
      const int topk = std::stoi(m[5]), tokens = std::stoi(m[6]);
      if ((experts * world) % 4 != 0) continue;  // not expressible at this world size
      const std::string config = m[1];
      const std::string remark = "DeepGEMM grouped GEMMs alone (Linear1 + Linear2, no SwiGLU or communication), " +
                                 std::string(m[7]) + " rows per local expert";
      out.rows.push_back(peer_row(config, hidden, intermediate, experts * world / 4, topk, tokens, world,
                                  "deepgemm-bf16-gemm", "bf16", number(m[9]), remark));
      out.rows.push_back(peer_row(config, hidden, intermediate, experts * world / 4, topk, tokens, world,
                                  "deepgemm-fp8-gemm", "fp8", number(m[10]), remark));
    } else if (std::regex_search(line, m, mega_header)) {
      mega_ranks = std::stoi(m[1]);
      mega_hidden = std::stoi(m[2]);
      mega_ih = std::stoi(m[3]);
      mega_experts = std::stoi(m[4]);
      mega_topk = std::stoi(m[5]);
    } else if (std::regex_search(line, m, mega_line) && mega_ranks > 0) {
      out.rows.push_back(peer_row(model_name(mega_hidden, mega_ih, mega_topk), mega_hidden, mega_ih, mega_experts,
                                  mega_topk, std::stoi(m[1]), mega_ranks, "megamoe-sm90-fp8", "fp8",
                                  number(m[4]) * 1e-3,
                                  "MegaMoE SM90 FP8 kernel alone (input copies and x's FP8 cast outside), " +
                                      std::string(m[2]) + " routed rows"));
    } else if (line.find("rror") != std::string::npos) {
      out.errors.push_back(line);
    }
  }
  return out;
}

std::string shape_item(const BenchCase& c, int experts) {
  const LayerConfig& l = c.layer;
  return c.config + "," + std::to_string(l.hidden) + "," + std::to_string(l.intermediate) + "," +
         std::to_string(experts) + "," + std::to_string(l.topk) + "," + std::to_string(c.tokens_per_rank);
}

PeerOutput parse_routed_output(std::string_view text) {
  static const std::regex line_re(
      R"(^deepgemm-routed (\S+) H=(\d+) I=(\d+) E=(\d+) k=(\d+) T=(\d+)(?: world=(\d+))?: even (\S+) ms.*\| routed (\S+) ms \(\S+ TF/s, (\d+) blocks)");
  PeerOutput out;
  std::istringstream in{std::string(text)};
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, line_re)) {
      const int world = m[7].matched ? std::stoi(m[7]) : 1;
      out.rows.push_back(peer_row(m[1], std::stoi(m[2]), std::stoi(m[3]), std::stoi(m[4]), std::stoi(m[5]),
                                  std::stoi(m[6]), world, "deepgemm-fp8-gemm-routed", "fp8", number(m[9]),
                                  "DeepGEMM FP8 grouped GEMMs alone on a routed batch's expert counts (" +
                                      std::string(m[10]) + " blocks of 128 rows; even counts " + std::string(m[8]) +
                                      " ms)"));
    } else if (line.find("rror") != std::string::npos) {
      out.errors.push_back(line);
    }
  }
  return out;
}

std::string routed_shapes(const std::vector<BenchCase>& cases) {
  std::set<std::tuple<int, int, int, int, int>> seen;
  std::string shapes;
  for (const BenchCase& c : cases) {
    const LayerConfig& l = c.layer;
    if (l.weight_format != WeightFormat::kFp8Block128) continue;
    if (!seen.insert({l.hidden, l.intermediate, l.num_experts, l.topk, c.tokens_per_rank}).second) continue;
    if (!shapes.empty()) shapes += ';';
    shapes += shape_item(c, l.num_experts);
  }
  return shapes;
}

std::string gemm_alone_extra_shapes(const std::vector<BenchCase>& cases, int world) {
  std::set<std::tuple<int, int, int, int, int>> seen = builtin_gemm_shapes();
  std::string extra;
  for (const BenchCase& c : cases) {
    const LayerConfig& l = c.layer;
    if ((l.num_experts * 4) % world != 0) continue;
    const auto key = std::make_tuple(l.hidden, l.intermediate, l.num_experts * 4 / world, l.topk, c.tokens_per_rank);
    if (!seen.insert(key).second) continue;
    if (!extra.empty()) extra += ';';
    extra += shape_item(c, std::get<2>(key));
  }
  return extra;
}

std::vector<std::pair<std::string, std::string>> megamoe_batches(const std::vector<BenchCase>& cases) {
  std::vector<std::pair<std::string, std::string>> vars;
  for (const auto& [model, var] : {std::pair{"dsv3", "MEGAMOE_DSV3_BATCHES"}, {"qwen3-30b", "MEGAMOE_QWEN3_BATCHES"}}) {
    std::set<int> seen;
    std::string tokens;
    for (const BenchCase& c : cases) {
      const LayerConfig& l = c.layer;
      if (model_name(l.hidden, l.intermediate, l.topk) != model || !seen.insert(c.tokens_per_rank).second) continue;
      tokens += (tokens.empty() ? "" : " ") + std::to_string(c.tokens_per_rank);
    }
    if (!tokens.empty()) vars.emplace_back(var, tokens);
  }
  return vars;
}

}  // namespace epfuse::bench
