// libFuzzer target: HuggingFace config.json files (--config).
#include <cstdint>
#include <string>

#include "exercise.hpp"
#include "model_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    try {
        exercise(memcalc::cli::parse_hf_config(
                     std::string(reinterpret_cast<const char*>(data), size), "fuzz", "fuzz")
                     .architecture);
    } catch (const memcalc::error&) {}
    return 0;
}
