// The float64 CPU reference: experts loaded once each, applied to all requested rows that use them.
#include "epfuse/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <exception>
#include <mutex>
#include <string>
#include <thread>

#include "common/fp8.h"
#include "epfuse/error.h"
#include "ref/generator.h"

namespace epfuse {
namespace {

void require(bool ok, const std::string& message) {
  if (!ok) throw Error(ErrorCode::kInvalidArgument, message);
}

// One use of an expert: requested row `row` (index into the output), its top-k slot and weight.
struct Hit {
  int row;
  int slot;
  double weight;
};

// Four independent sums keep the FPU busy (a single chain waits on each add's latency).
double dot(const double* a, const double* b, int n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += a[i] * b[i];
    s1 += a[i + 1] * b[i + 1];
    s2 += a[i + 2] * b[i + 2];
    s3 += a[i + 3] * b[i + 3];
  }
  for (; i < n; ++i) s0 += a[i] * b[i];
  return (s0 + s1) + (s2 + s3);
}

// SwiGLU with the optional clamp (LayerConfig::swiglu_clamp): gate <= c, up in [-c, c].
double swiglu(double gate, double up, double clamp) {
  if (clamp > 0) {
    gate = std::min(gate, clamp);
    up = std::min(std::max(up, -clamp), clamp);
  }
  return gate / (1.0 + std::exp(-gate)) * up;
}

bool is_fp8(const LayerConfig& cfg) { return cfg.weight_format == WeightFormat::kFp8Block128; }

// Rows [rows, cols] of `v` replaced by their FP8 value: quantised in float with one scale per
// block_rows x 128 block (common/fp8.h), read back as code * scale, exact in double. The weights use
// 128x128 blocks, the activations x and h 1x128 groups, as the kernels will.
void round_to_fp8(double* v, int rows, int cols, int block_rows, ScaleFormat format) {
  const size_t n = static_cast<size_t>(rows) * cols;
  std::vector<float> f(v, v + n);
  std::vector<uint8_t> q(n);
  std::vector<float> scales(static_cast<size_t>((rows + block_rows - 1) / block_rows) * fp8::num_blocks(cols));
  fp8::quantize_matrix(f.data(), rows, cols, block_rows, q.data(), scales.data(), format);
  for (size_t i = 0; i < n; ++i) {
    const int r = static_cast<int>(i / cols), c = static_cast<int>(i % cols);
    v[i] = static_cast<double>(fp8::e4m3_to_float(q[i])) *
           scales[static_cast<size_t>(r / block_rows) * fp8::num_blocks(cols) + c / fp8::kBlock];
  }
}

// An expert's bf16 weights as the FP8 layer holds them (config.h, kFp8Block128): the gate and up
// halves of w13 blocked apart, then w2. No change for bf16 weights.
void quantize_expert(const LayerConfig& cfg, std::vector<double>& w13, std::vector<double>& w2) {
  if (!is_fp8(cfg)) return;
  const int H = cfg.hidden, I = cfg.intermediate;
  round_to_fp8(w13.data(), I, H, fp8::kBlock, cfg.scale_format);
  round_to_fp8(w13.data() + static_cast<size_t>(I) * H, I, H, fp8::kBlock, cfg.scale_format);
  round_to_fp8(w2.data(), H, I, fp8::kBlock, cfg.scale_format);
}

// One expert applied to its hits: contrib[(row * k + slot) * H + c] = weight * (W2 a)[c].
struct ExpertWorker {
  const LayerConfig& cfg;
  const std::vector<double>& x;  // [rows, H] requested rows as double
  std::vector<double>& contrib;  // [rows, k, H]
  std::vector<double> w13, w2, h13, act;

