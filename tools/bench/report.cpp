#include "bench/report.h"

#include <algorithm>
#include <cmath>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

std::string fixed(double v, int decimals) { return std::isfinite(v) ? tools::format_fixed(v, decimals) : "-"; }

LayerConfig row_layer(const BenchRow& row) {
  LayerConfig cfg;
  cfg.hidden = row.hidden;
  cfg.intermediate = row.intermediate;
  cfg.num_experts = row.experts;
  cfg.topk = row.topk;
  cfg.max_tokens_per_rank = row.tokens_per_rank;
  if (row.dtype == "fp8") cfg.weight_format = WeightFormat::kFp8Block128;
  return cfg;
}

bool same_problem(const BenchRow& a, const BenchRow& b) {
  return a.config == b.config && a.hidden == b.hidden && a.intermediate == b.intermediate &&
         a.experts == b.experts && a.topk == b.topk && a.tokens_per_rank == b.tokens_per_rank &&
         a.routing == b.routing && a.ranks == b.ranks && a.dtype == b.dtype;
}

}  // namespace

BenchRow row_for_case(const BenchCase& c, std::string impl, int ranks, Routing routing) {
  BenchRow row;
  row.config = c.config;
  row.routing = std::string(to_string(routing));
  row.impl = std::move(impl);
  row.dtype = dtype_name(c.layer.weight_format);
  row.hidden = c.layer.hidden;
  row.intermediate = c.layer.intermediate;
  row.experts = c.layer.num_experts;
  row.topk = c.layer.topk;
  row.tokens_per_rank = c.tokens_per_rank;
  row.ranks = ranks;
  return row;
}

void fill_expected_load(BenchRow& row, const Ceilings& ceilings) {
  const LayerConfig cfg = row_layer(row);
  const RankLoad load = expected_uniform_load(cfg, row.ranks, row.tokens_per_rank);
  row.flops_per_gpu = expert_flops(cfg, load.routed_slots);
  row.remote_bytes_per_gpu = load.remote_rows * token_row_bytes(cfg);
  row.floor = layer_floor(cfg, load, ceilings);
}

void derive_row(BenchRow& row) {
  row.floor_ms = row.floor.floor_ms();
  if (!row.ran()) return;
  const double seconds = row.median_ms * 1e-3;
  row.tflops_per_gpu = row.flops_per_gpu / seconds / 1e12;
  row.nvlink_gbps = row.remote_bytes_per_gpu / seconds / 1e9;
  row.floor_fraction = row.floor_ms / row.median_ms;
  row.gemm_alone_tflops = row.flops_per_gpu / (row.gemm_alone_ms * 1e-3) / 1e12;
  if (row.step_layers > 0) {
    row.step_per_layer_ms = row.step_median_ms / row.step_layers;
    row.step_per_layer_over_single = row.step_per_layer_ms / row.median_ms;
  }
}

void fill_speedups(std::vector<BenchRow>& rows) {
  for (BenchRow& row : rows) {
    row.speedup_over.clear();
    if (!row.ran()) continue;
    for (const BenchRow& other : rows)
      if (&other != &row && other.ran() && other.impl != row.impl && same_problem(row, other))
        row.speedup_over[other.impl] = other.median_ms / row.median_ms;
  }
}

