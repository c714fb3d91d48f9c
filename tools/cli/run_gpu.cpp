// One rank of `epfuse run` on a GPU: bootstrap from the environment, build the job, run the calls
// (verifying the scheduled ones), gather every rank's statistics and report on rank 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/run.h"
#include "cli/run_report.h"
#include "comm/comm_backend.h"
#include "common/check.h"
#include "common/job.h"
#include "common/output.h"
#include "epfuse/workspace.h"

namespace epfuse::tools {
namespace {

// Each rank checks its rows on its share of the host's cores.
int reference_threads(int world_size) {
  int local = world_size;
  if (const char* s = std::getenv("LOCAL_WORLD_SIZE")) local = std::max(1, std::atoi(s));
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, cores / local);
}

struct Outcome {
  RankStats stats;
  int calls = 0;
  int calls_verified = 0;
  double max_rel_err = 0.0;   // agreed by all ranks
  WorstRow worst_row;         // agreed by all ranks
  int64_t unwritten = 0;      // agreed by all ranks
  std::optional<int> failed_call;
  std::vector<double> call_ms;  // this rank's forward time per call (cudaEvents)
};

// Device memory in use on this rank's GPU (every process's, every rank's in the one-GPU mode). The
// stream-ordered pool keeps freed blocks until a synchronisation: trim it first, so that what it
// happens to hold at the moment does not read as memory the calls took.
int64_t device_bytes_used() {
  int device = 0;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  cudaMemPool_t pool = nullptr;
  EPFUSE_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool, device));
  EPFUSE_CUDA_CHECK(cudaMemPoolTrimTo(pool, 0));
  size_t free = 0, total = 0;
  EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return static_cast<int64_t>(total - free);
}

// Adds a verified call's verdict to `o`; false when it failed (the verdict is all-reduced, so every
// rank stops at the same call).
bool add_verified(Outcome& o, const Verdict& v, int call) {
  o.stats.seconds += v.forward_ms * 1e-3;
  o.call_ms.push_back(v.forward_ms);
  o.stats.rows_checked += v.rows_checked;
  o.stats.unwritten += v.unwritten;
  o.stats.rel_err = std::max(o.stats.rel_err, std::isnan(v.rel_err) ? INFINITY : v.rel_err);
  o.stats.output_norm = std::hypot(o.stats.output_norm, v.output_norm);
  o.max_rel_err = std::max(o.max_rel_err, v.max_rel_err);
  o.worst_row = worse(o.worst_row, v.worst_row);
  o.unwritten += v.total_unwritten;
  ++o.calls_verified;
  ++o.calls;
  if (!v.passed) o.failed_call = call;
  return v.passed;
}

// An unverified call: its forward time, then its device errors.
void add_timed(Outcome& o, double ms, MoeLayer& layer, cudaStream_t stream) {
  o.stats.seconds += ms * 1e-3;
  o.call_ms.push_back(ms);
  layer.check_errors(stream);
  ++o.calls;
}

Outcome run_calls(const RunPlan& plan, RankJob& job, int rank) {
  Outcome o;
  const int threads = reference_threads(plan.ranks);
  std::optional<Progress> progress;
  if (rank == 0 && plan.iters > 1) progress.emplace("calls", plan.iters);
  std::unique_ptr<InputSet> inputs;  // without --vary every call repeats call 0's inputs
  for (int call = 0; call < plan.iters; ++call) {
    const bool fresh = !inputs || plan.vary;
    if (fresh) {
      int tokens = plan.token_counts(call)[static_cast<size_t>(rank)];
      inputs.reset();  // free the previous set first
      inputs = std::make_unique<InputSet>(job.make_inputs(tokens, plan.routing, plan.input_seed(call), plan.x_fp8));
    }
    count_slots(inputs->host(), o.stats);
    if (fresh) {
      // Time the layer, not the harness: each rank makes its inputs at its own pace (host generation,
      // upload), and a forward timed from its own start would absorb the wait for the slowest peer's.
      // The uploads finish and every rank arrives here before any timed region starts.
      EPFUSE_CUDA_CHECK(cudaStreamSynchronize(job.stream()));
      job.comm().barrier();
    }
    if (plan.verifies_call(call)) {
      std::vector<int> rows = sample_rows(inputs->num_tokens(), plan.verify_rows);
      if (!add_verified(o, job.verified_forward(*inputs, rows, plan.tolerance, threads), call)) break;
    } else {
      add_timed(o, time_iterations(job.stream(), 1, [&](int) { job.forward(*inputs); })[0], job.layer(), job.stream());
    }
    if (progress) progress->update(call + 1);
  }
  if (progress) progress->finish();
  inputs.reset();  // the end's memory reading counts the layer, not the last call's inputs
  return o;
}

