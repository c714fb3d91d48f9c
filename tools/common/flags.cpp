#include "common/flags.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <type_traits>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

namespace epfuse::tools {
namespace {

// from_chars over the whole text, so "12x", "0x10" and "" are rejected; range errors named.
template <class T>
std::string number_problem(std::string_view text) {
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
  return "";
}

// The flag's name as the usage and the errors spell it.
std::string long_name(const CLI::Option* opt) { return "--" + opt->get_lnames().front(); }

// Checks a number before CLI11 converts it, so the error names the flag, the value and why.
template <class T>
void check_number(CLI::Option* opt) {
  opt->check(CLI::Validator(
      [flag = long_name(opt)](std::string& value) -> std::string {
        const std::string why = number_problem<T>(value);
        if (!why.empty()) throw UsageError(flag + " " + value + ": " + why);
        return "";
      },
      ""));
}

// A comma-separated list into `target`, each item through `item` (which throws UsageError saying why).
template <class T, class Item>
CLI::Option* add_list(CLI::App& app, const std::string& names, std::vector<T>& target, const std::string& help,
                      const char* value_name, Item item) {
  CLI::Option* opt = app.add_option(names)->description(help);
  opt->each([&target, item, flag = long_name(opt)](const std::string& text) {
    std::vector<T> values;
    try {
      for (const std::string& s : split_list(text)) values.push_back(item(s));
    } catch (const UsageError& e) {
      throw UsageError(flag + " " + text + ": " + e.what());
    }
    target = std::move(values);
  });
  return opt->type_name(value_name)->default_str(fmt::format("{}", fmt::join(target, ",")));
}

// epfuse's usage layout: "usage: <synopsis>", the description, then "flags:" with one aligned row per
// visible flag, its help (continuation lines aligned under the first) and "(default: ...)".
class UsageFormatter : public CLI::FormatterBase {
 public:
  explicit UsageFormatter(std::string synopsis) : synopsis_(std::move(synopsis)) {}

  std::string make_help(const CLI::App* app, std::string, CLI::AppFormatMode) const override {
    std::vector<std::pair<std::string, std::string>> rows;
    for (const CLI::Option* opt : app->get_options()) {
      if (opt == app->get_help_ptr() || opt->get_group().empty()) continue;  // help last; hidden ones
      std::string left = "  ";
      for (const std::string& s : opt->get_snames()) left += "-" + s + ", ";
      left += long_name(opt);
      if (opt->get_type_size_max() > 0) left += " " + opt->get_type_name();  // 0: a switch
      std::string help = opt->get_description();
      if (!opt->get_default_str().empty()) help += " (default: " + opt->get_default_str() + ")";
      rows.emplace_back(std::move(left), std::move(help));
    }
    rows.emplace_back("  -h, --help", "show this help");
    size_t width = 0;
    for (const auto& row : rows) width = std::max(width, row.first.size());
    std::string out = fmt::format("usage: {}\n", synopsis_);
    if (!app->get_description().empty()) out += fmt::format("\n{}\n", app->get_description());
    out += "\nflags:\n";
    const std::string indent = "\n" + std::string(width + 2, ' ');
    for (auto& [left, help] : rows) {
      for (size_t pos = 0; (pos = help.find('\n', pos)) != std::string::npos; pos += indent.size())
        help.replace(pos, 1, indent);
      out += fmt::format("{:<{}}{}\n", left, width + 2, help);
    }
    return out;
  }

 private:
  std::string synopsis_;
};

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
    : app_(std::make_unique<CLI::App>(std::move(description))) {
  app_->formatter(std::make_shared<UsageFormatter>(std::move(synopsis)));
  app_->set_help_flag("-h,--help", "show this help");
  app_->allow_extras();  // unknown flags and stray arguments: reported by parse() in epfuse's words
}

FlagParser::~FlagParser() = default;
FlagParser::FlagParser(FlagParser&&) noexcept = default;

template <class T>
FlagParser& FlagParser::add(const std::string& names, T& target, const std::string& help) {
  if constexpr (std::is_same_v<T, bool>) {
    app_->add_flag(names, target, help)
        ->multi_option_policy(CLI::MultiOptionPolicy::Throw)  // given twice is an error, as for the others
        ->default_str(target ? "true" : "");
  } else if constexpr (std::is_same_v<T, std::string>) {
    app_->add_option(names, target, help)->type_name("S")->default_str(target);
  } else if constexpr (std::is_same_v<T, std::vector<int>>) {
    add_list(*app_, names, target, help, "N,N,...", [](const std::string& s) {
      const std::string why = number_problem<int>(s);
      if (!why.empty()) throw UsageError("item '" + s + "': " + why);
      return std::stoi(s);
    });
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    add_list(*app_, names, target, help, "S,S,...", [](const std::string& s) {
      if (s.empty()) throw UsageError("empty item in list");
      return s;
    });
  } else {
    CLI::Option* opt = app_->add_option(names, target, help)
                           ->type_name(std::is_floating_point_v<T> ? "X" : "N")
                           ->default_str(fmt::format("{}", target));
    check_number<T>(opt);
  }
  return *this;
}
template FlagParser& FlagParser::add(const std::string&, int&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, int64_t&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, uint64_t&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, float&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, double&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, bool&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, std::string&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, std::vector<int>&, const std::string&);
template FlagParser& FlagParser::add(const std::string&, std::vector<std::string>&, const std::string&);

FlagParser& FlagParser::default_text(const std::string& name, std::string text) {
  app_->get_option(name)->default_str(std::move(text));
  return *this;
}
FlagParser& FlagParser::hide(const std::string& name) {
  app_->get_option(name)->group("");
  return *this;
}

bool FlagParser::seen(const std::string& name) const { return app_->count(name) > 0; }

std::vector<std::string> FlagParser::parse(const std::vector<std::string>& args) {
  const auto end = std::find(args.begin(), args.end(), "--");
  std::vector<std::string> reversed(std::make_reverse_iterator(end), args.rend());  // CLI11 pops from the back
  try {
    app_->parse(reversed);
  } catch (const CLI::CallForHelp&) {
    help_ = true;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  for (const std::string& arg : app_->remaining())
    throw UsageError(arg.starts_with("-") ? "unknown flag " + arg : "unexpected argument '" + arg + "'");
  return {end == args.end() ? end : end + 1, args.end()};
}

std::string FlagParser::usage() const { return app_->help(); }

int usage_error(const FlagParser& flags, std::string_view command, const std::string& why) {
  fmt::print(stderr, "epfuse {}: {}\n\n{}", command, why, flags.usage());
  return 2;
}

std::optional<int> parse_command_flags(FlagParser& flags, std::string_view command,
                                       const std::vector<std::string>& args, std::vector<std::string>* rest) {
  try {
    std::vector<std::string> r = flags.parse(args);
    if (rest) *rest = std::move(r);
  } catch (const UsageError& e) {
    return usage_error(flags, command, e.what());
  }
  if (flags.help_requested()) {
    fmt::print("{}", flags.usage());
    return 0;
  }
  return std::nullopt;
}

}  // namespace epfuse::tools
