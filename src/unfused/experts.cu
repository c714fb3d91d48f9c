// The receiver's side before and between the expert GEMMs: permute to expert-contiguous rows, SwiGLU.
#include "common/check.h"
#include "common/launch.h"
#include "unfused/kernels.h"
#include "unfused/vec.cuh"

namespace epfuse::unfused {
namespace {

constexpr int kPermuteThreads = 256;
constexpr int kPermuteWarps = kPermuteThreads / kWarp;
constexpr int kPermuteRecords = 32;  // records per block step: one ticket per (block step, expert)
constexpr int kSwigluThreads = 256;

// Exclusive prefix sum of data[0, n) in shared memory, by warp 0; the whole block calls it.
__device__ void exclusive_scan_shared(int32_t* data, int n) {
  if (threadIdx.x < kWarp) {
    const int lane = threadIdx.x;
    int32_t carry = 0;
    for (int base = 0; base < n; base += kWarp) {
      const int i = base + lane;
      const int32_t value = i < n ? data[i] : 0;
      int32_t inclusive = value;
#pragma unroll
      for (int offset = 1; offset < kWarp; offset *= 2) {
        const int32_t other = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += other;
      }
      if (i < n) data[i] = carry + inclusive - value;
      carry += __shfl_sync(0xffffffffu, inclusive, kWarp - 1);
    }
  }
  __syncthreads();
}

// Rows of an expert are handed out by a ticket dispenser: per block step, one shared-memory atomic
// per (record, slot) and one global atomic per expert present. Rows within an expert are therefore
// in no fixed order, which changes nothing in the result: a GEMM row depends only on its own inputs.
__global__ void __launch_bounds__(kPermuteThreads) permute_kernel(ChainShape s, const uint8_t* __restrict__ recv_records,
                                                                   int num_records, const int32_t* __restrict__ recv_counts,
                                                                   int32_t* expert_fill, bf16* __restrict__ rows,
                                                                   float* __restrict__ row_weight,
                                                                   int32_t* __restrict__ token_rows) {
  extern __shared__ int32_t smem[];
  const int local_experts = s.experts_per_rank;
  int32_t* expert_start = smem;                   // [El] first row of each local expert
  int32_t* step_count = smem + local_experts;      // [El] rows of this step per expert
  int32_t* step_base = smem + 2 * local_experts;   // [El] first row of this step per expert
  __shared__ int32_t slot_row[kPermuteRecords * kMaxTopk];

  for (int e = threadIdx.x; e < local_experts; e += blockDim.x)
    expert_start[e] = static_cast<int32_t>(expert_rows(recv_counts, s.counts_words, s.world_size, e));
  __syncthreads();
  exclusive_scan_shared(expert_start, local_experts);

  const int64_t meta_offset = record_meta_offset(s.hidden);
  const auto slot_expert = [&](int64_t record, int slot) {
    return reinterpret_cast<const int32_t*>(recv_records + record * s.record_bytes + meta_offset)[slot];
  };
  const auto slot_weight = [&](int64_t record, int slot) {
    return reinterpret_cast<const float*>(recv_records + record * s.record_bytes + meta_offset +
                                          s.topk * sizeof(int32_t))[slot];
  };

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int row_vecs = s.hidden / kVec;
  for (int64_t first = int64_t{blockIdx.x} * kPermuteRecords; first < num_records;
       first += int64_t{gridDim.x} * kPermuteRecords) {
    const int step_records = static_cast<int>(min(int64_t{kPermuteRecords}, num_records - first));
    const int step_slots = step_records * s.topk;
    for (int e = threadIdx.x; e < local_experts; e += blockDim.x) step_count[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < step_slots; p += blockDim.x) {
      const int32_t local = slot_expert(first + p / s.topk, p % s.topk);
      slot_row[p] = local >= 0 ? atomicAdd(&step_count[local], 1) : -1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < local_experts; e += blockDim.x)
      if (step_count[e] > 0) step_base[e] = expert_start[e] + atomicAdd(&expert_fill[e], step_count[e]);
    __syncthreads();
    for (int p = threadIdx.x; p < step_slots; p += blockDim.x) {
      const int64_t record = first + p / s.topk;
      const int32_t local = slot_expert(record, p % s.topk);
      int32_t row = -1;
      if (local >= 0) {
        row = step_base[local] + slot_row[p];
        row_weight[row] = slot_weight(record, p % s.topk);
      }
      slot_row[p] = row;
      token_rows[first * s.topk + p] = row;
    }
    __syncthreads();
    // Copy: a warp per record, each 16-byte vector loaded once and stored to each of its rows.
    for (int r = warp; r < step_records; r += kPermuteWarps) {
      int32_t dest_rows[kMaxTopk];
#pragma unroll
      for (int slot = 0; slot < kMaxTopk; ++slot) dest_rows[slot] = slot < s.topk ? slot_row[r * s.topk + slot] : -1;
      const uint4* src = reinterpret_cast<const uint4*>(recv_records + (first + r) * s.record_bytes);
      for (int v = lane; v < row_vecs; v += kWarp) {
        const uint4 value = src[v];
#pragma unroll
        for (int slot = 0; slot < kMaxTopk; ++slot)
          if (dest_rows[slot] >= 0) reinterpret_cast<uint4*>(rows + int64_t{dest_rows[slot]} * s.hidden)[v] = value;
      }
    }
    __syncthreads();  // slot_row and the step arrays are reused by the next step
  }
}

__global__ void __launch_bounds__(kSwigluThreads) swiglu_kernel(bf16* inter, const float* __restrict__ row_weight,
                                                                 int64_t num_rows, int intermediate, float clamp) {
  const int row_vecs = intermediate / kVec;
  for (RowVecWalk w = row_vec_walk(int64_t{blockIdx.x} * blockDim.x + threadIdx.x, int64_t{gridDim.x} * blockDim.x,
                                   row_vecs);
       w.row < num_rows; advance(w)) {
    const int64_t row = w.row;
    const int v = w.vec;
    uint4* gate_up = reinterpret_cast<uint4*>(inter + row * 2 * intermediate);
    const Vec8 gate = to_float(gate_up[v]);
    const Vec8 up = to_float(gate_up[row_vecs + v]);
    const float weight = row_weight[row];
    Vec8 h;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      float g = gate.v[j], u = up.v[j];
      if (clamp > 0.0f) {  // LayerConfig::swiglu_clamp: gate clamped from above, up on both sides
        g = fminf(g, clamp);
        u = fminf(fmaxf(u, -clamp), clamp);
      }
      h.v[j] = weight * (g / (1.0f + __expf(-g))) * u;
    }
    gate_up[v] = to_bf16(h);  // over the gate this thread alone read
  }
}

}  // namespace

void launch_permute(const ChainShape& s, const uint8_t* recv_records, int num_records, const int32_t* recv_counts,
                    int32_t* expert_fill, bf16* rows, float* row_weight, int32_t* token_rows, cudaStream_t stream) {
  if (num_records == 0) return;
  const size_t smem = 3 * static_cast<size_t>(s.experts_per_rank) * sizeof(int32_t);
  if (smem > kDefaultSharedMemory)  // only for thousands of local experts
    detail::allow_all_dynamic_smem(permute_kernel);
  const int grid = grid_blocks(num_records, kPermuteRecords, s.sm_count, 4);
  permute_kernel<<<grid, kPermuteThreads, smem, stream>>>(s, recv_records, num_records, recv_counts, expert_fill, rows,
                                                           row_weight, token_rows);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

void launch_swiglu(const ChainShape& s, bf16* inter, const float* row_weight, int64_t num_rows, float clamp,
                   cudaStream_t stream) {
  if (num_rows == 0) return;
  const int grid = grid_blocks(num_rows * (s.intermediate / kVec), kSwigluThreads, s.sm_count, 8);
  swiglu_kernel<<<grid, kSwigluThreads, 0, stream>>>(inter, row_weight, num_rows, s.intermediate, clamp);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::unfused
