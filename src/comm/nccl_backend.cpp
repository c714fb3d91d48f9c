// Transport::kNccl (comm_backend.h): one process per GPU. The TCP rendezvous for the NCCL id
// (Communicator::bootstrap), wrapping a framework's communicator (Communicator::borrow), symmetric
// windows and device communicators for the kernels, host collectives through device scratch on the
// communicator's own stream, each bounded by the collective timeout.

// nccl_device.h is written for nvcc; under g++ it needs size_t and the CUDA vector types first.
#include <cstddef>
#include <cuda_runtime.h>
#include <nccl_device.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <thread>
#include <utility>

#include "comm/collective_step.h"
#include "comm/comm_backend.h"
#include "comm/nccl_version.h"
#include "comm/tcp_store.h"
#include "common/check.h"
#include "common/device_buffer.h"
#include "common/device_guard.h"
#include "common/env.h"

namespace epfuse::detail {
namespace {

constexpr const char* kNcclIdKey = "nccl_id";

// A host collective through device scratch on `stream`: `send` goes up, `enqueue(send_dev,
// recv_dev)` enqueues the collective, `recv` comes back; returns when `wait()` (bounded) has seen the
// stream drain.
template <typename Enqueue, typename Wait>
void staged_collective(int rank, int device, cudaStream_t stream, std::span<const std::byte> send,
                       std::span<std::byte> recv, Enqueue&& enqueue, Wait&& wait) {
  DeviceGuard guard(device, rank);
  // Freed in stream order on every path, errors included.
  const StreamBuffer scratch(send.size() + recv.size(), stream, rank_prefix(rank) + "host collective scratch: ");
  std::byte* send_dev = scratch.as<std::byte>();
  std::byte* recv_dev = send_dev + send.size();
  EPFUSE_RANK_CUDA_CHECK(rank, cudaMemcpyAsync(send_dev, send.data(), send.size(), cudaMemcpyHostToDevice, stream));
  enqueue(static_cast<const void*>(send_dev), static_cast<void*>(recv_dev));
  EPFUSE_RANK_CUDA_CHECK(rank, cudaMemcpyAsync(recv.data(), recv_dev, recv.size(), cudaMemcpyDeviceToHost, stream));
  wait();
}

}  // namespace

class NcclBackend final : public CommBackend {
 public:
  // `owner` is the communicator this backend serves (its rank, world size, device and timeout are
  // already set); it outlives the backend. `owned`: this backend finalizes and destroys `comm`.
  NcclBackend(Communicator& owner, ncclComm_t comm, bool owned)
      : owner_(owner),
        comm_(comm),
        owned_(owned),
        rank_(owner.rank()),
        world_size_(owner.world_size()),
        device_(owner.device()),
        collective_timeout_(owner.collective_timeout()) {}

