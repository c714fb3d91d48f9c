// epfuse/types.h: tensors as device pointers with shapes; no framework dependency.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>

namespace epfuse {

using bf16 = __nv_bfloat16;

// One rank's tokens for one forward call. All pointers are device pointers owned by the caller.
//
// Unusual inputs are defined by what the float64 reference (epfuse/reference.h) computes; none of
// them is an error:
//  - Duplicate expert ids within a token are independent slots: two slots naming expert e add
//    w[t,j1] * expert_e(x[t]) + w[t,j2] * expert_e(x[t]), i.e. one slot of weight w[t,j1] + w[t,j2] up
//    to rounding, never a deduplicated one. The token still travels once to e's rank.
//  - Weights are used as given: any sign, never normalised (scaling a token's weights scales y[t]). A
//    weight of 0 still runs its expert (so 0 * NaN is NaN); topk_idx = -1 is what drops a slot.
//  - NaN or Inf in x[t], or a non-finite weight of token t, reaches row t of y and no other row. Without
//    a clamp every element of row t is then NaN or Inf; a token whose slots are all dropped gets zeros
//    whatever x[t] holds. With swiglu_clamp > 0 a NaN stays NaN, but the clamp may bound an Inf.
// Known deviations of the GPU implementations (not yet fixed):
//  - unfused, topk > E/R only: tokens naming one rank's experts in more than E/R slots can give that
//    rank more expert rows than its buffers hold (sized for distinct ids, src/unfused/plan.cpp); the
//    rank throws Error(kInternal) alone and its peers' all-to-all never completes. Keep each token's
//    ids distinct there. The fused kernel sizes every buffer for k slots per token and follows the
//    definition.
//  - both, swiglu_clamp > 0 only: the clamp (fminf/fmaxf, which return the non-NaN operand) turns a NaN
//    gate or up into the bound, so a NaN in x[t] gives a finite, meaningless row t instead of NaN
//    (src/device/ffn/epilogue.cuh swiglu, src/unfused/experts.cu swiglu_kernel); other rows are unaffected.
struct TokenBatch {
  const bf16* x = nullptr;              // [num_tokens, hidden]
  const int32_t* topk_idx = nullptr;    // [num_tokens, topk] global expert ids; -1 = dropped slot
  const float* topk_weights = nullptr;  // [num_tokens, topk]
  int num_tokens = 0;                   // 0 allowed; at most LayerConfig::max_tokens_per_rank
  // FP8 layers, optional: x already quantised by the caller per token per 128 channels (config.h):
  // e4m3fn codes [num_tokens, hidden] (16-byte aligned) and float scales [num_tokens, ceil(hidden/128)]
  // (the real value is code * scale). Every scale must be finite and > 0: the C++ API (and the C ABI)
  // does not check them (they are device memory, read only by the kernel), and a zero, negative, NaN
  // or Inf scale gives wrong or non-finite rows of y without an error. epfuse.torch checks them
  // before the call (one host synchronisation; not inside a CUDA graph capture). When x_fp8 is set,
  // x is not read (it may be null) and these bytes are what dispatch sends and Linear1 reads. The
  // fused layer runs it; the unfused chain refuses it (kUnsupported), as bf16 layers do. Every rank
  // passes the same kind.
  const uint8_t* x_fp8 = nullptr;
  const float* x_scales = nullptr;
};

// This rank's experts (E/R of them), device pointers owned by the caller.
//
// LayerConfig::weight_format picks which fields are read:
//  - kBf16: w13 and w2 (the FP8 fields are ignored).
//  - kFp8Block128 (config.h has the format): w13_fp8, w2_fp8 (e4m3fn codes, 16-byte aligned) and their
//    scales, one per 128x128 block (gate and up halves of w13 blocked apart), float for
//    ScaleFormat::kFp32 or the UE8M0 exponent byte (scale = 2^(e - 127)) for kUe8m0, in DeepSeek-V3's
//    weight_scale_inv order (the real weight is code * scale):
//      w13_scales [E/R, 2 * ceil(I/128), ceil(H/128)],  w2_scales [E/R, ceil(H/128), ceil(I/128)].
//    w13_scales_count / w2_scales_count are the number of scale elements the caller holds there; they
//    must equal those shapes (a checkpoint of another layout is an Error(kInvalidArgument) at creation,
//    not a silent misread). Every scale must be finite and > 0 (kFp32), or an exponent byte in
//    [1, 254] (kUe8m0): the layer reads them once at creation (a synchronous copy: they must be
//    written before MoeLayer::create) and names the first bad one.
//    The bf16 fields are ignored. The layer keeps its own copy of the scales (in the layout its GEMMs
//    want) and borrows the codes.
//  Both layers run FP8 weights at every valid size (sizes the kernels do not tile run padded, config.h).
struct ExpertWeights {
  const bf16* w13 = nullptr;  // [E/R, 2I, H]: rows [0, I) are the gate (W1), rows [I, 2I) the up (W3)
  const bf16* w2 = nullptr;   // [E/R, H, I]: the down projection

  const uint8_t* w13_fp8 = nullptr;  // [E/R, 2I, H] e4m3fn codes, rows as w13
  const uint8_t* w2_fp8 = nullptr;   // [E/R, H, I] e4m3fn codes
  const void* w13_scales = nullptr;  // see above: float or uint8_t by LayerConfig::scale_format
  const void* w2_scales = nullptr;
  int64_t w13_scales_count = 0;
  int64_t w2_scales_count = 0;
};

}  // namespace epfuse
