// One rank's MoE layer for the multi-process GPU layer tests (tests/gpu/fused, tests/gpu/unfused):
// generated weights, device inputs, a poisoned forward read back as double, and the check against
// the float64 reference. Collective where the layer is (creation, forward).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "common/device_buffer.h"
#include "epfuse/epfuse.h"

namespace epfuse::testing {

inline constexpr uint64_t kWeightSeed = 42;

// The layer tests' small shape: H = 256, 16 experts (16, 8 or 4 per rank on 1, 2, 4 ranks), top-4,
// 96 tokens per rank; intermediate size and clamp per test.
inline LayerConfig small_layer_config(int intermediate, float clamp) {
  LayerConfig cfg;
  cfg.hidden = 256;
  cfg.intermediate = intermediate;
  cfg.num_experts = 16;
  cfg.topk = 4;
  cfg.max_tokens_per_rank = 96;
  cfg.swiglu_clamp = clamp;
  return cfg;
}

// Two layers of different shapes for one workspace: a = small_layer_config(256), b with H 128, I 384,
// top-2, and the capacity that holds both.
struct TwoLayerShapes {
  LayerConfig a, b, capacity;
};
inline TwoLayerShapes two_layer_shapes() {
  TwoLayerShapes s{small_layer_config(256, 0.0f), {}, {}};
  s.b = s.a;
  s.b.hidden = 128;
  s.b.intermediate = 384;
  s.b.topk = 2;
  s.capacity = s.a;
  s.capacity.intermediate = 384;
  return s;
}

// A device buffer between two guard bands of kGuardBytes filled with kGuardByte, to catch a layer
// writing outside its caller's buffers (the fault-injection tests check them).
class GuardedBuffer {
 public:
  static constexpr size_t kGuardBytes = 4096;  // keeps the interior 16-byte (page) aligned
  static constexpr unsigned char kGuardByte = 0xA5;
  GuardedBuffer() = default;
  explicit GuardedBuffer(size_t bytes);  // device-synchronising (cudaMalloc, cudaMemset)
  template <typename T = void>
  T* as() const { return static_cast<T*>(static_cast<void*>(buffer_.as<char>() + kGuardBytes)); }
  size_t bytes() const { return bytes_; }
  // "" when both bands still hold kGuardByte; else "<name>: byte i before/after the buffer is 0x..".
  // Stream-ordered on `stream`, then synchronises it.
  std::string guard_damage(const char* name, cudaStream_t stream) const;

 private:
  detail::DeviceBuffer buffer_;
  size_t bytes_ = 0;
};

class LayerRank {
 public:
  // Inputs are sized for max_tokens_per_rank + extra_tokens (room for a too-many-tokens call). With a
  // workspace, the (fused) layer is made on it (MoeLayer::create(cfg, workspace, weights)); it must
  // outlive this object.
  LayerRank(Impl impl, const LayerConfig& cfg, int extra_tokens = 0, Workspace* workspace = nullptr);
  ~LayerRank();
  LayerRank(const LayerRank&) = delete;
  LayerRank& operator=(const LayerRank&) = delete;

  // Collective: drops the layer and creates a new one on the same weights (in the one-GPU mode after a
  // barrier: see LoopbackWorld on device-synchronising calls).
  void recreate();

  MoeLayer& layer() { return *layer_; }
  cudaStream_t stream() const { return stream_; }
  int rank() const;
  int world() const;
  bf16* y() const { return y_.as<bf16>(); }
  // The generated bf16 weights and, with cfg.weight_format = kFp8Block128, their FP8 quantisation
  // (quantize_expert_weights: the reference's) in the FP8 fields.
  ExpertWeights weights() const;

  HostTokens tokens(int count, Routing routing, uint64_t seed) const;
  void upload(const HostTokens& in);
  TokenBatch batch(int count) const { return {x_.as<bf16>(), idx_.as<int32_t>(), weights_.as<float>(), count}; }

  // Poisons y (bf16 NaN), runs one forward and check_errors, returns the rows as double.
  std::vector<double> forward(const HostTokens& in);
  // What forward enqueues on the stream right before the layer's forward (after the poison), e.g. a
  // kernel that leaves something behind for it; none by default.
  void set_before_forward(std::function<void(cudaStream_t)> before) { before_forward_ = std::move(before); }
  // y's first num_tokens rows as double, after this rank's stream (for forwards run another way,
  // e.g. a replayed CUDA graph); poison_y() fills y with bf16 NaN on the stream.
  std::vector<double> output(int num_tokens);
  void poison_y();
  // Fault tests: fills y with a finite value (bf16 0x3f3f = 0.746) on the stream, so that the rows a
  // failed call poisoned (NaN) show; and how many of the first num_tokens rows' values are not NaN.
  static constexpr double kFiniteFill = 0.74609375;
  void fill_y_finite();
  size_t values_not_nan(int num_tokens);
  // Checks rows against the float64 reference (no row unwritten, the overall and per-row bounds);
  // returns the reference, for callers that report more about it.
  std::vector<double> expect_close_to_reference(const HostTokens& in, const std::vector<double>& got,
                                                const std::string& what) const;
  // A forward checked against the float64 reference on every row (and no row left unwritten); an
  // Error from the layer is a test failure, not an exception.
  void expect_matches_reference(const HostTokens& in, const std::string& what);
  // Fault tests: "" when no guard band around x, topk_idx, topk_weights or y was written and the
  // device inputs still equal `in` (uploaded last); else what differs.
  std::string outside_writes(const HostTokens& in);

 private:
  Impl impl_;
  LayerConfig cfg_;
  Communicator& comm_;
  Workspace* workspace_ = nullptr;
  detail::DeviceBuffer w13_, w2_;
  detail::DeviceBuffer w13_fp8_, w2_fp8_, w13_scales_, w2_scales_;  // FP8 configs only
  GuardedBuffer x_, idx_, weights_, y_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<MoeLayer> layer_;
  std::function<void(cudaStream_t)> before_forward_;
};

}  // namespace epfuse::testing
