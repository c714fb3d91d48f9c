// Internal: the one owner of CUDA memory. DeviceBuffer (device bytes), PinnedBuffer (page-locked host
// bytes) and DeviceArray<T> (a count of T on a DeviceBuffer). Allocation failures throw
// epfuse::Error(kCuda) with CUDA's message; destructors never throw: a failed free goes to stderr.
// A buffer frees on whichever device is current: a caller that switches devices frees it (assigns
// an empty buffer) inside its DeviceGuard's scope.
#pragma once
#include <cstddef>
#include <cstdio>
#include <utility>

#include <cuda_runtime.h>

#include "common/check.h"

namespace epfuse::detail {

enum class MemoryKind { kDevice, kPinnedHost };

// Zero bytes allocate nothing: as() is then null.
template <MemoryKind kKind>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    if constexpr (kKind == MemoryKind::kPinnedHost)
      EPFUSE_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
    else
      EPFUSE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  CudaBuffer(CudaBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { release(); }

  template <typename T = void>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (ptr_ == nullptr) return;
    const cudaError_t err = kKind == MemoryKind::kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    if (err != cudaSuccess)
      std::fprintf(stderr, "epfuse: freeing %zu bytes failed: %s\n", bytes_, cudaGetErrorString(err));
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceBuffer = CudaBuffer<MemoryKind::kDevice>;
using PinnedBuffer = CudaBuffer<MemoryKind::kPinnedHost>;

// `count` uninitialised T on the current device.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t count) : buffer_(count * sizeof(T)) {}

  T* get() const { return buffer_.as<T>(); }
  size_t size() const { return buffer_.bytes() / sizeof(T); }
  size_t bytes() const { return buffer_.bytes(); }

 private:
  DeviceBuffer buffer_;
};

}  // namespace epfuse::detail
