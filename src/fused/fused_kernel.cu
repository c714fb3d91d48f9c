// The fused MoE kernel: one persistent launch per forward; this file is the whole CTA program. A CTA
// takes tasks from the scheduler (scheduler.cuh) in id order and runs each (task_map.h):
//   layout / publish / collect (layout.cuh), dispatch (dispatch.cuh), the expert GEMM tiles (Linear1,
//   Linear2: expert_ffn.cuh, over a tile GEMM's mainloop and epilogue.cuh), combine (combine.cuh).
// With an all-thread tile GEMM (TileGemm, TileGemmWgmma) every thread runs every task (cta_program).
// With the warp-specialised TileGemmTma a CTA runs its tasks before the GEMM phase on all threads and
// then splits for good into two roles (warp_specialised_roles), each with its own loop:
//   producer warpgroup (warps 0-3, kProducerRegs registers): takes task ids from the scheduler, waits
//     for a tile's inputs, reads its row table, posts the task to the math warps (scheduler.cuh
//     TaskQueue: two slots in shared memory) and issues all its operand loads into the ring; then takes
//     the next id while they compute;
//   math warpgroups (warps 4-11, kConsumerRegs registers): take each posted task: a GEMM tile's wgmma
//     k-loop and epilogue, or a combine task (one warp per token); then free its slot.
// One instantiation per shape of heuristics.h's kFusedTileShapes; the host picks one per call from the
// expected rows per expert.
#include "fused/fused_kernel.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda_runtime.h>
#ifdef EPFUSE_TRACE
#include <sys/file.h>
#endif

#include "common/check.h"
#include "common/env.h"
#include "common/launch.h"
#include "device/diagnostics/profile.cuh"
#include "device/diagnostics/trace.cuh"
#include "device/ffn/expert_ffn.cuh"
#include "device/ffn/expert_ffn_fp8.cuh"
#include "device/gemm/gemm_mainloop.cuh"
#include "device/gemm/gemm_mainloop_tma.cuh"
#include "device/gemm/gemm_mainloop_tma_fp8.cuh"
#include "device/gemm/gemm_mainloop_wgmma.cuh"
#include "device/gemm/tile_gemm.cuh"
#include "device/kernel/context.cuh"
#include "device/kernel/scheduler.cuh"
#include "device/phases/combine.cuh"
#include "device/phases/dispatch.cuh"
#include "device/phases/layout.cuh"
#include "device/ptx/ptx.cuh"

