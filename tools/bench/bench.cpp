// The `epfuse bench` parent: no GPU work of its own. It launches one rank process per GPU (itself,
// re-executed with --worker-dir), follows their progress records, runs the PyTorch peer on the same
// shapes, merges the rows, derives the figures and prints the table (and --json).
#include "bench/bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <cuda_runtime.h>
#include <fmt/format.h>

#include "bench/peers.h"
#include "bench/report.h"
#include "bench/trace_export.h"
#include "bench/worker.h"
#include "common/flags.h"
#include "common/output.h"
#include "common/process.h"
#include "epfuse/error.h"
#include "launch/launcher.h"

namespace epfuse::tools {
namespace {

using namespace epfuse::bench;

constexpr const char* kPeerScript = "bench/peers/torch_ep.py";
constexpr size_t kPeerLogLines = 30;  // shown when the peer fails

int fail(const std::string& reason) {
  std::fflush(stdout);
  fmt::print(stderr, "epfuse bench: {}\n", reason);
  return 1;
}

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// A peer script (path relative to the source tree): from the source tree this binary was built from,
// else the tree around the executable (build/tools/epfuse -> ./bench/peers), else the working directory.
std::string find_peer_script(const char* relative = kPeerScript) {
  namespace fs = std::filesystem;
  const fs::path exe = fs::path(self_executable()).parent_path();
  for (const fs::path& root : {fs::path(EPFUSE_SOURCE_DIR), exe.parent_path().parent_path(), exe.parent_path(),
                               fs::current_path()})
    if (fs::exists(root / relative)) return (root / relative).string();
  return "";
}

// The "done" count of a progress record; nullopt for any other line (a broken one included: the
// records are checked when the ranks are done).
std::optional<long long> progress_done(std::string_view line) {
  const std::optional<Record> rec = find_record(line);
  if (!rec || rec->tag() != kProgressTag) return std::nullopt;
  try {
    return rec->integer("done");
  } catch (const epfuse::Error&) {
    return std::nullopt;
  }
}

// Follows rank 0's records file while the ranks run and moves the progress bar with it.
class RecordFollower {
 public:
  RecordFollower(std::string path, Progress& progress)
      : path_(std::move(path)), progress_(progress), thread_([this] { loop(); }) {}
  ~RecordFollower() {
    stop_ = true;
    thread_.join();
  }

 private:
  void loop() {
    std::ifstream in;
    std::string line, partial;
    while (true) {
      const bool last_pass = stop_.load();  // read once more after the ranks ended
      if (!in.is_open()) in.open(path_);
      if (in.is_open()) {
        while (std::getline(in, line)) {
          if (in.eof()) {  // no newline yet: the writer is mid-line
            partial += line;
            break;
          }
          if (const std::optional<long long> done = progress_done(partial + line)) progress_.update(*done);
          partial.clear();
        }
        in.clear();
      }
      if (last_pass) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  }
  std::string path_;
  Progress& progress_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts after the members it reads
};

struct WorkerResult {
  int exit_code = 0;
  WorkerRecords records;
};

WorkerResult run_ranks(const BenchOptions& o, int world, Progress& progress) {
  namespace fs = std::filesystem;
  std::string dir = (fs::temp_directory_path() / "epfuse-bench-XXXXXX").string();
  if (!::mkdtemp(dir.data())) throw epfuse::Error(epfuse::ErrorCode::kInvalidArgument, "bench: cannot create a temporary directory in " + fs::temp_directory_path().string());
  const std::string records = dir + "/" + kRecordsFile;
  WorkerResult out;
  {
    RecordFollower follow(records, progress);
    std::vector<std::string> argv{self_executable(), "bench"};
    argv.insert(argv.end(), o.args.begin(), o.args.end());
    argv.insert(argv.end(), {"--worker-dir", dir});
    LaunchOptions opts;
    opts.nprocs = world;
    out.exit_code = launch(opts, argv);
  }
  std::stringstream text;
  if (std::ifstream in(records); in) text << in.rdbuf();
  std::error_code ignored;
  fs::remove_all(dir, ignored);
  out.records = read_worker_records(text);  // throws for a line that is not a record
  return out;
}

bool torch_importable() {
  return std::system("python3 -c 'import torch' >/dev/null 2>&1") == 0;
}

struct PeerResult {
  bool ok = false;
  std::string why;  // when !ok
  std::vector<BenchRow> rows;
};

// Runs the PyTorch peer over the uniform-routing cases, reading its records as it goes.
PeerResult run_peer(const BenchOptions& o, const std::vector<BenchCase>& cases, int world, Progress& progress,
                    int progress_base) {
  PeerResult out;
  const std::string script = find_peer_script();
  if (script.empty()) {
    out.why = std::string("cannot find ") + kPeerScript;
    return out;
  }
  std::string shapes;
  for (const BenchCase& c : cases)
    shapes += (shapes.empty() ? "" : ";") + shape_item(c, c.layer.num_experts);
  // NVLink multicast stays off (FACTS.md); --standalone picks a free rendezvous port.
  const std::string cmd = "NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --standalone --nproc_per_node=" +
                          std::to_string(world) + " " + shell_quote(script) + " --shapes " + shell_quote(shapes) +
                          " --warmup " + std::to_string(o.warmup) + " --iters " + std::to_string(o.iters) +
                          " --sets " + std::to_string(o.sets) + " --seed " + std::to_string(o.seed) +
                          " --verify-rows " + std::to_string(o.verify_rows) + " --tolerance " +
                          std::to_string(o.tolerance) + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) {
    out.why = "cannot start python3";
    return out;
  }
  std::deque<std::string> log;
  std::string line;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    line += buf;
    if (line.back() != '\n') continue;  // a longer line continues
    const std::optional<Record> rec = find_record(line);  // the rest is torch's and NCCL's log
    if (rec && rec->tag() == kProgressTag) {
      progress.update(progress_base + rec->integer("done"));
    } else if (rec && rec->tag() == kRowTag) {
      BenchRow r = row_from_record(*rec);
      r.ranks = world;
      out.rows.push_back(std::move(r));
    } else {
      log.push_back(line);
      if (log.size() > kPeerLogLines) log.pop_front();
    }
    line.clear();
  }
  const int status = ::pclose(pipe);
  out.ok = status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  if (!out.ok) {
    out.why = "python3 -m torch.distributed.run exited with status " +
              std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : status) + "; its last lines:\n";
    for (const std::string& l : log) out.why += "  " + l;
  }
  return out;
}

