// The flags of the `epfuse` commands, parsed by CLI11: long flags as `--name value` or
// `--name=value`, one-letter aliases (`-n 4`), `--help`, and `--` ending the flags. The usage keeps
// epfuse's layout ("usage: <synopsis>", the description, "flags:" with their defaults). Errors are
// UsageError with a message naming the flag; the CLI prints it with the usage, exit 2.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace CLI {
class App;
}

namespace epfuse::tools {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "a,b,c" -> {"a","b","c"}; empty items are kept (so callers can reject them by name).
std::vector<std::string> split_list(std::string_view text, char sep = ',');

class FlagParser {
 public:
  // `synopsis` is the usage line after "usage: ", e.g. "epfuse run [flags]".
  FlagParser(std::string synopsis, std::string description);
  ~FlagParser();
  FlagParser(FlagParser&&) noexcept;

  // Registers a flag writing into `target`; `names` as CLI11 spells them ("--model", "-n,--nprocs").
  // The target's current value is the default shown in the usage. Lists are comma-separated. A bool
  // flag takes no value (`--name`), or `--name=false`. Numbers must be whole and finite.
  // T: int, int64_t, uint64_t, float, double, bool, std::string, std::vector<int> or
  // std::vector<std::string> (instantiated in flags.cpp).
  template <class T>
  FlagParser& add(const std::string& names, T& target, const std::string& help);
  // Replaces the "(default: ...)" text of the usage; "" shows none (when the help says it).
  FlagParser& default_text(const std::string& name, std::string text);
  // A flag accepted but not listed in the usage (internal re-exec flags).
  FlagParser& hide(const std::string& name);

  // Parses args (without the program and command names). Returns the arguments after `--`.
  // Throws UsageError.
  std::vector<std::string> parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_; }
  // Whether the flag (e.g. "--hidden") was given on the command line (not just defaulted).
  bool seen(const std::string& name) const;
  std::string usage() const;

 private:
  std::unique_ptr<CLI::App> app_;
  bool help_ = false;
};

// Prints "epfuse <command>: <why>" and the usage on stderr; returns 2 (the usage exit code).
int usage_error(const FlagParser& flags, std::string_view command, const std::string& why);

// The commands' common front: parses `args` for `epfuse <command>`. Returns std::nullopt to go
// on, 0 after printing the usage for --help, or 2 after printing "epfuse <command>: <why>" and the
// usage on stderr. `rest` receives parse()'s result.
std::optional<int> parse_command_flags(FlagParser& flags, std::string_view command,
                                       const std::vector<std::string>& args,
                                       std::vector<std::string>* rest = nullptr);

}  // namespace epfuse::tools
