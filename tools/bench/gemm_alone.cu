#include "bench/gemm_alone.h"

#include <numeric>

#include "bench/ceilings.h"
#include "common/check.h"
#include "common/job.h"
#include "unfused/grouped_gemm.h"

namespace epfuse::bench {

GemmAloneTimes time_expert_gemms(const LayerConfig& cfg, const ExpertWeights& weights, std::span<const int> rows,
                                 int warmup, int iters, cudaStream_t stream) {
  const int64_t h = cfg.hidden, i2 = 2 * int64_t{cfg.intermediate}, inter = cfg.intermediate;
  const size_t total = std::accumulate(rows.begin(), rows.end(), size_t{0});
  // Inputs random (zeros would flatter). The W2 input is read from the W13 output with leading
  // dimension 2I, as in the layer (SwiGLU writes h over the gate half), but filled at random rather
  // than by SwiGLU: the GEMM's speed does not depend on where its operand came from.
  tools::DeviceArray<bf16> x(std::max<size_t>(total * h, 1)), gate_up(std::max<size_t>(total * i2, 1)),
      out(std::max<size_t>(total * h, 1));
  fill_random(x.get(), total * h, 21, stream);
  fill_random(gate_up.get(), total * i2, 22, stream);

  // The layer's workspace: cuBLAS's per-shape kernels may use it. Outlives the handle.
  tools::DeviceArray<uint8_t> workspace(unfused::kCublasWorkspaceBytes);
  cublasHandle_t handle = nullptr;
  EPFUSE_CUBLAS_CHECK(cublasCreate(&handle));
  struct Destroy {
    cublasHandle_t h;
    ~Destroy() { (void)cublasDestroy(h); }
  } destroy{handle};
  EPFUSE_CUBLAS_CHECK(cublasSetWorkspace(handle, workspace.get(), workspace.size()));
  unfused::GroupedGemm w13_gemm(static_cast<int>(rows.size())), w2_gemm(static_cast<int>(rows.size()));
  const unfused::GroupedGemmArgs w13{rows, static_cast<int>(i2), static_cast<int>(h), x.get(), h, weights.w13,
                                     i2 * h, gate_up.get(), i2};
  const unfused::GroupedGemmArgs w2{rows, static_cast<int>(h), static_cast<int>(inter), gate_up.get(), i2,
                                    weights.w2, h * inter, out.get(), h};
  const auto time_path = [&](unfused::GemmPath path) {
    auto body = [&](int) {
      w13_gemm.run(handle, w13, path, stream);
      w2_gemm.run(handle, w2, path, stream);
    };
    tools::time_iterations(stream, warmup, body);
    return tools::time_iterations(stream, iters, body);
  };
  GemmAloneTimes t;
  t.layer_path = unfused::select_gemm_path(unfused::gemm_path_override_from_env(), rows);
  t.grouped_ms = time_path(unfused::GemmPath::kGrouped);
  t.loop_ms = time_path(unfused::GemmPath::kLoop);
  return t;
}

}  // namespace epfuse::bench
