// make_padded_layer (padded_layer.h).
#include "layer/padded_layer.h"

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/collective_step.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/device_guard.h"
#include "common/fp8.h"
#include "common/overlap.h"
#include "epfuse/error.h"
#include "weights/fp8_weights.h"

namespace epfuse {
namespace {

// The caller's weights as the padded layer's: codes or bf16 values zero-padded, FP8 block scales
// re-laid out with scale 1 for the new blocks (all of whose weights are zero).
class PaddedWeights {
 public:
  PaddedWeights(const LayerConfig& cfg, const LayerConfig& run, int local, const ExpertWeights& w,
                const std::string& who) {
    const int H = cfg.hidden, I = cfg.intermediate, Hp = run.hidden, Ip = run.intermediate;
    const bool fp8 = cfg.weight_format == WeightFormat::kFp8Block128;
    const int elem = fp8 ? 1 : static_cast<int>(sizeof(bf16));
    const void* w13 = fp8 ? static_cast<const void*>(w.w13_fp8) : w.w13;
    const void* w2 = fp8 ? static_cast<const void*>(w.w2_fp8) : w.w2;
    if (fp8) {
      if (const std::string problem = weights::check_fp8_weight_pointers(cfg, local, w); !problem.empty())
        throw Error(ErrorCode::kInvalidArgument, who + "MoeLayer::create: " + problem);
    } else {
      EPFUSE_REQUIRE(reinterpret_cast<uintptr_t>(w13) % 16 == 0 && reinterpret_cast<uintptr_t>(w2) % 16 == 0,
                     ErrorCode::kInvalidArgument, who + "MoeLayer::create: w13 and w2 must be 16-byte aligned");
    }
    // The gate and up halves of w13 are padded apart: [2 * local, I, H] -> [2 * local, Ip, Hp].
    w13_ = detail::DeviceBuffer(size_t{2} * local * Ip * Hp * elem);
    w2_ = detail::DeviceBuffer(size_t{1} * local * Hp * Ip * elem);
    padding::copy_resized(w13, 2 * local, I, H, w13_.as(), Ip, Hp, elem, nullptr);
    padding::copy_resized(w2, local, H, I, w2_.as(), Hp, Ip, elem, nullptr);
    if (fp8) {
      // w13's halves pad apart (2 * local matrices of ceil(I/128) block rows), but the caller names a
      // scale by [expert][block row of both halves][block column], as the layers check it.
      w13_scales_ = pad_scales(cfg, w.w13_scales, w.w13_scales_count, {local, fp8::w13_scale_rows(I)},
                               {2 * local, fp8::num_blocks(I), fp8::num_blocks(H)}, Ip / fp8::kBlock,
                               Hp / fp8::kBlock, "w13_scales", who);
      w2_scales_ = pad_scales(cfg, w.w2_scales, w.w2_scales_count, {local, fp8::num_blocks(H)},
                              {local, fp8::num_blocks(H), fp8::num_blocks(I)}, Hp / fp8::kBlock, Ip / fp8::kBlock,
                              "w2_scales", who);
    }
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // the wrapped layer reads them at once
    view_.w13 = fp8 ? nullptr : w13_.as<bf16>();
    view_.w2 = fp8 ? nullptr : w2_.as<bf16>();
    if (fp8) {
      view_.w13_fp8 = w13_.as<uint8_t>();
      view_.w2_fp8 = w2_.as<uint8_t>();
      view_.w13_scales = w13_scales_.as();
      view_.w2_scales = w2_scales_.as();
      view_.w13_scales_count = int64_t{2} * local * (Ip / fp8::kBlock) * (Hp / fp8::kBlock);
      view_.w2_scales_count = int64_t{1} * local * (Hp / fp8::kBlock) * (Ip / fp8::kBlock);
    }
  }

  const ExpertWeights& view() const { return view_; }
  size_t bytes() const { return w13_.bytes() + w2_.bytes() + w13_scales_.bytes() + w2_scales_.bytes(); }

