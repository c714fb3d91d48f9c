// The out-of-memory injection of common/device_buffer.h (fail_allocation), on the CPU: which
// allocation fails, that it is the calling thread's count, and the error a failed allocation gives
// (no CUDA call is made for it, so this runs without a GPU).
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "common/device_buffer.h"
#include "epfuse/error.h"

namespace epfuse::detail {
namespace {

TEST(AllocationFault, TheNthAllocationFailsOnce) {
  fail_allocation(3);
  EXPECT_FALSE(injected_allocation_failure());
  EXPECT_FALSE(injected_allocation_failure());
  EXPECT_TRUE(injected_allocation_failure());
  EXPECT_FALSE(injected_allocation_failure()) << "one failure, then allocations go ahead";
  fail_allocation(2);
  fail_allocation(0);  // disarmed
  EXPECT_FALSE(injected_allocation_failure());
  EXPECT_FALSE(injected_allocation_failure());
}

TEST(AllocationFault, OtherThreadsDoNotCount) {
  fail_allocation(1);
  bool other = true;
  std::thread([&] { other = injected_allocation_failure(); }).join();
  EXPECT_FALSE(other);
  EXPECT_TRUE(injected_allocation_failure()) << "this thread's next allocation is still the one to fail";
}

TEST(AllocationFault, ABufferFailsAsOutOfMemory) {
  for (int pinned = 0; pinned < 2; ++pinned) {
    fail_allocation(1);
    try {
      if (pinned) PinnedBuffer b(64, "rank 2: ");
      else DeviceBuffer b(64, "rank 2: ");
      ADD_FAILURE() << "the armed allocation went ahead";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCuda);
      EXPECT_EQ(std::string(e.what()), std::string("rank 2: ") + (pinned ? "cudaMallocHost" : "cudaMalloc") +
                                           "(64 bytes) failed: out of memory (cudaErrorMemoryAllocation)");
    }
  }
  fail_allocation(1);
  try {
    DeviceArray<float> a(4);  // no `who`: the call and its size alone
    ADD_FAILURE() << "the armed allocation went ahead";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cudaMalloc(16 bytes) failed: out of memory (cudaErrorMemoryAllocation)");
  }
}

}  // namespace
}  // namespace epfuse::detail
