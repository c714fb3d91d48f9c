#include "bench/trace_export.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include <nlohmann/json.hpp>

namespace epfuse::bench {
namespace {

constexpr const char* kPhases[] = {"layout", "publish", "dispatch", "collect", "linear1", "linear2", "combine", "done"};
// Stamp indices (src/device/diagnostics/trace.cuh Stamp).
enum : int {
  kTaken = 0, kWeights, kInputs, kPosted, kLoaded, kMathStart, kFirstFull, kLoopEnd, kEnd, kEpiMath, kEpiStored,
  kLoopSynced, kEpiSwiglu, kPlanSeen, kRolesSplit
};
constexpr int kPreRecords = 8;  // trace.cuh: records of the tasks a CTA runs before it splits into roles
constexpr int kFields = 15;

std::string phase_name(int p) { return p >= 0 && p < 8 ? kPhases[p] : "phase " + std::to_string(p); }
bool gemm_phase(int p) { return p == 4 || p == 5; }

}  // namespace

std::vector<TraceRow> parse_trace_csv(const std::string& text) {
  std::vector<TraceRow> rows;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    std::vector<int64_t> v;
    std::istringstream fields(line);
    std::string f;
    while (std::getline(fields, f, ',')) {
      size_t used = 0;
      int64_t x = 0;
      try {
        x = std::stoll(f, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != f.size())
        throw std::runtime_error("trace line " + std::to_string(n) + ": '" + f + "' is not an integer");
      v.push_back(x);
    }
    if (v.size() != static_cast<size_t>(kFields + kTraceStamps))
      throw std::runtime_error("trace line " + std::to_string(n) + ": " + std::to_string(v.size()) + " fields, not " +
                               std::to_string(kFields + kTraceStamps));
    TraceRow r;
    int* ints[kFields] = {&r.rank, &r.hidden, &r.intermediate, &r.experts, &r.tokens, &r.mma, &r.launch,
                          &r.cta,  &r.smid, &r.record,       &r.phase,   &r.index,  &r.expert, &r.mblock, &r.nblock};
    for (int i = 0; i < kFields; ++i) *ints[i] = static_cast<int>(v[static_cast<size_t>(i)]);
    for (int s = 0; s < kTraceStamps; ++s) r.t[s] = v[static_cast<size_t>(kFields + s)];
    rows.push_back(r);
  }
  return rows;
}

std::string chrome_trace_json(const std::vector<TraceRow>& rows) {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const TraceRow& r : rows)
    for (int64_t t : r.t)
      if (t >= 0) t0 = std::min(t0, t);
  const auto us = [&](int64_t t) { return static_cast<double>(t - t0) / 1000.0; };
  nlohmann::json events = nlohmann::json::array();
  std::map<int, std::map<int, std::string>> threads;  // rank -> tid -> name
  const auto add = [&](const std::string& name, const TraceRow& r, int tid, int64_t a, int64_t b, nlohmann::json args) {
    if (a < 0 || b < 0 || b < a) return;
    events.push_back({{"name", name}, {"ph", "X"}, {"pid", r.rank}, {"tid", tid}, {"ts", us(a)}, {"dur", us(b) - us(a)},
                      {"args", std::move(args)}});
  };
  for (const TraceRow& r : rows) {
    const int base = 3 * r.cta;
    nlohmann::json args = {{"launch", r.launch}, {"cta", r.cta}, {"sm", r.smid}, {"tokens", r.tokens}};
    if (r.kernel_span()) {
      threads[r.rank][base] = "CTA " + std::to_string(r.cta);
      add("kernel (launch " + std::to_string(r.launch) + ")", r, base, r.t[kTaken], r.t[kEnd], args);
      continue;
    }
    args["index"] = r.index;
    if (gemm_phase(r.phase)) args.update({{"expert", r.expert}, {"mblock", r.mblock}, {"nblock", r.nblock}});
    const std::string name = phase_name(r.phase);
    if (r.record < kPreRecords) {  // a task every thread of the CTA runs
      threads[r.rank][base] = "CTA " + std::to_string(r.cta);
      add(name, r, base, r.t[kMathStart], r.t[kEnd], args);
      add(r.phase == 3 ? "wait: every rank's counts" : "wait: layout done", r, base, r.t[kMathStart], r.t[kInputs], {});
      add("rows written", r, base, r.t[kInputs], r.t[kEpiStored], {});
      continue;
    }
    if (r.t[kRolesSplit] >= 0) {  // a CTA's first role task: from the plan to its roles, on the CTA's thread
      threads[r.rank][base] = "CTA " + std::to_string(r.cta);
      add("plan: copy, decode, split", r, base, r.t[kPlanSeen] >= 0 ? r.t[kPlanSeen] : r.t[kRolesSplit], r.t[kRolesSplit], {});
    }
    if (r.t[kTaken] >= 0) {  // the producer warpgroup's part
      threads[r.rank][base + 1] = "CTA " + std::to_string(r.cta) + " producer";
      add(name, r, base + 1, r.t[kTaken], r.t[kLoaded] >= 0 ? r.t[kLoaded] : r.t[kPosted], args);
      add("free slot, first weights", r, base + 1, r.t[kTaken], r.t[kWeights], {});
      add("wait: inputs", r, base + 1, r.t[kWeights], r.t[kInputs], {});
      add("row table, post", r, base + 1, r.t[kInputs], r.t[kPosted], {});
      add("loads", r, base + 1, r.t[kPosted], r.t[kLoaded], {});
    }
    threads[r.rank][base + 2] = "CTA " + std::to_string(r.cta) + " math";
    add(name, r, base + 2, r.t[kMathStart], r.t[kEnd], args);
    add("wait: first stage", r, base + 2, r.t[kMathStart], r.t[kFirstFull], {});
    add("k-loop", r, base + 2, r.t[kFirstFull], r.t[kLoopEnd], {});
    add("epilogue", r, base + 2, r.t[kLoopEnd], r.t[kEnd], {});
  }
  // The launches of each rank on one more thread, with the gaps between them.
  std::map<std::pair<int, int>, std::pair<int64_t, int64_t>> spans;  // (rank, launch) -> first start, last end
  for (const TraceRow& r : rows) {
    if (!r.kernel_span() || r.t[kTaken] < 0 || r.t[kEnd] < 0) continue;
    auto [it, fresh] = spans.try_emplace({r.rank, r.launch}, r.t[kTaken], r.t[kEnd]);
    if (!fresh) it->second = {std::min(it->second.first, r.t[kTaken]), std::max(it->second.second, r.t[kEnd])};
  }
  constexpr int kLaunchTid = -1;
  int64_t prev_end = -1;
  int prev_rank = -1;
  for (const auto& [key, span] : spans) {
    TraceRow r;
    r.rank = key.first;
    threads[r.rank][kLaunchTid] = "launches";
    if (key.first == prev_rank && prev_end >= 0) add("between launches", r, kLaunchTid, prev_end, span.first, {});
    add("launch " + std::to_string(key.second), r, kLaunchTid, span.first, span.second, {{"launch", key.second}});
    prev_rank = key.first;
    prev_end = span.second;
  }
  for (const auto& [rank, tids] : threads) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", rank}, {"args", {{"name", "rank " + std::to_string(rank)}}}});
    for (const auto& [tid, name] : tids) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", rank}, {"tid", tid}, {"args", {{"name", name}}}});
      events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", rank}, {"tid", tid}, {"args", {{"sort_index", tid}}}});
    }
  }
  return nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ns"}}.dump();
}

