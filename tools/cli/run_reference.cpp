// `epfuse run` without a GPU (or with --impl reference): the float64 CPU reference on every
// simulated rank's tokens, with the same seeds a GPU run would use.
#include <chrono>
#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "cli/run.h"
#include "cli/run_report.h"
#include "common/output.h"
#include "epfuse/reference.h"

namespace epfuse::tools {

int run_reference(const RunPlan& plan, const std::string& command) {
  RunResult result;
  result.device = "cpu";
  result.ranks.resize(static_cast<size_t>(plan.ranks));
  result.first_call_tokens = plan.token_counts(0);
  GeneratedExperts experts(plan.cfg, plan.seed);
  std::vector<double> sum_sq(result.ranks.size(), 0.0);

  // One bar over every (call, rank) reference, each weighted equally.
  constexpr int64_t kUnits = 1000;
  Progress progress("reference", int64_t{plan.iters} * plan.ranks * kUnits);
  for (int call = 0; call < plan.iters; ++call) {
    std::vector<int> counts = plan.token_counts(call);
    for (int r = 0; r < plan.ranks; ++r) {
      RankStats& s = result.ranks[static_cast<size_t>(r)];
      HostTokens tokens =
          make_tokens(plan.cfg, plan.ranks, r, counts[static_cast<size_t>(r)], plan.routing, plan.input_seed(call));
      count_slots(tokens, s);
      const int64_t base = (int64_t{call} * plan.ranks + r) * kUnits;
      auto start = std::chrono::steady_clock::now();
      std::vector<double> y = reference_forward(plan.cfg, tokens, experts, {}, 0, [&](int64_t done, int64_t total) {
        progress.update(base + (total > 0 ? done * kUnits / total : kUnits));
      });
      s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      for (double v : y) sum_sq[static_cast<size_t>(r)] += v * v;
      progress.update(base + kUnits);
    }
    ++result.calls;
  }
  progress.finish();
  for (size_t r = 0; r < result.ranks.size(); ++r) result.ranks[r].output_norm = std::sqrt(sum_sq[r]);

  std::fputs(summary(plan, result, /*reference_only=*/true).c_str(), stdout);
  std::fflush(stdout);
  if (!plan.json.empty()) write_file(plan.json, result_json(plan, result, command));
  return 0;
}

}  // namespace epfuse::tools
