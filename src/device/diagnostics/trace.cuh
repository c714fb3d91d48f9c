// A diagnostic timeline of the fused kernel, compiled in only with -DEPFUSE_TRACE=ON (CMake option; a
// separate build: the stamps change register allocation, so its times are not the release kernel's).
// Per CTA, one record per task: %globaltimer stamps at each step of a task's way through the CTA
// (Stamp), written by the leaders of the roles, and the CTA's own span (its first and last instruction).
// kLaunches consecutive launches are recorded side by side (slot = the call's epoch % kLaunches), so
// the gaps between back-to-back launches show too. The host copies the records out and writes them as
// CSV (fused_kernel.cu LaunchTrace), which `epfuse bench --trace` turns into Chrome trace-event JSON
// (tools/bench/trace_export.h) and scripts/trace_report.py summarises. One process per GPU: the records
// are per process. Without EPFUSE_TRACE every call below is an empty inline function.
#pragma once
#include <cstdint>

#include "device/ptx/signals.cuh"

namespace epfuse::device::trace {

// The steps of a task (columns of the CSV, in this order).
enum Stamp : int {
  kTaken = 0,   // the CTA (producer) has the task id
  kWeights,     // producer: the queue slot is free and the tile's first weights are issued
  kInputs,      // producer: the tile's inputs are there (dispatch rows / the expert's Linear1 tiles);
                //   dispatch, publish: the layout is done; collect: every rank's counts are in
  kPosted,      // producer: posted to the math warps; layout: the slots drawn in shared memory; collect:
                //   the senders' status checked and the counts in shared memory; dispatch (decode kernels,
                //   FP8, own rows first): this rank's own rows written, before the layout wait
  kLoaded,      // producer: every operand load of the tile issued; layout: the ticket bases drawn;
                //   collect: the experts' m-blocks planned; dispatch: the rows of the pass after the
                //   layout wait written, before the entries
  kMathStart,   // math: took the posted task (pre-role tasks: start)
  kFirstFull,   // math: the first stage of the k-loop is there; combine (a decode task, several warps a
                //   token): its tokens' tiles are all in
  kLoopEnd,     // math: the k-loop is done; layout: the bases added to the slots; collect: the prefixes,
                //   the schedule and the targets built; combine (decode task): the tokens reduced into y
  kEnd,         // the task is done (epilogue, signals)
  kEpiMath,     // math: Linear1's h values (and FP8 codes) are in registers; collect: the prefixes scanned
  kEpiStored,   // math: the epilogue's stores are issued (before the release / signals); dispatch:
                //   every row and entry of the task is written (before the arrival adds); publish: the
                //   counts, status and layer stored (before the flags); collect: the plan copied out
  kLoopSynced,  // math: both math warpgroups are past the k-loop (the group barrier after it)
  kEpiSwiglu,   // math: Linear1's SwiGLU values are in registers (FP8: before their quantisation);
                //   collect: the GEMM schedule built
  kPlanSeen,    // a CTA's first role task: its scheduler saw this call's plan published (the flag)
  kRolesSplit,  // a CTA's first role task: the plan copied and the task decoded, the CTA splitting into roles
  kStamps
};

inline constexpr int kMaxCtas = 264;
inline constexpr int kPreRecords = 8;  // tasks a CTA runs before it splits into roles
inline constexpr int kMaxRecords = 128;  // a CTA runs ~70 tasks at mixtral T = 4096
inline constexpr int kLaunches = 4;      // consecutive launches recorded

struct Record {
  uint64_t t[kStamps];
  int32_t phase, index, expert, mblock, nblock, smid;
};
// A CTA's span in one launch: its first instruction (after the prologue's shared-memory set-up) and its
// last (the CTA's last role done).
struct Span {
  uint64_t start, end;
  int32_t smid, pad;
};

#ifdef EPFUSE_TRACE
inline constexpr bool kOn = true;
__device__ Record g_records[kLaunches][kMaxCtas][kMaxRecords];
__device__ Span g_spans[kLaunches][kMaxCtas];

// This launch's slot (begin_launch), read by every stamp.
__device__ __forceinline__ int& current_slot() {
  __shared__ int slot;
  return slot;
}

// The record of the task the stamping thread's group runs: thread 0's before the roles, the math
// leader's after (read by the stamps inside the tasks).
__device__ __forceinline__ int& current_record() {
  __shared__ int r;
  return r;
}

__device__ __forceinline__ uint32_t smid() {
  uint32_t v;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
  return v;
}

// Step s of a record at time t (a time taken earlier: now()).
__device__ __forceinline__ void stamp_at(int record, Stamp s, uint64_t t) {
  if (blockIdx.x < kMaxCtas && record >= 0 && record < kMaxRecords) g_records[current_slot()][blockIdx.x][record].t[s] = t;
}
__device__ __forceinline__ void stamp(int record, Stamp s) { stamp_at(record, s, globaltimer_ns()); }
__device__ __forceinline__ uint64_t now() { return globaltimer_ns(); }

// The whole CTA, at its start: this launch's slot (from the call's epoch) and the span's start.
__device__ __forceinline__ void begin_launch(uint32_t epoch) {
  if (threadIdx.x == 0) {
    current_slot() = static_cast<int>(epoch % kLaunches);
    if (blockIdx.x < kMaxCtas) {
      Span& sp = g_spans[epoch % kLaunches][blockIdx.x];
      sp.start = globaltimer_ns();
      sp.smid = static_cast<int32_t>(smid());
    }
  }
  __syncthreads();
}
// The CTA's last thread to finish (one thread): the span's end.
__device__ __forceinline__ void end_launch() {
  if (blockIdx.x < kMaxCtas) g_spans[current_slot()][blockIdx.x].end = globaltimer_ns();
}

// Task: protocol/task_map.h's (a template, so that the GEMM engine can stamp without the task map).
template <class Task>
__device__ __forceinline__ void describe(int record, const Task& task) {
  if (blockIdx.x >= kMaxCtas || record < 0 || record >= kMaxRecords) return;
  Record& r = g_records[current_slot()][blockIdx.x][record];
  r.phase = static_cast<int32_t>(task.phase);
  r.index = task.index;
  r.expert = task.tile.expert;
  r.mblock = task.tile.mblock;
  r.nblock = task.tile.nblock;
  r.smid = static_cast<int32_t>(smid());
}

// The group's leader (thread 0 before the roles, the math leader after), when it takes a task: the task
// becomes its current record, described and stamped kMathStart (record -1: none).
template <class Task>
__device__ __forceinline__ void open_task(bool leader, int record, const Task& task) {
  if (!leader) return;
  current_record() = record;
  describe(record, task);
  stamp(record, kMathStart);
}
// The group's leader (thread 0 before the roles, the math leader after) stamps step s of its task.
__device__ __forceinline__ void stamp_current(bool leader, Stamp s) {
  if (leader) stamp(current_record(), s);
}
// The math leader stamps its first full stage (called by every math thread of the k-loop).
__device__ __forceinline__ void first_full(int math_thread, int kb) {
  if (math_thread == 0 && kb == 0) stamp(current_record(), kFirstFull);
}
#else
inline constexpr bool kOn = false;
__device__ __forceinline__ void begin_launch(uint32_t) {}
__device__ __forceinline__ void end_launch() {}
__device__ __forceinline__ void stamp(int, Stamp) {}
__device__ __forceinline__ void stamp_at(int, Stamp, uint64_t) {}
__device__ __forceinline__ uint64_t now() { return 0; }
template <class Task>
__device__ __forceinline__ void open_task(bool, int, const Task&) {}
__device__ __forceinline__ void stamp_current(bool, Stamp) {}
template <class Task>
__device__ __forceinline__ void describe(int, const Task&) {}
__device__ __forceinline__ void first_full(int, int) {}
#endif

}  // namespace epfuse::device::trace
