// The chain's one communication pattern: every rank sends a contiguous block to every peer (itself
// included) with grouped ncclSend/ncclRecv. Blocks lie peer after peer in both buffers.
#pragma once
#include <cstdint>
#include <span>

#include <cuda_runtime.h>
#include <nccl.h>

namespace epfuse::unfused {

// Peer p receives send_items[p] items of item_bytes from `send` (after the blocks of peers < p) and
// this rank receives recv_items[p] items from p into `recv` likewise. Empty blocks are skipped; both
// sides agree on them because the counts were exchanged first.
void all_to_all(ncclComm_t comm, const void* send, std::span<const int64_t> send_items, void* recv,
                std::span<const int64_t> recv_items, int64_t item_bytes, cudaStream_t stream);

}  // namespace epfuse::unfused
