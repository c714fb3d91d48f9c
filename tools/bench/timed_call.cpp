#include "bench/timed_call.h"

#include "bench/gpu_delay.h"
#include "common/check.h"

namespace epfuse::bench {

void start_together(Communicator& comm, cudaStream_t stream) {
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  comm.barrier();
  gpu_delay(stream, kLaunchLeadUs);
}

Summary slowest_rank(Communicator& comm, const std::vector<double>& ms) {
  return summarize(max_over_ranks(comm.all_gather(ms), comm.world_size()));
}

}  // namespace epfuse::bench
