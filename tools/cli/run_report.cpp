#include "cli/run_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/output.h"

namespace epfuse::tools {

std::vector<double> RankStats::pack() const {
  return {static_cast<double>(tokens),       static_cast<double>(routed),
          static_cast<double>(dropped),      static_cast<double>(rows_checked),
          static_cast<double>(unwritten),    rel_err,
          output_norm,                       seconds};
}

RankStats RankStats::unpack(const double* v) {
  RankStats s;
  s.tokens = static_cast<int64_t>(v[0]);
  s.routed = static_cast<int64_t>(v[1]);
  s.dropped = static_cast<int64_t>(v[2]);
  s.rows_checked = static_cast<int64_t>(v[3]);
  s.unwritten = static_cast<int64_t>(v[4]);
  s.rel_err = v[5];
  s.output_norm = v[6];
  s.seconds = v[7];
  return s;
}

void count_slots(const HostTokens& tokens, RankStats& s) {
  s.tokens += tokens.num_tokens;
  for (int32_t e : tokens.topk_idx) (e >= 0 ? s.routed : s.dropped) += 1;
}

namespace {

std::string config_line(const RunPlan& plan) {
  const LayerConfig& c = plan.cfg;
  std::string line =
      fmt::format("config: {} (H={} I={} E={} k={}", plan.model, c.hidden, c.intermediate, c.num_experts, c.topk);
  if (c.swiglu_clamp > 0) line += fmt::format(" clamp={:.3f}", c.swiglu_clamp);
  if (c.weight_format != WeightFormat::kBf16) line += fmt::format(" fp8 scales={}", to_string(c.scale_format));
  if (plan.x_fp8) line += " x=fp8 (caller)";
  line += fmt::format(")  impl={}  ranks={}  routing={}  seed={}  max tokens/rank={}",
                      plan.impl ? to_string(*plan.impl) : "reference", plan.ranks, to_string(plan.routing), plan.seed,
                      c.max_tokens_per_rank);
  if (plan.vary) line += "  vary";
  return line + "\n";
}

std::string worst_row_place(const WorstRow& w) {
  return w.rank < 0 ? " (no rows checked)" : fmt::format(" (rank {} row {})", w.rank, w.row);
}

}  // namespace

std::string summary(const RunPlan& plan, const RunResult& r, bool reference_only) {
  std::string out = config_line(plan);
  const std::string tokens_header = r.calls > 1 ? fmt::format("tokens ({} calls)", r.calls) : "tokens";
  if (reference_only) {
    Table t({"rank", tokens_header, "routed slots", "dropped", "output norm", "time s"});
    for (size_t i = 0; i < r.ranks.size(); ++i) {
      const RankStats& s = r.ranks[i];
      t.add_row({std::to_string(i), std::to_string(s.tokens), std::to_string(s.routed), std::to_string(s.dropped),
                 format_sci(s.output_norm, 4), format_fixed(s.seconds, 2)});
    }
    return out + t.render();
  }
  Table t({"rank", tokens_header, "routed slots", "dropped", "rows checked", "rel err", "unwritten", "ms/call"});
  for (size_t i = 0; i < r.ranks.size(); ++i) {
    const RankStats& s = r.ranks[i];
    t.add_row({std::to_string(i), std::to_string(s.tokens), std::to_string(s.routed), std::to_string(s.dropped),
               std::to_string(s.rows_checked), format_sci(s.rel_err), std::to_string(s.unwritten),
               format_fixed(r.calls ? 1e3 * s.seconds / r.calls : 0.0, 3)});
  }
  out += t.render();
  out += fmt::format(
      "verified: {} (max rel err {}, tolerance {}; max row rel err {}{}, row tolerance {}; {} unwritten elements; "
      "{} of {} calls checked)\n",
      r.verified ? "yes" : "NO", format_sci(r.max_rel_err), format_sci(plan.tolerance), format_sci(r.worst_row.err),
      worst_row_place(r.worst_row), format_sci(row_tolerance(plan.tolerance, plan.cfg.weight_format)), r.unwritten, r.calls_verified, r.calls);
  out += fmt::format("layer memory per GPU (weights not included): {:.1f} MiB symmetric (NCCL window), {:.1f} MiB "
                     "private\n",
                     r.memory.symmetric_bytes / 1048576.0, r.memory.private_bytes / 1048576.0);
  if (r.device_used_start >= 0)
    out += fmt::format("device memory in use (rank 0's GPU): {:.1f} MiB before the first call, {:.1f} MiB after the "
                       "last ({:+.1f} MiB)\n",
                       r.device_used_start / 1048576.0, r.device_used_end / 1048576.0,
                       (r.device_used_end - r.device_used_start) / 1048576.0);
  out += soak_line(plan, r);
  if (r.call_times.calls > 1)
    out += fmt::format("time per call (rank 0): median {:.3f} ms over the first {} calls, {:.3f} ms over the last {} "
                       "(all {}: median {:.3f}, min {:.3f}, max {:.3f})\n",
                       r.call_times.first_median, r.call_times.window, r.call_times.last_median, r.call_times.window,
                       r.call_times.calls, r.call_times.median, r.call_times.min, r.call_times.max);
  return out;
}

std::string soak_line(const RunPlan& plan, const RunResult& r) {
  const auto mib = [](int64_t bytes) { return bytes < 0 ? -1.0 : bytes / 1048576.0; };
  const std::string cycles = plan.cycles > 0 ? fmt::format(" cycles={}", plan.cycles) : "";
  return fmt::format(
      "soak: mode={}{} calls={} checked={} max_rel_err={} max_row_rel_err={} unwritten={} memory_start_mib={:.1f} "
      "memory_end_mib={:.1f} verified={}{}\n",
      plan.mode(), cycles, r.calls, r.calls_verified, format_sci(r.max_rel_err), format_sci(r.worst_row.err),
      r.unwritten, mib(r.device_used_start), mib(r.device_used_end), r.verified ? "yes" : "no",
      r.memory_flat ? fmt::format(" memory_flat={}", *r.memory_flat ? "yes" : "no") : "");
}

std::string result_json(const RunPlan& plan, const RunResult& r, const std::string& command) {
  const LayerConfig& c = plan.cfg;
  const Json config = {{"model", plan.model},
                       {"hidden", c.hidden},
                       {"intermediate", c.intermediate},
                       {"experts", c.num_experts},
                       {"topk", c.topk},
                       {"clamp", static_cast<double>(c.swiglu_clamp)},
                       {"dtype", std::string(dtype_name(c.weight_format))},
                       {"scale_format", c.weight_format == WeightFormat::kBf16 ? Json()
                                                                               : Json(std::string(to_string(c.scale_format)))},
                       {"x_fp8", plan.x_fp8},
                       {"max_tokens_per_rank", c.max_tokens_per_rank},
                       {"routing", std::string(to_string(plan.routing))},
                       {"seed", plan.seed},
                       {"vary", plan.vary},
                       {"mode", plan.mode()},
                       {"cycles", plan.cycles},
                       {"verify_every", plan.verify_every},
                       {"verify_rows", plan.verify_rows},
                       {"tolerance", plan.tolerance},
                       {"row_tolerance", row_tolerance(plan.tolerance, c.weight_format)}};
  Json per_rank = Json::array();
  for (const RankStats& s : r.ranks)
    per_rank.push_back({{"tokens", s.tokens},
                        {"routed_slots", s.routed},
                        {"dropped_slots", s.dropped},
                        {"rows_checked", s.rows_checked},
                        {"rel_err", s.rel_err},
                        {"unwritten", s.unwritten},
                        {"output_norm", s.output_norm},
                        {"seconds", s.seconds}});
  Json worst;  // null for the CPU reference and when no row was checked
  if (plan.impl && r.worst_row.rank >= 0)
    worst = {{"rank", r.worst_row.rank}, {"row", r.worst_row.row}, {"rel_err", r.worst_row.err}};
  const Json doc = {{"device", r.device},
                    {"gpus", r.gpus},
                    {"date", utc_timestamp()},
                    {"commit", git_commit()},
                    {"command", command},
                    {"config", config},
                    {"impl", plan.impl ? std::string(to_string(*plan.impl)) : std::string("reference")},
                    {"ranks", r.first_call_tokens},
                    {"calls", r.calls},
                    {"calls_verified", r.calls_verified},
                    {"max_rel_err", plan.impl ? Json(r.max_rel_err) : Json()},
                    {"max_row_rel_err", plan.impl ? Json(r.worst_row.err) : Json()},
                    {"worst_row", worst},
                    {"unwritten", r.unwritten},
                    {"verified", r.verified},
                    {"memory",
                     {{"symmetric_bytes", r.memory.symmetric_bytes}, {"private_bytes", r.memory.private_bytes}}},
                    {"rank_stats", per_rank}};
  Json full = doc;
  if (r.device_used_start >= 0)
    full["device_memory_used_bytes"] = {{"start", r.device_used_start},
                                        {"end", r.device_used_end},
                                        {"change", r.device_used_end - r.device_used_start}};
  if (r.memory_flat) full["device_memory_flat"] = *r.memory_flat;
  if (r.call_times.calls > 0)
    full["call_ms_rank0"] = {{"calls", r.call_times.calls},
                             {"window", r.call_times.window},
                             {"first_window_median", r.call_times.first_median},
                             {"last_window_median", r.call_times.last_median},
                             {"median", r.call_times.median},
                             {"min", r.call_times.min},
                             {"max", r.call_times.max}};
  return dump_json(full);
}

}  // namespace epfuse::tools
