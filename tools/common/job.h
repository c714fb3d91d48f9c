// The per-rank job shared by `epfuse run`, `epfuse bench` and the GPU tests: this rank's expert
// weights on its GPU, seeded input sets, the layer, one forward verified against the float64 CPU
// reference (the verdict agreed by all ranks), and event timing of repeated forwards.
//
// Everything a rank needs is derived from seeds, so ranks agree on token counts, routing and
// weights without exchanging anything but the final verdict.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <cuda_runtime.h>

#include "common/device_buffer.h"
#include "epfuse/communicator.h"
#include "epfuse/config.h"
#include "epfuse/inputs.h"
#include "epfuse/layer.h"
#include "epfuse/types.h"

namespace epfuse::tools {

// ---- pure helpers (host only, unit-tested on the CPU) ----

// The input seed of forward call `call` (0-based) of a run seeded with `seed`; the weight seed is
// `seed` itself. Distinct calls get unrelated inputs; the same (seed, call) gives the same inputs.
uint64_t call_seed(uint64_t seed, int call);

// How many tokens each rank gets.
struct TokenPlan {
  std::vector<int> per_rank;  // fixed counts, one per rank (used when !random)
  bool random = false;        // counts drawn per call in [0, max_tokens] (make_token_counts)
  int max_tokens = 0;         // the layer's max_tokens_per_rank
};
// The counts of call `call`: fixed ones, or drawn from call_seed(seed, call) when the plan is
// random or `vary` asks for fresh counts every call (then the first call keeps the fixed counts).
std::vector<int> token_counts_for_call(const TokenPlan& plan, int world_size, uint64_t seed, int call,
                                       bool vary);

// The rows of a rank's T tokens compared with the reference: all of them when max_rows <= 0 and
// T <= kAllRowsUpTo, or when max_rows >= T; otherwise max_rows (default kSampledRows) rows spread
// evenly over [0, T), always including the first and the last. Sorted, distinct.
inline constexpr int kAllRowsUpTo = 64;
inline constexpr int kSampledRows = 32;
std::vector<int> sample_rows(int num_tokens, int max_rows);

// Poisoned or NaN bf16 elements of y: the layer never wrote them (or wrote garbage).
int64_t count_unwritten(std::span<const bf16> y);

// Per-row relative errors of `out` against `ref`, both [rows, H] row-major: row r's is
// ||out_r - ref_r|| / max(||ref_r||, kRowNormFloor), so a row the reference leaves zero (every slot
// dropped) must come out zero. NaN for a row of `out` holding a NaN. Throws Error(kInvalidArgument)
// when the sizes differ or are not a multiple of H.
inline constexpr double kRowNormFloor = 1e-30;
std::vector<double> row_errors(std::span<const double> ref, std::span<const double> out, size_t H);
// Where two outputs of the same inputs differ (a failed forward against the next one): per row of H, one
// character per block of `block` columns (the last may be shorter): '.' identical, 'n' a NaN in either,
// 'z' all zero where `ref` is not, else the block's relative error, '0' >= 1, '1' >= 0.1, '2' >= 0.01,
// '3' below.
std::vector<std::string> block_error_map(std::span<const double> ref, std::span<const double> out, size_t H,
                                         size_t block);

// The per-row bound that goes with an overall tolerance (relative Frobenius error over all checked
// rows), so that a few bad rows cannot hide among many good ones. Rounding the layer's bf16 stages
// (Linear1 output, expert output, y) in a float64 model of it puts the worst row at 1.03x to 1.5x the
// overall error (hidden 128 to 7168, top-k 1 to 8, up to 1000 rows, overall 2.4e-3 to 2.9e-3; GPU runs
// in bench/results show 3e-3 to 4.2e-3 overall): twice the overall tolerance leaves a correct row
// room, while a row with a wrong expert or a missing slot is off by 0.1 to 1.
inline constexpr double kRowToleranceFactor = 2.0;
// FP8 weights: 3x. The kernel quantises h (1x128, for Linear2) from an fp32 value its FP8 MMAs
// accumulated with limited precision, the reference from a float64 one: where a dominant h element
// sits at a code boundary, or a group's amax at a power of two (UE8M0 scales), a tiny difference moves
// the code or the group's whole scale. With the generator's power-of-two magnitudes one such row
// (H 256, I 384) moves by 4.2-4.6% when the reference's own h is perturbed by 1e-3 relative, as the
// kernel's did (4.15%, docs/performance.md#padded-sizes-and-caller-quantised-x). A scale read from the wrong group or block is off
// by 2x or 4x (the magnitudes) across a whole group, far outside.
inline constexpr double kFp8RowToleranceFactor = 3.0;
inline double row_tolerance(double tolerance, WeightFormat format = WeightFormat::kBf16) {
  return (format == WeightFormat::kFp8Block128 ? kFp8RowToleranceFactor : kRowToleranceFactor) * tolerance;
}

// The checked row with the largest per-row error.
struct WorstRow {
  int rank = -1;  // -1: no row checked
  int row = -1;   // the token index on that rank
  double err = 0.0;
};
// This rank's worst: errs[i] is the error of token rows[i]; a NaN error counts as +inf.
WorstRow worst_row(std::span<const double> errs, std::span<const int> rows, int rank);
// The worse of two: the larger error (a checked row over none; a tie keeps `a`).
WorstRow worse(const WorstRow& a, const WorstRow& b);
// Every rank's worst from Communicator::all_gather of (err, row) per rank, rank-major.
WorstRow worst_of_ranks(std::span<const double> gathered);

// Drift of the time per call over a long run: medians of the first and the last `window` calls, where
// window = min(kDriftWindow, calls / 2) (at least 1), and the whole run's median, min and max.
inline constexpr size_t kDriftWindow = 1000;
struct CallTimes {
  size_t calls = 0;
  size_t window = 0;
  double first_median = 0, last_median = 0, median = 0, min = 0, max = 0;  // ms
};
// All zero for no calls.
CallTimes call_time_stats(std::span<const double> ms);

// ---- device resources ----

// A device array of T (uninitialised), freed on destruction: the library's owner of device memory.
using detail::DeviceArray;

// This rank's experts [rank*E/R, (rank+1)*E/R) on the current device, generated from `seed`. With
// cfg.weight_format = kFp8Block128 also their FP8 quantisation (quantize_expert_weights, the
// reference's) in the FP8 fields of view(); the bf16 weights stay (the GEMM-alone timing reads them).
class RankWeights {
 public:
  RankWeights(const LayerConfig& cfg, int world_size, int rank, uint64_t seed, cudaStream_t stream);
  ExpertWeights view() const;
  uint64_t seed() const { return seed_; }
  // Bytes the layer reads: bf16 weights, or FP8 codes and scales.
  size_t bytes() const {
    return fp8_ ? w13_fp8_.bytes() + w2_fp8_.bytes() + w13_scales_.bytes() + w2_scales_.bytes()
                : w13_.bytes() + w2_.bytes();
  }

