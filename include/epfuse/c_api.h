/* epfuse/c_api.h: the C ABI of epfuse (libepfuse_c.so), for bindings that pass tensors as device
 * pointers, shapes and a CUDA stream (the Python package loads it with ctypes; no framework is linked).
 *
 * Every function returns EPFUSE_OK (0) or the epfuse::ErrorCode of the failure plus one
 * (EPFUSE_ERR_*); epfuse_last_error() then returns that error's message for the calling thread, valid
 * until its next call into this API. Nothing here exits or aborts the process.
 *
 * Objects: a communicator (one rank of a world), a workspace (the buffers every layer of a model shares:
 * one per communicator, sized for the largest layer), a layer (its borrowed weights and small state).
 * Creating and destroying a workspace or a layer is collective: every rank does it, in the same order.
 * Destroy layers before their workspace and workspaces before their communicator.
 *
 * After a peer fails (EPFUSE_ERR_TIMEOUT or EPFUSE_ERR_ABORTED from any call, or a rank known dead):
 * epfuse_comm_abort, then destroy the layers, the workspace and the communicator; each of those is
 * then local and returns at once. Without the abort, destroying a workspace on an owned communicator
 * (epfuse_comm_init_rank) waits at most the collective timeout (EPFUSE_COLLECTIVE_TIMEOUT_MS, default
 * 300000) for its peers, then aborts the communicator and returns EPFUSE_ERR_TIMEOUT; on a borrowed one
 * it can wait until the owner aborts its communicator.
 */
#ifndef EPFUSE_C_API_H_
#define EPFUSE_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EPFUSE_C_API_VERSION 4

#if defined(__GNUC__)
#define EPFUSE_C_EXPORT __attribute__((visibility("default")))
#else
#define EPFUSE_C_EXPORT
#endif

enum {
  EPFUSE_OK = 0,
  EPFUSE_ERR_INVALID_CONFIG = 1,
  EPFUSE_ERR_INVALID_ARGUMENT = 2,
  EPFUSE_ERR_CUDA = 3,
  EPFUSE_ERR_NCCL = 4,
  EPFUSE_ERR_BOOTSTRAP = 5,
  EPFUSE_ERR_TIMEOUT = 6,
  EPFUSE_ERR_UNSUPPORTED = 7,
  EPFUSE_ERR_INTERNAL = 8,
  EPFUSE_ERR_ABORTED = 9,
};

typedef struct epfuse_comm epfuse_comm;
typedef struct epfuse_workspace epfuse_workspace;
typedef struct epfuse_layer epfuse_layer;

/* epfuse_layer_config.weight_format and .scale_format (epfuse::WeightFormat, epfuse::ScaleFormat). */
enum {
  EPFUSE_WEIGHTS_BF16 = 0,
  EPFUSE_WEIGHTS_FP8_BLOCK128 = 1, /* e4m3fn codes, one scale per 128x128 block (DeepSeek-V3's layout) */
};
enum {
  EPFUSE_SCALES_FP32 = 0,
  EPFUSE_SCALES_UE8M0 = 1, /* one exponent byte e per block: scale = 2^(e - 127) */
};

/* The shape of a layer (or, for a workspace, the largest layer it must hold). Fields as in
 * epfuse::LayerConfig (epfuse/config.h). A workspace made with weight_format EPFUSE_WEIGHTS_FP8_BLOCK128
 * runs FP8 and bf16 layers; one made with EPFUSE_WEIGHTS_BF16 only bf16 layers. */
typedef struct {
  int32_t hidden;
  int32_t intermediate;
  int32_t num_experts;
  int32_t topk;
  int32_t max_tokens_per_rank;
  float swiglu_clamp;
  int32_t num_sms;       /* 0: the default SM budget */
  int32_t weight_format; /* EPFUSE_WEIGHTS_* */
  int32_t scale_format;  /* EPFUSE_SCALES_*; FP8 weights only */
} epfuse_layer_config;

EPFUSE_C_EXPORT int epfuse_c_api_version(void);
/* The calling thread's last error message ("" if none). */
EPFUSE_C_EXPORT const char* epfuse_last_error(void);

/* --- communicators --- */
/* Wraps an existing ncclComm_t (e.g. a torch.distributed NCCL group's): borrowed, never aborted,
 * finalized or destroyed here (epfuse_comm_abort only marks it unusable for epfuse; its owner must
 * abort it). */
EPFUSE_C_EXPORT int epfuse_comm_borrow_nccl(void* nccl_comm, epfuse_comm** out);
/* A new NCCL communicator of rank `rank` in a world of `world_size` on CUDA device `device`, from an
 * ncclUniqueId (128 bytes) that rank 0 made with epfuse_nccl_unique_id and every rank received
 * (collective). Owned by epfuse (epfuse_comm_abort ends it with ncclCommAbort). Its host collectives
 * wait at most EPFUSE_COLLECTIVE_TIMEOUT_MS (default 300000); ncclCommInitRank itself waits for every
 * rank without a bound of epfuse's. */
EPFUSE_C_EXPORT int epfuse_nccl_unique_id(void* id_out, size_t id_bytes);
EPFUSE_C_EXPORT int epfuse_comm_init_rank(const void* id, size_t id_bytes, int world_size, int rank, int device, epfuse_comm** out);
/* Owned: collective (a barrier bounded by the collective timeout, past which the communicator is
 * aborted, then ncclCommFinalize); after epfuse_comm_abort, local. Borrowed: the ncclComm_t is left
 * to its owner. */
