// The NCCL loaded at run time against the NCCL the build compiled. NCCL's device API (nccl_device.h) is
// inline code over the library's own structs (a window, a device communicator and its requirements),
// whose layout changes between releases, 2.28 patches included: the device code and the host calls of
// that API built from one version's headers and run on another's library read the wrong fields
// (docs/performance.md, "Faults seen while timing"). Every entrance to the device API checks first.
#pragma once
#include <string>

namespace epfuse::detail {

// nccl.h's version code as "X.Y.Z" (NCCL_VERSION: X * 1000 + Y * 100 + Z up to 2.8, X * 10000 + Y * 100 + Z
// from 2.9).
std::string nccl_version_text(int code);

// Empty when device code compiled from the headers of version `built` may run on the library that reports
// `loaded` (the same version); otherwise the reason, naming both versions, the library's file
// (`loaded_file`, may be empty) and the build's (`built_file`, may be empty), and what to do.
std::string nccl_device_api_mismatch(int built, int loaded, const std::string& loaded_file,
                                     const std::string& built_file);

// Throws Error(kUnsupported), prefixed with the rank (>= 0), when the NCCL this process loaded is not the
// version the build compiled.
void require_nccl_device_api(int rank);

}  // namespace epfuse::detail
