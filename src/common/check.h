// Internal: turn CUDA, cuBLAS and NCCL return codes into epfuse::Error naming the call and place.
#pragma once
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "epfuse/error.h"

namespace epfuse::detail {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line);
[[noreturn]] void throw_nccl(ncclResult_t res, const char* call, const char* file, int line);

}  // namespace epfuse::detail

#define EPFUSE_CUDA_CHECK(call)                                                       \
  do {                                                                                \
    cudaError_t epfuse_err_ = (call);                                                 \
    if (epfuse_err_ != cudaSuccess)                                                   \
      ::epfuse::detail::throw_cuda(epfuse_err_, #call, __FILE__, __LINE__);           \
  } while (0)

// After a kernel launch: launch-configuration errors and sticky errors from earlier work.
#define EPFUSE_CUDA_CHECK_LAUNCH() EPFUSE_CUDA_CHECK(cudaGetLastError())

#define EPFUSE_CUBLAS_CHECK(call)                                                     \
  do {                                                                                \
    cublasStatus_t epfuse_st_ = (call);                                               \
    if (epfuse_st_ != CUBLAS_STATUS_SUCCESS)                                          \
      ::epfuse::detail::throw_cublas(epfuse_st_, #call, __FILE__, __LINE__);          \
  } while (0)

#define EPFUSE_NCCL_CHECK(call)                                                       \
  do {                                                                                \
    ncclResult_t epfuse_res_ = (call);                                                \
    if (epfuse_res_ != ncclSuccess)                                                   \
      ::epfuse::detail::throw_nccl(epfuse_res_, #call, __FILE__, __LINE__);           \
  } while (0)

// A broken internal invariant or bad argument, with a formatted message.
#define EPFUSE_REQUIRE(cond, code, msg)                                               \
  do {                                                                                \
    if (!(cond)) throw ::epfuse::Error((code), (msg));                                \
  } while (0)
