#include "layer_rank.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <utility>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/job.h"
#include "multiprocess.h"

namespace epfuse::testing {

GuardedBuffer::GuardedBuffer(size_t bytes) : buffer_(bytes + 2 * kGuardBytes), bytes_(bytes) {
  EPFUSE_CUDA_CHECK(cudaMemset(buffer_.as(), kGuardByte, buffer_.bytes()));
}

std::string GuardedBuffer::guard_damage(const char* name, cudaStream_t stream) const {
  std::vector<unsigned char> before(kGuardBytes), after(kGuardBytes);
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(before.data(), buffer_.as(), kGuardBytes, cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(after.data(), buffer_.as<char>() + kGuardBytes + bytes_, kGuardBytes,
                                    cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  char text[160];
  for (size_t i = 0; i < kGuardBytes; ++i) {
    if (before[kGuardBytes - 1 - i] != kGuardByte) {
      std::snprintf(text, sizeof text, "%s: byte %zu before the buffer is 0x%02x (guard 0x%02x)", name, i + 1,
                    before[kGuardBytes - 1 - i], kGuardByte);
      return text;
    }
    if (after[i] != kGuardByte) {
      std::snprintf(text, sizeof text, "%s: byte %zu after the buffer is 0x%02x (guard 0x%02x)", name, i, after[i],
                    kGuardByte);
      return text;
    }
  }
  return "";
}

LayerRank::LayerRank(Impl impl, const LayerConfig& cfg, int extra_tokens, Workspace* workspace)
    : impl_(impl), cfg_(cfg), comm_(comm()), workspace_(workspace) {
  const int local = cfg.experts_per_rank(comm_.world_size());
  w13_ = detail::DeviceBuffer(size_t(local) * 2 * cfg.intermediate * cfg.hidden * sizeof(bf16));
  w2_ = detail::DeviceBuffer(size_t(local) * cfg.hidden * cfg.intermediate * sizeof(bf16));
  // Non-blocking, and stream-ordered copies below: in the one-GPU mode the legacy default stream would
  // order this rank's copies after the other ranks' kernels, which may wait for this rank.
  EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  generate_expert_weights(cfg, comm_.world_size(), comm_.rank(), kWeightSeed, w13_.as<bf16>(), w2_.as<bf16>(), stream_);
  if (cfg.weight_format == WeightFormat::kFp8Block128) {
    const size_t scale_bytes = cfg.scale_format == ScaleFormat::kFp32 ? sizeof(float) : 1;
    const auto blocks = [](int n) { return size_t(n + 127) / 128; };
    w13_fp8_ = detail::DeviceBuffer(size_t(local) * 2 * cfg.intermediate * cfg.hidden);
    w2_fp8_ = detail::DeviceBuffer(size_t(local) * cfg.hidden * cfg.intermediate);
    w13_scales_ = detail::DeviceBuffer(size_t(local) * 2 * blocks(cfg.intermediate) * blocks(cfg.hidden) * scale_bytes);
    w2_scales_ = detail::DeviceBuffer(size_t(local) * blocks(cfg.hidden) * blocks(cfg.intermediate) * scale_bytes);
    quantize_expert_weights(cfg, local, w13_.as<bf16>(), w2_.as<bf16>(), w13_fp8_.as<uint8_t>(), w2_fp8_.as<uint8_t>(),
                            w13_scales_.as(), w2_scales_.as(), stream_);
  }
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const size_t tokens = size_t(cfg.max_tokens_per_rank) + extra_tokens;
  x_ = GuardedBuffer(tokens * cfg.hidden * sizeof(bf16));
  idx_ = GuardedBuffer(tokens * cfg.topk * sizeof(int32_t));
  weights_ = GuardedBuffer(tokens * cfg.topk * sizeof(float));
  y_ = GuardedBuffer(tokens * cfg.hidden * sizeof(bf16));
  // Last: the layer's collective creation ends every rank's device-synchronising calls (cudaMalloc
  // above) before any rank can launch a forward that waits for the others (one-GPU mode).
  recreate();
}

LayerRank::~LayerRank() {
  try {  // as in recreate(); a world that already failed has nothing left to wait for
    if (layer_ != nullptr && comm_.transport() == Transport::kLoopback) comm_.barrier();
  } catch (const Error&) {
  }
  layer_.reset();
  cudaStreamDestroy(stream_);  // destructor: nothing to report an error to
}

void LayerRank::recreate() {
  // One-GPU mode: freeing the layer synchronises the device, which would wait for peers' forwards that
  // wait for ranks whose launch is queued behind that synchronisation. Every rank's forward is done
  // (checked) once all are here.
  if (layer_ != nullptr && comm_.transport() == Transport::kLoopback) comm_.barrier();
  layer_.reset();
  const ExpertWeights weights = this->weights();
  layer_ = workspace_ != nullptr ? MoeLayer::create(cfg_, *workspace_, weights)
                                 : MoeLayer::create(impl_, cfg_, comm_, weights);
}

ExpertWeights LayerRank::weights() const {
  ExpertWeights w{w13_.as<bf16>(), w2_.as<bf16>()};
  if (cfg_.weight_format == WeightFormat::kFp8Block128) {
    const int64_t scale_bytes = cfg_.scale_format == ScaleFormat::kFp32 ? sizeof(float) : 1;
    w.w13_fp8 = w13_fp8_.as<uint8_t>();
    w.w2_fp8 = w2_fp8_.as<uint8_t>();
    w.w13_scales = w13_scales_.as();
    w.w2_scales = w2_scales_.as();
    w.w13_scales_count = static_cast<int64_t>(w13_scales_.bytes()) / scale_bytes;
    w.w2_scales_count = static_cast<int64_t>(w2_scales_.bytes()) / scale_bytes;
  }
  return w;
}

int LayerRank::rank() const { return comm_.rank(); }
int LayerRank::world() const { return comm_.world_size(); }

HostTokens LayerRank::tokens(int count, Routing routing, uint64_t seed) const {
  return make_tokens(cfg_, world(), rank(), count, routing, seed);
}

void LayerRank::upload(const HostTokens& in) {
  EPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(x_.as(), in.x.data(), in.x.size() * sizeof(bf16), cudaMemcpyHostToDevice, stream_));
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(idx_.as(), in.topk_idx.data(), in.topk_idx.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(weights_.as(), in.topk_weights.data(), in.topk_weights.size() * sizeof(float),
                                    cudaMemcpyHostToDevice, stream_));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host vectors may go after this returns
}

std::vector<double> LayerRank::forward(const HostTokens& in) {
  upload(in);
  poison_y();
  // One-GPU mode: launch only once every rank is past its device-synchronising calls (LoopbackWorld).
  if (comm_.transport() == Transport::kLoopback) comm_.barrier();
  if (before_forward_) before_forward_(stream_);
  layer_->forward(batch(in.num_tokens), y(), stream_);
  layer_->check_errors(stream_);
  return output(in.num_tokens);
}

std::string LayerRank::outside_writes(const HostTokens& in) {
  for (auto [name, buf] : {std::pair<const char*, const GuardedBuffer*>{"x", &x_}, {"topk_idx", &idx_},
                           {"topk_weights", &weights_}, {"y", &y_}}) {
    const std::string damage = buf->guard_damage(name, stream_);
    if (!damage.empty()) return damage;
  }
  // The inputs are read-only to the layer: what was uploaded is still there.
  auto differs = [&](const char* name, const void* dev, const void* host, size_t bytes) -> std::string {
    std::vector<unsigned char> got(bytes);
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(got.data(), dev, bytes, cudaMemcpyDeviceToHost, stream_));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return std::memcmp(got.data(), host, bytes) == 0 ? "" : std::string(name) + " was written by the layer";
  };
  for (const std::string& d :
       {differs("x", x_.as(), in.x.data(), in.x.size() * sizeof(bf16)),
        differs("topk_idx", idx_.as(), in.topk_idx.data(), in.topk_idx.size() * sizeof(int32_t)),
        differs("topk_weights", weights_.as(), in.topk_weights.data(), in.topk_weights.size() * sizeof(float))})
    if (!d.empty()) return d;
  return "";
}

void LayerRank::poison_y() { EPFUSE_CUDA_CHECK(cudaMemsetAsync(y_.as(), 0xff, y_.bytes(), stream_)); }  // bf16 NaN

void LayerRank::fill_y_finite() { EPFUSE_CUDA_CHECK(cudaMemsetAsync(y_.as(), 0x3f, y_.bytes(), stream_)); }

size_t LayerRank::values_not_nan(int num_tokens) {
  const std::vector<double> y = output(num_tokens);
  return static_cast<size_t>(std::count_if(y.begin(), y.end(), [](double v) { return !std::isnan(v); }));
}

std::vector<double> LayerRank::output(int num_tokens) {
  std::vector<bf16> host(size_t(num_tokens) * cfg_.hidden);
  EPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), y_.as(), host.size() * sizeof(bf16), cudaMemcpyDeviceToHost, stream_));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::vector<double> out(host.size());
  for (size_t i = 0; i < host.size(); ++i) out[i] = __bfloat162float(host[i]);
  return out;
}

