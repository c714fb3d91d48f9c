// The symmetric window as the fused kernel reaches it (ncclGetLocalPointer, device/kernel/transport.cuh)
// against the allocation the host zeroes at creation (SymmetricBuffer::local): they must name the same
// memory, or the kernel would start on flags and counters the zeroing never reached and read combine
// slots no tile had written, without an error. Checked at every workspace's creation.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

namespace epfuse::fused {

// Where one probe of the window found its two views apart.
struct WindowViewMismatch {
  int64_t offset = -1;       // -1: every probe agreed
  uintptr_t device_view = 0; // ncclGetLocalPointer(window, offset)
  uintptr_t allocation = 0;  // local + offset
};

// Probes kWindowViewProbes offsets spread over [0, bytes): a word written through each view is read
// through the other, then both are zeroed again. Synchronous (stream, then its sync); for creation.
inline constexpr int kWindowViewProbes = 128;
WindowViewMismatch first_window_view_mismatch(ncclWindow_t window, void* local, size_t bytes, cudaStream_t stream);
// The error's text: which offset of the window's `bytes`, and both addresses.
std::string describe(const WindowViewMismatch& m, size_t bytes);

}  // namespace epfuse::fused
