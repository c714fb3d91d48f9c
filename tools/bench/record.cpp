#include "bench/record.h"

#include <cmath>
#include <limits>

#include "epfuse/error.h"

namespace epfuse::bench {
namespace {

constexpr const char* kKindKey = "record";

[[noreturn]] void invalid(std::string message) { throw Error(ErrorCode::kInvalidArgument, std::move(message)); }

}  // namespace

Record::Record(std::string_view tag) : json_({{kKindKey, std::string(tag)}}) {}

std::string Record::tag() const { return json_.at(kKindKey).get<std::string>(); }

nlohmann::ordered_json& Record::slot(std::string_view key) {
  if (key == kKindKey) invalid(tag() + " record: '" + std::string(key) + "' names the kind, not a field");
  return json_[std::string(key)];
}

Record& Record::set(std::string_view key, std::string_view value) {
  slot(key) = std::string(value);
  return *this;
}

Record& Record::set(std::string_view key, double value) {
  if (std::isnan(value)) return set(key, "nan");
  if (std::isinf(value)) return set(key, value > 0 ? "inf" : "-inf");
  slot(key) = value;
  return *this;
}

Record& Record::set(std::string_view key, long long value) {
  slot(key) = value;
  return *this;
}

bool Record::has(std::string_view key) const { return key != kKindKey && json_.contains(std::string(key)); }

const nlohmann::ordered_json& Record::field(std::string_view key) const {
  if (!has(key)) invalid(tag() + " record has no field '" + std::string(key) + "'");
  return json_.at(std::string(key));
}

void Record::bad_field(std::string_view key, std::string_view expected) const {
  invalid(tag() + " record: field '" + std::string(key) + "' = " + field(key).dump() + " is not " +
          std::string(expected));
}

std::string Record::text(std::string_view key) const {
  const nlohmann::ordered_json& v = field(key);
  if (!v.is_string()) bad_field(key, "a string");
  return v.get<std::string>();
}

double Record::number(std::string_view key) const {
  const nlohmann::ordered_json& v = field(key);
  if (v.is_number()) return v.get<double>();
  if (v == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (v == "inf") return std::numeric_limits<double>::infinity();
  if (v == "-inf") return -std::numeric_limits<double>::infinity();
  bad_field(key, "a number");
}

long long Record::integer(std::string_view key) const {
  const nlohmann::ordered_json& v = field(key);
  if (!v.is_number_integer()) bad_field(key, "an integer");
  return v.get<long long>();
}

double Record::number_or(std::string_view key, double fallback) const { return has(key) ? number(key) : fallback; }

std::string Record::format() const { return json_.dump(); }

Record parse_record(std::string_view line) {
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.remove_suffix(1);
  Record rec;
  rec.json_ = nlohmann::ordered_json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (rec.json_.is_discarded()) invalid("not a bench record (not JSON): " + std::string(line));
  const auto kind = rec.json_.find(kKindKey);
  if (!rec.json_.is_object() || kind == rec.json_.end() || !kind->is_string())
    invalid("not a bench record (no \"record\" kind): " + std::string(line));
  return rec;
}

std::optional<Record> find_record(std::string_view line) {
  try {
    return parse_record(line);
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace epfuse::bench