Record row_record(const BenchRow& row) {
  Record r(kRowTag);
  r.set("config", row.config).set("hidden", row.hidden).set("intermediate", row.intermediate);
  r.set("experts", row.experts).set("topk", row.topk).set("tokens_per_rank", row.tokens_per_rank);
  r.set("routing", row.routing).set("impl", row.impl).set("dtype", row.dtype).set("ranks", row.ranks);
  if (!row.ran()) return r.set("note", row.note);
  r.set("iters", row.iters).set("sets", row.sets);
  r.set("median_ms", row.median_ms).set("p10_ms", row.p10_ms).set("p90_ms", row.p90_ms);
  r.set("dispatch_ms", row.dispatch_ms).set("experts_ms", row.experts_ms).set("combine_ms", row.combine_ms);
  r.set("sustained_calls", row.sustained_calls).set("sustained_ms", row.sustained_ms);
  r.set("sustained_joules", row.sustained_joules).set("sustained_watts", row.sustained_watts);
  r.set("gemm_alone_ms", row.gemm_alone_ms);
  r.set("gemm_alone_grouped_ms", row.gemm_alone_grouped_ms).set("gemm_alone_loop_ms", row.gemm_alone_loop_ms);
  if (!row.gemm_path.empty()) r.set("gemm_path", row.gemm_path);
  if (!row.tile.empty()) r.set("tile", row.tile);
  r.set("verified", row.verified).set("rel_err", row.rel_err).set("unwritten", row.unwritten);
  r.set("flops_per_gpu", row.flops_per_gpu).set("remote_bytes_per_gpu", row.remote_bytes_per_gpu);
  r.set("floor_compute_ms", row.floor.compute_ms).set("floor_weights_ms", row.floor.weights_ms);
  r.set("floor_comm_ms", row.floor.comm_ms);
  if (row.step_layers > 0) {
    r.set("step_layers", row.step_layers).set("step_graph", row.step_graph ? 1 : 0);
    r.set("step_weight_sets", row.step_weight_sets).set("step_weight_set_bytes", row.step_weight_set_bytes);
    r.set("step_median_ms", row.step_median_ms).set("step_p10_ms", row.step_p10_ms).set("step_p90_ms", row.step_p90_ms);
    r.set("step_layers_checked", row.step_layers_checked).set("step_verified", row.step_verified);
    r.set("step_rel_err", row.step_rel_err).set("step_row_err", row.step_row_err);
    r.set("step_norm_rel_err", row.step_norm_rel_err).set("step_unwritten", row.step_unwritten);
  }
  return r;
}

BenchRow row_from_record(const Record& rec) {
  BenchRow row;
  row.config = rec.text("config");
  row.hidden = static_cast<int>(rec.integer("hidden"));
  row.intermediate = static_cast<int>(rec.integer("intermediate"));
  row.experts = static_cast<int>(rec.integer("experts"));
  row.topk = static_cast<int>(rec.integer("topk"));
  row.tokens_per_rank = static_cast<int>(rec.integer("tokens_per_rank"));
  row.routing = rec.text("routing");
  row.impl = rec.text("impl");
  row.dtype = rec.has("dtype") ? rec.text("dtype") : "bf16";  // the PyTorch peer's rows are bf16
  row.ranks = rec.has("ranks") ? static_cast<int>(rec.integer("ranks")) : 0;
  if (rec.has("note")) {
    row.note = rec.text("note");
    return row;
  }
  row.iters = static_cast<int>(rec.integer("iters"));
  row.sets = static_cast<int>(rec.integer("sets"));
  row.median_ms = rec.number("median_ms");
  row.p10_ms = rec.number("p10_ms");
  row.p90_ms = rec.number("p90_ms");
  row.dispatch_ms = rec.number_or("dispatch_ms", kNaN);
  row.experts_ms = rec.number_or("experts_ms", kNaN);
  row.combine_ms = rec.number_or("combine_ms", kNaN);
  row.sustained_calls = rec.has("sustained_calls") ? static_cast<int>(rec.integer("sustained_calls")) : 0;
  row.sustained_ms = rec.number_or("sustained_ms", kNaN);
  row.sustained_joules = rec.number_or("sustained_joules", kNaN);
  row.sustained_watts = rec.number_or("sustained_watts", kNaN);
  row.gemm_alone_ms = rec.number_or("gemm_alone_ms", kNaN);
  row.gemm_alone_grouped_ms = rec.number_or("gemm_alone_grouped_ms", kNaN);
  row.gemm_alone_loop_ms = rec.number_or("gemm_alone_loop_ms", kNaN);
  if (rec.has("gemm_path")) row.gemm_path = rec.text("gemm_path");
  if (rec.has("tile")) row.tile = rec.text("tile");
  row.verified = rec.text("verified");
  row.rel_err = rec.number("rel_err");
  row.unwritten = rec.has("unwritten") ? rec.integer("unwritten") : -1;
  // The PyTorch peer reports no work figures: the parent fills them (fill_expected_load).
  row.flops_per_gpu = rec.number_or("flops_per_gpu", kNaN);
  row.remote_bytes_per_gpu = rec.number_or("remote_bytes_per_gpu", kNaN);
  row.floor.compute_ms = rec.number_or("floor_compute_ms", kNaN);
  row.floor.weights_ms = rec.number_or("floor_weights_ms", kNaN);
  row.floor.comm_ms = rec.number_or("floor_comm_ms", kNaN);
  if (rec.has("step_layers")) {
    row.step_layers = static_cast<int>(rec.integer("step_layers"));
    row.step_graph = rec.integer("step_graph") != 0;
    row.step_weight_sets = static_cast<int>(rec.integer("step_weight_sets"));
    row.step_weight_set_bytes = rec.number("step_weight_set_bytes");
    row.step_median_ms = rec.number("step_median_ms");
    row.step_p10_ms = rec.number("step_p10_ms");
    row.step_p90_ms = rec.number("step_p90_ms");
    row.step_layers_checked = static_cast<int>(rec.integer("step_layers_checked"));
    row.step_verified = rec.text("step_verified");
    row.step_rel_err = rec.number("step_rel_err");
    row.step_row_err = rec.number("step_row_err");
    row.step_norm_rel_err = rec.number("step_norm_rel_err");
    row.step_unwritten = rec.integer("step_unwritten");
  }
  return row;
}

