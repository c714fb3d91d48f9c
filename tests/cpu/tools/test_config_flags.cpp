// `epfuse run` against the one LayerConfig field list (src/common/config_fields.h): every field has
// a flag (tools/cli/run_options.h: kConfigFieldFlags) or is listed as deliberately without one, and
// each flag, resolved into a run plan, moves its field and no other.
#include <algorithm>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "cli/run_options.h"
#include "common/config_fields.h"

namespace epfuse::tools {
namespace {

using detail::kLayerConfigFieldNames;

// The fields of `a` and `b` that differ, by name, in the list's order.
std::vector<std::string> differing_fields(const LayerConfig& a, const LayerConfig& b) {
  std::vector<std::string> out;
#define EPFUSE_DIFFERS(name, c_type, doc) \
  if (!(a.name == b.name)) out.push_back(#name);
  EPFUSE_LAYER_CONFIG_FIELDS(EPFUSE_DIFFERS)
#undef EPFUSE_DIFFERS
  return out;
}

// The layer config `epfuse run` resolves from these flags (one rank, no GPU).
LayerConfig resolved_config(const std::map<std::string, std::string>& flags) {
  RunFlags f;
  FlagParser parser("epfuse run [flags]", "");
  add_run_flags(parser, f);
  std::vector<std::string> args;
  for (const auto& [flag, value] : flags) {
    args.push_back(flag);
    args.push_back(value);
  }
  parser.parse(args);
  return resolve_run_plan(f, parser, /*ranks=*/1, /*have_gpu=*/false).cfg;
}

// A small valid layer; each case below changes one flag from here.
std::map<std::string, std::string> base_flags() {
  return {{"--hidden", "128"}, {"--intermediate", "128"}, {"--experts", "8"}, {"--topk", "2"}, {"--tokens", "4"}};
}

TEST(ConfigFlags, EveryFieldHasAFlagOrIsListedWithoutOne) {
  for (const char* field : kLayerConfigFieldNames) {
    const auto with_flag = std::count_if(std::begin(kConfigFieldFlags), std::end(kConfigFieldFlags),
                                         [&](const ConfigFieldFlag& f) { return std::string_view(f.field) == field; });
    const auto without = std::count_if(kConfigFieldsWithoutFlag.begin(), kConfigFieldsWithoutFlag.end(),
                                       [&](const char* f) { return std::string_view(f) == field; });
    EXPECT_EQ(with_flag + without, 1)
        << "LayerConfig::" << field << " (src/common/config_fields.h): give it an `epfuse run` flag in "
        << "kConfigFieldFlags, or list it in kConfigFieldsWithoutFlag (tools/cli/run_options.h), once";
  }
}

TEST(ConfigFlags, TheTablesNameOnlyListedFields) {
  auto listed = [](std::string_view field) {
    return std::any_of(std::begin(kLayerConfigFieldNames), std::end(kLayerConfigFieldNames),
                       [&](const char* name) { return field == name; });
  };
  for (const ConfigFieldFlag& f : kConfigFieldFlags) EXPECT_TRUE(listed(f.field)) << f.field << " (" << f.flag << ")";
  for (const char* field : kConfigFieldsWithoutFlag) EXPECT_TRUE(listed(field)) << field;
}

TEST(ConfigFlags, EachFlagSetsItsFieldAndNoOther) {
  for (const ConfigFieldFlag& f : kConfigFieldFlags) {
    SCOPED_TRACE(std::string(f.flag) + " " + f.value + " -> LayerConfig::" + f.field);
    std::map<std::string, std::string> flags = base_flags();
    if (f.with[0] != nullptr) flags[f.with[0]] = f.with[1];
    const LayerConfig before = resolved_config(flags);
    flags[f.flag] = f.value;
    const LayerConfig after = resolved_config(flags);
    EXPECT_EQ(differing_fields(before, after), std::vector<std::string>{f.field});
  }
}

}  // namespace
}  // namespace epfuse::tools
