// The float64 CPU reference: each needed expert's weights loaded once, band by band, and applied to all
// requested rows that use them.
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
// 128x128 blocks (a band of at most 128 rows is one block row), the activations x and h 1x128 groups,
// as the kernels will. The float copies live in this thread's buffers, kept between calls.
void round_to_fp8(double* v, int rows, int cols, int block_rows, ScaleFormat format) {
  thread_local std::vector<float> f, scales;
  thread_local std::vector<uint8_t> q;
  const size_t n = static_cast<size_t>(rows) * cols;
  f.assign(v, v + n);
  q.resize(n);
  const int col_blocks = fp8::num_blocks(cols);
  scales.resize(static_cast<size_t>((rows + block_rows - 1) / block_rows) * col_blocks);
  fp8::quantize_matrix(f.data(), rows, cols, block_rows, q.data(), scales.data(), format);
  for (int r = 0; r < rows; ++r) {
    const float* s = &scales[static_cast<size_t>(r / block_rows) * col_blocks];
    const size_t at = static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) v[at + c] = static_cast<double>(fp8::e4m3_to_float(q[at + c])) * s[c / fp8::kBlock];
  }
}

void check_shape(const LayerConfig& cfg) {
  require(cfg.hidden > 0 && cfg.intermediate > 0 && cfg.num_experts > 0 && cfg.topk > 0,
          "reference: hidden=" + std::to_string(cfg.hidden) + ", intermediate=" + std::to_string(cfg.intermediate) +
              ", num_experts=" + std::to_string(cfg.num_experts) + ", topk=" + std::to_string(cfg.topk) +
              ": all must be positive");
}

using Matrix = ExpertSource::Matrix;

// A matrix's rows and columns: w13 [2I, H] in two halves of I rows (gate, up; FP8 blocks them apart),
// w2 [H, I] in one.
struct MatrixShape {
  int rows, cols, half;
};
MatrixShape shape_of(const LayerConfig& cfg, Matrix m) {
  return m == Matrix::kW13 ? MatrixShape{2 * cfg.intermediate, cfg.hidden, cfg.intermediate}
                           : MatrixShape{cfg.hidden, cfg.intermediate, cfg.hidden};
}

// The bands of a matrix (ExpertSource::load_band's ranges), in row order: first rows and counts.
std::vector<std::pair<int, int>> bands_of(const MatrixShape& s) {
  std::vector<std::pair<int, int>> out;
  for (int h0 = 0; h0 < s.rows; h0 += s.half)
    for (int r = 0; r < s.half; r += ExpertSource::kBandRows)
      out.emplace_back(h0 + r, std::min(ExpertSource::kBandRows, s.half - r));
  return out;
}

