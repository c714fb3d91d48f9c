#include "bench/ceilings.h"

#include <cublas_v2.h>
#include <nccl.h>
#include <nccl_device.h>

#include <string>
#include <vector>

#include "bench/stats.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/job.h"

namespace epfuse::bench {
namespace {

using tools::DeviceArray;
using tools::time_iterations;

constexpr int kThreads = 512;
constexpr int kWarmup = 3;
constexpr int kReps = 20;
constexpr uint32_t kPushMark = 0xabcd;

__global__ void fill_random_kernel(bf16* data, size_t n, uint64_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    data[i] = __float2bfloat16(detail::uniform_pm1(detail::hash_at(seed, detail::Stream::kX, i)));
}

// Each rank stores its chunk into region [rank * chunk, (rank + 1) * chunk) of every peer's window
// with 16-byte stores, all CTAs sharing the work; LSA barriers before (peers ready) and after
// (stores visible). `tag` changes per launch so the check sees the last launch's data.
__global__ void push_kernel(ncclDevComm dev_comm, ncclWindow_t window, size_t chunk, int rank, int world,
                            uint32_t tag) {
  ncclLsaBarrierSession<ncclCoopCta> barrier(ncclCoopCta(), dev_comm, ncclTeamTagLsa(), blockIdx.x);
  barrier.sync(ncclCoopCta(), cuda::memory_order_relaxed);
  const size_t vectors = chunk / sizeof(uint4);
  for (int p = 1; p < world; ++p) {
    const int peer = (rank + p) % world;
    uint4* dst = static_cast<uint4*>(ncclGetLsaPointer(window, rank * chunk, peer));
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < vectors; i += size_t{gridDim.x} * blockDim.x)
      dst[i] = make_uint4(rank, static_cast<uint32_t>(i), tag, kPushMark);
  }
  barrier.sync(ncclCoopCta(), cuda::memory_order_acq_rel);
}

__global__ void check_push_kernel(const uint4* window, size_t chunk, int rank, int world, uint32_t tag,
                                  unsigned long long* bad) {
  const size_t vectors = chunk / sizeof(uint4);
  for (int src = 0; src < world; ++src) {
    if (src == rank) continue;
    const uint4* region = window + src * vectors;
    for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < vectors; i += size_t{gridDim.x} * blockDim.x) {
      const uint4 v = region[i];
      if (v.x != static_cast<uint32_t>(src) || v.y != static_cast<uint32_t>(i) || v.z != tag || v.w != kPushMark)
        atomicAdd(bad, 1ull);
    }
  }
}

int sm_count() {
  int device = 0, sms = 0;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  EPFUSE_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

double median_ms(cudaStream_t stream, const std::function<void(int)>& body) {
  time_iterations(stream, kWarmup, body);
  const std::vector<double> ms = time_iterations(stream, kReps, body);
  return percentile(ms, 0.5);
}

double gemm_tflops(cudaStream_t stream) {
  constexpr int n = 8192;
  DeviceArray<bf16> a(size_t{n} * n), b(size_t{n} * n), c(size_t{n} * n);
  fill_random(a.get(), a.size(), 11, stream);
  fill_random(b.get(), b.size(), 12, stream);
  cublasHandle_t handle = nullptr;
  EPFUSE_CUBLAS_CHECK(cublasCreate(&handle));
  struct Destroy {
    cublasHandle_t h;
    ~Destroy() { (void)cublasDestroy(h); }
  } destroy{handle};
  EPFUSE_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const float alpha = 1.0f, beta = 0.0f;
  const double ms = median_ms(stream, [&](int) {
    EPFUSE_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.get(), CUDA_R_16BF, n,
                                     b.get(), CUDA_R_16BF, n, &beta, c.get(), CUDA_R_16BF, n,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  });
  return 2.0 * n * n * n / (ms * 1e-3) / 1e12;
}

double hbm_gbps(cudaStream_t stream) {
  constexpr size_t bytes = size_t{1} << 30;
  DeviceArray<bf16> src(bytes / sizeof(bf16)), dst(bytes / sizeof(bf16));
  fill_random(src.get(), src.size(), 13, stream);
  const double ms = median_ms(stream, [&](int) {
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice, stream));
  });
  return 2.0 * bytes / (ms * 1e-3) / 1e9;  // read + write
}

double nvlink_gbps(Communicator& comm, cudaStream_t stream) {
  const int world = comm.world_size(), rank = comm.rank();
  if (world == 1) return 0.0;
  constexpr size_t chunk = size_t{64} << 20;
  const int ctas = sm_count();
  SymmetricBuffer window = comm.alloc_symmetric(chunk * world);
  DeviceComm dev_comm = comm.create_device_comm(ctas);
  uint32_t tag = 0;
  const double ms = median_ms(stream, [&](int) {
    push_kernel<<<ctas, kThreads, 0, stream>>>(dev_comm.get(), window.window(), chunk, rank, world, ++tag);
    EPFUSE_CUDA_CHECK_LAUNCH();
  });
  DeviceArray<unsigned long long> bad(1);
  unsigned long long bad_host = 0;
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(bad.get(), 0, sizeof(unsigned long long), stream));
  check_push_kernel<<<ctas, kThreads, 0, stream>>>(static_cast<const uint4*>(window.local()), chunk, rank, world,
                                                   tag, bad.get());
  EPFUSE_CUDA_CHECK_LAUNCH();
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(&bad_host, bad.get(), sizeof bad_host, cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  EPFUSE_REQUIRE(bad_host == 0, ErrorCode::kInternal,
                 "NVLink ceiling: rank " + std::to_string(rank) + " found " + std::to_string(bad_host) +
                     " wrong 16-byte words from its peers' stores");
  return static_cast<double>(world - 1) * chunk / (ms * 1e-3) / 1e9;
}

}  // namespace

void fill_random(bf16* data, size_t n, uint64_t seed, cudaStream_t stream) {
  if (n == 0) return;
  fill_random_kernel<<<4 * sm_count(), kThreads, 0, stream>>>(data, n, seed);
  EPFUSE_CUDA_CHECK_LAUNCH();
}

Ceilings measure_ceilings(Communicator& comm, cudaStream_t stream) {
  const double mine[3] = {gemm_tflops(stream), hbm_gbps(stream), nvlink_gbps(comm, stream)};
  const std::vector<double> all = comm.all_gather(mine);
  const int world = comm.world_size();
  auto across = [&](int which) {
    std::vector<double> v(world);
    for (int r = 0; r < world; ++r) v[r] = all[r * 3 + which];
    return percentile(v, 0.5);
  };
  return {across(0), across(1), across(2)};
}

}  // namespace epfuse::bench
