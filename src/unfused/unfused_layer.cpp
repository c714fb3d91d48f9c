// The unfused chain, host side: one forward enqueues everything on the caller's stream and waits on
// the host once, for the counts matrix (the sizes of the token exchange and the GEMMs' m values).
#include "unfused/unfused_layer.h"

#include <array>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <limits>
#include <mutex>
#include <string>

#include <cublasLt.h>
#include <cublas_v2.h>

#include "common/check.h"
#include "common/device_buffer.h"
#include "common/fault.h"
#include "common/fp8.h"
#include "common/overlap.h"
#include "epfuse/error.h"
#include "unfused/all_to_all.h"
#include "unfused/counts.h"
#include "unfused/fp8_gemm.h"
#include "unfused/fp8_kernels.h"
#include "unfused/fp8_layout.h"
#include "unfused/gemm_path.h"
#include "unfused/grouped_gemm.h"
#include "unfused/kernels.h"
#include "unfused/plan.h"
#include "weights/fp8_weights.h"

namespace epfuse::unfused {
namespace {

// Events at the phase boundaries of a forward.
enum Mark { kStart, kDispatched, kComputed, kCombined, kMarks };

class UnfusedLayer final : public MoeLayer {
 public:
  UnfusedLayer(const detail::CheckedConfig& cfg, Communicator& comm, const ExpertWeights& weights);
  ~UnfusedLayer() override;

  void forward(const TokenBatch& in, bf16* y, cudaStream_t stream) override;
  // Bounded (Communicator::wait_bounded): past the communicator's collective timeout it aborts it.
  void check_errors(cudaStream_t stream) override { comm_obj_.wait_bounded(stream, "unfused check_errors"); }
  void set_phase_timing(bool enabled) override { timing_ = enabled; }
  std::optional<PhaseTimes> last_phase_times() override;

  Impl impl() const override { return Impl::kUnfused; }
  const LayerConfig& config() const override { return cfg_; }
  MemoryFootprint memory() const override;

 private:
  HostInputError check_inputs(const TokenBatch& in, const bf16* y) const;
  void init_fp8(const ExpertWeights& weights);
  void run_fp8_experts(int records, cudaStream_t stream);
  void mark(Mark m, cudaStream_t stream) {
    if (timing_) EPFUSE_CUDA_CHECK(cudaEventRecord(events_[m], stream));
  }

  int32_t* send_counts() const { return reinterpret_cast<int32_t*>(counts_.as<uint8_t>() + plan_.send_counts_offset); }
  int32_t* recv_counts() const { return reinterpret_cast<int32_t*>(counts_.as<uint8_t>() + plan_.recv_counts_offset); }
  int32_t* expert_fill() const { return reinterpret_cast<int32_t*>(counts_.as<uint8_t>() + plan_.expert_fill_offset); }
  unsigned long long* error_key() const {
    return reinterpret_cast<unsigned long long*>(counts_.as<uint8_t>() + plan_.error_key_offset);
  }

  LayerConfig cfg_;
  Communicator& comm_obj_;
  ncclComm_t comm_;
  int rank_;
  ExpertWeights weights_;
  UnfusedPlan plan_;
  ChainShape shape_;

  detail::DeviceBuffer send_, recv_, rows_, inter_, row_weight_, token_rows_, send_slot_, counts_, cublas_workspace_;
  detail::PinnedBuffer host_counts_;  // send then receive counts matrix, read once per forward
  std::vector<int64_t> counts_items_;  // one counts row per peer
  Traffic traffic_;
  cublasHandle_t cublas_ = nullptr;
  GroupedGemm gemm_up_, gemm_down_;  // one each: their pointer staging must not be shared in a forward
  std::optional<GemmPath> forced_gemm_path_;  // EPFUSE_UNFUSED_GEMM, read once at creation
  // Fault injection (common/fault.h): set only on the rank EPFUSE_FAULT names.
  std::optional<detail::Fault> fault_;
  detail::DeviceBuffer fault_ids_;  // bad_ids: the corrupted copy of topk_idx
  int64_t calls_ = 0;               // forwards so far

