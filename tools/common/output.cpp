#include "common/output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <stdexcept>

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "build_info.h"

namespace epfuse::tools {
namespace {

bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end != s.c_str() && (*end == '\0' || *end == '%' || *end == 'x');
}

void dump_to(std::string& out, const Json& j, int depth) {
  const auto newline = [&](int d) { out += '\n' + std::string(static_cast<size_t>(2 * d), ' '); };
  if (j.is_object()) {
    out += '{';
    for (auto it = j.begin(); it != j.end(); ++it) {
      out += it == j.begin() ? "" : ",";
      newline(depth + 1);
      out += Json(it.key()).dump() + ": ";
      dump_to(out, it.value(), depth + 1);
    }
    if (!j.empty()) newline(depth);
    out += '}';
  } else if (j.is_array()) {
    const bool scalars = std::none_of(j.begin(), j.end(), [](const Json& v) { return v.is_structured(); });
    out += '[';
    for (auto it = j.begin(); it != j.end(); ++it) {
      out += it == j.begin() ? "" : scalars ? ", " : ",";
      if (!scalars) newline(depth + 1);
      dump_to(out, *it, depth + 1);
    }
    if (!scalars && !j.empty()) newline(depth);
    out += ']';
  } else {
    out += j.dump();  // nlohmann/json's scalars: escaped strings, shortest round-trip numbers, NaN as null
  }
}

}  // namespace

// ---- Table ----

void Table::add_row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::render() const {
  std::vector<size_t> width(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    width[c] = headers_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells, bool header) {
    std::string out;
    for (size_t c = 0; c < cells.size(); ++c) {
      const bool last = c + 1 == cells.size();
      if (c) out += "  ";
      if (!header && looks_numeric(cells[c])) out += fmt::format("{:>{}}", cells[c], width[c]);
      else out += last ? cells[c] : fmt::format("{:<{}}", cells[c], width[c]);  // no trailing blanks
    }
    return out + "\n";
  };
  std::string out = line(headers_, true);
  size_t total = 0;
  for (size_t w : width) total += w;
  out += std::string(total + 2 * (width.empty() ? 0 : width.size() - 1), '-') + "\n";
  for (const auto& row : rows_) out += line(row, false);
  return out;
}

// ---- JSON ----

std::string dump_json(const Json& doc) {
  std::string out;
  dump_to(out, doc, 0);
  return out + "\n";
}

// ---- Progress ----

Progress::Progress(std::string label, int64_t total, std::chrono::milliseconds period)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total, 1)),
      period_(period),
      tty_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

Progress::~Progress() {
  // Abandoned (an error unwound past it): end the bar's line without claiming completion.
  if (!finished_ && tty_ && last_done_ >= 0) std::fputs("\n", stderr);
}

void Progress::update(int64_t done) {
  auto now = std::chrono::steady_clock::now();
  // A terminal redraws at most ~10 times a second; a log gets a line per period.
  auto min_gap = tty_ ? std::chrono::milliseconds(100) : period_;
  if (done == last_done_ || (done < total_ && now - last_draw_ < min_gap)) return;
  last_draw_ = now;
  draw(done, false);
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (!tty_ && last_done_ == total_) return;  // the last periodic line already said 100%
  draw(total_, true);
}

void Progress::draw(int64_t done, bool final) {
  last_done_ = done;
  double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total_), 0.0, 1.0);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const std::string tail = fmt::format(" {:3d}%  {:.1f} s", static_cast<int>(frac * 100.0), secs);
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    fmt::print(stderr, "\r{} [{:<{}}]{}{}", label_, std::string(static_cast<size_t>(filled), '#'), kWidth, tail,
               final ? "\n" : "");
  } else {
    fmt::print(stderr, "{}:{}\n", label_, tail);
  }
  std::fflush(stderr);
}

// ---- facts ----

std::string git_commit() { return EPFUSE_GIT_COMMIT; }

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", tm);
}

std::string command_line(const std::vector<std::string>& args) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                   "0123456789-_=.,/:+@%") == std::string::npos;
    if (!plain) {
      std::string quoted = "'";
      for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = quoted + "'";
    }
    out += (i ? " " : "") + a;
  }
  return out;
}

std::string command_line(int argc, char** argv) { return command_line(std::vector<std::string>(argv, argv + argc)); }

std::string format_fixed(double v, int decimals) { return fmt::format("{:.{}f}", v, decimals); }

std::string format_sci(double v, int digits) {
  return std::isnan(v) ? "nan" : fmt::format("{:.{}e}", v, digits);
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot open " + path + " for writing: " + std::strerror(errno));
  f << content;
  f.close();
  if (!f) throw std::runtime_error("writing " + path + " failed: " + std::strerror(errno));
}

}  // namespace epfuse::tools
