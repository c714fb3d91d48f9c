// Which CTA does what, apart from the math:
//   TaskScheduler: CTAs take task ids from one atomic counter in id order (task_map.h); ids past the
//     static phases wait for this call's expert plan and GEMM schedule to learn how many GEMM tiles
//     exist and in which order. The last CTA to finish resets the per-call counters for the next launch.
//   TaskQueue: within a warp-specialised CTA, the hand-over of each task from the producer role, which
//     takes the ids, to the math role (fused_kernel.cu), through slots in shared memory.
#pragma once
#include <cstdint>

#include "device/diagnostics/trace.cuh"
#include "device/kernel/context.cuh"
#include "device/kernel/errors.cuh"
#include "device/kernel/wait.cuh"
#include "device/protocol/task_map.h"
#include "device/ptx/mbarrier.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/signals.cuh"
#include "device/ptx/thread_group.cuh"

namespace epfuse::device {

template <class Transport>
class TaskScheduler {
 public:
  // host_space (the decode kernels, fused_kernel.cu): the task counts the host made (FusedParams::tasks);
  // otherwise made here, as the other kernels' instructions were measured with
  // (docs/performance.md#the-calls-task-counts-by-the-host-2026-12-02).
  __device__ TaskScheduler(const FusedContext<Transport>& c, bool host_space)
      : c_(c),
        space_(host_space ? c.prm->tasks : make_task_space(c.prm->num_tokens, static_cast<int>(gridDim.x), c.prm->dims.world)) {}

  // The next task for group g (kDone when there is none, or after an abort): the whole CTA, or in a
  // warp-specialised CTA its producer warps, which hand each task on to the math warps (TaskQueue).
  __device__ Task next(const ThreadGroup& g = ThreadGroup::cta()) { return next(g, claim(g)); }

  // next in two steps, for a producer that takes its next id before it issues the loads of the task in
  // hand, so that the atomic's round trip (~1-3 us with 132 CTAs on one counter) runs under them:
  // claim (the leader's id, in a register; no barrier), then next(g, claimed) decodes it (the abort
  // test is there).
  __device__ uint32_t claim(const ThreadGroup& g) const { return g.leader() ? atomicAdd(&c_.ctl->task_counter, 1u) : 0u; }
  __device__ Task next(const ThreadGroup& g, uint32_t claimed) {
    __shared__ uint32_t id;
    g.sync();
    if (g.leader()) id = aborted(c_.ctl) ? ~0u : claimed;
    g.sync();
    if (id == ~0u) return {Phase::kDone, 0};
    const int task = static_cast<int>(id);
    if (task >= space_.static_tasks() && !have_plan_) {
      uint32_t* plan_epoch = &c_.ctl->plan_epoch;
      const uint32_t epoch = c_.epoch;
      if (!group_wait(g, *c_.prm, c_.ctl, c_.site(Phase::kLinear1, WaitKind::kPlan), epoch,
                    [&] { return ld_acquire_gpu(plan_epoch); }, [&](uint32_t v) { return flag_is_current(v, epoch); }))
        return {Phase::kDone, 0};
      if constexpr (trace::kOn) plan_seen_ = trace::now();
      // The acquire above ordered the collect task's plan and schedule before these reads. A CTA with a
      // copy of its own (FusedContext::plan) fills it here, once: the plan reads of every task's decoding
      // (a binary search over the segments) and row table (each row's source and entry) are then
      // shared-memory loads, not dependent global loads behind the SM's own TMA copies
      // (docs/performance.md#the-plan-in-shared-memory-2026-11-29).
      const ExpertPlan published = c_.published_plan();
      if (c_.plan.rows != published.rows && !copy_plan(g, published)) return {Phase::kDone, 0};
      space_ = with_gemm_tasks(space_, c_.plan.seg_start[*c_.plan.segments]);
      have_plan_ = true;
    }
    return decode_task(space_, c_.plan, task);
  }

  __device__ const TaskSpace& space() const { return space_; }

