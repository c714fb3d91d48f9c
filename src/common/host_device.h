// Internal: EPFUSE_HD marks a function that both the host compiler and nvcc compile (protocol
// arithmetic, buffer offsets, hashing), so the CPU tests run the very code the kernel runs.
#pragma once

#if defined(__CUDACC__)
#define EPFUSE_HD __host__ __device__ __forceinline__
#else
#define EPFUSE_HD inline
#endif
