// The communicator on GPUs: symmetric windows reached through LSA pointers with 16-byte device
// stores and loads, ordered by LSA barriers; host collectives; borrow(); argument and device errors;
// a window's device view against its allocation, and the host copy the layers' block scales take.
// Every window is poisoned before a kernel runs and checked word for word afterwards.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <nccl_device.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/check.h"
#include "common/device_buffer.h"
#include "common/hash.h"
#include "epfuse/communicator.h"
#include "epfuse/error.h"
#include "fused/window_view.h"
#include "multiprocess.h"

namespace {

using epfuse::Communicator;
using epfuse::DeviceComm;
using epfuse::SymmetricBuffer;
using epfuse::detail::mix64;
using epfuse::testing::comm;

constexpr int kBlocks = 8;  // CTAs per kernel; each CTA owns LSA barrier blockIdx.x
constexpr int kThreads = 256;
constexpr size_t kVecsPerRegion = size_t{1} << 14;  // 16-byte words per region: 256 KiB
constexpr size_t kRegionBytes = kVecsPerRegion * sizeof(uint4);
constexpr unsigned char kPoisonByte = 0xA5;

// What `writer` stores for `reader` at word i: every field of the triple shows, so a store that
// lands in the wrong place, comes from the wrong rank or is missing cannot pass.
__host__ __device__ uint4 pattern(int writer, int reader, uint32_t i) {
  const uint64_t h = mix64((static_cast<uint64_t>(writer) << 48) ^ (static_cast<uint64_t>(reader) << 32) ^ i);
  return make_uint4(0xE0000000u | (static_cast<uint32_t>(writer) << 12) | static_cast<uint32_t>(reader), i,
                    static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32));
}

// Round r's word j from `writer`: a function of everything every rank wrote for word j in round
// r-1 (`previous`), so a read that overtook the barrier changes every later round.
__host__ __device__ uint4 round_value(int round, int writer, uint32_t j, uint64_t previous) {
  const uint64_t h = mix64(mix64((static_cast<uint64_t>(round) << 32) | static_cast<uint32_t>(writer)) ^
                           (static_cast<uint64_t>(j) * 0x9e3779b97f4a7c15ULL) ^ previous);
  return make_uint4(static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32),
                    (static_cast<uint32_t>(round) << 16) | static_cast<uint32_t>(writer), j);
}

// Order-independent digest of one word from each writer.
__host__ __device__ uint64_t digest(uint4 v) {
  return mix64((static_cast<uint64_t>(v.y) << 32 | v.x) ^ mix64(static_cast<uint64_t>(v.w) << 32 | v.z));
}

bool same(uint4 a, uint4 b) { return a.x == b.x && a.y == b.y && a.z == b.z && a.w == b.w; }

std::string show(uint4 v) {
  char text[64];
  std::snprintf(text, sizeof(text), "{%08x %08x %08x %08x}", v.x, v.y, v.z, v.w);
  return text;
}

// Compares `count` words of `got` with expected(i); reports the first few mismatches and the total.
template <typename Expected>
void expect_words(const uint4* got, size_t count, Expected expected, const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < count; ++i) {
    const uint4 want = expected(static_cast<uint32_t>(i));
    if (!same(got[i], want) && ++bad <= 4) {
      ADD_FAILURE() << what << " word " << i << ": got " << show(got[i]) << ", expected " << show(want);
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << count << " words differ";
}

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { EPFUSE_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

std::vector<uint4> to_host(const SymmetricBuffer& buffer, cudaStream_t stream) {
  std::vector<uint4> host(buffer.bytes() / sizeof(uint4));
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(host.data(), buffer.local(), buffer.bytes(), cudaMemcpyDeviceToHost, stream));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

void poison(const SymmetricBuffer& buffer, cudaStream_t stream) {
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(buffer.local(), kPoisonByte, buffer.bytes(), stream));
}

// Each rank stores pattern(me, peer, i) into region `me` of every peer's window (itself included).
__global__ void push_kernel(ncclDevComm dc, ncclWindow_t window) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dc, ncclTeamTagLsa(), blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);  // every window is poisoned
  const ncclTeam lsa = ncclTeamLsa(dc);
  for (int k = 0; k < lsa.nRanks; ++k) {
    const int peer = (lsa.rank + k) % lsa.nRanks;  // staggered: not every rank hits rank 0 first
    auto* dst = static_cast<uint4*>(ncclGetLsaPointer(window, lsa.rank * kRegionBytes, peer));
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kVecsPerRegion; i += gridDim.x * blockDim.x) {
      dst[i] = pattern(lsa.rank, peer, static_cast<uint32_t>(i));
    }
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);  // every store into every window is done
}

