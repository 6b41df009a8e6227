#include <algorithm>

#include "memcalc/error.hpp"
#include "model_file.hpp"
#include "presets_data.hpp"
#include "suggest.hpp"

namespace memcalc::cli {

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& p : compiled_presets) names.emplace_back(p.name);
    std::sort(names.begin(), names.end());
    return names;
}

ModelFile load_preset(const std::string& name) {
    for (const auto& p : compiled_presets)
        if (name == p.name) return p.build();
    throw error("unknown preset '" + name + "'" + did_you_mean(name, preset_names()) +
                "; 'memcalc presets' lists them");
}

}  // namespace memcalc::cli
