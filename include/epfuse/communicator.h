// epfuse/communicator.h: the ranks of a world, their symmetric windows and host collectives.
//
// Two transports (Transport): NCCL (one process per GPU, windows reached through NVLink LSA
// pointers) and loopback (every rank of a world in one process on one GPU, one host thread per rank:
// LoopbackWorld). Layers and tools use a Communicator the same way under both.
//
// Lifetime: SymmetricBuffer and DeviceComm refer to their Communicator's ncclComm_t and must be
// destroyed before it (declare them after the Communicator, or reset them first). Creating and
// destroying them is collective: every rank does it, in the same order.
// Every call selects the communicator's device for its duration and restores the caller's.
// Errors are Error(kNccl / kCuda / kBootstrap / kInvalidArgument) whose message starts "rank R: ".
#pragma once
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nccl.h>

struct ncclDevComm;  // nccl_device/core.h; include <nccl_device.h> where kernels use it
struct CUstream_st;  // cudaStream_t, without pulling cuda_runtime.h into every user

namespace epfuse {

enum class Transport {
  kNccl,      // one process per GPU; peers' windows through NCCL LSA (NVLink) pointers
  kLoopback,  // all ranks in one process on one GPU; rank r's window is slice r of one allocation
};

namespace detail {
class LoopbackHub;      // the state the ranks of a LoopbackWorld share (src/comm/loopback_hub.h)
class CommBackend;      // what a Communicator does under its transport (src/comm/comm_backend.h)
class NcclBackend;      // Transport::kNccl (src/comm/nccl_backend.cpp)
class LoopbackBackend;  // Transport::kLoopback (src/comm/loopback_backend.cpp)
}

// The torchrun convention: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct BootstrapOptions {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds timeout{120000};  // for fetching the NCCL id from rank 0
  // Bounds every host collective of the communicator (barrier, all_gather, all_reduce_*, the
  // agreement inside alloc_symmetric): past it the communicator is aborted and the call throws
  // Error(kTimeout), instead of waiting forever for a rank that died or never calls.
  std::chrono::milliseconds collective_timeout{300000};
  // Which job the ranks belong to: rank 0 serves the NCCL id only to ranks with the same job id and
  // world_size, and a rank that reaches another job's rank 0 (two jobs on one MASTER_PORT) fails at
  // once with Error(kBootstrap) naming its own job instead of joining it (the store tells it
  // nothing of its own). Empty: world_size alone tells
  // jobs apart. At most 512 bytes.
  std::string job_id;
  // The per-launch secret shared by every rank of the job: rank 0's store serves the NCCL id only to a
  // client that proves it (an HMAC, the secret never travels), and a rank accepts only a reply that
  // proves it. Required when world_size > 1 (bootstrap throws Error(kBootstrap) naming
  // EPFUSE_BOOTSTRAP_SECRET otherwise). At most 1024 bytes.
  std::string secret;
  // Let rank 0's store listen on a wildcard master_addr (0.0.0.0, ::), i.e. on every interface;
  // false: such an address is refused with Error(kBootstrap).
  bool bind_any = false;

  // Reads RANK and WORLD_SIZE (required), LOCAL_RANK (default RANK), MASTER_ADDR (default
  // 127.0.0.1), MASTER_PORT (default 29500), EPFUSE_BOOTSTRAP_TIMEOUT_MS (default 120000),
  // EPFUSE_COLLECTIVE_TIMEOUT_MS (default 300000), the
  // job id from EPFUSE_JOB_ID, else TORCHELASTIC_RUN_ID (torchrun's), else empty, the secret from
  // EPFUSE_BOOTSTRAP_SECRET, else derived from TORCHELASTIC_RUN_ID and MASTER_PORT, else empty, and
  // bind_any from EPFUSE_BOOTSTRAP_BIND_ANY (default 0);
  // throws Error(kBootstrap) naming a missing or malformed variable and its value.
  static BootstrapOptions from_env();
  // Throws Error(kBootstrap) naming the first field out of range (by its environment variable).
  void validate() const;
};

