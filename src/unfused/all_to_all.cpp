#include "unfused/all_to_all.h"

#include <cstddef>

#include "common/check.h"

namespace epfuse::unfused {

void all_to_all(ncclComm_t comm, const void* send, std::span<const int64_t> send_items, void* recv,
                std::span<const int64_t> recv_items, int64_t item_bytes, cudaStream_t stream) {
  const auto* send_bytes = static_cast<const uint8_t*>(send);
  auto* recv_bytes = static_cast<uint8_t*>(recv);
  int64_t send_offset = 0, recv_offset = 0;
  EPFUSE_NCCL_CHECK(ncclGroupStart());
  // ncclGroupEnd must follow a started group even when a call inside fails.
  try {
    for (size_t peer = 0; peer < send_items.size(); ++peer) {
      const int p = static_cast<int>(peer);
      if (send_items[peer] > 0)
        EPFUSE_NCCL_CHECK(ncclSend(send_bytes + send_offset * item_bytes,
                                   static_cast<size_t>(send_items[peer] * item_bytes), ncclUint8, p, comm, stream));
      if (recv_items[peer] > 0)
        EPFUSE_NCCL_CHECK(ncclRecv(recv_bytes + recv_offset * item_bytes,
                                   static_cast<size_t>(recv_items[peer] * item_bytes), ncclUint8, p, comm, stream));
      send_offset += send_items[peer];
      recv_offset += recv_items[peer];
    }
  } catch (...) {
    (void)ncclGroupEnd();
    throw;
  }
  EPFUSE_NCCL_CHECK(ncclGroupEnd());
}

}  // namespace epfuse::unfused
