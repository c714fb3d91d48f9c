// Fault injection for tests (issue 14, issue 43 item 8): compiled in, off unless EPFUSE_FAULT is set.
// One rank of a world misbehaves in one forward call of a layer (fused or unfused), so that tests and
// the CLI can check that every other rank fails within its bound, names what it waited for, and
// recovers. Implemented in src/core/fault.cpp.
//
//   EPFUSE_FAULT="rank=R,kind=K[,call=N][,ms=M][,at=P]"
//
// rank: the rank that misbehaves (the others ignore the variable). call: the layer's forward to
// misbehave in, counting from 0 in each layer (`epfuse run`'s call numbers; default 0); every other
// call is normal. kind:
//   skip     the forward returns without launching (the caller believes it ran: a rank that never
//            calls); y is left as it was
//   stall    the forward sleeps M ms before it launches (default: twice the peers' bound, the fused
//            workspace's EPFUSE_TIMEOUT_MS, the unfused chain's collective timeout): past its peers'
//            bound, then it runs late
//   throw    the forward throws Error(kInternal) before launching (thread mode: a rank's thread dies
//            mid-call)
//   exit     the process ends at once with _exit(1) before launching (process mode: a rank dies
//            mid-call; in the one-GPU mode it ends every rank's process)
//   bad_ids  the layer reads a copy of topk_idx (layer-private memory; the caller's stays untouched)
//            whose first id is 0x7f7f7f7f, out of range: the bad-expert path on every rank (fused: the
//            device's; unfused: the counts exchange's). Nothing to corrupt with num_tokens = 0: then the
//            call is normal
//   fail_create  creating a fused workspace fails on that rank before its collective allocation, as
//            an allocation failure would (Error(kCuda)); `call` does not apply. Every other rank's
//            creation must fail too (Error(kAborted) naming the rank), not wait for it. The unfused
//            chain ignores it
//   hang     the call launches, and its fused kernel stops at point P (at=, required; common/hang_point.h):
//            publish, dispatch, collect, producer or scheduler. The stopped threads wait for this
//            rank's abort flag (one of its own waits ran out), at most 4x the workspace's
//            EPFUSE_TIMEOUT_MS (twice its longest wait); aborted, they abandon their task, else they go
//            on, late. producer and scheduler are warp-specialised CTAs' producer warps (the FP8
//            kernel; bf16 at >= 128 rows per expert): a kernel without them runs normally. The unfused
//            chain ignores it (it has no kernel of its own to stop)
// What each layer's peers see, and the bounds, are in docs/fused_design.md (the EPFUSE_FAULT entry).
// The variable is read when a layer is created; a malformed one is Error(kInvalidArgument) naming it
// (on every rank alike: every rank reads the same text).
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <cuda_runtime.h>

#include "common/hang_point.h"

namespace epfuse::detail {

enum class FaultKind { kSkip, kStall, kThrow, kExit, kBadIds, kFailCreate, kHang };
std::string_view to_string(FaultKind kind);

struct Fault {
  int rank = 0;
  FaultKind kind = FaultKind::kSkip;
  int64_t call = 0;
  int64_t stall_ms = -1;  // -1: twice the peers' bound (act_on_fault's default_stall)
  HangPoint hang_at = HangPoint::kNone;  // kind=hang: where the kernel stops

  // Whether this rank misbehaves in its layer's forward number `call` (from 0).
  bool fires(int my_rank, int64_t this_call) const {
    return my_rank == rank && this_call == call && kind != FaultKind::kFailCreate;
  }
};

// Parses EPFUSE_FAULT's text; nullopt for empty text. Throws Error(kInvalidArgument) "EPFUSE_FAULT
// = '<text>': <what is wrong>" for an unknown key, kind or point, a missing rank or kind (or at= with
// kind=hang), ms= or at= with another kind, a negative or non-integer number, or a key given twice.
std::optional<Fault> parse_fault(std::string_view text);
// parse_fault of EPFUSE_FAULT (common/env.h), nullopt when unset.
std::optional<Fault> fault_from_env();

// A fault that fires in forward call `call` of rank `rank`, on the host, before the layer's first
// collective work: prints "epfuse: rank R: EPFUSE_FAULT: <kind>[ at <point>] in forward call N" to stderr, then
//   skip: returns true (the caller returns at once);
//   stall: sleeps stall_ms (or `default_stall`), returns false;
//   throw: throws Error(kInternal) "rank R: EPFUSE_FAULT: throw in forward call N (thrown before
//          <before>)";
//   exit: ends the process with _exit(1);
//   bad_ids, fail_create, hang: returns false (bad_ids: the caller reads copy_ids_with_bad_first's copy;
//   hang: the fused layer passes hang_at to its kernel).
bool act_on_fault(const Fault& fault, int rank, int64_t call, std::chrono::milliseconds default_stall,
                  std::string_view before);

// bad_ids: dst[0, n) = src[0, n) with dst[0] = 0x7f7f7f7f (out of every layer's range), stream-ordered.
void copy_ids_with_bad_first(int32_t* dst, const int32_t* src, size_t n, cudaStream_t stream);

}  // namespace epfuse::detail
