#include "common/job.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/check.h"
#include "common/fp8.h"
#include "common/hash.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"
#include "epfuse/reference.h"

namespace epfuse::tools {

// ---- pure helpers ----

uint64_t call_seed(uint64_t seed, int call) {
  return detail::mix64(seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(call) + 1));
}

std::vector<int> token_counts_for_call(const TokenPlan& plan, int world_size, uint64_t seed, int call,
                                       bool vary) {
  if (plan.random || (vary && call > 0))
    return make_token_counts(world_size, plan.max_tokens, call_seed(seed, plan.random && !vary ? 0 : call));
  EPFUSE_REQUIRE(static_cast<int>(plan.per_rank.size()) == world_size, ErrorCode::kInvalidArgument,
                 "token plan has " + std::to_string(plan.per_rank.size()) + " counts for " +
                     std::to_string(world_size) + " ranks");
  return plan.per_rank;
}

std::vector<int> sample_rows(int num_tokens, int max_rows) {
  int n = max_rows > 0 ? std::min(max_rows, num_tokens)
                       : (num_tokens <= kAllRowsUpTo ? num_tokens : kSampledRows);
  std::vector<int> rows;
  if (n <= 0) return rows;
  if (n == 1) return {0};  // a single row: the first (the last is checked whenever n >= 2)
  rows.reserve(static_cast<size_t>(n));
  // Row i of n at round(i * (T-1) / (n-1)): first and last included, evenly spread; distinct
  // because n <= T makes the step >= 1.
  for (int i = 0; i < n; ++i) {
    int64_t r = (static_cast<int64_t>(i) * (num_tokens - 1) + (n - 1) / 2) / (n - 1);
    rows.push_back(static_cast<int>(r));
  }
  return rows;
}

int64_t count_unwritten(std::span<const bf16> y) {
  int64_t n = 0;
  for (const bf16& v : y) {
    uint16_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    n += (bits & 0x7fff) > 0x7f80;  // exponent all ones, mantissa non-zero: NaN (0xFFFF is the poison)
  }
  return n;
}

std::vector<double> row_errors(std::span<const double> ref, std::span<const double> out, size_t H) {
  EPFUSE_REQUIRE(H > 0 && ref.size() == out.size() && ref.size() % H == 0, ErrorCode::kInvalidArgument,
                 "row_errors: ref has " + std::to_string(ref.size()) + " values, out " + std::to_string(out.size()) +
                     ", rows of " + std::to_string(H));
  std::vector<double> errs(ref.size() / H);
  for (size_t r = 0; r < errs.size(); ++r) {
    double diff = 0.0, norm = 0.0;
    for (size_t h = r * H; h < (r + 1) * H; ++h) {
      diff += (out[h] - ref[h]) * (out[h] - ref[h]);
      norm += ref[h] * ref[h];
    }
    errs[r] = std::sqrt(diff) / std::max(std::sqrt(norm), kRowNormFloor);
  }
  return errs;
}

std::vector<std::string> block_error_map(std::span<const double> ref, std::span<const double> out, size_t H,
                                         size_t block) {
  EPFUSE_REQUIRE(H > 0 && block > 0 && ref.size() == out.size() && ref.size() % H == 0, ErrorCode::kInvalidArgument,
                 "block_error_map: ref has " + std::to_string(ref.size()) + " values, out " +
                     std::to_string(out.size()) + ", rows of " + std::to_string(H) + ", blocks of " +
                     std::to_string(block));
  std::vector<std::string> map(ref.size() / H);
  for (size_t r = 0; r < map.size(); ++r)
    for (size_t c0 = 0; c0 < H; c0 += block) {
      double diff = 0.0, norm = 0.0, got = 0.0;
      for (size_t h = r * H + c0; h < r * H + std::min(H, c0 + block); ++h) {
        diff += (out[h] - ref[h]) * (out[h] - ref[h]);
        norm += ref[h] * ref[h];
        got += out[h] * out[h];
      }
      const double err = std::sqrt(diff) / std::max(std::sqrt(norm), kRowNormFloor);
      map[r] += diff == 0.0          ? '.'
                : std::isnan(diff) ? 'n'
                : got == 0.0       ? 'z'
                : err >= 1.0       ? '0'
                : err >= 0.1       ? '1'
                : err >= 0.01      ? '2'
                                   : '3';
    }
  return map;
}

WorstRow worst_row(std::span<const double> errs, std::span<const int> rows, int rank) {
  EPFUSE_REQUIRE(errs.size() == rows.size(), ErrorCode::kInvalidArgument,
                 "worst_row: " + std::to_string(errs.size()) + " errors for " + std::to_string(rows.size()) + " rows");
  WorstRow w;
  for (size_t i = 0; i < errs.size(); ++i) {
    const double err = std::isnan(errs[i]) ? std::numeric_limits<double>::infinity() : errs[i];
    w = worse(w, {rank, rows[i], err});
  }
  return w;
}

