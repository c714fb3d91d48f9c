// Sets an environment variable for its scope, for the GPU tests that inject faults (EPFUSE_FAULT,
// EPFUSE_TIMEOUT_MS: read when a layer or workspace is created). Set on the test's main thread before
// the ranks start.
#pragma once
#include <cstdlib>
#include <string>

namespace epfuse::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) { setenv(name, value.c_str(), 1); }
  ~ScopedEnv() { unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
};

}  // namespace epfuse::testing