  // The published plan into this CTA's copy (FusedContext::plan), by one bulk copy: one round trip at any
  // expert count, where a loop of loads by the group's threads took ~2 us at 128 experts
  // (docs/performance.md#the-plans-copy-by-one-bulk-copy-2026-12-01). False (group-uniform, recorded) when
  // its wait ran out.
  __device__ bool copy_plan(const ThreadGroup& g, const ExpertPlan& published) {
    __shared__ __align__(8) uint64_t bar;
    const uint32_t b = ptx::smem_u32(&bar);
    if (g.leader()) {
      ptx::mbar_init(b, 1);
      ptx::fence_mbar_init();
      ptx::fence_proxy_async_global();  // the plan's stores, acquired by the wait above, before the copy reads them
      const uint32_t bytes = static_cast<uint32_t>(plan_copy_bytes16(c_.prm->dims));
      ptx::mbar_arrive_expect_tx(b, bytes);
      ptx::bulk_load(ptx::smem_u32(c_.plan.rows), published.rows, bytes, b);
    }
    g.sync();  // the barrier is initialised before any thread waits on it
    const bool ok = mbar_wait(b, 0, c_.limit(c_.prm->timeout_ns), [&] {
      report_timeout(c_.ctl, c_.prm->rank, c_.site(Phase::kLinear1, WaitKind::kPlan), 0, 0);
    });
    return !g.sync_or(!ok);
  }
  // When this CTA saw the plan published (a trace build's kPlanSeen; 0 otherwise or before).
  __device__ uint64_t plan_seen() const { return plan_seen_; }

  // Every CTA calls this once, after its last task (g: the threads that ran it). The last one zeroes
  // what the tasks counted this call and stores the call state (the next launch is ordered after this
  // one on the stream, so it sees them).
  __device__ void finish(const ThreadGroup& g = ThreadGroup::cta()) {
    __shared__ int last;
    __shared__ uint32_t seen[3];  // the last CTA's view of plan_epoch, mblocks and abort
    FusedControl* ctl = c_.ctl;
    g.sync();
    if (g.leader()) {
      // The acq_rel add releases what every thread of this CTA wrote before the sync above and, for the
      // last CTA, acquires what every other CTA did; the threads after the sync below see it through the
      // CTA barrier, so no separate fence (docs/performance.md#the-finishs-fences-2026-11-30).
      last = atomic_add_done() == gridDim.x - 1 ? 1 : 0;
      // The last CTA: the three words the resets depend on, read together after the acquire above (every
      // other CTA is done: none of them changes any more). One round trip, not three in a row: the last
      // CTA's finish ends every call (docs/performance.md#the-last-ctas-finish-2026-11-29).
      if (last) {
        seen[0] = *reinterpret_cast<const volatile uint32_t*>(&ctl->plan_epoch);
        seen[1] = *reinterpret_cast<const volatile uint32_t*>(&ctl->mblocks);
        seen[2] = *reinterpret_cast<const volatile uint32_t*>(&ctl->abort);
      }
    }
    g.sync();
    if (!last) return;
    const FusedDims& d = c_.prm->dims;
    const int mblocks = flag_is_current(seen[0], c_.epoch) ? static_cast<int>(seen[1]) : 0;
    const bool was_aborted = seen[2] != 0;
    for (int i = g.rank(); i < d.world; i += g.count) c_.row_tickets[i] = 0;
    for (int i = g.rank(); i < d.num_experts; i += g.count) c_.pair_tickets[i] = 0;
    for (int i = g.rank(); i < mblocks; i += g.count) c_.l1_done[i] = 0;
    // An aborted call's rows: NaN in this call's own y, whichever rows its combine did or did not
    // write (every CTA is done with y by now), so that no caller reads a half-written y as a result.
    if (was_aborted) fill_y_with_nan(*c_.prm, g.rank(), g.count);
    if (g.leader()) {
      ctl->task_counter = 0;
      ctl->layout_done = 0;
      ctl->ctas_done = 0;
      // The call state for the next launch (graph replays included): this call's epoch, and whether
      // the workspace is now unusable.
      ctl->epoch = c_.epoch;
      if (was_aborted) {
        ctl->broken = 1u;
        tell_host_failed(*c_.prm);
      }
    }
    // Nothing to fence here: the next launch on the stream, and a dependent launch's grid_dependency_wait,
    // see this grid's writes once it has ended.
  }