void LayerRank::expect_matches_reference(const HostTokens& in, const std::string& what) {
  std::vector<double> got;
  try {
    got = forward(in);
  } catch (const Error& e) {
    ADD_FAILURE() << what << ": " << e.what();
    return;
  }
  expect_close_to_reference(in, got, what);
}

std::vector<double> LayerRank::expect_close_to_reference(const HostTokens& in, const std::vector<double>& got,
                                                         const std::string& what) const {
  size_t unwritten = 0;
  for (double v : got) unwritten += std::isnan(v);
  EXPECT_EQ(unwritten, 0u) << what;
  const std::vector<double> want = reference_forward(cfg_, in, GeneratedExperts(cfg_, kWeightSeed));
  if (in.num_tokens > 0) {
    constexpr double kTolerance = 2e-2;  // epfuse run's default
    EXPECT_LT(relative_error(want, got), kTolerance) << what;
    // A few wrong rows hide in the overall error: each row has its own bound (tools/common/job.h).
    const std::vector<double> errs = tools::row_errors(want, got, static_cast<size_t>(cfg_.hidden));
    for (size_t row = 0; row < errs.size(); ++row)
      EXPECT_LE(errs[row], tools::row_tolerance(kTolerance, cfg_.weight_format)) << what << ": row " << row << " of " << errs.size();
  }
  return want;
}

}  // namespace epfuse::testing
