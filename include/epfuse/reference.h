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
// as decode(code) * scale: the FP8 layer is the same layer, quantised. A source gives a band of rows
// at a time, so that the reference's threads share an expert and hold no whole matrix.
class ExpertSource {
 public:
  enum class Matrix { kW13, kW2 };
  explicit ExpertSource(const LayerConfig& cfg);
  virtual ~ExpertSource() = default;
  const LayerConfig& config() const { return cfg_; }
  // Rows [first, first + count) of expert `expert`'s `matrix` into out ([count, cols]). A band: at most
  // kBandRows rows, starting at a multiple of kBandRows from the start of w13's gate or up half (or of
  // w2) and not crossing into the next (whole FP8 block rows). Throws Error(kInvalidArgument) for another
  // range or an expert outside [0, E).
  static constexpr int kBandRows = 128;
  void load_band(int expert, Matrix matrix, int first, int count, double* out) const;
  // The whole expert, band by band.
  void load(int expert, std::vector<double>& w13, std::vector<double>& w2) const;

 protected:
  // The band's bf16 weights as double (load_band has checked the range and quantises after).
  virtual void bf16_band(int expert, Matrix matrix, int first, int count, double* out) const = 0;

 private:
  LayerConfig cfg_;
};

// The generator's experts (inputs.h), regenerated on demand.
class GeneratedExperts final : public ExpertSource {
 public:
  GeneratedExperts(const LayerConfig& cfg, uint64_t seed) : ExpertSource(cfg), seed_(seed) {}

 private:
  void bf16_band(int expert, Matrix matrix, int first, int count, double* out) const override;
  uint64_t seed_;
};

// Experts held in host memory: w13 [E, 2I, H], w2 [E, H, I] for all E experts (sizes checked).
class HostExperts final : public ExpertSource {
 public:
  HostExperts(const LayerConfig& cfg, std::vector<bf16> w13, std::vector<bf16> w2);

 private:
  void bf16_band(int expert, Matrix matrix, int first, int count, double* out) const override;
  std::vector<bf16> w13_, w2_;
};

// Called with (done, total) bands and experts computed as the reference proceeds, from its worker
// threads one call at a time.
using Progress = std::function<void(int64_t done, int64_t total)>;

// y[t] = sum_j w[t,j] * W2_e(silu(W1_e x[t]) * W3_e x[t]), e = topk_idx[t,j] (slots with -1 skipped),
// in float64, with the optional clamp of cfg. With FP8 weights (cfg.weight_format) it also rounds as
// the FP8 kernels will: x quantised 1x128 (dispatch), and w[t,j] * silu(..) * (..) quantised 1x128
// before W2 (the Linear1 epilogue), in cfg.scale_format; the sums stay float64. Computes the rows `rows` of `in` (all rows when
// empty); returns [rows, H] row-major. Uses up to `threads` threads (0: hardware concurrency).
//
// Each needed expert's bands are loaded once and applied to every requested row that routes to it;
// threads take bands of w13 (every needed expert's), then each expert's activation, then bands of w2,
// so a call of few experts (mixtral's two a GPU) uses every thread. Every (row, slot) contribution is
// kept and the slots are summed in slot order, so the result does not depend on the thread count.
// Memory: rows * topk * (H + 3I) doubles, plus a band (kBandRows rows) per thread. Throws
// Error(kInvalidArgument) for sizes that do not match cfg (the source's shape and formats included), a row
// outside [0, T) or an expert id outside [-1, E).
std::vector<double> reference_forward(const LayerConfig& cfg, const HostTokens& in,
                                      const ExpertSource& experts, std::span<const int> rows = {},
                                      int threads = 0, const Progress& progress = {});

// ||out - ref||_F / ||ref||_F (||out||_F when ref is all zeros). NaN if out holds a NaN.
// Throws Error(kInvalidArgument) when the sizes differ.
double relative_error(std::span<const double> ref, std::span<const double> out);

}  // namespace epfuse
