// Records that carry benchmark results between processes, one JSON object per line (JSON Lines):
// the rank processes (rank 0, into <worker-dir>/records.jsonl) and the PyTorch peer (on its stdout)
// write them, the `epfuse bench` parent reads them. The key "record" names the kind, the others are
// its fields: {"record": "EPFUSE_ROW", "config": "dsv3", "tokens_per_rank": 128, "median_ms": 1.25}.
// Numbers are JSON numbers; a non-finite one is the string "nan", "inf" or "-inf" (JSON has none).
#pragma once
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace epfuse::bench {

inline constexpr std::string_view kRowTag = "EPFUSE_ROW";
inline constexpr std::string_view kProgressTag = "EPFUSE_PROGRESS";
inline constexpr std::string_view kCeilingsTag = "EPFUSE_CEILINGS";

class Record {
 public:
  explicit Record(std::string_view tag);

  std::string tag() const;
  // The whole record as it travels: {"record": tag, fields in the order set}.
  const nlohmann::ordered_json& json() const { return json_; }

  // Appends (or replaces) a field.
  Record& set(std::string_view key, std::string_view value);
  Record& set(std::string_view key, const char* value) { return set(key, std::string_view(value)); }
  Record& set(std::string_view key, double value);
  Record& set(std::string_view key, long long value);
  Record& set(std::string_view key, int value) { return set(key, static_cast<long long>(value)); }

  bool has(std::string_view key) const;
  // Throw Error(kInvalidArgument) naming the tag and key when absent or of another type.
  std::string text(std::string_view key) const;
  double number(std::string_view key) const;  // "nan" / "inf" / "-inf" accepted
  long long integer(std::string_view key) const;
  // The number, or `fallback` when the field is absent.
  double number_or(std::string_view key, double fallback) const;

  // One line, without the newline.
  std::string format() const;

 private:
  friend Record parse_record(std::string_view line);
  Record() = default;
  nlohmann::ordered_json& slot(std::string_view key);  // for set: any key but "record"
  const nlohmann::ordered_json& field(std::string_view key) const;
  [[noreturn]] void bad_field(std::string_view key, std::string_view expected) const;
  nlohmann::ordered_json json_;
};

// The record on `line` (a trailing newline is ignored). Throws Error(kInvalidArgument) saying why
// when the line is not one: not JSON, not an object, or no string "record".
Record parse_record(std::string_view line);
// For output that mixes records with log lines (the PyTorch peer's): the record, or nullopt when
// the line is not one.
std::optional<Record> find_record(std::string_view line);

}  // namespace epfuse::bench
