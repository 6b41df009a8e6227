#pragma once
// A recipe as a JSON file, in the schema `memcalc recipes --format json` prints for each built-in
// one.
#include <string>
#include <string_view>

#include "memcalc/recipe.hpp"

namespace memcalc::cli {

/// `origin` names the text in errors. The byte counts the listing prints beside the dtypes may be
/// given too; each must be what the dtypes and the optimiser make.
Recipe parse_recipe_json(std::string_view text, const std::string& origin);
Recipe load_recipe_file(const std::string& path);

}  // namespace memcalc::cli
