#include "stale_shared.h"

#include "common/check.h"

namespace epfuse::testing {
namespace {

__global__ void fill_shared_memory_kernel(uint32_t word, int bytes) {
  extern __shared__ uint32_t smem[];
  for (int i = static_cast<int>(threadIdx.x); i < bytes / 4; i += static_cast<int>(blockDim.x)) smem[i] = word;
  __syncthreads();
}

__global__ void count_shared_words_kernel(uint32_t word, int bytes, unsigned long long* differing) {
  extern __shared__ uint32_t smem[];
  unsigned long long mine = 0;
  for (int i = static_cast<int>(threadIdx.x); i < bytes / 4; i += static_cast<int>(blockDim.x))
    mine += *static_cast<volatile uint32_t*>(smem + i) != word ? 1u : 0u;
  atomicAdd(differing, mine);
}

// The fill's launch on the current device: one block per SM, each with the SM's whole shared memory.
struct WholeSms {
  int sms = 0, bytes = 0;
};
WholeSms whole_sms() {
  int device = 0;
  WholeSms w;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&w.sms, cudaDevAttrMultiProcessorCount, device));
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&w.bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return w;
}

}  // namespace

void prepare_shared_memory_fill() {
  const int bytes = whole_sms().bytes;
  for (const void* kernel : {reinterpret_cast<const void*>(fill_shared_memory_kernel),
                             reinterpret_cast<const void*>(count_shared_words_kernel)}) {
    EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    EPFUSE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100));
  }
}

void fill_shared_memory(uint8_t byte, cudaStream_t stream) {
  const auto [sms, bytes] = whole_sms();
  fill_shared_memory_kernel<<<sms, 1024, static_cast<size_t>(bytes), stream>>>(0x01010101u * byte, bytes);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

SharedWords shared_words_not(uint8_t byte, cudaStream_t stream) {
  const auto [sms, bytes] = whole_sms();
  unsigned long long* differing = nullptr;
  EPFUSE_CUDA_CHECK(cudaMallocAsync(&differing, sizeof(*differing), stream));
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(differing, 0, sizeof(*differing), stream));
  count_shared_words_kernel<<<sms, 1024, static_cast<size_t>(bytes), stream>>>(0x01010101u * byte, bytes, differing);
  EPFUSE_CUDA_CHECK_LAUNCH();
  unsigned long long host = 0;
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(&host, differing, sizeof(host), cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaFreeAsync(differing, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return {static_cast<long long>(host), static_cast<long long>(sms) * (bytes / 4)};
}

}  // namespace epfuse::testing