namespace epfuse::fused {
namespace {

using device::Phase;
using device::Task;
using device::TaskProfiler;
using device::TaskScheduler;
using device::ThreadGroup;

// The kernels the host takes at decode sizes (plan.cpp choose_fused_tile: the FP8 decode kernel, bf16's
// 32-row tile): their combine warms its code and reads its tokens' routing while their tiles are still
// coming (combine_task), a Linear2 tile's producer fills its row table before its wait (producer_role),
// the FP8 dispatch quantises this rank's own rows before its wait for the layout (dispatch_task), and a
// call of one layout task sends its counts from the routing and takes no tickets (layout_task, publish_task).
// Only there: the other kernels keep their instructions (their k-loops' registers moved with such code).
template <class Gemm>
constexpr bool decode_kernel() {
  if constexpr (requires { Gemm::kDecodeForm; }) return Gemm::kDecodeForm || Gemm::kBlockM <= 32;
  else return Gemm::kBlockM <= 32;
}
template <class Gemm>
inline constexpr bool kDecodeKernel = decode_kernel<Gemm>();

// ---- the roles of a warp-specialised CTA, from its first task of the GEMM phase on ----

// The producer warpgroup: takes task ids from the scheduler and hands each on through the queue.
template <class Tiles, class Transport>
__device__ void producer_role(const device::FusedContext<Transport>& c, TaskScheduler<Transport>& scheduler, Task task,
                              void* smem) {
  using Gemm = typename Tiles::Gemm;
  const ThreadGroup g = Tiles::producers();
  const device::FusedParams& prm = *c.prm;
  const int H = prm.dims.hidden, I = prm.dims.intermediate;
  auto& queue = Tiles::shared(smem).queue;
  typename Gemm::RingPos ring;
  for (uint32_t n = 0;; ++n) {
    const int s = queue.slot(n);
    const int rec = device::trace::kPreRecords + static_cast<int>(n);
    if (g.leader()) device::trace::describe(rec, task), device::trace::stamp(rec, device::trace::kTaken);
    if (g.sync_or(!queue.wait_free(c, n))) break;
    const bool gemm = Tiles::is_gemm(task.phase);
    typename Tiles::ARows a_rows = {};  // this thread's A operands of the tile
    device::TileRows w{};
    const int l1_tiles = 2 * I / Gemm::kBlockN;
    // Inputs not in yet: the weights of the tile's first k-blocks go out first (they need none) and
    // stream while it waits. Inputs in (most tiles): no preload, which would wait for the stages the
    // math warps' current tile still holds before the row table could be read and the tile posted
    // (docs/performance.md#task-hand-over-between-tiles: ~2 us of every tile's hand-over).
    const bool in = gemm && device::tile_inputs_in(c, g, task.phase, task.tile, l1_tiles);
    // No preload in a call that stops after the post (EPFUSE_FAULT at=producer, below): then nothing of
    // the tile is in flight, and the math warps never find a stage of it full.
    const bool preload = gemm && !in && prm.fault_hang != HangPoint::kProducer;
    const int preloaded = preload ? device::preload_weights<Tiles>(c, g, task, ring, smem) : 0;
    if (g.leader()) device::trace::stamp(rec, device::trace::kWeights);
    bool ok = preloaded >= 0;
    if constexpr (kDecodeKernel<Gemm>) {
      // A Linear2 tile's rows are known once its expert's Linear1 inputs are in: its row table is filled
      // then, while its Linear1 tiles still run, so that the hand-over after them is the wait alone
      // (docs/performance.md#linear2s-row-table-before-its-wait-2026-11-29).
      const bool wait = gemm && !in && ok, table_first = wait && task.phase == Phase::kLinear2;
      if (wait)
        ok = device::wait_tile_inputs(c, g, table_first ? Phase::kLinear1 : task.phase, task.tile, table_first ? 0 : l1_tiles);
      if (gemm && ok) Tiles::prepare(c, g, task, I, queue.table[s], a_rows, w);
      if (table_first && ok) ok = device::wait_tile_inputs(c, g, task.phase, task.tile, l1_tiles);
      if (wait && !ok && preload) device::drop_weights<Tiles>(c, task, ring, smem);
    } else {  // the same with table_first false, in the order the other kernels' SASS was measured with
      if (gemm && !in && ok && !(ok = device::wait_tile_inputs(c, g, task.phase, task.tile, l1_tiles)) && preload)
        device::drop_weights<Tiles>(c, task, ring, smem);
      if (gemm && ok) Tiles::prepare(c, g, task, I, queue.table[s], a_rows, w);
    }
    if (g.leader()) device::trace::stamp(rec, device::trace::kInputs);
    // EPFUSE_FAULT at=scheduler: the end of the task stream is never posted; the math warps wait for it.
    if (task.phase == Phase::kDone) device::hang_here(prm, c.ctl, g, HangPoint::kScheduler);
    if (g.leader()) {
      queue.item[s] = {ok ? task : Task{Phase::kDone, 0, {}}, w.rows,
                       gemm ? static_cast<int64_t>(c.plan.pair_off[w.expert]) + w.row0 : 0};
      queue.post(s);
      device::trace::stamp(rec, device::trace::kPosted);
    }
    if (!ok || task.phase == Phase::kDone) break;
    // EPFUSE_FAULT at=producer: the tile is posted, its operands never load; its math warps' pipeline
    // waits for them.
    if (gemm && device::hang_here(prm, c.ctl, g, HangPoint::kProducer)) break;
    // The next id is taken before this tile's loads, its decoding (and any wait) after them: the
    // atomic's round trip runs under the loads, and the math warps never wait for a producer held in
    // a later task's wait (scheduler.cuh TaskQueue).
    const uint32_t claimed = scheduler.claim(g);
    if (gemm && !Tiles::load(c, g, task, a_rows, H, I, ring, smem, preloaded)) break;
    if (g.leader()) device::trace::stamp(rec, device::trace::kLoaded);
    task = scheduler.next(g, claimed);
  }
  device::ptx::cp_async_wait_all();  // leave no copy in flight behind an exited thread
}

// The math warpgroups: take each task the producer posted, run it, free its slot. Inlined, as
// warp_specialised_roles: nvcc made the FP8 decode kernels' roles a call of their own, which cost qwen3-30b's
// FP8 decode rows 1-2% (docs/performance.md#the-fp8-decode-kernels-roles-inlined-2026-12-01).
template <class Tiles, class Transport>
__device__ __forceinline__ void math_role(const device::FusedContext<Transport>& c, TaskScheduler<Transport>& scheduler,
                                          TaskProfiler& profiler, void* smem) {
  using Gemm = typename Tiles::Gemm;
  const ThreadGroup g = Tiles::consumers();
  auto& sh = Tiles::shared(smem);
  typename Gemm::RingPos ring;
  for (uint32_t n = 0;; ++n) {
    const int s = sh.queue.slot(n);
    // Each thread copies the posted item before the group's barrier: a combine task frees its slot as
    // soon as the leader is past the barrier, and the producer may then overwrite it before a slower
    // warp has read it, which would run another task than its siblings (docs/performance.md#faults-seen-while-timing: a
    // combine twice, or kDone against their barriers). After a failed wait the copy is not used.
    const bool posted_ok = sh.queue.wait_posted(c, n);
    const typename Tiles::Posted posted = sh.queue.item[s];
    const bool failed = g.sync_or(!posted_ok);
    const Task& task = posted.task;
    const int rec = device::trace::kPreRecords + static_cast<int>(n);
    device::trace::open_task(g.leader(), rec, task);
    profiler.after_next(static_cast<int>(Phase::kDone), g);
    if (failed || task.phase == Phase::kDone) break;
    // A GEMM tile frees its slot once its epilogue no longer reads the row table, before its release
    // adds (a gpu / sys scope release waits ~1 us for the CTA's stores; only the adding threads wait).
    switch (task.phase) {
      case Phase::kLinear1: Tiles::linear1(c, posted, sh, s, ring, smem, g); break;
      case Phase::kLinear2: Tiles::linear2(c, posted, sh, s, ring, smem, g); break;
      default:
        sh.queue.release(s, g);
        if (task.phase == Phase::kCombine) device::combine_task<kDecodeKernel<Gemm>>(c, task.index, scheduler.space(), g);
        break;
    }
    profiler.after_task(static_cast<int>(task.phase), g);
    if (g.leader()) device::trace::stamp(rec, device::trace::kEnd);
  }
  profiler.flush(g);
  scheduler.finish(g);
  if (g.leader()) device::trace::end_launch();
}

// Every thread of the CTA, with its first task from the GEMM phase on; the CTA ends in here (inlined: see
// math_role).
template <class Tiles, class Transport>
__device__ __forceinline__ void warp_specialised_roles(const device::FusedContext<Transport>& c,
                                                       TaskScheduler<Transport>& scheduler, TaskProfiler& profiler,
                                                       Task first, void* smem) {
  using Gemm = typename Tiles::Gemm;
  if (threadIdx.x < Gemm::kProducerThreads) {
    device::ptx::setmaxnreg_dec<Gemm::kProducerRegs>();
    producer_role<Tiles>(c, scheduler, first, smem);
  } else {
    device::ptx::setmaxnreg_inc<Gemm::kConsumerRegs>();
    math_role<Tiles>(c, scheduler, profiler, smem);
  }
}

// Shared memory a tile leaves free for the tasks before its GEMM phase (the collect task's plan): all of
// its GEMM's, or what precedes a ring's mbarriers (initialised once per launch).
template <class Gemm>
constexpr int scratch_before_gemm() {
  if constexpr (requires { Gemm::kBarrierOffset; }) return static_cast<int>(Gemm::kBarrierOffset);
  else return static_cast<int>(Gemm::kSmemBytes);
}

// The role tiles of a warp-specialised tile GEMM: bf16 (TileGemmTma) or FP8 (TileGemmTmaFp8).
template <class Gemm>
using RoleTilesOf = std::conditional_t<device::WarpSpecialisedFp8Tile<Gemm>, device::WarpSpecialisedFp8Tiles<Gemm>,
                                       device::WarpSpecialisedTiles<Gemm>>;

// The FP8 split kernel (heuristics.h kTmaFp8M128N256Split), whose Linear2 tiles split over K, and the task
// slots its split may take (task_map.h linear2_call_parts): the CTAs, at most the workspace's split slots.
template <class Gemm>
constexpr bool split_kernel() {
  if constexpr (requires { Gemm::kSplitK; }) return Gemm::kSplitK;
  else return false;
}
template <class Gemm>
inline constexpr bool kSplitKernel = split_kernel<Gemm>();
template <class Gemm>
__device__ __forceinline__ int split_slots(const device::FusedParams& prm) {
  if constexpr (kSplitKernel<Gemm>) return device::split_slot_count(prm);
  else return 0;
}

// Dynamic shared memory the tiles of a tile GEMM use; the CTA's copy of the expert plan follows it
// (FusedContext::plan), when it fits beside them.
template <class Gemm>
constexpr int tile_smem_bytes() {
  if constexpr (device::WarpSpecialisedTile<Gemm> || device::WarpSpecialisedFp8Tile<Gemm>)
    return (RoleTilesOf<Gemm>::kSmemBytes + 15) / 16 * 16;
  else return (device::ExpertTiles<Gemm>::kSmemBytes + 15) / 16 * 16;
}
// Bytes of the CTA's plan copy after tile_smem_bytes: the plan's, rounded up to 16 (one bulk copy), when the
// block then stays within its dynamic shared memory budget (expert_ffn.cuh kBlockSmemBytes less
// kStaticSmemBytes, as the tiles' own static_asserts); 0 when it does not fit and the tasks read the published
// plan. The kernel and its launch shape ask here.
template <class Gemm>
__host__ __device__ constexpr size_t plan_copy_bytes(const device::FusedDims& dims) {
  const size_t plan_bytes = device::plan_copy_bytes16(dims);
  return static_cast<size_t>(tile_smem_bytes<Gemm>()) + plan_bytes + device::kStaticSmemBytes <=
                 static_cast<size_t>(device::kBlockSmemBytes)
             ? plan_bytes : 0;
}

// ---- the CTA program ----
template <class Gemm, class Transport>
__global__ void __launch_bounds__(Gemm::kThreads, 1) fused_moe_kernel(const __grid_constant__ device::FusedParams prm) {
  extern __shared__ __align__(1024) char smem[];
  // Nothing before this wait reads global memory (launch_fused_kernel, common/launch.h): x, the routing
  // and y are the previous kernels' (a norm writes x just before), and the control block (the broken
  // flag, the epoch, the counters) and the symmetric window are the previous call's. The CTA's launch
  // is what overlaps the previous kernel's tail.
  device::ptx::grid_dependency_wait();
  // The next kernel may be launched now: its CTAs take the SMs this grid's CTAs leave (all of this
  // grid's CTAs are resident once each has issued this) and wait in their own prologue for this grid's
  // end. Not in the one-GPU mode, where they could take the SMs another rank's kernel of this call
  // still needs to become resident, and this call waits for that kernel.
  if constexpr (!std::is_same_v<Transport, device::LoopbackTransport>) device::ptx::launch_dependents();
  // A workspace that failed in an earlier call runs nothing; y gets NaN rather than stale values (a
  // graph replay has no host check in between).
  if (device::workspace_broken(prm)) return device::fill_y_with_nan(prm);
  static_assert(device::TileGemmKind<Gemm>, "a tile GEMM of one kind (tile_gemm.cuh)");
  constexpr bool kFp8 = device::WarpSpecialisedFp8Tile<Gemm>;  // weight_format fp8-block128
  constexpr bool kRoles = device::WarpSpecialisedTile<Gemm> || kFp8;
  using Tiles = device::ExpertTiles<Gemm>;
  using RoleTiles = RoleTilesOf<Gemm>;
  if constexpr (kRoles) {
    static_assert(device::RoleTiles<RoleTiles, Transport>, "the roles' interface (expert_ffn.cuh RoleTiles)");
    RoleTiles::init(smem);
  }
  const bool plan_copy = plan_copy_bytes<Gemm>(prm.dims) != 0;
  const auto c =
      device::FusedContext<Transport>::make(prm, plan_copy ? reinterpret_cast<int*>(smem + tile_smem_bytes<Gemm>()) : nullptr);
  device::trace::begin_launch(c.epoch);
  const int nblocks1 = 2 * prm.dims.intermediate / Gemm::kBlockN;
  const int nblocks2 = prm.dims.hidden / Gemm::kBlockN;
  TaskScheduler scheduler(c, kDecodeKernel<Gemm>);
  TaskProfiler profiler(prm.profile);
  for (int pre = 0;; ++pre) {
    const Task task = scheduler.next();
    profiler.after_next(static_cast<int>(Phase::kDone));
    const int rec = pre < device::trace::kPreRecords ? pre : -1;  // the roles' tasks have their own records
    device::trace::open_task(threadIdx.x == 0 && !(kRoles && task.phase >= Phase::kLinear1), rec, task);
    if constexpr (kRoles) {
      if (task.phase >= Phase::kLinear1) {
        // The plan's way to the roles (the producer stamps kTaken in the same record once it runs; a
        // plan_seen of 0 is written as not stamped).
        if (threadIdx.x == 0) {
          device::trace::stamp_at(device::trace::kPreRecords, device::trace::kPlanSeen, scheduler.plan_seen());
          device::trace::stamp(device::trace::kPreRecords, device::trace::kRolesSplit);
        }
        return warp_specialised_roles<RoleTiles>(c, scheduler, profiler, task, smem);
      }
    }
    if (task.phase == Phase::kDone) break;
    switch (task.phase) {
      case Phase::kLayout: device::layout_task<kDecodeKernel<Gemm>>(c, task.index, smem); break;
      case Phase::kPublish: device::publish_task<kDecodeKernel<Gemm>>(c, scheduler.space().layout, smem); break;
      case Phase::kDispatch: device::dispatch_task<kFp8, kDecodeKernel<Gemm>>(c, task.index, scheduler.space(), smem); break;
      case Phase::kCollect:
        device::collect_task<kDecodeKernel<Gemm>, kSplitKernel<Gemm>>(c, Gemm::kBlockM, nblocks1, nblocks2, smem,
                                                                      scratch_before_gemm<Gemm>(), split_slots<Gemm>(prm));
        break;
      case Phase::kLinear1:
        if constexpr (!kRoles) Tiles::linear1(c, task.tile, smem);
        break;
      case Phase::kLinear2:
        if constexpr (!kRoles) Tiles::linear2(c, task.tile, smem);
        break;
      case Phase::kCombine: device::combine_task<kDecodeKernel<Gemm>>(c, task.index, scheduler.space()); break;
      case Phase::kDone: break;
    }
    profiler.after_task(static_cast<int>(task.phase));
    if (threadIdx.x == 0) device::trace::stamp(rec, device::trace::kEnd);
  }
  profiler.flush();
  scheduler.finish();
  if (threadIdx.x == 0) device::trace::end_launch();
}

// The kernel of one tile GEMM under the communicator's transport (transport.cuh): the only place
// the transport is chosen, once per launch on the host. World 1 over NCCL has no peer to signal.
template <class Gemm, class Fn>
void with_kernel(Transport transport, int world, Fn&& fn) {
  switch (transport) {
    case Transport::kNccl:
      if (world == 1) return fn(fused_moe_kernel<Gemm, device::LocalTransport>);
      return fn(fused_moe_kernel<Gemm, device::LsaTransport>);
    case Transport::kLoopback: return fn(fused_moe_kernel<Gemm, device::LoopbackTransport>);
  }
  throw Error(ErrorCode::kInternal, "fused kernel: unknown transport " + std::to_string(static_cast<int>(transport)));
}

// Layout and dispatch scratch lives in the same dynamic smem as the GEMM stages.
size_t scratch_bytes(const device::FusedDims& d) { return (static_cast<size_t>(d.world) + 2u * d.num_experts) * 4; }

// One kernel per shape of kFusedTileShapes; fn gets the tile GEMM (wgmma or mma.sync) of that shape.
template <size_t I>
struct GemmOf {
  static constexpr GemmTileShape S = kFusedTileShapes[I];
  using type = std::conditional_t<
      S.mma == GemmMma::kWgmmaTma, device::TileGemmTma<S.stages>,
      std::conditional_t<S.mma == GemmMma::kWgmma,
                         device::TileGemmWgmma<S.block_m, S.block_n, S.block_k, S.stages, S.warps_m, S.warps_n>,
                         device::TileGemm<S.block_m, S.block_n, S.block_k, S.stages, S.warps_m, S.warps_n>>>;
  static_assert(type::kThreads == S.threads() && type::kBlockM == S.block_m && type::kBlockN == S.block_n,
                "the shape table and the tile GEMM agree");
  static_assert(device::TileGemmKind<type> && device::WarpSpecialisedTile<type> == (S.mma == GemmMma::kWgmmaTma),
                "every mainloop satisfies the tile contract (tile_gemm.cuh) of its kind");
};
template <size_t I>
using GemmAt = typename GemmOf<I>::type;

template <class Fn, size_t... Is>
void with_shape_impl(const GemmTileShape& s, Fn& fn, std::index_sequence<Is...>) {
  const bool found = ((s == kFusedTileShapes[Is] ? (fn(GemmAt<Is>{}), true) : false) || ...);
  if (!found) throw Error(ErrorCode::kInternal, "fused kernel: no instantiation for the chosen GEMM tile shape");
}
// The FP8 kernels (kTmaFp8M128N256, its decode kernel and its split kernel, every weight_format
// fp8-block128 config) besides kFusedTileShapes.
template <class Fn>
void with_shape(const GemmTileShape& s, Fn fn) {
  using Fp8 = device::TileGemmTmaFp8<kTmaFp8M128N256.stages>;
  using Fp8Decode = device::TileGemmTmaFp8Decode<kTmaFp8M128N256Decode.stages>;
  static_assert(device::TileGemmKind<Fp8> && Fp8::kThreads == kTmaFp8M128N256.threads() && !Fp8::kDecodeForm);
  static_assert(device::TileGemmKind<Fp8Decode> && Fp8Decode::kThreads == kTmaFp8M128N256Decode.threads() &&
                Fp8Decode::kDecodeForm);
  // The decode kernel's CTAs copy the expert plan into the shared memory its tiles leave (plan_copy_bytes); where
  // it does not fit, its tasks read the published plan, and 16 KB more of the tiles' cost the decode rows 4-5%
  // that way (docs/performance.md#the-decode-k-blocks-split-between-the-math-warpgroups-2026-12-02-not-kept).
  // Room kept for 128 local experts at world 8.
  static_assert(plan_copy_bytes<Fp8Decode>(device::FusedDims{8, 0, 0, 8 * 128, 8, 0}) != 0,
                "the decode kernel's tiles leave room for the CTA's plan copy");
  if (s == kTmaFp8M128N256) return fn(Fp8{});
  if (s == kTmaFp8M128N256Decode) return fn(Fp8Decode{});
  using Fp8Split = device::TileGemmTmaFp8Split<kTmaFp8M128N256Split.stages>;
  static_assert(device::TileGemmKind<Fp8Split> && Fp8Split::kThreads == kTmaFp8M128N256Split.threads() &&
                Fp8Split::kDecodeForm && Fp8Split::kSplitK && !Fp8Decode::kSplitK);
  static_assert(plan_copy_bytes<Fp8Split>(device::FusedDims{8, 0, 0, 8 * 128, 8, 0}) != 0,
                "the split kernel's tiles leave room for the CTA's plan copy");
  if (s == kTmaFp8M128N256Split) return fn(Fp8Split{});
  with_shape_impl(s, fn, std::make_index_sequence<std::size(kFusedTileShapes)>{});
}

}  // namespace

KernelShape fused_kernel_shape(const GemmTileShape& tile, const device::FusedDims& dims) {
  KernelShape ks{};
  with_shape(tile, [&](auto gemm) {
    using Gemm = decltype(gemm);
    ks.threads = Gemm::kThreads;
    ks.smem_bytes = std::max(static_cast<size_t>(tile_smem_bytes<Gemm>()) + plan_copy_bytes<Gemm>(dims), scratch_bytes(dims));
  });
  return ks;
}

int prepare_fused_kernel(Transport transport, const GemmTileShape& tile, const device::FusedDims& dims) {
  int blocks_per_sm = 0;
  with_shape(tile, [&](auto gemm) {
    const KernelShape ks = fused_kernel_shape(tile, dims);
    with_kernel<decltype(gemm)>(transport, dims.world, [&](auto kernel) {
      // The kernel's dynamic shared memory must fit what a block may have: say so by numbers rather than
      // through the launch's cudaErrorInvalidValue.
      const size_t allowed = detail::allow_all_dynamic_smem(kernel);
      if (ks.smem_bytes > allowed)
        throw Error(ErrorCode::kUnsupported,
                    "fused kernel (block_m " + std::to_string(tile.block_m) + ", block_k " + std::to_string(tile.block_k) +
                        "): " + std::to_string(ks.smem_bytes) + " B of dynamic shared memory exceed the " +
                        std::to_string(allowed) + " B this GPU leaves a block beside the kernel's static shared memory");
      EPFUSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, ks.threads, ks.smem_bytes));
    });
  });
  return blocks_per_sm;
}

