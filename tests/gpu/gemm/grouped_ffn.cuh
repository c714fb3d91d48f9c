// A grouped expert FFN on one GPU composed from the fused kernel's GEMM pieces (TileGemm, the SwiGLU
// epilogue, the tile-shape heuristics), shared by the correctness test and the microbenchmark:
//   h[r]   = bf16( swiglu(W1_e x[token(r)], W3_e x[token(r)]; clamp) * weight(r) )   Linear1 + SwiGLU
//   out[r] = W2_e h[r]                                                               Linear2, fp32
// for every row r of expert e (rows of expert e are [offset[e], offset[e+1]), gathered from a token
// pool through row_token). Each kernel is persistent: a CTA computes tile after tile, so TileGemm is
// exercised the way the fused kernel calls it.
#pragma once
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <vector>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "device/ffn/epilogue.cuh"
#include "device/gemm/gemm_mainloop.cuh"
#include "device/gemm/gemm_mainloop_wgmma.cuh"
#include "fused/heuristics.h"

namespace epfuse::test {

struct GroupedFfnArgs {
  const __nv_bfloat16* x_pool;  // [pool_tokens, H]
  const int* row_token;         // [rows] token of each expert row
  const float* row_weight;      // [rows] top-k weight of each row
  const int* expert_offset;     // [E + 1]
  const __nv_bfloat16* w13;     // [E, 2I, H]
  const __nv_bfloat16* w2;      // [E, H, I]
  __nv_bfloat16* h;             // [rows, I]
  float* out;                   // [rows, H]
  const int4* tiles1;           // Linear1 tiles (expert, m_block, n_block): n_block of 2I tile columns
  int num_tiles1;
  const int4* tiles2;           // Linear2 tiles: n_block of H columns
  int num_tiles2;
  int H;
  int I;
  float clamp;
};

template <class Gemm>
__global__ void __launch_bounds__(Gemm::kThreads, 1) linear1_swiglu_kernel(GroupedFfnArgs args) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int64_t two_i = 2 * static_cast<int64_t>(args.I);
  for (int t = blockIdx.x; t < args.num_tiles1; t += gridDim.x) {
    const int4 tile = args.tiles1[t];
    const int expert = tile.x;
    const int row0 = args.expert_offset[expert] + tile.y * Gemm::kBlockM;
    const int rows = min(Gemm::kBlockM, args.expert_offset[expert + 1] - row0);
    const int n_out0 = tile.z * (Gemm::kBlockN / 2);
    auto a_row = [&](int i) -> const __nv_bfloat16* {
      return i < rows ? args.x_pool + static_cast<int64_t>(args.row_token[row0 + i]) * args.H : nullptr;
    };
    typename Gemm::Accum acc;
    Gemm::mainloop(a_row, device::swiglu_b_row(args.w13 + expert * two_i * args.H, args.H, args.I, n_out0),
                   args.H, smem, acc);
    device::visit_swiglu<Gemm>(acc, args.clamp, [&](int row, int out_col, float h0, float h1) {
      if (row < rows) {
        const float w = args.row_weight[row0 + row];
        auto* dst = args.h + static_cast<int64_t>(row0 + row) * args.I + n_out0 + out_col;
        *reinterpret_cast<uint32_t*>(dst) = device::ptx::pack_bf16x2(h0 * w, h1 * w);
      }
    });
  }
}

template <class Gemm>
__global__ void __launch_bounds__(Gemm::kThreads, 1) linear2_kernel(GroupedFfnArgs args) {
  extern __shared__ __align__(128) uint8_t smem[];
  for (int t = blockIdx.x; t < args.num_tiles2; t += gridDim.x) {
    const int4 tile = args.tiles2[t];
    const int expert = tile.x;
    const int row0 = args.expert_offset[expert] + tile.y * Gemm::kBlockM;
    const int rows = min(Gemm::kBlockM, args.expert_offset[expert + 1] - row0);
    const int n0 = tile.z * Gemm::kBlockN;
    auto a_row = [&](int i) -> const __nv_bfloat16* {
      return i < rows ? args.h + static_cast<int64_t>(row0 + i) * args.I : nullptr;
    };
    typename Gemm::Accum acc;
    Gemm::mainloop(a_row, device::dense_b_row(args.w2 + static_cast<int64_t>(expert) * args.H * args.I, args.I, n0),
                   args.I, smem, acc);
    Gemm::visit(acc, [&](int row, int col, float v0, float v1) {
      if (row < rows) device::ptx::st_cs_v2_f32(args.out + static_cast<int64_t>(row0 + row) * args.H + n0 + col, v0, v1);
    });
  }
}

// Tiles (expert, m_block, n_block) in expert-major, then n-block, then m-block order: consecutive CTAs
// share a weight tile (B), read once from HBM and then from L2.
inline std::vector<int4> make_tiles(const std::vector<int>& expert_offset, int block_m, int n_blocks) {
  std::vector<int4> tiles;
  for (size_t e = 0; e + 1 < expert_offset.size(); ++e) {
    const int m_blocks = (expert_offset[e + 1] - expert_offset[e] + block_m - 1) / block_m;
    for (int nb = 0; nb < n_blocks; ++nb)
      for (int mb = 0; mb < m_blocks; ++mb) tiles.push_back(int4{static_cast<int>(e), mb, nb, 0});
  }
  return tiles;
}

