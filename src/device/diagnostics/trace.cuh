// A diagnostic timeline of the fused kernel, compiled in only with -DEPFUSE_TRACE=ON (CMake option; a
// separate build: the stamps change register allocation, so its times are not the release kernel's).
// Per CTA, one record per task: %globaltimer stamps at each step of a task's way through the CTA
// (Stamp), written by the leaders of the roles. The host copies the records of chosen launches out and
// writes them as CSV (fused_kernel.cu LaunchTrace; scripts/trace_report.py reads them). Without
// EPFUSE_TRACE every call below is an empty inline function.
#pragma once
#include <cstdint>

#include "device/ptx/signals.cuh"

namespace epfuse::device::trace {

// The steps of a task (columns of the CSV, in this order).
enum Stamp : int {
  kTaken = 0,   // the CTA (producer) has the task id
  kWeights,     // producer: the queue slot is free and the tile's first weights are issued
  kInputs,      // producer: the tile's inputs are there (dispatch rows / the expert's Linear1 tiles);
                //   dispatch: the layout is done; collect: every rank's counts are in
  kPosted,      // producer: posted to the math warps (pre-role tasks: unused)
  kLoaded,      // producer: every operand load of the tile issued
  kMathStart,   // math: took the posted task (pre-role tasks: start)
  kFirstFull,   // math: the first stage of the k-loop is there
  kLoopEnd,     // math: the k-loop is done
  kEnd,         // the task is done (epilogue, signals)
  kEpiMath,     // math: Linear1's h values (and FP8 codes) are in registers
  kEpiStored,   // math: the epilogue's stores are issued (before the release / signals); dispatch:
                //   every row and entry of the task is written (before the arrival adds)
  kLoopSynced,  // math: both math warpgroups are past the k-loop (the group barrier after it)
  kEpiSwiglu,   // math: Linear1's SwiGLU values are in registers (FP8: before their quantisation)
  kStamps
};

inline constexpr int kMaxCtas = 264;
inline constexpr int kPreRecords = 8;  // tasks a CTA runs before it splits into roles
inline constexpr int kMaxRecords = 128;  // a CTA runs ~70 tasks at mixtral T = 4096

struct Record {
  uint64_t t[kStamps];
  int32_t phase, index, expert, mblock, nblock, smid;
};

#ifdef EPFUSE_TRACE
inline constexpr bool kOn = true;
__device__ Record g_records[kMaxCtas][kMaxRecords];

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

__device__ __forceinline__ void stamp(int record, Stamp s) {
  if (blockIdx.x < kMaxCtas && record >= 0 && record < kMaxRecords) g_records[blockIdx.x][record].t[s] = globaltimer_ns();
}

// Task: protocol/task_map.h's (a template, so that the GEMM engine can stamp without the task map).
template <class Task>
__device__ __forceinline__ void describe(int record, const Task& task) {
  if (blockIdx.x >= kMaxCtas || record < 0 || record >= kMaxRecords) return;
  Record& r = g_records[blockIdx.x][record];
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
__device__ __forceinline__ void stamp(int, Stamp) {}
template <class Task>
__device__ __forceinline__ void open_task(bool, int, const Task&) {}
__device__ __forceinline__ void stamp_current(bool, Stamp) {}
template <class Task>
__device__ __forceinline__ void describe(int, const Task&) {}
__device__ __forceinline__ void first_full(int, int) {}
#endif

}  // namespace epfuse::device::trace