  // Owned: ncclCommFinalize + ncclCommDestroy (collective), after a barrier bounded by the collective
  // timeout (a peer that died would otherwise hold the finalize forever: past the timeout the barrier
  // aborts the communicator and the rest is local); nothing left to do after abort(). Borrowed: the
  // comm is left to its owner.
  ~NcclBackend() override {
    log_errors("~Communicator", [this] {
      DeviceGuard guard(device_, rank_);
      if (owned_ && world_size_ > 1 && !aborted_->load() && barrier_stream_ != nullptr)
        log_errors("~Communicator: the barrier before ncclCommFinalize", [this] { barrier(); });
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

  // The stream and word barrier() uses, on device_. Separate from the constructor so that what it
  // made before a failure is released by the destructor.
  void init_barrier() {
    DeviceGuard guard(device_, rank_);
    cudaStream_t stream = nullptr;
    EPFUSE_RANK_CUDA_CHECK(rank_, cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    barrier_stream_ = stream;
    barrier_word_ = share_device_bytes(sizeof(int), device_, rank_, rank_prefix(rank_) + "barrier word: ");
    EPFUSE_RANK_CUDA_CHECK(rank_, cudaMemsetAsync(barrier_word_.get(), 0, sizeof(int), stream));
  }

  void abort(const std::string& why) noexcept override {
    {
      std::lock_guard<std::mutex> lock(abort_mutex_);
      if (aborted_->load()) return;
      abort_reason_ = why;
      aborted_->store(true);
    }
    // A borrowed comm is its owner's to abort: epfuse only stops using it (every later call throws
    // kAborted, and what was made from it is freed without NCCL).
    if (!owned_) return;
    log_errors("Communicator::abort", [&] {
      DeviceGuard guard(device_, rank_);
      EPFUSE_RANK_NCCL_CHECK(rank_, ncclCommAbort(comm_));
    });
  }

  bool aborted() const override { return aborted_->load(); }

  void wait_bounded(cudaStream_t stream, const char* what) override {
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
        const std::string why = std::string(what) + " timed out after " +
                                std::to_string(collective_timeout_.count()) +
                                " ms: a rank never joined (dead, stalled or in another collective)";
        abort(why);
        throw Error(ErrorCode::kTimeout, rank_prefix(rank_) + why + "; the communicator is aborted");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(200));
    }
  }

  SymmetricBuffer alloc_symmetric(size_t bytes) override {
    check_not_aborted("alloc_symmetric");
    EPFUSE_REQUIRE(bytes > 0, ErrorCode::kInvalidArgument,
                   rank_prefix(rank_) + "alloc_symmetric: size 0 (a window needs at least one byte)");
    SymmetricBuffer buffer;
    buffer.device_ = device_;
    DeviceGuard guard(device_, rank_);
    buffer.comm_ = comm_;
    buffer.aborted_ = aborted_;
    // The window registration is collective and unbounded: enter it only once every rank has its
    // memory (a rank whose allocation failed would leave the others registering forever).
    agree_on_step(owner_, "alloc_symmetric(" + std::to_string(bytes) + " bytes)", [&] {
      require_nccl_device_api(rank_);  // the window is for device code
      if (injected_allocation_failure())
        throw_allocation(cudaErrorMemoryAllocation, "ncclMemAlloc", bytes, rank_prefix(rank_));
      EPFUSE_RANK_NCCL_CHECK(rank_, ncclMemAlloc(&buffer.ptr_, bytes));
      buffer.bytes_ = bytes;
    });
    // On failure `buffer` frees the memory (its window_ is still null).
    EPFUSE_RANK_NCCL_CHECK(
        rank_, ncclCommWindowRegister(comm_, buffer.ptr_, bytes, &buffer.window_, NCCL_WIN_COLL_SYMMETRIC));
    return buffer;
  }

  DeviceComm create_device_comm(int lsa_barrier_count) override {
    EPFUSE_REQUIRE(lsa_barrier_count >= 0, ErrorCode::kInvalidArgument,
                   rank_prefix(rank_) + "create_device_comm: lsa_barrier_count=" + std::to_string(lsa_barrier_count) +
                       " is negative");
    check_not_aborted("create_device_comm");
    // ncclDevCommCreate is collective: every rank's check agreed before any enters it.
    agree_on_step(owner_, "create_device_comm", [&] { require_nccl_device_api(rank_); });
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

  void barrier() override {
    check_not_aborted("barrier");
    DeviceGuard guard(device_, rank_);
    EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllReduce(barrier_word_.get(), barrier_word_.get(), 1, ncclInt32, ncclMax,
                                                comm_, barrier_stream_));
    wait_bounded(barrier_stream_, "barrier");
  }

  std::vector<double> all_gather(std::span<const double> local) override {
    const size_t n = local.size();
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

  double all_reduce_max(double local) override {
    constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
    check_not_aborted("all_reduce_max");
    // NCCL's max does not propagate NaN: a NaN travels as a flag beside the value, both maxed at once.
    const bool nan = std::isnan(local);
    const double send[2] = {nan ? -std::numeric_limits<double>::infinity() : local, nan ? 1.0 : 0.0};
    double recv[2] = {0.0, 0.0};
    staged_collective(
        rank_, device_, barrier_stream_, std::as_bytes(std::span(send)), std::as_writable_bytes(std::span(recv)),
        [&](const void* s, void* r) {
          EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllReduce(s, r, 2, ncclFloat64, ncclMax, comm_, barrier_stream_));
        },
        [&] { wait_bounded(barrier_stream_, "all_reduce_max"); });
    return recv[1] > 0.0 ? kNaN : recv[0];
  }

  int64_t all_reduce_sum(int64_t local) override {
    check_not_aborted("all_reduce_sum");
    int64_t sum = 0;
    staged_collective(
        rank_, device_, barrier_stream_, std::as_bytes(std::span(&local, 1)),
        std::as_writable_bytes(std::span(&sum, 1)),
        [&](const void* s, void* r) {
          EPFUSE_RANK_NCCL_CHECK(rank_, ncclAllReduce(s, r, 1, ncclInt64, ncclSum, comm_, barrier_stream_));
        },
        [&] { wait_bounded(barrier_stream_, "all_reduce_sum"); });
    return sum;
  }

 private:
  // Error(kAborted) after abort().
  void check_not_aborted(const char* what) const {
    if (!aborted_->load()) return;
    std::lock_guard<std::mutex> lock(abort_mutex_);
    throw Error(ErrorCode::kAborted,
                rank_prefix(rank_) + what + ": the communicator was aborted (" + abort_reason_ + ")");
  }

  Communicator& owner_;  // agree_on_step's collectives go through it
  const ncclComm_t comm_;
  const bool owned_;
  const int rank_;
  const int world_size_;
  const int device_;
  const std::chrono::milliseconds collective_timeout_;
  cudaStream_t barrier_stream_ = nullptr;
  std::shared_ptr<void> barrier_word_;  // device memory (one int): the all-reduce operand
  // Shared with the SymmetricBuffers and DeviceComms made here: after abort they free only memory.
  std::shared_ptr<std::atomic<bool>> aborted_ = std::make_shared<std::atomic<bool>>(false);
  mutable std::mutex abort_mutex_;  // guards abort_reason_
  std::string abort_reason_;        // the first abort's, under abort_mutex_
};

}  // namespace epfuse::detail

namespace epfuse {

using detail::rank_prefix;

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
  // Only ranks of this job that hold its secret get the id: a rank of another job, or a stranger, that
  // reaches this store gets nothing, and a rank takes the id only from a store that holds the secret.
  const std::string job = detail::bootstrap_job(opts.world_size, opts.job_id);
  EPFUSE_REQUIRE(opts.world_size == 1 || !opts.secret.empty(), ErrorCode::kBootstrap,
                 rank_prefix(rank) + "no bootstrap secret: set EPFUSE_BOOTSTRAP_SECRET to the same random value on "
                                     "every rank (`epfuse launch` sets one; under torchrun it is derived from "
                                     "TORCHELASTIC_RUN_ID), or BootstrapOptions::secret");
  std::unique_ptr<detail::TcpStore> store;  // rank 0 serves the id until ncclCommInitRank returns
  if (rank == 0) {
    EPFUSE_RANK_NCCL_CHECK(rank, ncclGetUniqueId(&id));
    if (opts.world_size > 1) {
      store = std::make_unique<detail::TcpStore>(opts.master_addr, opts.master_port, rank, job, opts.secret,
                                                 opts.bind_any);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
      store->set(detail::kNcclIdKey, detail::Blob(bytes, bytes + sizeof(id)));
    }
  } else {
    const detail::Blob blob =
        detail::tcp_store_get(opts.master_addr, opts.master_port, job, opts.secret, detail::kNcclIdKey, opts.timeout,
                              rank);
    EPFUSE_REQUIRE(blob.size() == sizeof(id), ErrorCode::kBootstrap,
                   rank_prefix(rank) + "the NCCL id from " + opts.master_addr + ":" +
                       std::to_string(opts.master_port) + " has " + std::to_string(blob.size()) +
                       " bytes, expected " + std::to_string(sizeof(id)) + " (a different NCCL version on rank 0?)");
    std::memcpy(&id, blob.data(), sizeof(id));
  }

