// The timing protocol every GPU row shares (bench/README.md "Protocol"): how the ranks start each timed
// call together, and how one figure is made of every rank's times.
#pragma once
#include <vector>

#include <cuda_runtime.h>

#include "bench/stats.h"
#include "epfuse/communicator.h"

namespace epfuse::bench {

// Before each timed call, outside its events: the stream drained, the ranks met, and the GPU delay
// queued (gpu_delay.h), so that the start event fires when the GPU reaches the call.
void start_together(Communicator& comm, cudaStream_t stream);

// Collective: per iteration the slowest rank, then statistics over iterations.
Summary slowest_rank(Communicator& comm, const std::vector<double>& ms);

}  // namespace epfuse::bench
