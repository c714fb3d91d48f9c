// Internal: what a Communicator (epfuse/communicator.h) does under its transport. The transport is
// chosen once, when the communicator is made: Communicator::bootstrap and ::borrow make an
// NcclBackend (nccl_backend.cpp), LoopbackWorld::communicator a LoopbackBackend
// (loopback_backend.cpp). Communicator's public methods forward to the backend and never ask which
// transport it is. Also the error helpers the communicator's files share.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <nccl.h>

#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace epfuse::detail {

// One transport's collectives, allocations and aborts. Every method has the contract of the
// Communicator method of the same name (epfuse/communicator.h), errors and their messages included.
class CommBackend {
 public:
  CommBackend() = default;
  CommBackend(const CommBackend&) = delete;
  CommBackend& operator=(const CommBackend&) = delete;
  // Releases what the transport holds; never throws (errors go to stderr).
  virtual ~CommBackend() = default;

  virtual void abort(const std::string& why) noexcept = 0;
  virtual bool aborted() const = 0;
  virtual SymmetricBuffer alloc_symmetric(size_t bytes) = 0;
  virtual DeviceComm create_device_comm(int lsa_barrier_count) = 0;
  virtual void barrier() = 0;
  virtual void wait_bounded(cudaStream_t stream, const char* what) = 0;
  virtual std::vector<double> all_gather(std::span<const double> local) = 0;
  virtual double all_reduce_max(double local) = 0;
  virtual int64_t all_reduce_sum(int64_t local) = 0;
};

// The loopback backend of `rank` (already claimed) in the world `hub` describes.
std::unique_ptr<CommBackend> make_loopback_backend(std::shared_ptr<LoopbackHub> hub, int rank);

// "rank R: ", or "" for a rank not known (< 0): in a multi-process job the rank is the first thing a
// reader of an error needs.
inline std::string rank_prefix(int rank) { return rank >= 0 ? "rank " + std::to_string(rank) + ": " : ""; }

// check.h's macros know neither the rank nor the communicator whose last error explains a failure.
inline void check_nccl(ncclResult_t res, const char* call, int rank) {
  if (res == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);  // the comm argument is unused by NCCL
  throw Error(ErrorCode::kNccl, rank_prefix(rank) + call + " failed: " + ncclGetErrorString(res) + " (" +
                                    (last != nullptr && last[0] != '\0' ? last : "no further detail") + ")");
}

inline void check_cuda(cudaError_t err, const char* call, int rank) {
  if (err == cudaSuccess) return;
  throw Error(ErrorCode::kCuda, rank_prefix(rank) + call + " failed: " + cudaGetErrorString(err) + " (" +
                                    cudaGetErrorName(err) + ")");
}

#define EPFUSE_RANK_NCCL_CHECK(rank, call) ::epfuse::detail::check_nccl((call), #call, (rank))
#define EPFUSE_RANK_CUDA_CHECK(rank, call) ::epfuse::detail::check_cuda((call), #call, (rank))

// Destructors must not throw: the error goes to stderr, where a job's log keeps it.
template <typename F>
void log_errors(const char* what, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epfuse: %s: %s\n", what, e.what());
  }
}

}  // namespace epfuse::detail
