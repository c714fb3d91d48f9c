#include "bench/decode_run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <vector>

#include "bench/decode_step.h"
#include "bench/timed_call.h"
#include "bench/rms_norm.h"
#include "bench/stats.h"
#include "common/check.h"
#include "common/job.h"
#include "epfuse/error.h"
#include "epfuse/reference.h"
#include "epfuse/workspace.h"
#include "padding/padding.h"

namespace epfuse::bench {
namespace {

using tools::DeviceArray;

size_t blocks128(int n) { return static_cast<size_t>(n + 127) / 128; }

// One rank's experts of one weight set, holding only what the layer reads: bf16 weights, or FP8 codes
// and block scales (quantised from bf16 ones generated into the caller's scratch, which the next set
// reuses), so that as many sets as possible fit.
class WeightSet {
 public:
  static size_t scale_bytes(const LayerConfig& cfg) { return cfg.scale_format == ScaleFormat::kFp32 ? sizeof(float) : 1; }
  static size_t w13_scales(const LayerConfig& cfg, int local) {
    return size_t(local) * 2 * blocks128(cfg.intermediate) * blocks128(cfg.hidden);
  }
  static size_t w2_scales(const LayerConfig& cfg, int local) {
    return size_t(local) * blocks128(cfg.hidden) * blocks128(cfg.intermediate);
  }
  static size_t w13_elems(const LayerConfig& cfg, int local) { return size_t(local) * 2 * cfg.intermediate * cfg.hidden; }
  static size_t bytes(const LayerConfig& cfg, int local) {
    const size_t elems = 3 * w13_elems(cfg, local) / 2;
    if (cfg.weight_format != WeightFormat::kFp8Block128) return elems * sizeof(bf16);
    return elems + (w13_scales(cfg, local) + w2_scales(cfg, local)) * scale_bytes(cfg);
  }

  // scratch13 / scratch2: w13_elems / half of it bf16 each (FP8 sets only; null for bf16).
  WeightSet(const LayerConfig& cfg, int world, int rank, uint64_t seed, bf16* scratch13, bf16* scratch2,
            cudaStream_t stream) {
    const int local = cfg.experts_per_rank(world);
    const size_t n13 = w13_elems(cfg, local);
    if (cfg.weight_format != WeightFormat::kFp8Block128) {
      w13_ = DeviceArray<bf16>(n13);
      w2_ = DeviceArray<bf16>(n13 / 2);
      generate_expert_weights(cfg, world, rank, seed, w13_.get(), w2_.get(), stream);
      view_ = ExpertWeights{w13_.get(), w2_.get()};
      return;
    }
    w13_fp8_ = DeviceArray<uint8_t>(n13);
    w2_fp8_ = DeviceArray<uint8_t>(n13 / 2);
    w13_scales_ = DeviceArray<uint8_t>(w13_scales(cfg, local) * scale_bytes(cfg));
    w2_scales_ = DeviceArray<uint8_t>(w2_scales(cfg, local) * scale_bytes(cfg));
    generate_expert_weights(cfg, world, rank, seed, scratch13, scratch2, stream);
    quantize_expert_weights(cfg, local, scratch13, scratch2, w13_fp8_.get(), w2_fp8_.get(), w13_scales_.get(),
                            w2_scales_.get(), stream);
    view_.w13_fp8 = w13_fp8_.get();
    view_.w2_fp8 = w2_fp8_.get();
    view_.w13_scales = w13_scales_.get();
    view_.w2_scales = w2_scales_.get();
    view_.w13_scales_count = static_cast<int64_t>(w13_scales(cfg, local));
    view_.w2_scales_count = static_cast<int64_t>(w2_scales(cfg, local));
  }
  const ExpertWeights& view() const { return view_; }

 private:
  DeviceArray<bf16> w13_, w2_;
  DeviceArray<uint8_t> w13_fp8_, w2_fp8_, w13_scales_, w2_scales_;
  ExpertWeights view_;
};

// Destroys a captured graph and its executable on every path.
struct Graph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ~Graph() {
    if (exec) (void)cudaGraphExecDestroy(exec);
    if (graph) (void)cudaGraphDestroy(graph);
  }
};

template <class T>
void upload(DeviceArray<T>& dev, const std::vector<T>& host, cudaStream_t stream) {
  EPFUSE_REQUIRE(host.size() <= dev.size(), ErrorCode::kInternal, "decode step: an upload larger than its buffer");
  if (!host.empty())
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(dev.get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
}

std::vector<bf16> download(const DeviceArray<bf16>& dev, size_t count, cudaStream_t stream) {
  std::vector<bf16> host(count);
  if (count > 0)
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(host.data(), dev.get(), count * sizeof(bf16), cudaMemcpyDeviceToHost, stream));
  return host;
}

std::vector<double> to_double(const std::vector<bf16>& v) {
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<double>(__bfloat162float(v[i]));
  return out;
}

double worst(std::span<const double> errs) {
  double w = 0.0;
  for (double e : errs) w = std::max(w, std::isnan(e) ? std::numeric_limits<double>::infinity() : e);
  return w;
}

double nan_as_inf(double v) { return std::isnan(v) ? std::numeric_limits<double>::infinity() : v; }

}  // namespace