  std::unique_ptr<Communicator> comm =
      init_rank(id, opts.world_size, rank, opts.local_rank, opts.collective_timeout);
  // ncclCommInitRank is collective: when it returned on rank 0, every rank had read the id.
  store.reset();
  return comm;
}

std::unique_ptr<Communicator> Communicator::init_rank(const ncclUniqueId& id, int world_size, int rank, int device,
                                                     std::chrono::milliseconds collective_timeout) {
  EPFUSE_REQUIRE(world_size >= 1 && rank >= 0 && rank < world_size && device >= 0 && collective_timeout.count() >= 1,
                 ErrorCode::kInvalidArgument,
                 "Communicator::init_rank: rank " + std::to_string(rank) + " of world " + std::to_string(world_size) +
                     " on device " + std::to_string(device) + " with a collective timeout of " +
                     std::to_string(collective_timeout.count()) + " ms is out of range");
  EPFUSE_RANK_CUDA_CHECK(rank, cudaSetDevice(device));
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->transport_ = Transport::kNccl;
  comm->rank_ = rank;
  comm->world_size_ = world_size;
  comm->device_ = device;
  comm->collective_timeout_ = collective_timeout;
  // Blocking, and not bounded by epfuse (README, "Waits epfuse does not bound"): NCCL's nonblocking
  // mode would bound it, but every later call on such a communicator must then be polled until it
  // has finished (docs/performance.md, "Faults seen while timing").
  EPFUSE_RANK_NCCL_CHECK(rank, ncclCommInitRank(&comm->comm_, world_size, id, rank));
  auto backend = std::make_unique<detail::NcclBackend>(*comm, comm->comm_, /*owned=*/true);
  detail::NcclBackend& nccl = *backend;
  comm->backend_ = std::move(backend);
  nccl.init_barrier();
  return comm;
}

std::unique_ptr<Communicator> Communicator::borrow(ncclComm_t nccl) {
  EPFUSE_REQUIRE(nccl != nullptr, ErrorCode::kInvalidArgument, "Communicator::borrow: the ncclComm_t is null");
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->transport_ = Transport::kNccl;
  comm->comm_ = nccl;
  EPFUSE_RANK_NCCL_CHECK(-1, ncclCommUserRank(nccl, &comm->rank_));
  EPFUSE_RANK_NCCL_CHECK(comm->rank_, ncclCommCount(nccl, &comm->world_size_));
  EPFUSE_RANK_NCCL_CHECK(comm->rank_, ncclCommCuDevice(nccl, &comm->device_));
  comm->collective_timeout_ = std::chrono::milliseconds(env::collective_timeout_ms(comm->collective_timeout_.count()));
  auto backend = std::make_unique<detail::NcclBackend>(*comm, nccl, /*owned=*/false);
  detail::NcclBackend& borrowed = *backend;
  comm->backend_ = std::move(backend);
  borrowed.init_barrier();
  return comm;
}

}  // namespace epfuse
