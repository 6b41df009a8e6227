// memcalc presets, memcalc recipes: the catalogues.
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "render.hpp"

namespace memcalc::cli {

std::string run_presets(const std::string& format) {
    std::vector<std::pair<std::string, ModelFile>> presets;
    for (const auto& name : preset_names()) presets.emplace_back(name, load_preset(name));
    switch (parse_format(format)) {
        case Format::json: return presets_json(presets).dump(2) + "\n";
        case Format::csv: return presets_csv(presets);
        case Format::table: return presets_table(presets);
    }
    return {};
}

std::string run_recipes(const std::string& format) {
    switch (parse_format(format)) {
        case Format::json: return recipes_json().dump(2) + "\n";
        case Format::csv: return recipes_csv();
        case Format::table: return recipes_table();
    }
    return {};
}

}  // namespace memcalc::cli
