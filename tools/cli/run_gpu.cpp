// One rank of `epfuse run` on a GPU: bootstrap from the environment, build the job, run the calls
// (verifying the scheduled ones), gather every rank's statistics and report on rank 0.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/run.h"
#include "cli/run_report.h"
#include "common/check.h"
#include "common/job.h"
#include "common/output.h"

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
      Verdict v = job.verified_forward(*inputs, rows, plan.tolerance, threads);
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
      // The verdict is all-reduced, so every rank stops at the same call.
      if (!v.passed) {
        o.failed_call = call;
        break;
      }
    } else {
      const double ms = time_iterations(job.stream(), 1, [&](int) { job.forward(*inputs); })[0];
      o.stats.seconds += ms * 1e-3;
      o.call_ms.push_back(ms);
      job.layer().check_errors(job.stream());
      ++o.calls;
    }
    if (progress) progress->update(call + 1);
  }
  if (progress) progress->finish();
  inputs.reset();  // the end's memory reading counts the layer, not the last call's inputs
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
  try {
    job = std::make_unique<RankJob>(comm, plan.cfg, *plan.impl, plan.seed);
    result.memory = job->layer().memory();
    // Device memory in use before the first call and after the last (every rank's allocations done:
    // the barriers), to show that calls do not accumulate any.
    comm.barrier();
    result.device_used_start = device_bytes_used();
    Outcome o = run_calls(plan, *job, comm.rank());
    comm.barrier();
    result.device_used_end = device_bytes_used();
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
  if (comm.rank() != 0) return failed_call ? 1 : 0;
  std::fputs(summary(plan, result, /*reference_only=*/false).c_str(), stdout);
  std::fflush(stdout);
  if (!plan.json.empty()) write_file(plan.json, result_json(plan, result, command));
  if (failed_call)
    return fail("verification failed at call " + std::to_string(*failed_call) + ": max rel err " +
                format_sci(result.max_rel_err) + " (tolerance " + format_sci(plan.tolerance) + "), " +
                std::to_string(result.unwritten) + " unwritten elements");
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
    fmt::print(stderr, "epfuse: rank {}: {}\n", comm->rank(), e.what());
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
