// What the `epfuse` commands print and write: aligned tables, JSON documents, progress on stderr
// (a bar on a terminal, periodic plain lines otherwise), and the facts every report carries
// (date, commit, command line).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

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

// A JSON value; objects keep their keys in insertion order. Non-finite numbers become null.
class Json {
 public:
  Json() = default;  // null
  Json(bool v) : value_(v) {}
  Json(int v) : value_(static_cast<int64_t>(v)) {}
  Json(int64_t v) : value_(v) {}
  Json(uint64_t v) : value_(static_cast<int64_t>(v)) {}
  Json(double v) : value_(v) {}
  Json(const char* v) : value_(std::string(v)) {}
  Json(std::string v) : value_(std::move(v)) {}
  Json(std::string_view v) : value_(std::string(v)) {}
  static Json object();
  static Json array();
  template <class T>
  static Json array_of(const std::vector<T>& items) {
    Json a = array();
    for (const T& item : items) a.push(Json(item));
    return a;
  }

  Json& set(std::string key, Json value);  // on an object; replaces an existing key
  Json& push(Json value);                  // on an array
  std::string dump(int indent = 2) const;

 private:
  struct Object {
    std::vector<std::pair<std::string, Json>> members;
  };
  struct Array {
    std::vector<Json> items;
  };
  void dump_to(std::string& out, int indent, int depth) const;
  std::variant<std::monostate, bool, int64_t, double, std::string, std::shared_ptr<Object>,
               std::shared_ptr<Array>>
      value_;
};

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