// --graph: the first forward captured once, then every iteration a replay after fresh inputs (seeded from
// (seed, iteration), the first forward's token counts) were copied into the captured buffers; y is poisoned before
// each checked replay, so a replay that left rows unwritten (or the previous replay's) fails.
Outcome run_graph_calls(const RunPlan& plan, RankJob& job, int rank) {
  Outcome o;
  const int threads = reference_threads(plan.ranks);
  const int tokens = plan.token_counts(0)[static_cast<size_t>(rank)];
  InputSet captured = job.make_inputs(tokens, plan.routing, call_seed(plan.seed, 0), plan.x_fp8);
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(job.stream()));
  // The first forward on the captured buffers into the job's output.
  CapturedGraph graph(job.stream(), [&] { job.layer().forward(captured.batch(), job.output(), job.stream()); });
  std::optional<Progress> progress;
  if (rank == 0 && plan.iters > 1) progress.emplace("replays", plan.iters);
  for (int call = 0; call < plan.iters; ++call) {
    if (call > 0) {
      const InputSet fresh = job.make_inputs(tokens, plan.routing, call_seed(plan.seed, call), plan.x_fp8);
      captured.overwrite_with(fresh, job.stream());
      EPFUSE_CUDA_CHECK(cudaStreamSynchronize(job.stream()));
    }
    // As in run_calls (the layer's time, not the harness's); in the one-GPU mode also every rank past
    // its device-synchronising calls (instantiation, allocations) before any replays (LoopbackWorld).
    job.comm().barrier();
    count_slots(captured.host(), o.stats);
    if (plan.verifies_call(call)) {
      std::vector<int> rows = sample_rows(tokens, plan.verify_rows);
      if (!add_verified(o, job.verified_launch(captured, rows, plan.tolerance, threads, [&] { graph.launch(); }), call))
        break;
    } else {
      add_timed(o, time_iterations(job.stream(), 1, [&](int) { graph.launch(); })[0], job.layer(), job.stream());
    }
    if (progress) progress->update(call + 1);
  }
  if (progress) progress->finish();
  return o;
}

