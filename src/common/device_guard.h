// Internal: the one device guard. Streams, allocations, events and enqueues act on the current device,
// which need not be the communicator's when the caller switched (or when one process drives several
// GPUs); a DeviceGuard selects a device for a scope and gives the caller's back at its end.
#pragma once

namespace epfuse::detail {

class DeviceGuard {
 public:
  // Makes `device` current. A failed query or switch throws epfuse::Error(kCuda) with CUDA's message,
  // prefixed "rank <rank>: " when rank >= 0 (as the communicator's errors are).
  explicit DeviceGuard(int device, int rank = -1);
  ~DeviceGuard();  // restores the caller's device; never throws
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

}  // namespace epfuse::detail
