// The fused MoE kernel: one persistent launch per forward, composing the device pieces by role
// (layout, dispatch, expert tiles, combine) under the task scheduler. One instantiation per shape of
// heuristics.h's kFusedTileShapes (TileGemmTma, TileGemmWgmma or TileGemm); the host picks one per call
// from the expected rows per expert. With the warp-specialised TileGemmTma a CTA hands its GEMM and
// combine tasks to the GEMM region (gemm_region.cuh: producer and math warpgroups); with the others
// every thread runs every task.
#include "fused/fused_kernel.h"

#include <algorithm>
#include <iterator>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

#include "common/check.h"
#include "device/combine.cuh"
#include "device/context.cuh"
#include "device/dispatch.cuh"
#include "device/expert_ffn.cuh"
#include "device/gemm_mainloop.cuh"
#include "device/gemm_mainloop_wgmma.cuh"
#include "device/gemm_mainloop_tma.cuh"
#include "device/gemm_region.cuh"
#include "device/layout.cuh"
#include "device/profile.cuh"
#include "device/scheduler.cuh"

namespace epfuse::fused {
namespace {

using device::Phase;

template <class Gemm, class Transport>
__global__ void __launch_bounds__(Gemm::kThreads, 1) fused_moe_kernel(const __grid_constant__ device::FusedParams prm) {
  extern __shared__ __align__(1024) char smem[];
  // A workspace that failed in an earlier call runs nothing; y gets NaN rather than stale values (a
  // graph replay has no host check in between).
  if (device::workspace_broken(prm)) return device::fill_y_with_nan(prm);
  constexpr bool kRegion = requires { Gemm::kWarpSpecialised; };
  using Tiles = device::ExpertTiles<Gemm>;
  if constexpr (kRegion) device::GemmRegion<Gemm>::init(smem);
  const auto c = device::FusedContext<Transport>::make(prm);
  const int nblocks1 = 2 * prm.dims.intermediate / Gemm::kBlockN;
  const int nblocks2 = prm.dims.hidden / Gemm::kBlockN;
  device::TaskScheduler scheduler(c);
  device::TaskProfiler profiler(prm.profile);
  for (;;) {
    const device::Task task = scheduler.next();
    profiler.after_next(static_cast<int>(Phase::kDone));
    if constexpr (kRegion) {
      if (task.phase >= Phase::kLinear1) return device::GemmRegion<Gemm>::run(c, scheduler, profiler, task, smem);
    }
    if (task.phase == Phase::kDone) break;
    switch (task.phase) {
      case Phase::kLayout: device::layout_task(c, task.index, smem); break;
      case Phase::kPublish: device::publish_task(c, scheduler.space().layout); break;
      case Phase::kDispatch: device::dispatch_task(c, task.index, scheduler.space().layout, smem); break;
      case Phase::kCollect: device::collect_task(c, Gemm::kBlockM, nblocks1, nblocks2); break;
      case Phase::kLinear1:
        if constexpr (!kRegion) Tiles::linear1(c, task.tile, smem);
        break;
      case Phase::kLinear2:
        if constexpr (!kRegion) Tiles::linear2(c, task.tile, smem);
        break;
      case Phase::kCombine: device::combine_task(c, task.index); break;
      case Phase::kDone: break;
    }
    profiler.after_task(static_cast<int>(task.phase));
  }
  profiler.flush();
  scheduler.finish();
}

// The kernel of one tile GEMM under the communicator's transport (transport.cuh): the only place
// the transport is chosen, once per launch on the host.
template <class Gemm, class Fn>
void with_kernel(Transport transport, Fn&& fn) {
  switch (transport) {
    case Transport::kNccl: return fn(fused_moe_kernel<Gemm, device::LsaTransport>);
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
};
template <size_t I>
using GemmAt = typename GemmOf<I>::type;

template <class Fn, size_t... Is>
void with_shape_impl(const GemmTileShape& s, Fn& fn, std::index_sequence<Is...>) {
  const bool found = ((s == kFusedTileShapes[Is] ? (fn(GemmAt<Is>{}), true) : false) || ...);
  if (!found) throw Error(ErrorCode::kInternal, "fused kernel: no instantiation for the chosen GEMM tile shape");
}
template <class Fn>
void with_shape(const GemmTileShape& s, Fn fn) {
  with_shape_impl(s, fn, std::make_index_sequence<std::size(kFusedTileShapes)>{});
}

}  // namespace

KernelShape fused_kernel_shape(const GemmTileShape& tile, const device::FusedDims& dims) {
  KernelShape ks{};
  with_shape(tile, [&](auto gemm) {
    using Gemm = decltype(gemm);
    ks.threads = Gemm::kThreads;
    constexpr int kTileSmem = [] {
      if constexpr (requires { Gemm::kWarpSpecialised; }) return device::GemmRegion<Gemm>::kSmemBytes;
      else return device::ExpertTiles<Gemm>::kSmemBytes;
    }();
    ks.smem_bytes = std::max(static_cast<size_t>(kTileSmem), scratch_bytes(dims));
  });
  return ks;
}

int prepare_fused_kernel(Transport transport, const GemmTileShape& tile, const device::FusedDims& dims) {
  int blocks_per_sm = 0;
  with_shape(tile, [&](auto gemm) {
    const KernelShape ks = fused_kernel_shape(tile, dims);
    with_kernel<decltype(gemm)>(transport, [&](auto kernel) {
      EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(ks.smem_bytes)));
      EPFUSE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks_per_sm, kernel, ks.threads, ks.smem_bytes));
    });
  });
  return blocks_per_sm;
}

int lsa_team_size(ncclComm_t comm) { return ncclTeamLsa(comm).nRanks; }

void launch_fused_kernel(Transport transport, const GemmTileShape& tile, const device::FusedParams& prm, int grid,
                         cudaStream_t stream) {
  with_shape(tile, [&](auto gemm) {
    const KernelShape ks = fused_kernel_shape(tile, prm.dims);
    with_kernel<decltype(gemm)>(transport, [&](auto kernel) {
      kernel<<<grid, ks.threads, ks.smem_bytes, stream>>>(prm);
      EPFUSE_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace epfuse::fused
