// What the FP8 layer tests share (tests/gpu/fused/test_gpu_fused_fp8.cpp, tests/gpu/unfused/
// test_gpu_unfused_fp8.cpp): their shape, a check that also reports how far the layer is from the FP8
// and the bf16 references, and the cases every FP8 layer runs.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "epfuse/epfuse.h"
#include "layer_rank.h"
#include "multiprocess.h"

namespace epfuse::testing {

// H = 256 (2 blocks), I = 384 (3 blocks; w13 has 6 block rows), 16 experts, top-4, 128 tokens per rank.
LayerConfig fp8_layer_config(ScaleFormat scales = ScaleFormat::kFp32, float clamp = 0.0f);

class Fp8LayerRank : public LayerRank {
 public:
  Fp8LayerRank(Impl impl, const LayerConfig& cfg) : LayerRank(impl, cfg), impl_(impl), cfg_(cfg) {}

  // What a check saw: output, FP8 reference, per-row errors, and whether the check added a failure.
  struct Checked {
    std::vector<double> got;
    std::vector<double> want;
    std::vector<double> row_errors;
    bool failed = false;
  };
  // The forward against the FP8 reference (LayerRank's bounds), printing the overall and worst-row
  // errors and the error against the bf16 reference (the format's own, for information). nullopt when
  // the forward threw (a test failure) or there were no tokens.
  std::optional<Checked> check(const HostTokens& in, const std::string& what);

 private:
  Impl impl_;
  LayerConfig cfg_;
};

// The cases every FP8 layer runs; Rank(const LayerConfig&) with check(in, what).
// Both scale formats, every routing, T in {0, 1, 7, 128}, then uneven counts across ranks.
template <class Rank>
void check_every_routing_and_token_count() {
  for (ScaleFormat scales : {ScaleFormat::kFp32, ScaleFormat::kUe8m0}) {
    Rank r(fp8_layer_config(scales));
    uint64_t seed = 300;
    for (Routing routing :
         {Routing::kUniform, Routing::kSkewed, Routing::kOneExpert, Routing::kDropped, Routing::kOneRank})
      for (int count : {0, 1, 7, 128})
        r.check(r.tokens(count, routing, seed++), std::string(to_string(routing)) + " T=" + std::to_string(count));
    // Uneven counts across ranks, from a shared seed.
    for (int call = 0; call < 2; ++call, ++seed) {
      const int count = make_token_counts(r.world(), 128, seed)[r.rank()];
      r.check(r.tokens(count, Routing::kUniform, seed), "uneven T=" + std::to_string(count));
    }
  }
}

template <class Rank>
void check_clamp() {
  Rank r(fp8_layer_config(ScaleFormat::kFp32, 0.05f));
  r.check(r.tokens(64, Routing::kUniform, 11), "clamp 0.05");
}

// A model-like width (dsv3's I = 2048 is too slow for the reference here): H = 1024 (8 x groups, 4
// Linear2 n-blocks of the fused tile), I = 512 (4 blocks), 8 experts, top-2.
template <class Rank>
void check_wider_layer() {
  LayerConfig cfg = fp8_layer_config();
  cfg.hidden = 1024;
  cfg.intermediate = 512;
  cfg.num_experts = 8;
  cfg.topk = 2;
  Rank r(cfg);
  r.check(r.tokens(128, Routing::kUniform, 21), "H=1024 I=512 T=128");
  r.check(r.tokens(7, Routing::kSkewed, 22), "H=1024 I=512 T=7");
}

}  // namespace epfuse::testing