// A window every rank holds at the same size, which kernels reach on peers.
// NCCL: memory from ncclMemAlloc registered as an NCCL_WIN_COLL_SYMMETRIC window; kernels reach
// peers' copies with ncclGetPeerPointer(window(), offset, peer).
// Loopback: slice rank() of one device allocation of world_size() slices of stride() bytes each;
// peer p's copy is at slices_base() + p * stride(). window() is null.
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
  // Loopback only (null / 0 under NCCL): slice 0 and the distance between slices.
  void* slices_base() const { return slices_base_; }
  size_t stride() const { return stride_; }
  // NCCL: deregisters and frees now (collective); throws on an NCCL error. Loopback: drops this
  // rank's share; the allocation is freed with the last rank's share (not collective). The
  // destructor and move assignment do the same but only log errors to stderr.
  void reset();

 private:
  friend class detail::NcclBackend;
  friend class detail::LoopbackBackend;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  void* ptr_ = nullptr;
  ncclWindow_t window_ = nullptr;
  size_t bytes_ = 0;
  std::shared_ptr<const std::atomic<bool>> aborted_;  // NCCL: the communicator's; after abort, free only
  std::shared_ptr<void> slices_;  // loopback: the allocation of every rank's slice
  void* slices_base_ = nullptr;
  size_t stride_ = 0;
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
  friend class detail::NcclBackend;
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  ncclDevComm* dev_ = nullptr;
  int lsa_barrier_count_ = 0;
  std::shared_ptr<const std::atomic<bool>> aborted_;  // the communicator's; after abort, nothing to destroy
};

