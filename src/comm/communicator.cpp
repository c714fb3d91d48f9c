// Communicator (epfuse/communicator.h): TCP rendezvous for the NCCL id, the NCCL communicator,
// symmetric windows and device communicators for the kernels, host collectives; in a one-GPU world
// (LoopbackWorld, loopback.cpp) the same calls go through the shared LoopbackHub instead.
#include "epfuse/communicator.h"

// nccl_device.h is written for nvcc; under g++ it needs size_t and the CUDA vector types first.
#include <cstddef>
#include <cuda_runtime.h>
#include <nccl_device.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "comm/collective_step.h"
#include "comm/loopback_hub.h"
#include "comm/tcp_store.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/device_guard.h"
#include "common/env.h"

namespace epfuse {
namespace {

using detail::DeviceGuard;

constexpr const char* kNcclIdKey = "nccl_id";
constexpr long long kMaxWorldSize = 1 << 16;
constexpr size_t kMaxJobIdBytes = 512;  // BootstrapOptions::job_id; the store's limit is twice that
// Loopback: each rank's slice of a symmetric allocation starts on this boundary (whole pages, so
// no kernel's vector access of one rank's slice straddles into a peer's).
constexpr size_t kSliceAlignment = 4096;

std::string rank_prefix(int rank) { return rank >= 0 ? "rank " + std::to_string(rank) + ": " : ""; }

// check.h's macros know neither the rank nor the communicator whose last error explains a failure;
// in a multi-process job the rank is the first thing a reader needs.
void check_nccl(ncclResult_t res, const char* call, int rank) {
  if (res == ncclSuccess) return;
  const char* last = ncclGetLastError(nullptr);  // the comm argument is unused by NCCL
  throw Error(ErrorCode::kNccl, rank_prefix(rank) + call + " failed: " + ncclGetErrorString(res) + " (" +
                                    (last != nullptr && last[0] != '\0' ? last : "no further detail") + ")");
}

void check_cuda(cudaError_t err, const char* call, int rank) {
  if (err == cudaSuccess) return;
  throw Error(ErrorCode::kCuda, rank_prefix(rank) + call + " failed: " + cudaGetErrorString(err) + " (" +
                                    cudaGetErrorName(err) + ")");
}

#define EPFUSE_RANK_NCCL_CHECK(rank, call) check_nccl((call), #call, (rank))
#define EPFUSE_RANK_CUDA_CHECK(rank, call) check_cuda((call), #call, (rank))

int user_rank(ncclComm_t comm) {
  int rank = -1;
  return comm != nullptr && ncclCommUserRank(comm, &rank) == ncclSuccess ? rank : -1;
}

// Destructors must not throw: the error goes to stderr, where a job's log keeps it.
template <typename F>
void log_errors(const char* what, F&& f) noexcept {
  try {
    f();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "epfuse: %s: %s\n", what, e.what());
  }
}

// --- loopback helpers (the hub carries bytes; these give them types) ---

// Every rank's `mine`, rank-major, through one hub exchange.
template <typename T>
std::vector<std::vector<T>> loopback_gather(detail::LoopbackHub& hub, int rank, const char* what,
                                            std::span<const T> mine) {
  const std::vector<std::vector<std::byte>> all = hub.exchange(rank, what, std::as_bytes(mine));
  std::vector<std::vector<T>> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    EPFUSE_REQUIRE(all[r].size() % sizeof(T) == 0, ErrorCode::kInternal,
                   rank_prefix(rank) + what + ": rank " + std::to_string(r) + " sent " +
                       std::to_string(all[r].size()) + " bytes, not whole values");
    out[r].resize(all[r].size() / sizeof(T));
    if (!all[r].empty()) std::memcpy(out[r].data(), all[r].data(), all[r].size());
  }
  return out;
}