EPFUSE_C_EXPORT int epfuse_comm_destroy(epfuse_comm* comm);
/* Gives up on the world (API version 4), for when a peer failed or may be dead: an owned
 * communicator is ended with ncclCommAbort (this rank's in-flight NCCL work stops without waiting for
 * peers); a borrowed one is only marked unusable for epfuse. Afterwards every collective call on it,
 * and on its workspaces and layers, returns EPFUSE_ERR_ABORTED naming `why` (NULL or "": a default),
 * and destroying them is local. Idempotent (the first reason is kept). Call it from the thread that
 * makes this communicator's calls, not while another thread is inside one of them. */
EPFUSE_C_EXPORT int epfuse_comm_abort(epfuse_comm* comm, const char* why);
/* *aborted = 1 once the communicator is aborted (by epfuse_comm_abort or a timed-out collective), else 0. */
EPFUSE_C_EXPORT int epfuse_comm_aborted(const epfuse_comm* comm, int* aborted);
EPFUSE_C_EXPORT int epfuse_comm_rank(const epfuse_comm* comm, int* rank);
EPFUSE_C_EXPORT int epfuse_comm_world_size(const epfuse_comm* comm, int* world_size);

/* --- workspaces (collective) --- */
EPFUSE_C_EXPORT int epfuse_workspace_create(epfuse_comm* comm, const epfuse_layer_config* capacity, epfuse_workspace** out);
/* Collective (a barrier bounded by the collective timeout, skipped after epfuse_comm_abort). The
 * workspace is freed whatever the result; EPFUSE_ERR_TIMEOUT when the peers never met the barrier
 * (the communicator is then aborted). */
EPFUSE_C_EXPORT int epfuse_workspace_destroy(epfuse_workspace* ws);
/* Device bytes the workspace holds: the symmetric window and the private buffers. */
EPFUSE_C_EXPORT int epfuse_workspace_memory(const epfuse_workspace* ws, size_t* symmetric_bytes, size_t* private_bytes);

/* --- layers (collective) --- */
/* The fused layer of `config` on `ws`, with this rank's experts: w13 [E/R, 2I, H] bf16 (gate rows, then
 * up rows), w2 [E/R, H, I] bf16, device pointers that must outlive the layer. EPFUSE_ERR_INVALID_CONFIG
 * when the layer does not fit the workspace (the message names the field). config->weight_format must
 * be EPFUSE_WEIGHTS_BF16 (FP8 experts: epfuse_layer_create_fp8). */
EPFUSE_C_EXPORT int epfuse_layer_create(epfuse_workspace* ws, const epfuse_layer_config* config, const void* w13, const void* w2,
                        epfuse_layer** out);
/* The same with FP8 experts (config->weight_format EPFUSE_WEIGHTS_FP8_BLOCK128, on a workspace made for
 * it): w13 [E/R, 2I, H] and w2 [E/R, H, I] e4m3fn codes (device pointers, 16-byte aligned, outliving the
 * layer) and their block scales in DeepSeek-V3's weight_scale_inv order, w13_scales [E/R, 2 ceil(I/128),
 * ceil(H/128)] and w2_scales [E/R, ceil(H/128), ceil(I/128)]: float (EPFUSE_SCALES_FP32) or exponent
 * bytes (EPFUSE_SCALES_UE8M0), *_scales_count elements each, device pointers read once here. A count
 * that is not that shape's, or a scale that is not finite and > 0, is EPFUSE_ERR_INVALID_ARGUMENT naming
 * it (epfuse::ExpertWeights, epfuse/types.h). */
EPFUSE_C_EXPORT int epfuse_layer_create_fp8(epfuse_workspace* ws, const epfuse_layer_config* config, const void* w13,
                            const void* w13_scales, int64_t w13_scales_count, const void* w2, const void* w2_scales,
                            int64_t w2_scales_count, epfuse_layer** out);
EPFUSE_C_EXPORT int epfuse_layer_destroy(epfuse_layer* layer);
/* Collective: y [num_tokens, H] bf16 = the MoE layer of x [num_tokens, H] bf16, topk_idx [num_tokens, k]
 * int32 (-1 = dropped), topk_weights [num_tokens, k] fp32, enqueued on `stream` (a cudaStream_t; NULL:
 * the legacy default stream). All pointers are device pointers, 16-byte aligned, rows contiguous.
 * Capturable in a CUDA graph (the kernel advances its own call state); errors the device finds are
 * returned by epfuse_layer_check_errors. Forwards on one workspace from several threads take turns
 * (the C++ forward's rules: README "Threads and streams"). */
EPFUSE_C_EXPORT int epfuse_layer_forward(epfuse_layer* layer, const void* x, const int32_t* topk_idx, const float* topk_weights,
                         int num_tokens, void* y, void* stream);
/* Collective, FP8 layers (API version 3): as epfuse_layer_forward with x already quantised by the caller:
 * x_fp8 [num_tokens, H] e4m3fn codes (16-byte aligned) and x_scales [num_tokens, ceil(H/128)] fp32, one
 * per token per 128 channels (the real value is code * scale); epfuse::TokenBatch::x_fp8. Every rank
 * passes the same kind of x. The unfused chain returns EPFUSE_ERR for it (kUnsupported by name). */
EPFUSE_C_EXPORT int epfuse_layer_forward_fp8(epfuse_layer* layer, const void* x_fp8, const float* x_scales,
                             const int32_t* topk_idx, const float* topk_weights, int num_tokens, void* y,
                             void* stream);
/* Synchronises `stream` and reports what the device recorded (bad expert ids, a peer that timed out).
 * After a device error the workspace stays failed: every later forward of any layer on it fails (and
 * fills y with NaN when it runs inside a graph), until the workspace is re-created. */
EPFUSE_C_EXPORT int epfuse_layer_check_errors(epfuse_layer* layer, void* stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* EPFUSE_C_API_H_ */
