// Forwards on one workspace from several host threads and streams, and beside a CUDA graph replay
// (README "Threads and streams"): each forward takes the workspace's turn (common/stream_turn.h), so
// every call's rows match the float64 reference however the threads interleave. At world > 1 the
// calls pair across ranks in the order each rank took its turns, which is right for calls of one
// layer from any thread; calls of different layers or workspaces from racing threads are world 1 only.
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "common/job.h"
#include "epfuse/epfuse.h"
#include "layer_rank.h"
#include "multiprocess.h"

namespace epfuse {
namespace {

constexpr double kTolerance = 2e-2;  // epfuse run's default

// "" when `got` (a forward's rows) matches the float64 reference of `in`; else what does not.
std::string reference_mismatch(const LayerConfig& cfg, const GeneratedExperts& experts, const HostTokens& in,
                               const std::vector<double>& got) {
  const auto unwritten = std::count_if(got.begin(), got.end(), [](double v) { return std::isnan(v); });
  if (unwritten > 0) return std::to_string(unwritten) + " unwritten elements";
  if (in.num_tokens == 0) return "";
  const std::vector<double> want = reference_forward(cfg, in, experts);
  const double overall = relative_error(want, got);
  if (!(overall < kTolerance)) return "relative error " + std::to_string(overall);
  const std::vector<double> rows = tools::row_errors(want, got, static_cast<size_t>(cfg.hidden));
  for (size_t r = 0; r < rows.size(); ++r)
    if (!(rows[r] <= tools::row_tolerance(kTolerance, cfg.weight_format)))
      return "row " + std::to_string(r) + " relative error " + std::to_string(rows[r]);
  return "";
}

// One thread's stream and buffers, sized for cfg.max_tokens_per_rank (made before the threads start:
// in the one-GPU mode an allocation waits for the device, LoopbackWorld).
class Worker {
 public:
  explicit Worker(const LayerConfig& cfg)
      : cfg_(cfg),
        x_(size_t(cfg.max_tokens_per_rank) * cfg.hidden * sizeof(bf16)),
        idx_(size_t(cfg.max_tokens_per_rank) * cfg.topk * sizeof(int32_t)),
        weights_(size_t(cfg.max_tokens_per_rank) * cfg.topk * sizeof(float)),
        y_(size_t(cfg.max_tokens_per_rank) * cfg.hidden * sizeof(bf16)) {
    EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~Worker() { (void)cudaStreamDestroy(stream_); }
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  cudaStream_t stream() const { return stream_; }
  TokenBatch batch(int count) const { return {x_.as<bf16>(), idx_.as<int32_t>(), weights_.as<float>(), count}; }
  bf16* y() const { return y_.as<bf16>(); }

  // Stream-ordered: the inputs into this worker's buffers, y poisoned (bf16 NaN).
  void upload(const HostTokens& in) {
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(x_.as(), in.x.data(), in.x.size() * sizeof(bf16), cudaMemcpyHostToDevice, stream_));
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(idx_.as(), in.topk_idx.data(), in.topk_idx.size() * sizeof(int32_t),
                                      cudaMemcpyHostToDevice, stream_));
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(weights_.as(), in.topk_weights.data(), in.topk_weights.size() * sizeof(float),
                                      cudaMemcpyHostToDevice, stream_));
    EPFUSE_CUDA_CHECK(cudaMemsetAsync(y_.as(), 0xff, y_.bytes(), stream_));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host vectors may go after this returns
  }
  // y's first rows as double, after this worker's stream.
  std::vector<double> output(int num_tokens) {
    std::vector<bf16> host(size_t(num_tokens) * cfg_.hidden);
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(host.data(), y_.as(), host.size() * sizeof(bf16), cudaMemcpyDeviceToHost, stream_));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<double> out(host.size());
    for (size_t i = 0; i < host.size(); ++i) out[i] = __bfloat162float(host[i]);
    return out;
  }

 private:
  LayerConfig cfg_;
  detail::DeviceBuffer x_, idx_, weights_, y_;
  cudaStream_t stream_ = nullptr;
};