 private:
  uint64_t seed_;
  bool fp8_ = false;
  size_t scale_bytes_ = sizeof(float);
  DeviceArray<bf16> w13_, w2_;
  DeviceArray<uint8_t> w13_fp8_, w2_fp8_, w13_scales_, w2_scales_;
};

// One rank's inputs for one forward call: the host copy (for the reference) and a device copy.
class InputSet {
 public:
  // caller_fp8_x (FP8 configs): x also quantised here, per token per 128 channels with cfg's scale
  // format (common/fp8.h, the arithmetic the reference applies to x), and batch() hands the layer
  // those codes and scales with x = null (TokenBatch::x_fp8).
  InputSet(const LayerConfig& cfg, int world_size, int rank, int num_tokens, Routing routing,
           uint64_t seed, cudaStream_t stream, bool caller_fp8_x = false);
  const HostTokens& host() const { return host_; }
  TokenBatch batch() const;
  int num_tokens() const { return host_.num_tokens; }
  // Stream-ordered: `other`'s inputs (same token count and x format) into this set's device buffers,
  // which keep their addresses (a CUDA graph captured on them replays with the new inputs); the host
  // copy becomes other's. Throws Error(kInvalidArgument) when the sizes differ.
  void overwrite_with(const InputSet& other, cudaStream_t stream);
  uint64_t seed() const { return seed_; }