int lsa_team_size(ncclComm_t comm) { return ncclTeamLsa(comm).nRanks; }

#ifdef EPFUSE_TRACE
// The diagnostic timeline (device/diagnostics/trace.cuh): of each distinct problem (rank, dims, tokens, kernel) this
// process launches, launches EPFUSE_TRACE_LAUNCH (default 20, so after warm-up) to EPFUSE_TRACE_LAUNCH +
// trace::kLaunches - 1 are recorded, back to back, and appended to the CSV file EPFUSE_TRACE_FILE (no
// file: nothing is recorded): one row per task record and one per CTA span (rec -1), stamps in
// %globaltimer nanoseconds; tools/bench/trace_export.h reads them.
class LaunchTrace {
 public:
  // Before a launch: whether it is the last one to record (then the caller calls after() once it is
  // launched); the first one to record clears the records.
  bool before(const device::FusedParams& prm, const GemmTileShape& tile, cudaStream_t stream) {
    if (!env::text("EPFUSE_TRACE_FILE")) return false;
    const int first = env::trace_launch();
    const int n = ++launches_[key(prm, tile)];
    if (n == first) {
      void* at = nullptr;
      EPFUSE_CUDA_CHECK(cudaGetSymbolAddress(&at, device::trace::g_records));
      EPFUSE_CUDA_CHECK(cudaMemsetAsync(at, 0, sizeof(device::trace::g_records), stream));
      EPFUSE_CUDA_CHECK(cudaGetSymbolAddress(&at, device::trace::g_spans));
      EPFUSE_CUDA_CHECK(cudaMemsetAsync(at, 0, sizeof(device::trace::g_spans), stream));
    }
    return n == first + device::trace::kLaunches - 1;
  }
  // After the last recorded launch: waits for it and appends the records of all kLaunches.
  void after(const device::FusedParams& prm, const GemmTileShape& tile, int grid, cudaStream_t stream) {
    using device::trace::kLaunches;
    using device::trace::kMaxCtas;
    using device::trace::kMaxRecords;
    using device::trace::Record;
    using device::trace::Span;
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    std::vector<Record> rec(static_cast<size_t>(kLaunches) * kMaxCtas * kMaxRecords);
    std::vector<Span> spans(static_cast<size_t>(kLaunches) * kMaxCtas);
    EPFUSE_CUDA_CHECK(cudaMemcpyFromSymbol(rec.data(), device::trace::g_records, rec.size() * sizeof(Record)));
    EPFUSE_CUDA_CHECK(cudaMemcpyFromSymbol(spans.data(), device::trace::g_spans, spans.size() * sizeof(Span)));
    std::FILE* f = std::fopen(env::text("EPFUSE_TRACE_FILE").value_or("").c_str(), "a");
    if (f == nullptr) throw Error(ErrorCode::kInvalidArgument, "EPFUSE_TRACE_FILE cannot be opened");
    // Every rank's process appends to the one file: whole blocks of lines, one rank at a time (the lock
    // holds until fclose has written the buffered lines out).
    if (flock(fileno(f), LOCK_EX) != 0) {
      std::fclose(f);
      throw Error(ErrorCode::kInternal, "EPFUSE_TRACE_FILE cannot be locked");
    }
    // Launches numbered in time order (the slots go round with the epoch).
    std::vector<std::pair<uint64_t, int>> order;
    for (int l = 0; l < kLaunches; ++l) order.push_back({spans[static_cast<size_t>(l) * kMaxCtas].start, l});
    std::sort(order.begin(), order.end());
    const auto ns = [](uint64_t t) { return t == 0 ? -1ll : static_cast<long long>(t); };
    const int ctas = std::min(grid, kMaxCtas);
    for (int launch = 0; launch < kLaunches; ++launch) {
      const int slot = order[static_cast<size_t>(launch)].second;
      const auto prefix = [&](int cta, int smid, int r, int phase, int index, int e, int mb, int nb) {
        std::fprintf(f, "%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d,%d", prm.rank, prm.dims.hidden, prm.dims.intermediate,
                     prm.dims.num_experts, prm.num_tokens, static_cast<int>(tile.mma), launch, cta, smid, r, phase,
                     index, e, mb, nb);
      };
      for (int cta = 0; cta < ctas; ++cta) {
        const Span& sp = spans[static_cast<size_t>(slot) * kMaxCtas + cta];
        if (sp.start != 0) {
          prefix(cta, sp.smid, -1, -1, 0, 0, 0, 0);
          for (int s = 0; s < device::trace::kStamps; ++s)
            std::fprintf(f, ",%lld", s == 0 ? ns(sp.start) : s == device::trace::kEnd ? ns(sp.end) : -1ll);
          std::fprintf(f, "\n");
        }
        for (int i = 0; i < kMaxRecords; ++i) {
          const Record& r = rec[(static_cast<size_t>(slot) * kMaxCtas + cta) * kMaxRecords + i];
          if (std::all_of(std::begin(r.t), std::end(r.t), [](uint64_t t) { return t == 0; })) continue;
          prefix(cta, r.smid, i, r.phase, r.index, r.expert, r.mblock, r.nblock);
          for (uint64_t t : r.t) std::fprintf(f, ",%lld", ns(t));
          std::fprintf(f, "\n");
        }
      }
    }
    std::fclose(f);
  }

 private:
  static std::tuple<int, int, int, int, int, int, int> key(const device::FusedParams& prm, const GemmTileShape& tile) {
    return std::make_tuple(prm.rank, prm.dims.hidden, prm.dims.intermediate, prm.dims.num_experts, prm.dims.world,
                           prm.num_tokens, static_cast<int>(tile.mma));
  }
  std::map<std::tuple<int, int, int, int, int, int, int>, int> launches_;
};
#endif

void launch_fused_kernel(Transport transport, const GemmTileShape& tile, const device::FusedParams& prm, int grid,
                         bool programmatic, cudaStream_t stream) {
#ifdef EPFUSE_TRACE
  static LaunchTrace trace;
  const bool traced = trace.before(prm, tile, stream);
#endif
  with_shape(tile, [&](auto gemm) {
    const KernelShape ks = fused_kernel_shape(tile, prm.dims);
    with_kernel<decltype(gemm)>(transport, prm.dims.world, [&](auto kernel) {
      detail::launch_kernel(kernel, grid, ks.threads, ks.smem_bytes, stream, programmatic, prm);
    });
  });
#ifdef EPFUSE_TRACE
  if (traced) trace.after(prm, tile, grid, stream);
#endif
}

}  // namespace epfuse::fused
