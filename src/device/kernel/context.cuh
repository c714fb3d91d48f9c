// The per-launch view every task works through: the kernel argument, the private workspace carved by
// PrivRegions, this call's parity, and (through the Transport, transport.cuh) pointers into this
// rank's or a peer's symmetric window.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/kernel/errors.cuh"
#include "device/kernel/kernel_params.h"
#include "device/kernel/transport.cuh"
#include "device/kernel/wait.cuh"
#include "device/protocol/epoch.h"
#include "device/protocol/task_map.h"

namespace epfuse::device {

template <class Transport>
struct FusedContext {
  const FusedParams* prm;
  FusedControl* ctl;
  uint32_t epoch;   // this call's (next_epoch of the last call's, FusedControl::epoch)
  uint32_t parity;
  int local_experts;
  __nv_bfloat16* h;
  int32_t* pair_row;
  int32_t* pair_index;
  uint32_t* row_tickets;
  uint32_t* pair_tickets;
  // The expert plan the tasks read: this CTA's copy in shared memory (plan_copy of make; TaskScheduler
  // fills it once the plan is out), or the published one in the workspace, which the collect task writes.
  ExpertPlan plan;
  uint32_t* arrival_base;  // this parity's [L]
  uint32_t* token_base;    // this parity's [T_max]
  uint32_t* l1_done;

  __device__ static FusedContext make(const FusedParams& prm, int* plan_copy = nullptr) {
    FusedContext c;
    char* ws = prm.workspace;
    const PrivRegions& pl = prm.priv;
    c.prm = &prm;
    c.ctl = reinterpret_cast<FusedControl*>(ws + pl.control);
    // Every CTA reads the last call's epoch before the last CTA of this call stores the new one (it
    // does so only after every CTA has finished, scheduler.cuh finish()).
    c.epoch = next_epoch(*reinterpret_cast<const volatile uint32_t*>(&c.ctl->epoch));
    c.parity = epoch_parity(c.epoch);
    c.local_experts = prm.dims.local_experts();
    c.h = reinterpret_cast<__nv_bfloat16*>(ws + pl.h);
    c.pair_row = reinterpret_cast<int32_t*>(ws + pl.pair_row);
    c.pair_index = reinterpret_cast<int32_t*>(ws + pl.pair_index);
    c.row_tickets = reinterpret_cast<uint32_t*>(ws + pl.row_tickets);
    c.pair_tickets = reinterpret_cast<uint32_t*>(ws + pl.pair_tickets);
    c.plan = plan_copy != nullptr ? plan_view(plan_copy, prm.dims.world, c.local_experts) : c.published_plan();
    // Strides of the workspace's capacity, as the counters they mirror (regions.h).
    c.arrival_base = reinterpret_cast<uint32_t*>(ws + pl.arrival_base) + c.parity * prm.capacity.local_experts();
    c.token_base = reinterpret_cast<uint32_t*>(ws + pl.token_base) + c.parity * prm.capacity.max_tokens;
    c.l1_done = reinterpret_cast<uint32_t*>(ws + pl.l1_done);
    return c;
  }

  // The plan as the collect task publishes it in the workspace (regions.h).
  __device__ ExpertPlan published_plan() const {
    return plan_view(reinterpret_cast<int*>(prm->workspace + prm->priv.plan), prm->dims.world, local_experts);
  }
  __device__ WaitSite site(Phase phase, WaitKind what, int a = 0, int b = 0) const { return {phase, what, a, b}; }
  // A wait's limit: timeout_ns from now, or this call's abort.
  __device__ WaitLimit limit(uint64_t timeout_ns) const { return {globaltimer_ns() + timeout_ns, &ctl->abort}; }
};

// Byte `offset` of rank's copy of the symmetric window (a peer's, or this rank's own).
template <class T, class Transport>
__device__ __forceinline__ T* peer_ptr(const FusedContext<Transport>& c, int rank, size_t offset) {
  return static_cast<T*>(Transport::peer(*c.prm, rank, offset));
}
// Byte `offset` of this rank's copy of the symmetric window.
template <class T, class Transport>
__device__ __forceinline__ T* local_ptr(const FusedContext<Transport>& c, size_t offset) {
  return static_cast<T*>(Transport::local(*c.prm, offset));
}

// The flags and counters between ranks (counts, arrivals, token signals), at the Transport's scope
// (transport.cuh kScope).
template <class Transport>
__device__ __forceinline__ constexpr bool signals_stay_local(const FusedContext<Transport>&) {
  return Transport::kScope == SignalScope::kGpu;
}
template <class Transport>
__device__ __forceinline__ uint32_t peer_acquire(const FusedContext<Transport>& c, const uint32_t* p) {
  return signals_stay_local(c) ? ld_acquire_gpu(p) : ld_acquire_sys(p);
}
template <class Transport>
__device__ __forceinline__ void peer_release_add(const FusedContext<Transport>& c, uint32_t* p, uint32_t v) {
  if (signals_stay_local(c)) red_add_release_gpu(p, v);
  else red_add_release_sys(p, v);
}
// Tagged words (protocol/epoch.h), at the same scope.
template <class Transport>
__device__ __forceinline__ uint64_t peer_load_word(const FusedContext<Transport>& c, const uint64_t* p) {
  return signals_stay_local(c) ? ld_relaxed_gpu_u64(p) : ld_relaxed_sys_u64(p);
}
template <class Transport>
__device__ __forceinline__ void peer_store_word(const FusedContext<Transport>& c, uint64_t* p, uint64_t v) {
  if (signals_stay_local(c)) st_relaxed_gpu_u64(p, v);
  else st_relaxed_sys_u64(p, v);
}

}  // namespace epfuse::device
