#include "comm/nccl_version.h"

#include <link.h>

#include <cstring>

#include <nccl.h>

#include "comm/comm_backend.h"
#include "common/check.h"
#include "epfuse/error.h"

#ifndef EPFUSE_BUILT_NCCL_LIBRARY
#define EPFUSE_BUILT_NCCL_LIBRARY ""
#endif

namespace epfuse::detail {
namespace {

// The file of the loaded object whose name holds "libnccl" (the dynamic linker's choice), or "".
std::string loaded_nccl_file() {
  std::string file;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* out) {
        if (info->dlpi_name == nullptr || std::strstr(info->dlpi_name, "libnccl") == nullptr) return 0;
        *static_cast<std::string*>(out) = info->dlpi_name;
        return 1;
      },
      &file);
  return file;
}

}  // namespace

std::string nccl_version_text(int code) {
  const bool before_2_9 = code < 10000;
  const int major = before_2_9 ? code / 1000 : code / 10000;
  const int minor = before_2_9 ? code / 100 % 10 : code / 100 % 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

std::string nccl_device_api_mismatch(int built, int loaded, const std::string& loaded_file,
                                     const std::string& built_file) {
  if (built == loaded) return {};
  return "the NCCL library loaded at run time is " + nccl_version_text(loaded) +
         (loaded_file.empty() ? std::string() : " (" + loaded_file + ")") + ", but epfuse was built against NCCL " +
         nccl_version_text(built) + (built_file.empty() ? std::string() : " (" + built_file + ")") +
         ": NCCL's device API reads the library's own structs, whose layout differs between versions, so the "
         "fused layer would read wrong addresses. Load the build's NCCL (its directory first in LD_LIBRARY_PATH) "
         "or build epfuse against this one (NCCL_HOME=<its prefix> EPFUSE_BUILD_DIR=<a new directory> bash scripts/build.sh)";
}

void require_nccl_device_api(int rank) {
  int loaded = 0;
  EPFUSE_RANK_NCCL_CHECK(rank, ncclGetVersion(&loaded));
  if (loaded == NCCL_VERSION_CODE) return;  // the loaded file is looked up only for the error
  throw Error(ErrorCode::kUnsupported, rank_prefix(rank) + nccl_device_api_mismatch(NCCL_VERSION_CODE, loaded,
                                                                                    loaded_nccl_file(),
                                                                                    EPFUSE_BUILT_NCCL_LIBRARY));
}

}  // namespace epfuse::detail
