#include "bench/worker.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>

#include "bench/ceilings.h"
#include "bench/decode_run.h"
#include "bench/energy.h"
#include "bench/gemm_alone.h"
#include "bench/timed_call.h"
#include "bench/report.h"
#include "bench/stats.h"
#include "common/check.h"
#include "common/job.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"
#include "fused/fused_layer.h"
#include "fused/plan.h"

namespace epfuse::bench {
namespace {

using tools::InputSet;
using tools::RankJob;

// Forwards per rank timed with phase events on, after the main timing (events add a little work).
constexpr int kPhaseIters = 20;

// Rank 0's records file; the other ranks report nothing (the parent reads rank 0 alone).
class RecordSink {
 public:
  RecordSink(const std::string& dir, bool active) {
    if (!active) return;
    out_.open(dir + "/" + kRecordsFile, std::ios::app);
    EPFUSE_REQUIRE(out_.good(), ErrorCode::kInvalidArgument,
                   "bench: cannot write " + dir + "/" + kRecordsFile);
  }
  void write(const Record& rec) {
    if (!out_.is_open()) return;
    out_ << rec.format() << std::endl;  // flushed: the parent follows the file while we run
  }
  void progress(int done, int total, const std::string& label) {
    write(Record(kProgressTag).set("done", done).set("total", total).set("label", label));
  }

 private:
  std::ofstream out_;
};

// Collective: each rank's values summed over ranks.
std::vector<double> sum_over_ranks(Communicator& comm, const std::vector<double>& mine) {
  const std::vector<double> all = comm.all_gather(mine);
  std::vector<double> sum(mine.size(), 0.0);
  for (size_t i = 0; i < all.size(); ++i) sum[i % mine.size()] += all[i];
  return sum;
}

// --sustained: about target_ms of forwards back to back, no sync between them (as a model's layers run,
// and as peers time a GEMM "sustained"): on the compute-bound rows the board's power limit then sets
// the clock, which the synchronised calls above only partly reach. Collective (the ranks start
// together; the layer synchronises them within). Energy from each rank's own GPU counter (null: none).
void time_sustained(Communicator& comm, RankJob& job, const std::vector<InputSet>& sets, double target_ms,
                    double median_ms, const EnergyCounter* counter, BenchRow& row) {
  const int calls = sustained_calls(target_ms, median_ms);
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(job.stream()));
  comm.barrier();
  const std::optional<double> j0 = counter ? counter->joules() : std::nullopt;
  const double elapsed = tools::time_iterations(job.stream(), 1, [&](int) {
    for (int i = 0; i < calls; ++i) job.forward(sets[i % sets.size()]);
  })[0];
  const std::optional<double> j1 = counter ? counter->joules() : std::nullopt;
  const SustainedFigures f = sustained_figures(elapsed, calls, j0 && j1 ? *j1 - *j0 : kNaN);
  const int world = comm.world_size();
  const std::vector<double> sums = sum_over_ranks(comm, {f.joules_per_call, f.watts});
  row.sustained_calls = calls;
  row.sustained_ms = slowest_rank(comm, {f.ms_per_call}).median;
  row.sustained_joules = sums[0] / world;
  row.sustained_watts = sums[1] / world;
}

// What the routing of a case's input sets asks of the GPUs: the floor (per term the slowest rank,
// averaged over sets), work per GPU (mean over ranks and sets), and set 0's rows per local expert.
struct CaseLoad {
  Floor floor;
  double flops_per_gpu = 0, remote_bytes_per_gpu = 0;
  std::vector<int> local_rows;
};

CaseLoad case_load(Communicator& comm, const LayerConfig& cfg, const std::vector<InputSet>& sets,
                   const Ceilings& ceilings) {
  const int world = comm.world_size(), rank = comm.rank(), per_rank = cfg.experts_per_rank(world);
  CaseLoad out;
  for (size_t s = 0; s < sets.size(); ++s) {
    RoutingCounts counts = make_routing_counts(cfg, world);
    count_rank_routing(cfg, world, rank, sets[s].host().topk_idx, counts);
    // One collective for the three vectors: [E slots | R sends | R recvs].
    std::vector<double> packed = counts.slots_per_expert;
    packed.insert(packed.end(), counts.sends_per_rank.begin(), counts.sends_per_rank.end());
    packed.insert(packed.end(), counts.recvs_per_rank.begin(), counts.recvs_per_rank.end());
    packed = sum_over_ranks(comm, packed);
    const auto e_end = packed.begin() + cfg.num_experts;
    counts.slots_per_expert.assign(packed.begin(), e_end);
    counts.sends_per_rank.assign(e_end, e_end + world);
    counts.recvs_per_rank.assign(e_end + world, packed.end());

    Floor slowest;
    for (int r = 0; r < world; ++r) {
      const RankLoad load = rank_load(cfg, world, r, counts);
      const Floor f = layer_floor(cfg, load, ceilings);
      slowest.compute_ms = std::max(slowest.compute_ms, f.compute_ms);
      slowest.weights_ms = std::max(slowest.weights_ms, f.weights_ms);
      slowest.comm_ms = std::max(slowest.comm_ms, f.comm_ms);
      out.flops_per_gpu += expert_flops(cfg, load.routed_slots) / world / sets.size();
      out.remote_bytes_per_gpu += load.remote_rows * token_row_bytes(cfg) / world / sets.size();
    }
    out.floor.compute_ms += slowest.compute_ms / sets.size();
    out.floor.weights_ms += slowest.weights_ms / sets.size();
    out.floor.comm_ms += slowest.comm_ms / sets.size();
    if (s == 0)
      for (int e = rank * per_rank; e < (rank + 1) * per_rank; ++e)
        out.local_rows.push_back(static_cast<int>(counts.slots_per_expert[e]));
  }
  return out;
}

// A note is one cell of the table (and one JSON string): no tabs or newlines.
std::string one_line(std::string text) {
  std::replace_if(text.begin(), text.end(), [](char c) { return c == '\t' || c == '\n' || c == '\r'; }, ' ');
  return text;
}

int reference_threads() {
  const char* local_world = std::getenv("LOCAL_WORLD_SIZE");
  const int ranks = local_world ? std::max(1, std::atoi(local_world)) : 1;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks);
}

