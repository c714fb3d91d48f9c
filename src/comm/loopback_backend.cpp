// Transport::kLoopback (comm_backend.h): every rank of a LoopbackWorld in this process, on one GPU.
// Each host collective is one exchange through the world's shared LoopbackHub (which bounds the wait
// and reports aborts itself); a symmetric allocation is one device allocation that rank 0 makes and
// every rank gets a slice of.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>

#include "comm/comm_backend.h"
#include "comm/loopback_hub.h"
#include "common/check.h"
#include "common/device_buffer.h"

namespace epfuse::detail {
namespace {

// Each rank's slice of a symmetric allocation starts on this boundary (whole pages, so no kernel's
// vector access of one rank's slice straddles into a peer's).
constexpr size_t kSliceAlignment = 4096;

// Every rank's `mine`, rank-major, through one hub exchange (the hub carries bytes; this gives them
// types).
template <typename T>
std::vector<std::vector<T>> loopback_gather(LoopbackHub& hub, int rank, const char* what, std::span<const T> mine) {
  const std::vector<std::vector<std::byte>> all = hub.exchange(rank, what, std::as_bytes(mine));
  std::vector<std::vector<T>> out(all.size());
  for (size_t r = 0; r < all.size(); ++r) {
    EPFUSE_REQUIRE(all[r].size() % sizeof(T) == 0, ErrorCode::kInternal,
                   rank_prefix(rank) + what + ": rank " + std::to_string(r) + " sent " +
                       std::to_string(all[r].size()) + " bytes, not whole values");
    out[r].resize(all[r].size() / sizeof(T));
    if (!all[r].empty()) std::memcpy(out[r].data(), all[r].data(), all[r].size());
  }
  return out;
}

// Every rank's one value (the hub already rejects ranks that call different collectives).
template <typename T>
std::vector<T> loopback_gather_one(LoopbackHub& hub, int rank, const char* what, T mine) {
  std::vector<T> out;
  for (const std::vector<T>& values : loopback_gather(hub, rank, what, std::span<const T>(&mine, 1))) {
    EPFUSE_REQUIRE(values.size() == 1, ErrorCode::kInternal,
                   rank_prefix(rank) + what + ": a rank sent " + std::to_string(values.size()) + " values, not one");
    out.push_back(values[0]);
  }
  return out;
}

// Every rank computes this from the same gathered counts, so all of them throw alike and no rank
// goes on alone.
void require_same_counts(int rank, const char* what, const std::vector<uint64_t>& counts, const char* unit) {
  bool same = true;
  for (uint64_t c : counts) same = same && c == counts[0];
  if (same) return;
  std::string listed;
  for (size_t r = 0; r < counts.size(); ++r) {
    listed += (r > 0 ? ", rank " : "rank ") + std::to_string(r) + ": " + std::to_string(counts[r]) + " " + unit;
  }
  throw Error(ErrorCode::kInvalidArgument, rank_prefix(rank) + what + ": the ranks passed different sizes (" + listed +
                                               "); every rank must pass the same");
}

// Rank 0 allocates `total` bytes for every rank's slice and hands every rank a share of it
// (device_buffer.h: the last rank to drop its share frees it, on whichever rank's thread that is,
// with the device selected; like a destructor it only logs errors); a failure reaches every rank as
// the same Error(kCuda), so no rank proceeds alone.
std::shared_ptr<void> share_slices(LoopbackHub& hub, int rank, int device, size_t total) {
  LoopbackHub::Contribution mine;
  if (rank == 0) {
    try {
      mine.handle = share_device_bytes(total, device, rank, rank_prefix(rank));
    } catch (const std::exception& e) {
      const std::string why = e.what();
      mine.bytes.resize(why.size());
      std::memcpy(mine.bytes.data(), why.data(), why.size());
    }
  }
  std::vector<LoopbackHub::Contribution> all = hub.exchange(rank, "alloc_symmetric", std::move(mine));
  if (all[0].handle == nullptr) {
    const std::string why(reinterpret_cast<const char*>(all[0].bytes.data()), all[0].bytes.size());
    throw Error(ErrorCode::kCuda, rank_prefix(rank) + "alloc_symmetric: rank 0 could not allocate the " +
                                      std::to_string(total) + " bytes of the world's slices: " + why);
  }
  return all[0].handle;
}

}  // namespace

class LoopbackBackend final : public CommBackend {
 public:
  LoopbackBackend(std::shared_ptr<LoopbackHub> hub, int rank)
      : hub_(std::move(hub)), rank_(rank), world_size_(hub_->world_size()), device_(hub_->device()) {}

