#include "common/flags.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

namespace epfuse::tools {
namespace {

// from_chars over the whole text, so "12x" and "" are rejected; range errors named.
template <class T>
std::string parse_number(std::string_view text, T& out) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec == std::errc::result_out_of_range) return "out of range";
  if (ec != std::errc() || ptr != end || text.empty()) {
    if constexpr (std::is_floating_point_v<T>) return "expected a number";
    else if constexpr (std::is_unsigned_v<T>) return "expected a non-negative integer";
    else return "expected an integer";
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (!std::isfinite(value)) return "expected a finite number";
  }
  out = value;
  return "";
}

std::string parse_bool(std::string_view text, bool& out) {
  if (text == "true" || text == "1" || text == "yes" || text == "on") out = true;
  else if (text == "false" || text == "0" || text == "no" || text == "off") out = false;
  else return "expected true or false";
  return "";
}

template <class T>
std::string show(const T& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i ? "," : "") + items[i];
  return out;
}

template <class T>
FlagParser::ValueParser number_parser(T& target) {
  return [&target](std::string_view v) { return parse_number(v, target); };
}

}  // namespace

std::vector<std::string> split_list(std::string_view text, char sep) {
  std::vector<std::string> out;
  while (true) {
    size_t pos = text.find(sep);
    out.emplace_back(text.substr(0, pos));
    if (pos == std::string_view::npos) return out;
    text.remove_prefix(pos + 1);
  }
}

FlagParser::FlagParser(std::string synopsis, std::string description)
    : synopsis_(std::move(synopsis)), description_(std::move(description)) {}

FlagParser& FlagParser::add_flag(Flag flag) {
  if (lookup(flag.name)) throw std::logic_error("flag --" + flag.name + " registered twice");
  flags_.push_back(std::move(flag));
  return *this;
}

FlagParser& FlagParser::add(std::string name, int& target, std::string help) {
  return add_flag({std::move(name), "N", std::move(help), show(target), number_parser(target)});
}
FlagParser& FlagParser::add(std::string name, int64_t& target, std::string help) {
  return add_flag({std::move(name), "N", std::move(help), show(target), number_parser(target)});
}
FlagParser& FlagParser::add(std::string name, uint64_t& target, std::string help) {
  return add_flag({std::move(name), "N", std::move(help), show(target), number_parser(target)});
}
FlagParser& FlagParser::add(std::string name, double& target, std::string help) {
  return add_flag({std::move(name), "X", std::move(help), show(target), number_parser(target)});
}
FlagParser& FlagParser::add(std::string name, float& target, std::string help) {
  return add_flag({std::move(name), "X", std::move(help), show(target), number_parser(target)});
}
FlagParser& FlagParser::add(std::string name, std::string& target, std::string help) {
  return add_flag({std::move(name), "S", std::move(help), target, [&target](std::string_view v) {
                     target = v;
                     return std::string();
                   }});
}
FlagParser& FlagParser::add(std::string name, bool& target, std::string help) {
  Flag f{std::move(name), "", std::move(help), target ? "true" : "",
         [&target](std::string_view v) { return parse_bool(v, target); }};
  f.is_switch = true;
  return add_flag(std::move(f));
}
FlagParser& FlagParser::add(std::string name, std::vector<int>& target, std::string help) {
  std::vector<std::string> shown;
  for (int v : target) shown.push_back(std::to_string(v));
  return add_flag({std::move(name), "N,N,...", std::move(help), join(shown),
                   [&target](std::string_view v) {
                     std::vector<int> values;
                     for (const std::string& item : split_list(v)) {
                       int x = 0;
                       std::string why = parse_number(std::string_view(item), x);
                       if (!why.empty()) return "item '" + item + "': " + why;
                       values.push_back(x);
                     }
                     target = std::move(values);
                     return std::string();
                   }});
}
FlagParser& FlagParser::add(std::string name, std::vector<std::string>& target, std::string help) {
  return add_flag({std::move(name), "S,S,...", std::move(help), join(target), [&target](std::string_view v) {
                     std::vector<std::string> items = split_list(v);
                     for (const std::string& item : items)
                       if (item.empty()) return std::string("empty item in list");
                     target = std::move(items);
                     return std::string();
                   }});
}
FlagParser& FlagParser::add_custom(std::string name, std::string value_name, ValueParser parse,
                                   std::string help, std::string default_text) {
  return add_flag({std::move(name), std::move(value_name), std::move(help), std::move(default_text),
                   std::move(parse)});
}

