// The C ABI (epfuse/c_api.h): handles around the C++ objects, and every exception turned into a
// return code plus the calling thread's message.
#include "epfuse/c_api.h"

#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

#include "capi/config_c.h"
#include "common/check.h"
#include "common/env.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"
#include "epfuse/layer.h"
#include "epfuse/workspace.h"

struct epfuse_comm {
  std::unique_ptr<epfuse::Communicator> comm;  // owned (init_rank) or borrowed (borrow_nccl)
};
struct epfuse_workspace {
  std::unique_ptr<epfuse::Workspace> ws;
};
struct epfuse_layer {
  std::unique_ptr<epfuse::MoeLayer> layer;
};

namespace {

thread_local std::string t_last_error;

static_assert(EPFUSE_ERR_INVALID_CONFIG == static_cast<int>(epfuse::ErrorCode::kInvalidConfig) + 1 &&
                  EPFUSE_ERR_ABORTED == static_cast<int>(epfuse::ErrorCode::kAborted) + 1,
              "c_api.h's codes are ErrorCode + 1");

// Runs f; an exception becomes its code and message (never crosses the C boundary).
template <class F>
int guarded(F&& f) noexcept {
  t_last_error.clear();
  try {
    f();
    return EPFUSE_OK;
  } catch (const epfuse::Error& e) {
    t_last_error = e.what();
    return static_cast<int>(e.code()) + 1;
  } catch (const std::exception& e) {
    t_last_error = e.what();
    return EPFUSE_ERR_INTERNAL;
  } catch (...) {
    t_last_error = "unknown exception";
    return EPFUSE_ERR_INTERNAL;
  }
}

// Handles and out-pointers are checked before anything else, with the function's name.
void need_nonnull(const void* p, const char* fn, const char* what) {
  if (p == nullptr) throw epfuse::Error(epfuse::ErrorCode::kInvalidArgument, std::string(fn) + ": " + what + " is NULL");
}
template <class T>
T& need(T* p, const char* fn, const char* what) {
  need_nonnull(p, fn, what);
  return *p;
}

// epfuse_layer_config -> LayerConfig, generated from the field list (config_c.h).
epfuse::LayerConfig to_config(const epfuse_layer_config& c) { return epfuse::detail::config_from_c(c); }

// What a layer creation checks first: its handles and out-pointer, then that config->weight_format is
// the function's own (`format`, spelled out in `expected`). Returns the workspace.
epfuse::Workspace& creation_args(epfuse_workspace* ws, const epfuse_layer_config* config, epfuse_layer** out,
                                 const char* fn, int32_t format, const char* expected) {
  epfuse_workspace& w = need(ws, fn, "ws");
  const epfuse_layer_config& cfg = need(config, fn, "config");
  need(out, fn, "out");
  EPFUSE_REQUIRE(cfg.weight_format == format, epfuse::ErrorCode::kInvalidArgument,
                 std::string(fn) + ": config->weight_format = " + std::to_string(cfg.weight_format) + ", expected " +
                     expected);
  return *w.ws;
}

// The layer of `cfg` on `ws` with `weights` (their fields as cfg.weight_format says), into *out.
void create_layer(epfuse::Workspace& ws, const epfuse_layer_config& cfg, const epfuse::ExpertWeights& weights,
                  epfuse_layer** out) {
  auto l = std::make_unique<epfuse_layer>();
  l->layer = epfuse::MoeLayer::create(to_config(cfg), ws, weights);
  *out = l.release();
}

}  // namespace

