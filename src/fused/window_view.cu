#include "fused/window_view.h"

#include <cinttypes>
#include <cstdio>

#include <nccl_device.h>

#include "common/check.h"
#include "common/device_buffer.h"

namespace epfuse::fused {
namespace {

struct Probe {
  int64_t offset;
  uint64_t device_view;
  uint64_t allocation;
  uint32_t agree;
};

// Byte offset of probe i of n over `bytes`: a 4-byte word's, the first at 0 and the last at the window's end.
__host__ __device__ inline size_t probe_offset(int i, int n, size_t bytes) {
  const size_t words = bytes / 4;
  return words <= 1 ? 0 : (static_cast<size_t>(i) * (words - 1) / static_cast<size_t>(n - 1)) * 4;
}

// L2 loads and stores (.cg): the L2 holds lines by physical address, so a word written through one
// virtual address is seen through any other that maps it.
__global__ void probe_window_views(ncclWindow_t window, char* local, size_t bytes, Probe* out) {
  const int i = threadIdx.x;
  if (i >= kWindowViewProbes) return;
  const size_t off = probe_offset(i, kWindowViewProbes, bytes);
  auto* view = static_cast<uint32_t*>(ncclGetLocalPointer(window, off));
  auto* alloc = reinterpret_cast<uint32_t*>(local + off);
  const uint32_t mark = 0x9E3779B9u ^ static_cast<uint32_t>(i);
  __stcg(view, mark);
  __threadfence();
  const bool forth = __ldcg(alloc) == mark;
  __stcg(alloc, ~mark);
  __threadfence();
  const bool back = __ldcg(view) == ~mark;
  __stcg(view, 0u);
  __stcg(alloc, 0u);
  out[i] = Probe{static_cast<int64_t>(off), reinterpret_cast<uint64_t>(view), reinterpret_cast<uint64_t>(alloc),
                 forth && back ? 1u : 0u};
}

}  // namespace

WindowViewMismatch first_window_view_mismatch(ncclWindow_t window, void* local, size_t bytes, cudaStream_t stream) {
  WindowViewMismatch none;
  if (window == nullptr || local == nullptr || bytes < 4) return none;
  detail::DeviceArray<Probe> probes(kWindowViewProbes);
  probe_window_views<<<1, kWindowViewProbes, 0, stream>>>(window, static_cast<char*>(local), bytes, probes.get());
  EPFUSE_CUDA_CHECK(cudaGetLastError());
  Probe host[kWindowViewProbes];
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(host, probes.get(), sizeof(host), cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  for (const Probe& p : host)
    if (!p.agree) return WindowViewMismatch{p.offset, static_cast<uintptr_t>(p.device_view), static_cast<uintptr_t>(p.allocation)};
  return none;
}

std::string describe(const WindowViewMismatch& m, size_t bytes) {
  char text[512];
  std::snprintf(text, sizeof(text),
                "the symmetric window's device view (ncclGetLocalPointer) does not reach the memory of its "
                "allocation: at offset %" PRId64 " of %zu bytes, view 0x%" PRIxPTR ", allocation 0x%" PRIxPTR
                " (the registration is mapped onto other memory; the workspace's zeroing would not reach "
                "the kernel's flags)",
                m.offset, bytes, m.device_view, m.allocation);
  return text;
}

}  // namespace epfuse::fused
