#include "fused/fused_layer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unistd.h>
#include <utility>

#include <cuda_runtime.h>

#include "comm/collective_step.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/device_guard.h"
#include "common/env.h"
#include "common/fault.h"
#include "common/fp8.h"
#include "common/overlap.h"
#include "common/stream_turn.h"
#include "device/gemm/gemm_maps_wgmma.h"
#include "device/kernel/kernel_params.h"
#include "device/protocol/epoch.h"
#include "device/protocol/task_map.h"
#include "epfuse/error.h"
#include "fused/describe_error.h"
#include "fused/fused_kernel.h"
#include "fused/heuristics.h"
#include "fused/plan.h"
#include "fused/profile.h"
#include "fused/tensor_map.h"
#include "fused/window_view.h"
#include "fused/workspace_turn.h"
#include "weights/block_scales.h"
#include "weights/fp8_weights.h"

namespace epfuse::fused {
namespace {

using detail::Fault;
using detail::FaultKind;
using detail::fault_from_env;

// The turns of the fused workspaces in this process, by workspace_turn_key (workspace_turn.h).
// Never destroyed: a workspace may outlive static destruction (one leaked at exit by a binding).
detail::SharedTurns<std::pair<int, uintptr_t>>& workspace_turns() {
  static auto* turns = new detail::SharedTurns<std::pair<int, uintptr_t>>();
  return *turns;
}

// The workspace of the fused layer (epfuse/workspace.h): the symmetric window, the private buffers
// (control block included) and the cross-stream order of its layers' forwards, laid out for the
// capacity; every layer on it addresses with these offsets (FusedParams::capacity) and computes with
// its own dims.
class FusedWorkspace final : public Workspace {
 public:
  FusedWorkspace(Communicator& comm, const detail::CheckedConfig& checked)
      : comm_(comm), capacity_(checked.config()), plan_(plan_fused(padded(capacity_), comm.world_size())) {
    const std::string who = "rank " + std::to_string(comm.rank()) + ": ";
    // Creation is collective: each step's local work (checks, allocations) ends with every rank
    // agreeing that all of them succeeded (agree_on_step), so that one rank's failure (a bad
    // EPFUSE_TIMEOUT_MS, an allocation) fails every rank instead of leaving them in the next
    // collective.
    detail::agree_on_step(comm, "Workspace::create", [&] {
      EPFUSE_REQUIRE(checked.world_size() == comm.world_size(), ErrorCode::kInternal,
                     who + "the workspace's capacity was checked for another world size");
      // Under NCCL every peer is reached through LSA pointers: all ranks must share one NVLink domain
      // (the inter-node GIN path is not implemented).
      if (comm.transport() == Transport::kNccl) {
        const int lsa_ranks = lsa_team_size(comm.nccl());
        EPFUSE_REQUIRE(lsa_ranks == comm.world_size(), ErrorCode::kUnsupported,
                       who + "fused layer needs all " + std::to_string(comm.world_size()) +
                           " ranks in one NVLink (LSA) team; this rank's team has " + std::to_string(lsa_ranks));
      } else {
        const int queues = env::device_max_connections();
        EPFUSE_REQUIRE(queues >= comm.world_size(), ErrorCode::kUnsupported,
                       who + "one-GPU mode with " + std::to_string(comm.world_size()) +
                           " ranks needs CUDA_DEVICE_MAX_CONNECTIONS >= " + std::to_string(comm.world_size()) +
                           " (found " + std::to_string(queues) +
                           "), set before the process's first CUDA call: ranks sharing a hardware queue "
                           "wait for each other's forwards forever");
      }
      timeout_ns_ = env::fused_timeout_ms(comm.rank()) * 1000000ull;
      programmatic_ = env::programmatic_launch();
      schedule_lag_quarters_ = env::schedule_lag_quarters();
      if (std::optional<Fault> f = fault_from_env(); f && f->kind == FaultKind::kFailCreate && f->rank == comm.rank())
        throw Error(ErrorCode::kCuda, who + "EPFUSE_FAULT: fail_create: the workspace's allocation failed (injected)");
    });
    std::optional<detail::DeviceGuard> guard;
    try {
      guard.emplace(comm.device());
    } catch (const Error& e) {  // every error names its rank
      throw Error(e.code(), who + e.what());
    }
    // Zeroed once: flags and counters then only move forward (epochs, monotonic counters), and the
    // control block's epoch starts at 0 (the first call is epoch 1). Peers may write into this window
    // as soon as their first forward starts, so every rank zeroes before the final agreement.
    window_ = comm.alloc_symmetric(plan_.symmetric_bytes());  // collective, agreed inside
    detail::agree_on_step(comm, "Workspace::create (buffers)", [&] {
      EPFUSE_CUDA_CHECK(cudaMemset(window_.local(), 0, plan_.symmetric_bytes()));
      // The kernel reaches the window through NCCL's view of it, the zeroing above through the
      // allocation: both must be the same memory (window_view.h).
      if (const WindowViewMismatch m = first_window_view_mismatch(window_.window(), window_.local(),
                                                                  plan_.symmetric_bytes(), nullptr);
          m.offset >= 0)
        throw Error(ErrorCode::kNccl, who + describe(m, plan_.symmetric_bytes()));
      private_ = detail::DeviceBuffer(plan_.private_bytes());
      EPFUSE_CUDA_CHECK(cudaMemset(private_.as(), 0, plan_.private_bytes()));
      host_failed_ = detail::PinnedBuffer(sizeof(uint32_t));
      *host_failed_.as<uint32_t>() = 0;
      EPFUSE_CUDA_CHECK(cudaHostGetDevicePointer(&host_failed_device_, host_failed_.as(), 0));
      // Made here, before the device synchronisation, never in a forward (common/stream_turn.h).
      turn_ = workspace_turns().turn(workspace_turn_key(comm.device(), comm.transport() == Transport::kLoopback, &comm));
      EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
    });
  }