// --cycles: plan.cycles times a workspace and RunPlan::kCycleLayers layers on it (weights seeded
// seed, seed + 1, ...: a layer that ran another's weights would fail its check) created, one forward
// of each (layer l of cycle c on call c * kCycleLayers + l's inputs), checked on the scheduled cycles,
// and destroyed. Device memory is read after the first cycle (which also loads the kernels' modules
// and the libraries' lazy state) and after the last: `result` gets both.
Outcome run_cycles(const RunPlan& plan, Communicator& comm, RunResult& result) {
  Outcome o;
  const int rank = comm.rank();
  const int threads = reference_threads(plan.ranks);
  const OwnedStream stream(comm.device());
  std::vector<std::unique_ptr<RankWeights>> weights;
  for (int l = 0; l < RunPlan::kCycleLayers; ++l)
    weights.push_back(std::make_unique<RankWeights>(plan.cfg, comm.world_size(), rank, plan.seed + l, stream.get()));
  DeviceArray<bf16> y(static_cast<size_t>(std::max(plan.cfg.max_tokens_per_rank, 1)) * plan.cfg.hidden);
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.get()));  // the layers read the weights at creation
  std::optional<Progress> progress;
  if (rank == 0 && plan.cycles > 1) progress.emplace("cycles", plan.cycles);
  for (int cycle = 0; cycle < plan.cycles && !o.failed_call; ++cycle) {
    // Declared outside the try: on an error the world is aborted first, then they go (locally).
    std::unique_ptr<Workspace> ws;
    std::vector<std::unique_ptr<MoeLayer>> layers;  // after ws: destroyed before it
    try {
      ws = Workspace::create(comm, plan.cfg);
      for (int l = 0; l < RunPlan::kCycleLayers; ++l)
        layers.push_back(MoeLayer::create(plan.cfg, *ws, weights[static_cast<size_t>(l)]->view()));
      if (cycle == 0) result.memory = ws->memory();
      for (int l = 0; l < RunPlan::kCycleLayers && !o.failed_call; ++l) {
        const int call = cycle * RunPlan::kCycleLayers + l;
        const InputSet in(plan.cfg, comm.world_size(), rank, plan.token_counts(call)[static_cast<size_t>(rank)],
                          plan.routing, plan.input_seed(call), stream.get(), plan.x_fp8);
        count_slots(in.host(), o.stats);
        // As in run_calls: uploads done and every rank here before the forward (the one-GPU mode's rule
        // on device-synchronising calls, LoopbackWorld, included).
        EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
        comm.barrier();
        MoeLayer& layer = *layers[static_cast<size_t>(l)];
        const auto forward = [&] { layer.forward(in.batch(), y.get(), stream.get()); };
        if (plan.verifies_cycle(cycle)) {
          const std::vector<int> rows = sample_rows(in.num_tokens(), plan.verify_rows);
          add_verified(o,
                       verify_forward(comm, layer, plan.cfg, plan.seed + l, y.get(), y.bytes(), stream.get(), in, rows,
                                      plan.tolerance, threads, forward),
                       call);
        } else {
          add_timed(o, time_iterations(stream.get(), 1, [&](int) { forward(); })[0], layer, stream.get());
        }
      }
      layers.clear();  // collective, like their creation
      ws.reset();
    } catch (const std::exception& e) {
      comm.abort(e.what());
      throw;
    }
    if (cycle == 0 || cycle == plan.cycles - 1) {
      comm.barrier();  // every rank's frees done
      (cycle == 0 ? result.device_used_start : result.device_used_end) = device_bytes_used();
    }
    if (progress) progress->update(cycle + 1);
  }
  if (progress) progress->finish();
  if (result.device_used_end < 0) result.device_used_end = result.device_used_start;  // stopped early
  return o;
}

