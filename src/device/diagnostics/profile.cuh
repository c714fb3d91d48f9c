// Device side of the optional profile (profile_record.h): per CTA, thread 0 stamps %globaltimer around
// every task and every CTA-wide wait into shared memory, and adds its totals to the global record once,
// when the CTA ends. Off (FusedParams::profile == nullptr) it costs one uniform branch per task and per wait.
#pragma once
#include <cstdint>

#include "device/diagnostics/profile_record.h"
#include "device/ptx/signals.cuh"
#include "device/ptx/thread_group.cuh"

namespace epfuse::device {

// Wait time of the current task, in CTA-ns (written by the waiters, read and reset by TaskProfiler).
__device__ __forceinline__ unsigned long long& profile_task_wait_ns() {
  __shared__ unsigned long long ns;
  return ns;
}

// Adds a wait of `ns` nanoseconds to the current task (one thread per CTA-wide wait; per warp waits
// pass their share, ns / warps).
__device__ __forceinline__ void profile_add_wait(unsigned long long ns) {
  atomicAdd(&profile_task_wait_ns(), ns);
}

class TaskProfiler {
 public:
  __device__ explicit TaskProfiler(FusedProfile* out) : out_(out) {
    if (out_ == nullptr) return;
    __shared__ FusedProfile cta;
    __shared__ uint64_t clock[2];  // thread 0's CTA start and current span start, off the registers
    cta_ = &cta;
    clock_ = clock;
    uint64_t* words = reinterpret_cast<uint64_t*>(cta_);
    for (int i = threadIdx.x; i < static_cast<int>(sizeof(FusedProfile) / 8); i += blockDim.x) words[i] = 0;
    if (threadIdx.x == 0) {
      profile_task_wait_ns() = 0;
      clock_[0] = globaltimer_ns();
      clock_[1] = clock_[0];
    }
    __syncthreads();
  }

  __device__ bool on() const { return out_ != nullptr; }

  // After TaskScheduler::next() (the time since the previous task ended, its wait for the plan
  // included, goes to the scheduler bucket). Every thread calls it.
  // g: the threads that run the tasks (the whole CTA, or the math warps of a warp-specialised CTA).
  __device__ void after_next(int scheduler_bucket, const ThreadGroup& g = ThreadGroup::cta()) {
    if (on() && g.leader()) close(scheduler_bucket, globaltimer_ns(), take_wait());
  }
  // After the task of `bucket` (a Phase): every thread of g calls it.
  __device__ void after_task(int bucket, const ThreadGroup& g = ThreadGroup::cta()) {
    if (!on()) return;
    g.sync();  // the task's per-warp waits have all been added
    if (g.leader()) close(bucket, globaltimer_ns(), take_wait());
  }

  // Once per CTA, after its last task: a few atomics into the global record.
  __device__ void flush(const ThreadGroup& g = ThreadGroup::cta()) {
    if (!on() || !g.leader()) return;
    const uint64_t end = globaltimer_ns();
    for (int b = 0; b < kProfileBuckets; ++b) {
      if (cta_->tasks[b] == 0) continue;
      add(&out_->busy_ns[b], cta_->busy_ns[b]);
      add(&out_->wait_ns[b], cta_->wait_ns[b]);
      add(&out_->tasks[b], cta_->tasks[b]);
      max(&out_->first_start_inv[b], cta_->first_start_inv[b]);
      max(&out_->last_end[b], cta_->last_end[b]);
    }
    max(&out_->kernel_start_inv, ~clock_[0]);
    max(&out_->kernel_end, end);
    add(&out_->cta_ns, end - clock_[0]);
    add(&out_->ctas, 1);
  }

 private:
  __device__ static uint64_t take_wait() {
    const uint64_t wait = profile_task_wait_ns();
    profile_task_wait_ns() = 0;
    return wait;
  }
  // Thread 0: the span [clock_[1], now) belongs to bucket; the next span starts now.
  __device__ void close(int b, uint64_t now, uint64_t wait) {
    const uint64_t start = clock_[1];
    cta_->busy_ns[b] += now - start;
    cta_->wait_ns[b] += wait;
    cta_->tasks[b] += 1;
    if (~start > cta_->first_start_inv[b]) cta_->first_start_inv[b] = ~start;
    if (now > cta_->last_end[b]) cta_->last_end[b] = now;
    clock_[1] = now;
  }
  __device__ static void add(uint64_t* p, uint64_t v) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }
  __device__ static void max(uint64_t* p, uint64_t v) {
    atomicMax(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  }

  FusedProfile* out_;
  FusedProfile* cta_ = nullptr;
  uint64_t* clock_ = nullptr;
};

}  // namespace epfuse::device
