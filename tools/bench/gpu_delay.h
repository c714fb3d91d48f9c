// A GPU-side delay ahead of each timed forward (worker.cpp): the stream is busy for `microseconds`
// while the host does the forward's launch work, so the start event, queued behind the delay, fires
// when the GPU reaches the forward's own work rather than when the host began preparing it.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace epfuse::bench {

// The lead every timed call gets: longer than the host's launch work of one forward (a few to tens of
// microseconds), short against the rows' times. The PyTorch peer (bench/peers/torch_ep.py) uses the same.
inline constexpr uint32_t kLaunchLeadUs = 200;

// One thread spinning on %globaltimer on `stream` for `microseconds`; checks the launch.
void gpu_delay(cudaStream_t stream, uint32_t microseconds);

}  // namespace epfuse::bench