std::vector<LaunchSummary> summarise_launches(const std::vector<TraceRow>& rows) {
  struct Acc {
    int64_t start = std::numeric_limits<int64_t>::max(), end = -1;
    int ctas = 0;
    std::map<int, std::tuple<int, int64_t, int64_t>> phases;  // phase -> tasks, first start, last end
  };
  std::map<std::pair<int, int>, Acc> acc;
  for (const TraceRow& r : rows) {
    Acc& a = acc[{r.rank, r.launch}];
    if (r.kernel_span()) {
      if (r.t[kTaken] >= 0) a.start = std::min(a.start, r.t[kTaken]);
      a.end = std::max(a.end, r.t[kEnd]);
      ++a.ctas;
      continue;
    }
    const int64_t s = r.t[kMathStart] >= 0 ? r.t[kMathStart] : r.t[kTaken];
    auto [it, fresh] = a.phases.try_emplace(r.phase, 0, std::numeric_limits<int64_t>::max(), -1);
    auto& [n, first, last] = it->second;
    ++n;
    if (s >= 0) first = std::min(first, s);
    last = std::max(last, r.t[kEnd]);
  }
  std::vector<LaunchSummary> out;
  int64_t prev_end = -1;
  int prev_rank = -1;
  for (const auto& [key, a] : acc) {
    LaunchSummary s;
    s.rank = key.first;
    s.launch = key.second;
    s.ctas = a.ctas;
    const int64_t start = a.start != std::numeric_limits<int64_t>::max() ? a.start : 0;
    s.span_us = a.end >= start ? static_cast<double>(a.end - start) / 1000.0 : 0.0;
    if (key.first == prev_rank && prev_end >= 0) s.gap_before_us = static_cast<double>(start - prev_end) / 1000.0;
    for (const auto& [p, v] : a.phases) {
      const auto& [n, first, last] = v;
      if (p == 7) continue;  // the kDone records: a CTA's end, already its span's
      s.phases.push_back({p, n, first >= 0 && first != std::numeric_limits<int64_t>::max()
                                    ? static_cast<double>(first - start) / 1000.0 : -1.0,
                          last >= 0 ? static_cast<double>(last - start) / 1000.0 : -1.0});
    }
    prev_rank = key.first;
    prev_end = a.end;
    out.push_back(std::move(s));
  }
  return out;
}

std::string format_launch_summaries(const std::vector<LaunchSummary>& summaries) {
  std::string out;
  char line[256];
  for (const LaunchSummary& s : summaries) {
    std::snprintf(line, sizeof line, "rank %d launch %d: %d CTAs, kernel %.1f us", s.rank, s.launch, s.ctas, s.span_us);
    out += line;
    if (s.gap_before_us >= 0) {
      std::snprintf(line, sizeof line, ", %.1f us after the previous launch ended", s.gap_before_us);
      out += line;
    }
    out += "\n";
    for (const LaunchSummary::Phase& p : s.phases) {
      std::snprintf(line, sizeof line, "  %-8s %4d tasks  first start %7.1f us  last end %7.1f us\n",
                    phase_name(p.phase).c_str(), p.tasks, p.first_start_us, p.last_end_us);
      if (p.last_end_us < 0) std::snprintf(line, sizeof line, "  %-8s %4d tasks  first start %7.1f us  not ended\n",
                                           phase_name(p.phase).c_str(), p.tasks, p.first_start_us);
      out += line;
    }
  }
  return out;
}

}  // namespace epfuse::bench