 private:
  __device__ uint32_t atomic_add_done() { return atom_add_acq_rel_gpu(&c_.ctl->ctas_done, 1u); }

  const FusedContext<Transport>& c_;
  TaskSpace space_;
  bool have_plan_ = false;
  uint64_t plan_seen_ = 0;
};

// The task hand-over between the roles of a warp-specialised CTA, in its shared memory: the producer
// warpgroup prepares a task (waits for its inputs, fills its row table), posts it to a slot and issues
// its operand loads; the math warpgroups take the slots in order and free each when done with it.
//   full[s]:  the producer posted item[s] (table[s] is filled): 1 arrival.
//   empty[s]: the math warps are done with item[s] and table[s]: 1 arrival (their leader's, after a
//             barrier that every math thread reaches only once it has read item[s]: math_role).
// With two slots the producer runs at most one task ahead: it claims task n + 1 only after issuing every
// load of task n, so the math warps never wait for a producer stuck in a later task's wait, and taking
// ids in order still cannot deadlock (a task waits only for smaller ids; docs/fused_design.md).
template <class Item, class Table, int kSlots_ = 2>
struct TaskQueue {
  static constexpr int kSlots = kSlots_;
  Table table[kSlots];
  Item item[kSlots];
  uint64_t full[kSlots];
  uint64_t empty[kSlots];

  // Once per launch, by one thread; the caller fences the barriers' init and synchronises the CTA.
  __device__ void init() {
    for (int s = 0; s < kSlots; ++s) {
      ptx::mbar_init(ptx::smem_u32(&full[s]), 1);
      ptx::mbar_init(ptx::smem_u32(&empty[s]), 1);
    }
  }

  // The slot of the n-th task a role handles (both roles count from 0).
  __device__ static int slot(uint32_t n) { return static_cast<int>(n % kSlots); }

  // Producer: until the math warps are done with the slot's previous task (a fresh barrier passes
  // parity 1). False when the wait was abandoned.
  template <class Transport>
  __device__ bool wait_free(const FusedContext<Transport>& c, uint32_t n) {
    return wait(c, empty[slot(n)], ((n / kSlots) & 1u) ^ 1u, slot(n));
  }
  // Producer, one thread: the task is in item[s] and table[s] (release: they go with the arrival).
  __device__ void post(int s) { ptx::mbar_arrive(ptx::smem_u32(&full[s])); }

  // Math: until the n-th task is posted. False when the wait was abandoned.
  template <class Transport>
  __device__ bool wait_posted(const FusedContext<Transport>& c, uint32_t n) {
    return wait(c, full[slot(n)], (n / kSlots) & 1u, slot(n));
  }
  // Math, the leader of g: done with slot s.
  __device__ void release(int s, const ThreadGroup& g) {
    if (g.leader()) ptx::mbar_arrive(ptx::smem_u32(&empty[s]));
  }

 private:
  // A slot barrier's phase (bounded: the other side may sit in a wait of its own bounded by the
  // timeout, so this one allows twice that before it reports the slot).
  template <class Transport>
  __device__ static bool wait(const FusedContext<Transport>& c, uint64_t& bar, uint32_t parity, int slot) {
    return mbar_wait(ptx::smem_u32(&bar), parity, c.limit(2 * c.prm->timeout_ns),
                     [&] { report_timeout(c.ctl, c.prm->rank, c.site(Phase::kDone, WaitKind::kTaskSlot, slot), 0, 0); });
  }
};

}  // namespace epfuse::device