// Collective: phase medians of the slowest rank, or NaN when the implementation has no phase timing.
void time_phases(RankJob& job, const std::vector<InputSet>& sets, BenchRow& row) {
  MoeLayer& layer = job.layer();
  layer.set_phase_timing(true);
  std::vector<double> phases[3];
  bool supported = true;
  for (int i = 0; i < kPhaseIters; ++i) {
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(job.stream()));
    job.comm().barrier();
    job.forward(sets[i % sets.size()]);
    const std::optional<PhaseTimes> t = layer.last_phase_times();
    if (!t) {
      supported = false;  // the same on every rank: it depends on the implementation only
      break;
    }
    phases[0].push_back(t->dispatch_ms);
    phases[1].push_back(t->experts_ms);
    phases[2].push_back(t->combine_ms);
  }
  layer.set_phase_timing(false);
  if (!supported) return;
  row.dispatch_ms = slowest_rank(job.comm(), phases[0]).median;
  row.experts_ms = slowest_rank(job.comm(), phases[1]).median;
  row.combine_ms = slowest_rank(job.comm(), phases[2]).median;
}

// A failed check before the timed calls (collective: every rank's verdict is the same): what each rank's
// y looked like against three more forwards of the same input set, whether those agree with each other,
// and whether the inputs on the device are still the host's (docs/performance.md#faults-seen-while-timing:
// a first forward that came out wrong while the later ones were right). On stderr, per rank.
void diagnose_failed_check(RankJob& job, const InputSet& in, const std::string& label) {
  const int T = in.num_tokens(), k = job.config().topk;
  const size_t H = static_cast<size_t>(job.config().hidden);
  cudaStream_t stream = job.stream();
  const auto output = [&] {
    std::vector<bf16> y(static_cast<size_t>(T) * H);
    if (!y.empty())
      EPFUSE_CUDA_CHECK(cudaMemcpyAsync(y.data(), job.output(), y.size() * sizeof(bf16), cudaMemcpyDeviceToHost, stream));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return y;
  };
  // Compared bitwise (NaN included), mapped by value.
  const auto bitwise_equal = [](const std::vector<bf16>& a, const std::vector<bf16>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
  };
  const auto values = [](const std::vector<bf16>& y) {
    std::vector<double> out(y.size());
    for (size_t i = 0; i < y.size(); ++i) out[i] = __bfloat162float(y[i]);
    return out;
  };
  const std::vector<bf16> failed = output();
  const TokenBatch b = in.batch();
  const HostTokens& host = in.host();
  const auto same = [&](const void* device, const void* expected, size_t bytes) {
    std::vector<unsigned char> got(bytes);
    if (bytes > 0) EPFUSE_CUDA_CHECK(cudaMemcpyAsync(got.data(), device, bytes, cudaMemcpyDeviceToHost, stream));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return std::memcmp(got.data(), expected, bytes) == 0 ? "yes" : "NO";
  };
  const char* x_same = b.x != nullptr ? same(b.x, host.x.data(), host.x.size() * sizeof(bf16)) : "(x_fp8)";
  const char* idx_same = same(b.topk_idx, host.topk_idx.data(), host.topk_idx.size() * sizeof(int32_t));
  const char* w_same = same(b.topk_weights, host.topk_weights.data(), host.topk_weights.size() * sizeof(float));
  std::vector<std::vector<bf16>> later;
  for (int i = 0; i < 3; ++i) {
    job.forward(in);
    job.layer().check_errors(stream);
    later.push_back(output());
  }
  const int rank = job.comm().rank();
  std::fprintf(stderr,
               "bench: %s, rank %d, diagnosis of the failed check: the device inputs are the host's (x %s, topk_idx "
               "%s, topk_weights %s); three more forwards: the 2nd and 3rd equal to the 1st bitwise: %s, %s\n",
               label.c_str(), rank, x_same, idx_same, w_same, bitwise_equal(later[1], later[0]) ? "yes" : "NO",
               bitwise_equal(later[2], later[0]) ? "yes" : "NO");
  // Per token, one character per 256 columns: the failed y against the first later forward.
  const std::vector<std::string> map = tools::block_error_map(values(later[0]), values(failed), H, 256);
  constexpr int kTokensShown = 16;
  for (int t = 0; t < std::min(T, kTokensShown); ++t) {
    std::string experts;
    for (int j = 0; j < k; ++j)
      experts.append(" ").append(std::to_string(host.topk_idx[static_cast<size_t>(t) * k + j]));
    std::fprintf(stderr, "bench: rank %d token %d %s (experts%s)\n", rank, t, map[static_cast<size_t>(t)].c_str(),
                 experts.c_str());
  }
  const auto wrong = std::count_if(map.begin(), map.end(), [](const std::string& m) {
    return m.find_first_not_of('.') != std::string::npos;
  });
  std::fprintf(stderr, "bench: rank %d: %lld of %d tokens differ from the later forward (per 256 columns: '.' same, "
               "'n' NaN, 'z' zero, '0'-'3' error >= 1, 0.1, 0.01, below)\n",
               rank, static_cast<long long>(wrong), T);
}

}  // namespace

