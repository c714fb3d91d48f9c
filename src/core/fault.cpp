#include "common/fault.h"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>

#include "common/check.h"
#include "common/env.h"
#include "epfuse/error.h"

namespace epfuse::detail {

std::string_view to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::kSkip: return "skip";
    case FaultKind::kStall: return "stall";
    case FaultKind::kThrow: return "throw";
    case FaultKind::kExit: return "exit";
    case FaultKind::kBadIds: return "bad_ids";
    case FaultKind::kFailCreate: return "fail_create";
    case FaultKind::kHang: return "hang";
  }
  return "unknown";
}

std::optional<Fault> parse_fault(std::string_view text) {
  if (text.empty()) return std::nullopt;
  const auto fail = [&](const std::string& why) -> Error {
    return Error(ErrorCode::kInvalidArgument, "EPFUSE_FAULT = '" + std::string(text) + "': " + why +
                                                  " (expected rank=R,kind=skip|stall|throw|exit|bad_ids|fail_create|hang[,call=N][,ms=M]"
                                                  "[,at=publish|dispatch|collect|producer|scheduler])");
  };
  const auto number = [&](std::string_view key, std::string_view v) {
    int64_t n = -1;
    const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (ec != std::errc() || ptr != v.data() + v.size() || n < 0 || v.empty())
      throw fail(std::string(key) + "=" + std::string(v) + " is not a non-negative integer");
    return n;
  };
  Fault f;
  std::set<std::string, std::less<>> seen;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string_view item = text.substr(at, comma - at);
    at = comma + 1;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos) throw fail("'" + std::string(item) + "' is not key=value");
    const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
    if (!seen.insert(std::string(key)).second) throw fail(std::string(key) + " is given twice");
    if (key == "rank") {
      const int64_t r = number(key, value);
      if (r > (1 << 16)) throw fail("rank=" + std::string(value) + " is out of range");
      f.rank = static_cast<int>(r);
    } else if (key == "call") {
      f.call = number(key, value);
    } else if (key == "ms") {
      f.stall_ms = number(key, value);
    } else if (key == "kind") {
      bool known = false;
      for (FaultKind k : {FaultKind::kSkip, FaultKind::kStall, FaultKind::kThrow, FaultKind::kExit, FaultKind::kBadIds,
                          FaultKind::kFailCreate, FaultKind::kHang})
        if (value == to_string(k)) f.kind = k, known = true;
      if (!known) throw fail("unknown kind '" + std::string(value) + "'");
    } else if (key == "at") {
      for (HangPoint p : kHangPoints)
        if (value == to_string(p)) f.hang_at = p;
      if (f.hang_at == HangPoint::kNone) throw fail("unknown hang point '" + std::string(value) + "'");
    } else {
      throw fail("unknown key '" + std::string(key) + "'");
    }
  }
  if (!seen.contains("rank")) throw fail("rank is missing");
  if (!seen.contains("kind")) throw fail("kind is missing");
  if (seen.contains("ms") && f.kind != FaultKind::kStall) throw fail("ms applies to kind=stall only");
  if (seen.contains("at") != (f.kind == FaultKind::kHang))
    throw fail(f.kind == FaultKind::kHang ? "kind=hang needs at=" : "at applies to kind=hang only");
  return f;
}

std::optional<Fault> fault_from_env() {
  const std::optional<std::string> s = env::text("EPFUSE_FAULT");
  return s ? parse_fault(*s) : std::nullopt;
}

bool act_on_fault(const Fault& fault, int rank, int64_t call, std::chrono::milliseconds default_stall,
                  std::string_view before) {
  const std::string what = "rank " + std::to_string(rank) + ": EPFUSE_FAULT: " + std::string(to_string(fault.kind)) +
                           (fault.kind == FaultKind::kHang ? " at " + std::string(to_string(fault.hang_at)) : "") +
                           " in forward call " + std::to_string(call);
  std::fprintf(stderr, "epfuse: %s\n", what.c_str());
  std::fflush(stderr);
  switch (fault.kind) {
    case FaultKind::kSkip: return true;
    case FaultKind::kStall:
      std::this_thread::sleep_for(fault.stall_ms >= 0 ? std::chrono::milliseconds(fault.stall_ms) : default_stall);
      return false;
    case FaultKind::kThrow:
      throw Error(ErrorCode::kInternal, what + " (thrown before " + std::string(before) + ")");
    case FaultKind::kExit:
      std::fflush(stdout);
      ::_exit(1);
    case FaultKind::kBadIds:
    case FaultKind::kFailCreate:
    case FaultKind::kHang: return false;
  }
  return false;
}

void copy_ids_with_bad_first(int32_t* dst, const int32_t* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  EPFUSE_CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
  EPFUSE_CUDA_CHECK(cudaMemsetAsync(dst, 0x7f, sizeof(int32_t), stream));
}

}  // namespace epfuse::detail
