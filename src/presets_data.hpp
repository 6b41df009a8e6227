#pragma once
// Every file in presets/, compiled into the program as code that builds its ModelFile (generated at
// build time by memcalc_preset_compiler, src/preset_compiler.cpp): no JSON is parsed at start-up.
#include <array>

#include "model_file.hpp"

namespace memcalc::cli {

struct CompiledPreset {
    const char* name;      ///< the file's name without .json
    ModelFile (*build)();  ///< the model as parse_model_json reads the file
};

extern const std::array<CompiledPreset, MEMCALC_PRESET_COUNT> compiled_presets;

}  // namespace memcalc::cli