  // No stream, word or NCCL comm to release; the hub is shared with the world's other ranks.
  ~LoopbackBackend() override = default;

  void abort(const std::string& why) noexcept override {
    log_errors("Communicator::abort", [&] { hub_->abort(rank_, why); });
  }

  bool aborted() const override { return hub_->aborted(); }

  void wait_bounded(cudaStream_t stream, const char* /*what*/) override {
    EPFUSE_RANK_CUDA_CHECK(rank_, cudaStreamSynchronize(stream));
  }

  SymmetricBuffer alloc_symmetric(size_t bytes) override {
    // Agree on the size first: a mismatch fails every rank before any CUDA call.
    const std::vector<uint64_t> sizes = loopback_gather_one<uint64_t>(*hub_, rank_, "alloc_symmetric", bytes);
    require_same_counts(rank_, "alloc_symmetric", sizes, "bytes");
    EPFUSE_REQUIRE(bytes > 0, ErrorCode::kInvalidArgument,
                   rank_prefix(rank_) + "alloc_symmetric: size 0 (a window needs at least one byte)");
    SymmetricBuffer buffer;
    buffer.device_ = device_;
    const size_t world = static_cast<size_t>(world_size_);
    EPFUSE_REQUIRE(bytes <= (SIZE_MAX - kSliceAlignment) / world, ErrorCode::kInvalidArgument,
                   rank_prefix(rank_) + "alloc_symmetric: " + std::to_string(bytes) + " bytes times " +
                       std::to_string(world) + " ranks overflows size_t");
    const size_t stride = (bytes + kSliceAlignment - 1) / kSliceAlignment * kSliceAlignment;
    buffer.slices_ = share_slices(*hub_, rank_, device_, stride * world);
    buffer.slices_base_ = buffer.slices_.get();
    buffer.stride_ = stride;
    buffer.ptr_ = static_cast<std::byte*>(buffer.slices_base_) + static_cast<size_t>(rank_) * stride;
    buffer.bytes_ = bytes;
    return buffer;
  }

  DeviceComm create_device_comm(int /*lsa_barrier_count*/) override {
    throw Error(ErrorCode::kUnsupported,
                rank_prefix(rank_) + "create_device_comm: NCCL device communicators are not available in the "
                                     "one-GPU (loopback) mode");
  }

  void barrier() override { hub_->exchange(rank_, "barrier", std::span<const std::byte>()); }

  std::vector<double> all_gather(std::span<const double> local) override {
    const std::vector<std::vector<double>> each = loopback_gather(*hub_, rank_, "all_gather", local);
    std::vector<uint64_t> counts;
    for (const std::vector<double>& values : each) counts.push_back(values.size());
    require_same_counts(rank_, "all_gather", counts, "values");
    std::vector<double> all;
    all.reserve(local.size() * each.size());
    for (const std::vector<double>& values : each) all.insert(all.end(), values.begin(), values.end());
    return all;
  }

  double all_reduce_max(double local) override {
    double max = -std::numeric_limits<double>::infinity();
    for (double v : loopback_gather_one(*hub_, rank_, "all_reduce_max", local)) {
      if (std::isnan(v)) return std::numeric_limits<double>::quiet_NaN();
      max = std::max(max, v);
    }
    return max;
  }

  int64_t all_reduce_sum(int64_t local) override {
    int64_t sum = 0;
    for (int64_t v : loopback_gather_one(*hub_, rank_, "all_reduce_sum", local)) sum += v;
    return sum;
  }

 private:
  const std::shared_ptr<LoopbackHub> hub_;  // shared with the world's other ranks
  const int rank_;
  const int world_size_;
  const int device_;
};

std::unique_ptr<CommBackend> make_loopback_backend(std::shared_ptr<LoopbackHub> hub, int rank) {
  return std::make_unique<LoopbackBackend>(std::move(hub), rank);
}

}  // namespace epfuse::detail