  void run(const ExpertSource& experts, int expert, const std::vector<Hit>& hits) {
    const int H = cfg.hidden, I = cfg.intermediate, n = static_cast<int>(hits.size());
    experts.load(expert, w13, w2);
    require(w13.size() == static_cast<size_t>(2) * I * H && w2.size() == static_cast<size_t>(H) * I,
            "ExpertSource::load(" + std::to_string(expert) + ") returned " + std::to_string(w13.size()) + " and " +
                std::to_string(w2.size()) + " values, expected 2*I*H and H*I");
    // Weight rows outside, tokens inside: each weight row is read once from memory, then from cache.
    h13.resize(static_cast<size_t>(n) * 2 * I);
    for (int r = 0; r < 2 * I; ++r)
      for (int i = 0; i < n; ++i)
        h13[static_cast<size_t>(i) * 2 * I + r] =
            dot(&w13[static_cast<size_t>(r) * H], &x[static_cast<size_t>(hits[i].row) * H], H);
    act.resize(static_cast<size_t>(n) * I);
    for (int i = 0; i < n; ++i)
      for (int c = 0; c < I; ++c)
        act[static_cast<size_t>(i) * I + c] = swiglu(h13[static_cast<size_t>(i) * 2 * I + c],
                                                     h13[static_cast<size_t>(i) * 2 * I + I + c], cfg.swiglu_clamp);
    // FP8: the top-k weight goes into h before h is quantised 1x128 for Linear2 (the kernel's Linear1
    // epilogue), so it is not applied again after Linear2.
    const bool fp8 = is_fp8(cfg);
    if (fp8) {
      for (int i = 0; i < n; ++i)
        for (int c = 0; c < I; ++c) act[static_cast<size_t>(i) * I + c] *= hits[i].weight;
      round_to_fp8(act.data(), n, I, 1, cfg.scale_format);
    }
    for (int c = 0; c < H; ++c)
      for (int i = 0; i < n; ++i)
        contrib[(static_cast<size_t>(hits[i].row) * cfg.topk + hits[i].slot) * H + c] =
            (fp8 ? 1.0 : hits[i].weight) * dot(&w2[static_cast<size_t>(c) * I], &act[static_cast<size_t>(i) * I], I);
  }
};

void check_shape(const LayerConfig& cfg) {
  require(cfg.hidden > 0 && cfg.intermediate > 0 && cfg.num_experts > 0 && cfg.topk > 0,
          "reference: hidden=" + std::to_string(cfg.hidden) + ", intermediate=" + std::to_string(cfg.intermediate) +
              ", num_experts=" + std::to_string(cfg.num_experts) + ", topk=" + std::to_string(cfg.topk) +
              ": all must be positive");
}

}  // namespace

void GeneratedExperts::load(int expert, std::vector<double>& w13, std::vector<double>& w2) const {
  check_shape(cfg_);
  require(expert >= 0 && expert < cfg_.num_experts, "GeneratedExperts::load: expert=" + std::to_string(expert) +
                                                        " outside [0, " + std::to_string(cfg_.num_experts) + ")");
  const int H = cfg_.hidden, I = cfg_.intermediate;
  // One hash per row, one mix per element (ref/generator.h): the same bits as the GPU generator.
  auto fill = [&](std::vector<double>& out, detail::Stream stream, int rows, int cols, float scale) {
    out.resize(static_cast<size_t>(rows) * cols);
    for (int r = 0; r < rows; ++r) {
      const uint64_t key = detail::weight_row_key(seed_, stream, expert, r);
      const uint64_t block_key = detail::weight_block_key(seed_, stream, expert, r);
      double* row = &out[static_cast<size_t>(r) * cols];
      for (int c = 0; c < cols; ++c)
        row[c] = detail::bf16_bits_to_float(detail::weight_bf16_bits(key, block_key, c, scale));
    }
  };
  fill(w13, detail::Stream::kW13, 2 * I, H, detail::weight_scale(H));
  fill(w2, detail::Stream::kW2, H, I, detail::weight_scale(I));
  quantize_expert(cfg_, w13, w2);
}

HostExperts::HostExperts(const LayerConfig& cfg, std::vector<bf16> w13, std::vector<bf16> w2)
    : cfg_(cfg), w13_(std::move(w13)), w2_(std::move(w2)) {
  check_shape(cfg_);
  const size_t per_expert = static_cast<size_t>(cfg.hidden) * cfg.intermediate;
  require(w13_.size() == 2 * per_expert * cfg.num_experts && w2_.size() == per_expert * cfg.num_experts,
          "HostExperts: w13 has " + std::to_string(w13_.size()) + " and w2 " + std::to_string(w2_.size()) +
              " elements; expected E*2I*H=" + std::to_string(2 * per_expert * cfg.num_experts) +
              " and E*H*I=" + std::to_string(per_expert * cfg.num_experts));
}

void HostExperts::load(int expert, std::vector<double>& w13, std::vector<double>& w2) const {
  require(expert >= 0 && expert < cfg_.num_experts, "HostExperts::load: expert=" + std::to_string(expert) +
                                                        " outside [0, " + std::to_string(cfg_.num_experts) + ")");
  const size_t per_expert = static_cast<size_t>(cfg_.hidden) * cfg_.intermediate;
  auto convert = [](const bf16* src, size_t n, std::vector<double>& out) {
    out.resize(n);
    for (size_t i = 0; i < n; ++i) out[i] = detail::bf16_bits_to_float(__bfloat16_as_ushort(src[i]));
  };
  convert(&w13_[2 * per_expert * expert], 2 * per_expert, w13);
  convert(&w2_[per_expert * expert], per_expert, w2);
  quantize_expert(cfg_, w13, w2);
}