// Runs `calls` forwards of layers[t % layers.size()] from each of `threads` threads at once, each on
// its own stream with fresh inputs, every one checked against the reference; returns the failures.
// The threads meet before every call, so that their forwards race (a thread that stops drops out).
std::vector<std::string> hammer(std::vector<testing::LayerRank*> layers, int threads, int calls, uint64_t seed) {
  std::vector<std::unique_ptr<Worker>> workers;
  for (int t = 0; t < threads; ++t) workers.push_back(std::make_unique<Worker>(layers[t % layers.size()]->layer().config()));
  std::vector<std::string> failures(static_cast<size_t>(threads));
  std::atomic<int> checked{0};
  std::barrier<> meet(threads);
  if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();  // see LoopbackWorld
  // The rank's communicator belongs to the rank's own thread (one-GPU mode): its device is read here.
  const int device = testing::comm().device();
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      testing::LayerRank& r = *layers[t % layers.size()];
      Worker& w = *workers[t];
      const LayerConfig& cfg = r.layer().config();
      const GeneratedExperts experts(cfg, testing::kWeightSeed);
      const Routing routings[] = {Routing::kUniform, Routing::kSkewed, Routing::kDropped, Routing::kOneRank};
      try {
        EPFUSE_CUDA_CHECK(cudaSetDevice(device));
        for (int c = 0; c < calls; ++c) {
          const uint64_t s = seed + 1000 * t + c;
          const HostTokens in = r.tokens(static_cast<int>(s % 33), routings[(t + c) % 4], s);  // 0 to 32 tokens
          w.upload(in);
          meet.arrive_and_wait();
          r.layer().forward(w.batch(in.num_tokens), w.y(), w.stream());
          r.layer().check_errors(w.stream());
          const std::string bad = reference_mismatch(cfg, experts, in, w.output(in.num_tokens));
          if (!bad.empty()) {
            failures[t] = "thread " + std::to_string(t) + " call " + std::to_string(c) + ": " + bad;
            break;
          }
          ++checked;
        }
      } catch (const std::exception& e) {
        failures[t] = "thread " + std::to_string(t) + ": " + e.what();
      }
      meet.arrive_and_drop();
    });
  for (std::thread& t : pool) t.join();
  std::vector<std::string> out;
  for (const std::string& f : failures)
    if (!f.empty()) out.push_back(f);
  if (out.empty() && checked.load() != threads * calls)
    out.push_back(std::to_string(checked.load()) + " of " + std::to_string(threads * calls) + " calls checked");
  return out;
}

// Four threads call one layer at once, each on its own stream (at every world: one layer's calls pair
// correctly in any order). Without the workspace's turn two of them would launch onto one control block.
EPFUSE_RANK_TEST(Threads, OneLayerFromFourThreadsMatchesTheReference) {
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), cfg);
  testing::LayerRank layer(Impl::kFused, cfg, 0, ws.get());
  for (const std::string& f : hammer({&layer}, 4, 16, 5000)) ADD_FAILURE() << "rank " << layer.rank() << ": " << f;
  EXPECT_FALSE(ws->failed());
}

// Two layers of different shapes on one workspace, four threads (two per layer) at once. World 1
// only: at world > 1 racing threads would pair one rank's call of a layer with a peer's of the other.
EPFUSE_RANK_TEST(Threads, TwoLayersOfOneWorkspaceFromFourThreads) {
  if (testing::world() > 1) GTEST_SKIP() << "calls of different layers from racing threads need world 1";
  const testing::TwoLayerShapes shapes = testing::two_layer_shapes();
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), shapes.capacity);
  testing::LayerRank ra(Impl::kFused, shapes.a, 0, ws.get());
  testing::LayerRank rb(Impl::kFused, shapes.b, 0, ws.get());
  for (const std::string& f : hammer({&ra, &rb}, 4, 16, 6000)) ADD_FAILURE() << f;
}

// Two workspaces on one GPU, each of whose kernels takes every SM, forwarded from two threads at once:
// they take turns on the GPU (README "Threads and streams"), so neither holds SMs the other waits for.
// World 1 only: at world > 1 every rank must issue them in the same order, which racing threads do not.
EPFUSE_RANK_TEST(Threads, TwoWorkspacesOnOneGpuTakeTurns) {
  if (testing::world() > 1) GTEST_SKIP() << "forwards of two workspaces from racing threads need world 1";
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  std::unique_ptr<Workspace> first = Workspace::create(testing::comm(), cfg);
  std::unique_ptr<Workspace> second = Workspace::create(testing::comm(), cfg);
  testing::LayerRank ra(Impl::kFused, cfg, 0, first.get());
  testing::LayerRank rb(Impl::kFused, cfg, 0, second.get());
  for (const std::string& f : hammer({&ra, &rb}, 4, 16, 7000)) ADD_FAILURE() << f;
}

