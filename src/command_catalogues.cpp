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
    return in_format(
        format, [&] { return presets_json(presets); }, [&] { return presets_csv(presets); },
        [&] { return presets_table(presets); });
}

std::string run_recipes(const std::string& format) {
    return in_format(format, [] { return recipes_json(); }, [] { return recipes_csv(); }, [] { return recipes_table(); });
}

}  // namespace memcalc::cli