struct DeepGemmPeers {
  bool ran = false, ok = false;
  std::string why;  // when !ok
  PeerOutput out;
};

// Runs a peer command, echoing its lines as they come (a run cut off by a time limit still shows the
// peers' rows so far); its exit status (-1: not started) and output.
std::pair<int, std::string> run_echoed(const std::string& cmd) {
  fmt::print("epfuse bench: the DeepGEMM/MegaMoE peers: {} (their builds take minutes)\n", cmd);
  std::fflush(stdout);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) return {-1, ""};
  std::string text;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) {
    fmt::print("  peers| {}", buf);
    std::fflush(stdout);
    text += buf;
  }
  const int status = ::pclose(pipe);
  return {status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : (status == -1 ? -1 : 128), text};
}

// `--peer-steps ... routed`: bench/peers/deepgemm_routed.py on the FP8 cases, DIR/deepgemm on PYTHONPATH.
void run_routed_peer(const BenchOptions& o, int world, DeepGemmPeers& p) {
  const std::string shapes = routed_shapes(o.cases);
  if (shapes.empty()) return;  // no FP8 case
  const std::string script = find_peer_script(kRoutedScript);
  if (script.empty()) {
    p.ok = false;
    p.why += std::string("cannot find ") + kRoutedScript + "\n";
    return;
  }
  const auto [status, text] = run_echoed("PYTHONPATH=" + shell_quote(o.peers_dir + "/deepgemm") + " python3 " +
                                         shell_quote(script) + " --shapes " + shell_quote(shapes) + " --world " +
                                         std::to_string(world) + " 2>&1");
  PeerOutput routed = parse_routed_output(text);
  const bool ok = status == 0 && !routed.rows.empty();
  for (BenchRow& r : routed.rows) p.out.rows.push_back(std::move(r));
  for (std::string& e : routed.errors) p.out.errors.push_back(std::move(e));
  if (!ok) {
    p.ok = false;
    p.why += std::string(kRoutedScript) + " exited with status " + std::to_string(status) + " and " +
             std::to_string(routed.rows.size()) + " rows (its output is above, '  peers| ')\n";
  }
}

