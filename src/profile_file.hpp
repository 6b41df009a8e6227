#pragma once
// A framework profile as a JSON file, in the schema `memcalc profiles --format json` prints for
// each built-in one.
#include <string>
#include <string_view>

#include "memcalc/framework.hpp"

namespace memcalc::cli {

/// `origin` names the text in errors. A key left out takes the default profile's value.
FrameworkProfile parse_profile_json(std::string_view text, const std::string& origin);
FrameworkProfile load_profile_file(const std::string& path);

}  // namespace memcalc::cli