// Each rank loads region 0 ("home", filled by its owner) of every peer into its own region 1 + peer.
__global__ void pull_kernel(ncclDevComm dc, ncclWindow_t window) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dc, ncclTeamTagLsa(), blockIdx.x);
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);  // every home region is filled
  const ncclTeam lsa = ncclTeamLsa(dc);
  for (int k = 0; k < lsa.nRanks; ++k) {
    const int peer = (lsa.rank + k) % lsa.nRanks;
    const auto* src = static_cast<const uint4*>(ncclGetLsaPointer(window, 0, peer));
    auto* dst = static_cast<uint4*>(ncclGetLocalPointer(window, (1 + peer) * kRegionBytes));
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < kVecsPerRegion; i += gridDim.x * blockDim.x) {
      dst[i] = src[i];
    }
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);  // no peer changes its home while we load
}

// Region (round, writer) sits at offset (round * world + writer) * kRegionBytes in every window.
// CTA b handles the same words on every rank, so LSA barrier b orders exactly the data it needs.
__global__ void rounds_kernel(ncclDevComm dc, ncclWindow_t window, int rounds) {
  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), dc, ncclTeamTagLsa(), blockIdx.x);
  const ncclTeam lsa = ncclTeamLsa(dc);
  const int world = lsa.nRanks;
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);  // every window is poisoned
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = blockIdx.x * blockDim.x + threadIdx.x; j < kVecsPerRegion; j += gridDim.x * blockDim.x) {
      uint64_t previous = 0;
      if (round > 0) {
        for (int w = 0; w < world; ++w) {
          const auto* src = static_cast<const uint4*>(
              ncclGetLocalPointer(window, (static_cast<size_t>(round - 1) * world + w) * kRegionBytes));
          previous += digest(src[j]);
        }
      }
      const uint4 value = round_value(round, lsa.rank, static_cast<uint32_t>(j), previous);
      for (int k = 0; k < world; ++k) {
        const int peer = (lsa.rank + k) % world;
        auto* dst = static_cast<uint4*>(
            ncclGetLsaPointer(window, (static_cast<size_t>(round) * world + lsa.rank) * kRegionBytes, peer));
        dst[j] = value;
      }
    }
    bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);  // round's stores visible before the next reads
  }
}

TEST(GpuComm, LsaTeamIsTheWorld) {
  Communicator& c = comm();
  const ncclTeam_t lsa = ncclTeamLsa(c.nccl());
  EXPECT_EQ(lsa.nRanks, c.world_size()) << "these tests assume every rank shares one node's NVLink domain";
  EXPECT_EQ(lsa.rank, c.rank());
  EXPECT_EQ(c.world_size(), epfuse::testing::world());
  int device = -1;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  EXPECT_EQ(device, c.device());
  c.barrier();
}

TEST(GpuComm, PushReachesEveryPeerExactly) {
  Communicator& c = comm();
  const int world = c.world_size();
  Stream stream;
  SymmetricBuffer window = c.alloc_symmetric(world * kRegionBytes);
  DeviceComm dev = c.create_device_comm(kBlocks);
  ASSERT_EQ(dev.lsa_barrier_count(), kBlocks);
  for (int repeat = 0; repeat < 2; ++repeat) {  // a second run on a reused window and barriers
    poison(window, stream.s);
    push_kernel<<<kBlocks, kThreads, 0, stream.s>>>(dev.get(), window.window());
    EPFUSE_CUDA_CHECK_LAUNCH();
    const std::vector<uint4> got = to_host(window, stream.s);
    for (int writer = 0; writer < world; ++writer) {
      expect_words(got.data() + writer * kVecsPerRegion, kVecsPerRegion,
                   [&](uint32_t i) { return pattern(writer, c.rank(), i); },
                   "run " + std::to_string(repeat) + ", rank " + std::to_string(c.rank()) + " region of writer " +
                       std::to_string(writer));
    }
  }
}

