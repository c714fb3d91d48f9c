// Which fused workspaces take turns with each other (common/stream_turn.h), as a pure function for
// the CPU tests: the key of the turn a workspace shares with the others of its key.
#pragma once
#include <cstdint>
#include <utility>

namespace epfuse::fused {

// Under NCCL (one rank per GPU) every workspace of a GPU shares one turn: each kernel needs all its
// CTAs resident at once and waits for the peers' kernels, so two running together on one GPU could
// hold SMs the other waits for, and ranks that ran them in different orders would each wait for the
// other's. Taking turns in the order their forwards were issued, every rank issuing them in the same
// order (as for any collective), leaves one kernel at a time per GPU.
//
// In the one-GPU mode the ranks of a world share the GPU and their kernels must run side by side
// (each has SMs / R): a turn is never shared by two ranks, of one world or of two. Each rank's
// workspaces share the turn of the rank's communicator (`rank_comm`, its address), so that one
// rank's kernels of two workspaces run one at a time while its peers' run beside them.
inline std::pair<int, uintptr_t> workspace_turn_key(int device, bool one_gpu_mode, const void* rank_comm) {
  return {device, one_gpu_mode ? reinterpret_cast<uintptr_t>(rank_comm) : uintptr_t{0}};
}

}  // namespace epfuse::fused