  // FP8 weights (weight_format = kFp8Block128), set up by init_fp8. The chain dispatches the bf16
  // tokens as the bf16 chain does and quantises the permuted expert rows (each a copy of its token, so
  // the codes and scales are those of quantising x at home: the reference's); sending FP8 + scales
  // instead would halve the dispatch bytes, which the fused kernel's FP8 dispatch is for, while this
  // chain is the baseline of the FP8 expert GEMMs with the record protocol unchanged.
  bool fp8_ = false;
  bool inter_fp32_ = false;  // Linear1 writes fp32 into inter_ (re-allocated twice as large), else bf16
  cublasLtHandle_t lt_ = nullptr;
  Fp8Gemm gemm_fp8_;
  detail::DeviceBuffer w13_scales_, w2_scales_;  // the layer's copies, in cuBLASLt's block layout
  // The FP8 GEMMs run on each expert's rows padded to a multiple of 16 (fp8_layout.h): their inputs
  // and outputs (x and h quantised, inter_, and Linear2's output in rows_) are in the padded layout,
  // sized for fp8_row_capacity_ rows; the permute's rows_ and row_weight_ stay in the real layout.
  int64_t fp8_row_capacity_ = 0;
  detail::DeviceBuffer x_codes_, x_scales_;      // expert rows quantised: Linear1's input
  detail::DeviceBuffer h_codes_, h_scales_;      // h quantised: Linear2's input
  detail::DeviceBuffer row_map_;                 // Fp8RowMap arrays, uploaded per forward
  detail::PinnedBuffer row_map_host_;
  cudaEvent_t row_map_uploaded_ = nullptr;

  // Recorded at the end of every forward; the next one waits for it on its own stream, so calls on
  // different streams never overlap on the shared buffers.
  cudaEvent_t finished_ = nullptr;
  bool timing_ = false;
  bool timed_ = false;  // the last forward recorded its events
  std::mutex forward_mutex_;
  std::array<cudaEvent_t, kMarks> events_{};
};

UnfusedLayer::UnfusedLayer(const detail::CheckedConfig& checked, Communicator& comm, const ExpertWeights& weights)
    : cfg_(checked.config()),
      comm_obj_(comm),
      comm_(comm.nccl()),
      rank_(comm.rank()),
      weights_(weights),
      plan_(plan_unfused(checked)),
      send_(plan_.send_bytes),
      recv_(plan_.recv_bytes),
      rows_(plan_.rows_bytes),
      inter_(plan_.inter_bytes),
      row_weight_(plan_.row_weight_bytes),
      token_rows_(plan_.token_rows_bytes),
      send_slot_(plan_.send_slot_bytes),
      counts_(plan_.counts_bytes),
      cublas_workspace_(kCublasWorkspaceBytes),
      host_counts_(plan_.recv_counts_offset * 2),
      counts_items_(comm.world_size(), 1),
      gemm_up_(plan_.experts_per_rank),
      gemm_down_(plan_.experts_per_rank),
      forced_gemm_path_(gemm_path_override_from_env()) {
  const LayerConfig& cfg = cfg_;
  shape_.hidden = cfg.hidden;
  shape_.intermediate = cfg.intermediate;
  shape_.topk = cfg.topk;
  shape_.num_experts = cfg.num_experts;
  shape_.experts_per_rank = plan_.experts_per_rank;
  shape_.world_size = plan_.world_size;
  shape_.counts_words = plan_.counts_words;
  shape_.record_bytes = plan_.record_bytes;
  int device = 0;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&shape_.sm_count, cudaDevAttrMultiProcessorCount, device));

  EPFUSE_CUBLAS_CHECK(cublasCreate(&cublas_));
  try {
    EPFUSE_CUBLAS_CHECK(cublasSetWorkspace(cublas_, cublas_workspace_.as(), cublas_workspace_.bytes()));
    for (cudaEvent_t& event : events_) EPFUSE_CUDA_CHECK(cudaEventCreate(&event));
    EPFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&finished_, cudaEventDisableTiming));
    if (cfg.weight_format == WeightFormat::kFp8Block128) init_fp8(weights);
    // kind=hang stops a fused kernel (fault.h): the chain has none of its own to stop.
    if (std::optional<detail::Fault> f = detail::fault_from_env();
        f && f->rank == rank_ && f->kind != detail::FaultKind::kHang) {
      if (f->kind == detail::FaultKind::kFailCreate)
        throw Error(ErrorCode::kCuda, "rank " + std::to_string(rank_) +
                                          ": EPFUSE_FAULT: fail_create: the unfused layer's allocation failed (injected)");
      fault_ = f;
      if (f->kind == detail::FaultKind::kBadIds)
        fault_ids_ = detail::DeviceBuffer(static_cast<size_t>(cfg.max_tokens_per_rank) * cfg.topk * sizeof(int32_t));
    }
  } catch (...) {
    if (row_map_uploaded_ != nullptr) cudaEventDestroy(row_map_uploaded_);
    if (lt_ != nullptr) cublasLtDestroy(lt_);
    if (finished_ != nullptr) cudaEventDestroy(finished_);
    for (cudaEvent_t event : events_)
      if (event != nullptr) cudaEventDestroy(event);
    cublasDestroy(cublas_);
    throw;
  }
}