Record ceilings_record(const Ceilings& c, std::string_view source) {
  Record r(kCeilingsTag);
  r.set("gemm_tflops", c.gemm_tflops).set("hbm_gbps", c.hbm_gbps).set("nvlink_gbps", c.nvlink_gbps);
  r.set("fp8_gemm_tflops", c.fp8_gemm_tflops);
  return r.set("source", source);
}

Ceilings ceilings_from_record(const Record& rec) {
  Ceilings c{rec.number("gemm_tflops"), rec.number("hbm_gbps"), rec.number("nvlink_gbps")};
  c.fp8_gemm_tflops = rec.number_or("fp8_gemm_tflops", Ceilings::kFp8GemmTflopsH200);
  return c;
}

WorkerRecords read_worker_records(std::istream& in) {
  WorkerRecords out;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    try {
      const Record rec = parse_record(line);
      if (rec.tag() == kCeilingsTag) {
        out.ceilings = ceilings_from_record(rec);
        out.ceilings_source = rec.text("source");
      } else if (rec.tag() == kRowTag) {
        out.rows.push_back(row_from_record(rec));
      } else if (rec.tag() != kProgressTag) {
        throw Error(ErrorCode::kInvalidArgument, "unknown record kind '" + rec.tag() + "'");
      }
    } catch (const Error& e) {
      throw Error(ErrorCode::kInvalidArgument, "bench: rank 0's records, line " + std::to_string(n) + ": " + e.what());
    }
  }
  return out;
}

std::string render_table(const std::vector<BenchRow>& rows) {
  // One speedup column per implementation present, in order of first appearance.
  std::vector<std::string> impls;
  for (const BenchRow& r : rows) {
    bool seen = false;
    for (const std::string& i : impls) seen = seen || i == r.impl;
    if (!seen) impls.push_back(r.impl);
  }
  std::vector<std::string> headers{"config", "T/rank", "impl", "median ms", "p10", "p90", "TFLOP/s/GPU",
                                   "NVLink GB/s", "floor ms", "floor/median"};
  for (const std::string& i : impls) headers.push_back("x vs " + i);
  for (const char* h : {"GEMM alone ms", "GEMM TFLOP/s", "disp/exp/comb ms", "verified", "rel err"})
    headers.push_back(h);
  const bool sustained = std::any_of(rows.begin(), rows.end(), [](const BenchRow& r) { return r.sustained_calls > 0; });
  if (sustained) headers.push_back("sustained ms / J / W");
  const bool step = std::any_of(rows.begin(), rows.end(), [](const BenchRow& r) { return r.step_layers > 0; });
  if (step)
    for (const char* h : {"step ms (layers, weight sets)", "step/L ms", "step/L vs 1 layer", "step verified"})
      headers.push_back(h);
  tools::Table table(headers);
  for (const BenchRow& r : rows) {
    std::vector<std::string> cells{r.config, std::to_string(r.tokens_per_rank),
                                   r.dtype == "bf16" ? r.impl : r.impl + " " + r.dtype};
    if (!r.ran()) {
      cells.push_back("skipped: " + r.note);
      cells.resize(headers.size(), "");
      table.add_row(cells);
      continue;
    }
    cells.push_back(fixed(r.median_ms, 3));
    cells.push_back(fixed(r.p10_ms, 3));
    cells.push_back(fixed(r.p90_ms, 3));
    cells.push_back(fixed(r.tflops_per_gpu, 1));
    cells.push_back(fixed(r.nvlink_gbps, 1));
    cells.push_back(fixed(r.floor_ms, 3) + " (" + std::string(r.floor.bound()) + ")");
    cells.push_back(std::isfinite(r.floor_fraction) ? fixed(100 * r.floor_fraction, 1) + "%" : "-");
    for (const std::string& i : impls) {
      const auto it = r.speedup_over.find(i);
      cells.push_back(it == r.speedup_over.end() ? "-" : fixed(it->second, 2) + "x");
    }
    cells.push_back(fixed(r.gemm_alone_ms, 3) + (r.gemm_path.empty() ? "" : " " + r.gemm_path));
    cells.push_back(fixed(r.gemm_alone_tflops, 1));
    cells.push_back(std::isfinite(r.dispatch_ms) ? fixed(r.dispatch_ms, 3) + "/" + fixed(r.experts_ms, 3) +
                                                       "/" + fixed(r.combine_ms, 3)
                                                 : "-");
    cells.push_back(r.verified);
    cells.push_back(tools::format_sci(r.rel_err));
    if (sustained)
      cells.push_back(r.sustained_calls > 0 ? fixed(r.sustained_ms, 3) + " / " + fixed(r.sustained_joules, 2) + " / " +
                                                  fixed(r.sustained_watts, 0)
                                            : "-");
    if (step && r.step_layers > 0) {
      cells.push_back(fixed(r.step_median_ms, 3) + " (" + std::to_string(r.step_layers) + ", S=" +
                      std::to_string(r.step_weight_sets) + (r.step_graph ? ", graph)" : ", launched)"));
      cells.push_back(fixed(r.step_per_layer_ms, 3));
      cells.push_back(std::isfinite(r.step_per_layer_over_single) ? fixed(r.step_per_layer_over_single, 3) + "x" : "-");
      cells.push_back(r.step_verified + " " + tools::format_sci(std::max(r.step_rel_err, r.step_norm_rel_err)));
    } else if (step) {
      cells.resize(headers.size(), "-");
    }
    table.add_row(cells);
  }
  return table.render();
}

