// A kernel that leaves a byte pattern in the shared memory of every SM. Shared memory is not cleared
// between kernels: a fused kernel launched after it that read shared memory it had not written in its
// own launch (a plan copy, a row table, a ring stage, a queue slot) would compute with the pattern, and
// a check after it fails however rarely the previous kernels' leftovers happen to be wrong
// (tests/gpu/fused/test_gpu_fused_fp8.cpp).
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace epfuse::testing {

// Loads the kernel and gives it the SM's whole shared memory (the largest dynamic shared memory a block
// may opt into, the carveout all shared memory), on the current device. Call before the ranks' first
// forward: in the one-GPU mode a kernel loaded or configured later could wait for the other ranks'
// running kernels (LoopbackWorld on device-synchronising calls), which wait for this rank.
void prepare_shared_memory_fill();  // and the reader shared_words_not

// On `stream`: one block per SM (a block that large fits one per SM, so the grid covers every SM), each
// filling its shared memory with `byte`. Checks the launch; synchronises nothing.
void fill_shared_memory(uint8_t byte, cudaStream_t stream);

// What makes the fill worth anything: the pattern is still there for the next kernel. On `stream`, a
// kernel shaped as the fill's (one block per SM, the whole shared memory) counts the 32-bit words of its
// shared memory, read before it writes any, that are not four `byte`s; synchronises the stream and
// returns the count and the words read.
struct SharedWords {
  long long differing = 0, read = 0;
};
SharedWords shared_words_not(uint8_t byte, cudaStream_t stream);

}  // namespace epfuse::testing