UnfusedLayer::~UnfusedLayer() {
  // The buffers are freed after this: let the last forward finish with them first.
  if (finished_ != nullptr) {
    if (cudaEventSynchronize(finished_) != cudaSuccess) std::fprintf(stderr, "epfuse: last unfused forward failed\n");
    cudaEventDestroy(finished_);
  }
  for (cudaEvent_t event : events_)
    if (event != nullptr) cudaEventDestroy(event);
  if (cublas_ != nullptr && cublasDestroy(cublas_) != CUBLAS_STATUS_SUCCESS)
    std::fprintf(stderr, "epfuse: cublasDestroy failed\n");
  if (row_map_uploaded_ != nullptr) {
    if (cudaEventSynchronize(row_map_uploaded_) != cudaSuccess)
      std::fprintf(stderr, "epfuse: unfused FP8 row map upload failed\n");
    cudaEventDestroy(row_map_uploaded_);
  }
  if (lt_ != nullptr && cublasLtDestroy(lt_) != CUBLAS_STATUS_SUCCESS)
    std::fprintf(stderr, "epfuse: cublasLtDestroy failed\n");
}

// Checks the FP8 fields (types.h), reads the scales once (validating every one) and keeps them in the
// layout cuBLASLt reads (fp8_layout.h); sizes the quantised activations for the plan's row bound.
void UnfusedLayer::init_fp8(const ExpertWeights& weights) {
  const std::string who = "rank " + std::to_string(rank_) + ": MoeLayer::create: ";
  const int local = plan_.experts_per_rank, H = cfg_.hidden, I = cfg_.intermediate;
  if (const std::string problem = weights::check_fp8_weight_pointers(cfg_, local, weights); !problem.empty())
    throw Error(ErrorCode::kInvalidArgument, who + problem);
  fp8_ = true;
  const auto convert = [&](const void* device, int64_t count, int matrices, int rows, int k, const char* name) {
    const std::vector<float> blocked =
        weights::read_block_scales(device, count, cfg_.scale_format, matrices, rows, k, name, who).blocked;
    detail::DeviceBuffer out(blocked.size() * sizeof(float));
    detail::copy_to_device_now(out.as(), blocked.data(), out.bytes());
    return out;
  };
  // w13: per expert 2 * ceil(I/128) block rows, the gate's then the up's (named so in messages).
  w13_scales_ = convert(weights.w13_scales, weights.w13_scales_count, local, fp8::w13_scale_rows(I), H, "w13_scales");
  w2_scales_ = convert(weights.w2_scales, weights.w2_scales_count, local, fp8::num_blocks(H), I, "w2_scales");
  // Padded rows (fp8_layout.h): each non-empty expert adds at most 15 rows. The row map is int32.
  const int64_t rows = fp8_layout::padded_row_capacity(plan_.max_expert_rows, local);
  if (rows > std::numeric_limits<int32_t>::max())
    throw Error(ErrorCode::kUnsupported, who + "the FP8 unfused chain's padded expert rows (" + std::to_string(rows) +
                                             ") exceed int32");
  fp8_row_capacity_ = rows;
  x_codes_ = detail::DeviceBuffer(static_cast<size_t>(rows) * H);
  h_codes_ = detail::DeviceBuffer(static_cast<size_t>(rows) * I);
  // Scale regions [ceil(k/128), padded rows] packed: act_scale_start(rows, k) floats in all.
  x_scales_ = detail::DeviceBuffer(static_cast<size_t>(fp8_layout::act_scale_start(rows, H)) * sizeof(float));
  h_scales_ = detail::DeviceBuffer(static_cast<size_t>(fp8_layout::act_scale_start(rows, I)) * sizeof(float));
  // rows_: the permute's real rows, then Linear2's output in the padded layout (pre-reduce reads it
  // through padded token rows).
  rows_ = detail::DeviceBuffer();
  rows_ = detail::DeviceBuffer(static_cast<size_t>(rows) * H * sizeof(bf16));
  const size_t map_bytes = 2 * (static_cast<size_t>(local) + 1) * sizeof(int32_t);
  row_map_ = detail::DeviceBuffer(map_bytes);
  row_map_host_ = detail::PinnedBuffer(map_bytes);
  EPFUSE_CUBLAS_CHECK(cublasLtCreate(&lt_));
  EPFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&row_map_uploaded_, cudaEventDisableTiming));

  // Linear1 writes fp32 where cuBLASLt can: gate and up then reach SwiGLU and h's 1x128 quantisation
  // as fp32 sums (as the float64 reference's and the fused kernel's accumulators), not rounded to bf16
  // first, which would move about 2% of h's codes by one e4m3 step and cost ~1e-2 of relative error.
  // inter_ in the padded layout: [rows, 2I].
  const size_t inter_elements = static_cast<size_t>(rows) * 2 * I;
  inter_ = detail::DeviceBuffer();  // the plan's bf16 buffer: freed before the fp32 one is made
  inter_ = detail::DeviceBuffer(inter_elements * sizeof(float));
  const Fp8GemmArgs probe{.rows = {}, .n = I % fp8::kBlock == 0 ? 2 * I : I, .k = H, .a = x_codes_.as<uint8_t>(),
                          .lda = H, .a_scales = x_scales_.as<float>(), .w = weights.w13_fp8, .w_expert_stride = 0,
                          .w_scales = w13_scales_.as<float>(),
                          .w_scale_expert_stride = 0, .c = inter_.as(), .ldc = 2 * int64_t{I},
                          .c_type = CUDA_R_32F};
  inter_fp32_ = gemm_fp8_.has_algorithm(lt_, probe, 128, cublas_workspace_.bytes());
  if (!inter_fp32_) {
    std::fprintf(stderr, "epfuse: rank %d: cuBLASLt has no block-scaled FP8 GEMM with fp32 output here: the FP8 "
                         "unfused chain writes Linear1 in bf16 (h's codes then differ more from the reference's)\n",
                 rank_);
    inter_ = detail::DeviceBuffer();
    inter_ = detail::DeviceBuffer(inter_elements * sizeof(bf16));
  }
}