std::string render_step_lines(const std::vector<BenchRow>& rows) {
  std::string out;
  for (const BenchRow& r : rows) {
    if (r.step_layers <= 0) continue;
    out += "  " + r.config + " T=" + std::to_string(r.tokens_per_rank) + " " + r.impl +
           (r.dtype == "bf16" ? "" : " " + r.dtype) + ": " + std::to_string(r.step_layers) + " layers " +
           fixed(r.step_median_ms, 3) + " ms = " + fixed(r.step_per_layer_ms, 4) + " ms per layer, " +
           (std::isfinite(r.step_per_layer_over_single) ? fixed(r.step_per_layer_over_single, 3) + "x" : "-") +
           " the single layer's " + fixed(r.median_ms, 4) + " ms; S=" + std::to_string(r.step_weight_sets) +
           " weight sets of " + fixed(r.step_weight_set_bytes / 1e9, 3) + " GB per GPU (layer i on set i % " +
           std::to_string(r.step_weight_sets) + "); verified " + r.step_verified + " (" +
           std::to_string(r.step_layers_checked) + " layers checked: rel err " + tools::format_sci(r.step_rel_err) +
           ", worst row " + tools::format_sci(r.step_row_err) + "; norms " + tools::format_sci(r.step_norm_rel_err) +
           "; unwritten " + std::to_string(r.step_unwritten) + ")\n";
  }
  return out;
}

std::string render_floor_table(const std::vector<BenchCase>& cases, int world, const Ceilings& c) {
  tools::Table table({"config", "T/rank", "compute ms", "weights ms", "comm ms", "floor ms", "bound"});
  for (const BenchCase& bc : cases) {
    if (bc.layer.num_experts % world != 0) {
      table.add_row({bc.config, std::to_string(bc.tokens_per_rank), "E not divisible by ranks", "", "", "", ""});
      continue;
    }
    const Floor f = layer_floor(bc.layer, expected_uniform_load(bc.layer, world, bc.tokens_per_rank), c);
    const std::string config =
        bc.layer.weight_format == WeightFormat::kBf16 ? bc.config : bc.config + " " + dtype_name(bc.layer.weight_format);
    table.add_row({config, std::to_string(bc.tokens_per_rank), fixed(f.compute_ms, 3), fixed(f.weights_ms, 3),
                   fixed(f.comm_ms, 3), fixed(f.floor_ms(), 3), std::string(f.bound())});
  }
  return table.render();
}

