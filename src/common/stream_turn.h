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
  StreamTurn() = default;
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
  // work (on the current device: call it under the device's guard). Throws Error(kCuda).
  Held take(cudaStream_t stream);
  // The mutex alone, for host state the forwards also touch (phase timing, lazily made buffers).
  std::unique_lock<std::mutex> hold() { return std::unique_lock<std::mutex>(mutex_); }

 private:
  std::mutex mutex_;
  cudaEvent_t last_ = nullptr;  // made by the first take(), on its device
};

// The turns shared by key, each alive while someone holds it: turn(k) returns the living turn of k,
// or a new one. The fused workspaces use it for one turn per GPU (README "Threads and streams").
template <typename Key>
class SharedTurns {
 public:
  std::shared_ptr<StreamTurn> turn(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::weak_ptr<StreamTurn>& slot = turns_[key];
    std::shared_ptr<StreamTurn> living = slot.lock();
    if (!living) {
      living = std::make_shared<StreamTurn>();
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
  std::map<Key, std::weak_ptr<StreamTurn>> turns_;
};

}  // namespace epfuse::detail