// Linear1, SwiGLU and Linear2 on FP8: rows_ (bf16, permuted) -> rows_ (bf16, Linear2's output in the
// padded layout), and token_rows_ -> the padded rows, for the combine's pre-reduce.
void UnfusedLayer::run_fp8_experts(int records, cudaStream_t stream) {
  const int local = plan_.experts_per_rank, H = cfg_.hidden, I = cfg_.intermediate;
  const std::span<const int> rows(traffic_.expert_rows);
  // Row map: each expert's first real row, then its first padded row (fp8_layout.h).
  EPFUSE_CUDA_CHECK(cudaEventSynchronize(row_map_uploaded_));  // the previous forward's upload left
  auto* host_first = row_map_host_.as<int32_t>();
  int32_t* host_padded = host_first + local + 1;
  fp8_layout::fill_row_map(rows.data(), local, host_first, host_padded);
  const int64_t total = host_padded[local];  // padded rows: what the quantise kernels cover
  EPFUSE_REQUIRE(host_first[local] == traffic_.total_rows && total <= fp8_row_capacity_, ErrorCode::kInternal,
                 "rank " + std::to_string(rank_) + ": FP8 expert rows " + std::to_string(host_first[local]) +
                     " (padded " + std::to_string(total) + ") exceed the buffers (" +
                     std::to_string(fp8_row_capacity_) + " padded rows)");
  EPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(row_map_.as(), row_map_host_.as(), row_map_.bytes(), cudaMemcpyHostToDevice, stream));
  EPFUSE_CUDA_CHECK(cudaEventRecord(row_map_uploaded_, stream));
  const auto* dev_first = row_map_.as<int32_t>();
  const Fp8RowMap map{.expert_first = dev_first, .padded_first = dev_first + local + 1, .experts = local};

  launch_quantize_rows(rows_.as<bf16>(), total, H, cfg_.scale_format, map, x_codes_.as<uint8_t>(),
                       x_scales_.as<float>(), shape_.sm_count, stream);
  // Linear1. Gate and up are blocked apart (config.h); when I % 128 == 0 their blocks tile 2I rows
  // exactly, so one GEMM of n = 2I covers both; otherwise the up half starts inside a 128-row block
  // and each half is a GEMM of its own, writing its columns of inter_.
  const int i_blocks = fp8::num_blocks(I);
  const int64_t w13_scale_stride = int64_t{2} * i_blocks * fp8_layout::padded_k_blocks(H);
  Fp8GemmArgs up{.rows = rows, .n = 2 * I, .k = H, .a = x_codes_.as<uint8_t>(), .lda = H,
                 .a_scales = x_scales_.as<float>(), .w = weights_.w13_fp8,
                 .w_expert_stride = int64_t{2} * I * H, .w_scales = w13_scales_.as<float>(),
                 .w_scale_expert_stride = w13_scale_stride, .c = inter_.as(), .ldc = 2 * int64_t{I},
                 .c_type = inter_fp32_ ? CUDA_R_32F : CUDA_R_16BF};
  if (I % fp8::kBlock == 0) {
    gemm_fp8_.run(lt_, up, cublas_workspace_.as(), cublas_workspace_.bytes(), stream);
  } else {
    up.n = I;  // gate
    gemm_fp8_.run(lt_, up, cublas_workspace_.as(), cublas_workspace_.bytes(), stream);
    up.w += int64_t{I} * H;  // up: its rows, its block rows, its columns
    up.w_scales += int64_t{i_blocks} * fp8_layout::padded_k_blocks(H);
    up.c = static_cast<uint8_t*>(up.c) + int64_t{I} * (inter_fp32_ ? sizeof(float) : sizeof(bf16));
    gemm_fp8_.run(lt_, up, cublas_workspace_.as(), cublas_workspace_.bytes(), stream);
  }
  launch_swiglu_quantize(inter_.as(), inter_fp32_, row_weight_.as<float>(), total, I, cfg_.swiglu_clamp,
                         cfg_.scale_format, map, h_codes_.as<uint8_t>(), h_scales_.as<float>(), shape_.sm_count,
                         stream);
  gemm_fp8_.run(lt_,
                {.rows = rows, .n = H, .k = I, .a = h_codes_.as<uint8_t>(), .lda = I,
                 .a_scales = h_scales_.as<float>(), .w = weights_.w2_fp8,
                 .w_expert_stride = int64_t{H} * I, .w_scales = w2_scales_.as<float>(),
                 .w_scale_expert_stride = fp8_layout::weight_scale_floats(H, I), .c = rows_.as<bf16>(), .ldc = H},
                cublas_workspace_.as(), cublas_workspace_.bytes(), stream);
  // The combine reads Linear2's real rows only: their padded places.
  launch_pad_token_rows(token_rows_.as<int32_t>(), int64_t{records} * cfg_.topk, map, shape_.sm_count, stream);
}

