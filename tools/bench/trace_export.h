// The fused kernel's timeline as a trace a person can open: the rows a -DEPFUSE_TRACE=ON build appends
// to EPFUSE_TRACE_FILE (src/fused/fused_kernel.cu LaunchTrace: one row per task record and one per CTA's
// kernel span, %globaltimer nanoseconds) turned into Chrome trace-event JSON, which Perfetto's UI
// (ui.perfetto.dev) and chrome://tracing open. Pure host code, CPU-tested.
//
// One process per rank, one thread per CTA role: "CTA c" (the kernel span and the tasks every thread
// runs before the GEMM phase), "CTA c producer" and "CTA c math" (a warp-specialised CTA's roles). Each
// task is a complete event named by its phase, with its steps as nested events (waiting for inputs, the
// k-loop, the epilogue, ...), and the gap between one launch's last CTA and the next launch's first.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace epfuse::bench {

// The stamps of a record, in the CSV's order (src/device/diagnostics/trace.cuh Stamp).
inline constexpr int kTraceStamps = 15;

struct TraceRow {
  int rank = 0, hidden = 0, intermediate = 0, experts = 0, tokens = 0, mma = 0, launch = 0;
  int cta = 0, smid = 0, record = 0, phase = 0, index = 0, expert = 0, mblock = 0, nblock = 0;
  int64_t t[kTraceStamps] = {};  // ns, -1 = not stamped
  bool kernel_span() const { return record < 0; }  // t[0] = the CTA's start, t[8] = its end
};

// Parses the CSV (one row per line, 15 integer fields then kTraceStamps stamps). Throws
// std::runtime_error naming the line for a malformed row.
std::vector<TraceRow> parse_trace_csv(const std::string& text);

// The Chrome trace-event JSON of the rows: times in microseconds from the earliest stamp of all rows.
std::string chrome_trace_json(const std::vector<TraceRow>& rows);

// Per rank and launch: the kernel's span (first CTA start to last CTA end), the gap after the previous
// launch's end, and each phase's first start and last end, us from the launch's first CTA start.
struct LaunchSummary {
  int rank = 0, launch = 0, ctas = 0;
  double span_us = 0, gap_before_us = -1;  // -1: the first launch recorded
  struct Phase {
    int phase = 0, tasks = 0;
    double first_start_us = 0, last_end_us = 0;
  };
  std::vector<Phase> phases;
};
std::vector<LaunchSummary> summarise_launches(const std::vector<TraceRow>& rows);
std::string format_launch_summaries(const std::vector<LaunchSummary>& s);

}  // namespace epfuse::bench