// The rule for two workspaces at any world (README "Threads and streams"): one thread per rank issues
// forwards of two workspaces in the same order on every rank, on two streams with no host
// synchronisation between them. Their kernels, each taking the SMs of its rank, run one at a time per
// GPU (per rank in the one-GPU mode, beside the peers'), so every call matches the reference.
EPFUSE_RANK_TEST(Threads, TwoWorkspacesInOneOrderOnEveryRank) {
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  std::unique_ptr<Workspace> first = Workspace::create(testing::comm(), cfg);
  std::unique_ptr<Workspace> second = Workspace::create(testing::comm(), cfg);
  testing::LayerRank ra(Impl::kFused, cfg, 0, first.get());
  testing::LayerRank rb(Impl::kFused, cfg, 0, second.get());
  const GeneratedExperts experts(cfg, testing::kWeightSeed);
  for (int round = 0; round < 20; ++round) {
    const HostTokens in_a = ra.tokens(48, Routing::kUniform, 9000 + round);
    const HostTokens in_b = rb.tokens(1 + round % 40, Routing::kSkewed, 9100 + round);
    ra.upload(in_a);
    ra.poison_y();
    rb.upload(in_b);
    rb.poison_y();
    if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();  // see LoopbackWorld
    ra.layer().forward(ra.batch(in_a.num_tokens), ra.y(), ra.stream());
    rb.layer().forward(rb.batch(in_b.num_tokens), rb.y(), rb.stream());
    ra.layer().check_errors(ra.stream());
    rb.layer().check_errors(rb.stream());
    const std::string what = "round " + std::to_string(round);
    EXPECT_EQ(reference_mismatch(cfg, experts, in_a, ra.output(in_a.num_tokens)), "") << what << ": the first workspace";
    EXPECT_EQ(reference_mismatch(cfg, experts, in_b, rb.output(in_b.num_tokens)), "") << what << ": the second";
  }
}

// A forward captured in a graph, replayed on one stream while an eager forward of the same layer is
// issued on another stream with no host synchronisation between them, in both orders: the replay
// waits for the eager forward issued before it and the next eager forward waits for the replay (the
// capture holds external event nodes), so both calls' rows match the reference every time.
EPFUSE_RANK_TEST(Threads, EagerForwardBesideAGraphReplayIsOrdered) {
  const LayerConfig cfg = testing::small_layer_config(256, 0.0f);
  std::unique_ptr<Workspace> ws = Workspace::create(testing::comm(), cfg);
  testing::LayerRank r(Impl::kFused, cfg, 0, ws.get());
  Worker eager(cfg);
  const GeneratedExperts experts(cfg, testing::kWeightSeed);
  constexpr int kTokens = 48;
  r.upload(r.tokens(kTokens, Routing::kUniform, 8000));
  tools::CapturedGraph graph(r.stream(), [&] { r.layer().forward(r.batch(kTokens), r.y(), r.stream()); });
  testing::comm().barrier();  // see CapturedGraph: instantiation may wait for the device
  for (int round = 0; round < 20; ++round) {
    const HostTokens replayed = r.tokens(kTokens, Routing::kSkewed, 8100 + round);
    const HostTokens direct = r.tokens(1 + round % 40, Routing::kUniform, 8200 + round);
    r.upload(replayed);
    r.poison_y();
    eager.upload(direct);
    if (testing::comm().transport() == Transport::kLoopback) testing::comm().barrier();
    if (round % 2 == 0) {
      graph.launch();
      r.layer().forward(eager.batch(direct.num_tokens), eager.y(), eager.stream());
    } else {
      r.layer().forward(eager.batch(direct.num_tokens), eager.y(), eager.stream());
      graph.launch();
    }
    r.layer().check_errors(r.stream());
    r.layer().check_errors(eager.stream());
    const std::string what = "round " + std::to_string(round) + (round % 2 == 0 ? " (replay first)" : " (eager first)");
    EXPECT_EQ(reference_mismatch(cfg, experts, replayed, r.output(kTokens)), "") << what << ": the replay";
    EXPECT_EQ(reference_mismatch(cfg, experts, direct, eager.output(direct.num_tokens)), "") << what << ": eager";
  }
}

}  // namespace
}  // namespace epfuse