WorstRow worse(const WorstRow& a, const WorstRow& b) {
  if (b.row < 0) return a;
  return a.row < 0 || b.err > a.err ? b : a;
}

namespace {
double median_of(std::span<const double> v) {
  std::vector<double> s(v.begin(), v.end());
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}
}  // namespace

CallTimes call_time_stats(std::span<const double> ms) {
  CallTimes t;
  t.calls = ms.size();
  if (ms.empty()) return t;
  t.window = std::max<size_t>(1, std::min(kDriftWindow, ms.size() / 2));
  t.first_median = median_of(ms.first(t.window));
  t.last_median = median_of(ms.last(t.window));
  t.median = median_of(ms);
  const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
  t.min = *lo;
  t.max = *hi;
  return t;
}

WorstRow worst_of_ranks(std::span<const double> gathered) {
  EPFUSE_REQUIRE(gathered.size() % 2 == 0, ErrorCode::kInvalidArgument,
                 "worst_of_ranks: " + std::to_string(gathered.size()) + " values are not (err, row) pairs");
  WorstRow w;
  for (size_t r = 0; r < gathered.size() / 2; ++r)
    w = worse(w, {static_cast<int>(r), static_cast<int>(gathered[2 * r + 1]), gathered[2 * r]});
  return w;
}

bool within_tolerance(const Verdict& v, double tolerance, WeightFormat format) {
  return v.max_rel_err <= tolerance && v.worst_row.err <= row_tolerance(tolerance, format) && v.total_unwritten == 0;
}

// ---- device resources ----

namespace {

// Never empty: some layers reject null pointers even for T = 0.
template <class T>
DeviceArray<T> upload(const std::vector<T>& host, cudaStream_t stream) {
  DeviceArray<T> dev(std::max<size_t>(host.size(), 1));
  if (!host.empty())
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(dev.get(), host.data(), host.size() * sizeof(T),
                                      cudaMemcpyHostToDevice, stream));
  return dev;
}

size_t expert_elems(const LayerConfig& cfg, int world_size) {
  return static_cast<size_t>(cfg.experts_per_rank(world_size)) * 2 * cfg.intermediate * cfg.hidden;
}

}  // namespace

RankWeights::RankWeights(const LayerConfig& cfg, int world_size, int rank, uint64_t seed,
                         cudaStream_t stream)
    : seed_(seed), w13_(expert_elems(cfg, world_size)), w2_(expert_elems(cfg, world_size) / 2) {
  generate_expert_weights(cfg, world_size, rank, seed, w13_.get(), w2_.get(), stream);
  if (cfg.weight_format != WeightFormat::kFp8Block128) return;
  fp8_ = true;
  scale_bytes_ = cfg.scale_format == ScaleFormat::kFp32 ? sizeof(float) : 1;
  const int local = cfg.experts_per_rank(world_size);
  const auto blocks = [](int n) { return static_cast<size_t>(n + 127) / 128; };
  w13_fp8_ = DeviceArray<uint8_t>(expert_elems(cfg, world_size));
  w2_fp8_ = DeviceArray<uint8_t>(expert_elems(cfg, world_size) / 2);
  w13_scales_ = DeviceArray<uint8_t>(size_t(local) * 2 * blocks(cfg.intermediate) * blocks(cfg.hidden) * scale_bytes_);
  w2_scales_ = DeviceArray<uint8_t>(size_t(local) * blocks(cfg.hidden) * blocks(cfg.intermediate) * scale_bytes_);
  quantize_expert_weights(cfg, local, w13_.get(), w2_.get(), w13_fp8_.get(), w2_fp8_.get(), w13_scales_.get(),
                          w2_scales_.get(), stream);
}

ExpertWeights RankWeights::view() const {
  ExpertWeights w{w13_.get(), w2_.get()};
  if (!fp8_) return w;
  w.w13_fp8 = w13_fp8_.get();
  w.w2_fp8 = w2_fp8_.get();
  w.w13_scales = w13_scales_.get();
  w.w2_scales = w2_scales_.get();
  w.w13_scales_count = static_cast<int64_t>(w13_scales_.bytes() / scale_bytes_);
  w.w2_scales_count = static_cast<int64_t>(w2_scales_.bytes() / scale_bytes_);
  return w;
}