// Every rank's one value (the hub already rejects ranks that call different collectives).
template <typename T>
std::vector<T> loopback_gather_one(detail::LoopbackHub& hub, int rank, const char* what, T mine) {
  std::vector<T> out;
  for (const std::vector<T>& values : loopback_gather(hub, rank, what, std::span<const T>(&mine, 1))) {
    EPFUSE_REQUIRE(values.size() == 1, ErrorCode::kInternal,
                   rank_prefix(rank) + what + ": a rank sent " + std::to_string(values.size()) + " values, not one");
    out.push_back(values[0]);
  }
  return out;
}

// Every rank computes this from the same gathered counts, so all of them throw alike and no rank
// goes on alone.
void require_same_counts(int rank, const char* what, const std::vector<uint64_t>& counts, const char* unit) {
  bool same = true;
  for (uint64_t c : counts) same = same && c == counts[0];
  if (same) return;
  std::string listed;
  for (size_t r = 0; r < counts.size(); ++r) {
    listed += (r > 0 ? ", rank " : "rank ") + std::to_string(r) + ": " + std::to_string(counts[r]) + " " + unit;
  }
  throw Error(ErrorCode::kInvalidArgument, rank_prefix(rank) + what + ": the ranks passed different sizes (" + listed +
                                               "); every rank must pass the same");
}

// Loopback: rank 0 allocates `total` bytes for every rank's slice and hands every rank a share of
// it (device_buffer.h: the last rank to drop its share frees it, on whichever rank's thread that is,
// with the device selected; like a destructor it only logs errors); a failure reaches every rank as
// the same Error(kCuda), so no rank proceeds alone.
std::shared_ptr<void> share_slices(detail::LoopbackHub& hub, int rank, int device, size_t total) {
  detail::LoopbackHub::Contribution mine;
  if (rank == 0) {
    try {
      mine.handle = detail::share_device_bytes(total, device, rank, rank_prefix(rank));
    } catch (const std::exception& e) {
      const std::string why = e.what();
      mine.bytes.resize(why.size());
      std::memcpy(mine.bytes.data(), why.data(), why.size());
    }
  }
  std::vector<detail::LoopbackHub::Contribution> all = hub.exchange(rank, "alloc_symmetric", std::move(mine));
  if (all[0].handle == nullptr) {
    const std::string why(reinterpret_cast<const char*>(all[0].bytes.data()), all[0].bytes.size());
    throw Error(ErrorCode::kCuda, rank_prefix(rank) + "alloc_symmetric: rank 0 could not allocate the " +
                                      std::to_string(total) + " bytes of the world's slices: " + why);
  }
  return all[0].handle;
}

