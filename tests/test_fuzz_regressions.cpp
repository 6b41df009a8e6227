// Inputs the fuzzers once crashed memcalc with (tests/fuzz-regressions/): each must now be read,
// or refused with memcalc::error, and then estimated and rendered like any other model.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "exercise.hpp"
#include "model_file.hpp"
#include "safetensors_header.hpp"

TEST_CASE("every input a fuzzer found is handled", "[fuzz]") {
    const std::filesystem::path dir =
        std::filesystem::path(MEMCALC_SOURCE_DIR) / "tests" / "fuzz-regressions";
    std::size_t inputs = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
        std::ifstream in(entry.path(), std::ios::binary);
        std::stringstream text;
        text << in.rdbuf();
        CAPTURE(entry.path().filename().string());
        ++inputs;
        try {  // as the start of a safetensors file, too
            (void)memcalc::cli::parse_safetensors_header(text.str(), text.str().size(), "fuzz");
        } catch (const memcalc::error&) {}
        for (bool hf : {false, true}) {
            try {
                const auto file = hf ? memcalc::cli::parse_hf_config(text.str(), "fuzz", "fuzz")
                                     : memcalc::cli::parse_model_json(text.str(), "fuzz", "fuzz");
                exercise(file.architecture);
            } catch (const memcalc::error&) {}
        }
    }
    CHECK(inputs > 0);
}