MemoryFootprint UnfusedLayer::memory() const {
  return {.symmetric_bytes = 0,
          .private_bytes = plan_.total_bytes - plan_.inter_bytes + inter_.bytes() - plan_.rows_bytes + rows_.bytes() +
                           kCublasWorkspaceBytes +
                           gemm_up_.device_bytes() +
                           gemm_down_.device_bytes() + w13_scales_.bytes() + w2_scales_.bytes() + x_codes_.bytes() +
                           x_scales_.bytes() + h_codes_.bytes() + h_scales_.bytes() + row_map_.bytes()};
}

HostInputError UnfusedLayer::check_inputs(const TokenBatch& in, const bf16* y) const {
  if (in.num_tokens < 0 || in.num_tokens > cfg_.max_tokens_per_rank)
    return {InputError::kTokenCount, 0, in.num_tokens};
  if (in.x_fp8 != nullptr || in.x_scales != nullptr) return {InputError::kCallerFp8X, in.num_tokens, 0};
  if (in.num_tokens == 0) return {};
  const int32_t null_mask = (in.x == nullptr ? NullPointer::kX : 0) |
                            (in.topk_idx == nullptr ? NullPointer::kTopkIdx : 0) |
                            (in.topk_weights == nullptr ? NullPointer::kTopkWeights : 0) |
                            (y == nullptr ? NullPointer::kOutput : 0);
  if (null_mask != 0) return {InputError::kNullPointer, in.num_tokens, null_mask};
  // The pack and home-reduce kernels move x and y rows as 16-byte vectors (vec.cuh).
  const int32_t misaligned_mask = (reinterpret_cast<uintptr_t>(in.x) % 16 != 0 ? NullPointer::kX : 0) |
                                  (reinterpret_cast<uintptr_t>(y) % 16 != 0 ? NullPointer::kOutput : 0);
  if (misaligned_mask != 0) return {InputError::kMisaligned, in.num_tokens, misaligned_mask};
  // y is written (home reduce) while x and the routing are still read: no input may share its bytes.
  const size_t T = static_cast<size_t>(in.num_tokens), H = static_cast<size_t>(cfg_.hidden),
               K = static_cast<size_t>(cfg_.topk);
  const detail::ByteRange out{"y", y, T * H * sizeof(bf16)};
  const int32_t aliased_mask =
      (detail::overlaps(out, {"x", in.x, T * H * sizeof(bf16)}) ? NullPointer::kX : 0) |
      (detail::overlaps(out, {"topk_idx", in.topk_idx, T * K * sizeof(int32_t)}) ? NullPointer::kTopkIdx : 0) |
      (detail::overlaps(out, {"topk_weights", in.topk_weights, T * K * sizeof(float)}) ? NullPointer::kTopkWeights : 0);
  if (aliased_mask != 0) return {InputError::kAliased, in.num_tokens, aliased_mask};
  return {};
}

