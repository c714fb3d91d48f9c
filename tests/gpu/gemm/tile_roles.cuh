// What the tile tests and benchmarks that run a warp-specialised tile under its own roles share: the
// record of a ring wait that ran out, and the sink that keeps a k-loop's accumulators live when nothing
// stores them.
#pragma once
#include <cstdint>

namespace epfuse::testing {

// A ring wait of `side` (0 producer, 1 math) ran out at `tile`: the first failure is kept in
// error[0..2] = {1 + side, tile, CTA}, and the abort flag ends the other role's waits too.
__device__ inline void record_ring_failure(uint32_t* error, uint32_t* abort, int side, int tile) {
  if (atomicCAS(error, 0u, 1u + side) == 0) {
    error[1] = tile;
    error[2] = blockIdx.x;
  }
  atomicExch(abort, 1u);
}

// The accumulators stay live (ptxas would drop MMAs whose results nothing reads): their sum is written
// to *sink only for a value no run produces, so nothing is ever stored.
template <int kRegs, class T>
__device__ inline void keep_live(const float (&acc)[kRegs], T* sink) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kRegs; ++i) sum += acc[i];
  if (sum == -1.2345e-38f) *sink = static_cast<T>(sum);
}

}  // namespace epfuse::testing