TEST(GpuComm, PullLoadsEveryPeerExactly) {
  Communicator& c = comm();
  const int world = c.world_size();
  Stream stream;
  SymmetricBuffer window = c.alloc_symmetric((1 + world) * kRegionBytes);
  DeviceComm dev = c.create_device_comm(kBlocks);
  std::vector<uint4> home(kVecsPerRegion);
  for (size_t i = 0; i < home.size(); ++i) home[i] = pattern(c.rank(), c.rank(), static_cast<uint32_t>(i));
  poison(window, stream.s);
  EPFUSE_CUDA_CHECK(
      cudaMemcpyAsync(window.local(), home.data(), kRegionBytes, cudaMemcpyHostToDevice, stream.s));
  pull_kernel<<<kBlocks, kThreads, 0, stream.s>>>(dev.get(), window.window());
  EPFUSE_CUDA_CHECK_LAUNCH();
  const std::vector<uint4> got = to_host(window, stream.s);
  expect_words(got.data(), kVecsPerRegion, [&](uint32_t i) { return home[i]; }, "own home region");
  for (int owner = 0; owner < world; ++owner) {
    expect_words(got.data() + (1 + owner) * kVecsPerRegion, kVecsPerRegion,
                 [&](uint32_t i) { return pattern(owner, owner, i); },
                 "rank " + std::to_string(c.rank()) + " pulled from rank " + std::to_string(owner));
  }
}

TEST(GpuComm, LsaBarrierOrdersDependentRounds) {
  Communicator& c = comm();
  const int world = c.world_size();
  constexpr int kRounds = 6;
  Stream stream;
  SymmetricBuffer window = c.alloc_symmetric(static_cast<size_t>(kRounds) * world * kRegionBytes);
  DeviceComm dev = c.create_device_comm(kBlocks);
  poison(window, stream.s);
  rounds_kernel<<<kBlocks, kThreads, 0, stream.s>>>(dev.get(), window.window(), kRounds);
  EPFUSE_CUDA_CHECK_LAUNCH();
  const std::vector<uint4> got = to_host(window, stream.s);

  // The host replays the rounds: expected[w][j] is writer w's word j of the current round.
  std::vector<std::vector<uint4>> expected(world, std::vector<uint4>(kVecsPerRegion));
  for (int round = 0; round < kRounds; ++round) {
    std::vector<uint64_t> previous(kVecsPerRegion, 0);
    if (round > 0) {
      for (int w = 0; w < world; ++w) {
        for (size_t j = 0; j < kVecsPerRegion; ++j) previous[j] += digest(expected[w][j]);
      }
    }
    for (int w = 0; w < world; ++w) {
      for (size_t j = 0; j < kVecsPerRegion; ++j) {
        expected[w][j] = round_value(round, w, static_cast<uint32_t>(j), previous[j]);
      }
      expect_words(got.data() + (static_cast<size_t>(round) * world + w) * kVecsPerRegion, kVecsPerRegion,
                   [&](uint32_t j) { return expected[w][j]; },
                   "rank " + std::to_string(c.rank()) + " round " + std::to_string(round) + " from writer " +
                       std::to_string(w));
    }
  }
}

TEST(GpuComm, BuffersMoveAndResetOnce) {
  Communicator& c = comm();
  SymmetricBuffer a = c.alloc_symmetric(1 << 20);
  void* const local = a.local();
  ASSERT_NE(local, nullptr);
  EXPECT_EQ(a.bytes(), size_t{1} << 20);
  SymmetricBuffer b = std::move(a);
  EXPECT_EQ(a.local(), nullptr);
  EXPECT_EQ(a.window(), nullptr);
  EXPECT_EQ(b.local(), local);
  SymmetricBuffer d = c.alloc_symmetric(4096);
  d = std::move(b);  // frees d's own window first (collective on every rank alike)
  EXPECT_EQ(d.local(), local);
  d.reset();
  d.reset();  // a second reset is a no-op
  EXPECT_EQ(d.local(), nullptr);
  EXPECT_EQ(d.bytes(), 0u);

  DeviceComm x = c.create_device_comm(2);
  DeviceComm y = std::move(x);
  EXPECT_FALSE(static_cast<bool>(x));
  EXPECT_TRUE(static_cast<bool>(y));
  EXPECT_EQ(y.lsa_barrier_count(), 2);
  y.reset();
  EXPECT_FALSE(static_cast<bool>(y));
  c.barrier();
}