// run_deepgemm_peers.sh's steps (gemm, megamoe), its rows into p.
void run_script_peers(const BenchOptions& o, int world, const std::vector<std::string>& steps, DeepGemmPeers& p) {
  const std::string script = o.peers_dir + "/" + kPeersScript;
  if (!std::filesystem::exists(script)) {
    p.ok = false;
    p.why += script + " not found (prepare DIR and copy ../shared/peers/*.sh *.py into DIR/scripts: "
                      "../shared/peers/README.md)\n";
    return;
  }
  std::string env = "EXTRA=" + shell_quote(gemm_alone_extra_shapes(o.cases, world)) + " ";
  if (world > 1) env += "MEGAMOE_RANKS=" + std::to_string(world) + " ";
  // MegaMoE at this run's token counts, unless the caller's environment names its own.
  for (const auto& [var, tokens] : megamoe_batches(o.cases))
    if (std::getenv(var.c_str()) == nullptr) env += var + "=" + shell_quote(tokens) + " ";
  std::string cmd = env + "bash " + shell_quote(script) + " " + shell_quote(o.peers_dir);
  for (const std::string& step : steps) cmd += " " + step;
  const auto [status, text] = run_echoed(cmd + " 2>&1");
  p.out = parse_peer_output(text, world);
  if (status != 0 || p.out.rows.empty()) {
    p.ok = false;
    p.why += "run_deepgemm_peers.sh exited with status " + std::to_string(status) + " and " +
             std::to_string(p.out.rows.size()) + " rows (its output is above, '  peers| ')\n";
  }
}

// `--peers DIR`: DIR/scripts/run_deepgemm_peers.sh DIR <--peer-steps but routed> (bench/peers.h), output
// parsed; then the routed step when asked for.
DeepGemmPeers run_deepgemm_peers(const BenchOptions& o, int world) {
  DeepGemmPeers p;
  p.ran = true;
  p.ok = true;
  std::vector<std::string> steps;
  for (const std::string& step : o.peer_steps)
    if (step != "routed") steps.push_back(step);
  if (!steps.empty()) run_script_peers(o, world, steps, p);
  if (std::find(o.peer_steps.begin(), o.peer_steps.end(), "routed") != o.peer_steps.end()) run_routed_peer(o, world, p);
  return p;
}

// A peer's row of the same per-GPU work as case c (its own config name may differ: the GEMM-alone
// script names the FACTS model a world-1 case spells out as "custom").
bool same_work(const BenchRow& r, const BenchCase& c, int world) {
  return r.tokens_per_rank == c.tokens_per_rank && r.hidden == c.layer.hidden &&
         r.intermediate == c.layer.intermediate && r.experts == c.layer.num_experts && r.topk == c.layer.topk &&
         r.ranks == world && r.dtype == dtype_name(c.layer.weight_format);
}

bool same_case(const BenchRow& r, const BenchCase& c) {
  return r.config == c.config && r.tokens_per_rank == c.tokens_per_rank && r.hidden == c.layer.hidden &&
         r.intermediate == c.layer.intermediate && r.experts == c.layer.num_experts && r.topk == c.layer.topk &&
         r.dtype == dtype_name(c.layer.weight_format);
}

int run_floors_only(const BenchOptions& o, const std::string& command) {
  const int world = o.ranks > 0 ? o.ranks : 4;
  const Ceilings c = o.ceilings.value_or(Ceilings{812, 4250, 350});
  fmt::print("epfuse bench: no GPU found: printing the floors only ({} ranks, uniform routing; ceilings {}: "
             "GEMM {:.0f} TFLOP/s, HBM {:.0f} GB/s, NVLink {:.0f} GB/s)\n",
             world, o.ceilings ? "from --ceilings" : "of FACTS.md", c.gemm_tflops, c.hbm_gbps, c.nvlink_gbps);
  std::fputs(render_floor_table(o.cases, world, c).c_str(), stdout);
  if (o.json_path.empty()) return 0;
  RunInfo info{"none", utc_timestamp(), git_commit(), command, 0, c, o.ceilings ? "flags" : "FACTS.md", "none"};
  std::vector<BenchRow> rows;
  for (const BenchCase& bc : o.cases) {
    if (!check_config(bc.layer, world).empty()) continue;
    BenchRow r = row_for_case(bc, "none", world, o.routing);
    r.note = "no GPU: floor only";
    fill_expected_load(r, c);
    derive_row(r);
    rows.push_back(std::move(r));
  }
  write_file(o.json_path, tools::dump_json(report_json(info, rows)) + "\n");
  return 0;
}

}  // namespace