// Waits (issue 14: each bounded or documented). NCCL collectives have no timeout of their own: a
// peer that never calls forward, or died, holds them until the NCCL communicator is aborted.
//  - host, the counts synchronisation below: bounded by the communicator's collective timeout
//    (EPFUSE_COLLECTIVE_TIMEOUT_MS, default 300 s; Communicator::wait_bounded): past it the
//    communicator is aborted (which ends this rank's NCCL kernels) and the forward throws
//    Error(kTimeout) "rank R: unfused forward: the counts all-to-all timed out ...", with its y NaN
//    (filled on the stream after the abort has ended its NCCL kernels). It also covers
//    this stream's earlier work, hence the generous bound;
//  - host, check_errors: bounded the same way;
//  - host, ncclGroupEnd of an all-to-all: may block for the first exchange with a peer (NCCL sets up
//    connections lazily, together with the peer); NOT bounded by epfuse (NCCL's own connection
//    timeouts apply). After the first forward the connections exist and it only enqueues;
//  - device: the record and combine all-to-alls wait in NCCL kernels for every peer; such a wait
//    surfaces on the host in the bounded waits above (this forward's check_errors, the next
//    forward's counts synchronisation) and otherwise in last_phase_times and the destructor
//    (cudaEventSynchronize of finished_), which are NOT bounded: after an error from a peer call
//    Communicator::abort first (as `epfuse run` does), then destroy the layer. A rank that fails
//    after the counts exchange (peers already inside the all-to-alls) aborts its communicator itself
//    (forward below), so it never waits there, and its peers' next bounded wait ends theirs;
//  - GroupedGemm::run_grouped waits for its previous pointer upload, which is ordered before this
//    forward's counts synchronisation, so it never waits beyond that.
// Input errors (host checks, bad expert ids) travel in the counts, so every rank throws and none waits.
// Faults (EPFUSE_FAULT, common/fault.h) act before the counts exchange: a rank that skips, stalls past
// the collective timeout, throws or exits leaves its peers in the counts synchronisation, which ends
// within the collective timeout (kTimeout, the communicator aborted: later forwards throw kAborted);
// NCCL cannot tell them which rank is missing. bad_ids fails every rank in the same call.
void UnfusedLayer::forward(const TokenBatch& caller, bf16* y, cudaStream_t stream) {
  // One host thread at a time (README "Threads and streams"): its NCCL calls, host members and
  // buffers are the layer's.
  std::lock_guard<std::mutex> lock(forward_mutex_);
  // After an abort (a timed-out collective, or Communicator::abort) the NCCL communicator is gone:
  // refuse before any NCCL call, which would fail as a corrupted communicator (kNccl).
  comm_obj_.require_not_aborted("unfused forward");
  timed_ = false;
  const int64_t call = calls_++;
  const bool fault = fault_ && fault_->fires(rank_, call);
  if (fault && detail::act_on_fault(*fault_, rank_, call, 2 * comm_obj_.collective_timeout(), "the counts exchange"))
    return;
  TokenBatch in = caller;
  // A rank with bad input still takes part in the counts exchange (with no tokens) and reports the
  // error there, so that no peer waits for rows that never come.
  const HostInputError host_error = check_inputs(in, y);
  const int tokens = host_error.code == InputError::kNone ? in.num_tokens : 0;
  const int world = plan_.world_size, words = plan_.counts_words;

  // ---- dispatch -----------------------------------------------------------------------------------
  EPFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, finished_, 0));
  if (fault && fault_->kind == detail::FaultKind::kBadIds && tokens > 0) {
    detail::copy_ids_with_bad_first(fault_ids_.as<int32_t>(), in.topk_idx, static_cast<size_t>(tokens) * cfg_.topk,
                                    stream);
    in.topk_idx = fault_ids_.as<int32_t>();
  }
  mark(kStart, stream);
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(counts_.as(), 0, plan_.counts_bytes, stream));
  launch_layout(shape_, in.topk_idx, tokens, send_counts(), send_slot_.as<int32_t>(), error_key(), stream);
  launch_pack(shape_, in.x, in.topk_idx, in.topk_weights, tokens, send_counts(), send_slot_.as<int32_t>(),
              error_key(), host_error, send_.as<uint8_t>(), stream);
  all_to_all(comm_, send_counts(), counts_items_, recv_counts(), counts_items_, int64_t{words} * sizeof(int32_t),
             stream);
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(host_counts_.as(), counts_.as(), host_counts_.bytes(), cudaMemcpyDeviceToHost,
                                    stream));
  // A call that fails before any row moves finishes none of them: a rank whose own arguments were valid
  // leaves its y NaN (bf16 0xFFFF), as a failed fused call does.
  const auto poison_y = [&] {
    if (host_error.code != InputError::kNone || tokens == 0) return cudaSuccess;
    return cudaMemsetAsync(y, 0xff, static_cast<size_t>(tokens) * cfg_.hidden * sizeof(bf16), stream);
  };
  // The forward's one host synchronisation, bounded (see the waits above).
  try {
    comm_obj_.wait_bounded(stream, "unfused forward: the counts all-to-all");
  } catch (const Error& e) {
    // Timed out: the communicator is aborted, which ends this stream's NCCL kernels, so the fill runs
    // after them. The timeout is what the caller hears; a fill that cannot be queued changes nothing.
    if (e.code() == ErrorCode::kTimeout && poison_y() != cudaSuccess) (void)cudaGetLastError();
    throw;
  }

  const int32_t* host_send = host_counts_.as<int32_t>();
  const int32_t* host_recv = host_send + world * words;
  if (const auto message = first_input_error(host_recv, world, words, cfg_)) {
    // On every rank alike, before any row moves.
    EPFUSE_CUDA_CHECK(poison_y());
    throw Error(ErrorCode::kInvalidArgument, *message);
  }
  // From here every peer is inside this call's record and combine all-to-alls. A rank that fails now
  // (kInternal, a CUDA error) would leave them waiting on the device for rows that never come, and its
  // own next collective out of step with theirs: it aborts the communicator instead (an owned one with
  // ncclCommAbort), so its later calls throw kAborted at once; the peers see the failure at their next
  // bounded wait (check_errors, the next forward's counts), within the collective timeout.
  try {
    read_traffic(host_send, host_recv, world, words, plan_.experts_per_rank, traffic_);
    EPFUSE_REQUIRE(traffic_.total_send <= plan_.max_send_records && traffic_.total_recv <= plan_.max_recv_records &&
                       traffic_.total_rows <= plan_.max_expert_rows,
                   ErrorCode::kInternal,
                   "rank " + std::to_string(rank_) + ": unfused traffic exceeds the plan: send " +
                       std::to_string(traffic_.total_send) + ", receive " + std::to_string(traffic_.total_recv) +
                       ", expert rows " + std::to_string(traffic_.total_rows));
    all_to_all(comm_, send_.as(), traffic_.send_records, recv_.as(), traffic_.recv_records, plan_.record_bytes,
               stream);
    mark(kDispatched, stream);

    // ---- experts --------------------------------------------------------------------------------------
    const int records = static_cast<int>(traffic_.total_recv);
    launch_permute(shape_, recv_.as<uint8_t>(), records, recv_counts(), expert_fill(), rows_.as<bf16>(),
                   row_weight_.as<float>(), token_rows_.as<int32_t>(), stream);
    const int64_t inter_ld = 2 * int64_t{cfg_.intermediate};
    const GemmPath gemm_path = select_gemm_path(forced_gemm_path_, traffic_.expert_rows);
    if (fp8_) {
      run_fp8_experts(records, stream);
    } else {
      gemm_up_.run(cublas_,
                   {.rows = traffic_.expert_rows, .n = 2 * cfg_.intermediate, .k = cfg_.hidden, .a = rows_.as<bf16>(),
                    .lda = cfg_.hidden, .w = weights_.w13, .w_expert_stride = inter_ld * cfg_.hidden,
                    .c = inter_.as<bf16>(), .ldc = inter_ld},
                   gemm_path, stream);
      launch_swiglu(shape_, inter_.as<bf16>(), row_weight_.as<float>(), traffic_.total_rows, cfg_.swiglu_clamp, stream);
      gemm_down_.run(cublas_,
                     {.rows = traffic_.expert_rows, .n = cfg_.hidden, .k = cfg_.intermediate, .a = inter_.as<bf16>(),
                      .lda = inter_ld, .w = weights_.w2, .w_expert_stride = int64_t{cfg_.hidden} * cfg_.intermediate,
                      .c = rows_.as<bf16>(), .ldc = cfg_.hidden},
                     gemm_path, stream);
    }
    mark(kComputed, stream);

    // ---- combine: the rows go back the way the records came, in the same buffers ----------------------
    launch_pre_reduce(shape_, rows_.as<bf16>(), token_rows_.as<int32_t>(), records, recv_.as<bf16>(), stream);
    all_to_all(comm_, recv_.as(), traffic_.recv_records, send_.as(), traffic_.send_records,
               int64_t{cfg_.hidden} * sizeof(bf16), stream);
    launch_home_reduce(shape_, send_.as<bf16>(), in.topk_idx, send_counts(), send_slot_.as<int32_t>(), tokens, y,
                       stream);
    mark(kCombined, stream);
    EPFUSE_CUDA_CHECK(cudaEventRecord(finished_, stream));
    timed_ = timing_;
  } catch (const std::exception& e) {
    comm_obj_.abort(std::string("unfused forward failed after the counts exchange: ") + e.what());
    throw;
  }
}

std::optional<PhaseTimes> UnfusedLayer::last_phase_times() {
  if (!timed_) return std::nullopt;
  EPFUSE_CUDA_CHECK(cudaEventSynchronize(events_[kCombined]));
  PhaseTimes t;
  EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&t.dispatch_ms, events_[kStart], events_[kDispatched]));
  EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&t.experts_ms, events_[kDispatched], events_[kComputed]));
  EPFUSE_CUDA_CHECK(cudaEventElapsedTime(&t.combine_ms, events_[kComputed], events_[kCombined]));
  return t;
}

}  // namespace

std::unique_ptr<MoeLayer> make_unfused_layer(const detail::CheckedConfig& cfg, Communicator& comm,
                                             const ExpertWeights& weights) {
  // Its all-to-alls are NCCL collectives, and NCCL cannot put two ranks on one GPU.
  if (comm.transport() != Transport::kNccl)
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(comm.rank()) +
                                             ": the unfused implementation is unsupported in one-GPU mode (its "
                                             "all-to-alls are NCCL collectives, which need one GPU per rank)");
  return std::make_unique<UnfusedLayer>(cfg, comm, weights);
}

}  // namespace epfuse::unfused
