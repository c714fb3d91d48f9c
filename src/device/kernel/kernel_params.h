// The fused kernel's argument (passed by value, one per launch) and its private control block.
// Plain host/device types: the host fills FusedParams, the kernel composes src/device/*.cuh over it.
#pragma once
#include <cstdint>

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <nccl.h>

#include "common/hang_point.h"
#include "device/diagnostics/error_record.h"
#include "device/diagnostics/profile_record.h"
#include "device/protocol/regions.h"
#include "epfuse/config.h"  // ScaleFormat

namespace epfuse::device {

// Private, per GPU (one per workspace, shared by its layers). Every field is either reset by the last
// CTA of a call (so the next launch starts from zero without a host memset), tagged with the epoch, or
// the call state the kernel advances itself (epoch, broken): nothing in the kernel's arguments changes
// from call to call, so a forward captured in a CUDA graph replays correctly.
struct FusedControl {
  uint32_t task_counter;  // next task id (reset at exit)
  uint32_t ctas_done;     // CTAs that finished this call (reset at exit)
  uint32_t layout_done;   // layout tasks finished (reset at exit)
  uint32_t plan_epoch;    // = epoch once the collect task built this call's plan
  uint32_t mblocks;       // m-blocks of this call's plan (valid when plan_epoch == epoch)
  uint32_t abort;         // != 0: leave every wait and take no more tasks (sticky: layer broken)
  uint32_t input_status;  // ErrorKind::kBadExpert if this rank's topk_idx had a bad id (sticky)
  uint32_t epoch;         // the last call's epoch (epoch.h); the last CTA of a call stores it
  uint32_t broken;        // != 0: a call ended aborted; every later call only fills y with NaN (sticky)
  uint32_t pad[3];
  ErrorRecord error;
};

struct FusedParams {
  FusedDims dims;      // this layer's shape (the math)
  FusedDims capacity;  // the workspace's capacity: every region's strides (regions.h), shared by layers
  SymRegions sym;       // made from `capacity`
  PrivRegions priv;     // made from `capacity`
  int rank = 0;
  int num_tokens = 0;
  uint32_t host_status = 0;   // ErrorKind the host found in this call's arguments (then num_tokens = 0)
  float swiglu_clamp = 0.0f;
  uint64_t timeout_ns = 0;    // bound of every device-side wait
  const __nv_bfloat16* x = nullptr;
  const int32_t* topk_idx = nullptr;
  const float* topk_weights = nullptr;
  __nv_bfloat16* y = nullptr;
  const __nv_bfloat16* w13 = nullptr;  // [L][2I][H]
  const __nv_bfloat16* w2 = nullptr;   // [L][H][I]
  // TMA views of the weights for TileGemmTma (src/fused/tensor_map.h): w13 as [L * 2I, H] and w2 as
  // [L * H, I], bf16, box 64 x 128, 128-byte swizzle. Read through their kernel-parameter address.
  CUtensorMap w13_map{};
  CUtensorMap w2_map{};
  ncclWindow_t window = nullptr;       // the symmetric window under LsaTransport (transport.cuh)
  char* workspace = nullptr;           // private workspace base (PrivRegions offsets)
  FusedProfile* profile = nullptr;     // optional in-kernel profile (profile_record.h); null = off
  // The symmetric window under LoopbackTransport: rank r's copy at slices + r * stride. Last, so that
  // the fields above keep their parameter offsets in the LSA kernel.
  struct {
    char* slices = nullptr;
    size_t stride = 0;
  } loopback;
  // weight_format fp8-block128 (the TileGemmTmaFp8 kernel only; after everything else, so that the bf16
  // kernels' parameter offsets and code are unchanged). w13_map / w2_map above are then the FP8 views
  // (weight_tensor_map_fp8: box 128 bytes x 128 rows). The weight block scales are fp32 (UE8M0 converted
  // at creation), each 128-row block's K-block scales padded to a multiple of 4 floats
  // (weights/block_scales.h padded_k_blocks): w13 row block b (of L * 2I / 128) at w13_scales + b * w13_kb,
  // w2 row block b (of L * H / 128) at w2_scales + b * w2_kb. x_offset: the private fp8_x region (this
  // rank's own rows, regions.h). scale_format: of the activation groups (x, h).
  struct {
    const float* w13_scales = nullptr;
    const float* w2_scales = nullptr;
    int w13_kb = 0;
    int w2_kb = 0;
    size_t x_offset = 0;
    ScaleFormat scale_format = ScaleFormat::kFp32;
    // x quantised by the caller (TokenBatch::x_fp8): codes [T, H], scales [T, H / 128]; null: dispatch
    // quantises prm.x.
    const uint8_t* x_codes = nullptr;
    const float* x_scales = nullptr;
  } fp8;
  // Page-locked, mapped host word (one per workspace): the last CTA of an aborted call sets it, so the
  // host learns of the failure without a synchronisation (errors.cuh tell_host_failed). Null: none.
  uint32_t* host_failed = nullptr;
  // Which layer this call runs (nonzero, the same on every rank for the same layer: the order of its
  // creation on the workspace): carried in the count message, so ranks calling different layers in
  // one call fail (ErrorKind::kPeerOtherLayer) instead of mixing them.
  uint32_t layer_id = 0;
  // EPFUSE_FAULT kind=hang (common/fault.h), set only in the call it fires in: where this rank's kernel
  // stops (wait.cuh hang_here: one compare per task at each point, none in a k-loop). kNone: never.
  HangPoint fault_hang = HangPoint::kNone;
  // EPFUSE_SCHEDULE_LAG (common/env.h): -1 the plan's own order (task_map.h schedule_lag); 0 Linear1
  // first; n > 0 a lag of n quarter waves of CTAs (forced_lag).
  int schedule_lag_quarters = -1;
  // task_map.h combine_wants_lag for this layer's intermediate size and format (schedule_lag's last argument).
  bool combine_lag = true;
  // The workspace's private split region (regions.h split_k_bytes; FP8 only): its offset and slots (0: none,
  // no Linear2 tile is split). Last, so that the fields above keep their parameter offsets.
  struct {
    size_t offset = 0;
    int slots = 0;
  } split_k;
  // The call's task counts (task_map.h make_task_space of num_tokens, the grid and the world), made by the
  // host with num_tokens, read by the decode kernels' scheduler (scheduler.cuh): made in every CTA they took
  // ~1 us of integer divisions before its first task (docs/performance.md#the-calls-task-counts-by-the-host-2026-12-02).
  // Last, so that the fields above keep their parameter offsets.
  TaskSpace tasks{};
};

}  // namespace epfuse::device
