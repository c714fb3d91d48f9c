// The one-GPU world's shared state (loopback_hub.h): rounds of deposits under one mutex.
//
// Why a fast rank cannot overwrite a result a slow rank still needs: the last arrival of round g
// moves the deposits into published_ and starts round g+1 with empty deposits, so a rank that
// returns early and enters round g+1 writes only into deposits_, never into published_. published_
// is replaced only when round g+1 completes, which needs every rank's g+1 deposit, and a rank
// deposits for g+1 only after it has copied g's result (copies_left_ counts them). The last copier
// drops published_, so no allocation handed through an exchange stays alive in the hub.
#include "comm/loopback_hub.h"

#include <utility>

#include "epfuse/error.h"

namespace epfuse::detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string prefix(int rank) { return "rank " + std::to_string(rank) + ": "; }

// "A, B": the ranks not marked in `present`.
std::string absent_ranks(const std::vector<bool>& present) {
  std::string out;
  for (size_t r = 0; r < present.size(); ++r) {
    if (present[r]) continue;
    if (!out.empty()) out += ", ";
    out += std::to_string(r);
  }
  return out;
}

}  // namespace

LoopbackHub::LoopbackHub(int world_size, int device, std::chrono::milliseconds timeout)
    : world_size_(world_size),
      device_(device),
      timeout_(timeout),
      claimed_(static_cast<size_t>(world_size), false),
      present_(static_cast<size_t>(world_size), false),
      deposits_(static_cast<size_t>(world_size)) {}

void LoopbackHub::claim(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank < 0 || rank >= world_size_) {
    throw Error(ErrorCode::kInvalidArgument, prefix(rank) + "LoopbackWorld::communicator: the world has ranks [0, " +
                                                 std::to_string(world_size_) + ")");
  }
  if (claimed_[static_cast<size_t>(rank)]) {
    throw Error(ErrorCode::kInvalidArgument,
                prefix(rank) + "LoopbackWorld::communicator: this rank's communicator was already handed out");
  }
  claimed_[static_cast<size_t>(rank)] = true;
}

std::vector<std::vector<std::byte>> LoopbackHub::exchange(int rank, const char* what,
                                                          std::span<const std::byte> mine) {
  std::vector<Contribution> all = exchange(rank, what, Contribution{{mine.begin(), mine.end()}, nullptr});
  std::vector<std::vector<std::byte>> out;
  out.reserve(all.size());
  for (Contribution& c : all) out.push_back(std::move(c.bytes));
  return out;
}

std::vector<LoopbackHub::Contribution> LoopbackHub::exchange(int rank, const char* what, Contribution mine) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  std::vector<Contribution> released;  // declared before the lock: destroyed after it is released
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) throw_aborted(rank, what);
  if (rank < 0 || rank >= world_size_) {
    throw Error(ErrorCode::kInternal, prefix(rank) + what + ": rank outside the one-GPU world of " +
                                          std::to_string(world_size_));
  }
  const size_t me = static_cast<size_t>(rank);
  if (present_[me] || (arrived_ > 0 && round_what_ != what)) {
    // Two threads on one rank, or ranks calling collectives in different orders: the results would
    // be garbage, so the world fails here rather than later.
    const std::string why =
        present_[me] ? std::string(what) + " was called again on this rank while its previous call waits"
                     : std::string(what) + " met " + round_what_ + " of another rank (every rank must make the "
                                                                   "same collective calls in the same order)";
    released = fail(rank, why);
    throw Error(ErrorCode::kInvalidArgument, prefix(rank) + why);
  }
  if (arrived_ == 0) round_what_ = what;
  present_[me] = true;
  deposits_[me] = std::move(mine);
  const uint64_t my_round = round_;
  if (++arrived_ == world_size_) {
    published_ = std::exchange(deposits_, std::vector<Contribution>(static_cast<size_t>(world_size_)));
    copies_left_ = world_size_;
    present_.assign(present_.size(), false);
    arrived_ = 0;
    ++round_;
    cv_.notify_all();
  } else {
    cv_.wait_until(lock, deadline, [&] { return round_ != my_round || aborted_; });
  }

  if (round_ == my_round) {  // not completed: failed while we waited, or our deadline passed
    if (aborted_) {
      if (timed_out_ && timed_out_round_ == my_round) {
        throw Error(ErrorCode::kTimeout, prefix(rank) + "one-GPU world: " + timed_out_text_);
      }
      throw_aborted(rank, what);
    }
    timed_out_text_ = std::string(what) + " timed out after " + std::to_string(timeout_.count()) +
                      " ms waiting for rank(s) " + absent_ranks(present_);
    timed_out_ = true;
    timed_out_round_ = my_round;
    released = fail(rank, timed_out_text_);
    throw Error(ErrorCode::kTimeout, prefix(rank) + "one-GPU world: " + timed_out_text_);
  }
  std::vector<Contribution> out = published_;
  if (--copies_left_ == 0) released = std::move(published_);
  return out;
}

void LoopbackHub::abort(int rank, const std::string& why) {
  std::vector<Contribution> released;
  std::lock_guard<std::mutex> lock(mutex_);
  if (aborted_) return;
  // LoopbackWorld::run passes messages that already start with the rank; the abort text names it once.
  const std::string own = prefix(rank);
  released = fail(rank, why.compare(0, own.size(), own) == 0 ? why.substr(own.size()) : why);
}

bool LoopbackHub::aborted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return aborted_;
}

std::vector<LoopbackHub::Contribution> LoopbackHub::fail(int rank, const std::string& why) {
  if (!aborted_) {
    aborted_ = true;
    failed_rank_ = rank;
    failed_why_ = why;
    cv_.notify_all();
  }
  // The round will never complete: its deposits (a handle among them) are of no use to anyone.
  return std::exchange(deposits_, std::vector<Contribution>(static_cast<size_t>(world_size_)));
}

void LoopbackHub::throw_aborted(int rank, const char* what) const {
  throw Error(ErrorCode::kAborted,
              prefix(rank) + what + ": rank " + std::to_string(failed_rank_) + " failed: " + failed_why_);
}

}  // namespace epfuse::detail
