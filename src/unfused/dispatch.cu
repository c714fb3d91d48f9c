// The sender's side of dispatch: layout (where each token goes) and pack (its records).
#include "common/check.h"
#include "common/launch.h"
#include "unfused/kernels.h"
#include "unfused/vec.cuh"

namespace epfuse::unfused {
namespace {

constexpr int kLayoutThreads = 256;  // one token per thread
constexpr int kPackThreads = 256;    // one token per warp
constexpr int kPackWarps = kPackThreads / kWarp;

__device__ __forceinline__ unsigned lanemask_lt() {
  unsigned mask;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(mask));
  return mask;
}

// Rows per global expert are counted in shared memory and flushed once per block, so the global
// atomics are per (block, expert), not per slot. Record positions come from one atomic per warp and
// destination (lanes with the same destination agree with __match_any_sync).
__global__ void __launch_bounds__(kLayoutThreads) layout_kernel(ChainShape s, const int32_t* __restrict__ topk_idx,
                                                                 int num_tokens, int32_t* send_counts,
                                                                 int32_t* __restrict__ send_slot,
                                                                 unsigned long long* error_key) {
  extern __shared__ int32_t expert_rows_smem[];  // [E]
  for (int e = threadIdx.x; e < s.num_experts; e += blockDim.x) expert_rows_smem[e] = 0;
  __syncthreads();

  const int lane = threadIdx.x % kWarp;
  // The loop bound is uniform over the block: whole warps stay converged for __match_any_sync.
  for (int64_t first = int64_t{blockIdx.x} * blockDim.x; first < num_tokens; first += int64_t{gridDim.x} * blockDim.x) {
    const int64_t token = first + threadIdx.x;
    const bool live = token < num_tokens;
    const int32_t* experts = topk_idx + (live ? token : 0) * s.topk;
    for (int slot = 0; slot < s.topk; ++slot) {
      int dest = -1;
      if (live) {
        const int32_t expert = experts[slot];
        if (routed(expert, s.num_experts)) {
          atomicAdd(&expert_rows_smem[expert], 1);
          if (first_slot_for_rank(experts, slot, s.num_experts, s.experts_per_rank))
            dest = rank_of_expert(expert, s.experts_per_rank);
        } else if (expert != -1) {
          atomicMax(error_key, bad_expert_key(static_cast<int>(token), slot, s.topk, expert));
        }
      }
      const unsigned same_dest = __match_any_sync(0xffffffffu, dest);
      const int leader = __ffs(same_dest) - 1;
      int base = 0;
      if (dest >= 0 && lane == leader)
        base = atomicAdd(&send_counts[dest * s.counts_words + CountsRow::kTokens], __popc(same_dest));
      base = __shfl_sync(0xffffffffu, base, leader);
      if (dest >= 0) send_slot[token * s.world_size + dest] = base + __popc(same_dest & lanemask_lt());
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < s.num_experts; e += blockDim.x) {
    const int rows = expert_rows_smem[e];
    if (rows > 0)
      atomicAdd(&send_counts[rank_of_expert(e, s.experts_per_rank) * s.counts_words + CountsRow::kExpertRows +
                             local_expert_of(e, s.experts_per_rank)],
                rows);
  }
}

__global__ void __launch_bounds__(kPackThreads) pack_kernel(ChainShape s, const bf16* __restrict__ x,
                                                             const int32_t* __restrict__ topk_idx,
                                                             const float* __restrict__ topk_weights, int num_tokens,
                                                             int32_t* send_counts, const int32_t* __restrict__ send_slot,
                                                             const unsigned long long* error_key,
                                                             HostInputError host_error,
                                                             uint8_t* __restrict__ send_records) {
  extern __shared__ int64_t dest_offset_smem[];  // [R]: first record of each destination's block
  for (int d = threadIdx.x; d < s.world_size; d += blockDim.x)
    dest_offset_smem[d] = peer_record_offset(send_counts, s.counts_words, d);
  // The error words: written by one block, read by no other (they touch words the others never read).
  for (int d = threadIdx.x; blockIdx.x == 0 && d < s.world_size; d += blockDim.x) {
    int32_t* row = send_counts + d * s.counts_words;
    if (host_error.code != InputError::kNone) {
      row[CountsRow::kErrorCode] = static_cast<int32_t>(host_error.code);
      row[CountsRow::kErrorToken] = host_error.token;
      row[CountsRow::kErrorSlot] = 0;
      row[CountsRow::kErrorValue] = host_error.value;
    } else if (*error_key != 0) {
      const BadExpert bad = decode_bad_expert(*error_key, s.topk);
      row[CountsRow::kErrorCode] = static_cast<int32_t>(InputError::kExpertOutOfRange);
      row[CountsRow::kErrorToken] = bad.token;
      row[CountsRow::kErrorSlot] = bad.slot;
      row[CountsRow::kErrorValue] = bad.value;
    }
  }
  __syncthreads();

  const int lane = threadIdx.x % kWarp;
  const int row_vecs = s.hidden / kVec;
  for (int64_t token = int64_t{blockIdx.x} * kPackWarps + threadIdx.x / kWarp; token < num_tokens;
       token += int64_t{gridDim.x} * kPackWarps) {
    const int32_t* experts = topk_idx + token * s.topk;
    // Each destination's record, found once; then every x vector is loaded once and stored to all.
    uint8_t* records[kMaxTopk];
#pragma unroll
    for (int slot = 0; slot < kMaxTopk; ++slot) {
      records[slot] = nullptr;
      if (slot < s.topk && first_slot_for_rank(experts, slot, s.num_experts, s.experts_per_rank)) {
        const int dest = rank_of_expert(experts[slot], s.experts_per_rank);
        records[slot] = send_records + (dest_offset_smem[dest] + send_slot[token * s.world_size + dest]) * s.record_bytes;
      }
    }
    const uint4* src = reinterpret_cast<const uint4*>(x + token * s.hidden);
    for (int v = lane; v < row_vecs; v += kWarp) {
      const uint4 value = __ldg(src + v);
#pragma unroll
      for (int slot = 0; slot < kMaxTopk; ++slot)
        if (records[slot] != nullptr) reinterpret_cast<uint4*>(records[slot])[v] = value;
    }
    // Routing for the destination: lane j writes slot j of every record.
    if (lane < s.topk) {
      const float weight = topk_weights[token * s.topk + lane];
#pragma unroll
      for (int slot = 0; slot < kMaxTopk; ++slot) {
        if (records[slot] == nullptr) continue;
        const int dest = rank_of_expert(experts[slot], s.experts_per_rank);
        const int32_t local = local_expert_at(experts, lane, dest, s.num_experts, s.experts_per_rank);
        uint8_t* meta = records[slot] + record_meta_offset(s.hidden);
        reinterpret_cast<int32_t*>(meta)[lane] = local;
        reinterpret_cast<float*>(meta + s.topk * sizeof(int32_t))[lane] = local >= 0 ? weight : 0.0f;
      }
    }
  }
}

}  // namespace

void launch_layout(const ChainShape& s, const int32_t* topk_idx, int num_tokens, int32_t* send_counts,
                   int32_t* send_slot, unsigned long long* error_key, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(s.num_experts) * sizeof(int32_t);
  if (smem > kDefaultSharedMemory)  // only for thousands of experts
    detail::allow_all_dynamic_smem(layout_kernel);
  const int grid = grid_blocks(num_tokens, kLayoutThreads, s.sm_count, 2);
  layout_kernel<<<grid, kLayoutThreads, smem, stream>>>(s, topk_idx, num_tokens, send_counts, send_slot, error_key);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

void launch_pack(const ChainShape& s, const bf16* x, const int32_t* topk_idx, const float* topk_weights,
                 int num_tokens, int32_t* send_counts, const int32_t* send_slot,
                 const unsigned long long* error_key, HostInputError host_error, uint8_t* send_records,
                 cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(s.world_size) * sizeof(int64_t);
  const int grid = grid_blocks(num_tokens, kPackWarps, s.sm_count, 8);
  pack_kernel<<<grid, kPackThreads, smem, stream>>>(s, x, topk_idx, topk_weights, num_tokens, send_counts, send_slot,
                                                     error_key, host_error, send_records);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::unfused
