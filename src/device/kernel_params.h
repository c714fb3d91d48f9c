// The fused kernel's argument (passed by value, one per launch) and its private control block.
// Plain host/device types: the host fills FusedParams, the kernel composes src/device/*.cuh over it.
#pragma once
#include <cstdint>

#include <cuda.h>  // CUtensorMap
#include <cuda_bf16.h>
#include <nccl.h>

#include "device/regions.h"
#include "device/error_record.h"
#include "device/profile_record.h"

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
};

}  // namespace epfuse::device