extern "C" {

int epfuse_c_api_version(void) { return EPFUSE_C_API_VERSION; }

const char* epfuse_last_error(void) { return t_last_error.c_str(); }

int epfuse_comm_borrow_nccl(void* nccl_comm, epfuse_comm** out) {
  return guarded([&] {
    need(out, "epfuse_comm_borrow_nccl", "out");
    auto c = std::make_unique<epfuse_comm>();
    c->comm = epfuse::Communicator::borrow(static_cast<ncclComm_t>(nccl_comm));
    *out = c.release();
  });
}

int epfuse_nccl_unique_id(void* id_out, size_t id_bytes) {
  return guarded([&] {
    need_nonnull(id_out, "epfuse_nccl_unique_id", "id_out");
    EPFUSE_REQUIRE(id_bytes == sizeof(ncclUniqueId), epfuse::ErrorCode::kInvalidArgument,
                   "epfuse_nccl_unique_id: id_bytes = " + std::to_string(id_bytes) + ", an ncclUniqueId has " +
                       std::to_string(sizeof(ncclUniqueId)));
    ncclUniqueId id{};
    EPFUSE_NCCL_CHECK(ncclGetUniqueId(&id));
    std::memcpy(id_out, &id, sizeof id);
  });
}

int epfuse_comm_init_rank(const void* id, size_t id_bytes, int world_size, int rank, int device, epfuse_comm** out) {
  return guarded([&] {
    need_nonnull(id, "epfuse_comm_init_rank", "id");
    need(out, "epfuse_comm_init_rank", "out");
    EPFUSE_REQUIRE(id_bytes == sizeof(ncclUniqueId), epfuse::ErrorCode::kInvalidArgument,
                   "epfuse_comm_init_rank: id_bytes = " + std::to_string(id_bytes) + ", an ncclUniqueId has " +
                       std::to_string(sizeof(ncclUniqueId)));
    EPFUSE_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size && device >= 0,
                   epfuse::ErrorCode::kInvalidArgument,
                   "epfuse_comm_init_rank: rank " + std::to_string(rank) + " of world " + std::to_string(world_size) +
                       " on device " + std::to_string(device) + " is out of range");
    ncclUniqueId uid{};
    std::memcpy(&uid, id, sizeof uid);
    // The bound on the communicator's host collectives, as under bootstrap.
    const std::chrono::milliseconds timeout(
        epfuse::env::collective_timeout_ms(epfuse::BootstrapOptions{}.collective_timeout.count()));
    auto c = std::make_unique<epfuse_comm>();
    c->comm = epfuse::Communicator::init_rank(uid, world_size, rank, device, timeout);
    *out = c.release();
  });
}

int epfuse_comm_destroy(epfuse_comm* comm) {
  return guarded([&] {
    std::unique_ptr<epfuse_comm> c(comm);
    if (!c) return;
    // Owned: a barrier bounded by the collective timeout (past it the communicator is aborted and
    // stderr says so), then finalized; after epfuse_comm_abort, local. Borrowed: left to its owner.
    c->comm.reset();
  });
}

int epfuse_comm_abort(epfuse_comm* comm, const char* why) {
  return guarded([&] {
    epfuse_comm& c = need(comm, "epfuse_comm_abort", "comm");
    c.comm->abort(why != nullptr && why[0] != '\0' ? why : "epfuse_comm_abort");
  });
}

int epfuse_comm_aborted(const epfuse_comm* comm, int* aborted) {
  return guarded([&] {
    need(aborted, "epfuse_comm_aborted", "aborted") = need(comm, "epfuse_comm_aborted", "comm").comm->aborted() ? 1 : 0;
  });
}

int epfuse_comm_rank(const epfuse_comm* comm, int* rank) {
  return guarded([&] {
    need(rank, "epfuse_comm_rank", "rank") = need(comm, "epfuse_comm_rank", "comm").comm->rank();
  });
}

int epfuse_comm_world_size(const epfuse_comm* comm, int* world_size) {
  return guarded([&] {
    need(world_size, "epfuse_comm_world_size", "world_size") =
        need(comm, "epfuse_comm_world_size", "comm").comm->world_size();
  });
}

int epfuse_workspace_create(epfuse_comm* comm, const epfuse_layer_config* capacity, epfuse_workspace** out) {
  return guarded([&] {
    epfuse_comm& c = need(comm, "epfuse_workspace_create", "comm");
    const epfuse_layer_config& cap = need(capacity, "epfuse_workspace_create", "capacity");
    need(out, "epfuse_workspace_create", "out");
    auto w = std::make_unique<epfuse_workspace>();
    w->ws = epfuse::Workspace::create(*c.comm, to_config(cap));
    *out = w.release();
  });
}

