// padding.h copy_resized: one 16-byte vector per thread step, zero where the source has no element.
#include <algorithm>
#include <string>

#include "common/check.h"
#include "epfuse/error.h"
#include "padding/padding.h"

namespace epfuse::padding {
namespace {

constexpr int kVector = 16;
constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    copy_resized_kernel(const uint4* __restrict__ src, int src_rows, int src_vectors, uint4* __restrict__ dst,
                        int dst_rows, int dst_vectors, int64_t total) {
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int c = static_cast<int>(v % dst_vectors);
    const int64_t row = v / dst_vectors;  // batch * dst_rows + r
    const int r = static_cast<int>(row % dst_rows);
    const int64_t b = row / dst_rows;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (r < src_rows && c < src_vectors) value = src[(b * src_rows + r) * src_vectors + c];
    dst[v] = value;
  }
}

}  // namespace

void copy_resized(const void* src, int64_t batches, int src_rows, int src_cols, void* dst, int dst_rows, int dst_cols,
                  int elem_bytes, cudaStream_t stream) {
  const int64_t src_row_bytes = int64_t{src_cols} * elem_bytes, dst_row_bytes = int64_t{dst_cols} * elem_bytes;
  EPFUSE_REQUIRE((elem_bytes == 1 || elem_bytes == 2) && src_row_bytes % kVector == 0 && dst_row_bytes % kVector == 0 &&
                     reinterpret_cast<uintptr_t>(src) % kVector == 0 && reinterpret_cast<uintptr_t>(dst) % kVector == 0,
                 ErrorCode::kInternal,
                 "copy_resized: rows of " + std::to_string(src_cols) + " and " + std::to_string(dst_cols) +
                     " elements of " + std::to_string(elem_bytes) + " bytes, or pointers, not 16-byte aligned");
  const int64_t total = batches * dst_rows * (dst_row_bytes / kVector);
  if (total == 0) return;
  const int64_t blocks = std::min<int64_t>((total + kThreads - 1) / kThreads, 8192);
  copy_resized_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const uint4*>(src), src_rows, static_cast<int>(src_row_bytes / kVector), static_cast<uint4*>(dst),
      dst_rows, static_cast<int>(dst_row_bytes / kVector), total);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

}  // namespace epfuse::padding
