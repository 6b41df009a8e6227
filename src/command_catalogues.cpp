// memcalc presets, recipes, optimizers, profiles, gpus, activation-functions and program-facts:
// the catalogues.
#include <string>
#include <utility>
#include <vector>

#include "commands.hpp"
#include "render.hpp"

namespace memcalc::cli {

std::string run_presets(const std::string& format) {
    std::vector<std::pair<std::string, ModelFile>> presets;
    for (const auto& name : preset_names()) presets.emplace_back(name, load_preset(name));
    return render_listing(presets_listing(presets), parse_format(format));
}

std::string run_recipes(const std::string& format) {
    return render_listing(recipes_listing(), parse_format(format));
}

std::string run_profiles(const std::string& format) {
    return render_listing(profiles_listing(), parse_format(format));
}

std::string run_gpus(const std::string& format) {
    return render_listing(gpus_listing(), parse_format(format));
}

std::string run_activation_functions(const std::string& format) {
    return render_listing(activation_functions_listing(), parse_format(format));
}

std::string run_optimizers(const std::string& format) {
    return render_listing(optimizers_listing(), parse_format(format));
}

std::string run_program_facts(const std::string& format) {
    return render_listing(program_facts_listing(), parse_format(format));
}

}  // namespace memcalc::cli
