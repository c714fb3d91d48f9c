// CPU tests of the NCCL run-time check (comm/nccl_version.h): version codes as text, the mismatch's
// verdict and message, and this process's own NCCL against the build's. No GPU needed.
#include <gtest/gtest.h>

#include <nccl.h>

#include <string>

#include "comm/nccl_version.h"
#include "epfuse/error.h"

namespace {

using epfuse::detail::nccl_device_api_mismatch;
using epfuse::detail::nccl_version_text;

TEST(NcclVersion, CodesOfBothEncodings) {
  EXPECT_EQ(nccl_version_text(22809), "2.28.9");
  EXPECT_EQ(nccl_version_text(22803), "2.28.3");
  EXPECT_EQ(nccl_version_text(21903), "2.19.3");
  EXPECT_EQ(nccl_version_text(20906), "2.9.6");  // the first release of the wide encoding
  EXPECT_EQ(nccl_version_text(2804), "2.8.4");   // the last of the narrow one
  EXPECT_EQ(nccl_version_text(30001), "3.0.1");
  EXPECT_EQ(nccl_version_text(NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)),
            std::to_string(NCCL_MAJOR) + "." + std::to_string(NCCL_MINOR) + "." + std::to_string(NCCL_PATCH));
}

TEST(NcclVersion, TheSameVersionPasses) {
  EXPECT_EQ(nccl_device_api_mismatch(22809, 22809, "/x/libnccl.so.2", "/y/libnccl.so"), "");
}

TEST(NcclVersion, AnOlderOrNewerLibraryIsNamedWithTheBuilds) {
  for (const int loaded : {22803, 22900, 22810}) {
    const std::string why = nccl_device_api_mismatch(22809, loaded, "/lib/x86_64-linux-gnu/libnccl.so.2",
                                                     "/usr/local/cuda/lib/libnccl.so");
    ASSERT_FALSE(why.empty()) << loaded;
    EXPECT_NE(why.find("is " + nccl_version_text(loaded) + " (/lib/x86_64-linux-gnu/libnccl.so.2)"), std::string::npos)
        << why;
    EXPECT_NE(why.find("built against NCCL 2.28.9 (/usr/local/cuda/lib/libnccl.so)"), std::string::npos) << why;
    EXPECT_NE(why.find("LD_LIBRARY_PATH"), std::string::npos) << why;
  }
  // Without the files' names the versions still say it.
  const std::string bare = nccl_device_api_mismatch(22809, 22803, "", "");
  EXPECT_NE(bare.find("is 2.28.3, but epfuse was built against NCCL 2.28.9:"), std::string::npos) << bare;
}

// This process runs the NCCL it was built against (the test links it as the library does), so the check
// passes; under another NCCL (LD_LIBRARY_PATH) it throws kUnsupported with the message above.
TEST(NcclVersion, ThisProcessRunsTheBuildsNccl) {
  int loaded = 0;
  ASSERT_EQ(ncclGetVersion(&loaded), ncclSuccess);
  if (loaded != NCCL_VERSION_CODE) {
    try {
      epfuse::detail::require_nccl_device_api(3);
      FAIL() << "the loaded NCCL " << nccl_version_text(loaded) << " is not the build's, and the check passed";
    } catch (const epfuse::Error& e) {
      EXPECT_EQ(e.code(), epfuse::ErrorCode::kUnsupported);
      EXPECT_EQ(std::string(e.what()).rfind("rank 3: the NCCL library loaded at run time is ", 0), 0u) << e.what();
    }
    GTEST_SKIP() << "this process loaded NCCL " << nccl_version_text(loaded) << ", not the build's "
                 << nccl_version_text(NCCL_VERSION_CODE) << ": the refusal was checked instead";
  }
  EXPECT_NO_THROW(epfuse::detail::require_nccl_device_api(0));
}

}  // namespace