// The fused workspace zeroes its window through the allocation and its kernel reaches it through
// ncclGetLocalPointer: the two must be one memory, also for windows made where freed ones were.
TEST(GpuComm, WindowDeviceViewIsTheAllocation) {
  Communicator& c = comm();
  for (size_t bytes : {size_t{4096}, size_t{1} << 20, (size_t{64} << 20) + 4096}) {
    for (int again = 0; again < 2; ++again) {  // the second window takes the first one's place
      SymmetricBuffer window = c.alloc_symmetric(bytes);
      const epfuse::fused::WindowViewMismatch m =
          epfuse::fused::first_window_view_mismatch(window.window(), window.local(), bytes, nullptr);
      EXPECT_EQ(m.offset, -1) << "rank " << c.rank() << ": " << epfuse::fused::describe(m, bytes);
    }
  }
  c.barrier();
}

// Word w of copy `seed`: every word differs from its neighbours and from the other copies' word w.
__host__ __device__ uint4 copy_word(uint32_t seed, size_t w) {
  const uint64_t h = mix64((static_cast<uint64_t>(seed) << 40) ^ w);
  return make_uint4(static_cast<uint32_t>(h), static_cast<uint32_t>(h >> 32), seed, static_cast<uint32_t>(w));
}

// Counts the words of `data` that are not copy `seed`'s, last word first: the end of a copy is what its
// DMA writes last.
__global__ void count_unlike(const uint4* data, size_t words, uint32_t seed, unsigned long long* wrong) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t w = words - 1 - i;
    const uint4 v = data[w], want = copy_word(seed, w);
    if (v.x != want.x || v.y != want.y || v.z != want.z || v.w != want.w) atomicAdd(wrong, 1ull);
  }
}

// copy_to_device_now (the layers' block scales): the bytes are in device memory when it returns, as a
// kernel on a non-blocking stream, which nothing orders after the copy, reads them.
TEST(DeviceCopy, HostBytesHaveLandedWhenItReturns) {
  Communicator& c = comm();
  constexpr size_t kWords = size_t{4} << 20;  // 64 MiB of pageable host memory
  std::vector<uint4> host(kWords);
  epfuse::detail::DeviceArray<uint4> device(kWords);
  epfuse::detail::DeviceArray<unsigned long long> wrong(1);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    for (size_t w = 0; w < kWords; ++w) host[w] = copy_word(seed, w);
    EPFUSE_CUDA_CHECK(cudaMemset(device.get(), 0xA5, kWords * sizeof(uint4)));
    EPFUSE_CUDA_CHECK(cudaMemset(wrong.get(), 0, sizeof(unsigned long long)));
    EPFUSE_CUDA_CHECK(cudaDeviceSynchronize());
    epfuse::detail::copy_to_device_now(device.get(), host.data(), kWords * sizeof(uint4));
    count_unlike<<<264, 256, 0, stream>>>(device.get(), kWords, seed, wrong.get());
    EPFUSE_CUDA_CHECK(cudaGetLastError());
    unsigned long long n = 0;
    EPFUSE_CUDA_CHECK(cudaMemcpyAsync(&n, wrong.get(), sizeof(n), cudaMemcpyDeviceToHost, stream));
    EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream));
    EXPECT_EQ(n, 0u) << "rank " << c.rank() << ", copy " << seed << ": " << n << " of " << kWords
                     << " words not yet written when the kernel read them";
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
  c.barrier();
}

