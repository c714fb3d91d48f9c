// The all-thread tiles' operand copies (gemm_mainloop.cuh TileGemm, gemm_mainloop_wgmma.cuh TileGemmWgmma):
// every k-block each of the kThreads threads copies the same (row, chunk) slots of a stage by cp.async,
// slot `index` = tid + i * kThreads (gemm_maps.h load_row / load_chunk / smem_chunk_offset: the XOR
// swizzle, which at kBlockK = 64 is the hardware's 128-byte one). Row pointers are resolved once per tile,
// so the gather (a_row) costs one lookup per row per tile, not per k-block. Padding rows of A (a_row
// returns nullptr) are zeroed once in every stage; no copy writes them during the tile. Destinations are
// recomputed at each use (they fold into immediate offsets), which keeps registers for the accumulators.
#pragma once
#include <cstdint>

#include <cuda_bf16.h>

#include "device/gemm/gemm_maps.h"
#include "device/ptx/ptx.cuh"

namespace epfuse::device {

template <int kBlockM, int kBlockN, int kBlockK, int kThreads, int kStages>
struct StageCopies {
  static constexpr int kChunksPerRow = kBlockK / kChunkElems;
  // 16-byte chunks each thread copies per stage (the last pass may be partial for a small A tile).
  static constexpr int kLoadsA = (kBlockM * kChunksPerRow + kThreads - 1) / kThreads;
  static constexpr int kLoadsB = (kBlockN * kChunksPerRow + kThreads - 1) / kThreads;
  static_assert((kBlockN * kChunksPerRow) % kThreads == 0, "B tile chunks must spread evenly");
  static_assert(kLoadsA <= 32, "copy_a is a 32-bit mask");

  const __nv_bfloat16* src_a[kLoadsA];
  const __nv_bfloat16* src_b[kLoadsB];
  uint32_t copy_a = 0;  // bit i: load i of A is a real row

  // Element offset within a stage of copy slot `index`.
  __device__ static int offset(int index) {
    return smem_chunk_offset(load_row(index, kBlockK), load_chunk(index, kBlockK), kBlockK);
  }

  // smem_a: the first A stage, A stages stage_stride elements of T apart (the padding rows' zeros go there;
  // T is the caller's view of shared memory, bf16 elements or bytes).
  template <class ARow, class BRow, class T>
  __device__ __forceinline__ void resolve(int tid, ARow a_row, BRow b_row, T* smem_a, int stage_stride) {
    static_assert(sizeof(__nv_bfloat16) % sizeof(T) == 0, "a bf16 element is a whole number of T");
    constexpr int kPerElem = sizeof(__nv_bfloat16) / sizeof(T);
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i) {
      const int index = tid + i * kThreads;
      src_a[i] = nullptr;
      if (index < kBlockM * kChunksPerRow) {
        const int chunk = load_chunk(index, kBlockK);
        const __nv_bfloat16* src = a_row(load_row(index, kBlockK));
        if (src != nullptr) {
          src_a[i] = src + chunk * kChunkElems;
          copy_a |= 1u << i;
        } else {
#pragma unroll
          for (int s = 0; s < kStages; ++s)
            *reinterpret_cast<int4*>(smem_a + s * stage_stride + kPerElem * offset(index)) = int4{0, 0, 0, 0};
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i) {
      const int index = tid + i * kThreads;
      src_b[i] = b_row(load_row(index, kBlockK)) + load_chunk(index, kBlockK) * kChunkElems;
    }
  }

  // K elements [k0, k0 + kBlockK) of every slot into the stage at shared addresses stage_a / stage_b;
  // b_read_once: B's copies carry the L2 policy b_policy (evict_first).
  __device__ __forceinline__ void load(int tid, int k0, uint32_t stage_a, uint32_t stage_b, bool b_read_once,
                                       uint64_t b_policy) const {
#pragma unroll
    for (int i = 0; i < kLoadsA; ++i)
      if (copy_a & (1u << i)) ptx::cp_async_16(stage_a + 2u * offset(tid + i * kThreads), src_a[i] + k0);
#pragma unroll
    for (int i = 0; i < kLoadsB; ++i)
      ptx::cp_async_16(stage_b + 2u * offset(tid + i * kThreads), src_b[i] + k0, b_read_once, b_policy);
  }
};

}  // namespace epfuse::device