tools::Json row_json(const BenchRow& r) {
  using tools::Json;
  Json speedups = Json::object();
  for (const auto& [impl, s] : r.speedup_over) speedups[impl] = s;
  Json j = {{"config", r.config},
            {"hidden", r.hidden},
            {"intermediate", r.intermediate},
            {"experts", r.experts},
            {"topk", r.topk},
            {"tokens_per_rank", r.tokens_per_rank},
            {"routing", r.routing},
            {"impl", r.impl},
            {"dtype", r.dtype},
            {"ranks", r.ranks},
            {"median_ms", r.median_ms},
            {"p10_ms", r.p10_ms},
            {"p90_ms", r.p90_ms},
            {"tflops_per_gpu", r.tflops_per_gpu},
            {"nvlink_gbps", r.nvlink_gbps},
            {"floor_ms", r.floor_ms},
            {"fraction_of_floor", r.floor_fraction},
            {"floor_terms",
             {{"compute_ms", r.floor.compute_ms},
              {"weights_ms", r.floor.weights_ms},
              {"comm_ms", r.floor.comm_ms},
              {"bound", std::string(r.floor.bound())}}},
            // Rows that did not run are unverified, not failed; only a run that failed the check says false.
            {"verified", r.verified == "yes" ? Json(true) : r.verified == "no" ? Json(false) : Json()},
            {"rel_err", r.rel_err},
            {"unwritten", r.unwritten < 0 ? Json() : Json(r.unwritten)},
            {"speedup_over", speedups},
            {"phases", {{"dispatch_ms", r.dispatch_ms}, {"experts_ms", r.experts_ms}, {"combine_ms", r.combine_ms}}},
            {"gemm_alone_ms", r.gemm_alone_ms},
            {"gemm_alone_tflops", r.gemm_alone_tflops},
            {"gemm_alone_grouped_ms", r.gemm_alone_grouped_ms},
            {"gemm_alone_loop_ms", r.gemm_alone_loop_ms},
            {"gemm_path", r.gemm_path.empty() ? Json() : Json(r.gemm_path)},
            {"tile", r.tile.empty() ? Json() : Json(r.tile)},
            {"flops_per_gpu", r.flops_per_gpu},
            {"remote_bytes_per_gpu", r.remote_bytes_per_gpu},
            {"iters", r.iters},
            {"sets", r.sets}};
  if (r.sustained_calls > 0)
    j["sustained"] = {{"calls", r.sustained_calls},
                      {"ms_per_call", r.sustained_ms},
                      {"joules_per_call", r.sustained_joules},
                      {"watts", r.sustained_watts}};
  if (r.step_layers > 0)
    j["decode_step"] = {{"layers", r.step_layers},
                        {"graph", r.step_graph},
                        {"weight_sets", r.step_weight_sets},
                        {"weight_set_bytes", r.step_weight_set_bytes},
                        {"median_ms", r.step_median_ms},
                        {"p10_ms", r.step_p10_ms},
                        {"p90_ms", r.step_p90_ms},
                        {"per_layer_ms", r.step_per_layer_ms},
                        {"per_layer_over_single", r.step_per_layer_over_single},
                        {"layers_checked", r.step_layers_checked},
                        {"verified", r.step_verified == "yes" ? Json(true) : r.step_verified == "no" ? Json(false) : Json()},
                        {"rel_err", r.step_rel_err},
                        {"row_err", r.step_row_err},
                        {"norm_rel_err", r.step_norm_rel_err},
                        {"unwritten", r.step_unwritten < 0 ? Json() : Json(r.step_unwritten)},
                        {"timing", kStepTimingMethod}};
  if (!r.ran()) j["skipped"] = r.note;
  if (!r.remark.empty()) j["remark"] = r.remark;
  return j;
}

tools::Json report_json(const RunInfo& info, const std::vector<BenchRow>& rows) {
  tools::Json all = tools::Json::array();
  for (const BenchRow& r : rows) all.push_back(row_json(r));
  return {{"device", info.device},
          {"device_uuid", info.device_uuid},
          {"gpus", info.gpus},
          {"date", info.date},
          {"commit", info.commit},
          {"command", info.command},
          {"timing", kTimingMethod},
          {"ceilings",
           {{"gemm_tflops", info.ceilings.gemm_tflops},
            {"fp8_gemm_tflops", info.ceilings.fp8_gemm_tflops},
            {"hbm_gbps", info.ceilings.hbm_gbps},
            {"nvlink_gbps", info.ceilings.nvlink_gbps},
            {"source", info.ceilings_source}}},
          {"rows", all}};
}

}  // namespace epfuse::bench
