// A small typed flag parser for the `epfuse` commands: long flags as `--name value` or
// `--name=value`, optional one-letter aliases (`-n 4`), `--help`, and `--` ending the flags.
// Errors are UsageError with a message naming the flag; the CLI prints it with the usage, exit 2.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace epfuse::tools {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "a,b,c" -> {"a","b","c"}; empty items are kept (so callers can reject them by name).
std::vector<std::string> split_list(std::string_view text, char sep = ',');

class FlagParser {
 public:
  // Returns "" when `value` was accepted, otherwise why not (e.g. "expected an integer").
  using ValueParser = std::function<std::string(std::string_view value)>;

  // `synopsis` is the usage line after "usage: ", e.g. "epfuse run [flags]".
  FlagParser(std::string synopsis, std::string description);

  // Registers --name writing into `target`; the target's current value is the default shown in
  // the usage. Lists are comma-separated. A bool flag takes no value (`--name`), or `--name=false`.
  FlagParser& add(std::string name, int& target, std::string help);
  FlagParser& add(std::string name, int64_t& target, std::string help);
  FlagParser& add(std::string name, uint64_t& target, std::string help);
  FlagParser& add(std::string name, double& target, std::string help);
  FlagParser& add(std::string name, float& target, std::string help);
  FlagParser& add(std::string name, std::string& target, std::string help);
  FlagParser& add(std::string name, bool& target, std::string help);
  FlagParser& add(std::string name, std::vector<int>& target, std::string help);
  FlagParser& add(std::string name, std::vector<std::string>& target, std::string help);
  // Any other type: `parse` converts and stores the value itself.
  FlagParser& add_custom(std::string name, std::string value_name, ValueParser parse, std::string help,
                         std::string default_text = "");
  // `-x` as another spelling of the long flag `name` (registered before).
  FlagParser& alias(char short_name, std::string_view name);
  // Replaces the "(default: ...)" text of the usage; "" shows none (when the help says it).
  FlagParser& default_text(std::string_view name, std::string text);
  // A flag accepted but not listed in the usage (internal re-exec flags).
  FlagParser& hide(std::string_view name);

  // Parses args (without the program and command names). Returns the arguments after `--`, or
  // the positional ones when `allow_positional`. Throws UsageError.
  std::vector<std::string> parse(const std::vector<std::string>& args, bool allow_positional = false);
  std::vector<std::string> parse(int argc, char** argv, int first, bool allow_positional = false);

  bool help_requested() const { return help_; }
  // Whether the flag was given on the command line (not just defaulted).
  bool seen(std::string_view name) const;
  std::string usage() const;

 private:
  struct Flag {
    std::string name, value_name, help, default_text;
    ValueParser parse;
    bool is_switch = false;
    bool hidden = false;
    char short_name = 0;
    bool seen = false;
  };
  Flag& find(std::string_view name);
  Flag* lookup(std::string_view name);
  Flag* lookup_short(char c);
  FlagParser& add_flag(Flag flag);

  std::string synopsis_, description_;
  std::vector<Flag> flags_;
  bool help_ = false;
};

// Prints "epfuse <command>: <why>" and the usage on stderr; returns 2 (the usage exit code).
int usage_error(const FlagParser& flags, std::string_view command, const std::string& why);

// The commands' common front: parses `args` for `epfuse <command>`. Returns std::nullopt to go
// on, 0 after printing the usage for --help, or 2 after printing "epfuse <command>: <why>" and the
// usage on stderr. `rest` receives parse()'s result.
std::optional<int> parse_command_flags(FlagParser& flags, std::string_view command,
                                       const std::vector<std::string>& args,
                                       std::vector<std::string>* rest = nullptr,
                                       bool allow_positional = false);

}  // namespace epfuse::tools
