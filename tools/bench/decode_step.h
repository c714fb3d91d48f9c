// The multi-layer decode step of `epfuse bench --layers L` (bench/README.md "The decode step"): its pure
// parts, unit-tested on the CPU. The GPU side is decode_run.h.
//
// A step runs L MoE layers on one workspace, each with its own routing and weights, each layer's output
// RMS-normalised into the next layer's input, as a model's decode step runs its MoE layers. A model's
// per-GPU weights of all its layers do not fit one GPU with the bench's generated weights beside them
// (dsv3's FP8 experts of one rank at world 4 are ~2.8 GB a layer), so the step holds S <= L distinct
// weight sets, as many as fit a memory budget, and layer i runs set i % S. Any S >= 2 with a set larger
// than L2 (50 MB on H200) already keeps a layer from finding its weights in L2.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace epfuse::bench {

// The fraction of the GPU's memory the weight sets leave free (the layers' scale copies, NCCL, the
// CUDA context and allocator slack grow after the sets are counted).
inline constexpr double kStepKeepFreeFraction = 0.10;

// How many distinct weight sets of `set_bytes` each fit: into `free_bytes` less `keep_free_fraction` of
// `total_bytes` and less `reserve_bytes` (memory still to be taken after the sets, e.g. scratch for the
// FP8 quantisation), at most `layers` and at most `cap` (cap <= 0: no cap), at least 1 (a step needs one
// set; its allocation then says whether even that fits).
int weight_sets_that_fit(size_t free_bytes, size_t total_bytes, size_t set_bytes, size_t reserve_bytes,
                         double keep_free_fraction, int layers, int cap);

// The weight seed of set s: set 0 is `seed` itself, the weights of the single layer the same row times, so
// the step's layer 0 is that layer; the others are unrelated seeds.
uint64_t weight_set_seed(uint64_t seed, int set);

// The input seed (routing, and x for layer 0) of layer `layer` in replay `replay` (0: the timed replays'
// inputs, 1: the verified replay's new inputs). Unrelated to the single layer's input sets.
uint64_t step_input_seed(uint64_t seed, int replay, int layer);

// The layers whose MoE output the verified replay compares with the float64 reference: every layer when
// check <= 0 or check >= layers, else `check` layers spread evenly, the first and the last included.
std::vector<int> checked_layers(int layers, int check);

// The RMS-normalisation between layers, x = y / sqrt(mean(y^2) + eps) per row (no learned scale), as
// the bench's kernel computes it (decode_run.h) and the float64 reference checks it.
inline constexpr double kRmsNormEps = 1e-6;
// Rows of H values of y (row-major) normalised in float64. Throws Error(kInvalidArgument) when the size
// is not a multiple of H (or H is 0).
std::vector<double> rms_norm_reference(std::span<const double> y, size_t H, double eps = kRmsNormEps);

}  // namespace epfuse::bench