// Owned and borrowed. bootstrap() and init_rank() make an NCCL communicator that epfuse owns (in
// NCCL's default blocking mode): abort() ends it with ncclCommAbort, the destructor finalizes it.
// borrow() wraps a framework's communicator (torch.distributed's) that epfuse never aborts, finalizes
// or destroys: abort() only marks it unusable for epfuse, and its owner must abort it (after a peer's
// death it cannot be finalized or reused either).
//
// Bounded waits, and the limits that remain (README, "Waits epfuse does not bound"):
//  - bounded by the collective timeout: every host collective (barrier, all_gather, all_reduce_*, the
//    agreement inside alloc_symmetric), wait_bounded, and on owned communicators the destructor (a
//    barrier before ncclCommFinalize: past the timeout the communicator is aborted instead);
//  - NOT bounded by epfuse: ncclCommInitRank (once every rank has the NCCL id), window registration
//    and ncclDevCommCreate after the agreement (every rank reached them, so only a rank that dies
//    inside them holds the others), ncclCommFinalize after its barrier, and whatever a borrowed
//    communicator's owner does with it;
//  - NOT bounded: an NCCL kernel already enqueued (the unfused chain's all-to-alls) waits on the device
//    for its peers until this rank aborts; the host sees it at its next bounded wait.
class Communicator {
 public:
  // Rank 0 creates the ncclUniqueId and serves it over TCP at master_addr:master_port; the others
  // fetch it with retries until opts.timeout. Sets the calling thread's device to local_rank. Owned
  // (init_rank with the id).
  static std::unique_ptr<Communicator> bootstrap(const BootstrapOptions& opts);
  // Collective: this rank's communicator of a world of `world_size` from an ncclUniqueId every rank
  // received (made by rank 0 with ncclGetUniqueId), on CUDA device `device` (made current). Owned;
  // `collective_timeout` bounds its host collectives. ncclCommInitRank waits for every rank without a
  // bound of epfuse's. Error(kInvalidArgument) for a rank, world size, device or timeout out of range.
  static std::unique_ptr<Communicator> init_rank(const ncclUniqueId& id, int world_size, int rank, int device,
                                                 std::chrono::milliseconds collective_timeout);
  // Wraps a communicator the caller already has (e.g. from the framework); never aborted, finalized
  // or destroyed here. The collective timeout is EPFUSE_COLLECTIVE_TIMEOUT_MS (default 300000).
  static std::unique_ptr<Communicator> borrow(ncclComm_t comm);

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Owned: a barrier, then ncclCommFinalize + ncclCommDestroy (collective; a barrier that times out
  // aborts the communicator instead), or nothing left to do after abort(). Borrowed: the comm is left
  // alone. Every SymmetricBuffer and DeviceComm made from it must already be gone. Never throws
  // (errors go to stderr).
  ~Communicator();

  // Gives up on the world, for when a peer failed or may be dead (an Error(kTimeout) or kAborted from
  // a layer or a collective): NCCL (owned): ncclCommAbort, which ends this rank's in-flight NCCL
  // work without waiting for peers; borrowed: never aborted here, only marked unusable for epfuse
  // (its owner must abort it: epfuse frees its windows' memory without deregistering them). Loopback:
  // LoopbackWorld::abort. Afterwards every collective of this communicator throws Error(kAborted)
  // naming `why`, and destroying what was made from it (layers, workspaces, SymmetricBuffer,
  // DeviceComm) and the communicator itself is local and cannot hang: the process can then exit
  // cleanly or bootstrap a new communicator. Idempotent (the first reason is kept); never throws.
  // Call it from the thread that makes this communicator's calls (as after an error they threw), not
  // while another thread is inside one of them: ncclCommAbort frees what such a call still uses.
  void abort(const std::string& why) noexcept;
  bool aborted() const;
  // After abort(): throws Error(kAborted) "rank R: <what>: the communicator was aborted; destroy the
  // layer and create a new communicator" (a layer's forward, before it launches or calls NCCL).
  void require_not_aborted(std::string_view what) const;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int device() const { return device_; }
  Transport transport() const { return transport_; }
  // How many ranks of this world share this rank's GPU (1 under NCCL, world_size() in loopback):
  // their persistent kernels must all be resident at once.
  int ranks_per_device() const { return transport_ == Transport::kLoopback ? world_size_ : 1; }
  // The NCCL communicator; null in loopback (NCCL cannot put two ranks on one GPU).
  ncclComm_t nccl() const { return comm_; }

  // Collective: every rank calls with the same size (> 0). Loopback: a size that differs between
  // ranks is an Error(kInvalidArgument) on every rank; the memory is not zeroed.
  SymmetricBuffer alloc_symmetric(size_t bytes);
  // Collective: an ncclDevComm with this many LSA barriers (one per CTA that synchronises; >= 0).
  // Never requests NVLink multicast. NCCL only: Error(kUnsupported) in loopback.
  DeviceComm create_device_comm(int lsa_barrier_count);
  // Collective: returns when every rank has called it (NCCL: an all-reduce, then a bounded wait for
  // it; loopback: a host barrier).
  void barrier();
  // The bound on this communicator's host collectives (NCCL; loopback: the world's timeout). Past it
  // an NCCL collective aborts the communicator (abort()) and throws Error(kTimeout) "rank R: <what>
  // timed out after N ms: a rank never joined (dead, stalled or in another collective); the
  // communicator is aborted".
  std::chrono::milliseconds collective_timeout() const { return collective_timeout_; }
  // NCCL: waits on the host for `stream`, whose work includes NCCL operations of this communicator,
  // at most collective_timeout(); on the timeout or an asynchronous NCCL error it aborts the
  // communicator and throws (Error(kTimeout) / kNccl, "rank R: <what> ..."). Spins for the first
  // 2 ms (as cudaStreamSynchronize would), then polls. Loopback: cudaStreamSynchronize.
  void wait_bounded(CUstream_st* stream, const char* what);

  // Host collectives (every rank calls, in the same order, with the same count); they use the
  // communicator's own stream and scratch, never the caller's stream, and return on the host.
  // Every rank's `local`, rank-major.
  std::vector<double> all_gather(std::span<const double> local);
  // The largest value over ranks; NaN if any rank's is NaN.
  double all_reduce_max(double local);
  // The sum over ranks.
  int64_t all_reduce_sum(int64_t local);

 private:
  friend class LoopbackWorld;  // makes loopback communicators
  Communicator();  // out of line: backend_'s type is complete only in src/comm

  // What the accessors above return; fixed at construction.
  Transport transport_ = Transport::kNccl;
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int world_size_ = 1;
  int device_ = 0;
  std::chrono::milliseconds collective_timeout_{300000};
  // The transport's implementation, chosen once at construction; every collective, abort and
  // allocation forwards to it.
  std::unique_ptr<detail::CommBackend> backend_;
};

// Every rank of a world of world_size ranks inside this process, on one GPU (Transport::kLoopback):
// the multi-rank protocol testable at any world size on a machine with one GPU. One host thread per
// rank does what one process does with an NCCL communicator (create the layer, forward,
// check_errors, destroy), each rank on its own stream. Timing in this mode means nothing.
//
// Host collectives (barrier, all_gather, all_reduce_*, alloc_symmetric) wait at most `timeout` for
// the slowest rank, then throw Error(kTimeout) naming the ranks that did not arrive; after abort()
// (or a timeout) every rank's current and later collective throws Error(kAborted) naming the rank
// that failed and why, so no thread waits for a rank that has given up.
//
// Hardware queues: the GPU runs the kernels of at most CUDA_DEVICE_MAX_CONNECTIONS streams side by
// side (default 8, at most 32); with fewer queues than ranks two ranks' forwards can share one, and the
// second waits for the first, which waits for it. The constructor sets CUDA_DEVICE_MAX_CONNECTIONS=32
// unless it is set; CUDA reads it when it creates the process's context, so construct the world (or
// set it) before the first CUDA call. The fused layer refuses a loopback world larger than the value.
//
// The GPU is shared: a CUDA call that synchronises the whole device (cudaFree, cudaMalloc,
// cudaDeviceSynchronize, synchronous cudaMemcpy/cudaMemset) on one rank's thread waits for every
// rank's kernels, and a rank's forward waits on the device for its peers' forwards. So a thread that
// makes such a call while a peer's forward is in flight and before making its own forward deadlocks
// until the device-side timeout. Put barrier() between such calls and the forward (run's `epfuse run
// --one-gpu` and the GPU tests do), or use stream-ordered allocation.
class LoopbackWorld {
 public:
  static constexpr int kMaxConnections = 32;  // CUDA's largest CUDA_DEVICE_MAX_CONNECTIONS

