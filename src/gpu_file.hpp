#pragma once
// A GPU as a JSON file, in the schema `memcalc gpus --format json` prints for each built-in one.
#include <string>
#include <string_view>

#include "memcalc/hardware.hpp"

namespace memcalc::cli {

/// "79.65": a memory in GiB to two places, as the listing shows it.
std::string gib_text(Count memory);

/// `origin` names the text in errors.
Gpu parse_gpu_json(std::string_view text, const std::string& origin);
Gpu load_gpu_file(const std::string& path);

}  // namespace memcalc::cli