// NCCL: a host collective through device scratch on `stream`: `send` goes up, `enqueue(send_dev,
// recv_dev)` enqueues the collective, `recv` comes back; returns when `wait()` (bounded) has seen the
// stream drain.
template <typename Enqueue, typename Wait>
void staged_collective(int rank, int device, cudaStream_t stream, std::span<const std::byte> send,
                       std::span<std::byte> recv, Enqueue&& enqueue, Wait&& wait) {
  DeviceGuard guard(device, rank);
  // Freed in stream order on every path, errors included.
  const detail::StreamBuffer scratch(send.size() + recv.size(), stream,
                                     rank_prefix(rank) + "host collective scratch: ");
  std::byte* send_dev = scratch.as<std::byte>();
  std::byte* recv_dev = send_dev + send.size();
  EPFUSE_RANK_CUDA_CHECK(rank, cudaMemcpyAsync(send_dev, send.data(), send.size(), cudaMemcpyHostToDevice, stream));
  enqueue(static_cast<const void*>(send_dev), static_cast<void*>(recv_dev));
  EPFUSE_RANK_CUDA_CHECK(rank, cudaMemcpyAsync(recv.data(), recv_dev, recv.size(), cudaMemcpyDeviceToHost, stream));
  wait();
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
  opts.master_port = static_cast<int>(env::bootstrap_integer("MASTER_PORT", false, opts.master_port, 1, 65535));
  opts.timeout = std::chrono::milliseconds(
      env::bootstrap_integer("EPFUSE_BOOTSTRAP_TIMEOUT_MS", false, opts.timeout.count(), 1, 24LL * 3600 * 1000));
  opts.collective_timeout = std::chrono::milliseconds(env::bootstrap_integer(
      "EPFUSE_COLLECTIVE_TIMEOUT_MS", false, opts.collective_timeout.count(), 1, 24LL * 3600 * 1000));
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

// --- Communicator ---

std::unique_ptr<Communicator> Communicator::bootstrap(const BootstrapOptions& opts) {
  opts.validate();
  const int rank = opts.rank;
  int device_count = 0;
  EPFUSE_RANK_CUDA_CHECK(rank, cudaGetDeviceCount(&device_count));
  if (opts.local_rank >= device_count) {
    const std::optional<std::string> visible = env::text("CUDA_VISIBLE_DEVICES");
    throw Error(ErrorCode::kBootstrap,
                rank_prefix(rank) + "LOCAL_RANK=" + std::to_string(opts.local_rank) + " but this process sees " +
                    std::to_string(device_count) + " CUDA device(s) (CUDA_VISIBLE_DEVICES=" +
                    (visible ? *visible : std::string("<unset>")) + "): one process per GPU");
  }
  EPFUSE_RANK_CUDA_CHECK(rank, cudaSetDevice(opts.local_rank));

  ncclUniqueId id{};
  // Only ranks of this job get the id: another job's rank that reaches this store fails at once.
  const std::string job = detail::bootstrap_job(opts.world_size, opts.job_id);
  std::unique_ptr<detail::TcpStore> store;  // rank 0 serves the id until ncclCommInitRank returns
  if (rank == 0) {
    EPFUSE_RANK_NCCL_CHECK(rank, ncclGetUniqueId(&id));
    if (opts.world_size > 1) {
      store = std::make_unique<detail::TcpStore>(opts.master_addr, opts.master_port, rank, job);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store->set(kNcclIdKey, detail::Blob(bytes, bytes + sizeof(id)));
    }
  } else {
    const detail::Blob blob =
        detail::tcp_store_get(opts.master_addr, opts.master_port, job, kNcclIdKey, opts.timeout, rank);
    EPFUSE_REQUIRE(blob.size() == sizeof(id), ErrorCode::kBootstrap,
                   rank_prefix(rank) + "the NCCL id from " + opts.master_addr + ":" +
                       std::to_string(opts.master_port) + " has " + std::to_string(blob.size()) +
                       " bytes, expected " + std::to_string(sizeof(id)) + " (a different NCCL version on rank 0?)");
    std::memcpy(&id, blob.data(), sizeof(id));
  }

  std::unique_ptr<Communicator> comm(new Communicator());
  comm->rank_ = rank;
  comm->world_size_ = opts.world_size;
  comm->device_ = opts.local_rank;
  comm->collective_timeout_ = opts.collective_timeout;
  EPFUSE_RANK_NCCL_CHECK(rank, ncclCommInitRank(&comm->comm_, opts.world_size, id, rank));
  comm->owned_ = true;
  // ncclCommInitRank is collective: when it returns on rank 0, every rank has read the id.
  store.reset();
  comm->init_barrier();
  return comm;
}

std::unique_ptr<Communicator> Communicator::borrow(ncclComm_t nccl) {
  EPFUSE_REQUIRE(nccl != nullptr, ErrorCode::kInvalidArgument, "Communicator::borrow: the ncclComm_t is null");
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->comm_ = nccl;
  comm->owned_ = false;
  EPFUSE_RANK_NCCL_CHECK(-1, ncclCommUserRank(nccl, &comm->rank_));
  EPFUSE_RANK_NCCL_CHECK(comm->rank_, ncclCommCount(nccl, &comm->world_size_));
  EPFUSE_RANK_NCCL_CHECK(comm->rank_, ncclCommCuDevice(nccl, &comm->device_));
  comm->collective_timeout_ = std::chrono::milliseconds(env::bootstrap_integer(
      "EPFUSE_COLLECTIVE_TIMEOUT_MS", false, comm->collective_timeout_.count(), 1, 24LL * 3600 * 1000));
  comm->init_barrier();
  return comm;
}

void Communicator::init_barrier() {
  DeviceGuard guard(device_, rank_);
  cudaStream_t stream = nullptr;
  EPFUSE_RANK_CUDA_CHECK(rank_, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  barrier_stream_ = stream;
  barrier_word_ = detail::share_device_bytes(sizeof(int), device_, rank_, rank_prefix(rank_) + "barrier word: ");
  EPFUSE_RANK_CUDA_CHECK(rank_, cudaMemsetAsync(barrier_word_.get(), 0, sizeof(int), stream));
}

Communicator::~Communicator() {
  if (transport_ == Transport::kLoopback) return;  // no stream, word or NCCL comm; the hub is shared
  log_errors("~Communicator", [this] {
    DeviceGuard guard(device_, rank_);
    // Every step runs even when an earlier one failed; the first failure is reported.
    barrier_word_.reset();  // device_buffer.h frees it (and logs a failure)
    const cudaError_t destroyed = barrier_stream_ != nullptr ? cudaStreamDestroy(barrier_stream_) : cudaSuccess;
    // Finalize flushes outstanding work so that Destroy cannot free resources peers still use. After
    // abort() there is nothing left: ncclCommAbort freed the communicator.
    const bool live = owned_ && !aborted_->load();
    const ncclResult_t finalized = live ? ncclCommFinalize(comm_) : ncclSuccess;
    const ncclResult_t nccl_destroyed = live ? ncclCommDestroy(comm_) : ncclSuccess;
    check_cuda(destroyed, "cudaStreamDestroy(barrier stream)", rank_);
    check_nccl(finalized, "ncclCommFinalize(comm)", rank_);
    check_nccl(nccl_destroyed, "ncclCommDestroy(comm)", rank_);
  });
}

void Communicator::abort(const std::string& why) noexcept {
  if (transport_ == Transport::kLoopback) {
    log_errors("Communicator::abort", [&] { hub_->abort(rank_, why); });
    return;
  }
  {
    std::lock_guard<std::mutex> lock(abort_mutex_);
    if (aborted_->load()) return;
    abort_reason_ = why;
    aborted_->store(true);
  }
  if (!owned_) return;  // a borrowed comm is its owner's to abort
  log_errors("Communicator::abort", [&] {
    DeviceGuard guard(device_, rank_);
    EPFUSE_RANK_NCCL_CHECK(rank_, ncclCommAbort(comm_));
  });
}

bool Communicator::aborted() const {
  return transport_ == Transport::kLoopback ? hub_->aborted() : aborted_->load();
}

void Communicator::check_not_aborted(const char* what) const {
  if (transport_ == Transport::kLoopback || !aborted_->load()) return;  // the hub reports its own aborts
  std::lock_guard<std::mutex> lock(abort_mutex_);
  throw Error(ErrorCode::kAborted,
              rank_prefix(rank_) + what + ": the communicator was aborted (" + abort_reason_ + ")");
}

void Communicator::wait_bounded(cudaStream_t stream, const char* what) {
  if (transport_ == Transport::kLoopback) {
    EPFUSE_RANK_CUDA_CHECK(rank_, cudaStreamSynchronize(stream));
    return;
  }
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  const Clock::time_point spin_until = start + std::chrono::milliseconds(2);
  const Clock::time_point deadline = start + collective_timeout_;
  auto pause = std::chrono::microseconds(5);
  for (;;) {
    const cudaError_t done = cudaStreamQuery(stream);
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) check_cuda(done, (std::string(what) + ": cudaStreamQuery").c_str(), rank_);
    const Clock::time_point now = Clock::now();
    if (now < spin_until) continue;
    check_not_aborted(what);  // the comm may be gone: never query it after abort()
    ncclResult_t async = ncclSuccess;
    EPFUSE_RANK_NCCL_CHECK(rank_, ncclCommGetAsyncError(comm_, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
      const std::string why = std::string(what) + " failed in NCCL: " + ncclGetErrorString(async);
      abort(why);
      throw Error(ErrorCode::kNccl, rank_prefix(rank_) + why + "; the communicator is aborted");
    }
    if (now >= deadline) {
      const std::string why = std::string(what) + " timed out after " + std::to_string(collective_timeout_.count()) +
                              " ms: a rank never joined (dead, stalled or in another collective)";
      abort(why);
      throw Error(ErrorCode::kTimeout, rank_prefix(rank_) + why + "; the communicator is aborted");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(200));
  }
}

SymmetricBuffer Communicator::alloc_symmetric(size_t bytes) {
  check_not_aborted("alloc_symmetric");
  const bool loopback = transport_ == Transport::kLoopback;
  if (loopback) {  // agree on the size first: a mismatch fails every rank before any CUDA call
    const std::vector<uint64_t> sizes = loopback_gather_one<uint64_t>(*hub_, rank_, "alloc_symmetric", bytes);
    require_same_counts(rank_, "alloc_symmetric", sizes, "bytes");
  }
  EPFUSE_REQUIRE(bytes > 0, ErrorCode::kInvalidArgument,
                 rank_prefix(rank_) + "alloc_symmetric: size 0 (a window needs at least one byte)");
  SymmetricBuffer buffer;
  buffer.device_ = device_;
  if (loopback) {
    const size_t world = static_cast<size_t>(world_size_);
    EPFUSE_REQUIRE(bytes <= (SIZE_MAX - kSliceAlignment) / world, ErrorCode::kInvalidArgument,
                   rank_prefix(rank_) + "alloc_symmetric: " + std::to_string(bytes) + " bytes times " +
                       std::to_string(world) + " ranks overflows size_t");
    const size_t stride = (bytes + kSliceAlignment - 1) / kSliceAlignment * kSliceAlignment;
    buffer.slices_ = share_slices(*hub_, rank_, device_, stride * world);
    buffer.slices_base_ = buffer.slices_.get();
    buffer.stride_ = stride;
    buffer.ptr_ = static_cast<std::byte*>(buffer.slices_base_) + static_cast<size_t>(rank_) * stride;
    buffer.bytes_ = bytes;
    return buffer;
  }
  DeviceGuard guard(device_, rank_);
  buffer.comm_ = comm_;
  buffer.aborted_ = aborted_;
  // The window registration is collective and unbounded: enter it only once every rank has its
  // memory (a rank whose allocation failed would leave the others registering forever).
  detail::agree_on_step(*this, "alloc_symmetric(" + std::to_string(bytes) + " bytes)", [&] {
    EPFUSE_RANK_NCCL_CHECK(rank_, ncclMemAlloc(&buffer.ptr_, bytes));
    buffer.bytes_ = bytes;
  });
  // On failure `buffer` frees the memory (its window_ is still null).
  EPFUSE_RANK_NCCL_CHECK(rank_,
                         ncclCommWindowRegister(comm_, buffer.ptr_, bytes, &buffer.window_, NCCL_WIN_COLL_SYMMETRIC));
  return buffer;
}

DeviceComm Communicator::create_device_comm(int lsa_barrier_count) {
  EPFUSE_REQUIRE(transport_ != Transport::kLoopback, ErrorCode::kUnsupported,
                 rank_prefix(rank_) + "create_device_comm: NCCL device communicators are not available in the "
                                      "one-GPU (loopback) mode");
  EPFUSE_REQUIRE(lsa_barrier_count >= 0, ErrorCode::kInvalidArgument,
                 rank_prefix(rank_) + "create_device_comm: lsa_barrier_count=" + std::to_string(lsa_barrier_count) +
                     " is negative");
  check_not_aborted("create_device_comm");
  DeviceGuard guard(device_, rank_);
  ncclDevCommRequirements reqs{};  // zero: no GIN, no extra resources, no multimem
  reqs.lsaBarrierCount = lsa_barrier_count;
  reqs.lsaMultimem = false;  // never NVLink multicast (DESIGN.md)
  auto dev = std::make_unique<ncclDevComm>();
  EPFUSE_RANK_NCCL_CHECK(rank_, ncclDevCommCreate(comm_, &reqs, dev.get()));
  DeviceComm out;
  out.comm_ = comm_;
  out.device_ = device_;
  out.dev_ = dev.release();
  out.lsa_barrier_count_ = lsa_barrier_count;
  out.aborted_ = aborted_;
  return out;
}

void Communicator::barrier() {
  if (transport_ == Transport::kLoopback) {
    hub_->exchange(rank_, "barrier", std::span<const std::byte>());
    return;
  }
  check_not_aborted("barrier");
  DeviceGuard guard(device_, rank_);
  EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllReduce(barrier_word_.get(), barrier_word_.get(), 1, ncclInt32, ncclMax, comm_,
                                              barrier_stream_));
  wait_bounded(barrier_stream_, "barrier");
}

std::vector<double> Communicator::all_gather(std::span<const double> local) {
  const size_t n = local.size();
  if (transport_ == Transport::kLoopback) {
    const std::vector<std::vector<double>> each = loopback_gather(*hub_, rank_, "all_gather", local);
    std::vector<uint64_t> counts;
    for (const std::vector<double>& values : each) counts.push_back(values.size());
    require_same_counts(rank_, "all_gather", counts, "values");
    std::vector<double> all;
    all.reserve(n * each.size());
    for (const std::vector<double>& values : each) all.insert(all.end(), values.begin(), values.end());
    return all;
  }
  check_not_aborted("all_gather");
  std::vector<double> all(n * static_cast<size_t>(world_size_));
  if (n == 0) return all;  // every rank passes the same count: none of them calls NCCL
  staged_collective(
      rank_, device_, barrier_stream_, std::as_bytes(local), std::as_writable_bytes(std::span(all)),
      [&](const void* send, void* recv) {
        EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllGather(send, recv, n, ncclFloat64, comm_, barrier_stream_));
      },
      [&] { wait_bounded(barrier_stream_, "all_gather"); });
  return all;
}

