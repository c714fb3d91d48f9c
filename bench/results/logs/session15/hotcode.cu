// Microbenchmark: n CTAs (one per SM) run the same 32 KB of straight-line code for the first time at
// the same moment (and again): does the instruction fetch of many SMs for the same lines queue?
// Variants: straight-line code, and code that jumps every 8 instructions (a chain of small blocks).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

template <int N>
__device__ __noinline__ float straight(float a) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("fma.rn.f32 %0, %0, %0, %0;" : "+f"(a));
  return a;
}
// Blocks of 8 FMAs, each ending in a jump over a 1-KB gap of never-executed code.
template <int N>
__device__ __noinline__ float jumpy(float a, int never) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) asm volatile("fma.rn.f32 %0, %0, %0, %0;" : "+f"(a));
    if (never == 12345 + i) {
#pragma unroll
      for (int j = 0; j < 64; ++j) asm volatile("fma.rn.f32 %0, %0, %0, %0;" : "+f"(a));
    }
  }
  return a;
}

__global__ void kern(uint64_t start, int variant, int never, uint64_t* out) {
  float a = threadIdx.x;
  while (gt() < start) {}
  __syncthreads();
  const uint64_t t0 = gt();
  a = variant == 0 ? straight<2048>(a) : jumpy<256>(a, never);
  __syncthreads();
  const uint64_t t1 = gt();
  a = variant == 0 ? straight<2048>(a) : jumpy<256>(a, never);
  __syncthreads();
  const uint64_t t2 = gt();
  if (threadIdx.x == 0) { out[2 * blockIdx.x] = t1 - t0; out[2 * blockIdx.x + 1] = t2 - t1; }
  if (a == 1.2345f) out[1000] = 1;
}
__global__ void now(uint64_t* t) { *t = gt(); }
// Evicts L2 (and any code there) by streaming a large buffer.
__global__ void flush(const int4* b, size_t n, int* sink) {
  int acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) acc ^= __ldcs(b + i).x;
  if (acc == 0x7654321) *sink = acc;
}

int main() {
  uint64_t* out; int4* buf; int* sink;
  const size_t bytes = size_t(1) << 30;
  CK(cudaMalloc(&out, 8192 * 8)); CK(cudaMalloc(&buf, bytes)); CK(cudaMalloc(&sink, 4)); CK(cudaMemset(buf, 1, bytes));
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  for (int variant = 0; variant < 2; ++variant)
    for (int ctas : {1, 8, 33, 66, 132}) {
      if (ctas > sms) continue;
      std::vector<double> first, again;
      for (int rep = 0; rep < 3; ++rep) {
        flush<<<sms * 4, 256>>>(buf, bytes / 16, sink);
        now<<<1, 1>>>(out + 4000);
        uint64_t t; CK(cudaMemcpy(&t, out + 4000, 8, cudaMemcpyDeviceToHost));
        kern<<<ctas, 256>>>(t + 200000, variant, 0, out);  // start 200 us from now, all together
        CK(cudaGetLastError()); CK(cudaDeviceSynchronize());
        std::vector<uint64_t> h(2 * ctas); CK(cudaMemcpy(h.data(), out, h.size() * 8, cudaMemcpyDeviceToHost));
        for (int b = 0; b < ctas; ++b) first.push_back(h[2 * b] / 1e3), again.push_back(h[2 * b + 1] / 1e3);
      }
      std::sort(first.begin(), first.end()); std::sort(again.begin(), again.end());
      printf("%-8s code, %3d CTAs at once: first pass median %6.2f us max %6.2f; again median %6.2f\n",
             variant ? "jumpy" : "straight", ctas, first[first.size() / 2], first.back(), again[again.size() / 2]);
    }
  return 0;
}
