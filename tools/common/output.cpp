#include "common/output.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <stdexcept>

#include "build_info.h"

namespace epfuse::tools {
namespace {

bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end != s.c_str() && (*end == '\0' || *end == '%' || *end == 'x');
}

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
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
      std::string pad(width[c] - cells[c].size(), ' ');
      bool right = !header && looks_numeric(cells[c]);
      out += (c ? "  " : "") + (right ? pad + cells[c] : cells[c] + (c + 1 < cells.size() ? pad : ""));
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

// ---- Json ----

Json Json::object() {
  Json j;
  j.value_ = std::make_shared<Object>();
  return j;
}
Json Json::array() {
  Json j;
  j.value_ = std::make_shared<Array>();
  return j;
}

Json& Json::set(std::string key, Json value) {
  auto* obj = std::get_if<std::shared_ptr<Object>>(&value_);
  if (!obj) throw std::logic_error("Json::set on a value that is not an object");
  for (auto& [k, v] : (*obj)->members) {
    if (k == key) {
      v = std::move(value);
      return *this;
    }
  }
  (*obj)->members.emplace_back(std::move(key), std::move(value));
  return *this;
}

Json& Json::push(Json value) {
  auto* arr = std::get_if<std::shared_ptr<Array>>(&value_);
  if (!arr) throw std::logic_error("Json::push on a value that is not an array");
  (*arr)->items.push_back(std::move(value));
  return *this;
}

std::string Json::dump(int indent) const {
  std::string out;
  dump_to(out, indent, 0);
  return out + "\n";
}

void Json::dump_to(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent <= 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  if (std::holds_alternative<std::monostate>(value_)) {
    out += "null";
  } else if (auto* b = std::get_if<bool>(&value_)) {
    out += *b ? "true" : "false";
  } else if (auto* i = std::get_if<int64_t>(&value_)) {
    out += std::to_string(*i);
  } else if (auto* d = std::get_if<double>(&value_)) {
    if (!std::isfinite(*d)) {
      out += "null";
    } else {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.12g", *d);
      out += buf;
    }
  } else if (auto* s = std::get_if<std::string>(&value_)) {
    append_escaped(out, *s);
  } else if (auto* o = std::get_if<std::shared_ptr<Object>>(&value_)) {
    out += "{";
    bool first = true;
    for (const auto& [k, v] : (*o)->members) {
      out += first ? "" : ",";
      first = false;
      newline(depth + 1);
      append_escaped(out, k);
      out += indent > 0 ? ": " : ":";
      v.dump_to(out, indent, depth + 1);
    }
    if (!first) newline(depth);
    out += "}";
  } else if (auto* a = std::get_if<std::shared_ptr<Array>>(&value_)) {
    // Arrays of scalars stay on one line: per-rank lists read better that way.
    bool scalars = std::all_of((*a)->items.begin(), (*a)->items.end(), [](const Json& j) {
      return !std::holds_alternative<std::shared_ptr<Object>>(j.value_) &&
             !std::holds_alternative<std::shared_ptr<Array>>(j.value_);
    });
    out += "[";
    for (size_t k = 0; k < (*a)->items.size(); ++k) {
      out += k ? (scalars ? ", " : ",") : "";
      if (!scalars) newline(depth + 1);
      (*a)->items[k].dump_to(out, indent, depth + 1);
    }
    if (!scalars && !(*a)->items.empty()) newline(depth);
    out += "]";
  }
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
  char tail[64];
  std::snprintf(tail, sizeof(tail), " %3d%%  %.1f s", static_cast<int>(frac * 100.0), secs);
  std::string text;
  if (tty_) {
    constexpr int kWidth = 30;
    int filled = static_cast<int>(frac * kWidth);
    text = "\r" + label_ + " [" + std::string(static_cast<size_t>(filled), '#') +
           std::string(static_cast<size_t>(kWidth - filled), ' ') + "]" + tail + (final ? "\n" : "");
  } else {
    text = label_ + ":" + tail + "\n";
  }
  std::fputs(text.c_str(), stderr);
  std::fflush(stderr);
}

// ---- facts ----

std::string git_commit() { return EPFUSE_GIT_COMMIT; }

std::string utc_timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
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

std::string format_fixed(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string format_sci(double v, int digits) {
  if (std::isnan(v)) return "nan";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*e", digits, v);
  return buf;
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw std::runtime_error("cannot open " + path + " for writing: " + std::strerror(errno));
  f << content;
  f.close();
  if (!f) throw std::runtime_error("writing " + path + " failed: " + std::strerror(errno));
}

}  // namespace epfuse::tools
