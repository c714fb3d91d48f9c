// The DeepGEMM and MegaMoE peers (../shared/peers/README.md): `epfuse bench --peers DIR` runs
// DIR/scripts/run_deepgemm_peers.sh DIR gemm megamoe (or the --peer-steps given) on this machine after
// the layers and turns its output into rows of the same table and JSON:
//   deepgemm-bf16-gemm, deepgemm-fp8-gemm  DeepGEMM's m-grouped contiguous GEMMs alone (Linear1 +
//       Linear2, no SwiGLU, no communication; deepgemm_gemm_alone.py), bf16 and FP8 (1x128 activation,
//       128x128 weight scales) on one GPU's share of a layer: its line's E / 4 local experts with
//       T * 4 * k / E rows each. A row carries that work as the layer of `world` ranks doing the same
//       per-GPU work: experts = E * world / 4, ranks = world (at world 1: E / 4 experts).
//   megamoe-sm90-fp8  DeepGEMM PR 323's SM90 FP8 MegaMoE kernel alone (its input copies and x's FP8 cast
//       outside), from its fused-only sweep (header: ranks, hidden, ih, experts, topk; a line per T).
//   deepgemm-fp8-gemm-routed  with --peer-steps routed: DeepGEMM's FP8 GEMMs alone on the expert counts a
//       routed batch gives one rank (bench/peers/deepgemm_routed.py, run from this source tree with
//       DIR/deepgemm on PYTHONPATH, after the script's steps have built it), each expert padded to 128
//       rows as the fused layer pads its m-blocks; the case's own shape, experts and world.
// Parsing is pure host code, unit-tested on the CPU.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/options.h"
#include "bench/report.h"

namespace epfuse::bench {

inline constexpr const char* kPeersScript = "scripts/run_deepgemm_peers.sh";
inline constexpr const char* kRoutedScript = "bench/peers/deepgemm_routed.py";  // relative to the source tree

struct PeerOutput {
  std::vector<BenchRow> rows;
  std::vector<std::string> errors;  // lines of the output that mention an error, as printed
};

// The rows in the output of run_deepgemm_peers.sh (any mix of its gemm and megamoe steps; other lines
// are ignored, lines with "error"/"Error" collected). `world` as above.
PeerOutput parse_peer_output(std::string_view text, int world);

// A peer script's shape item, "name,H,I,E,k,T" (torch_ep.py, deepgemm_gemm_alone.py's EXTRA,
// deepgemm_routed.py): case c's, with `experts` in place of its own.
std::string shape_item(const BenchCase& c, int experts);

// The rows in the output of deepgemm_routed.py (its "deepgemm-routed" lines; "world=" absent is 1; other
// lines ignored, lines with "error"/"Error" collected).
PeerOutput parse_routed_output(std::string_view text);

// --shapes for deepgemm_routed.py: each FP8 case's "name,H,I,E,k,T" once (E the world's experts, T a
// rank's tokens), ';'-separated; empty when no case is FP8.
std::string routed_shapes(const std::vector<BenchCase>& cases);

// EXTRA="name,H,I,E,k,T;..." for deepgemm_gemm_alone.py: the cases that its built-in FACTS list lacks,
// as the world-4 shapes it expects (E * 4 / world global experts); cases it cannot express are left out.
std::string gemm_alone_extra_shapes(const std::vector<BenchCase>& cases, int world);

// MEGAMOE_DSV3_BATCHES and MEGAMOE_QWEN3_BATCHES for run_deepgemm_peers.sh: the token counts of the cases
// of MegaMoE's two shapes (dsv3 and qwen3-30b by hidden, intermediate and top-k, whatever the experts), in
// order, each once, space-separated; a shape without cases is left out (the script's own list then).
// Without them a decode sweep's MegaMoE rows came at the script's 128 / 1024 / 4096 tokens, beside none
// of the layer's rows.
std::vector<std::pair<std::string, std::string>> megamoe_batches(const std::vector<BenchCase>& cases);

}  // namespace epfuse::bench