double Communicator::all_reduce_max(double local) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  if (transport_ == Transport::kLoopback) {
    double max = -std::numeric_limits<double>::infinity();
    for (double v : loopback_gather_one(*hub_, rank_, "all_reduce_max", local)) {
      if (std::isnan(v)) return kNaN;
      max = std::max(max, v);
    }
    return max;
  }
  check_not_aborted("all_reduce_max");
  // NCCL's max does not propagate NaN: a NaN travels as a flag beside the value, both maxed at once.
  const bool nan = std::isnan(local);
  const double send[2] = {nan ? -std::numeric_limits<double>::infinity() : local, nan ? 1.0 : 0.0};
  double recv[2] = {0.0, 0.0};
  staged_collective(rank_, device_, barrier_stream_, std::as_bytes(std::span(send)),
                    std::as_writable_bytes(std::span(recv)), [&](const void* s, void* r) {
                      EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllReduce(s, r, 2, ncclFloat64, ncclMax, comm_,
                                                                  barrier_stream_));
                    },
                    [&] { wait_bounded(barrier_stream_, "all_reduce_max"); });
  return recv[1] > 0.0 ? kNaN : recv[0];
}

int64_t Communicator::all_reduce_sum(int64_t local) {
  if (transport_ == Transport::kLoopback) {
    int64_t sum = 0;
    for (int64_t v : loopback_gather_one(*hub_, rank_, "all_reduce_sum", local)) sum += v;
    return sum;
  }
  check_not_aborted("all_reduce_sum");
  int64_t sum = 0;
  staged_collective(rank_, device_, barrier_stream_, std::as_bytes(std::span(&local, 1)),
                    std::as_writable_bytes(std::span(&sum, 1)), [&](const void* s, void* r) {
                      EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllReduce(s, r, 1, ncclInt64, ncclSum, comm_,
                                                                  barrier_stream_));
                    },
                    [&] { wait_bounded(barrier_stream_, "all_reduce_sum"); });
  return sum;
}

}  // namespace epfuse
