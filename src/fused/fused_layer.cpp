#include "fused/fused_layer.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include <cuda_runtime.h>

#include "common/check.h"
#include "device/epoch.h"
#include "device/gemm_layout_wgmma.h"
#include "device/kernel_params.h"
#include "epfuse/error.h"
#include "fused/describe_error.h"
#include "fused/fused_kernel.h"
#include "fused/heuristics.h"
#include "fused/plan.h"
#include "fused/profile.h"
#include "fused/tensor_map.h"

namespace epfuse::fused {
namespace {

constexpr uint64_t kDefaultTimeoutMs = 20000;

// EPFUSE_PROFILE=1: while phase timing is on, rank 0 prints the in-kernel profile's per-phase table
// (means over the timed calls) when timing is switched off again.
bool profile_print_from_env() {
  const char* s = std::getenv("EPFUSE_PROFILE");
  return s != nullptr && std::string(s) == "1";
}

uint64_t timeout_ms_from_env() {
  const char* s = std::getenv("EPFUSE_TIMEOUT_MS");
  if (s == nullptr || *s == '\0') return kDefaultTimeoutMs;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end != '\0' || v == 0)
    throw Error(ErrorCode::kInvalidArgument, std::string("EPFUSE_TIMEOUT_MS = '") + s + "' is not a positive integer");
  return v;
}

// The hardware queues CUDA gives the process's streams (CUDA's default when unset or malformed).
int device_connections_from_env() {
  constexpr int kCudaDefault = 8;
  const char* s = std::getenv("CUDA_DEVICE_MAX_CONNECTIONS");
  if (s == nullptr || *s == '\0') return kCudaDefault;
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  return *end == '\0' && v > 0 ? static_cast<int>(std::min<long>(v, LoopbackWorld::kMaxConnections)) : kCudaDefault;
}

// Runs a scope on the communicator's device and restores the caller's.
class OnDevice {
 public:
  explicit OnDevice(int device) {
    EPFUSE_CUDA_CHECK(cudaGetDevice(&saved_));
    if (saved_ != device) EPFUSE_CUDA_CHECK(cudaSetDevice(device));
  }
  ~OnDevice() { cudaSetDevice(saved_); }  // restoring cannot fail for a device that was current
  OnDevice(const OnDevice&) = delete;
  OnDevice& operator=(const OnDevice&) = delete;

