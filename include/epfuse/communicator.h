// epfuse/communicator.h: one process per GPU, NCCL underneath, symmetric windows for the kernels.
//
// Lifetime: SymmetricBuffer and DeviceComm refer to their Communicator's ncclComm_t and must be
// destroyed before it (declare them after the Communicator, or reset them first). Creating and
// destroying them is collective: every rank does it, in the same order.
// Every call selects the communicator's device for its duration and restores the caller's.
// Errors are Error(kNccl / kCuda / kBootstrap / kInvalidArgument) whose message starts "rank R: ".
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <nccl.h>

struct ncclDevComm;  // nccl_device/core.h; include <nccl_device.h> where kernels use it
struct CUstream_st;  // cudaStream_t, without pulling cuda_runtime.h into every user

namespace epfuse {

// The torchrun convention: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct BootstrapOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{120000};  // for fetching the NCCL id from rank 0

  // Reads RANK and WORLD_SIZE (required), LOCAL_RANK (default RANK), MASTER_ADDR (default
  // 127.0.0.1), MASTER_PORT (default 29500) and EPFUSE_BOOTSTRAP_TIMEOUT_MS (default 120000);
  // throws Error(kBootstrap) naming a missing or malformed variable and its value.
  static BootstrapOptions from_env();
  // Throws Error(kBootstrap) naming the first field out of range (by its environment variable).
  void validate() const;
};

// Memory from ncclMemAlloc registered as an NCCL_WIN_COLL_SYMMETRIC window: every rank holds one
// of the same size and kernels reach peers' copies with ncclGetLsaPointer(window(), offset, peer).
class SymmetricBuffer {
 public:
  SymmetricBuffer() = default;
  SymmetricBuffer(SymmetricBuffer&& other) noexcept;
  SymmetricBuffer& operator=(SymmetricBuffer&& other) noexcept;
  SymmetricBuffer(const SymmetricBuffer&) = delete;
  SymmetricBuffer& operator=(const SymmetricBuffer&) = delete;
  ~SymmetricBuffer();

  void* local() const { return ptr_; }
  ncclWindow_t window() const { return window_; }
  size_t bytes() const { return bytes_; }
  // Deregisters and frees now (collective); throws on an NCCL error. The destructor and move
  // assignment do the same but only log errors to stderr.
  void reset();

 private:
  friend class Communicator;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  void* ptr_ = nullptr;
  ncclWindow_t window_ = nullptr;
  size_t bytes_ = 0;
};

// An ncclDevComm (LSA barriers) for kernels; passed to kernels by value via get().
class DeviceComm {
 public:
  DeviceComm() = default;
  DeviceComm(DeviceComm&& other) noexcept;
  DeviceComm& operator=(DeviceComm&& other) noexcept;
  DeviceComm(const DeviceComm&) = delete;
  DeviceComm& operator=(const DeviceComm&) = delete;
  ~DeviceComm();

  // Only on a DeviceComm from Communicator::create_device_comm (not default-constructed or reset).
  const ncclDevComm& get() const { return *dev_; }
  int lsa_barrier_count() const { return lsa_barrier_count_; }
  explicit operator bool() const { return dev_ != nullptr; }
  // ncclDevCommDestroy now (collective); throws on an NCCL error (the destructor only logs).
  void reset();

 private:
  friend class Communicator;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  ncclDevComm* dev_ = nullptr;
  int lsa_barrier_count_ = 0;
};

class Communicator {
 public:
  // Rank 0 creates the ncclUniqueId and serves it over TCP at master_addr:master_port; the others
  // fetch it with retries until opts.timeout. Sets the calling thread's device to local_rank.
  static std::unique_ptr<Communicator> bootstrap(const BootstrapOptions& opts);
  // Wraps a communicator the caller already has (e.g. from the framework); never destroyed here.
  static std::unique_ptr<Communicator> borrow(ncclComm_t comm);

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Owned: ncclCommFinalize + ncclCommDestroy (collective). Borrowed: the comm is left alone.
  // Every SymmetricBuffer and DeviceComm made from it must already be gone. Never throws.
  ~Communicator();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  ncclComm_t nccl() const { return comm_; }

  // Collective: every rank calls with the same size (> 0).
  SymmetricBuffer alloc_symmetric(size_t bytes);
  // Collective: an ncclDevComm with this many LSA barriers (one per CTA that synchronises; >= 0).
  // Never requests NVLink multicast.
  DeviceComm create_device_comm(int lsa_barrier_count);
  // Collective: returns when every rank has called it (an NCCL all-reduce, then a stream sync).
  void barrier();

 private:
  Communicator() = default;
  void init_barrier();  // the stream and word barrier() uses, on device_

  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  int device_ = 0;
  CUstream_st* barrier_stream_ = nullptr;
  int* barrier_word_ = nullptr;  // device memory: the all-reduce operand
};

}  // namespace epfuse