  // Throws Error(kInvalidArgument) for world_size < 1 or > kMaxConnections, device < 0 or timeout
  // < 1 ms. Touches no GPU.
  LoopbackWorld(int world_size, int device, std::chrono::milliseconds timeout = std::chrono::milliseconds(120000));
  ~LoopbackWorld();
  LoopbackWorld(const LoopbackWorld&) = delete;
  LoopbackWorld& operator=(const LoopbackWorld&) = delete;

  int world_size() const;
  int device() const;

  // The communicator of `rank` (once per rank; Error(kInvalidArgument) for a rank out of range or
  // taken twice). It may outlive the world object (the shared state is reference-counted).
  std::unique_ptr<Communicator> communicator(int rank);
  // Marks the world failed; see above. The first abort's rank and reason are kept.
  void abort(int rank, const std::string& why);
  bool aborted() const;

  // Runs fn(comm) once per rank, each on its own thread with that rank's communicator (the thread's
  // CUDA device set to device()), and returns when all have returned. A rank whose fn throws aborts
  // the world, so the others' host collectives fail instead of waiting for it. Returns each rank's
  // error message ("" for a rank that succeeded), indexed by rank.
  std::vector<std::string> run(const std::function<void(Communicator&)>& fn);

 private:
  std::shared_ptr<detail::LoopbackHub> hub_;
};

}  // namespace epfuse
