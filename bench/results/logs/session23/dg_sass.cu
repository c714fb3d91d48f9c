// Session 23: instantiates DeepGEMM's SM90 FP8 1D2D kernel for mixtral's Linear1 configs (dg_sass.sh compiles it).
#include <deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh>
#include <deep_gemm/epilogue/transform.cuh>
using namespace deep_gemm;
static void __instantiate_kernel() {
    auto p1 = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<cute::UMMA::Major::K, 0, 28672, 4096, 2, 128, 192, 128, 128, 128, 128, 4, 128, 256, 2, false, 132, GemmType::MGroupedContiguous, cutlass::bfloat16_t, epilogue::transform::EpilogueIdentity>);
    auto p2 = reinterpret_cast<void*>(&sm90_fp8_gemm_1d2d_impl<cute::UMMA::Major::K, 0, 28672, 4096, 2, 128, 128, 128, 128, 128, 128, 5, 128, 256, 2, true, 132, GemmType::MGroupedContiguous, cutlass::bfloat16_t, epilogue::transform::EpilogueIdentity>);
    (void)p1; (void)p2;
}
