// Launchers of the unfused chain's kernels, in the order a forward runs them. Each kernel is
// memory-bound: 16-byte vector accesses, one warp per token row, grids sized from the SM count.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

#include "epfuse/config.h"
#include "epfuse/types.h"
#include "unfused/protocol.h"

namespace epfuse::unfused {

// What every kernel needs to know about the layer; fixed at creation.
struct ChainShape {
  int hidden = 0, intermediate = 0, topk = 0, num_experts = 0;
  int experts_per_rank = 0, world_size = 0, counts_words = 0;
  int64_t record_bytes = 0;
  int sm_count = 0;  // grids are sized for this many SMs
};

// An input error the host found before launching; travels in the counts like a device-found one.
struct HostInputError {
  InputError code = InputError::kNone;
  int32_t token = 0, value = 0;
};

// 1. Per own token: its position in each destination's record block (send_slot[t * R + d]), the
// records and rows per (destination, local expert) in send_counts, and the first bad expert id.
void launch_layout(const ChainShape& s, const int32_t* topk_idx, int num_tokens, int32_t* send_counts,
                   int32_t* send_slot, unsigned long long* error_key, cudaStream_t stream);

// 2. Writes each token's record into each destination's block, and the error words into every row of
// send_counts (host_error wins over the device's error key).
void launch_pack(const ChainShape& s, const bf16* x, const int32_t* topk_idx, const float* topk_weights,
                 int num_tokens, int32_t* send_counts, const int32_t* send_slot,
                 const unsigned long long* error_key, HostInputError host_error, uint8_t* send_records,
                 cudaStream_t stream);

// 3. Received records -> expert-contiguous rows (expert e's rows start at the sum of the rows of
// experts < e, from recv_counts); a record with several local experts becomes several rows.
// Records each row's top-k weight and each (record, slot)'s row. expert_fill must be zero.
void launch_permute(const ChainShape& s, const uint8_t* recv_records, int num_records,
                    const int32_t* recv_counts, int32_t* expert_fill, bf16* rows, float* row_weight,
                    int32_t* token_rows, cudaStream_t stream);

// 4. In place on Linear1's output [rows, 2I]: h = weight * silu(gate) * up in fp32 (clamped when
// clamp > 0), written as bf16 over the gate half, so Linear2 reads h with leading dimension 2I.
void launch_swiglu(const ChainShape& s, bf16* inter, const float* row_weight, int64_t num_rows, float clamp,
                   cudaStream_t stream);

// 5. Per received record: the sum in fp32 of its experts' Linear2 rows -> one bf16 row, [records, H].
void launch_pre_reduce(const ChainShape& s, const bf16* expert_out, const int32_t* token_rows, int num_records,
                       bf16* combine_rows, cudaStream_t stream);

// 6. At home: y[t] = sum in fp32 over the token's destination ranks of the rows they returned (into
// the send buffer, laid out as the records were); zeros for tokens routed nowhere.
void launch_home_reduce(const ChainShape& s, const bf16* returned_rows, const int32_t* topk_idx,
                        const int32_t* send_counts, const int32_t* send_slot, int num_tokens, bf16* y,
                        cudaStream_t stream);

}  // namespace epfuse::unfused
