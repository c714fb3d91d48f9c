#include "fused/tensor_map.h"

#include <string>

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include "common/check.h"
#include "epfuse/error.h"

namespace epfuse::fused {
namespace {

// Through the runtime's driver entry point: the library links only cudart, so a machine without a
// driver can still load it (and run the CPU paths).
PFN_cuTensorMapEncodeTiled_v12000 encode_tiled() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult found{};
    EPFUSE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || p == nullptr)
      throw Error(ErrorCode::kCuda, "cuTensorMapEncodeTiled is not available from this driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A 2-D K-major view with a box of one 128-byte swizzle row (kBoxBytes of K) x box_rows rows.
CUtensorMap sw128_tensor_map(CUtensorMapDataType type, int element_bytes, const char* what, const void* base,
                             int64_t rows, int64_t cols, int box_rows) {
  constexpr cuuint32_t kBoxBytes = 128;  // the widest inner box of the 128-byte swizzle
  CUtensorMap map{};
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(cols) * element_bytes};
  const cuuint32_t box[2] = {kBoxBytes / element_bytes, static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, type, 2, const_cast<void*>(base), dims, strides, box, element_strides,
                                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw Error(ErrorCode::kCuda, "cuTensorMapEncodeTiled failed (" + std::to_string(static_cast<int>(r)) +
                                      ") for a [" + std::to_string(rows) + ", " + std::to_string(cols) + "] " +
                                      what + " weight view, box " + std::to_string(box[0]) + " x " +
                                      std::to_string(box_rows));
  return map;
}

}  // namespace

CUtensorMap weight_tensor_map(const __nv_bfloat16* base, int64_t rows, int64_t cols, int box_rows) {
  return sw128_tensor_map(CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, sizeof(__nv_bfloat16), "bf16", base, rows, cols, box_rows);
}

CUtensorMap weight_tensor_map_fp8(const uint8_t* base, int64_t rows, int64_t cols, int box_rows) {
  return sw128_tensor_map(CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, "fp8", base, rows, cols, box_rows);
}

}  // namespace epfuse::fused
