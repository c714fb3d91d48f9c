#include "failed_launch.h"

#include "common/launch.h"

namespace epfuse::testing {
namespace {

__global__ void empty_kernel(int) {}

}  // namespace

void failed_launch() { detail::launch_kernel(empty_kernel, dim3(1), dim3(2048), 0, nullptr, false, 0); }

}  // namespace epfuse::testing
