// LoopbackWorld (epfuse/communicator.h): every rank of a world in this process, one host thread per
// rank, their collectives through one shared LoopbackHub. Each rank's Communicator forwards to a
// LoopbackBackend (loopback_backend.cpp).
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "comm/comm_backend.h"
#include "comm/loopback_hub.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

using detail::rank_prefix;

// Selects the world's GPU on a rank's thread where there is one. Without one (CPU tests) the rank
// runs without a device: the host collectives need none, and the runtime's error is cleared so that
// the rank's own CUDA calls do not report it.
void use_device(int device, int rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return;
  }
  if (device >= count) return;
  const cudaError_t err = cudaSetDevice(device);
  if (err != cudaSuccess) {
    throw Error(ErrorCode::kCuda, rank_prefix(rank) + "cudaSetDevice(" + std::to_string(device) +
                                      ") failed: " + cudaGetErrorString(err) + " (" + cudaGetErrorName(err) + ")");
  }
}

}  // namespace

LoopbackWorld::LoopbackWorld(int world_size, int device, std::chrono::milliseconds timeout) {
  auto fail = [](const std::string& why) { throw Error(ErrorCode::kInvalidArgument, "LoopbackWorld: " + why); };
  if (world_size < 1) fail("world_size=" + std::to_string(world_size) + " must be at least 1");
  if (world_size > kMaxConnections)
    fail("world_size=" + std::to_string(world_size) + " exceeds " + std::to_string(kMaxConnections) +
         " (a GPU runs at most that many streams' kernels side by side: CUDA_DEVICE_MAX_CONNECTIONS)");
  if (device < 0) fail("device=" + std::to_string(device) + " must not be negative");
  if (timeout.count() < 1) fail("timeout=" + std::to_string(timeout.count()) + " ms must be at least 1 ms");
  hub_ = std::make_shared<detail::LoopbackHub>(world_size, device, timeout);
  // Every rank's forward needs a hardware queue of its own (see the class comment); effective only when
  // the process has no CUDA context yet.
  ::setenv("CUDA_DEVICE_MAX_CONNECTIONS", std::to_string(kMaxConnections).c_str(), /*overwrite=*/0);
}

LoopbackWorld::~LoopbackWorld() = default;

int LoopbackWorld::world_size() const { return hub_->world_size(); }

int LoopbackWorld::device() const { return hub_->device(); }

std::unique_ptr<Communicator> LoopbackWorld::communicator(int rank) {
  hub_->claim(rank);
  std::unique_ptr<Communicator> comm(new Communicator());
  comm->transport_ = Transport::kLoopback;
  comm->rank_ = rank;
  comm->world_size_ = hub_->world_size();
  comm->device_ = hub_->device();
  comm->backend_ = detail::make_loopback_backend(hub_, rank);
  return comm;
}

void LoopbackWorld::abort(int rank, const std::string& why) { hub_->abort(rank, why); }

bool LoopbackWorld::aborted() const { return hub_->aborted(); }

std::vector<std::string> LoopbackWorld::run(const std::function<void(Communicator&)>& fn) {
  const int world = world_size();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int rank = 0; rank < world; ++rank) comms.push_back(communicator(rank));
  std::vector<std::string> errors(static_cast<size_t>(world));
  // A rank that fails aborts the world, so its peers' collectives throw instead of waiting for it.
  auto fail = [&](int rank, std::string why) {
    if (why.rfind("rank ", 0) != 0) why = rank_prefix(rank) + why;
    abort(rank, why);
    errors[static_cast<size_t>(rank)] = std::move(why);
  };
  auto run_rank = [&](int rank) {
    try {
      use_device(device(), rank);
      fn(*comms[static_cast<size_t>(rank)]);
    } catch (const std::exception& e) {
      fail(rank, e.what());
    } catch (...) {
      fail(rank, "an exception not derived from std::exception");
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int rank = 0; rank < world; ++rank) {
    try {
      threads.emplace_back(run_rank, rank);
    } catch (const std::system_error& e) {
      // The ranks already started must not wait for those that never will.
      for (int missing = rank; missing < world; ++missing) {
        fail(missing, std::string("could not start the rank's thread: ") + e.what());
      }
      break;
    }
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

}  // namespace epfuse