 private:
  struct CheckedAs {
    int matrices, rows;  // the caller's indices: [matrix][row][column]
  };
  struct Blocks {
    int matrices, rows, cols;  // the same scales as padded: [matrix][row][column]
  };
  // The caller's scales, checked as the layers check them (every value, the first bad one named in
  // the caller's indices), into [b.matrices, rows_pad, cols_pad].
  static detail::DeviceBuffer pad_scales(const LayerConfig& cfg, const void* scales, int64_t count, CheckedAs checked,
                                         Blocks b, int rows_pad, int cols_pad, const char* name,
                                         const std::string& who) {
    const weights::CheckedScales caller = weights::read_block_scales(
        scales, count, cfg.scale_format, checked.matrices, checked.rows, b.cols * fp8::kBlock, name,
        who + "MoeLayer::create: ");
    const std::vector<uint8_t> padded =
        padding::pad_block_scales(caller.raw.data(), cfg.scale_format, b.matrices, b.rows, b.cols, rows_pad, cols_pad);
    detail::DeviceBuffer out(padded.size());
    detail::copy_to_device_now(out.as(), padded.data(), padded.size());
    return out;
  }

  detail::DeviceBuffer w13_, w2_, w13_scales_, w2_scales_;
  ExpertWeights view_;
};

class PaddedLayer final : public MoeLayer {
 public:
  PaddedLayer(const LayerConfig& cfg, Communicator& comm) : cfg_(cfg), comm_(comm) {}

  ~PaddedLayer() override {
    inner_.reset();  // before the weights it reads
    if (weights_ || stage_) {  // freed on the communicator's device
      detail::DeviceGuard guard(comm_.device());
      weights_.reset();
      stage_.reset();
    }
  }

  void forward(const TokenBatch& in, bf16* y, cudaStream_t stream) override {
    const int T = in.num_tokens;
    const bool fp8_x = in.x_fp8 != nullptr || in.x_scales != nullptr;  // quantised by the caller
    const void* x_rows = fp8_x ? static_cast<const void*>(in.x_fp8) : in.x;
    const bool staged = T > 0 && T <= cfg_.max_tokens_per_rank && x_rows != nullptr && y != nullptr &&
                        in.topk_idx != nullptr && in.topk_weights != nullptr &&
                        reinterpret_cast<uintptr_t>(x_rows) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                        (!fp8_x || (in.x_scales != nullptr && reinterpret_cast<uintptr_t>(in.x_scales) % 4 == 0 &&
                                    cfg_.weight_format == WeightFormat::kFp8Block128)) &&
                        !aliased(in, y);
    // No rows to move, or bad input: the wrapped layer reports it (and tells its peers). An aliased y
    // (staging would hide it from the wrapped layer) reaches it as given: its wider rows overlap too.
    if (!staged) {
      inner_->forward(in, y, stream);
      return;
    }
    detail::DeviceGuard guard(comm_.device());
    const int H = cfg_.hidden, Hp = inner_->config().hidden;
    // Held from the copy into the staging rows to the copy out of them: another padded forward on them,
    // from another thread or stream, comes after (padding::Stage).
    detail::StreamTurn::Held turn = stage_->take(stream);
    TokenBatch padded = in;
    if (fp8_x) {
      // Codes [T, Hp] then scales [T, Hp / 128] in the x rows (1 + 1/32 bytes per bf16 pair); the new
      // groups are zero codes under scale 0.
      const int groups = fp8::num_blocks(H), groups_pad = Hp / fp8::kBlock;
      auto* codes = reinterpret_cast<uint8_t*>(stage_->x());
      auto* scales = reinterpret_cast<float*>(codes + static_cast<size_t>(T) * Hp);
      padding::copy_resized(in.x_fp8, 1, T, H, codes, T, Hp, 1, stream);
      EPFUSE_CUDA_CHECK(cudaMemsetAsync(scales, 0, static_cast<size_t>(T) * groups_pad * sizeof(float), stream));
      EPFUSE_CUDA_CHECK(cudaMemcpy2DAsync(scales, groups_pad * sizeof(float), in.x_scales, groups * sizeof(float),
                                          groups * sizeof(float), T, cudaMemcpyDeviceToDevice, stream));
      padded.x = nullptr;
      padded.x_fp8 = codes;
      padded.x_scales = scales;
    } else {
      padding::copy_resized(in.x, 1, T, H, stage_->x(), T, Hp, sizeof(bf16), stream);
      padded.x = stage_->x();
    }
    inner_->forward(padded, stage_->y(), stream);
    padding::copy_resized(stage_->y(), 1, T, Hp, y, T, H, sizeof(bf16), stream);
    turn.done();
  }

