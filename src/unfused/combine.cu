// Combine: pre-reduce a received token's expert rows before they travel back, then reduce at home.
#include "common/check.h"
#include "unfused/kernels.h"
#include "unfused/vec.cuh"

namespace epfuse::unfused {
namespace {

constexpr int kReduceThreads = 256;  // one token per warp
constexpr int kReduceWarps = kReduceThreads / kWarp;

// out[H] = sum in fp32 of the rows at sources[0, kMaxTopk) (nullptr: none), as bf16. Summation in
// slot order keeps the result independent of where the rows happen to lie.
__device__ __forceinline__ void sum_rows(const bf16* const (&sources)[kMaxTopk], bf16* out, int hidden, int lane) {
  const int row_vecs = hidden / kVec;
  int count = 0;
  const bf16* single = nullptr;
#pragma unroll
  for (int j = 0; j < kMaxTopk; ++j)
    if (sources[j] != nullptr) {
      ++count;
      single = sources[j];
    }
  // One source (most records and tokens at top-2, e.g. mixtral): a plain copy. bf16 -> fp32 -> bf16
  // is exact, so it gives the sum's bits (up to the sign of a zero) without the conversions and the
  // 16 per-vector source tests.
  if (count == 1) {
    for (int v = lane; v < row_vecs; v += kWarp)
      reinterpret_cast<uint4*>(out)[v] = reinterpret_cast<const uint4*>(single)[v];
    return;
  }
  for (int v = lane; v < row_vecs; v += kWarp) {
    Vec8 acc{};
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j)
      if (sources[j] != nullptr) add(acc, reinterpret_cast<const uint4*>(sources[j])[v]);
    reinterpret_cast<uint4*>(out)[v] = to_bf16(acc);
  }
}

__global__ void __launch_bounds__(kReduceThreads) pre_reduce_kernel(ChainShape s, const bf16* __restrict__ expert_out,
                                                                     const int32_t* __restrict__ token_rows,
                                                                     int num_records, bf16* __restrict__ combine_rows) {
  const int lane = threadIdx.x % kWarp;
  for (int64_t record = int64_t{blockIdx.x} * kReduceWarps + threadIdx.x / kWarp; record < num_records;
       record += int64_t{gridDim.x} * kReduceWarps) {
    const bf16* sources[kMaxTopk];
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j) {
      const int32_t row = j < s.topk ? token_rows[record * s.topk + j] : -1;
      sources[j] = row >= 0 ? expert_out + int64_t{row} * s.hidden : nullptr;
    }
    sum_rows(sources, combine_rows + record * s.hidden, s.hidden, lane);
  }
}

__global__ void __launch_bounds__(kReduceThreads) home_reduce_kernel(ChainShape s, const bf16* __restrict__ returned_rows,
                                                                      const int32_t* __restrict__ topk_idx,
                                                                      const int32_t* __restrict__ send_counts,
                                                                      const int32_t* __restrict__ send_slot,
                                                                      int num_tokens, bf16* __restrict__ y) {
  extern __shared__ int64_t dest_offset_smem[];  // [R]: first returned row of each destination
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x)
    dest_offset_smem[d] = peer_record_offset(send_counts, s.counts_words, d);
  __syncthreads();
  const int lane = threadIdx.x % kWarp;
  for (int64_t token = int64_t{blockIdx.x} * kReduceWarps + threadIdx.x / kWarp; token < num_tokens;
       token += int64_t{gridDim.x} * kReduceWarps) {
    const int32_t* experts = topk_idx + token * s.topk;
    const bf16* sources[kMaxTopk];
#pragma unroll
    for (int j = 0; j < kMaxTopk; ++j) {
      sources[j] = nullptr;
      if (j < s.topk && first_slot_for_rank(experts, j, s.num_experts, s.experts_per_rank)) {
        const int dest = rank_of_expert(experts[j], s.experts_per_rank);
        sources[j] = returned_rows + (dest_offset_smem[dest] + send_slot[token * s.world_size + dest]) * s.hidden;
      }
    }
    sum_rows(sources, y + token * s.hidden, s.hidden, lane);  // no destination: a row of zeros
  }
}

}  // namespace

void launch_pre_reduce(const ChainShape& s, const bf16* expert_out, const int32_t* token_rows, int num_records,
                       bf16* combine_rows, cudaStream_t stream) {
  if (num_records == 0) return;
  const int grid = grid_blocks(num_records, kReduceWarps, s.sm_count, 8);
  pre_reduce_kernel<<<grid, kReduceThreads, 0, stream>>>(s, expert_out, token_rows, num_records, combine_rows);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

void launch_home_reduce(const ChainShape& s, const bf16* returned_rows, const int32_t* topk_idx,
                        const int32_t* send_counts, const int32_t* send_slot, int num_tokens, bf16* y,
                        cudaStream_t stream) {
  if (num_tokens == 0) return;
  const size_t smem = static_cast<size_t>(s.world_size) * sizeof(int64_t);
  const int grid = grid_blocks(num_tokens, kReduceWarps, s.sm_count, 8);
  home_reduce_kernel<<<grid, kReduceThreads, smem, stream>>>(s, returned_rows, topk_idx, send_counts, send_slot,
                                                             num_tokens, y);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::unfused