std::vector<double> reference_forward(const LayerConfig& cfg, const HostTokens& in, const ExpertSource& experts,
                                      std::span<const int> rows, int threads, const Progress& progress) {
  check_shape(cfg);
  const int H = cfg.hidden, k = cfg.topk, T = in.num_tokens;
  require(T >= 0 && in.x.size() == static_cast<size_t>(T) * H && in.topk_idx.size() == static_cast<size_t>(T) * k &&
              in.topk_weights.size() == static_cast<size_t>(T) * k,
          "reference: num_tokens=" + std::to_string(T) + " but x, topk_idx, topk_weights hold " +
              std::to_string(in.x.size()) + ", " + std::to_string(in.topk_idx.size()) + ", " +
              std::to_string(in.topk_weights.size()) + " values (expected T*H, T*k, T*k)");

  std::vector<int> all_rows;
  if (rows.empty()) {
    all_rows.resize(T);
    for (int t = 0; t < T; ++t) all_rows[t] = t;
    rows = all_rows;
  }
  const int n = static_cast<int>(rows.size());

  // Requested rows as double, and which experts they use.
  std::vector<double> x(static_cast<size_t>(n) * H);
  std::vector<std::vector<Hit>> hits(cfg.num_experts);
  for (int i = 0; i < n; ++i) {
    const int t = rows[i];
    require(t >= 0 && t < T,
            "reference: row " + std::to_string(t) + " outside [0, num_tokens=" + std::to_string(T) + ")");
    for (int h = 0; h < H; ++h)
      x[static_cast<size_t>(i) * H + h] =
          detail::bf16_bits_to_float(__bfloat16_as_ushort(in.x[static_cast<size_t>(t) * H + h]));
    for (int j = 0; j < k; ++j) {
      const int e = in.topk_idx[static_cast<size_t>(t) * k + j];
      require(e >= -1 && e < cfg.num_experts, "reference: topk_idx[" + std::to_string(t) + "][" + std::to_string(j) +
                                                  "]=" + std::to_string(e) +
                                                  " outside [-1, num_experts=" + std::to_string(cfg.num_experts) + ")");
      if (e >= 0) hits[e].push_back({i, j, static_cast<double>(in.topk_weights[static_cast<size_t>(t) * k + j])});
    }
  }
  if (is_fp8(cfg)) round_to_fp8(x.data(), n, H, 1, cfg.scale_format);  // x as dispatch sends it
  std::vector<int> needed;
  for (int e = 0; e < cfg.num_experts; ++e)
    if (!hits[e].empty()) needed.push_back(e);

  std::vector<double> contrib(static_cast<size_t>(n) * k * H);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  threads = std::max(1, std::min<int>(threads, static_cast<int>(needed.size())));

  std::atomic<size_t> next{0};
  std::mutex mutex;  // guards done, error and the progress callback
  int64_t done = 0;
  std::exception_ptr error;
  auto work = [&] {
    ExpertWorker worker{cfg, x, contrib, {}, {}, {}, {}};
    for (size_t w = next++; w < needed.size(); w = next++) {
      try {
        worker.run(experts, needed[w], hits[needed[w]]);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
        next = needed.size();  // stop everyone
        return;
      }
      std::lock_guard lock(mutex);
      ++done;
      if (progress) progress(done, static_cast<int64_t>(needed.size()));
    }
  };
  if (!needed.empty()) {
    std::vector<std::thread> pool;
    for (int i = 1; i < threads; ++i) pool.emplace_back(work);
    work();
    for (std::thread& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);

  // Slots summed in slot order: the result does not depend on which thread computed what.
  std::vector<double> y(static_cast<size_t>(n) * H, 0.0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < k; ++j) {
      if (in.topk_idx[static_cast<size_t>(rows[i]) * k + j] < 0) continue;
      const double* c = &contrib[(static_cast<size_t>(i) * k + j) * H];
      double* out = &y[static_cast<size_t>(i) * H];
      for (int h = 0; h < H; ++h) out[h] += c[h];
    }
  return y;
}

double relative_error(std::span<const double> ref, std::span<const double> out) {
  require(ref.size() == out.size(),
          "relative_error: ref has " + std::to_string(ref.size()) + " values, out " + std::to_string(out.size()));
  double diff2 = 0, ref2 = 0, out2 = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = out[i] - ref[i];
    diff2 += d * d;
    ref2 += ref[i] * ref[i];
    out2 += out[i] * out[i];
  }
  // An all-zero reference (e.g. every slot dropped) has no scale: report the absolute error.
  return ref2 == 0 ? std::sqrt(out2) : std::sqrt(diff2 / ref2);
}

}  // namespace epfuse
