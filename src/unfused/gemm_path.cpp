#include "unfused/gemm_path.h"

#include <cstdint>
#include <cstdlib>
#include <string>

#include "common/env.h"
#include "epfuse/error.h"

namespace epfuse::unfused {

inline constexpr char kGemmPathEnv[] = "EPFUSE_UNFUSED_GEMM";

const char* to_string(GemmPath path) noexcept {
  switch (path) {
    case GemmPath::kGrouped: return "grouped";
    case GemmPath::kLoop: return "loop";
  }
  return "?";
}

GemmPath choose_gemm_path(std::span<const int> expert_rows) {
  int64_t rows = 0;
  int groups = 0;
  for (const int r : expert_rows) {
    if (r <= 0) continue;
    rows += r;
    ++groups;
  }
  if (groups == 0) return GemmPath::kGrouped;
  if (groups == 1) return GemmPath::kLoop;
  // rows / groups >= kLoopMinMeanRows, in integers.
  return rows >= int64_t{kLoopMinMeanRows} * groups ? GemmPath::kLoop : GemmPath::kGrouped;
}

std::optional<GemmPath> parse_gemm_path_override(const char* value) {
  if (value == nullptr) return std::nullopt;
  const std::string_view v(value);
  if (v.empty() || v == "auto") return std::nullopt;
  if (v == "grouped") return GemmPath::kGrouped;
  if (v == "loop") return GemmPath::kLoop;
  throw Error(ErrorCode::kInvalidArgument, std::string(kGemmPathEnv) + "=\"" + std::string(v) +
                                               "\": expected grouped, loop or auto (unset = auto)");
}

std::optional<GemmPath> gemm_path_override_from_env() {
  const std::optional<std::string> value = env::text(kGemmPathEnv);
  return parse_gemm_path_override(value ? value->c_str() : nullptr);
}

}  // namespace epfuse::unfused
