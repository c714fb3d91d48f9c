// Which fused workspaces take turns with each other (common/stream_turn.h), as a pure function for
// the CPU tests: the key of the turn a workspace shares with the others of its key.
#pragma once
#include <utility>

namespace epfuse::fused {

// Under NCCL (one rank per GPU) every workspace of a GPU shares one turn (rank -1): each kernel needs
// all its CTAs resident at once and waits for the peers' kernels, so two running together on one GPU
// could hold SMs the other waits for, and ranks that ran them in different orders would each wait for
// the other's. Taking turns in the order their forwards were issued, every rank issuing them in the
// same order (as for any collective), leaves one kernel at a time per GPU. In the one-GPU mode the
// ranks' kernels must run together (each has SMs / R): one turn per rank of the GPU there.
inline std::pair<int, int> workspace_turn_key(int device, bool one_gpu_mode, int rank) {
  return {device, one_gpu_mode ? rank : -1};
}

}  // namespace epfuse::fused