// The tile GEMM of a shape: TileGemm (mma.sync) or TileGemmWgmma, by shape.mma.
template <fused::GemmTileShape kShape>
using TileGemmOf = std::conditional_t<
    kShape.mma == fused::GemmMma::kWgmma,
    device::TileGemmWgmma<kShape.block_m, kShape.block_n, kShape.block_k, kShape.stages, kShape.warps_m,
                          kShape.warps_n>,
    device::TileGemm<kShape.block_m, kShape.block_n, kShape.block_k, kShape.stages, kShape.warps_m,
                     kShape.warps_n>>;

// Every shape the test and the benchmark cover: the kernel's mma.sync shape, then the wgmma ones.
inline std::vector<fused::GemmTileShape> all_tile_shapes() {
  std::vector<fused::GemmTileShape> shapes{fused::kTileM32};
  shapes.insert(shapes.end(), std::begin(fused::kWgmmaTileShapes), std::end(fused::kWgmmaTileShapes));
  return shapes;
}

// Calls f.template operator()<Gemm>() with the tile GEMM instantiated for `shape` (one of
// all_tile_shapes()); returns false for any other shape.
template <class F>
bool with_tile_gemm(const fused::GemmTileShape& shape, F&& f) {
  if (shape == fused::kWgmmaM128N256) { f.template operator()<TileGemmOf<fused::kWgmmaM128N256>>(); return true; }
  if (shape == fused::kWgmmaM128N128) { f.template operator()<TileGemmOf<fused::kWgmmaM128N128>>(); return true; }
  if (shape == fused::kTileM32) { f.template operator()<TileGemmOf<fused::kTileM32>>(); return true; }
  return false;
}

// A device copy of a host vector (one element at least: never a null pointer).
template <class T>
detail::DeviceArray<T> upload(const std::vector<T>& v) {
  detail::DeviceArray<T> d(v.empty() ? 1 : v.size());
  if (!v.empty()) EPFUSE_CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// The device buffers of one grouped FFN problem (shapes as in GroupedFfnArgs), owned here;
// args() points a GroupedFfnArgs at them (tiles and clamp left to the caller).
struct GroupedFfnBuffers {
  detail::DeviceArray<__nv_bfloat16> x_pool, w13, w2, h;
  detail::DeviceArray<int> row_token, expert_offset;
  detail::DeviceArray<float> row_weight, out;

  GroupedFfnArgs args(int H, int I) const {
    GroupedFfnArgs a{};
    a.x_pool = x_pool.get();
    a.row_token = row_token.get();
    a.row_weight = row_weight.get();
    a.expert_offset = expert_offset.get();
    a.w13 = w13.get();
    a.w2 = w2.get();
    a.h = h.get();
    a.out = out.get();
    a.H = H;
    a.I = I;
    return a;
  }
};

// Device tile lists for one shape, built once per problem (the benchmark reuses them across runs).
struct TilePlan {
  detail::DeviceArray<int4> tiles1;  // one more than num_tiles1: never empty
  detail::DeviceArray<int4> tiles2;
  int num_tiles1 = 0;
  int num_tiles2 = 0;
};

inline TilePlan make_tile_plan(const fused::GemmTileShape& shape, const std::vector<int>& expert_offset, int H, int I) {
  TilePlan plan;
  const std::vector<int4> t1 = make_tiles(expert_offset, shape.block_m, 2 * I / shape.block_n);
  const std::vector<int4> t2 = make_tiles(expert_offset, shape.block_m, H / shape.block_n);
  plan.num_tiles1 = static_cast<int>(t1.size());
  plan.num_tiles2 = static_cast<int>(t2.size());
  plan.tiles1 = detail::DeviceArray<int4>(t1.size() + 1);
  plan.tiles2 = detail::DeviceArray<int4>(t2.size() + 1);
  EPFUSE_CUDA_CHECK(cudaMemcpy(plan.tiles1.get(), t1.data(), t1.size() * sizeof(int4), cudaMemcpyHostToDevice));
  EPFUSE_CUDA_CHECK(cudaMemcpy(plan.tiles2.get(), t2.data(), t2.size() * sizeof(int4), cudaMemcpyHostToDevice));
  return plan;
}

enum FfnPhases : int { kLinear1 = 1, kLinear2 = 2, kBothLinears = 3 };

// Linear1 + SwiGLU then Linear2 (or one of them) with tile shape `shape`, persistent grids of
// `num_ctas` CTAs.
inline void run_grouped_ffn(const fused::GemmTileShape& shape, GroupedFfnArgs args, const TilePlan& plan,
                            int num_ctas, cudaStream_t stream, int phases = kBothLinears) {
  args.tiles1 = plan.tiles1.get();
  args.num_tiles1 = plan.num_tiles1;
  args.tiles2 = plan.tiles2.get();
  args.num_tiles2 = plan.num_tiles2;
  const bool known = with_tile_gemm(shape, [&]<class Gemm>() {
    EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(linear1_swiglu_kernel<Gemm>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, Gemm::kSmemBytes));
    EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(linear2_kernel<Gemm>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           Gemm::kSmemBytes));
    if ((phases & kLinear1) && plan.num_tiles1 > 0) {
      linear1_swiglu_kernel<Gemm><<<num_ctas, Gemm::kThreads, Gemm::kSmemBytes, stream>>>(args);
      EPFUSE_CUDA_CHECK_LAUNCH();
    }
    if ((phases & kLinear2) && plan.num_tiles2 > 0) {
      linear2_kernel<Gemm><<<num_ctas, Gemm::kThreads, Gemm::kSmemBytes, stream>>>(args);
      EPFUSE_CUDA_CHECK_LAUNCH();
    }
  });
  EPFUSE_REQUIRE(known, ErrorCode::kInternal, "run_grouped_ffn: tile shape without a TileGemm instantiation");
}

}  // namespace epfuse::test
