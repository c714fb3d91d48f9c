#include "bench/record.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

// Keys end at the first '=', so only keys must be free of it.
void check_token(std::string_view tag, std::string_view what, std::string_view s, bool is_key) {
  if (s.find_first_of(is_key ? "\t\n\r=" : "\t\n\r") != std::string_view::npos)
    throw Error(ErrorCode::kInvalidArgument, std::string(tag) + " record: " + std::string(what) + " '" +
                                                 std::string(s) + "' holds a tab or newline" +
                                                 (is_key ? " or '='" : ""));
}

}  // namespace

Record& Record::set(std::string_view key, std::string_view value) {
  check_token(tag_, "key", key, true);
  check_token(tag_, "value of " + std::string(key), value, false);
  for (auto& [k, v] : fields_)
    if (k == key) {
      v = value;
      return *this;
    }
  fields_.emplace_back(key, value);
  return *this;
}

Record& Record::set(std::string_view key, double value) {
  if (std::isnan(value)) return set(key, "nan");
  if (std::isinf(value)) return set(key, value > 0 ? "inf" : "-inf");
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", value);
  return set(key, std::string_view(buf));
}

Record& Record::set(std::string_view key, long long value) { return set(key, std::to_string(value)); }

bool Record::has(std::string_view key) const {
  for (const auto& [k, v] : fields_)
    if (k == key) return true;
  return false;
}

const std::string& Record::text(std::string_view key) const {
  for (const auto& [k, v] : fields_)
    if (k == key) return v;
  throw Error(ErrorCode::kInvalidArgument, tag_ + " record has no field '" + std::string(key) + "'");
}

double Record::number(std::string_view key) const {
  const std::string& v = text(key);
  char* end = nullptr;
  const double d = std::strtod(v.c_str(), &end);  // accepts nan and inf
  if (v.empty() || *end != '\0')
    throw Error(ErrorCode::kInvalidArgument,
                tag_ + " record: field '" + std::string(key) + "' = '" + v + "' is not a number");
  return d;
}

long long Record::integer(std::string_view key) const {
  const std::string& v = text(key);
  long long out = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || ptr != v.data() + v.size())
    throw Error(ErrorCode::kInvalidArgument,
                tag_ + " record: field '" + std::string(key) + "' = '" + v + "' is not an integer");
  return out;
}

double Record::number_or(std::string_view key, double fallback) const {
  return has(key) ? number(key) : fallback;
}

std::string Record::format() const {
  std::string out = tag_;
  for (const auto& [k, v] : fields_) out += "\t" + k + "=" + v;
  return out;
}

std::optional<Record> parse_record(std::string_view line, std::string_view tag) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  size_t pos = line.find(tag);
  while (pos != std::string_view::npos) {
    const size_t after = pos + tag.size();
    if (after == line.size() || line[after] == '\t') break;
    pos = line.find(tag, pos + 1);
  }
  if (pos == std::string_view::npos) return std::nullopt;
  Record rec{std::string(tag)};
  std::string_view rest = line.substr(pos + tag.size());
  while (!rest.empty()) {
    rest.remove_prefix(1);  // the tab
    const size_t end = std::min(rest.find('\t'), rest.size());
    const std::string_view field = rest.substr(0, end);
    const size_t eq = field.find('=');
    if (eq == std::string_view::npos || eq == 0) return std::nullopt;  // not one of ours
    rec.set(field.substr(0, eq), field.substr(eq + 1));
    rest.remove_prefix(end);
  }
  return rec;
}

}  // namespace epfuse::bench
