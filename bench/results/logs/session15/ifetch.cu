// Microbenchmark: the cost of an SM's first execution of straight-line code (instruction fetch),
// quiet memory and with the other SMs streaming HBM. CTA 0 runs a body of N FFMAs twice, stamping
// %globaltimer before and after each pass; CTAs 1.. stream a large buffer when load != 0.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

template <int N>
__device__ __forceinline__ void body(float& a, float& b, float& c, float& d) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(a) : "f"(b), "f"(c));
    asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(d) : "f"(b), "f"(c));
  }
}

template <int N>
__global__ void kern(uint64_t* out, const int4* buf, size_t n_vec, int load, volatile int* stop) {
  if (blockIdx.x == 0) {
    float a = threadIdx.x, b = 1.0f, c = 0.5f, d = 2.0f;
    if (load) { uint64_t t0 = gt(); while (gt() - t0 < 20000) {} }  // let the stream build up (20 us)
    __syncthreads();
    uint64_t t[3];
    for (int pass = 0; pass < 2; ++pass) {
      t[pass] = gt();
      body<N>(a, b, c, d);
      __syncthreads();
    }
    t[2] = gt();
    if (threadIdx.x == 0) { out[0] = t[1] - t[0]; out[1] = t[2] - t[1]; *stop = 1; }
    if (a + d == 12345.0f) out[2] = 1;
    return;
  }
  if (!load) return;
  int4 acc = {0, 0, 0, 0};
  size_t i = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x);
  const size_t step = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (int it = 0; !*stop && it < 64; ++it)
    for (size_t v = i; v < n_vec; v += step * 8) {
      int4 r[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) r[u] = v + u * step < n_vec ? __ldcs(buf + v + u * step) : int4{0, 0, 0, 0};
#pragma unroll
      for (int u = 0; u < 8; ++u) acc.x ^= r[u].x, acc.y ^= r[u].y;
      if (*stop) break;
    }
  if (acc.x == 0x12345 && acc.y == 0x678) out[3] = 1;
}

template <int N>
int run(uint64_t* out, const int4* buf, size_t n_vec, int* stop, int threads) {
  for (int load = 0; load < 2; ++load) {
    std::vector<uint64_t> a, b;
    for (int rep = 0; rep < 5; ++rep) {
      CK(cudaMemset(stop, 0, 4));
      // A fresh module state per rep is not possible; flush L2 by streaming instead.
      kern<N><<<load ? 132 : 1, threads>>>(out, buf, n_vec, load, stop);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      uint64_t h[2];
      CK(cudaMemcpy(h, out, 16, cudaMemcpyDeviceToHost));
      a.push_back(h[0]); b.push_back(h[1]);
    }
    std::sort(a.begin(), a.end()); std::sort(b.begin(), b.end());
    printf("code %6d bytes, %3d threads, %s: pass1 %7.2f us (min %7.2f max %7.2f), pass2 %7.2f us\n", N * 32, threads,
           load ? "131 SMs streaming" : "quiet            ", a[2] / 1e3, a[0] / 1e3, a[4] / 1e3, b[2] / 1e3);
  }
  return 0;
}

int main() {
  uint64_t* out; int4* buf; int* stop;
  const size_t bytes = size_t(4) << 30;
  CK(cudaMalloc(&out, 64)); CK(cudaMalloc(&buf, bytes)); CK(cudaMalloc(&stop, 4));
  CK(cudaMemset(buf, 1, bytes));
  const size_t n_vec = bytes / 16;
  for (int threads : {128, 256}) {
    run<128>(out, buf, n_vec, stop, threads);
    run<512>(out, buf, n_vec, stop, threads);
    run<1024>(out, buf, n_vec, stop, threads);
    run<2048>(out, buf, n_vec, stop, threads);
  }
  return 0;
}
