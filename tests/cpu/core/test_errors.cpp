// Error codes and the messages of the CUDA / cuBLAS / NCCL check macros.
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "common/check.h"
#include "epfuse/error.h"

namespace epfuse {
namespace {

// The message of the Error that `fn` throws, after checking its code.
template <typename Fn>
std::string message_of(Fn&& fn, ErrorCode expected) {
  try {
    fn();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), expected) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no epfuse::Error thrown";
  return "";
}

TEST(Errors, CodesHaveDistinctNames) {
  const ErrorCode codes[] = {ErrorCode::kInvalidConfig, ErrorCode::kInvalidArgument, ErrorCode::kCuda,
                             ErrorCode::kNccl,          ErrorCode::kBootstrap,       ErrorCode::kTimeout,
                             ErrorCode::kUnsupported,   ErrorCode::kInternal};
  std::set<std::string> names;
  for (ErrorCode c : codes) {
    std::string name = to_string(c);
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "unknown error");
    names.insert(name);
  }
  EXPECT_EQ(names.size(), std::size(codes));
}

TEST(Errors, ErrorKeepsCodeAndMessage) {
  Error e(ErrorCode::kTimeout, "rank 3 never set flag 7");
  EXPECT_EQ(e.code(), ErrorCode::kTimeout);
  EXPECT_STREQ(e.what(), "rank 3 never set flag 7");
  const std::runtime_error& base = e;  // catchable as a standard exception
  EXPECT_STREQ(base.what(), "rank 3 never set flag 7");
}

TEST(Check, CudaMessageNamesCallPlaceAndError) {
  const std::string m = message_of(
      [] {
        detail::throw_cuda(cudaErrorMemoryAllocation, "cudaMalloc(&p, n)", "/home/me/epfuse/src/comm/window.cpp", 42);
      },
      ErrorCode::kCuda);
  EXPECT_EQ(m.rfind("cudaMalloc(&p, n) failed at src/comm/window.cpp:42", 0), 0u) << m;
  EXPECT_NE(m.find("out of memory"), std::string::npos) << m;
  EXPECT_NE(m.find("(cudaErrorMemoryAllocation)"), std::string::npos) << m;
}

TEST(Check, CudaMacroThrowsOnlyOnFailure) {
  EXPECT_NO_THROW(EPFUSE_CUDA_CHECK(cudaSuccess));
  const std::string m = message_of([] { EPFUSE_CUDA_CHECK(cudaErrorInvalidValue); }, ErrorCode::kCuda);
  EXPECT_NE(m.find("cudaErrorInvalidValue failed at tests/cpu/core/test_errors.cpp:"), std::string::npos) << m;
  EXPECT_NE(m.find("(cudaErrorInvalidValue)"), std::string::npos) << m;
}

TEST(Check, CublasMessageNamesStatus) {
  EXPECT_NO_THROW(EPFUSE_CUBLAS_CHECK(CUBLAS_STATUS_SUCCESS));
  const std::string m = message_of([] { EPFUSE_CUBLAS_CHECK(CUBLAS_STATUS_NOT_INITIALIZED); }, ErrorCode::kCuda);
  EXPECT_NE(m.find("CUBLAS_STATUS_NOT_INITIALIZED failed at"), std::string::npos) << m;
  EXPECT_NE(m.find("(CUBLAS_STATUS_NOT_INITIALIZED)"), std::string::npos) << m;
}

TEST(Check, NcclMessageNamesResult) {
  EXPECT_NO_THROW(EPFUSE_NCCL_CHECK(ncclSuccess));
  const std::string m = message_of([] { EPFUSE_NCCL_CHECK(ncclInvalidArgument); }, ErrorCode::kNccl);
  EXPECT_NE(m.find("ncclInvalidArgument failed at"), std::string::npos) << m;
  EXPECT_NE(m.find("invalid argument"), std::string::npos) << m;
}

TEST(Check, RequireThrowsGivenCode) {
  EXPECT_NO_THROW(EPFUSE_REQUIRE(1 + 1 == 2, ErrorCode::kInternal, "unreachable"));
  const std::string m =
      message_of([] { EPFUSE_REQUIRE(false, ErrorCode::kInvalidArgument, "expert 300 out of range"); },
                 ErrorCode::kInvalidArgument);
  EXPECT_EQ(m, "expert 300 out of range");
}

}  // namespace
}  // namespace epfuse
