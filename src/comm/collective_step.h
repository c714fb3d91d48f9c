// Internal: failure-safe collective setup (issue 14). Creation and destruction are collective: a rank
// that fails a local step (an allocation, a bad environment variable, a check) and throws while its
// peers go on into the next collective would leave them waiting for it (in NCCL: forever). Each
// setup step therefore runs its local work and then agrees with every rank on whether all of them
// succeeded, through the communicator's (bounded) host collectives, before anyone goes on.
#pragma once
#include <functional>
#include <string>

namespace epfuse {
class Communicator;
}

namespace epfuse::detail {

// The longest part of a failed rank's message that reaches its peers.
inline constexpr size_t kAgreedMessageBytes = 480;

// Collective: runs `local` on this rank, then agrees with every rank (one all_gather of a status per
// rank; a second one carrying the failed ranks' messages only when some rank failed). When every
// rank's `local` returned, returns on every rank. Otherwise every rank throws: a rank whose `local`
// threw rethrows its own exception; every other rank throws Error(kAborted) "rank R: <step>: rank F
// failed: <F's message (first kAgreedMessageBytes bytes)>" naming the lowest failed rank F. Errors of
// the agreement itself (a timeout, an aborted communicator) propagate as they are, but on a rank whose
// `local` threw first: there its own message leads, with its code, and the agreement's follows.
void agree_on_step(Communicator& comm, const std::string& step, const std::function<void()>& local);

}  // namespace epfuse::detail
