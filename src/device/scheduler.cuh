// Which CTA does what, apart from the math: CTAs take task ids from one atomic counter in
// id order (task_map.h); ids past the static phases wait for this call's expert plan and GEMM schedule
// to learn how many GEMM tiles exist and in which order. The last CTA to finish resets the per-call
// counters for the next launch.
#pragma once
#include <cstdint>

#include "device/context.cuh"
#include "device/wait.cuh"
#include "device/signals.cuh"
#include "device/task_map.h"

namespace epfuse::device {

template <class Transport>
class TaskScheduler {
 public:
  __device__ explicit TaskScheduler(const FusedContext<Transport>& c) : c_(c), space_(make_task_space(c.prm->num_tokens)) {}

  // The next task for group g (kDone when there is none, or after an abort): the whole CTA, or in the
  // GEMM region its producer warps, which hand each task on to the math warps (gemm_region.cuh).
  __device__ Task next(const ThreadGroup& g = ThreadGroup::cta()) {
    __shared__ uint32_t id;
    g.sync();
    if (g.leader()) id = aborted(c_.ctl) ? ~0u : atomicAdd(&c_.ctl->task_counter, 1u);
    g.sync();
    if (id == ~0u) return {Phase::kDone, 0};
    const int task = static_cast<int>(id);
    if (task >= space_.static_tasks() && !have_plan_) {
      uint32_t* plan_epoch = &c_.ctl->plan_epoch;
      const uint32_t epoch = c_.epoch;
      if (!group_wait(g, *c_.prm, c_.ctl, c_.site(Phase::kLinear1, WaitKind::kPlan), epoch,
                    [&] { return ld_acquire_gpu(plan_epoch); }, [&](uint32_t v) { return flag_is_current(v, epoch); }))
        return {Phase::kDone, 0};
      // The acquire above ordered the collect task's plan and schedule before these reads.
      space_ = with_gemm_tasks(space_, c_.plan.seg_start[*c_.plan.segments]);
      have_plan_ = true;
    }
    return decode_task(space_, c_.plan, task);
  }

  __device__ const TaskSpace& space() const { return space_; }

  // Every CTA calls this once, after its last task (g: the threads that ran it). The last one zeroes
  // what the tasks counted this call and stores the call state (the next launch is ordered after this
  // one on the stream, so it sees them).
  __device__ void finish(const ThreadGroup& g = ThreadGroup::cta()) {
    __shared__ int last;
    g.sync();
    if (g.leader()) {
      __threadfence();
      last = atomic_add_done() == gridDim.x - 1 ? 1 : 0;
    }
    g.sync();
    if (!last) return;
    __threadfence();
    FusedControl* ctl = c_.ctl;
    const FusedDims& d = c_.prm->dims;
    const int mblocks = flag_is_current(ld_acquire_gpu(&ctl->plan_epoch), c_.epoch) ? static_cast<int>(ctl->mblocks) : 0;
    for (int i = g.rank(); i < d.world; i += g.count) c_.row_tickets[i] = 0;
    for (int i = g.rank(); i < d.num_experts; i += g.count) c_.pair_tickets[i] = 0;
    for (int i = g.rank(); i < mblocks; i += g.count) c_.l1_done[i] = 0;
    if (g.leader()) {
      ctl->task_counter = 0;
      ctl->layout_done = 0;
      ctl->ctas_done = 0;
      // The call state for the next launch (graph replays included): this call's epoch, and whether
      // the workspace is now unusable.
      ctl->epoch = c_.epoch;
      if (aborted(ctl)) ctl->broken = 1u;
    }
    __threadfence();
  }

 private:
  __device__ uint32_t atomic_add_done() { return atom_add_acq_rel_gpu(&c_.ctl->ctas_done, 1u); }

  const FusedContext<Transport>& c_;
  TaskSpace space_;
  bool have_plan_ = false;
};

}  // namespace epfuse::device
