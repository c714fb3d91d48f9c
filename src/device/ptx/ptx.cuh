// Thin wrappers over the PTX the tile GEMM and the fused kernel use: cp.async (Ampere+ async copy to
// shared memory), ldmatrix, mma.sync bf16 -> fp32, and global loads/stores with cache hints.
// One instruction per function, no policy: the callers decide what to issue and when.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

namespace epfuse::device::ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* ptr) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(ptr));
}

// ---- cp.async ----
// 16 bytes global -> shared, bypassing L1 (.cg): GEMM operands are reused from shared memory and L2,
// never from L1. The L2::128B prefetch hint fetches the whole 128-byte line, which the neighbouring
// chunks of the same row need next.
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16;\n" ::"r"(smem_dst), "l"(gmem_src)
               : "memory");
}
// Same, with an L2 cache policy (make_l2_evict_first).
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src, uint64_t l2_policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_dst),
               "l"(gmem_src), "l"(l2_policy)
               : "memory");
}
// The two above by a flag: with the L2 policy l2_policy when `hinted`, the plain copy otherwise (the
// all-thread tiles' weight copies, hinted when a call reads them once: task_map.h weights_read_once).
__device__ __forceinline__ void cp_async_16(uint32_t smem_dst, const void* gmem_src, bool hinted, uint64_t l2_policy) {
  if (hinted) cp_async_16(smem_dst, gmem_src, l2_policy);
  else cp_async_16(smem_dst, gmem_src);
}
// Same, reading only src_bytes (0 or 16) of the source and zero-filling the rest: a chunk past the end
// of a row (the partial last K block of the FP8 tile) lands as zeros without touching memory.
__device__ __forceinline__ void cp_async_16_zfill(uint32_t smem_dst, const void* gmem_src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_dst), "l"(gmem_src),
               "r"(src_bytes)
               : "memory");
}
// 4 bytes global -> shared through L1 (.ca; .cg copies only 16): for data the kernel never writes
// (weight scales), where an L1 line cannot be stale.
__device__ __forceinline__ void cp_async_4(uint32_t smem_dst, const void* gmem_src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_dst), "l"(gmem_src) : "memory");
}
// Until every cp.async this thread issued has landed (committed or not).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Wait until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// The L2 evict_first policy (createpolicy) for the cache_hint form of cp_async_16: the all-thread
// tiles' weights that a call reads once (task_map.h weights_read_once), so that they do not push out what
// the next launch reads again. (The FP8 tile's TMA boxes: mbarrier.cuh tma_load_2d_evict_first.)
__device__ __forceinline__ uint64_t make_l2_evict_first() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// ---- named barriers: synchronise `threads` threads (a multiple of 32) on barrier `id` (1..15; 0 is
// __syncthreads), so warps outside the group (e.g. communication warps) are never waited for ----
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Same, and true in every thread when `pred` was true in any of them. kConverged: for warps that arrive
// converged, the aligned form (bar.red), which ptxas emits as the barrier alone. Given the unaligned form
// after a __syncwarp, ptxas may drop the WARPSYNC and take a diverged warp through the barrier's own
// diverged path, which compute-sanitizer's synccheck reports
// (docs/performance.md#the-producer-warps-combine-as-streams-2026-11-30-not-kept).
template <bool kConverged = false>
__device__ __forceinline__ bool named_barrier_or(int id, int threads, bool pred) {
  uint32_t out;
  const uint32_t in = pred ? 1u : 0u;
  if constexpr (kConverged)
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %2, 0;\n bar.red.or.pred q, %1, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(out) : "r"(id), "r"(in), "r"(threads) : "memory");
  else
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %2, 0;\n barrier.red.or.pred q, %1, %3, p;\n selp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(out) : "r"(id), "r"(in), "r"(threads) : "memory");
  return out != 0;
}

// ---- setmaxnreg (sm_90a): a warpgroup gives registers back to, or takes them from, the SM's pool, so
// warp-specialised CTAs can give their math warps more than an even split (PTX ISA "setmaxnreg").
// Every warp of the warpgroup executes it; ptxas needs the kernel's launch bounds to apply it. ----
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// ---- ldmatrix: four (x4) or two (x2) 8x8 b16 matrices; lane l gives the address of row l % 8 of
// matrix l / 8 ----
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&frag)[4], uint32_t smem_src) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(frag[0]), "=r"(frag[1]), "=r"(frag[2]), "=r"(frag[3])
               : "r"(smem_src));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&frag)[2], uint32_t smem_src) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(frag[0]), "=r"(frag[1])
               : "r"(smem_src));
}

// ---- mma.sync m16n8k16, bf16 inputs, fp32 accumulate in place: d += a * b ----
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- global loads/stores with cache hints ----
// Read-only 16 bytes that this SM will not read again: non-coherent path, no L1 allocation.
__device__ __forceinline__ int4 ld_nc_na_v4(const void* ptr) {
  int4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(ptr));
  return v;
}
// Streaming stores (.cs, evict-first): outputs written once and consumed by another kernel phase.
__device__ __forceinline__ void st_cs_b32(void* ptr, uint32_t v) {
  asm volatile("st.global.cs.b32 [%0], %1;\n" ::"l"(ptr), "r"(v) : "memory");
}
__device__ __forceinline__ void st_cs_v2_f32(void* ptr, float v0, float v1) {
  asm volatile("st.global.cs.v2.f32 [%0], {%1, %2};\n" ::"l"(ptr), "f"(v0), "f"(v1) : "memory");
}
__device__ __forceinline__ void st_cs_v4(void* ptr, int4 v) {
  asm volatile("st.global.cs.v4.s32 [%0], {%1, %2, %3, %4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z),
               "r"(v.w)
               : "memory");
}

// Two floats -> one register of two bf16 (round to nearest), low half = first.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// ---- programmatic dependent launch (common/launch.h) ----
// Until the grid this launch depends on has completed and its memory operations are visible; returns at
// once when the launch had no programmatic dependency. Everything a kernel reads that an earlier kernel
// may write comes after it.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// This CTA lets the next kernel on the stream be launched (its CTAs run up to their own
// grid_dependency_wait) once every CTA of this grid has issued it or exited. Orders nothing: the next
// kernel's wait is still for this grid's completion.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

}  // namespace epfuse::device::ptx