int bench_command(int argc, char** argv) {
  BenchOptions o;
  try {
    o = parse_bench_options(std::vector<std::string>(argv + 1, argv + argc));
  } catch (const UsageError& e) {
    fmt::print(stderr, "epfuse bench: {}\n\n{}", e.what(), parse_bench_options({"--help"}).usage);
    return 2;
  }
  if (o.help) {
    std::fputs(o.usage.c_str(), stdout);
    return 0;
  }
  if (!o.worker_dir.empty()) {
    run_worker(o);  // errors propagate: the CLI prints them and exits 1, the launcher stops the others
    return 0;
  }

  const std::string command = "epfuse " + command_line(argc, argv);
  const int gpus = visible_gpus();
  if (gpus == 0) return run_floors_only(o, command);
  const int world = o.ranks > 0 ? o.ranks : gpus;
  if (world > gpus) {
    if (env_is("EPFUSE_SKIP_IF_FEWER_GPUS", "1")) {
      fmt::print("SKIPPED: needs {} GPUs, found {}\n", world, gpus);
      return 77;
    }
    return fail("--ranks " + std::to_string(world) + " needs " + std::to_string(world) + " GPUs, found " +
                std::to_string(gpus));
  }

  // The PyTorch peer: uniform routing, no clamp (what torch_ep_baseline.py computes).
  bool torch = o.torch == TorchMode::kOn || (o.torch == TorchMode::kAuto && torch_importable());
  std::string torch_note;
  if (torch && o.routing != Routing::kUniform) torch_note = "the PyTorch peer runs uniform routing only";
  if (torch && o.cases.front().layer.swiglu_clamp > 0) torch_note = "the PyTorch peer has no SwiGLU clamp";
  if (!torch_note.empty()) torch = false;
  if (o.torch == TorchMode::kOn && !torch_note.empty()) return fail("--torch on: " + torch_note);

  // The PyTorch peer is bf16: it runs the bf16 cases only.
  std::vector<BenchCase> torch_cases;
  for (const BenchCase& c : o.cases)
    if (c.layer.weight_format == WeightFormat::kBf16) torch_cases.push_back(c);
  if (torch_cases.empty()) torch = false;
  const int worker_units = static_cast<int>(o.cases.size() * o.impls.size()) + 1;
  Progress progress("epfuse bench", worker_units + (torch ? static_cast<int>(torch_cases.size()) : 0));
  const std::string trace_csv = o.trace_path.empty() ? "" : o.trace_path + ".csv";
  if (!trace_csv.empty()) {  // the rank processes append to it (src/fused/fused_kernel.cu LaunchTrace)
    std::error_code ignored;
    std::filesystem::remove(trace_csv, ignored);
    ::setenv("EPFUSE_TRACE_FILE", trace_csv.c_str(), 1);
  }
  const WorkerResult ranks = run_ranks(o, world, progress);
  if (ranks.exit_code != 0 && ranks.records.rows.empty()) {
    progress.finish();
    return fail("the rank processes failed before any row (see their output above)");
  }
  PeerResult peer;
  if (torch && ranks.records.ceilings) {
    peer = run_peer(o, torch_cases, world, progress, worker_units);
    if (!peer.ok) fmt::print(stderr, "\nepfuse bench: the PyTorch peer failed: {}", peer.why);
  }
  progress.finish();

  RunInfo info;
  info.device = device_name();
  info.device_uuid = device_uuid();
  info.gpus = world;
  info.date = utc_timestamp();
  info.commit = git_commit();
  info.command = command;
  info.ceilings = ranks.records.ceilings.value_or(Ceilings{});
  info.ceilings_source = ranks.records.ceilings_source;

  // The table and JSON of the layers, PyTorch and the DeepGEMM/MegaMoE peers' rows in `deepgemm`.
  const auto publish = [&](DeepGemmPeers deepgemm) {
    // Per case: the implementations in --impl order, then PyTorch, then the peers of the same work.
    std::vector<BenchRow> rows;
    for (const BenchCase& c : o.cases) {
      for (const BenchRow& r : ranks.records.rows)
        if (same_case(r, c)) rows.push_back(r);
      for (BenchRow r : peer.rows)
        if (same_case(r, c)) {
          fill_expected_load(r, info.ceilings);
          rows.push_back(std::move(r));
        }
      for (BenchRow& r : deepgemm.out.rows)
        if (!r.impl.empty() && same_work(r, c, world)) {
          BenchRow row = r;
          row.config = c.config;
          r.impl.clear();  // taken
          fill_expected_load(row, info.ceilings);
          rows.push_back(std::move(row));
        }
    }
    for (BenchRow& r : deepgemm.out.rows)  // the peers' other shapes, after the cases
      if (!r.impl.empty()) {
        fill_expected_load(r, info.ceilings);
        rows.push_back(std::move(r));
      }
    for (BenchRow& r : rows) derive_row(r);
    fill_speedups(rows);

    fmt::print("\nepfuse bench: {} x {} (GPU 0: {}), {} warm-up + {} timed forwards over {} input sets per row, "
               "routing {}\n",
               info.device, world, info.device_uuid, o.warmup, o.iters, o.sets, to_string(o.routing));
    fmt::print("ceilings ({}): GEMM {:.0f} TFLOP/s, HBM {:.0f} GB/s, NVLink {:.0f} GB/s\n", info.ceilings_source,
               info.ceilings.gemm_tflops, info.ceilings.hbm_gbps, info.ceilings.nvlink_gbps);
    if (!torch_note.empty()) fmt::print("torch: skipped: {}\n", torch_note);
    if (o.x_fp8) fmt::print("FP8 rows: x quantised by the caller (--x-fp8: e4m3 codes and 1x128 scales, not bf16 x)\n");
    std::fputs(render_table(rows).c_str(), stdout);
    const std::string steps = render_step_lines(rows);
    if (!steps.empty())
      fmt::print("decode steps ({}; bench/README.md \"The decode step\"):\n{}",
                 o.step_graph ? "one CUDA graph replayed" : "layers and norms launched from the host", steps);
    std::fflush(stdout);
    if (!o.json_path.empty()) write_file(o.json_path, tools::dump_json(report_json(info, rows)) + "\n");
    return rows;
  };

  DeepGemmPeers deepgemm;
  if (!o.peers_dir.empty() && ranks.records.ceilings) {
    // The layers' rows first (table and JSON): the peers' builds take minutes, and a run cut off there
    // keeps them.
    fmt::print("\nepfuse bench: the rows before the DeepGEMM/MegaMoE peers:");
    publish(deepgemm);
    deepgemm = run_deepgemm_peers(o, world);
    if (!deepgemm.ok) fmt::print(stderr, "epfuse bench: the DeepGEMM/MegaMoE peers failed: {}\n", deepgemm.why);
    for (const std::string& e : deepgemm.out.errors) fmt::print(stderr, "epfuse bench: peers: {}\n", e);
  }
  const std::vector<BenchRow> rows = publish(deepgemm);

  if (!trace_csv.empty()) {
    std::stringstream text;
    if (std::ifstream in(trace_csv); in) text << in.rdbuf();
    const std::vector<TraceRow> trace = parse_trace_csv(text.str());
    if (trace.empty())
      return fail("--trace: no timeline was recorded: the library needs -DEPFUSE_TRACE=ON (a diagnostic build), and "
                  "each row at least EPFUSE_TRACE_LAUNCH + 3 fused forwards (default 20 + 3)");
    write_file(o.trace_path, chrome_trace_json(trace) + "\n");
    fmt::print("\nepfuse bench: the fused kernel's timeline in {} (Perfetto's UI opens it; records in {}):\n{}",
               o.trace_path, trace_csv, format_launch_summaries(summarise_launches(trace)));
  }

  if (ranks.exit_code != 0) return fail("a rank process failed; the table holds the rows finished before it");
  if (o.torch == TorchMode::kOn && !peer.ok) return fail("--torch on and the PyTorch peer failed");
  if (deepgemm.ran && !deepgemm.ok) return fail("--peers " + o.peers_dir + ": the DeepGEMM/MegaMoE peers failed");
  for (const BenchRow& r : rows)
    if (r.verified == "no")
      return fail(r.config + " T=" + std::to_string(r.tokens_per_rank) + " " + r.impl +
                  " did not match the reference (rel err " + format_sci(r.rel_err) + ")");
  for (const BenchRow& r : rows)
    if (r.step_verified == "no")
      return fail(r.config + " T=" + std::to_string(r.tokens_per_rank) + " " + r.impl + ": the " +
                  std::to_string(r.step_layers) + "-layer decode step did not match the reference (layer rel err " +
                  format_sci(r.step_rel_err) + ", row " + format_sci(r.step_row_err) + ", norm " +
                  format_sci(r.step_norm_rel_err) + ", unwritten " + std::to_string(r.step_unwritten) + ")");
  return 0;
}

}  // namespace epfuse::tools
