// Internal: the state the ranks of a LoopbackWorld share (epfuse/communicator.h). Every host
// collective of the one-GPU transport is one exchange() here: each rank's thread deposits its bytes,
// the last to arrive publishes every rank's contribution, and all of them return with a copy.
// Waits are bounded by the world's timeout; a timeout or abort() fails the world for good, so no
// rank's thread waits for a rank that has given up.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace epfuse::detail {

class LoopbackHub {
 public:
  // What one rank brings to an exchange, and what every rank gets back (one per rank, rank-major).
  // `handle` carries shared ownership across ranks (alloc_symmetric's allocation); null otherwise.
  struct Contribution {
    std::vector<std::byte> bytes;
    std::shared_ptr<void> handle;
  };

  // Checks nothing: LoopbackWorld validates the arguments before it makes a hub.
  LoopbackHub(int world_size, int device, std::chrono::milliseconds timeout);
  LoopbackHub(const LoopbackHub&) = delete;
  LoopbackHub& operator=(const LoopbackHub&) = delete;

  int world_size() const { return world_size_; }
  int device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Marks `rank` handed out; Error(kInvalidArgument) for a rank outside the world or taken before.
  void claim(int rank);

  // Collective: returns every rank's `mine`, rank-major, once all world_size() ranks have called.
  // `what` names the collective in errors (ranks must call the same ones in the same order; a
  // different `what` from two ranks in one round is an Error(kInvalidArgument) that fails the world).
  // Throws Error(kTimeout) naming the ranks that had not arrived when the timeout passed (and fails
  // the world), or Error(kAborted) once the world has failed.
  std::vector<std::vector<std::byte>> exchange(int rank, const char* what, std::span<const std::byte> mine);
  // exchange() with a shared-ownership handle alongside the bytes.
  std::vector<Contribution> exchange(int rank, const char* what, Contribution mine);

  // Fails the world: every waiting and later exchange throws Error(kAborted) "rank R: <what>: rank
  // F failed: <why>". Only the first call counts.
  void abort(int rank, const std::string& why);
  bool aborted() const;

 private:
  [[noreturn]] void throw_aborted(int rank, const char* what) const;  // under mutex_
  // Under mutex_: records the first failure and wakes every waiter; returns what the caller
  // destroys after unlocking (handles whose deleters call into CUDA must not run under the lock).
  std::vector<Contribution> fail(int rank, const std::string& why);

  const int world_size_;
  const int device_;
  const std::chrono::milliseconds timeout_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<bool> claimed_;

  // The round being gathered: its number, who has deposited, their contributions, the first
  // rank's `what`.
  uint64_t round_ = 0;
  int arrived_ = 0;
  std::vector<bool> present_;
  std::vector<Contribution> deposits_;
  std::string round_what_;

  // The last completed round's result and how many ranks have yet to copy it.
  std::vector<Contribution> published_;
  int copies_left_ = 0;

  // The first failure: the rank that reported it and why. A timeout also keeps its round and message
  // so that every rank waiting in that round reports the same timeout.
  bool aborted_ = false;
  int failed_rank_ = -1;
  std::string failed_why_;
  bool timed_out_ = false;
  uint64_t timed_out_round_ = 0;
  std::string timed_out_text_;  // "<what> timed out after N ms waiting for rank(s) A, B"
};

}  // namespace epfuse::detail