InputSet::InputSet(const LayerConfig& cfg, int world_size, int rank, int num_tokens, Routing routing,
                   uint64_t seed, cudaStream_t stream, bool caller_fp8_x)
    : host_(make_tokens(cfg, world_size, rank, num_tokens, routing, seed)),
      seed_(seed),
      x_(upload(host_.x, stream)),
      topk_idx_(upload(host_.topk_idx, stream)),
      topk_weights_(upload(host_.topk_weights, stream)) {
  if (!caller_fp8_x) return;
  EPFUSE_REQUIRE(cfg.weight_format == WeightFormat::kFp8Block128, ErrorCode::kInvalidArgument,
                 "x quantised by the caller needs FP8 weights (weight_format fp8-block128)");
  const int T = host_.num_tokens, H = cfg.hidden;
  std::vector<float> x(host_.x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = __bfloat162float(host_.x[i]);
  std::vector<uint8_t> codes(x.size());
  std::vector<float> scales(static_cast<size_t>(T) * fp8::num_blocks(H));
  fp8::quantize_matrix(x.data(), T, H, 1, codes.data(), scales.data(), cfg.scale_format);
  x_fp8_ = upload(codes, stream);
  x_scales_ = upload(scales, stream);
}

void InputSet::overwrite_with(const InputSet& other, cudaStream_t stream) {
  const auto copy = [&](auto& dst, const auto& src, const char* name) {
    EPFUSE_REQUIRE(dst.bytes() == src.bytes(), ErrorCode::kInvalidArgument,
                   std::string("InputSet::overwrite_with: ") + name + " has " + std::to_string(src.bytes()) +
                       " bytes, the buffer it goes into " + std::to_string(dst.bytes()));
    if (dst.bytes() > 0)
      EPFUSE_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), dst.bytes(), cudaMemcpyDeviceToDevice, stream));
  };
  EPFUSE_REQUIRE(other.num_tokens() == num_tokens(), ErrorCode::kInvalidArgument,
                 "InputSet::overwrite_with: " + std::to_string(other.num_tokens()) + " tokens into a set of " +
                     std::to_string(num_tokens()));
  copy(x_, other.x_, "x");
  copy(topk_idx_, other.topk_idx_, "topk_idx");
  copy(topk_weights_, other.topk_weights_, "topk_weights");
  copy(x_fp8_, other.x_fp8_, "x_fp8");
  copy(x_scales_, other.x_scales_, "x_scales");
  host_ = other.host_;
  seed_ = other.seed_;
}

TokenBatch InputSet::batch() const {
  TokenBatch b{x_.get(), topk_idx_.get(), topk_weights_.get(), host_.num_tokens};
  if (x_fp8_.get() != nullptr) {
    b.x = nullptr;  // the layer must not need it
    b.x_fp8 = x_fp8_.get();
    b.x_scales = x_scales_.get();
  }
  return b;
}

// ---- the job ----

RankJob::RankJob(Communicator& comm, const LayerConfig& cfg, Impl impl, uint64_t weight_seed)
    : comm_(comm), cfg_(cfg) {
  validate_config(cfg_, comm.world_size());
  EPFUSE_CUDA_CHECK(cudaSetDevice(comm.device()));
  EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    weights_ = std::make_unique<RankWeights>(cfg_, comm.world_size(), comm.rank(), weight_seed, stream_);
    // The layer may set up on its own streams: the weights must be complete first.
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    layer_ = MoeLayer::create(impl, cfg_, comm_, weights_->view());
    y_ = DeviceArray<bf16>(static_cast<size_t>(std::max(cfg_.max_tokens_per_rank, 1)) * cfg_.hidden);
  } catch (...) {
    layer_.reset();
    weights_.reset();
    (void)cudaStreamDestroy(stream_);
    throw;
  }
}

RankJob::~RankJob() {
  layer_.reset();  // borrows the weights
  weights_.reset();
  (void)cudaStreamDestroy(stream_);
}

InputSet RankJob::make_inputs(int num_tokens, Routing routing, uint64_t seed, bool caller_fp8_x) const {
  return InputSet(cfg_, comm_.world_size(), comm_.rank(), num_tokens, routing, seed, stream_, caller_fp8_x);
}

void RankJob::forward(const InputSet& in) {
  // One-GPU mode: this rank's allocations since its last forward (inputs) synchronise the device, and
  // so wait for peers' forwards that wait for this one: the ranks launch only once all have made them.
  if (comm_.transport() == Transport::kLoopback) comm_.barrier();
  layer_->forward(in.batch(), y_.get(), stream_);
}

Verdict RankJob::verified_forward(const InputSet& in, std::span<const int> rows, double tolerance,
                                  int reference_threads) {
  return verify_forward(comm_, *layer_, cfg_, weights_->seed(), y_.get(), y_.bytes(), stream_, in, rows, tolerance,
                        reference_threads, [&] { forward(in); });
}

Verdict RankJob::verified_launch(const InputSet& in, std::span<const int> rows, double tolerance,
                                 int reference_threads, const std::function<void()>& launch) {
  return verify_forward(comm_, *layer_, cfg_, weights_->seed(), y_.get(), y_.bytes(), stream_, in, rows, tolerance,
                        reference_threads, launch);
}

