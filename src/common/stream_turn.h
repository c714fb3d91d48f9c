// Internal: the order of forwards that share device buffers (a fused workspace, a padded layer's
// staging rows), across host threads, streams and CUDA graphs.
//
// A forward takes the turn for as long as it enqueues: a mutex (so that a second host thread waits
// rather than interleaving its wait-then-record with this one, or reading half-updated host state),
// plus an event: the forward's stream waits for the previous forward's work, whatever its stream, and
// records the event after its own. Inside a stream capture the wait and the record become external
// event nodes of the graph (cudaEventWaitExternal, cudaEventRecordExternal), so that every replay of
// the graph waits for the forward issued before the replay and the next forward waits for the replay:
// an eager forward on another stream cannot overlap a replay in flight.
//
// Serialising (rather than refusing a second caller) is what a multi-threaded engine needs: two
// threads forwarding on one workspace both get correct rows, in the order they took the turn.
//
// The event is made with the turn, never by a forward: in the one-GPU mode a rank's forward comes
// after a barrier with its peers, whose kernels then wait on the device for this rank's launch, so
// between that barrier and the launch nothing may wait for the device (LoopbackWorld), and making an
// event may (docs/performance.md, "Faults seen while timing"). Turns are made at creation.
#pragma once
#include <cstddef>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include <cuda_runtime.h>

namespace epfuse::detail {

class StreamTurn {
 public:
  // Makes the event on the current device (call it under the device's guard, inside a creation).
  // Throws Error(kCuda).
  StreamTurn();
  // The host half alone (hold()), without an event: take() on it throws Error(kInternal).
  explicit StreamTurn(std::nullptr_t) {}
  ~StreamTurn();  // destroys the event; never throws
  StreamTurn(const StreamTurn&) = delete;
  StreamTurn& operator=(const StreamTurn&) = delete;

  // One forward's turn: holds the mutex until it goes. Work enqueued on `stream` after take() runs after
  // the previous holder's work; done() marks this holder's work (enqueued by then) for the next one. A
  // holder that goes without done() (it threw before launching) leaves the previous mark in place.
  class Held {
   public:
    Held(Held&&) = default;
    Held& operator=(Held&&) = default;
    void done();
    bool capturing() const { return capturing_; }

   private:
    friend class StreamTurn;
    Held(StreamTurn& turn, std::unique_lock<std::mutex> lock, cudaStream_t stream, bool capturing)
        : turn_(&turn), lock_(std::move(lock)), stream_(stream), capturing_(capturing) {}
    StreamTurn* turn_;
    std::unique_lock<std::mutex> lock_;
    cudaStream_t stream_;
    bool capturing_;
  };

  // Blocks while another thread holds the turn, then orders `stream` after the previous holder's
  // work (on the current device: call it under the device's guard). Makes nothing and waits for
  // nothing on the device: stream-ordered calls only. Throws Error(kCuda), or Error(kInternal) on a
  // turn made without its event.
  Held take(cudaStream_t stream);
  // The mutex alone, for host state the forwards also touch (phase timing, lazily made buffers).
  std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(mutex_); }

 private:
  std::mutex mutex_;
  cudaEvent_t last_ = nullptr;  // made by the constructor, on its device
};

// The turns shared by key, each alive while someone holds it: turn(k) returns the living turn of k,
// or a new one (made there: call it where a StreamTurn may be made). The fused workspaces use it for
// one turn per GPU, or per rank in the one-GPU mode (README "Threads and streams"). Turn is a
// parameter for the CPU tests.
template <typename Key, typename Turn = StreamTurn>
class SharedTurns {
 public:
  std::shared_ptr<Turn> turn(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::weak_ptr<Turn>& slot = turns_[key];
    std::shared_ptr<Turn> living = slot.lock();
    if (!living) {
      living = std::make_shared<Turn>();
      slot = living;
    }
    // Forget keys whose turns are gone, so that the map stays as small as the living turns.
    for (auto it = turns_.begin(); it != turns_.end();) it = it->second.expired() ? turns_.erase(it) : std::next(it);
    return living;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (const auto& [key, weak] : turns_) n += weak.expired() ? 0 : 1;
    return n;
  }

 private:
  std::mutex mutex_;
  std::map<Key, std::weak_ptr<Turn>> turns_;
};

}  // namespace epfuse::detail