  ~FusedWorkspace() override {
    // Destruction is collective under NCCL (the window's deregistration): meet the peers first in a
    // bounded barrier, so that a dead peer costs the collective timeout and an abort (after which the
    // window is freed locally) instead of a hang. The loopback world frees its slices without a
    // collective.
    if (comm_.transport() == Transport::kNccl && !comm_.aborted()) {
      try {
        comm_.barrier();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "epfuse: destroying the fused workspace: %s\n", e.what());
      }
    }
    detail::DeviceGuard guard(comm_.device());
    turn_.reset();  // its event, when this was its last workspace
    private_ = detail::DeviceBuffer();  // freed on the communicator's device
  }

  const LayerConfig& capacity() const override { return capacity_; }
  Communicator& comm() const override { return comm_; }
  MemoryFootprint memory() const override {
    return {plan_.symmetric_bytes(), plan_.private_bytes() + (pad_stage_ ? pad_stage_->bytes() : 0)};
  }
  bool failed() const override { return failed_.load(); }

  // The staging rows of the padded layers on this workspace (padding.h), made by the first of them
  // (inside its creation's agreed step) for the capacity's padded hidden size.
  std::shared_ptr<padding::Stage> pad_stage() {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (!pad_stage_) {
      detail::DeviceGuard guard(comm_.device());
      pad_stage_ = std::make_shared<padding::Stage>(capacity_.max_tokens_per_rank, padded(capacity_).hidden);
    }
    return pad_stage_;
  }
  uint64_t timeout_ms() const { return timeout_ns_ / 1000000ull; }
  // EPFUSE_PDL, read at creation: the fused kernel's launches may overlap the previous kernel's tail
  // (launch_fused_kernel).
  bool programmatic_launch() const { return programmatic_; }

  // Sizes compare as the kernel runs them (padded, padding.h), so that a padded layer (3072 for 2880)
  // fits the workspace made for its caller's size.
  std::string check_fits(const LayerConfig& cfg) const override {
    auto over = [](const char* field, long long v, long long cap) {
      return std::string(field) + "=" + std::to_string(v) + " exceeds the workspace's " + std::to_string(cap);
    };
    const LayerConfig run = padded(cfg), cap = padded(capacity_);
    if (run.hidden > cap.hidden) {
      if (cfg.hidden > capacity_.hidden) return over("hidden", cfg.hidden, capacity_.hidden);
      // e.g. 2880 pads to 3072 (padding.h), which a workspace for 2944 (not padded) cannot hold.
      return "hidden=" + std::to_string(cfg.hidden) + " runs padded to " + std::to_string(run.hidden) +
             ", more than the workspace's " + std::to_string(cap.hidden) + ": give the workspace hidden >= " +
             std::to_string(run.hidden);
    }
    if (run.intermediate > cap.intermediate) return over("intermediate", cfg.intermediate, capacity_.intermediate);
    if (cfg.num_experts > capacity_.num_experts) return over("num_experts", cfg.num_experts, capacity_.num_experts);
    if (cfg.topk > capacity_.topk) return over("topk", cfg.topk, capacity_.topk);
    // Experts per rank follow from num_experts (one world size).
    if (cfg.max_tokens_per_rank > capacity_.max_tokens_per_rank)
      return over("max_tokens_per_rank", cfg.max_tokens_per_rank, capacity_.max_tokens_per_rank);
    // FP8 layers need the fp8_x region, which only a workspace made for an FP8 capacity has.
    if (cfg.weight_format == WeightFormat::kFp8Block128 && capacity_.weight_format != WeightFormat::kFp8Block128)
      return "weight_format=fp8-block128 needs a workspace created with an fp8-block128 capacity";
    if (cfg.weight_format == WeightFormat::kFp8Block128 &&
        !device::fp8_h_fits(plan_.dims, plan_fused(run, comm_.world_size()).dims))
      return "the FP8 h rows do not fit the workspace's h region";
    return "";
  }