  // Whether y overlaps an input of the caller's sizes (what the wrapped layer refuses, fused_layer.cpp).
  bool aliased(const TokenBatch& in, const bf16* y) const {
    const size_t T = static_cast<size_t>(in.num_tokens), H = static_cast<size_t>(cfg_.hidden),
                 K = static_cast<size_t>(cfg_.topk);
    const detail::ByteRange out{"y", y, T * H * sizeof(bf16)};
    const bool fp8_x = in.x_fp8 != nullptr || in.x_scales != nullptr;  // then x is not read
    return detail::first_overlap(out, {{"x", fp8_x ? nullptr : in.x, T * H * sizeof(bf16)},
                                       {"x_fp8", in.x_fp8, T * H},
                                       {"x_scales", in.x_scales, T * fp8::num_blocks(cfg_.hidden) * sizeof(float)},
                                       {"topk_idx", in.topk_idx, T * K * sizeof(int32_t)},
                                       {"topk_weights", in.topk_weights, T * K * sizeof(float)}}) != nullptr;
  }

  void check_errors(cudaStream_t stream) override { inner_->check_errors(stream); }
  void set_phase_timing(bool enabled) override { inner_->set_phase_timing(enabled); }
  std::optional<PhaseTimes> last_phase_times() override { return inner_->last_phase_times(); }
  Impl impl() const override { return inner_->impl(); }
  const LayerConfig& config() const override { return cfg_; }
  MemoryFootprint memory() const override {
    MemoryFootprint m = inner_->memory();
    m.private_bytes += weights_->bytes() + (own_stage_ ? stage_->bytes() : 0);
    return m;
  }

  LayerConfig cfg_;
  Communicator& comm_;
  std::unique_ptr<PaddedWeights> weights_;
  std::shared_ptr<padding::Stage> stage_;
  bool own_stage_ = false;
  std::unique_ptr<MoeLayer> inner_;  // last: destroyed first (destructor)
};

// The padded weights and the staging rows of `layer` (one rank's local step of its creation).
// Checks the padded sizes (the one check of `run`; the wrapped layer takes it as checked).
void make_copies(PaddedLayer& layer, const LayerConfig& cfg, const LayerConfig& padded,
                 std::optional<detail::CheckedConfig>& run, Communicator& comm, const ExpertWeights& weights,
                 const std::function<std::shared_ptr<padding::Stage>()>& shared_stage, const std::string& who) {
  run = detail::CheckedConfig::check(padded, comm.world_size());
  detail::DeviceGuard guard(comm.device());
  layer.weights_ =
      std::make_unique<PaddedWeights>(cfg, run->config(), cfg.experts_per_rank(comm.world_size()), weights, who);
  layer.stage_ = shared_stage ? shared_stage() : nullptr;
  layer.own_stage_ = !layer.stage_;
  if (layer.own_stage_)
    layer.stage_ = std::make_shared<padding::Stage>(cfg.max_tokens_per_rank, padded.hidden);
  EPFUSE_REQUIRE(layer.stage_->fits(cfg.max_tokens_per_rank, padded.hidden), ErrorCode::kInternal,
                 who + "the workspace's staging rows are smaller than the layer's");
}

}  // namespace

std::unique_ptr<MoeLayer> make_padded_layer(Impl impl, const detail::CheckedConfig& checked, Communicator& comm,
                                            const ExpertWeights& weights,
                                            const std::function<std::shared_ptr<padding::Stage>()>& shared_stage,
                                            const MakeLayer& make_inner) {
  const LayerConfig& cfg = checked.config();
  const LayerConfig padded = padding::padded_config(cfg, impl);
  std::optional<detail::CheckedConfig> run;
  auto layer = std::make_unique<PaddedLayer>(cfg, comm);
  const std::string who = "rank " + std::to_string(comm.rank()) + ": ";
  detail::agree_on_step(comm, "MoeLayer::create (padded to hidden " + std::to_string(padded.hidden) +
                                  ", intermediate " + std::to_string(padded.intermediate) + ")",
                        [&] {
                          try {
                            make_copies(*layer, cfg, padded, run, comm, weights, shared_stage, who);
                          } catch (const Error& e) {  // every error names its rank
                            if (std::string_view(e.what()).starts_with(who)) throw;
                            throw Error(e.code(), who + e.what());
                          }
                        });
  layer->inner_ = make_inner(*run, layer->weights_->view());
  return layer;
}

}  // namespace epfuse