TEST(GpuComm, BadArgumentsAreRejected) {
  Communicator& c = comm();
  try {
    c.alloc_symmetric(0);
    ADD_FAILURE() << "alloc_symmetric(0) did not throw";
  } catch (const epfuse::Error& e) {
    EXPECT_EQ(e.code(), epfuse::ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(c.rank()) + ":"), std::string::npos) << e.what();
  }
  EXPECT_THROW(c.create_device_comm(-1), epfuse::Error);
  EXPECT_THROW(Communicator::borrow(nullptr), epfuse::Error);

  // A LOCAL_RANK past the visible devices is named with the count, before any network traffic.
  int count = 0;
  EPFUSE_CUDA_CHECK(cudaGetDeviceCount(&count));
  epfuse::BootstrapOptions opts;
  opts.world_size = count + 1;
  opts.rank = count;
  opts.local_rank = count;
  try {
    Communicator::bootstrap(opts);
    ADD_FAILURE() << "bootstrap with LOCAL_RANK=" << count << " did not throw";
  } catch (const epfuse::Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), epfuse::ErrorCode::kBootstrap);
    EXPECT_NE(what.find("LOCAL_RANK=" + std::to_string(count)), std::string::npos) << what;
    EXPECT_NE(what.find("sees " + std::to_string(count) + " CUDA device"), std::string::npos) << what;
  }
  int device = -1;
  EPFUSE_CUDA_CHECK(cudaGetDevice(&device));
  EXPECT_EQ(device, c.device()) << "a failed bootstrap must not change the current device";
}

// The host collectives through NCCL: values that differ per rank, a maximum that is negative (a
// reduction that starts from 0 would show), NaN from one rank only, and sums past 32 bits.
TEST(GpuComm, HostCollectivesCombineEveryRank) {
  Communicator& c = comm();
  const int world = c.world_size(), me = c.rank();
  auto value = [](int rank, int i) { return rank * 1000.0 + i + 0.25; };
  std::vector<double> mine, want;
  for (int i = 0; i < 5; ++i) mine.push_back(value(me, i));
  for (int r = 0; r < world; ++r)
    for (int i = 0; i < 5; ++i) want.push_back(value(r, i));
  EXPECT_EQ(c.all_gather(mine), want);
  EXPECT_TRUE(c.all_gather(std::vector<double>{}).empty());

  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(c.all_reduce_max(-1.5 * (me + 1)), -1.5);
  EXPECT_EQ(c.all_reduce_max(me == world - 1 ? 7.0 : -2.0), 7.0);  // the largest on the last rank
  EXPECT_TRUE(std::isnan(c.all_reduce_max(me == world - 1 ? kNaN : 1e300)));
  EXPECT_TRUE(std::isnan(c.all_reduce_max(me == 0 ? kNaN : kInf)));
  EXPECT_EQ(c.all_reduce_max(me == 0 ? kInf : 1.0), kInf);

  int64_t sum = 0;
  for (int r = 0; r < world; ++r) sum += (int64_t{r} + 1) << 40;
  EXPECT_EQ(c.all_reduce_sum((int64_t{me} + 1) << 40), sum);
  EXPECT_EQ(c.all_reduce_sum(me % 2 ? -3 : 5), 5 * ((world + 1) / 2) - 3 * (world / 2));
}

TEST(GpuComm, BorrowLeavesTheCommToItsOwner) {
  Communicator& c = comm();
  ncclComm_t split = nullptr;
  EPFUSE_NCCL_CHECK(ncclCommSplit(c.nccl(), 0, c.rank(), &split, nullptr));
  {
    std::unique_ptr<Communicator> borrowed = Communicator::borrow(split);
    EXPECT_EQ(borrowed->rank(), c.rank());
    EXPECT_EQ(borrowed->world_size(), c.world_size());
    EXPECT_EQ(borrowed->device(), c.device());
    EXPECT_EQ(borrowed->nccl(), split);
    SymmetricBuffer window = borrowed->alloc_symmetric(kRegionBytes);
    EXPECT_NE(window.local(), nullptr);
    borrowed->barrier();
  }
  // Still alive after the borrower is gone: an all-reduce on it gives the right sum.
  Stream stream;
  const epfuse::detail::DeviceArray<int> word_dev(1);
  int* word = word_dev.get();
  const int mine = c.rank() + 1;
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(word, &mine, sizeof(int), cudaMemcpyHostToDevice, stream.s));
  EPFUSE_NCCL_CHECK(ncclAllReduce(word, word, 1, ncclInt32, ncclSum, split, stream.s));
  int sum = 0;
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(&sum, word, sizeof(int), cudaMemcpyDeviceToHost, stream.s));
  EPFUSE_CUDA_CHECK(cudaStreamSynchronize(stream.s));
  const int world = c.world_size();
  EXPECT_EQ(sum, world * (world + 1) / 2);
  EPFUSE_NCCL_CHECK(ncclCommDestroy(split));
}

}  // namespace

int main(int argc, char** argv) { return epfuse::testing::run_multiprocess(argc, argv, 2); }