  // The kernel argument's workspace fields.
  void fill(device::FusedParams& prm) const {
    prm.capacity = plan_.dims;
    prm.sym = plan_.sym;
    prm.priv = plan_.priv;
    prm.timeout_ns = timeout_ns_;
    prm.schedule_lag_quarters = schedule_lag_quarters_;
    prm.window = window_.window();
    prm.loopback.slices = static_cast<char*>(window_.slices_base());
    prm.loopback.stride = window_.stride();
    prm.workspace = private_.as<char>();
    prm.fp8.x_offset = plan_.fp8_x;
    prm.split_k.offset = plan_.split_k;
    prm.split_k.slots = plan_.split_k != 0 ? device::kSplitSlots : 0;
    prm.host_failed = static_cast<uint32_t*>(host_failed_device_);
  }

  // Whether a call's kernel on this workspace ended aborted (it sets the mapped word as it finishes):
  // known on the host without a synchronisation, once that kernel has finished.
  bool device_failed() const {
    return host_failed_.as() != nullptr && *static_cast<const volatile uint32_t*>(host_failed_.as()) != 0;
  }

  // A forward's turn on this workspace (stream_turn.h), taken before it reads or writes anything the
  // workspace's forwards share (host members included) and kept until its launch is enqueued: on
  // `stream` it waits for the previous forward of any layer on the workspace (or, under NCCL, on its
  // GPU), on any stream and in any host thread; inside a capture, at every replay.
  detail::StreamTurn::Held take_turn(cudaStream_t stream) { return turn_->take(stream); }
  // The same mutex without the stream order, for a layer's host state outside forward.
  std::unique_lock<std::mutex> hold() { return turn_->hold(); }

  // The first error that made the workspace unusable (a layer's bad input or device error), named in
  // every later forward's refusal. check_errors sets it without the turn (it synchronises a stream).
  void mark_failed(const std::string& why) {
    std::lock_guard<std::mutex> lock(state_mutex_);
    if (!failed_.load()) failed_reason_ = why;
    failed_.store(true);
  }
  std::string failed_reason() const {
    std::lock_guard<std::mutex> lock(state_mutex_);
    return failed_reason_;
  }
  // The next layer's identity (1, 2, ...): layers are created collectively, so every rank numbers the
  // same layer alike (FusedParams::layer_id).
  uint32_t next_layer_id() { return ++layers_created_; }

  // The error record of the workspace's calls (the first error since its creation), after `stream`.
  device::ErrorRecord error_record(cudaStream_t stream) const {
    device::ErrorRecord rec{};
    const size_t at = plan_.priv.control + offsetof(device::FusedControl, error);
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(&rec, private_.as<char>() + at, sizeof rec, cudaMemcpyDeviceToHost, stream));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    return rec;
  }

 private:
  static LayerConfig padded(const LayerConfig& cfg) { return padding::padded_config(cfg, Impl::kFused); }

  Communicator& comm_;
  LayerConfig capacity_;  // as the caller gave it; the plan is for its padded sizes
  FusedPlan plan_;
  uint64_t timeout_ns_ = 0;
  bool programmatic_ = true;
  int schedule_lag_quarters_ = -1;  // EPFUSE_SCHEDULE_LAG, read at creation
  SymmetricBuffer window_;
  detail::DeviceBuffer private_;
  detail::PinnedBuffer host_failed_;  // FusedParams::host_failed, as the host reads it
  void* host_failed_device_ = nullptr;
  std::shared_ptr<detail::StreamTurn> turn_;  // workspace_turns(): the order of forwards
  std::atomic<bool> failed_{false};
  mutable std::mutex state_mutex_;  // failed_reason_, pad_stage_
  std::string failed_reason_;
  std::atomic<uint32_t> layers_created_{0};
  std::shared_ptr<padding::Stage> pad_stage_;
};

