// Owning handles for device and pinned host memory: freed in the destructor, which never throws.
#pragma once
#include <cstddef>
#include <cstdio>
#include <utility>

#include <cuda_runtime.h>

#include "common/check.h"

namespace epfuse::unfused {

template <bool kPinnedHost>
class CudaMemory {
 public:
  CudaMemory() = default;
  explicit CudaMemory(size_t bytes) : bytes_(bytes) {
    if (bytes == 0) return;
    if constexpr (kPinnedHost)
      EPFUSE_CUDA_CHECK(cudaMallocHost(&ptr_, bytes));
    else
      EPFUSE_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  CudaMemory(CudaMemory&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  CudaMemory& operator=(CudaMemory&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  CudaMemory(const CudaMemory&) = delete;
  CudaMemory& operator=(const CudaMemory&) = delete;
  ~CudaMemory() { release(); }

  template <typename T = void>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (ptr_ == nullptr) return;
    const cudaError_t err = kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    if (err != cudaSuccess) std::fprintf(stderr, "epfuse: freeing %zu bytes failed: %s\n", bytes_, cudaGetErrorString(err));
    ptr_ = nullptr;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using DeviceMemory = CudaMemory<false>;
using PinnedMemory = CudaMemory<true>;

}  // namespace epfuse::unfused