int epfuse_workspace_destroy(epfuse_workspace* ws) {
  return guarded([&] {
    std::unique_ptr<epfuse_workspace> w(ws);
    if (!w) return;
    // Destruction meets the peers in a bounded barrier (skipped once the communicator is aborted);
    // a barrier that times out aborts the communicator, which is how a dead peer shows here.
    epfuse::Communicator& comm = w->ws->comm();
    const bool was_aborted = comm.aborted();
    w.reset();
    if (!was_aborted && comm.aborted())
      throw epfuse::Error(epfuse::ErrorCode::kTimeout,
                          "epfuse_workspace_destroy: rank " + std::to_string(comm.rank()) +
                              ": the peers never met the destruction's barrier within the collective timeout (" +
                              std::to_string(comm.collective_timeout().count()) +
                              " ms): the workspace is freed and the communicator aborted (a rank is dead or stalled)");
  });
}

int epfuse_workspace_memory(const epfuse_workspace* ws, size_t* symmetric_bytes, size_t* private_bytes) {
  return guarded([&] {
    const epfuse::MemoryFootprint m = need(ws, "epfuse_workspace_memory", "ws").ws->memory();
    need(symmetric_bytes, "epfuse_workspace_memory", "symmetric_bytes") = m.symmetric_bytes;
    need(private_bytes, "epfuse_workspace_memory", "private_bytes") = m.private_bytes;
  });
}

int epfuse_layer_create(epfuse_workspace* ws, const epfuse_layer_config* config, const void* w13, const void* w2,
                        epfuse_layer** out) {
  return guarded([&] {
    epfuse::Workspace& w = creation_args(ws, config, out, "epfuse_layer_create", EPFUSE_WEIGHTS_BF16,
                                         "EPFUSE_WEIGHTS_BF16 (FP8 experts: epfuse_layer_create_fp8)");
    epfuse::ExpertWeights weights;
    weights.w13 = static_cast<const epfuse::bf16*>(w13);
    weights.w2 = static_cast<const epfuse::bf16*>(w2);
    create_layer(w, *config, weights, out);
  });
}

int epfuse_layer_create_fp8(epfuse_workspace* ws, const epfuse_layer_config* config, const void* w13,
                            const void* w13_scales, int64_t w13_scales_count, const void* w2, const void* w2_scales,
                            int64_t w2_scales_count, epfuse_layer** out) {
  return guarded([&] {
    epfuse::Workspace& w = creation_args(ws, config, out, "epfuse_layer_create_fp8", EPFUSE_WEIGHTS_FP8_BLOCK128,
                                         "EPFUSE_WEIGHTS_FP8_BLOCK128 (bf16 experts: epfuse_layer_create)");
    epfuse::ExpertWeights weights;
    weights.w13_fp8 = static_cast<const uint8_t*>(w13);
    weights.w2_fp8 = static_cast<const uint8_t*>(w2);
    weights.w13_scales = w13_scales;
    weights.w2_scales = w2_scales;
    weights.w13_scales_count = w13_scales_count;
    weights.w2_scales_count = w2_scales_count;
    create_layer(w, *config, weights, out);
  });
}

int epfuse_layer_destroy(epfuse_layer* layer) {
  return guarded([&] { delete layer; });
}

int epfuse_layer_forward(epfuse_layer* layer, const void* x, const int32_t* topk_idx, const float* topk_weights,
                         int num_tokens, void* y, void* stream) {
  return guarded([&] {
    epfuse_layer& l = need(layer, "epfuse_layer_forward", "layer");
    l.layer->forward({static_cast<const epfuse::bf16*>(x), topk_idx, topk_weights, num_tokens},
                     static_cast<epfuse::bf16*>(y), static_cast<cudaStream_t>(stream));
  });
}

int epfuse_layer_forward_fp8(epfuse_layer* layer, const void* x_fp8, const float* x_scales, const int32_t* topk_idx,
                             const float* topk_weights, int num_tokens, void* y, void* stream) {
  return guarded([&] {
    epfuse_layer& l = need(layer, "epfuse_layer_forward_fp8", "layer");
    epfuse::TokenBatch batch{nullptr, topk_idx, topk_weights, num_tokens};
    batch.x_fp8 = static_cast<const uint8_t*>(x_fp8);
    batch.x_scales = x_scales;
    l.layer->forward(batch, static_cast<epfuse::bf16*>(y), static_cast<cudaStream_t>(stream));
  });
}

int epfuse_layer_check_errors(epfuse_layer* layer, void* stream) {
  return guarded([&] {
    need(layer, "epfuse_layer_check_errors", "layer").layer->check_errors(static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