// Everything one rank does on its communicator: the job, the calls, every rank's statistics, and on
// rank 0 the report. Returns the rank's exit code; throws on errors.
int run_on(const RunPlan& plan, Communicator& comm, const std::string& command) {
  RunResult result;
  std::optional<int> failed_call;
  // Any error gives up on the world first (Communicator::abort), while the job still exists: then
  // destroying it (the layer's collective windows) is local and cannot wait for a peer that failed or
  // died.
  std::unique_ptr<RankJob> job;
  bool memory_grew = false;
  try {
    Outcome o;
    if (plan.cycles > 0) {
      o = run_cycles(plan, comm, result);
      // Every rank's own GPU (in the one-GPU mode the same one), so that every rank gives the same verdict.
      memory_grew = comm.all_reduce_max(static_cast<double>(result.device_used_end - result.device_used_start)) >
                    static_cast<double>(RunPlan::kCycleMemoryGrowthBytes);
      result.memory_flat = !memory_grew;
    } else {
      job = std::make_unique<RankJob>(comm, plan.cfg, *plan.impl, plan.seed);
      result.memory = job->layer().memory();
      // Device memory in use before the first call and after the last (every rank's allocations done:
      // the barriers), to show that calls do not accumulate any.
      comm.barrier();
      result.device_used_start = device_bytes_used();
      o = plan.graph ? run_graph_calls(plan, *job, comm.rank()) : run_calls(plan, *job, comm.rank());
      comm.barrier();
      result.device_used_end = device_bytes_used();
    }
    result.call_times = call_time_stats(o.call_ms);
    std::vector<double> all = comm.all_gather(o.stats.pack());
    for (int r = 0; r < comm.world_size(); ++r)
      result.ranks.push_back(RankStats::unpack(all.data() + r * RankStats::kFields));
    result.calls = o.calls;
    result.calls_verified = o.calls_verified;
    result.max_rel_err = o.max_rel_err;
    result.worst_row = o.worst_row;
    result.unwritten = o.unwritten;
    result.verified = !o.failed_call;
    failed_call = o.failed_call;
    cudaDeviceProp prop{};
    EPFUSE_CUDA_CHECK(cudaGetDeviceProperties(&prop, comm.device()));
    result.device = prop.name;
    EPFUSE_CUDA_CHECK(cudaGetDeviceCount(&result.gpus));
  } catch (const std::exception& e) {
    comm.abort(e.what());
    throw;  // the job goes after the abort
  }
  // The job (layer, buffers) goes before the report; in the one-GPU mode its cudaFree calls wait for
  // every rank's kernels, which are all done: each rank's last forward was checked above.
  job.reset();
  result.first_call_tokens = plan.token_counts(0);
  if (comm.rank() != 0) return failed_call || memory_grew ? 1 : 0;
  std::fputs(summary(plan, result, /*reference_only=*/false).c_str(), stdout);
  std::fflush(stdout);
  if (!plan.json.empty()) write_file(plan.json, result_json(plan, result, command));
  if (failed_call)
    return fail("verification failed at call " + std::to_string(*failed_call) + ": max rel err " +
                format_sci(result.max_rel_err) + " (tolerance " + format_sci(plan.tolerance) + "), " +
                std::to_string(result.unwritten) + " unwritten elements");
  if (memory_grew)
    return fail(fmt::format("device memory grew by {:.1f} MiB over {} create/destroy cycles (bound {:.1f} MiB on every "
                            "rank's GPU)",
                            (result.device_used_end - result.device_used_start) / 1048576.0, plan.cycles,
                            RunPlan::kCycleMemoryGrowthBytes / 1048576.0));
  return 0;
}

}  // namespace

int run_rank(const RunPlan& plan, const BootstrapOptions& boot, const std::string& command) {
  // Multicast is never used by epfuse; keep NCCL from setting it up either.
  ::setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);
  std::unique_ptr<Communicator> comm = Communicator::bootstrap(boot);
  try {
    return run_on(plan, *comm, command);
  } catch (const std::exception& e) {
    // Peers may be blocked in a collective this rank will never join. run_on aborted the communicator
    // (its job was destroyed locally); report and leave now, the launcher stops the rest.
    // The library's errors name their rank already: say it once.
    const std::string who = ::epfuse::detail::rank_prefix(comm->rank());
    const std::string what = e.what();
    fmt::print(stderr, "epfuse: {}{}\n", what.starts_with(who) ? "" : who, what);
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(1);
  }
}

int run_one_gpu(const RunPlan& plan, const std::string& command) {
  LoopbackWorld world(plan.ranks, /*device=*/0);
  std::vector<int> codes(static_cast<size_t>(plan.ranks), 1);
  const std::vector<std::string> errors =
      world.run([&](Communicator& comm) { codes[static_cast<size_t>(comm.rank())] = run_on(plan, comm, command); });
  // A failed rank aborts the world, so the others' errors name it: print them all, in rank order.
  bool failed = false;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (errors[r].empty()) {
      failed = failed || codes[r] != 0;
      continue;
    }
    fail(errors[r]);
    failed = true;
  }
  if (!failed) return 0;
  return fail("run failed on " + std::to_string(plan.ranks) + " ranks in one-GPU mode (see the rank errors above)");
}

}  // namespace epfuse::tools
