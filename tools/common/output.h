// What the `epfuse` commands print and write: aligned tables and numbers (fmt), JSON documents
// (nlohmann/json), progress on stderr (a bar on a terminal, periodic plain lines otherwise), and the
// facts every report carries (date, commit, command line).
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace epfuse::tools {

// Columns aligned to their widest cell; cells that look numeric are right-aligned.
class Table {
 public:
  explicit Table(std::vector<std::string> headers) : headers_(std::move(headers)) {}
  void add_row(std::vector<std::string> cells);
  std::string render() const;

 private:
  std::vector<std::string> headers_;
  std::vector<std::vector<std::string>> rows_;
};

// JSON documents are nlohmann/json values whose objects keep their keys in insertion order.
using Json = nlohmann::ordered_json;

// The layout of the JSON files the commands write: two-space indentation, arrays of scalars on one
// line ("[3, 0]": per-rank lists read better that way), non-finite numbers as null; ends with a newline.
std::string dump_json(const Json& doc);

// Progress of a long step on stderr: a redrawn bar when stderr is a terminal, otherwise a plain
// line at most every `period` (and at the end), so logs stay readable.
class Progress {
 public:
  Progress(std::string label, int64_t total, std::chrono::milliseconds period = std::chrono::seconds(5));
  ~Progress();
  void update(int64_t done);
  void finish();

 private:
  void draw(int64_t done, bool final);
  std::string label_;
  int64_t total_;
  std::chrono::milliseconds period_;
  bool tty_;
  bool finished_ = false;
  int64_t last_done_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Facts for reports.
std::string git_commit();                       // the commit the tool was built from, or "unknown"
std::string utc_timestamp();                    // ISO 8601, e.g. "2026-11-21T10:00:00Z"
std::string command_line(const std::vector<std::string>& args);  // shell-quoted where needed
std::string command_line(int argc, char** argv);
std::string format_fixed(double v, int decimals);
std::string format_sci(double v, int digits = 2);  // "1.23e-03"; "nan" for NaN
// Writes `content` to `path`; throws std::runtime_error naming the path and the reason.
void write_file(const std::string& path, const std::string& content);

}  // namespace epfuse::tools
