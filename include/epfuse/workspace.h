// epfuse/workspace.h: the device buffers every fused layer of a model shares.
#pragma once
#include <memory>
#include <string>

#include "epfuse/config.h"
#include "epfuse/layer.h"

namespace epfuse {

class Communicator;

// The symmetric window peers write into, the control block (the call epoch, counters, the error
// record) and the private scratch of the fused layer, sized once for the largest layer that will use
// them (`capacity`: every field of a layer's config at most the capacity's; num_experts too, and so
// experts per rank). One per communicator: a model's layers share it and hold only their borrowed
// weights and a few scalars (MoeLayer::create(cfg, workspace, weights)).
//
// Layers on a workspace take turns: each forward is ordered after the previous forward of any layer
// on it, on whatever stream and from whatever host thread (a second thread waits while the first
// enqueues; the workspace records an event after each launch and the next launch waits for it; a
// forward captured in a CUDA graph holds that wait and record as external event nodes, so replays and
// eager forwards are ordered too). Two forwards on one workspace never run at once, and under NCCL
// neither do two fused workspaces of one GPU in a process: their kernels each need every SM they were
// given resident at once. At world > 1 every rank must issue forwards of different layers or
// workspaces in the same order (README "Threads and streams").
//
// The call state (epoch, parity, counters) lives on the device and the kernel advances it, so a
// forward captured in a CUDA graph replays correctly any number of times with new inputs written into
// the captured buffers. After a device error (an expert id out of range, a peer that never arrived)
// the workspace is failed for good: every later forward of any of its layers throws, and a forward
// replayed in a graph fills y with NaN instead of returning stale values, until the workspace is
// re-created (collectively, after its layers are destroyed).
class Workspace {
 public:
  // Collective: every rank creates its workspace with the same capacity. Throws
  // Error(kInvalidConfig) for a capacity the fused kernel cannot run.
  // Environment: EPFUSE_TIMEOUT_MS bounds every device-side wait (default 20000).
  static std::unique_ptr<Workspace> create(Communicator& comm, const LayerConfig& capacity);
  virtual ~Workspace() = default;

  virtual const LayerConfig& capacity() const = 0;
  virtual Communicator& comm() const = 0;
  // The device memory the workspace holds (every layer on it adds only its own weights).
  virtual MemoryFootprint memory() const = 0;
  // "" when a layer of `cfg` fits this workspace; otherwise "field=value exceeds the workspace's N".
  virtual std::string check_fits(const LayerConfig& cfg) const = 0;
  // Whether a device error (or bad input) has made the workspace unusable.
  virtual bool failed() const = 0;
};

}  // namespace epfuse