FlagParser::Flag& FlagParser::find(std::string_view name) {
  Flag* f = lookup(name);
  if (!f) throw std::logic_error("flag --" + std::string(name) + " is not registered");
  return *f;
}
FlagParser::Flag* FlagParser::lookup(std::string_view name) {
  for (Flag& f : flags_)
    if (f.name == name) return &f;
  return nullptr;
}
FlagParser::Flag* FlagParser::lookup_short(char c) {
  for (Flag& f : flags_)
    if (f.short_name == c) return &f;
  return nullptr;
}

FlagParser& FlagParser::alias(char short_name, std::string_view name) {
  find(name).short_name = short_name;
  return *this;
}
FlagParser& FlagParser::default_text(std::string_view name, std::string text) {
  find(name).default_text = std::move(text);
  return *this;
}
FlagParser& FlagParser::hide(std::string_view name) {
  find(name).hidden = true;
  return *this;
}

bool FlagParser::seen(std::string_view name) const {
  for (const Flag& f : flags_)
    if (f.name == name) return f.seen;
  return false;
}

std::vector<std::string> FlagParser::parse(int argc, char** argv, int first, bool allow_positional) {
  return parse(std::vector<std::string>(argv + first, argv + argc), allow_positional);
}

std::vector<std::string> FlagParser::parse(const std::vector<std::string>& args, bool allow_positional) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      rest.insert(rest.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      return rest;
    }
    if (arg == "--help" || arg == "-h") {
      help_ = true;
      continue;
    }
    Flag* flag = nullptr;
    std::string spelled;
    std::optional<std::string> inline_value;
    if (arg.starts_with("--") && arg.size() > 2) {
      size_t eq = arg.find('=');
      std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) inline_value = arg.substr(eq + 1);
      spelled = "--" + name;
      flag = lookup(name);
    } else if (arg.size() == 2 && arg[0] == '-' && arg[1] != '-') {
      spelled = arg;
      flag = lookup_short(arg[1]);
    } else if (allow_positional) {
      rest.push_back(arg);
      continue;
    } else {
      throw UsageError("unexpected argument '" + arg + "'");
    }
    if (!flag) throw UsageError("unknown flag " + spelled);
    if (flag->seen) throw UsageError(spelled + " given twice");
    std::string value;
    if (inline_value) {
      value = *inline_value;
    } else if (flag->is_switch) {
      value = "true";
    } else {
      if (i + 1 >= args.size()) throw UsageError(spelled + " needs a value (" + flag->value_name + ")");
      value = args[++i];
    }
    std::string why = flag->parse(value);
    if (!why.empty()) throw UsageError(spelled + " " + value + ": " + why);
    flag->seen = true;
  }
  return rest;
}

std::string FlagParser::usage() const {
  std::ostringstream os;
  os << "usage: " << synopsis_ << "\n";
  if (!description_.empty()) os << "\n" << description_ << "\n";
  os << "\nflags:\n";
  std::vector<std::pair<std::string, const Flag*>> rows;
  size_t width = 0;
  for (const Flag& f : flags_) {
    if (f.hidden) continue;
    std::string left = std::string("  ") + (f.short_name ? std::string("-") + f.short_name + ", " : "") +
                       "--" + f.name + (f.is_switch ? "" : " " + f.value_name);
    width = std::max(width, left.size());
    rows.emplace_back(std::move(left), &f);
  }
  rows.emplace_back("  -h, --help", nullptr);
  width = std::max(width, rows.back().first.size());
  for (const auto& [left, f] : rows) {
    os << left << std::string(width + 2 - left.size(), ' ');
    if (!f) {
      os << "show this help\n";
      continue;
    }
    // Continuation lines of a multi-line help align under its first line.
    std::string help = f->help;
    for (size_t pos = 0; (pos = help.find('\n', pos)) != std::string::npos; pos += width + 3)
      help.insert(pos + 1, std::string(width + 2, ' '));
    os << help;
    if (!f->default_text.empty()) os << " (default: " << f->default_text << ")";
    os << "\n";
  }
  return os.str();
}

int usage_error(const FlagParser& flags, std::string_view command, const std::string& why) {
  std::fprintf(stderr, "epfuse %.*s: %s\n\n%s", static_cast<int>(command.size()), command.data(), why.c_str(),
               flags.usage().c_str());
  return 2;
}

std::optional<int> parse_command_flags(FlagParser& flags, std::string_view command,
                                       const std::vector<std::string>& args, std::vector<std::string>* rest,
                                       bool allow_positional) {
  try {
    std::vector<std::string> r = flags.parse(args, allow_positional);
    if (rest) *rest = std::move(r);
  } catch (const UsageError& e) {
    return usage_error(flags, command, e.what());
  }
  if (flags.help_requested()) {
    std::fputs(flags.usage().c_str(), stdout);
    return 0;
  }
  return std::nullopt;
}

}  // namespace epfuse::tools
