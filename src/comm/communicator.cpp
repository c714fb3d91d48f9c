// Communicator (epfuse/communicator.h): BootstrapOptions, the SymmetricBuffer and DeviceComm
// handles, and the Communicator's methods, which forward to its transport's backend
// (comm_backend.h): nccl_backend.cpp (with bootstrap() and borrow()) or loopback_backend.cpp (made
// by LoopbackWorld, loopback.cpp).
#include "epfuse/communicator.h"

// nccl_device.h is written for nvcc; under g++ it needs size_t and the CUDA vector types first.
#include <cstddef>
#include <cuda_runtime.h>
#include <nccl_device.h>

#include <cstdint>
#include <optional>
#include <utility>

#include "comm/comm_backend.h"
#include "common/check.h"
#include "common/device_guard.h"
#include "common/env.h"

namespace epfuse {
namespace {

using detail::check_nccl;
using detail::DeviceGuard;
using detail::log_errors;
using detail::rank_prefix;

constexpr long long kMaxWorldSize = 1 << 16;
constexpr size_t kMaxJobIdBytes = 512;     // BootstrapOptions::job_id; the store's job limit leaves room for more
constexpr size_t kMaxSecretBytes = 1024;  // BootstrapOptions::secret; the store's kMaxSecretBytes

int user_rank(ncclComm_t comm) {
  int rank = -1;
  return comm != nullptr && ncclCommUserRank(comm, &rank) == ncclSuccess ? rank : -1;
}

}  // namespace

// --- BootstrapOptions ---

BootstrapOptions BootstrapOptions::from_env() {
  BootstrapOptions opts;
  opts.world_size = static_cast<int>(env::bootstrap_integer("WORLD_SIZE", true, 1, 1, kMaxWorldSize));
  opts.rank = static_cast<int>(env::bootstrap_integer("RANK", true, 0, 0, kMaxWorldSize - 1));
  opts.local_rank =
      static_cast<int>(env::bootstrap_integer("LOCAL_RANK", false, opts.rank, 0, kMaxWorldSize - 1));
  if (std::optional<std::string> addr = env::text("MASTER_ADDR")) opts.master_addr = *addr;
  if (std::optional<std::string> job = env::job_id()) opts.job_id = *job;
  if (std::optional<std::string> secret = env::bootstrap_secret()) opts.secret = *secret;
  opts.bind_any = env::bootstrap_bind_any();
  opts.master_port = static_cast<int>(env::bootstrap_integer("MASTER_PORT", false, opts.master_port, 1, 65535));
  opts.timeout = std::chrono::milliseconds(
      env::bootstrap_integer("EPFUSE_BOOTSTRAP_TIMEOUT_MS", false, opts.timeout.count(), 1, 24LL * 3600 * 1000));
  opts.collective_timeout = std::chrono::milliseconds(env::collective_timeout_ms(opts.collective_timeout.count()));
  opts.validate();
  return opts;
}

void BootstrapOptions::validate() const {
  auto fail = [](const std::string& why) { throw Error(ErrorCode::kBootstrap, why); };
  if (world_size < 1) fail("WORLD_SIZE=" + std::to_string(world_size) + " must be at least 1");
  if (rank < 0 || rank >= world_size) {
    fail("RANK=" + std::to_string(rank) + " must be in [0, WORLD_SIZE=" + std::to_string(world_size) + ")");
  }
  if (local_rank < 0) fail("LOCAL_RANK=" + std::to_string(local_rank) + " must not be negative");
  if (local_rank >= world_size) {
    fail("LOCAL_RANK=" + std::to_string(local_rank) + " must be below WORLD_SIZE=" + std::to_string(world_size));
  }
  if (master_addr.empty()) fail("MASTER_ADDR is empty");
  if (master_port < 1 || master_port > 65535) {
    fail("MASTER_PORT=" + std::to_string(master_port) + " is outside [1, 65535]");
  }
  if (timeout.count() < 1) {
    fail("EPFUSE_BOOTSTRAP_TIMEOUT_MS=" + std::to_string(timeout.count()) + " must be at least 1");
  }
  if (collective_timeout.count() < 1) {
    fail("EPFUSE_COLLECTIVE_TIMEOUT_MS=" + std::to_string(collective_timeout.count()) + " must be at least 1");
  }
  if (job_id.size() > kMaxJobIdBytes) {
    fail("the job id (EPFUSE_JOB_ID or TORCHELASTIC_RUN_ID) has " + std::to_string(job_id.size()) +
         " bytes, more than " + std::to_string(kMaxJobIdBytes));
  }
  if (secret.size() > kMaxSecretBytes) {
    fail("the bootstrap secret (EPFUSE_BOOTSTRAP_SECRET) has " + std::to_string(secret.size()) + " bytes, more than " +
         std::to_string(kMaxSecretBytes));
  }
}

// --- SymmetricBuffer ---

SymmetricBuffer::SymmetricBuffer(SymmetricBuffer&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      device_(other.device_),
      ptr_(std::exchange(other.ptr_, nullptr)),
      window_(std::exchange(other.window_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      aborted_(std::move(other.aborted_)),
      slices_(std::move(other.slices_)),
      slices_base_(std::exchange(other.slices_base_, nullptr)),
      stride_(std::exchange(other.stride_, 0)) {}

SymmetricBuffer& SymmetricBuffer::operator=(SymmetricBuffer&& other) noexcept {
  if (this != &other) {
    log_errors("SymmetricBuffer move-assignment", [this] { reset(); });
    comm_ = std::exchange(other.comm_, nullptr);
    device_ = other.device_;
    ptr_ = std::exchange(other.ptr_, nullptr);
    window_ = std::exchange(other.window_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    aborted_ = std::move(other.aborted_);
    slices_ = std::move(other.slices_);
    slices_base_ = std::exchange(other.slices_base_, nullptr);
    stride_ = std::exchange(other.stride_, 0);
  }
  return *this;
}

SymmetricBuffer::~SymmetricBuffer() { log_errors("~SymmetricBuffer", [this] { reset(); }); }

void SymmetricBuffer::reset() {
  if (ptr_ == nullptr) return;
  if (slices_ != nullptr) {  // loopback: drop this rank's share; the last one frees (free_slices)
    ptr_ = nullptr;
    bytes_ = 0;
    slices_base_ = nullptr;
    stride_ = 0;
    slices_.reset();
    return;
  }
  // Clear the members first so that a failure below cannot lead to a second free.
  ncclComm_t comm = std::exchange(comm_, nullptr);
  void* ptr = std::exchange(ptr_, nullptr);
  ncclWindow_t window = std::exchange(window_, nullptr);
  bytes_ = 0;
  // After Communicator::abort the comm is gone (ncclCommAbort freed it, windows included): only the
  // memory is left to free, which involves no peer.
  const bool aborted = aborted_ != nullptr && aborted_->load();
  aborted_.reset();
  const int rank = aborted ? -1 : user_rank(comm);
  DeviceGuard guard(device_, rank);
  const ncclResult_t deregistered =
      window != nullptr && !aborted ? ncclCommWindowDeregister(comm, window) : ncclSuccess;
  const ncclResult_t freed = ncclMemFree(ptr);
  check_nccl(deregistered, "ncclCommWindowDeregister(comm, window)", rank);
  check_nccl(freed, "ncclMemFree(ptr)", rank);
}

// --- DeviceComm ---

DeviceComm::DeviceComm(DeviceComm&& other) noexcept
    : comm_(std::exchange(other.comm_, nullptr)),
      device_(other.device_),
      dev_(std::exchange(other.dev_, nullptr)),
      lsa_barrier_count_(std::exchange(other.lsa_barrier_count_, 0)),
      aborted_(std::move(other.aborted_)) {}

DeviceComm& DeviceComm::operator=(DeviceComm&& other) noexcept {
  if (this != &other) {
    log_errors("DeviceComm move-assignment", [this] { reset(); });
    comm_ = std::exchange(other.comm_, nullptr);
    device_ = other.device_;
    dev_ = std::exchange(other.dev_, nullptr);
    lsa_barrier_count_ = std::exchange(other.lsa_barrier_count_, 0);
    aborted_ = std::move(other.aborted_);
  }
  return *this;
}

DeviceComm::~DeviceComm() { log_errors("~DeviceComm", [this] { reset(); }); }

void DeviceComm::reset() {
  if (dev_ == nullptr) return;
  std::unique_ptr<ncclDevComm> dev(std::exchange(dev_, nullptr));
  ncclComm_t comm = std::exchange(comm_, nullptr);
  lsa_barrier_count_ = 0;
  const bool aborted = aborted_ != nullptr && aborted_->load();
  aborted_.reset();
  if (aborted) return;  // ncclCommAbort released it with the communicator
  const int rank = user_rank(comm);
  DeviceGuard guard(device_, rank);
  EPFUSE_RANK_NCCL_CHECK(rank, ncclDevCommDestroy(comm, dev.get()));
}

// --- Communicator: every method forwards to the transport's backend ---

Communicator::Communicator() = default;

Communicator::~Communicator() = default;  // the backend releases what its transport holds; never throws

void Communicator::abort(const std::string& why) noexcept { backend_->abort(why); }

bool Communicator::aborted() const { return backend_->aborted(); }

void Communicator::require_not_aborted(std::string_view what) const {
  if (aborted())
    throw Error(ErrorCode::kAborted, "rank " + std::to_string(rank_) + ": " + std::string(what) +
                                         ": the communicator was aborted; destroy the layer and create a new communicator");
}

void Communicator::wait_bounded(cudaStream_t stream, const char* what) { backend_->wait_bounded(stream, what); }

SymmetricBuffer Communicator::alloc_symmetric(size_t bytes) { return backend_->alloc_symmetric(bytes); }

DeviceComm Communicator::create_device_comm(int lsa_barrier_count) {
  return backend_->create_device_comm(lsa_barrier_count);
}

void Communicator::barrier() { backend_->barrier(); }

std::vector<double> Communicator::all_gather(std::span<const double> local) { return backend_->all_gather(local); }

double Communicator::all_reduce_max(double local) { return backend_->all_reduce_max(local); }

int64_t Communicator::all_reduce_sum(int64_t local) { return backend_->all_reduce_sum(local); }

}  // namespace epfuse
