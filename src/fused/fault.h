// Fault injection for tests (issue 14): compiled in, off unless EPFUSE_FAULT is set. One rank of a
// world misbehaves in one forward call of the fused layer, so that tests and the CLI can check that
// every other rank fails within its bound, names that rank and what it waited for, and recovers after
// re-creating its workspace.
//
//   EPFUSE_FAULT="rank=R,kind=K[,call=N][,ms=M]"
//
// rank: the rank that misbehaves (the others ignore the variable). call: the layer's forward to
// misbehave in, counting from 0 in each layer (`epfuse run`'s call numbers; default 0); every other
// call is normal. kind:
//   skip     the forward returns without launching (the caller believes it ran: a rank that never
//            calls); y is left as it was
//   stall    the forward sleeps M ms (default: twice the workspace's EPFUSE_TIMEOUT_MS) before it
//            launches: past its peers' device-side timeout, then it runs late
//   throw    the forward throws Error(kInternal) before launching (thread mode: a rank's thread dies
//            mid-call)
//   exit     the process ends at once with _exit(1) before launching (process mode: a rank dies
//            mid-call; in the one-GPU mode it ends every rank's process)
//   bad_ids  the kernel reads a copy of topk_idx (layer-private memory; the caller's stays untouched)
//            whose first id is 0x7f7f7f7f, out of range: the device's bad-expert path on every rank
//            (nothing to corrupt with num_tokens = 0: then the call is normal)
//   fail_create  creating a fused workspace fails on that rank before its collective allocation, as
//            an allocation failure would (Error(kCuda)); `call` does not apply. Every other rank's
//            creation must fail too (Error(kAborted) naming the rank), not wait for it
// The variable is read when a fused layer is created; a malformed one is Error(kInvalidArgument)
// naming it (on every rank alike: every rank reads the same text).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace epfuse::fused {

enum class FaultKind { kSkip, kStall, kThrow, kExit, kBadIds, kFailCreate };
std::string_view to_string(FaultKind kind);

struct Fault {
  int rank = 0;
  FaultKind kind = FaultKind::kSkip;
  int64_t call = 0;
  int64_t stall_ms = -1;  // -1: twice the workspace's timeout

  // Whether this rank misbehaves in its layer's forward number `call` (from 0).
  bool fires(int my_rank, int64_t this_call) const {
    return my_rank == rank && this_call == call && kind != FaultKind::kFailCreate;
  }
};

// Parses EPFUSE_FAULT's text; nullopt for empty text. Throws Error(kInvalidArgument) "EPFUSE_FAULT
// = '<text>': <what is wrong>" for an unknown key or kind, a missing rank or kind, a negative or
// non-integer number, or a key given twice.
std::optional<Fault> parse_fault(std::string_view text);
// parse_fault of EPFUSE_FAULT (common/env.h), nullopt when unset.
std::optional<Fault> fault_from_env();

}  // namespace epfuse::fused