 private:
  int saved_ = 0;
};

class FusedLayer final : public MoeLayer {
 public:
  FusedLayer(const LayerConfig& cfg, Communicator& comm, const ExpertWeights& weights)
      : cfg_(cfg), comm_(comm), weights_(weights), plan_(plan_fused(cfg, comm.world_size())) {
    validate_config(cfg, comm.world_size());
    EPFUSE_REQUIRE(weights.w13 != nullptr && weights.w2 != nullptr, ErrorCode::kInvalidArgument,
                   "rank " + std::to_string(comm.rank()) + ": fused layer: expert weights are null");
    const std::string who = "rank " + std::to_string(comm.rank()) + ": ";
    // Under NCCL every peer is reached through LSA pointers: all ranks must share one NVLink domain
    // (the inter-node GIN path is not implemented).
    if (comm.transport() == Transport::kNccl) {
      const int lsa_ranks = lsa_team_size(comm.nccl());
      EPFUSE_REQUIRE(lsa_ranks == comm.world_size(), ErrorCode::kUnsupported,
                     who + "fused layer needs all " + std::to_string(comm.world_size()) +
                         " ranks in one NVLink (LSA) team; this rank's team has " + std::to_string(lsa_ranks));
    }
    if (comm.transport() == Transport::kLoopback) {
      const int queues = device_connections_from_env();
      EPFUSE_REQUIRE(queues >= comm.world_size(), ErrorCode::kUnsupported,
                     who + "one-GPU mode with " + std::to_string(comm.world_size()) +
                         " ranks needs CUDA_DEVICE_MAX_CONNECTIONS >= " + std::to_string(comm.world_size()) +
                         " (found " + std::to_string(queues) +
                         "), set before the process's first CUDA call: ranks sharing a hardware queue "
                         "wait for each other's forwards forever");
    }
    timeout_ns_ = timeout_ms_from_env() * 1000000ull;
    OnDevice on(comm.device());
    int sms = 0;
    EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, comm.device()));
    // The CTAs of a launch wait for each other and for the peers' launches, so every CTA of every
    // kernel sharing this GPU (one per rank in the one-GPU mode) must be resident at once: a CTA
    // waiting for an SM would never be scheduled while the resident ones spin. Checked here for every
    // tile shape a call may pick.
    const int sharing = comm.ranks_per_device();
    grid_ = cfg.num_sms > 0 ? cfg.num_sms : sms / sharing;
    EPFUSE_REQUIRE(grid_ >= 1, ErrorCode::kUnsupported,
                   who + "fused layer: " + std::to_string(sharing) + " ranks cannot share the " + std::to_string(sms) +
                       " SMs of this GPU (at least one SM per rank)");
    for (const GemmTileShape& s : supported_fused_tiles(cfg)) {
      const int per_sm = prepare_fused_kernel(comm.transport(), s, plan_.dims);
      const std::string kernel = "fused kernel (block_m " + std::to_string(s.block_m) + ", " +
                                 std::to_string(fused_kernel_shape(s, plan_.dims).smem_bytes) + " B smem)";
      EPFUSE_REQUIRE(per_sm >= 1, ErrorCode::kUnsupported, who + kernel + " cannot be resident on this GPU");
      EPFUSE_REQUIRE(static_cast<int64_t>(grid_) * sharing <= static_cast<int64_t>(sms) * per_sm,
                     ErrorCode::kUnsupported,
                     who + "SM budget num_sms = " + std::to_string(grid_) + " cannot be resident: " +
                         std::to_string(sharing) + " rank(s) x " + std::to_string(grid_) + " CTAs of the " + kernel +
                         " need more than this GPU's " + std::to_string(sms) + " SMs x " + std::to_string(per_sm) +
                         " CTA(s) per SM (every CTA must be resident at once)");
    }
    // TMA views of the weights (TileGemmTma), encoded once: the weights stay put for the layer's life.
    const int64_t L = plan_.dims.local_experts(), H = cfg.hidden, I = cfg.intermediate;
    w13_map_ = weight_tensor_map(weights.w13, L * 2 * I, H, device::kWeightBoxRows);
    w2_map_ = weight_tensor_map(weights.w2, L * H, I, device::kWeightBoxRows);
    // Zeroed once: flags and counters then only move forward (epochs, monotonic counters). Peers may
    // write into this window as soon as their first forward starts, so every rank zeroes before the
    // barrier.
    window_ = comm.alloc_symmetric(plan_.symmetric_bytes());  // collective
    EPFUSE_CUDA_CHECK(cudaMemset(window_.local(), 0, plan_.symmetric_bytes()));
    EPFUSE_CUDA_CHECK(cudaMalloc(&workspace_, plan_.private_bytes()));
    EPFUSE_CUDA_CHECK(cudaMemset(workspace_, 0, plan_.private_bytes()));
    EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
    comm.barrier();
  }

  ~FusedLayer() override {
    if (workspace_ != nullptr || profile_ != nullptr) {
      OnDevice on(comm_.device());
      cudaFree(workspace_);  // destructor: nothing to report an error to
      cudaFree(profile_);
    }
  }

  // Phase timing = the in-kernel profile (device/profile.h): per-phase CTA-time / CTAs.
  void set_phase_timing(bool enabled) override {
    if (enabled && profile_ == nullptr) {
      OnDevice on(comm_.device());
      EPFUSE_CUDA_CHECK(cudaMalloc(&profile_, sizeof(device::FusedProfile)));
    }
    if (!enabled && timing_ && print_profile_ && comm_.rank() == 0 && profile_sum_.calls > 0)
      std::fprintf(stderr, "%s", format_profile(profile_sum_).c_str());
    if (enabled && !timing_) profile_sum_ = ProfileSummary{};
    timing_ = enabled;
    profiled_ = false;
  }

  std::optional<PhaseTimes> last_phase_times() override {
    if (!profiled_) return std::nullopt;
    OnDevice on(comm_.device());
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(profiled_stream_));
    device::FusedProfile rec{};
    EPFUSE_CUDA_CHECK(cudaMemcpy(&rec, profile_, sizeof rec, cudaMemcpyDeviceToHost));
    const ProfileSummary s = summarize_profile(rec);
    if (!summed_) accumulate_profile(profile_sum_, s);  // once per forward, however often it is asked
    summed_ = true;
    return phase_times_of(s);
  }

  void forward(const TokenBatch& in, bf16* y, cudaStream_t stream) override {
    const std::string who = "rank " + std::to_string(comm_.rank()) + ": ";
    EPFUSE_REQUIRE(!broken_, ErrorCode::kInternal,
                   who + "fused layer is unusable after an earlier device error; re-create it");
    // Bad arguments: still launch, with no tokens, so that the peers (already in this call) learn of it
    // from this rank's count message and fail with kInvalidArgument instead of timing out.
    std::string problem;
    uint32_t host_status = 0;
    if (in.num_tokens < 0 || in.num_tokens > cfg_.max_tokens_per_rank) {
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadTokenCount);
      problem = who + "num_tokens = " + std::to_string(in.num_tokens) + " is outside [0, max_tokens_per_rank = " +
                std::to_string(cfg_.max_tokens_per_rank) + "]";
    } else if (in.num_tokens > 0 && !(in.x && in.topk_idx && in.topk_weights && y)) {
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
      problem = who + "null input or output pointer with num_tokens = " + std::to_string(in.num_tokens);
    } else if (in.num_tokens > 0 && (reinterpret_cast<uintptr_t>(in.x) % 16 != 0 || reinterpret_cast<uintptr_t>(y) % 16 != 0)) {
      // Rows move as 16-byte vectors (dispatch, GEMM loads, combine stores).
      host_status = static_cast<uint32_t>(device::ErrorKind::kBadPointer);
      problem = who + "x and y must be 16-byte aligned";
    }
    OnDevice on(comm_.device());
    epoch_ = device::next_epoch(epoch_);
    device::FusedParams prm;
    prm.dims = plan_.dims;
    prm.sym = plan_.sym;
    prm.priv = plan_.priv;
    prm.rank = comm_.rank();
    prm.num_tokens = host_status == 0 ? in.num_tokens : 0;
    prm.epoch = epoch_;
    prm.host_status = host_status;
    // Rows per local expert if every rank has about as many tokens as this one (the real counts are
    // known only on the device); the tile shape is a per-rank choice, not part of the protocol.
    const int64_t rows = static_cast<int64_t>(prm.num_tokens) * cfg_.topk * comm_.world_size() / cfg_.num_experts;
    const GemmTileShape tile = choose_fused_tile(cfg_, static_cast<int>(std::min<int64_t>(rows, 1 << 30)));
    prm.swiglu_clamp = cfg_.swiglu_clamp;
    prm.timeout_ns = timeout_ns_;
    prm.x = in.x;
    prm.topk_idx = in.topk_idx;
    prm.topk_weights = in.topk_weights;
    prm.y = y;
    prm.w13 = weights_.w13;
    prm.w2 = weights_.w2;
    prm.w13_map = w13_map_;
    prm.w2_map = w2_map_;
    prm.window = window_.window();
    prm.loopback.slices = static_cast<char*>(window_.slices_base());
    prm.loopback.stride = window_.stride();
    prm.workspace = static_cast<char*>(workspace_);
    if (timing_) {
      // The kernel adds into the record: zero it first (stream-ordered, only while timing).
      EPFUSE_CUDA_CHECK(cudaMemsetAsync(profile_, 0, sizeof(device::FusedProfile), stream));
      prm.profile = profile_;
      profiled_stream_ = stream;
    }
    profiled_ = timing_;
    summed_ = false;
    launch_fused_kernel(comm_.transport(), tile, prm, grid_, stream);
    if (host_status != 0) {
      broken_ = true;
      throw Error(ErrorCode::kInvalidArgument, problem + "; the layer must be re-created");
    }
  }

  void check_errors(cudaStream_t stream) override {
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    device::ErrorRecord rec{};
    const size_t at = plan_.priv.control + offsetof(device::FusedControl, error);
    EPFUSE_CUDA_CHECK(cudaMemcpy(&rec, static_cast<char*>(workspace_) + at, sizeof rec, cudaMemcpyDeviceToHost));
    if (rec.kind != 0) {
      broken_ = true;
      throw Error(error_code(rec), describe_error(rec));
    }
  }

  Impl impl() const override { return Impl::kFused; }
  const LayerConfig& config() const override { return cfg_; }
  MemoryFootprint memory() const override { return {plan_.symmetric_bytes(), plan_.private_bytes()}; }

 private:
  LayerConfig cfg_;
  Communicator& comm_;
  ExpertWeights weights_;
  FusedPlan plan_;
  uint64_t timeout_ns_ = 0;
  int grid_ = 0;
  CUtensorMap w13_map_{};
  CUtensorMap w2_map_{};
  SymmetricBuffer window_;
  void* workspace_ = nullptr;
  uint32_t epoch_ = 0;  // the last call's epoch; the first call uses 1
  bool broken_ = false;
  // Phase timing (off by default): the device record of the last forward and the sum over forwards.
  bool timing_ = false;
  bool profiled_ = false;  // the last forward ran with the profile on
  bool summed_ = false;    // ... and was added to profile_sum_
  bool print_profile_ = profile_print_from_env();
  device::FusedProfile* profile_ = nullptr;
  cudaStream_t profiled_stream_ = nullptr;
  ProfileSummary profile_sum_;
};

}  // namespace

std::unique_ptr<MoeLayer> make_fused_layer(const LayerConfig& cfg, Communicator& comm, const ExpertWeights& weights) {
  return std::make_unique<FusedLayer>(cfg, comm, weights);
}

}  // namespace epfuse::fused
