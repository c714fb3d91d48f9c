// Epochs: how the fused kernel reuses its buffers and flags across calls without any reset.
//
// A call's epoch is next_epoch of the last call's, kept in the workspace's control block and advanced
// by the kernel itself (the last CTA of a call), so it never skips a value and the parity alternates
// even across the 2^32 wrap (2^32 is even); the first call of a workspace has epoch 1. Every buffer a peer writes exists twice, indexed by parity;
// flags hold the epoch that wrote them; counters only grow and their reader keeps the value they had
// before this call (its base) in its own memory. Why two parities suffice: docs/fused_design.md.
#pragma once
#include <cstdint>

#include "common/host_device.h"

namespace epfuse::device {

EPFUSE_HD uint32_t epoch_parity(uint32_t epoch) { return epoch & 1u; }
EPFUSE_HD uint32_t next_epoch(uint32_t epoch) { return epoch + 1u; }

// A flag of parity p holds the epoch of the last call of that parity (epoch - 2), or 0 before its
// first use, until this call stores `epoch`: equality is the whole test, with no ordering across wrap.
EPFUSE_HD bool flag_is_current(uint32_t flag, uint32_t epoch) { return flag == epoch; }

// A tagged word: a 32-bit value with the epoch that wrote it in the high half, sent as one 8-byte store
// (single-copy atomic), so a reader that finds the tag current has the value without a flag and the
// ordering a flag's release would have given. The count messages are tagged words
// (regions.h count_words); like a flag, a word of parity p holds epoch - 2's tag until this call writes it.
EPFUSE_HD uint64_t tagged_word(uint32_t epoch, uint32_t value) { return static_cast<uint64_t>(epoch) << 32 | value; }
EPFUSE_HD bool word_is_current(uint64_t word, uint32_t epoch) { return flag_is_current(static_cast<uint32_t>(word >> 32), epoch); }
EPFUSE_HD uint32_t word_value(uint64_t word) { return static_cast<uint32_t>(word); }

// A monotonic counter that peers add to (mod 2^32). The reader's base is the counter's value before
// this call; the call's adds are complete when (seen - base) reaches `expected`.
EPFUSE_HD uint32_t counter_progress(uint32_t seen, uint32_t base) { return seen - base; }
EPFUSE_HD bool counter_reached(uint32_t seen, uint32_t base, uint32_t expected) {
  return counter_progress(seen, base) >= expected;
}

}  // namespace epfuse::device
