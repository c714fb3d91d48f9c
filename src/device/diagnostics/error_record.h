// What the fused kernel records when a call fails: the first error of the call, with enough to say
// which rank, in which phase, waiting for what, expected what and saw what. Written on the device
// (errors.cuh), turned into an Error by the host (src/fused/fused_layer.cpp, describe_error).
#pragma once
#include <cstdint>

namespace epfuse::device {

enum class ErrorKind : int32_t {
  kNone = 0,
  kTimeout = 1,          // a bounded wait ran out
  kBadExpert = 2,        // this rank's topk_idx holds an id outside [-1, E)
  kPeerBadInput = 3,     // a peer's count message carried a bad-input status (seen = its kind)
  kBadTokenCount = 4,    // found by the host: num_tokens outside [0, max_tokens_per_rank]
  kBadPointer = 5,       // found by the host: a null or misaligned (not 16-byte) input/output pointer
  kPeerOtherLayer = 6,   // rank a's count message is for another layer (expected: this rank's id, seen: a's)
};
// A rank that finds bad input still launches (with no tokens) and publishes the kind as its input
// status, so its peers fail with kPeerBadInput at once instead of timing out.

// What a wait waited for; a and b name the object (see describe_error).
enum class WaitKind : int32_t {
  kNone = 0,
  kLayoutDone = 1,   // this rank's layout tasks (a = done, expected = all)
  kCounts = 2,       // the count message of rank a
  kArrivals = 3,     // local expert a's pairs from all senders
  kPlan = 4,         // this rank's expert plan (the collect task)
  kLinear1 = 5,      // Linear1 tiles of m-block a (expert b)
  kTokenTiles = 6,   // output tiles of token a from its experts' ranks
  kPipeline = 7,     // the tile GEMM's shared-memory pipeline (m-block a, n-block b): a TMA or copy never landed
  kTaskSlot = 8,     // the next task from this CTA's producer warps (slot a), for its math warps
};

// Waits for this rank's own progress that itself waits for peers: the expert plan (the collect task
// waits for every rank's count message) and a Linear2 tile's Linear1 tiles (they wait for arrivals).
// They are bounded at twice the timeout, so that when a peer is missing the wait for the peer expires
// first and the error names it, not the wait behind it.
constexpr bool waits_behind_a_wait(WaitKind what) { return what == WaitKind::kPlan || what == WaitKind::kLinear1; }

struct ErrorRecord {
  int32_t kind;      // ErrorKind; the first writer wins (atomicCAS from 0)
  int32_t rank;
  int32_t phase;     // Phase (task_map.h)
  int32_t what;      // WaitKind, or for kBadExpert/kPeerBadInput 0
  int32_t a;         // kBadExpert: token; kPeerBadInput: peer rank
  int32_t b;         // kBadExpert: top-k slot
  uint32_t expected; // kBadExpert: the bad expert id (as u32)
  uint32_t seen;
};

}  // namespace epfuse::device
