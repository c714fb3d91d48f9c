// The environment (common/env.h): every variable's reading and parsing.
#include "common/env.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include "epfuse/communicator.h"
#include "epfuse/error.h"

namespace epfuse::env {
namespace {

constexpr uint64_t kDefaultFusedTimeoutMs = 20000;

// A whole-string integer; Error names the variable and the text.
long long parse_int(std::string_view name, const std::string& text) {
  long long value = 0;
  const char* begin = text.c_str();
  const char* end = begin + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, value);
  if (ec == std::errc::result_out_of_range) {
    throw Error(ErrorCode::kBootstrap, std::string(name) + "='" + text + "' is out of range");
  }
  if (ec != std::errc() || ptr != end || ptr == begin) {
    throw Error(ErrorCode::kBootstrap, std::string(name) + "='" + text + "' is not an integer");
  }
  return value;
}

}  // namespace

std::optional<std::string> text(std::string_view name) {
  const bool listed = std::any_of(std::begin(kEnvironment), std::end(kEnvironment),
                                  [&](const Variable& v) { return v.name == name; });
  if (!listed)
    throw Error(ErrorCode::kInternal, "environment variable " + std::string(name) + " is not in env::kEnvironment");
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

long long bootstrap_integer(std::string_view name, bool required, long long fallback, long long lo, long long hi) {
  const std::optional<std::string> t = text(name);
  if (!t) {
    if (required) {
      throw Error(ErrorCode::kBootstrap, std::string(name) +
                                             " is not set (launch with `epfuse launch`, torchrun or mpirun, or "
                                             "set RANK and WORLD_SIZE yourself)");
    }
    return fallback;
  }
  const long long value = parse_int(name, *t);
  if (value < lo || value > hi) {
    throw Error(ErrorCode::kBootstrap, std::string(name) + "=" + *t + " is outside [" + std::to_string(lo) + ", " +
                                           std::to_string(hi) + "]");
  }
  return value;
}

std::optional<std::string> job_id() {
  if (std::optional<std::string> job = text("EPFUSE_JOB_ID")) return job;
  return text("TORCHELASTIC_RUN_ID");
}

std::optional<std::string> bootstrap_secret() {
  if (std::optional<std::string> secret = text("EPFUSE_BOOTSTRAP_SECRET")) return secret;
  const std::optional<std::string> run = text("TORCHELASTIC_RUN_ID");
  if (!run) return std::nullopt;
  // torchrun sets both on every rank of one launch; MASTER_PORT tells apart launches of one run id.
  const std::optional<std::string> port = text("MASTER_PORT");
  return "torchrun run_id=" + *run + " master_port=" + port.value_or("");
}

bool bootstrap_bind_any() {
  const std::optional<std::string> t = text("EPFUSE_BOOTSTRAP_BIND_ANY");
  if (!t || t->empty() || *t == "0") return false;
  if (*t == "1") return true;
  throw Error(ErrorCode::kBootstrap, "EPFUSE_BOOTSTRAP_BIND_ANY='" + *t + "' is neither 0 nor 1");
}

long long collective_timeout_ms(long long fallback) {
  return bootstrap_integer("EPFUSE_COLLECTIVE_TIMEOUT_MS", false, fallback, 1, 24LL * 3600 * 1000);
}

uint64_t fused_timeout_ms(int rank) {
  const std::optional<std::string> t = text("EPFUSE_TIMEOUT_MS");
  if (!t || t->empty()) return kDefaultFusedTimeoutMs;
  const char* s = t->c_str();
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end != '\0' || v == 0 || *s == '-' || v > 24ull * 3600 * 1000)
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank) + ": EPFUSE_TIMEOUT_MS = '" + *t +
                                                 "' is not a whole number of milliseconds in [1, 86400000]");
  return v;
}

bool programmatic_launch() {
  const std::optional<std::string> t = text("EPFUSE_PDL");
  if (!t || t->empty() || *t == "1") return true;
  if (*t == "0") return false;
  throw Error(ErrorCode::kInvalidArgument, "EPFUSE_PDL = '" + *t + "' is neither 0 nor 1");
}

int schedule_lag_quarters() {
  const std::optional<std::string> t = text("EPFUSE_SCHEDULE_LAG");
  if (!t || t->empty() || *t == "auto") return -1;
  if (*t == "first") return 0;
  double waves = 0.0;
  const char* end = t->c_str() + t->size();
  const auto [ptr, ec] = std::from_chars(t->c_str(), end, waves);
  const double quarters = waves * 4.0;
  if (ec != std::errc() || ptr != end || !(quarters >= 1.0 && quarters <= 64.0) || quarters != static_cast<int>(quarters))
    throw Error(ErrorCode::kInvalidArgument, "EPFUSE_SCHEDULE_LAG = '" + *t +
                                                 "' is neither auto, first nor a multiple of 0.25 waves in [0.25, 16]");
  return static_cast<int>(quarters);
}

std::optional<std::string> fused_tile() {
  std::optional<std::string> t = text("EPFUSE_FUSED_TILE");
  if (!t || t->empty() || *t == "auto") return std::nullopt;
  return t;
}

bool profile_print() { return text("EPFUSE_PROFILE") == std::optional<std::string>("1"); }

int device_max_connections() {
  constexpr int kCudaDefault = 8;
  const std::optional<std::string> t = text("CUDA_DEVICE_MAX_CONNECTIONS");
  if (!t || t->empty()) return kCudaDefault;
  char* end = nullptr;
  const long v = std::strtol(t->c_str(), &end, 10);
  return *end == '\0' && v > 0 ? static_cast<int>(std::min<long>(v, LoopbackWorld::kMaxConnections)) : kCudaDefault;
}

int trace_launch() {
  const std::optional<std::string> t = text("EPFUSE_TRACE_LAUNCH");
  return t ? std::atoi(t->c_str()) : 20;
}

}  // namespace epfuse::env
