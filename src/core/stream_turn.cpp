// StreamTurn (common/stream_turn.h).
#include "common/stream_turn.h"

#include "common/check.h"

namespace epfuse::detail {

StreamTurn::StreamTurn() { EPFUSE_CUDA_CHECK(cudaEventCreateWithFlags(&last_, cudaEventDisableTiming)); }

StreamTurn::~StreamTurn() {
  if (last_ != nullptr) cudaEventDestroy(last_);  // destructor: nothing to report an error to
}

StreamTurn::Held StreamTurn::take(cudaStream_t stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Never made here (see the header): a forward's turn must not wait for the device.
  EPFUSE_REQUIRE(last_ != nullptr, ErrorCode::kInternal, "a forward's turn has no event (a turn is made with its workspace)");
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  EPFUSE_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  const bool capturing = status != cudaStreamCaptureStatusNone;
  // In a capture a plain wait on an event recorded outside it is an error; the external wait is a node
  // that waits, at each replay, for the event's last record before that replay.
  EPFUSE_CUDA_CHECK(cudaStreamWaitEvent(stream, last_, capturing ? cudaEventWaitExternal : cudaEventWaitDefault));
  return Held(*this, std::move(lock), stream, capturing);
}

void StreamTurn::Held::done() {
  EPFUSE_CUDA_CHECK(cudaEventRecordWithFlags(turn_->last_, stream_,
                                             capturing_ ? cudaEventRecordExternal : cudaEventRecordDefault));
}

}  // namespace epfuse::detail
