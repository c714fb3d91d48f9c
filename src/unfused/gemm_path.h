// How the unfused chain runs one expert GEMM (grouped_gemm.h): one cuBLAS grouped call over all
// experts, or one cublasGemmEx per non-empty expert. A pure function of the row counts and the shape,
// so the choice is unit-tested on the CPU and the benchmark times exactly what the layer runs.
#pragma once
#include <optional>
#include <span>
#include <string_view>

namespace epfuse::unfused {

enum class GemmPath {
  kGrouped,  // cublasGemmGroupedBatchedEx: every expert's tiles in one launch
  kLoop,     // cublasGemmEx per expert: cuBLAS's per-shape kernel, one launch per expert
};

const char* to_string(GemmPath path) noexcept;

// Mean rows per non-empty expert from which the loop runs (reasoning in docs/performance.md#unfused-chain, "Unfused:
// GEMM path"; `epfuse bench` times both paths per shape to check it). On H200 the grouped call ran
// these shapes at 224-302 TFLOP/s where a per-shape cuBLAS GEMM reaches 600+, so the loop wins once
// an expert's GEMM is compute-bound. With m rows an expert's GEMM does m FLOP per weight byte: far
// under H200's ~200 FLOP/B ridge it is bound by reading its weights, and the grouped call, which
// streams every expert's weights at once, reads them closer to the HBM rate than a sequence of small
// launches does (dsv3 at 16 rows per expert: 1.42 ms grouped against a 1.33 ms weight floor).
// Measured on 4x H200 (bench/results/2026-11-21-h200x4-fused.json, GEMM alone, W13 + W2): 16 rows per
// expert grouped 1.42 / loop 2.02 ms, 32 rows 0.114 / 0.428, 128 rows 3.17 / 2.18, 512 rows 10.6 /
// 4.84. The threshold sits between 32 and 128; at 128 (dsv3 T=1024) ranks with a few rows under the
// mean fell back to grouped and held the layer at 3.6 ms, so it is not at 128 itself.
inline constexpr int kLoopMinMeanRows = 64;

// The heuristic: kLoop when the non-empty experts average at least kLoopMinMeanRows rows, or when
// only one expert has rows (then both paths are one GEMM, and cuBLAS's per-shape choice is the
// better one); kGrouped otherwise (also when no expert has rows: nothing runs either way).
GemmPath choose_gemm_path(std::span<const int> expert_rows);

// The value of EPFUSE_UNFUSED_GEMM (for measurement): "grouped" or "loop" force a path; unset,
// empty or "auto" leave the choice to the heuristic. Throws Error(kInvalidArgument) for anything else.
std::optional<GemmPath> parse_gemm_path_override(const char* value);
// parse_gemm_path_override of EPFUSE_UNFUSED_GEMM (common/env.h).
std::optional<GemmPath> gemm_path_override_from_env();

// What the layer runs: the override when given, else the heuristic.
inline GemmPath select_gemm_path(std::optional<GemmPath> forced, std::span<const int> expert_rows) {
  return forced ? *forced : choose_gemm_path(expert_rows);
}

}  // namespace epfuse::unfused