class FusedLayer final : public MoeLayer {
 public:
  // On a shared workspace, or (owned != null) on one made for this layer alone.
  FusedLayer(const detail::CheckedConfig& checked, FusedWorkspace& ws, const ExpertWeights& weights,
             std::unique_ptr<FusedWorkspace> owned = nullptr)
      : cfg_(checked.config()),
        owned_(std::move(owned)),
        ws_(ws),
        weights_(weights),
        dims_(plan_fused(cfg_, ws.comm().world_size()).dims),
        layer_id_(ws.next_layer_id()) {
    const LayerConfig& cfg = cfg_;
    Communicator& comm = ws.comm();
    const std::string who = "rank " + std::to_string(comm.rank()) + ": ";
    // Collective like the workspace's: every rank's local steps, then an agreement that all succeeded
    // (agree_on_step), so that no rank goes on to forward while a peer's creation failed. The
    // agreement also keeps every rank in creation until all are past cudaFuncSetAttribute
    // (prepare_fused_kernel), which waits for running launches of the kernel: in the one-GPU mode a
    // peer's forward may wait for this rank.
    detail::agree_on_step(comm, "MoeLayer::create (fused)", [&] {
      EPFUSE_REQUIRE(checked.world_size() == comm.world_size(), ErrorCode::kInternal,
                     who + "the layer's config was checked for another world size");
      if (!fp8_)
        EPFUSE_REQUIRE(weights.w13 != nullptr && weights.w2 != nullptr, ErrorCode::kInvalidArgument,
                       who + "fused layer: expert weights are null");
      const std::string fits = ws.check_fits(cfg);
      EPFUSE_REQUIRE(fits.empty(), ErrorCode::kInvalidConfig, who + "the layer does not fit its workspace: " + fits);
      detail::DeviceGuard guard(comm.device());
      int sms = 0;
      EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm.device()));
      // The CTAs of a launch wait for each other and for the peers' launches, so every CTA of every
      // kernel sharing this GPU (one per rank in the one-GPU mode) must be resident at once: a CTA
      // waiting for an SM would never be scheduled while the resident ones spin. Checked here for every
      // tile shape a call may pick.
      const int sharing = comm.ranks_per_device();
      grid_ = cfg.num_sms > 0 ? cfg.num_sms : sms / sharing;
      if (const std::optional<std::string> name = env::fused_tile()) forced_tile_ = forced_fused_tile(cfg, *name, who);
      EPFUSE_REQUIRE(grid_ >= 1, ErrorCode::kUnsupported,
                     who + "fused layer: " + std::to_string(sharing) + " ranks cannot share the " + std::to_string(sms) +
                         " SMs of this GPU (at least one SM per rank)");
      for (const GemmTileShape& s : supported_fused_tiles(cfg)) {
        const int per_sm = prepare_fused_kernel(comm.transport(), s, dims_);
        const std::string kernel = "fused kernel (block_m " + std::to_string(s.block_m) + ", " +
                                   std::to_string(fused_kernel_shape(s, dims_).smem_bytes) + " B smem)";
        EPFUSE_REQUIRE(per_sm >= 1, ErrorCode::kUnsupported, who + kernel + " cannot be resident on this GPU");
        EPFUSE_REQUIRE(static_cast<int64_t>(grid_) * sharing <= static_cast<int64_t>(sms) * per_sm,
                       ErrorCode::kUnsupported,
                       who + "SM budget num_sms = " + std::to_string(grid_) + " cannot be resident: " +
                           std::to_string(sharing) + " rank(s) x " + std::to_string(grid_) + " CTAs of the " + kernel +
                           " need more than this GPU's " + std::to_string(sms) + " SMs x " + std::to_string(per_sm) +
                           " CTA(s) per SM (every CTA must be resident at once)");
      }
      // TMA views of the weights (TileGemmTma), encoded once: the weights stay put for the layer's life.
      const int64_t L = dims_.local_experts(), H = cfg.hidden, I = cfg.intermediate;
      if (fp8_) {
        init_fp8(weights, who);
      } else {
        w13_map_ = weight_tensor_map(weights.w13, L * 2 * I, H, device::kWeightBoxRows);
        w2_map_ = weight_tensor_map(weights.w2, L * H, I, device::kWeightBoxRows);
      }
      // Fault injection (fault.h): only the rank it names keeps it. bad_ids needs a private copy of the
      // ids, allocated here where a device-synchronising allocation cannot wait for a peer's forward.
      if (std::optional<Fault> f = fault_from_env(); f && f->rank == comm.rank()) {
        fault_ = f;
        if (f->kind == FaultKind::kBadIds)
          fault_ids_ = detail::DeviceArray<int32_t>(static_cast<size_t>(cfg.max_tokens_per_rank) * cfg.topk);
      }
    });
  }

  ~FusedLayer() override {
    if (profile_.get() != nullptr || fault_ids_.get() != nullptr || w13_scales_.get() != nullptr ||
        w2_scales_.get() != nullptr) {
      detail::DeviceGuard guard(ws_.comm().device());
      profile_ = detail::DeviceArray<device::FusedProfile>();  // freed on the communicator's device
      fault_ids_ = detail::DeviceArray<int32_t>();
      w13_scales_ = detail::DeviceArray<float>();
      w2_scales_ = detail::DeviceArray<float>();
    }
  }

  // Phase timing = the in-kernel profile (device/diagnostics/profile_record.h): per-phase CTA-time / CTAs.
  void set_phase_timing(bool enabled) override {
    std::unique_lock<std::mutex> lock = ws_.hold();  // forward reads the flags under the turn
    if (enabled && profile_.get() == nullptr) {
      detail::DeviceGuard guard(ws_.comm().device());
      profile_ = detail::DeviceArray<device::FusedProfile>(1);
    }
    if (!enabled && timing_ && print_profile_ && ws_.comm().rank() == 0 && profile_sum_.calls > 0)
      std::fprintf(stderr, "%s", format_profile(profile_sum_).c_str());
    if (enabled && !timing_) profile_sum_ = ProfileSummary{};
    timing_ = enabled;
    profiled_ = false;
  }

  std::optional<PhaseTimes> last_phase_times() override {
    // Held while the record is read: no later forward can zero it meanwhile.
    std::unique_lock<std::mutex> lock = ws_.hold();
    if (!profiled_) return std::nullopt;
    detail::DeviceGuard guard(ws_.comm().device());
    // On the forward's stream, not the legacy default stream, whose implicit synchronisation could
    // wait for other ranks' kernels in the one-GPU mode.
    device::FusedProfile rec{};
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(&rec, profile_.get(), sizeof rec, cudaMemcpyDeviceToHost, profiled_stream_));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(profiled_stream_));
    const ProfileSummary s = summarize_profile(rec);
    if (!summed_) accumulate_profile(profile_sum_, s);  // once per forward, however often it is asked
    summed_ = true;
    return phase_times_of(s);
  }

  void forward(const TokenBatch& in, bf16* y, cudaStream_t stream) override {
    Communicator& comm = ws_.comm();
    const std::string who = "rank " + std::to_string(comm.rank()) + ": ";
    detail::DeviceGuard guard(comm.device());
    // After Communicator::abort the symmetric window's peers may be gone: no kernel touches it.
    comm.require_not_aborted("fused forward");
    // One forward at a time on the workspace, from its first read of shared state (calls_, the flags,
    // the profile record) to its launch: a second host thread waits here, and on the device this
    // forward runs after the previous one on the workspace, whatever its stream (or graph replay).
    detail::StreamTurn::Held turn = ws_.take_turn(stream);
    const int64_t call = calls_++;
    const bool fault = fault_ && fault_->fires(comm.rank(), call);
    // An earlier call's kernel failed (the device says so without a sync): its error, now, rather than
    // another call on a workspace whose every later call only returns NaN.
    if (!ws_.failed() && ws_.device_failed()) {
      check_errors(stream);
      ws_.mark_failed("a device error without an error record");
    }
    // Documented in epfuse/layer.h (MoeLayer::forward): kInternal, naming the error that broke it.
    EPFUSE_REQUIRE(!ws_.failed(), ErrorCode::kInternal,
                   who + "the fused layer's workspace is unusable after an earlier error (" + ws_.failed_reason() +
                       "); re-create it");
    // Bad arguments: still launch, with no tokens, so that the peers (already in this call) learn of it
    // from this rank's count message and fail with kInvalidArgument instead of timing out.
    std::string problem;
    uint32_t host_status = 0;
    const bool caller_fp8_x = in.x_fp8 != nullptr || in.x_scales != nullptr;  // TokenBatch::x_fp8
    const void* x_rows = caller_fp8_x ? static_cast<const void*>(in.x_fp8) : in.x;
    if (in.num_tokens < 0 || in.num_tokens > cfg_.max_tokens_per_rank) {
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadTokenCount);
      problem = who + "num_tokens = " + std::to_string(in.num_tokens) + " is outside [0, max_tokens_per_rank = " +
                std::to_string(cfg_.max_tokens_per_rank) + "]";
    } else if (caller_fp8_x && !fp8_) {
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
      problem = who + "x_fp8 / x_scales (x quantised by the caller) need a layer of FP8 weights; this one is bf16";
    } else if (in.num_tokens > 0 &&
               !(x_rows && (!caller_fp8_x || in.x_scales) && in.topk_idx && in.topk_weights && y)) {
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
      problem = who + "null input or output pointer with num_tokens = " + std::to_string(in.num_tokens) +
                (caller_fp8_x ? " (x_fp8 needs x_scales too)" : "");
    } else if (in.num_tokens > 0 && (reinterpret_cast<uintptr_t>(x_rows) % 16 != 0 ||
                                     reinterpret_cast<uintptr_t>(in.x_scales) % 4 != 0 ||
                                     reinterpret_cast<uintptr_t>(y) % 16 != 0)) {
      // Rows move as 16-byte vectors (dispatch, GEMM loads, combine stores).
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
      problem = who + (caller_fp8_x ? "x_fp8 and y must be 16-byte aligned, x_scales 4-byte aligned"
                                    : "x and y must be 16-byte aligned");
    } else if (const char* input = aliased_input(in, y)) {
      // y is written while the inputs are still read (by this rank and, for x, by its peers).
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
      problem = who + "y overlaps " + input + ": the output must not alias an input; give y its own memory";
    }
    device::FusedParams prm;
    ws_.fill(prm);
    prm.dims = dims_;
    prm.rank = comm.rank();
    prm.layer_id = layer_id_;
    prm.num_tokens = host_status == 0 ? in.num_tokens : 0;
    prm.tasks = device::make_task_space(prm.num_tokens, grid_, dims_.world);
    prm.host_status = host_status;
    // Rows per local expert if every rank has about as many tokens as this one (the real counts are
    // known only on the device); the tile shape is a per-rank choice, not part of the protocol.
    const int64_t rows = static_cast<int64_t>(prm.num_tokens) * cfg_.topk * comm.world_size() / cfg_.num_experts;
    const GemmTileShape tile =
        forced_tile_ ? *forced_tile_
                     : choose_fused_tile(cfg_, static_cast<int>(std::min<int64_t>(rows, 1 << 30)), dims_.local_experts(), grid_,
                                       prm.split_k.slots);
    prm.swiglu_clamp = cfg_.swiglu_clamp;
    prm.combine_lag = device::combine_wants_lag(cfg_.intermediate, fp8_);
    prm.x = in.x;
    prm.topk_idx = in.topk_idx;
    prm.topk_weights = in.topk_weights;
    prm.y = y;
    prm.w13 = weights_.w13;
    prm.w2 = weights_.w2;
    prm.w13_map = w13_map_;
    prm.w2_map = w2_map_;
    if (fp8_) {
      prm.fp8.w13_scales = w13_scales_.get();
      prm.fp8.w2_scales = w2_scales_.get();
      prm.fp8.w13_kb = weights::padded_k_blocks(cfg_.hidden);
      prm.fp8.w2_kb = weights::padded_k_blocks(cfg_.intermediate);
      prm.fp8.scale_format = cfg_.scale_format;
      if (caller_fp8_x && host_status == 0) {
        prm.fp8.x_codes = in.x_fp8;
        prm.fp8.x_scales = in.x_scales;
      }
    }
    if (timing_) {
      // The kernel adds into the record: zero it first (stream-ordered, only while timing).
      EPFUSE_CUDA_CHECK(cudaMemsetAsync(profile_.get(), 0, sizeof(device::FusedProfile), stream));
      prm.profile = profile_.get();
      profiled_stream_ = stream;
    }
    profiled_ = timing_;
    summed_ = false;
    if (fault && inject_fault(call, prm, in, stream)) return;
    launch_fused_kernel(comm.transport(), tile, prm, grid_, ws_.programmatic_launch(), stream);
    last_tile_ = tile;
    turn.done();
    if (host_status != 0) {
      ws_.mark_failed("forward call " + std::to_string(call) + ": " + problem);
      throw Error(ErrorCode::kInvalidArgument, problem + "; the workspace must be re-created");
    }
  }

  // The name of the input y overlaps (x, or x_fp8 / x_scales, topk_idx, topk_weights), or nullptr.
  const char* aliased_input(const TokenBatch& in, const bf16* y) const {
    const size_t T = static_cast<size_t>(in.num_tokens), H = static_cast<size_t>(cfg_.hidden),
                 K = static_cast<size_t>(cfg_.topk);
    const detail::ByteRange out{"y", y, T * H * sizeof(bf16)};
    const char* hit = in.x_fp8 != nullptr || in.x_scales != nullptr
                          ? detail::first_overlap(out, {{"x_fp8", in.x_fp8, T * H},
                                                        {"x_scales", in.x_scales,
                                                         T * fp8::num_blocks(cfg_.hidden) * sizeof(float)}})
                          : detail::first_overlap(out, {{"x", in.x, T * H * sizeof(bf16)}});
    return hit != nullptr ? hit
                          : detail::first_overlap(out, {{"topk_idx", in.topk_idx, T * K * sizeof(int32_t)},
                                                        {"topk_weights", in.topk_weights, T * K * sizeof(float)}});
  }

  void check_errors(cudaStream_t stream) override {
    detail::DeviceGuard guard(ws_.comm().device());
    const device::ErrorRecord rec = ws_.error_record(stream);
    if (rec.kind != 0) {
      const std::string what = describe_error(rec);
      ws_.mark_failed("a device error: " + what);
      throw Error(error_code(rec), what);
    }
  }

  Impl impl() const override { return Impl::kFused; }
  const LayerConfig& config() const override { return cfg_; }

  // EPFUSE_FAULT's misbehaviour in this call (fault.h), just before the launch; true: do not launch.
  bool inject_fault(int64_t call, device::FusedParams& prm, const TokenBatch& in, cudaStream_t stream) {
    const bool skip = detail::act_on_fault(*fault_, ws_.comm().rank(), call,
                                           std::chrono::milliseconds(2 * static_cast<int64_t>(ws_.timeout_ms())),
                                           "the launch");
    if (fault_->kind == FaultKind::kBadIds && prm.num_tokens > 0) {
      detail::copy_ids_with_bad_first(fault_ids_.get(), in.topk_idx, static_cast<size_t>(prm.num_tokens) * cfg_.topk,
                                      stream);
      prm.topk_idx = fault_ids_.get();
    }
    if (fault_->kind == FaultKind::kHang) prm.fault_hang = fault_->hang_at;  // this call's kernel only
    return skip;
  }
  // weight_format fp8-block128: checks the FP8 fields like the unfused chain (weights/fp8_weights.h:
  // pointers, alignment, scale counts), reads the scales once (a synchronous copy; every scale checked,
  // the first bad one named) and keeps them as fp32 in the padded block layout (weights/block_scales.h: each
  // 128-row block's K-block scales padded to 4 floats, the kernel's 16-byte reads); TMA views of the codes.
  void init_fp8(const ExpertWeights& weights, const std::string& who) {
    const int local = dims_.local_experts(), H = cfg_.hidden, I = cfg_.intermediate;
    // Other sizes reach this layer padded (padding.h, MoeLayer::create).
    EPFUSE_REQUIRE(H % 256 == 0 && I % 128 == 0, ErrorCode::kInternal,
                   who + "the fused FP8 kernel got hidden=" + std::to_string(H) + ", intermediate=" +
                       std::to_string(I) + " (needs hidden % 256 == 0 and intermediate % 128 == 0: unpadded)");
    if (const std::string problem = weights::check_fp8_weight_pointers(cfg_, local, weights); !problem.empty())
      throw Error(ErrorCode::kInvalidArgument, who + "MoeLayer::create: " + problem);
    const auto convert = [&](const void* device, int64_t count, int rows, int k, const char* name) {
      const std::vector<float> blocked = weights::read_block_scales(device, count, cfg_.scale_format, local, rows, k,
                                                                    name, who + "MoeLayer::create: ")
                                             .blocked;
      detail::DeviceArray<float> out(blocked.size());
      detail::copy_to_device_now(out.get(), blocked.data(), blocked.size() * sizeof(float));
      return out;
    };
    w13_scales_ = convert(weights.w13_scales, weights.w13_scales_count, fp8::w13_scale_rows(I), H, "w13_scales");
    w2_scales_ = convert(weights.w2_scales, weights.w2_scales_count, fp8::num_blocks(H), I, "w2_scales");
    w13_map_ = weight_tensor_map_fp8(weights.w13_fp8, int64_t{local} * 2 * I, H, device::kWeightBoxRows);
    w2_map_ = weight_tensor_map_fp8(weights.w2_fp8, int64_t{local} * H, I, device::kWeightBoxRows);
  }

  // A layer made with its own workspace reports it; on a shared one the layer adds no device memory.
  MemoryFootprint memory() const override { return owned_ ? ws_.memory() : MemoryFootprint{}; }
  const std::optional<GemmTileShape>& last_tile() const { return last_tile_; }

 private:
  LayerConfig cfg_;
  std::unique_ptr<FusedWorkspace> owned_;  // declared before ws_: it may be what ws_ refers to
  FusedWorkspace& ws_;
  ExpertWeights weights_;
  device::FusedDims dims_;
  int grid_ = 0;
  std::optional<GemmTileShape> forced_tile_;  // EPFUSE_FUSED_TILE, read at creation: every call's tile
  CUtensorMap w13_map_{};  // FP8: the views of the e4m3 codes
  CUtensorMap w2_map_{};
  bool fp8_ = cfg_.weight_format == WeightFormat::kFp8Block128;
  detail::DeviceArray<float> w13_scales_, w2_scales_;  // FP8: fp32 block scales, padded (init_fp8)
  // Phase timing (off by default): the device record of the last forward and the sum over forwards.
  bool timing_ = false;
  bool profiled_ = false;  // the last forward ran with the profile on
  bool summed_ = false;    // ... and was added to profile_sum_
  bool print_profile_ = env::profile_print();
  detail::DeviceArray<device::FusedProfile> profile_;
  cudaStream_t profiled_stream_ = nullptr;
  ProfileSummary profile_sum_;
  // Fault injection (fault.h): set only on the rank EPFUSE_FAULT names.
  int64_t calls_ = 0;  // forwards so far
  uint32_t layer_id_;  // FusedParams::layer_id: this layer's place in its workspace's creation order
  std::optional<Fault> fault_;
  detail::DeviceArray<int32_t> fault_ids_;  // bad_ids: the corrupted copy of topk_idx
  std::optional<GemmTileShape> last_tile_;  // the kernel instantiation the last forward launched
};

}  // namespace