// Runs fn(i, scratch) for i in [0, count) on up to `threads` threads, each with its own scratch
// vector; after each, done() under a lock. The first exception stops the others and is rethrown.
template <class Fn, class Done>
void parallel_for(int threads, size_t count, Fn fn, Done done) {
  std::atomic<size_t> next{0};
  std::mutex mutex;  // guards error and done()
  std::exception_ptr error;
  auto work = [&] {
    std::vector<double> scratch;
    for (size_t i = next++; i < count; i = next++) {
      try {
        fn(i, scratch);
      } catch (...) {
        std::lock_guard lock(mutex);
        if (!error) error = std::current_exception();
        next = count;  // stop everyone
        return;
      }
      std::lock_guard lock(mutex);
      done();
    }
  };
  const int n = static_cast<int>(std::min<size_t>(std::max(threads, 1), count));
  std::vector<std::thread> pool;
  for (int i = 1; i < n; ++i) pool.emplace_back(work);
  if (count > 0) work();
  for (std::thread& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

ExpertSource::ExpertSource(const LayerConfig& cfg) : cfg_(cfg) { check_shape(cfg_); }

void ExpertSource::load_band(int expert, Matrix matrix, int first, int count, double* out) const {
  const MatrixShape s = shape_of(cfg_, matrix);
  const char* name = matrix == Matrix::kW13 ? "w13" : "w2";
  require(expert >= 0 && expert < cfg_.num_experts, "ExpertSource::load_band: expert=" + std::to_string(expert) +
                                                        " outside [0, " + std::to_string(cfg_.num_experts) + ")");
  const int in_half = first % s.half;
  require(first >= 0 && count >= 1 && count <= kBandRows && first + count <= s.rows && in_half % kBandRows == 0 &&
              in_half + count <= s.half,
          std::string("ExpertSource::load_band: rows [") + std::to_string(first) + ", " + std::to_string(first + count) +
              ") of " + name + " are not a band (at most " + std::to_string(kBandRows) +
              " rows from a multiple of it in a half of " + std::to_string(s.half) + " rows)");
  bf16_band(expert, matrix, first, count, out);
  if (is_fp8(cfg_)) round_to_fp8(out, count, s.cols, fp8::kBlock, cfg_.scale_format);
}

void ExpertSource::load(int expert, std::vector<double>& w13, std::vector<double>& w2) const {
  for (Matrix m : {Matrix::kW13, Matrix::kW2}) {
    const MatrixShape s = shape_of(cfg_, m);
    std::vector<double>& out = m == Matrix::kW13 ? w13 : w2;
    out.resize(static_cast<size_t>(s.rows) * s.cols);
    for (const auto& [first, count] : bands_of(s)) load_band(expert, m, first, count, &out[static_cast<size_t>(first) * s.cols]);
  }
}

void GeneratedExperts::bf16_band(int expert, Matrix matrix, int first, int count, double* out) const {
  const LayerConfig& cfg = config();
  const MatrixShape s = shape_of(cfg, matrix);
  const detail::Stream stream = matrix == Matrix::kW13 ? detail::Stream::kW13 : detail::Stream::kW2;
  const float scale = detail::weight_scale(s.cols);
  // One hash per row, one mix per element (ref/generator.h): the same bits as the GPU generator.
  for (int r = first; r < first + count; ++r) {
    const uint64_t key = detail::weight_row_key(seed_, stream, expert, r);
    const uint64_t block_key = detail::weight_block_key(seed_, stream, expert, r);
    double* row = out + static_cast<size_t>(r - first) * s.cols;
    for (int c = 0; c < s.cols; ++c) row[c] = detail::bf16_bits_to_float(detail::weight_bf16_bits(key, block_key, c, scale));
  }
}

HostExperts::HostExperts(const LayerConfig& cfg, std::vector<bf16> w13, std::vector<bf16> w2)
    : ExpertSource(cfg), w13_(std::move(w13)), w2_(std::move(w2)) {
  const size_t per_expert = static_cast<size_t>(cfg.hidden) * cfg.intermediate;
  require(w13_.size() == 2 * per_expert * cfg.num_experts && w2_.size() == per_expert * cfg.num_experts,
          "HostExperts: w13 has " + std::to_string(w13_.size()) + " and w2 " + std::to_string(w2_.size()) +
              " elements; expected E*2I*H=" + std::to_string(2 * per_expert * cfg.num_experts) +
              " and E*H*I=" + std::to_string(per_expert * cfg.num_experts));
}

void HostExperts::bf16_band(int expert, Matrix matrix, int first, int count, double* out) const {
  const MatrixShape s = shape_of(config(), matrix);
  const std::vector<bf16>& w = matrix == Matrix::kW13 ? w13_ : w2_;
  const bf16* src = &w[(static_cast<size_t>(expert) * s.rows + first) * s.cols];
  for (size_t i = 0; i < static_cast<size_t>(count) * s.cols; ++i)
    out[i] = detail::bf16_bits_to_float(__bfloat16_as_ushort(src[i]));
}

std::vector<double> reference_forward(const LayerConfig& cfg, const HostTokens& in, const ExpertSource& experts,
                                      std::span<const int> rows, int threads, const Progress& progress) {
  check_shape(cfg);
  const int H = cfg.hidden, I = cfg.intermediate, k = cfg.topk, T = in.num_tokens;
  require(T >= 0 && in.x.size() == static_cast<size_t>(T) * H && in.topk_idx.size() == static_cast<size_t>(T) * k &&
              in.topk_weights.size() == static_cast<size_t>(T) * k,
          "reference: num_tokens=" + std::to_string(T) + " but x, topk_idx, topk_weights hold " +
              std::to_string(in.x.size()) + ", " + std::to_string(in.topk_idx.size()) + ", " +
              std::to_string(in.topk_weights.size()) + " values (expected T*H, T*k, T*k)");
  const LayerConfig& src = experts.config();
  require(src.hidden == H && src.intermediate == I && src.weight_format == cfg.weight_format &&
              src.scale_format == cfg.scale_format,
          "reference: the expert source holds H=" + std::to_string(src.hidden) + ", I=" + std::to_string(src.intermediate) +
              " in another format or shape than the layer's H=" + std::to_string(H) + ", I=" + std::to_string(I));

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
  const bool fp8 = is_fp8(cfg);
  if (fp8) round_to_fp8(x.data(), n, H, 1, cfg.scale_format);  // x as dispatch sends it
  std::vector<int> needed;
  for (int e = 0; e < cfg.num_experts; ++e)
    if (!hits[e].empty()) needed.push_back(e);
  const size_t U = needed.size();

  // Three passes over every needed expert: Linear1 by w13 bands (gate and up of each hit), the
  // activation by expert, Linear2 by w2 bands. Weight rows outside, tokens inside: each weight row is
  // read once from memory, then from cache.
  const std::vector<std::pair<int, int>> bands13 = bands_of(shape_of(cfg, Matrix::kW13)),
                                         bands2 = bands_of(shape_of(cfg, Matrix::kW2));
  std::vector<std::vector<double>> h13(U), act(U);
  for (size_t u = 0; u < U; ++u) h13[u].resize(hits[needed[u]].size() * 2 * I);
  std::vector<double> contrib(static_cast<size_t>(n) * k * H);
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int64_t total = static_cast<int64_t>(U * (bands13.size() + 1 + bands2.size()));
  int64_t done = 0;
  const auto count_one = [&] {
    ++done;
    if (progress) progress(done, total);
  };

  // One pass over every needed expert's bands of `m`: store(u, i, row, dot(band row, input(u, i))) for
  // each of the expert's hits i.
  const auto band_pass = [&](Matrix m, auto input, auto store) {
    const MatrixShape s = shape_of(cfg, m);
    const std::vector<std::pair<int, int>>& bands = m == Matrix::kW13 ? bands13 : bands2;
    parallel_for(threads, U * bands.size(), [&](size_t task, std::vector<double>& band) {
      const size_t u = task / bands.size();
      const auto [first, count] = bands[task % bands.size()];
      const size_t m_hits = hits[needed[u]].size();
      band.resize(static_cast<size_t>(count) * s.cols);
      experts.load_band(needed[u], m, first, count, band.data());
      for (int r = 0; r < count; ++r)
        for (size_t i = 0; i < m_hits; ++i) store(u, i, first + r, dot(&band[static_cast<size_t>(r) * s.cols], input(u, i), s.cols));
    }, count_one);
  };

  band_pass(
      Matrix::kW13, [&](size_t u, size_t i) { return &x[static_cast<size_t>(hits[needed[u]][i].row) * H]; },
      [&](size_t u, size_t i, int row, double v) { h13[u][i * 2 * I + row] = v; });

  parallel_for(threads, U, [&](size_t u, std::vector<double>&) {
    const std::vector<Hit>& hs = hits[needed[u]];
    const int m = static_cast<int>(hs.size());
    act[u].resize(static_cast<size_t>(m) * I);
    for (int i = 0; i < m; ++i)
      for (int c = 0; c < I; ++c)
        act[u][static_cast<size_t>(i) * I + c] =
            swiglu(h13[u][static_cast<size_t>(i) * 2 * I + c], h13[u][static_cast<size_t>(i) * 2 * I + I + c], cfg.swiglu_clamp);
    // FP8: the top-k weight goes into h before h is quantised 1x128 for Linear2 (the kernel's Linear1
    // epilogue), so it is not applied again after Linear2.
    if (fp8) {
      for (int i = 0; i < m; ++i)
        for (int c = 0; c < I; ++c) act[u][static_cast<size_t>(i) * I + c] *= hs[i].weight;
      round_to_fp8(act[u].data(), m, I, 1, cfg.scale_format);
    }
    std::vector<double>().swap(h13[u]);
  }, count_one);

  band_pass(
      Matrix::kW2, [&](size_t u, size_t i) { return &act[u][i * I]; },
      [&](size_t u, size_t i, int row, double v) {
        const Hit& hit = hits[needed[u]][i];
        contrib[(static_cast<size_t>(hit.row) * k + hit.slot) * H + row] = (fp8 ? 1.0 : hit.weight) * v;
      });

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
