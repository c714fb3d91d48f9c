// One-line records that carry benchmark results between processes: the rank processes and the
// PyTorch peer print them, the `epfuse bench` parent parses them. A record is a tag and
// tab-separated key=value fields ("EPFUSE_ROW\tconfig=dsv3\tmedian_ms=1.25"); keys and values hold
// no tab or newline, keys no '=' (a value may: "label=dsv3 T=128"); Record::set checks.
#pragma once
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace epfuse::bench {

inline constexpr std::string_view kRowTag = "EPFUSE_ROW";
inline constexpr std::string_view kProgressTag = "EPFUSE_PROGRESS";
inline constexpr std::string_view kCeilingsTag = "EPFUSE_CEILINGS";

class Record {
 public:
  Record() = default;
  explicit Record(std::string tag) : tag_(std::move(tag)) {}

  const std::string& tag() const { return tag_; }
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }

  // Appends (or replaces) a field. Doubles print with enough digits to round-trip.
  Record& set(std::string_view key, std::string_view value);
  Record& set(std::string_view key, const char* value) { return set(key, std::string_view(value)); }
  Record& set(std::string_view key, double value);
  Record& set(std::string_view key, long long value);
  Record& set(std::string_view key, int value) { return set(key, static_cast<long long>(value)); }

  bool has(std::string_view key) const;
  // Throw Error(kInvalidArgument) naming the tag and key when absent or not a number.
  const std::string& text(std::string_view key) const;
  double number(std::string_view key) const;  // "nan" / "inf" accepted
  long long integer(std::string_view key) const;
  // The number, or `fallback` when the field is absent.
  double number_or(std::string_view key, double fallback) const;

  std::string format() const;

 private:
  std::string tag_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

// The record in `line` if the line contains `tag` followed by a tab or the end (anything before the
// tag, such as a launcher's "[rank 0] " prefix, is ignored); nullopt otherwise.
std::optional<Record> parse_record(std::string_view line, std::string_view tag);

}  // namespace epfuse::bench
