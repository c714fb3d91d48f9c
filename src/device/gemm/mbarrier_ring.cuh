// The operand ring of the warp-specialised tile GEMMs (gemm_mainloop_tma.cuh bf16, gemm_mainloop_tma_fp8.cuh
// FP8): kStages stages in shared memory, each guarded by two mbarriers,
//   full[s]:  the stage's operands arrived (kFullArrivals arrivals: the producer threads' cp.async
//             arrivals and the TMA thread's expect_tx arrival, whose bytes the phase also waits for);
//   empty[s]: the math warps finished reading it (kEmptyArrivals arrivals: one per math warp).
// Both sides count the k-blocks they passed since init() (RingPos, carried from tile to tile in a
// register): k-block kb uses stage kb % kStages in round kb / kStages. The barriers sit at byte
// kBarrierOffset of the tile's dynamic shared memory, full[kStages] then empty[kStages].
// Only index arithmetic, the waits, a math warp's pass over stages it does not read, and the producer's
// issue ahead of a tile's other operands (and its drain when they never come): what a stage
// holds and who fills it is the tile's business.
#pragma once
#include <cstdint>

#include "device/ptx/mbarrier.cuh"
#include "device/ptx/ptx.cuh"
#include "device/ptx/spin_wait.cuh"

namespace epfuse::device {

// A side's position in the ring: k-blocks it has passed since init().
struct RingPos {
  uint32_t kb = 0;
};

template <int kStages, int kBarrierOffset, int kFullArrivals, int kEmptyArrivals>
struct MbarRing {
  static constexpr int kBarrierBytes = 2 * kStages * 8;

  __device__ static uint32_t full_bar(uint32_t smem, int s) { return smem + kBarrierOffset + 8u * s; }
  __device__ static uint32_t empty_bar(uint32_t smem, int s) { return smem + kBarrierOffset + 8u * (kStages + s); }
  __device__ static int stage(const RingPos& pos) { return static_cast<int>(pos.kb % kStages); }

  // Once per launch, by the whole CTA, before the first tile (synchronises the CTA).
  __device__ static void init(void* smem) {
    if (threadIdx.x == 0) {
      const uint32_t base = ptx::smem_u32(smem);
      for (int s = 0; s < kStages; ++s) {
        ptx::mbar_init(full_bar(base, s), kFullArrivals);
        ptx::mbar_init(empty_bar(base, s), kEmptyArrivals);
      }
      ptx::fence_mbar_init();
    }
    __syncthreads();
  }

  // Producer: until stage(pos) is free for k-block pos.kb. Round r of a stage waits for the release
  // of round r - 1 (a fresh barrier passes parity 1). False when the wait ran out (ptx/spin_wait.cuh).
  __device__ static bool wait_free(uint32_t smem, const RingPos& pos, const WaitLimit& limit) {
    return mbar_wait(empty_bar(smem, stage(pos)), ((pos.kb / kStages) & 1u) ^ 1u, limit);
  }
  // Math: until stage(pos) holds k-block pos.kb.
  __device__ static bool wait_full(uint32_t smem, const RingPos& pos, const WaitLimit& limit) {
    return mbar_wait(full_bar(smem, stage(pos)), (pos.kb / kStages) & 1u, limit);
  }
  // Producer, one thread: issue(stage, i) for the next n k-blocks from pos (i = 0 .. n - 1), each once
  // its stage is free; pos is not advanced (the tile's loader adds the rest of those stages later).
  // False when a wait ran out.
  template <class Issue>
  __device__ static bool issue_ahead(uint32_t smem, RingPos pos, int n, const WaitLimit& limit, Issue issue) {
    for (int i = 0; i < n; ++i, ++pos.kb) {
      if (!wait_free(smem, pos, limit)) return false;
      issue(stage(pos), i);
    }
    return true;
  }
  // Every producer thread, after issue_ahead for stages whose other operands will never come: arrives
  // on them in place of its copies (a cp.async arrival, as the loaders') and waits for their phases, so
  // that no bulk copy into shared memory outlives the CTA. The ring is not used again.
  __device__ static void drain_ahead(uint32_t smem, RingPos pos, int n, const WaitLimit& limit) {
    for (int i = 0; i < n; ++i, ++pos.kb) {
      ptx::cp_async_mbar_arrive_noinc(full_bar(smem, stage(pos)));
      mbar_wait(full_bar(smem, stage(pos)), (pos.kb / kStages) & 1u, limit);
    }
  }

  // Math warp that reads none of the next num_kb k-blocks (its rows of the tile are all padding): waits
  // for each and releases it at once (`arrives`: the thread is one of the stage's empty arrivals: a
  // warp's lane 0 where a warp arrives once, every thread where each does), so that its position and its
  // share of every release stay in step with the warps that do read them. False when a wait ran out.
  __device__ static bool pass(uint32_t smem, RingPos& pos, int num_kb, bool arrives, const WaitLimit& limit) {
    for (int kb = 0; kb < num_kb; ++kb, ++pos.kb) {
      if (!wait_full(smem, pos, limit)) return false;
      if (arrives) ptx::mbar_arrive(empty_bar(smem, stage(pos)));
    }
    return true;
  }
};

}  // namespace epfuse::device
