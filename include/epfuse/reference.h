// epfuse/reference.h: the float64 CPU reference of the layer and the error metric.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "epfuse/config.h"
#include "epfuse/inputs.h"

namespace epfuse {

// Where the reference reads expert weights from: a global expert id to its matrices, as double.
// w13: [2I, H] (gate rows then up rows), w2: [H, I]. With cfg.weight_format = kFp8Block128 both
// sources below hold bf16 weights and load them quantised in the layer's 128x128 blocks (config.h),
// as decode(code) * scale: the FP8 layer is the same layer, quantised.
class ExpertSource {
 public:
  virtual ~ExpertSource() = default;
  virtual void load(int expert, std::vector<double>& w13, std::vector<double>& w2) const = 0;
};

// The generator's experts (inputs.h), regenerated on demand.
class GeneratedExperts final : public ExpertSource {
 public:
  GeneratedExperts(const LayerConfig& cfg, uint64_t seed) : cfg_(cfg), seed_(seed) {}
  void load(int expert, std::vector<double>& w13, std::vector<double>& w2) const override;

 private:
  LayerConfig cfg_;
  uint64_t seed_;
};

// Experts held in host memory: w13 [E, 2I, H], w2 [E, H, I] for all E experts (sizes checked).
class HostExperts final : public ExpertSource {
 public:
  HostExperts(const LayerConfig& cfg, std::vector<bf16> w13, std::vector<bf16> w2);
  void load(int expert, std::vector<double>& w13, std::vector<double>& w2) const override;

 private:
  LayerConfig cfg_;
  std::vector<bf16> w13_, w2_;
};

// Called with (done, total) experts computed as the reference proceeds, from its worker threads
// one call at a time.
using Progress = std::function<void(int64_t done, int64_t total)>;

// y[t] = sum_j w[t,j] * W2_e(silu(W1_e x[t]) * W3_e x[t]), e = topk_idx[t,j] (slots with -1 skipped),
// in float64, with the optional clamp of cfg. With FP8 weights (cfg.weight_format) it also rounds as
// the FP8 kernels will: x quantised 1x128 (dispatch), and w[t,j] * silu(..) * (..) quantised 1x128
// before W2 (the Linear1 epilogue), in cfg.scale_format; the sums stay float64. Computes the rows `rows` of `in` (all rows when
// empty); returns [rows, H] row-major. Uses up to `threads` threads (0: hardware concurrency).
//
// Each needed expert is loaded once and applied to every requested row that routes to it; threads
// take whole experts. Every (row, slot) contribution is kept and the slots are summed in slot order,
// so the result does not depend on the thread count. Memory: rows * topk * H doubles, plus one
// expert (3 * H * I doubles) per thread. Throws Error(kInvalidArgument) for sizes that do not
// match cfg, a row outside [0, T) or an expert id outside [-1, E).
std::vector<double> reference_forward(const LayerConfig& cfg, const HostTokens& in,
                                      const ExpertSource& experts, std::span<const int> rows = {},
                                      int threads = 0, const Progress& progress = {});

// ||out - ref||_F / ||ref||_F (||out||_F when ref is all zeros). NaN if out holds a NaN.
// Throws Error(kInvalidArgument) when the sizes differ.
double relative_error(std::span<const double> ref, std::span<const double> out);

}  // namespace epfuse
