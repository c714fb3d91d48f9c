#include "bench/gemm_alone.h"

#include <numeric>

#include "bench/ceilings.h"
#include "common/check.h"
#include "common/job.h"
#include "unfused/grouped_gemm.h"

namespace epfuse::bench {

std::vector<double> time_grouped_gemms(const LayerConfig& cfg, const ExpertWeights& weights,
                                       std::span<const int> rows, int warmup, int iters, cudaStream_t stream) {
  const int64_t h = cfg.hidden, i2 = 2 * int64_t{cfg.intermediate}, inter = cfg.intermediate;
  const size_t total = std::accumulate(rows.begin(), rows.end(), size_t{0});
  // Inputs random (zeros would flatter); the W2 input is random too rather than the SwiGLU of the
  // W13 output: the GEMM's speed does not depend on where its operand came from.
  tools::DeviceArray<bf16> x(std::max<size_t>(total * h, 1)), gate_up(std::max<size_t>(total * i2, 1)),
      act(std::max<size_t>(total * inter, 1)), out(std::max<size_t>(total * h, 1));
  fill_random(x.get(), total * h, 21, stream);
  fill_random(act.get(), total * inter, 22, stream);

  cublasHandle_t handle = nullptr;
  EPFUSE_CUBLAS_CHECK(cublasCreate(&handle));
  struct Destroy {
    cublasHandle_t h;
    ~Destroy() { (void)cublasDestroy(h); }
  } destroy{handle};
  unfused::GroupedGemm w13_gemm(static_cast<int>(rows.size())), w2_gemm(static_cast<int>(rows.size()));
  const unfused::GroupedGemmArgs w13{rows, static_cast<int>(i2), static_cast<int>(h), x.get(), h, weights.w13,
                                     i2 * h, gate_up.get(), i2};
  const unfused::GroupedGemmArgs w2{rows, static_cast<int>(h), static_cast<int>(inter), act.get(), inter,
                                    weights.w2, h * inter, out.get(), h};
  auto body = [&](int) {
    w13_gemm.run(handle, w13, stream);
    w2_gemm.run(handle, w2, stream);
  };
  tools::time_iterations(stream, warmup, body);
  return tools::time_iterations(stream, iters, body);
}

}  // namespace epfuse::bench
