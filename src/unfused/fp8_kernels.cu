#include "unfused/fp8_kernels.h"

#include <algorithm>

#include "common/check.h"
#include "common/fp8.h"
#include "unfused/fp8_layout.h"

namespace epfuse::unfused {
namespace {

constexpr int kThreads = 256;  // 8 warps, one 1x128 group each at a time
constexpr int kWarp = 32;
constexpr int kPerLane = fp8::kBlock / kWarp;  // 4 elements per lane

__device__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Quantises the 4 values of this lane (all lanes of the warp call it; lanes past the group's extent
// pass zeros and store nothing) and writes the group's scale. The arithmetic of fp8::quantize_tile.
__device__ void quantize_group(const float (&v)[kPerLane], bool active, ScaleFormat format, uint8_t* codes,
                               float* scale_out, int lane) {
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) amax = fmaxf(amax, fabsf(v[j]));
  amax = warp_max(amax);
  const float scale = fp8::group_scale(amax, format);
  const float inv = 1.0f / scale;  // IEEE division (no fast math in this build), as the reference
  if (active) {
    uint32_t packed = 0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) packed |= static_cast<uint32_t>(fp8::float_to_e4m3(v[j] * inv)) << (8 * j);
    *reinterpret_cast<uint32_t*>(codes) = packed;
  }
  if (lane == 0) *scale_out = scale;
}

// The scale of k-block kb (K = k) of padded row r (fp8_layout.h).
__device__ float* scale_slot(const Fp8RowMap& map, const fp8_layout::PaddedRow& r, float* scales, int k, int kb) {
  return scales + fp8_layout::act_scale_offset(fp8_layout::act_scale_start(map.padded_first[r.expert], k),
                                               r.gemm_rows, r.local, kb);
}

// Over the padded rows p < padded_rows = map.padded_first[E_local]; a padding row (r.real < 0) reads
// nothing and is quantised as zeros (codes 0, scale group_scale(0) = 1 in both formats), so the GEMM
// computes zeros for it, never NaN.
__global__ void __launch_bounds__(kThreads)
    quantize_rows_kernel(const bf16* __restrict__ rows, int64_t padded_rows, int hidden, ScaleFormat format,
                         Fp8RowMap map, uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const int lane = threadIdx.x % kWarp;
  const int groups = fp8::num_blocks(hidden);
  const int64_t total = padded_rows * groups;
  for (int64_t g = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp; g < total;
       g += int64_t{gridDim.x} * blockDim.x / kWarp) {
    const int64_t p = g / groups;
    const int kb = static_cast<int>(g % groups);
    const int col = kb * fp8::kBlock + lane * kPerLane;
    const bool active = col < hidden;  // the last group may be 64 wide
    const fp8_layout::PaddedRow r = fp8_layout::padded_row(map.expert_first, map.padded_first, map.experts, p);
    float v[kPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active && r.real >= 0) {
      const uint2 raw = *reinterpret_cast<const uint2*>(rows + r.real * hidden + col);
      const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) v[j] = __bfloat162float(b[j]);
    }
    quantize_group(v, active, format, codes + p * hidden + col, scale_slot(map, r, scales, hidden, kb), lane);
  }
}

