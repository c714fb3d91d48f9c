// A diagnostic timeline of the fused kernel, compiled in only with -DEPFUSE_TRACE=ON (CMake option; a
// separate build: the stamps change register allocation, so its times are not the release kernel's).
// Per CTA, one record per task: %globaltimer stamps at each step of a task's way through the CTA
// (Stamp), written by the leaders of the roles. The host copies the records of chosen launches out and
// writes them as CSV (fused_kernel.cu LaunchTrace; scripts/trace_report.py reads them). Without
// EPFUSE_TRACE every call below is an empty inline function, and kOn guards the rest.
#pragma once
#include <cstdint>

#include "device/signals.cuh"
#include "device/task_map.h"

namespace epfuse::device::trace {

// The steps of a task (columns of the CSV, in this order).
enum Stamp : int {
  kTaken = 0,   // the CTA (producer) has the task id
  kWeights,     // producer: the queue slot is free and the tile's first weights are issued
  kInputs,      // producer: the tile's inputs are there (dispatch rows / the expert's Linear1 tiles)
  kPosted,      // producer: posted to the math warps (pre-role tasks: unused)
  kLoaded,      // producer: every operand load of the tile issued
  kMathStart,   // math: took the posted task (pre-role tasks: start)
  kFirstFull,   // math: the first stage of the k-loop is there
  kLoopEnd,     // math: the k-loop is done
  kEnd,         // the task is done (epilogue, signals)
  kEpiMath,     // math: Linear1's h values (and FP8 codes) are in registers
  kEpiStored,   // math: the epilogue's stores are issued (before the release / signals)
  kStamps
};

inline constexpr int kMaxCtas = 264;
inline constexpr int kPreRecords = 8;  // tasks a CTA runs before it splits into roles
inline constexpr int kMaxRecords = 64;

struct Record {
  uint64_t t[kStamps];
  int32_t phase, index, expert, mblock, nblock, smid;
};

#ifdef EPFUSE_TRACE
inline constexpr bool kOn = true;
__device__ Record g_records[kMaxCtas][kMaxRecords];

// The math leader's current record (read by the mainloop's first-stage stamp).
__device__ __forceinline__ int& math_record() {
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

// The math group's leader stamps step s of its current task.
__device__ __forceinline__ void math_stamp(bool leader, Stamp s) {
  if (leader) stamp(math_record(), s);
}
// The math leader stamps its first full stage (called by every math thread of the k-loop).
__device__ __forceinline__ void first_full(int math_thread, int kb) {
  if (math_thread == 0 && kb == 0) stamp(math_record(), kFirstFull);
}
#else
inline constexpr bool kOn = false;
__device__ __forceinline__ int& math_record() {
  __shared__ int r;
  return r;
}
__device__ __forceinline__ void stamp(int, Stamp) {}
__device__ __forceinline__ void math_stamp(bool, Stamp) {}
__device__ __forceinline__ void describe(int, const Task&) {}
__device__ __forceinline__ void first_full(int, int) {}
#endif

}  // namespace epfuse::device::trace
