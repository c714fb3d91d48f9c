// Thin wrappers over the Hopper asynchronous-transaction PTX the warp-specialised tile GEMM
// (gemm_mainloop_tma.cuh) uses: shared-memory mbarriers (init, arrive, arrive with an expected byte
// count, parity wait), the arrive that fires when a thread's cp.async copies have landed, the TMA
// 2-D tile load that completes its bytes on an mbarrier, and the plain bulk copy into shared memory with the
// proxy fence its global reads need. One instruction per function, no policy.
// Source: PTX ISA "mbarrier", "cp.async.mbarrier.arrive", "cp.async.bulk.tensor", "cp.async.bulk", "membar/fence".
#pragma once
#include <cstdint>

namespace epfuse::device::ptx {

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals) : "memory");
}
// Makes initialised barriers visible to the async proxy (TMA completes its bytes through it).
__device__ __forceinline__ void fence_mbar_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// One arrival that also announces `bytes` of transactions (TMA copies) the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// True once the phase with parity `parity` has completed (a fresh barrier counts its phase "-1",
// parity 1, as completed). The hardware may suspend the thread for a while before answering false.
__device__ __forceinline__ bool mbar_try_wait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
// An arrival on `bar` once every cp.async this thread issued before has landed. noinc: the arrival is
// one of the barrier's initial count (not added to it).
__device__ __forceinline__ void cp_async_mbar_arrive_noinc(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// TMA: the box at (c0 = inner, c1 = outer) of the 2-D tensor map `map` (in param, const or global
// memory) into shared memory at `dst`, its bytes counted on `bar`.
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// tma_load_2d with an L2 eviction-priority hint: evict_first marks the box's lines as the first to go, so
// a stream read once does not push out what is read again (the kernel's code, rows, plan, flags). Its
// createpolicy sits in the same asm rather than coming from ptx.cuh's make_l2_evict_first: the FP8
// kernel compiled with that form (or with a branch-free evict_first / evict_normal policy operand) to
// 118-121 spill instructions instead of 109 (docs/performance.md#register-allocation-and-spills).
__device__ __forceinline__ void tma_load_2d_evict_first(uint32_t dst, const void* map, uint32_t bar, int c0, int c1) {
  asm volatile(
      "{\n .reg .b64 policy;\n createpolicy.fractional.L2::evict_first.b64 policy, 1.0;\n"
      " cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, %4}], [%2], policy;\n}\n" ::"r"(dst),
      "l"(map), "r"(bar), "r"(c0), "r"(c1)
      : "memory");
}
// TMA, the other direction: shared memory at `src` into the box at (c0 = inner, c1 = outer) of `map`,
// tracked in this thread's bulk groups (bulk_commit, bulk_wait_all).
__device__ __forceinline__ void tma_store_2d(const void* map, uint32_t src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src), "r"(c0),
               "r"(c1)
               : "memory");
}
// Bulk copy (no tensor map): `bytes` (a multiple of 16; both addresses 16-byte aligned) of global `src`
// into shared memory at `dst`, its bytes counted on `bar`.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
// Global memory written by generic stores (another CTA's, acquired through a flag) becomes visible to
// this thread's later bulk or TMA reads (the async proxy).
__device__ __forceinline__ void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Until every bulk group this thread committed is complete (its writes done).
__device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

}  // namespace epfuse::device::ptx