 private:
  HostTokens host_;
  uint64_t seed_;
  DeviceArray<bf16> x_;
  DeviceArray<int32_t> topk_idx_;
  DeviceArray<float> topk_weights_;
  DeviceArray<uint8_t> x_fp8_;    // caller_fp8_x only
  DeviceArray<float> x_scales_;
};

// The outcome of one verified forward. The `max_`/`total_` fields, worst_row and `passed` are the
// same on every rank (all-reduced); the others are this rank's.
struct Verdict {
  int num_tokens = 0;          // this rank's T
  int rows_checked = 0;        // rows compared with the reference on this rank
  double rel_err = 0.0;        // this rank's relative Frobenius error on the checked rows
  double row_err = 0.0;        // this rank's largest per-row error (row_errors; +inf for NaN)
  int64_t unwritten = 0;       // this rank's poisoned/NaN elements of y, over all T rows
  double max_rel_err = 0.0;    // over ranks (+inf if any rank's is NaN)
  WorstRow worst_row;          // over ranks: the row with the largest per-row error
  int64_t total_unwritten = 0; // over ranks
  bool passed = false;         // within_tolerance(*this, tolerance)
  double output_norm = 0.0;    // ||y||_F of this rank's checked rows (a cheap fingerprint)
  double forward_ms = 0.0;     // this rank's forward alone (cudaEvents), without poison and checks
};

// Both bounds hold (max_rel_err <= tolerance, worst_row.err <= row_tolerance(tolerance, format)) and
// total_unwritten == 0.
bool within_tolerance(const Verdict& v, double tolerance, WeightFormat format = WeightFormat::kBf16);

// Collective: poison y (y_bytes of 0xFF: bf16 NaN), `launch` (a forward of `layer` on `in` into y on
// `stream`, or a replay of a graph that holds one), check_errors, copy y back, count unwritten elements
// over all rows, compare `rows` (sample_rows) with reference_forward of the experts generated from
// `weight_seed` (overall and per row), all-reduce the verdict. `reference_threads` as in
// reference_forward (0: all cores).
Verdict verify_forward(Communicator& comm, MoeLayer& layer, const LayerConfig& cfg, uint64_t weight_seed, bf16* y,
                       size_t y_bytes, cudaStream_t stream, const InputSet& in, std::span<const int> rows,
                       double tolerance, int reference_threads, const std::function<void()>& launch);

// A stream of the communicator's device, destroyed with its scope.
class OwnedStream {
 public:
  explicit OwnedStream(int device) {
    EPFUSE_CUDA_CHECK(cudaSetDevice(device));
    EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~OwnedStream() { (void)cudaStreamDestroy(stream_); }  // destructor: nothing to report an error to
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

// A rank's layer with its weights, stream and output buffer, created collectively.
class RankJob {
 public:
  // Collective. Uses comm's device; weights from `weight_seed`; y sized for cfg.max_tokens_per_rank.
  RankJob(Communicator& comm, const LayerConfig& cfg, Impl impl, uint64_t weight_seed);
  ~RankJob();
  RankJob(const RankJob&) = delete;
  RankJob& operator=(const RankJob&) = delete;

  // An input set for this rank (routing and seed as the caller chose, e.g. call_seed(seed, i)).
  InputSet make_inputs(int num_tokens, Routing routing, uint64_t seed, bool caller_fp8_x = false) const;

  // Collective: the layer's forward on this job's stream into y (no synchronisation). In the one-GPU
  // mode a host barrier first (see LoopbackWorld in epfuse/communicator.h).
  void forward(const InputSet& in);
  // Collective: poison y (0xFF bytes: bf16 NaN), forward, check_errors, copy y back, count unwritten
  // elements over all rows, compare `rows` (sample_rows) with reference_forward (overall and per
  // row), all-reduce the verdict. `reference_threads` as in reference_forward (0: all cores).
  Verdict verified_forward(const InputSet& in, std::span<const int> rows, double tolerance,
                           int reference_threads = 0);
  // The same with `launch` in place of forward(in), e.g. the replay of a graph captured on `in`'s
  // buffers and output().
  Verdict verified_launch(const InputSet& in, std::span<const int> rows, double tolerance, int reference_threads,
                          const std::function<void()>& launch);

  MoeLayer& layer() { return *layer_; }
  Communicator& comm() { return comm_; }
  const LayerConfig& config() const { return cfg_; }
  const RankWeights& weights() const { return *weights_; }
  cudaStream_t stream() const { return stream_; }
  bf16* output() const { return y_.get(); }

 private:
  Communicator& comm_;
  LayerConfig cfg_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<RankWeights> weights_;
  std::unique_ptr<MoeLayer> layer_;
  DeviceArray<bf16> y_;
};

// A CUDA graph of what `capture` enqueues on `stream` (a thread-local capture: in the one-GPU mode the
// other ranks' threads capture at the same time), instantiated and uploaded, `stream` synchronised;
// destroyed with its scope. In the one-GPU mode instantiating may wait for the device: every rank must
// be past it (a barrier) before any launches a graph whose kernels wait for peers.
class CapturedGraph {
 public:
  CapturedGraph(cudaStream_t stream, const std::function<void()>& capture);
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch();  // on the stream it was captured on

 private:
  void release();
  cudaStream_t stream_;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

// Runs `body(i)` n times on `stream`, each between two cudaEvents, and returns each iteration's
// milliseconds. `before(i)`, if given, runs on the host ahead of each iteration outside the timed
// region (e.g. Communicator::barrier so that ranks start together). Synchronises at the end.
std::vector<double> time_iterations(cudaStream_t stream, int n, const std::function<void(int)>& body,
                                    const std::function<void(int)>& before = {});

}  // namespace epfuse::tools