void run_worker(const BenchOptions& o) {
  const BootstrapOptions boot = BootstrapOptions::from_env();
  const std::unique_ptr<Communicator> comm = Communicator::bootstrap(boot);
  const int world = comm->world_size(), rank = comm->rank();
  RecordSink sink(o.worker_dir, rank == 0);
  const tools::OwnedStream owned_stream(comm->device());
  const cudaStream_t stream = owned_stream.get();

  const int total = static_cast<int>(o.cases.size() * o.impls.size()) + 1;
  sink.progress(0, total, "ceilings");
  const Ceilings ceilings = o.ceilings ? *o.ceilings : measure_ceilings(*comm, stream);
  // --sustained: this rank's GPU energy counter, opened once for the run.
  std::unique_ptr<EnergyCounter> energy;
  if (o.sustained_ms > 0) {
    int device = 0;
    EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
    std::string why;
    energy = EnergyCounter::open(device, &why);
    if (!energy && rank == 0) std::fprintf(stderr, "bench: --sustained: no energy counter (%s)\n", why.c_str());
  }
  sink.write(ceilings_record(ceilings, o.ceilings ? "flags" : "measured"));

  int done = 1;
  for (const BenchCase& bc : o.cases) {
    const LayerConfig& cfg = bc.layer;
    if (const std::string problem = check_config(cfg, world); !problem.empty()) {
      for (const std::string& impl : o.impls) {
        BenchRow row = row_for_case(bc, impl, world, o.routing);
        row.note = one_line("invalid config on " + std::to_string(world) + " ranks: " + problem);
        sink.write(row_record(row));
        sink.progress(++done, total, case_label(bc));
      }
      continue;
    }
    // Input sets shared by the implementations: fresh tokens and routing per set.
    std::vector<InputSet> sets;
    for (int s = 0; s < o.sets; ++s)
      sets.emplace_back(cfg, world, rank, bc.tokens_per_rank, o.routing, tools::call_seed(o.seed, s), stream,
                        o.x_fp8 && cfg.weight_format == WeightFormat::kFp8Block128);
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));  // the jobs use their own streams
    const CaseLoad load = case_load(*comm, cfg, sets, ceilings);
    double gemm_alone_ms = kNaN, gemm_alone_grouped_ms = kNaN, gemm_alone_loop_ms = kNaN;
    std::string gemm_path;

    for (const std::string& impl_name : o.impls) {
      sink.progress(done, total, case_label(bc) + " " + impl_name);
      BenchRow row = row_for_case(bc, impl_name, world, o.routing);
      if (o.x_fp8 && cfg.weight_format == WeightFormat::kFp8Block128 && impl_name == "unfused") {
        row.note = "the unfused chain takes bf16 x only (--x-fp8)";
        sink.write(row_record(row));
        sink.progress(++done, total, case_label(bc));
        continue;
      }
      std::unique_ptr<RankJob> job;
      try {
        job = std::make_unique<RankJob>(*comm, cfg, *parse_impl(impl_name), o.seed);
      } catch (const Error& e) {
        // Every rank refuses the same way (the implementation or the shape), so all skip together.
        if (e.code() != ErrorCode::kUnsupported && e.code() != ErrorCode::kInvalidConfig) throw;
        row.note = one_line(e.what());
        sink.write(row_record(row));
        sink.progress(++done, total, case_label(bc));
        continue;
      }
      // Once per case, with the first layer's weights. bf16 only: this times the bf16 chain's cuBLAS GEMMs
      // (gemm_alone.h), not the FP8 chain's cuBLASLt ones, so an FP8 row leaves it empty.
      if (std::isnan(gemm_alone_ms) && cfg.weight_format == WeightFormat::kBf16) {
        const GemmAloneTimes t =
            time_expert_gemms(cfg, job->weights().view(), load.local_rows, o.warmup, o.iters, stream);
        gemm_alone_ms = slowest_rank(*comm, t.layer_ms()).median;
        gemm_alone_grouped_ms = slowest_rank(*comm, t.grouped_ms).median;
        gemm_alone_loop_ms = slowest_rank(*comm, t.loop_ms).median;
        gemm_path = unfused::to_string(t.layer_path);  // rank 0's: only rank 0 writes the record
      }
      const std::vector<int> rows = tools::sample_rows(bc.tokens_per_rank, o.verify_rows);
      const tools::Verdict verdict = job->verified_forward(sets[0], rows, o.tolerance, reference_threads());
      if (!verdict.passed) diagnose_failed_check(*job, sets[0], case_label(bc) + " " + impl_name);

      for (int i = 0; i < o.warmup; ++i) job->forward(sets[i % sets.size()]);
      const std::vector<double> ms = tools::time_iterations(
          job->stream(), o.iters, [&](int i) { job->forward(sets[i % sets.size()]); },
          [&](int) { start_together(*comm, job->stream()); });
      const Summary layer_ms = slowest_rank(*comm, ms);
      if (o.sustained_ms > 0) time_sustained(*comm, *job, sets, o.sustained_ms, layer_ms.median, energy.get(), row);
      time_phases(*job, sets, row);
      // A failure during the timed calls (recorded on the device, or output gone wrong) must not leave
      // a row of times: the layer's error record is thrown here, and the output is checked once more.
      job->layer().check_errors(job->stream());
      const tools::Verdict after = job->verified_forward(sets[0], rows, o.tolerance, reference_threads());

      row.iters = o.iters;
      row.sets = o.sets;
      row.median_ms = layer_ms.median;
      row.p10_ms = layer_ms.p10;
      row.p90_ms = layer_ms.p90;
      row.gemm_alone_ms = gemm_alone_ms;
      row.gemm_alone_grouped_ms = gemm_alone_grouped_ms;
      row.gemm_alone_loop_ms = gemm_alone_loop_ms;
      row.gemm_path = gemm_path;
      if (const std::optional<fused::GemmTileShape> tile = fused::last_launched_tile(job->layer()))
        row.tile = std::string(fused::fused_tile_name(*tile));
      row.verified = verdict.passed && after.passed ? "yes" : "no";
      // A failed check says which one and what y looked like (an output norm near 0: y written as zeros;
      // docs/performance.md#faults-seen-while-timing).
      if (!(verdict.passed && after.passed) && rank == 0)
        for (const auto& [when, v] : {std::pair{"before the timed calls", &verdict}, std::pair{"after them", &after}})
          std::fprintf(stderr,
                       "bench: %s %s, the check %s: %s, rel err %.3e, worst row %d of rank %d at %.3e, "
                       "%lld unwritten, output norm %.4e (rank 0's checked rows)\n",
                       case_label(bc).c_str(), impl_name.c_str(), when, v->passed ? "passed" : "failed", v->max_rel_err,
                       v->worst_row.row, v->worst_row.rank, v->worst_row.err, static_cast<long long>(v->total_unwritten),
                       v->output_norm);
      row.rel_err = std::max(verdict.max_rel_err, after.max_rel_err);
      row.unwritten = verdict.total_unwritten + after.total_unwritten;
      row.flops_per_gpu = load.flops_per_gpu;
      row.remote_bytes_per_gpu = load.remote_bytes_per_gpu;
      row.floor = load.floor;
      if (o.step_layers > 0 && impl_name == "fused") {
        job.reset();  // the step budgets the GPU's free memory for its weight sets
        sink.progress(done, total, case_label(bc) + " fused, " + std::to_string(o.step_layers) + "-layer step");
        run_decode_step(*comm, bc, o, reference_threads(), row);
      }
      sink.write(row_record(row));
      sink.progress(++done, total, case_label(bc));
    }
  }
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
}

}  // namespace epfuse::bench
