#pragma once
// Reading a model description (a preset or a user's --model-file) from JSON.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memcalc/model.hpp"

namespace memcalc::cli {

struct ModelFile {
    Architecture architecture;
    std::string description;
    std::string source;
    std::optional<std::uint64_t> published_parameters;  ///< the model's published exact count, when known
};

/// Parses and validates one model description; `origin` (a file name) prefixes every error message.
/// `default_name` names the model when the file has no "name".
ModelFile parse_model_json(std::string_view text, const std::string& origin, const std::string& default_name);

/// Reads a file and parses it; the name defaults to the file's stem.
ModelFile load_model_file(const std::string& path);

/// The presets compiled into the program, by name.
std::vector<std::string> preset_names();
ModelFile load_preset(const std::string& name);

}  // namespace memcalc::cli
