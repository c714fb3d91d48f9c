// epfuse/communicator.h: one process per GPU, NCCL underneath, symmetric windows for the kernels.
//
// Lifetime: SymmetricBuffer and DeviceComm refer to their Communicator's ncclComm_t and must be
// destroyed before it (declare them after the Communicator, or reset them first).
#pragma once
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include <nccl.h>

struct ncclDevComm;  // nccl_device/core.h; include <nccl_device.h> where kernels use it

namespace epfuse {

// The torchrun convention: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct BootstrapOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{120000};  // for fetching the NCCL id from rank 0

  // Reads the environment; throws Error(kBootstrap) naming a missing or malformed variable.
  static BootstrapOptions from_env();
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
  void reset();  // deregisters and frees now

 private:
  friend class Communicator;
  ncclComm_t comm_ = nullptr;
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

  const ncclDevComm& get() const { return *dev_; }
  int lsa_barrier_count() const { return lsa_barrier_count_; }
  void reset();

 private:
  friend class Communicator;
  ncclComm_t comm_ = nullptr;
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
  ~Communicator();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  ncclComm_t nccl() const { return comm_; }

  // Collective: every rank calls with the same size.
  SymmetricBuffer alloc_symmetric(size_t bytes);
  // Collective: an ncclDevComm with this many LSA barriers (one per CTA that synchronises).
  DeviceComm create_device_comm(int lsa_barrier_count);
  // Collective: returns when every rank has called it (an NCCL all-reduce, then a stream sync).
  void barrier();

 private:
  Communicator() = default;
  ncclComm_t comm_ = nullptr;
  bool owned_ = false;
  int rank_ = 0;
  int world_size_ = 1;
  int device_ = 0;
};

}  // namespace epfuse