// 4 consecutive elements as float.
__device__ void load4(const bf16* p, float (&v)[kPerLane]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const bf16* b = reinterpret_cast<const bf16*>(&raw);
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) v[j] = __bfloat162float(b[j]);
}
__device__ void load4(const float* p, float (&v)[kPerLane]) {
  const float4 raw = *reinterpret_cast<const float4*>(p);
  v[0] = raw.x;
  v[1] = raw.y;
  v[2] = raw.z;
  v[3] = raw.w;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    swiglu_quantize_kernel(const T* __restrict__ inter, const float* __restrict__ row_weight, int64_t padded_rows,
                           int intermediate, float clamp, ScaleFormat format, Fp8RowMap map,
                           uint8_t* __restrict__ codes, float* __restrict__ scales) {
  const int lane = threadIdx.x % kWarp;
  const int groups = fp8::num_blocks(intermediate);
  const int64_t total = padded_rows * groups;
  for (int64_t g = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / kWarp; g < total;
       g += int64_t{gridDim.x} * blockDim.x / kWarp) {
    const int64_t p = g / groups;  // padded row, as quantize_rows_kernel
    const int kb = static_cast<int>(g % groups);
    const int col = kb * fp8::kBlock + lane * kPerLane;
    const bool active = col < intermediate;
    const fp8_layout::PaddedRow r = fp8_layout::padded_row(map.expert_first, map.padded_first, map.experts, p);
    float v[kPerLane] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active && r.real >= 0) {
      const T* gate_up = inter + p * 2 * intermediate;  // Linear1 wrote the padded layout
      float gate[kPerLane], up[kPerLane];
      load4(gate_up + col, gate);
      load4(gate_up + intermediate + col, up);
      const float weight = row_weight[r.real];  // the permute wrote the real layout
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        float gv = gate[j], uv = up[j];
        if (clamp > 0.0f) {  // LayerConfig::swiglu_clamp, as launch_swiglu
          gv = fminf(gv, clamp);
          uv = fminf(fmaxf(uv, -clamp), clamp);
        }
        v[j] = weight * (gv / (1.0f + expf(-gv))) * uv;
      }
    }
    quantize_group(v, active, format, codes + p * intermediate + col, scale_slot(map, r, scales, intermediate, kb),
                   lane);
  }
}

__global__ void pad_token_rows_kernel(int32_t* __restrict__ token_rows, int64_t count, Fp8RowMap map) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int32_t row = token_rows[i];
    if (row >= 0)
      token_rows[i] =
          static_cast<int32_t>(fp8_layout::padded_row_of(map.expert_first, map.padded_first, map.experts, row));
  }
}

int grid_for(int64_t groups, int sm_count) {
  const int64_t blocks = (groups + kThreads / kWarp - 1) / (kThreads / kWarp);
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{sm_count} * 8)));
}

}  // namespace

void launch_quantize_rows(const bf16* rows, int64_t padded_rows, int hidden, ScaleFormat format, Fp8RowMap map,
                          uint8_t* codes, float* scales, int sm_count, cudaStream_t stream) {
  if (padded_rows == 0) return;
  quantize_rows_kernel<<<grid_for(padded_rows * fp8::num_blocks(hidden), sm_count), kThreads, 0, stream>>>(
      rows, padded_rows, hidden, format, map, codes, scales);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

void launch_swiglu_quantize(const void* inter, bool inter_fp32, const float* row_weight, int64_t padded_rows,
                            int intermediate, float clamp, ScaleFormat format, Fp8RowMap map, uint8_t* codes,
                            float* scales, int sm_count, cudaStream_t stream) {
  if (padded_rows == 0) return;
  const int grid = grid_for(padded_rows * fp8::num_blocks(intermediate), sm_count);
  if (inter_fp32)
    swiglu_quantize_kernel<float><<<grid, kThreads, 0, stream>>>(static_cast<const float*>(inter), row_weight,
                                                                 padded_rows, intermediate, clamp, format, map, codes,
                                                                 scales);
  else
    swiglu_quantize_kernel<bf16><<<grid, kThreads, 0, stream>>>(static_cast<const bf16*>(inter), row_weight,
                                                                padded_rows, intermediate, clamp, format, map, codes,
                                                                scales);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

void launch_pad_token_rows(int32_t* token_rows, int64_t count, Fp8RowMap map, int sm_count, cudaStream_t stream) {
  if (count == 0) return;
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>((count + kThreads - 1) / kThreads,
                                                                           int64_t{sm_count} * 8)));
  pad_token_rows_kernel<<<grid, kThreads, 0, stream>>>(token_rows, count, map);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::unfused