std::optional<GemmTileShape> last_launched_tile(const MoeLayer& layer) {
  const auto* fused = dynamic_cast<const FusedLayer*>(&layer);
  return fused != nullptr ? fused->last_tile() : std::nullopt;
}

std::unique_ptr<Workspace> make_fused_workspace(Communicator& comm, const detail::CheckedConfig& capacity) {
  return std::make_unique<FusedWorkspace>(comm, capacity);
}

std::unique_ptr<MoeLayer> make_fused_layer(const detail::CheckedConfig& cfg, Communicator& comm,
                                           const ExpertWeights& weights) {
  auto ws = std::make_unique<FusedWorkspace>(comm, cfg);
  FusedWorkspace& ref = *ws;
  return std::make_unique<FusedLayer>(cfg, ref, weights, std::move(ws));
}

std::shared_ptr<padding::Stage> fused_pad_stage(Workspace& workspace) {
  auto* ws = dynamic_cast<FusedWorkspace*>(&workspace);
  EPFUSE_REQUIRE(ws != nullptr, ErrorCode::kInvalidArgument, "fused_pad_stage: the workspace is not a fused workspace");
  return ws->pad_stage();
}

std::unique_ptr<MoeLayer> make_fused_layer(const detail::CheckedConfig& cfg, Workspace& workspace,
                                           const ExpertWeights& weights) {
  auto* ws = dynamic_cast<FusedWorkspace*>(&workspace);
  EPFUSE_REQUIRE(ws != nullptr, ErrorCode::kInvalidArgument, "make_fused_layer: the workspace is not a fused workspace");
  return std::make_unique<FusedLayer>(cfg, *ws, weights);
}

}  // namespace epfuse::fused
