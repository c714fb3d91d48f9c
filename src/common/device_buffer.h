// Internal: the one owner of CUDA memory. DeviceBuffer (device bytes), PinnedBuffer (page-locked host
// bytes), DeviceArray<T> (a count of T on a DeviceBuffer), StreamBuffer (stream-ordered device bytes:
// cudaMallocAsync / cudaFreeAsync) and share_device_bytes (device bytes with shared ownership, freed on
// their device by the last owner). Allocation failures throw epfuse::Error(kCuda) with CUDA's message
// (prefixed with the caller's `who`, e.g. "rank 3: ", where one is given); destructors never throw: a
// failed free goes to stderr. A DeviceBuffer frees on whichever device is current: a caller that
// switches devices frees it (assigns an empty buffer) inside its DeviceGuard's scope.
#pragma once
#include <cstddef>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>

#include <cuda_runtime.h>

#include "common/check.h"
#include "common/device_guard.h"
#include "epfuse/error.h"

namespace epfuse::detail {

enum class MemoryKind { kDevice, kPinnedHost };

// Error(kCuda) "<who><call>(<bytes> bytes) failed: <CUDA's message> (<its name>)".
[[noreturn]] inline void throw_allocation(cudaError_t err, const char* call, size_t bytes, const std::string& who) {
  throw Error(ErrorCode::kCuda, who + call + "(" + std::to_string(bytes) + " bytes) failed: " +
                                    cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
}

// Out-of-memory injection for the GPU tests (tests/gpu/fused/test_gpu_faults.cpp): the n-th device or
// pinned allocation the calling thread makes from now on (1: the next) fails as CUDA's out of memory
// would (cudaErrorMemoryAllocation), with nothing allocated; 0 disarms. Allocations of other threads
// do not count. Every allocation of the library counts: CudaBuffer, and the NCCL window's ncclMemAlloc.
void fail_allocation(int n);
// Counts one allocation of the calling thread: true when it is the one to fail (fail_allocation).
bool injected_allocation_failure();

// Host bytes into device memory, there when this returns (and every earlier call on the default
// stream done): cudaMemcpy from pageable memory may return before its DMA has written them (CUDA's "API
// synchronization behavior"), and a kernel on a non-blocking stream is not ordered after the default
// stream. The layers' block scales go this way: their first forward may start right after creation.
void copy_to_device_now(void* device, const void* host, size_t bytes);

// Zero bytes allocate nothing: as() is then null.
template <MemoryKind kKind>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(size_t bytes) : CudaBuffer(bytes, std::string()) {}
  // The same, a failure naming `who` (e.g. "rank 3: ") and the call.
  CudaBuffer(size_t bytes, std::string who) : bytes_(bytes), who_(std::move(who)) {
    if (bytes == 0) return;
    const cudaError_t err = allocate(bytes);
    if (err != cudaSuccess) {
      ptr_ = nullptr;
      bytes_ = 0;
      throw_allocation(err, kKind == MemoryKind::kPinnedHost ? "cudaMallocHost" : "cudaMalloc", bytes, who_);
    }
  }
  CudaBuffer(CudaBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), who_(std::move(other.who_)) {}
  CudaBuffer& operator=(CudaBuffer&& other) noexcept {
    if (this != &other) {
      release();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
      who_ = std::move(other.who_);
    }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { release(); }

  template <typename T = void>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  const std::string& who() const { return who_; }

 private:
  cudaError_t allocate(size_t bytes) {
    if (injected_allocation_failure()) return cudaErrorMemoryAllocation;
    return kKind == MemoryKind::kPinnedHost ? cudaMallocHost(&ptr_, bytes) : cudaMalloc(&ptr_, bytes);
  }
  void release() noexcept {
    if (ptr_ == nullptr) return;
    const cudaError_t err = kKind == MemoryKind::kPinnedHost ? cudaFreeHost(ptr_) : cudaFree(ptr_);
    if (err != cudaSuccess)
      std::fprintf(stderr, "epfuse: %sfreeing %zu bytes failed: %s\n", who_.c_str(), bytes_, cudaGetErrorString(err));
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::string who_;  // what a failure names ("" or e.g. "rank 3: ")
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

// `bytes` of stream-ordered device memory (cudaMallocAsync on `stream`), freed in that stream's order
// (cudaFreeAsync) when the buffer goes, on every path, errors included. Failures name `who`. The
// caller keeps the stream alive and its device current for the buffer's lifetime.
class StreamBuffer {
 public:
  StreamBuffer(size_t bytes, cudaStream_t stream, std::string who) : stream_(stream), who_(std::move(who)) {
    const cudaError_t err = cudaMallocAsync(&ptr_, bytes, stream);
    if (err != cudaSuccess) throw_allocation(err, "cudaMallocAsync", bytes, who_);
    bytes_ = bytes;
  }
  StreamBuffer(const StreamBuffer&) = delete;
  StreamBuffer& operator=(const StreamBuffer&) = delete;
  ~StreamBuffer() {
    const cudaError_t err = cudaFreeAsync(ptr_, stream_);
    if (err != cudaSuccess)
      std::fprintf(stderr, "epfuse: %sfreeing %zu stream-ordered bytes failed: %s\n", who_.c_str(), bytes_,
                   cudaGetErrorString(err));
  }

  template <typename T = void>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  cudaStream_t stream_;
  std::string who_;
};

// `bytes` of device memory on `device` (allocated with `device` current, selected as rank `rank`'s
// DeviceGuard does it: -1 for none; failures name `who`) with
// shared ownership: the last owner frees it with `device` selected, on whichever thread that is, and
// only logs a failure (a failed free, or a failed device switch: the memory is then freed on the
// current device).
inline std::shared_ptr<void> share_device_bytes(size_t bytes, int device, int rank, const std::string& who) {
  std::unique_ptr<DeviceBuffer> owner;
  {
    DeviceGuard guard(device, rank);
    owner = std::make_unique<DeviceBuffer>(bytes, who);
  }
  void* ptr = owner->as();
  return std::shared_ptr<void>(ptr, [owner = std::shared_ptr<DeviceBuffer>(std::move(owner)), device](void*) {
    try {
      DeviceGuard guard(device);
      *owner = DeviceBuffer();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "epfuse: %sfreeing %zu bytes: %s\n", owner->who().c_str(), owner->bytes(), e.what());
    }
  });
}

}  // namespace epfuse::detail
