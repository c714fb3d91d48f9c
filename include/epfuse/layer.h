// epfuse/layer.h: the MoE layer forward, one object per rank.
#pragma once
#include <cstddef>
#include <memory>
#include <optional>
#include <string_view>

#include <cuda_runtime.h>

#include "epfuse/config.h"
#include "epfuse/types.h"

namespace epfuse {

class Communicator;
class Workspace;

enum class Impl {
  kUnfused,  // layout, NCCL all-to-all, permute, cuBLAS grouped GEMMs, SwiGLU, all-to-all, reduce
  kFused,    // one persistent kernel per GPU
};
std::string_view to_string(Impl impl);
std::optional<Impl> parse_impl(std::string_view name);

// Device memory a layer holds, per GPU, as a function of its config.
struct MemoryFootprint {
  size_t symmetric_bytes = 0;  // NCCL symmetric windows (reachable by peers)
  size_t private_bytes = 0;    // ordinary device memory
};

// Device time of one forward's phases, from CUDA events on its stream.
struct PhaseTimes {
  float dispatch_ms = 0;  // routing layout, counts exchange (and the host's wait for it), token exchange
  float experts_ms = 0;   // expert computation on the received tokens
  float combine_ms = 0;   // returning the expert outputs and reducing them into y
};

class MoeLayer {
 public:
  // Collective: every rank creates its layer with the same config. The weights are borrowed and
  // must outlive the layer. Throws Error(kInvalidConfig / kUnsupported) for configs it cannot run.
  // Failure-safe: every rank agrees that every step succeeded before the next collective, so when
  // one rank's creation fails (an allocation, a bad EPFUSE_TIMEOUT_MS) that rank throws its error
  // and every other rank throws Error(kAborted) naming it and its message; none waits for it.
  // Recovery after an error from a forward: kTimeout / kInvalidArgument / kAborted mean the layer (its
  // workspace) is unusable; re-create it (collective) if every rank is alive, or when a peer may be
  // dead call Communicator::abort first, after which destroying layers and the communicator is local.
  static std::unique_ptr<MoeLayer> create(Impl impl, const LayerConfig& cfg, Communicator& comm,
                                          const ExpertWeights& weights);
  // Collective: the fused layer on a shared workspace (epfuse/workspace.h), which must outlive it.
  // Throws Error(kInvalidConfig) when cfg does not fit the workspace (the message names the field).
  // The create above makes a workspace of cfg's size for the layer alone.
  static std::unique_ptr<MoeLayer> create(const LayerConfig& cfg, Workspace& workspace, const ExpertWeights& weights);
  virtual ~MoeLayer() = default;

  // Collective: y[in.num_tokens, hidden] (device, bf16) on `stream`. Validates what is cheap on the
  // host (token count, pointers; y must not overlap x, x_fp8, x_scales, topk_idx or topk_weights).
  // Errors found on the device (expert id out of range, a peer that never arrives) are recorded and
  // thrown by the next check_errors().
  // A host-side argument error (bad token count, null, misaligned or aliased pointer) throws
  // Error(kInvalidArgument) on this rank; its peers learn of it in the same call (fused: from their
  // check_errors(), unfused: from their forward) and fail with kInvalidArgument naming it.
  // The fused layer still takes part in the call (with no tokens) so that no peer waits, which leaves
  // the workspace mid-call: the workspace, and so EVERY layer on it, is then failed. Every later
  // forward on it throws Error(kInternal, "rank R: the fused layer's workspace is unusable after an
  // earlier error (<that error>); re-create it") without launching, as after a device error reported
  // by check_errors(). The caller must destroy the layers and the workspace and create them again
  // (collective: every rank does it). The unfused chain throws kInvalidArgument on every rank before
  // any row moves (a rank whose own arguments were valid leaves its y NaN); a forward whose counts
  // all-to-all timed out (a peer that never called) throws Error(kTimeout) with its y NaN too (filled
  // on `stream` once the abort has ended its NCCL kernels). A layer of padded sizes
  // behaves as the layer it wraps. After Communicator::abort (or a collective that timed out and
  // aborted it) every forward throws Error(kAborted, "rank R: <fused|unfused> forward: the
  // communicator was aborted; ...") before launching anything.
  // Threads: forwards on one workspace (or one unfused layer) from several host threads take turns;
  // the rules for streams, graphs and ranks are in README "Threads and streams".
  virtual void forward(const TokenBatch& in, bf16* y, cudaStream_t stream) = 0;
  // Synchronises `stream` and throws Error with what the device recorded since the last check.
  virtual void check_errors(cudaStream_t stream) = 0;

  // Optional phase timing (off by default, no cost when off): events around the phases of every
  // forward. Implementations without it ignore the call and report nullopt.
  virtual void set_phase_timing(bool enabled) { (void)enabled; }
  // The phases of the last forward run with timing on (waits for its events); nullopt if none.
  virtual std::optional<PhaseTimes> last_phase_times() { return std::nullopt; }

  virtual Impl impl() const = 0;
  virtual const LayerConfig& config() const = 0;
  virtual MemoryFootprint memory() const = 0;
};

}  // namespace epfuse