void run_decode_step(Communicator& comm, const BenchCase& bc, const BenchOptions& o, int reference_threads,
                     BenchRow& row) {
  const LayerConfig& cfg = bc.layer;
  const int world = comm.world_size(), rank = comm.rank(), L = o.step_layers, T = bc.tokens_per_rank;
  const size_t H = static_cast<size_t>(cfg.hidden), K = static_cast<size_t>(cfg.topk);
  const bool fp8 = cfg.weight_format == WeightFormat::kFp8Block128;
  if (padding::needs_padding(cfg, Impl::kFused)) {
    // A padded layer copies its weights (and pads x and y) per layer: not the step an engine runs.
    if (rank == 0)
      std::fprintf(stderr, "epfuse bench: --layers: %s runs padded (config.h \"Sizes\"); no decode step\n",
                   case_label(bc).c_str());
    return;
  }
  const tools::OwnedStream owned_stream(comm.device());
  const cudaStream_t stream = owned_stream.get();

  // Declared in the order they must outlive each other: the layers borrow the weights and the workspace.
  const std::unique_ptr<Workspace> ws = Workspace::create(comm, cfg);
  const size_t act = static_cast<size_t>(std::max(T, 1)) * H;
  std::vector<DeviceArray<bf16>> xs, ys;  // xs[l]: layer l's input (xs[L]: the step's output); ys[l]: its MoE output
  std::vector<DeviceArray<int32_t>> idx;
  std::vector<DeviceArray<float>> wts;
  for (int l = 0; l <= L; ++l) xs.emplace_back(act);
  for (int l = 0; l < L; ++l) {
    ys.emplace_back(act);
    idx.emplace_back(static_cast<size_t>(std::max(T, 1)) * K);
    wts.emplace_back(static_cast<size_t>(std::max(T, 1)) * K);
  }

  // Weight sets: as many as fit (the same count on every rank, so that every rank's layer i runs set
  // i % S and the reference knows every expert's seed).
  const int local = cfg.experts_per_rank(world);
  const size_t set_bytes = WeightSet::bytes(cfg, local);
  DeviceArray<bf16> scratch13, scratch2;
  if (fp8) {
    scratch13 = DeviceArray<bf16>(WeightSet::w13_elems(cfg, local));
    scratch2 = DeviceArray<bf16>(WeightSet::w13_elems(cfg, local) / 2);
  }
  // Still to come after the sets: each FP8 layer's own copy of its scales (in its GEMMs' layout, no
  // larger than twice the caller's), and allocator and NCCL slack.
  const size_t per_layer = fp8 ? 2 * (WeightSet::w13_scales(cfg, local) + WeightSet::w2_scales(cfg, local)) * sizeof(float) : 0;
  const size_t reserve = static_cast<size_t>(L) * per_layer + (size_t{64} << 20);
  size_t free_bytes = 0, total_bytes = 0;
  EPFUSE_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const int mine = weight_sets_that_fit(free_bytes, total_bytes, set_bytes, reserve, kStepKeepFreeFraction, L,
                                        o.step_weight_sets);
  const int S = static_cast<int>(-comm.all_reduce_max(-static_cast<double>(mine)));
  std::vector<std::unique_ptr<WeightSet>> sets;
  for (int s = 0; s < S; ++s)
    sets.push_back(std::make_unique<WeightSet>(cfg, world, rank, weight_set_seed(o.seed, s), scratch13.get(),
                                               scratch2.get(), stream));
  // The layers read FP8 scales at creation, synchronously: the sets must be complete.
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  scratch13 = DeviceArray<bf16>();
  scratch2 = DeviceArray<bf16>();

  std::vector<std::unique_ptr<MoeLayer>> layers;
  for (int l = 0; l < L; ++l) layers.push_back(MoeLayer::create(cfg, *ws, sets[l % S]->view()));

  // This replay's inputs: every layer's routing, and x for layer 0; the host copies for the reference.
  std::vector<HostTokens> inputs(L);
  const auto write_inputs = [&](int replay) {
    for (int l = 0; l < L; ++l) {
      inputs[l] = make_tokens(cfg, world, rank, T, o.routing, step_input_seed(o.seed, replay, l));
      upload(idx[l], inputs[l].topk_idx, stream);
      upload(wts[l], inputs[l].topk_weights, stream);
    }
    upload(xs[0], inputs[0].x, stream);
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));  // the host copies may change after this
  };
  const auto enqueue_step = [&] {
    for (int l = 0; l < L; ++l) {
      layers[l]->forward(TokenBatch{xs[l].get(), idx[l].get(), wts[l].get(), T}, ys[l].get(), stream);
      rms_norm(ys[l].get(), xs[l + 1].get(), T, cfg.hidden, static_cast<float>(kRmsNormEps), stream);
    }
  };
  write_inputs(0);

  Graph graph;
  if (o.step_graph) {
    // Thread-local capture, as the layer's own graph test does; nothing else runs on this stream.
    EPFUSE_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    try {
      enqueue_step();
    } catch (...) {
      cudaGraph_t partial = nullptr;
      (void)cudaStreamEndCapture(stream, &partial);
      if (partial) (void)cudaGraphDestroy(partial);
      throw;
    }
    EPFUSE_CUDA_CHECK(cudaStreamEndCapture(stream, &graph.graph));
    EPFUSE_CUDA_CHECK(cudaGraphInstantiate(&graph.exec, graph.graph, 0));
    EPFUSE_CUDA_CHECK(cudaGraphUpload(graph.exec, stream));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  const auto run_step = [&] {
    if (o.step_graph) {
      EPFUSE_CUDA_CHECK(cudaGraphLaunch(graph.exec, stream));
    } else {
      enqueue_step();
    }
  };

  // The row's protocol (bench/README.md "Protocol"): warm-up, then per iteration a stream sync, a barrier
  // of the ranks and the GPU delay outside the events; per iteration the slowest rank.
  comm.barrier();
  for (int i = 0; i < o.warmup; ++i) run_step();
  const std::vector<double> ms = tools::time_iterations(
      stream, o.iters, [&](int) { run_step(); }, [&](int) { start_together(comm, stream); });
  const Summary step_ms = slowest_rank(comm, ms);
  layers.back()->check_errors(stream);  // the workspace's error record: any layer's failure in the timed replays

  // The verified replay: new inputs written into the captured buffers, every output poisoned (0xFF bytes:
  // bf16 NaN) so that an element no kernel wrote stays NaN.
  write_inputs(1);
  for (int l = 0; l < L; ++l) {
    EPFUSE_CUDA_CHECK(cudaMemsetAsync(ys[l].get(), 0xFF, ys[l].bytes(), stream));
    EPFUSE_CUDA_CHECK(cudaMemsetAsync(xs[l + 1].get(), 0xFF, xs[l + 1].bytes(), stream));
  }
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  comm.barrier();
  run_step();
  layers.back()->check_errors(stream);
  const size_t n = static_cast<size_t>(T) * H;
  std::vector<std::vector<bf16>> x_out, y_out;
  for (int l = 0; l <= L; ++l) x_out.push_back(download(xs[l], n, stream));
  for (int l = 0; l < L; ++l) y_out.push_back(download(ys[l], n, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));

  // Every norm on every row: its output against the float64 norm of the layer output it read.
  int64_t unwritten = 0;
  double norm_err = 0.0;
  for (int l = 0; l < L; ++l) {
    unwritten += tools::count_unwritten(y_out[l]) + tools::count_unwritten(x_out[l + 1]);
    if (T > 0) norm_err = std::max(norm_err, worst(tools::row_errors(rms_norm_reference(to_double(y_out[l]), H),
                                                                     to_double(x_out[l + 1]), H)));
  }
  // The checked layers' sampled rows against the float64 reference of that layer on the input it read
  // (x_out[l], the previous norm's bf16 output): each layer is checked at the layer's own tolerance, and
  // an error does not compound over the layers before it.
  const std::vector<int> rows = tools::sample_rows(T, o.verify_rows);
  const std::vector<int> checked = checked_layers(L, o.step_check_layers);
  double layer_err = 0.0, row_err = 0.0;
  if (!rows.empty())
    for (int l : checked) {
      HostTokens in = inputs[l];
      in.x = x_out[l];
      const GeneratedExperts experts(cfg, weight_set_seed(o.seed, l % S));
      const std::vector<double> ref = reference_forward(cfg, in, experts, rows, reference_threads);
      std::vector<double> out;
      out.reserve(rows.size() * H);
      for (int r : rows)
        for (size_t h = 0; h < H; ++h) out.push_back(static_cast<double>(__bfloat162float(y_out[l][r * H + h])));
      layer_err = std::max(layer_err, nan_as_inf(relative_error(ref, out)));
      row_err = std::max(row_err, worst(tools::row_errors(ref, out, H)));
    }

  row.step_layers = L;
  row.step_graph = o.step_graph;
  row.step_weight_sets = S;
  row.step_weight_set_bytes = comm.all_reduce_max(static_cast<double>(set_bytes));
  row.step_median_ms = step_ms.median;
  row.step_p10_ms = step_ms.p10;
  row.step_p90_ms = step_ms.p90;
  row.step_layers_checked = static_cast<int>(checked.size());
  row.step_rel_err = comm.all_reduce_max(layer_err);
  row.step_row_err = comm.all_reduce_max(row_err);
  row.step_norm_rel_err = comm.all_reduce_max(norm_err);
  row.step_unwritten = comm.all_reduce_sum(unwritten);
  const bool passed = row.step_rel_err <= o.tolerance &&
                      row.step_row_err <= tools::row_tolerance(o.tolerance, cfg.weight_format) &&
                      row.step_norm_rel_err <= o.tolerance && row.step_unwritten == 0;
  row.step_verified = passed ? "yes" : "no";
}

}  // namespace epfuse::bench