Verdict verify_forward(Communicator& comm, MoeLayer& layer, const LayerConfig& cfg, uint64_t weight_seed, bf16* y_dev,
                       size_t y_bytes, cudaStream_t stream, const InputSet& in, std::span<const int> rows,
                       double tolerance, int reference_threads, const std::function<void()>& launch) {
  const int T = in.num_tokens();
  const size_t H = static_cast<size_t>(cfg.hidden);
  Verdict v;
  v.num_tokens = T;
  v.rows_checked = static_cast<int>(rows.size());

  // 0xFFFF is a bf16 NaN: any element the layer does not write stays NaN and is counted below.
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(y_dev, 0xFF, y_bytes, stream));
  v.forward_ms = time_iterations(stream, 1, [&](int) { launch(); })[0];
  layer.check_errors(stream);
  std::vector<bf16> y(static_cast<size_t>(T) * H);
  if (T > 0)
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(y.data(), y_dev, y.size() * sizeof(bf16), cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  v.unwritten = count_unwritten(y);

  WorstRow mine;
  if (!rows.empty()) {
    for (int r : rows)
      EPFUSE_REQUIRE(r >= 0 && r < T, ErrorCode::kInvalidArgument,
                     "verified row " + std::to_string(r) + " is outside the rank's " + std::to_string(T) +
                         " tokens");
    GeneratedExperts experts(cfg, weight_seed);
    std::vector<double> ref = reference_forward(cfg, in.host(), experts, rows, reference_threads);
    std::vector<double> out;
    out.reserve(rows.size() * H);
    for (int r : rows)
      for (size_t h = 0; h < H; ++h) out.push_back(static_cast<double>(__bfloat162float(y[r * H + h])));
    v.rel_err = relative_error(ref, out);
    mine = worst_row(row_errors(ref, out, H), rows, comm.rank());
    v.row_err = mine.err;
    double sq = 0.0;
    for (double o : out) sq += o * o;
    v.output_norm = std::sqrt(sq);
  }

  // A NaN error is reported as +inf (Verdict::max_rel_err; unwritten > 0 says why).
  const double local_err = std::isnan(v.rel_err) ? std::numeric_limits<double>::infinity() : v.rel_err;
  v.max_rel_err = comm.all_reduce_max(local_err);
  v.total_unwritten = comm.all_reduce_sum(v.unwritten);
  const double pair[] = {mine.err, static_cast<double>(mine.row)};
  v.worst_row = worst_of_ranks(comm.all_gather(pair));
  v.passed = within_tolerance(v, tolerance, cfg.weight_format);
  return v;
}

// ---- graphs ----

CapturedGraph::CapturedGraph(cudaStream_t stream, const std::function<void()>& capture) : stream_(stream) {
  EPFUSE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  try {
    capture();
  } catch (...) {
    cudaGraph_t partial = nullptr;  // end the capture, so that the stream is usable again
    if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial != nullptr) (void)cudaGraphDestroy(partial);
    throw;
  }
  try {
    EPFUSE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph_));
    EPFUSE_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph_, 0));
    EPFUSE_CUDA_CHECK(cudaGraphUpload(exec_, stream_));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  } catch (...) {
    release();
    throw;
  }
}

CapturedGraph::~CapturedGraph() { release(); }

void CapturedGraph::launch() { EPFUSE_CUDA_CHECK(cudaGraphLaunch(exec_, stream_)); }

void CapturedGraph::release() {  // also the destructor's: nothing to report an error to
  if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
  if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
  exec_ = nullptr;
  graph_ = nullptr;
}

// ---- timing ----

namespace {

class Events {
 public:
  explicit Events(size_t n) : events_(n, nullptr) {
    for (cudaEvent_t& e : events_) EPFUSE_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~Events() {
    for (cudaEvent_t e : events_)
      if (e) (void)cudaEventDestroy(e);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
  cudaEvent_t operator[](size_t i) const { return events_[i]; }

 private:
  std::vector<cudaEvent_t> events_;
};

}  // namespace

std::vector<double> time_iterations(cudaStream_t stream, int n, const std::function<void(int)>& body,
                                    const std::function<void(int)>& before) {
  EPFUSE_REQUIRE(n >= 0, ErrorCode::kInvalidArgument, "iteration count must be >= 0, got " + std::to_string(n));
  Events events(2 * static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    if (before) before(i);
    EPFUSE_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
    body(i);
    EPFUSE_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
  }
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    float t = 0.0f;
    EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&t, events[2 * i], events[2 * i + 1]));
    ms[static_cast<size_t>(i)] = t;
  }
  return ms;
}

}  // namespace epfuse::tools
