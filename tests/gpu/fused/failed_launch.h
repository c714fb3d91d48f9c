// A launch the runtime refuses (more threads a block than any GPU runs), through the library's own launch
// path (common/launch.h): its error must be reported by that launch alone, not again by the next call's
// launch check (tests/gpu/fused/test_gpu_fused.cpp).
#pragma once

namespace epfuse::testing {

// Throws the library's Error (ErrorCode::kCuda) for a launch of 2048 threads a block.
void failed_launch();

}  // namespace epfuse::testing
