#include "unfused/all_to_all.h"

#include <cstddef>
#include <string>

#include "comm/comm_backend.h"
#include "common/check.h"
#include "epfuse/error.h"

namespace epfuse::unfused {

void all_to_all(Communicator& communicator, const void* send, std::span<const int64_t> send_items, void* recv,
                std::span<const int64_t> recv_items, int64_t item_bytes, cudaStream_t stream) {
  const auto* send_bytes = static_cast<const uint8_t*>(send);
  auto* recv_bytes = static_cast<uint8_t*>(recv);
  int64_t send_offset = 0, recv_offset = 0;
  ncclComm_t comm = communicator.nccl();
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
  const ncclResult_t state = detail::settle_nccl(comm, ncclGroupEnd(), communicator.collective_timeout());
  if (state == ncclInProgress) {
    const std::string why = "unfused all-to-all: ncclGroupEnd timed out after " +
                            std::to_string(communicator.collective_timeout().count()) + " ms";
    communicator.abort(why);
    throw Error(ErrorCode::kTimeout, detail::rank_prefix(communicator.rank()) + why + "; the communicator is aborted");
  }
  detail::check_nccl(state, "ncclGroupEnd()", communicator.rank());
}

}  // namespace epfuse::unfused
