// Defaults that follow the flags (issue 36): a setting the formula cannot describe takes the
// architecture model, and says so once; a model whose layers the formula does not describe does
// too; the chapter's command stays the formula's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "run_program.hpp"

namespace {

std::string figures(const std::string& args) {
    const testing::Run run = testing::memcalc(args + " --format json");
    REQUIRE(run.status == 0);
    CHECK(run.err.empty());  // JSON: nothing said on stderr
    return run.out;
}

}  // namespace

TEST_CASE("a setting or model the formula cannot describe takes the architecture model",
          "[cli][defaults]") {
    const auto [args, said] = GENERATE(table<std::string, std::string>({
        {"--preset llama-3-8b --seq 1024 --profile hf-trainer",
         "--profile hf-trainer (--attention flash) takes the architecture model"},
        {"--preset llama-7b --seq 512 --attention flash", "--attention flash takes"},
        {"--preset llama-7b --seq 512 --platform cpu", "--platform cpu takes"},
        {"--preset mixtral-8x7b --seq 1024", "mixtral-8x7b (mixture of experts) takes"},
        {"--preset deepseek-v2-lite --seq 1024", "deepseek-v2-lite (mixture of experts) takes"},
        {"--preset jamba-1.5-mini --seq 1024", "(mixture of experts) takes"},
    }));
    INFO(args);
    CHECK(figures(args) == figures(args + " --activations architecture"));
    const testing::Run table = testing::memcalc(args);
    CHECK(table.status == 0);
    CHECK_THAT(table.err, Catch::Contains(said));
    CHECK(std::count(table.err.begin(), table.err.end(), '\n') == 1);  // once
}

TEST_CASE("the chapter's command stays the formula's", "[cli][defaults]") {
    const testing::Run run = testing::memcalc("--preset llama-7b --format json");
    REQUIRE(run.status == 0);
    CHECK(run.out.find("\"model\": \"korthikanti\"") != std::string::npos);
    CHECK(testing::memcalc("--preset llama-7b").err.empty());
    // A dense model of Mamba layers alone keeps the formula's Mamba variant.
    const std::string mamba =
        std::string(MEMCALC_SOURCE_DIR) + "/validation/models/mamba-tiny.json";
    CHECK(testing::memcalc("--model-file " + mamba + " --seq 512 --format json")
              .out.find("\"model\": \"korthikanti\"") != std::string::npos);
}

TEST_CASE("fit and plan choose as the estimate does", "[cli][defaults]") {
    const std::string moe = "--preset mixtral-8x7b --seq 1024 --gpu h100-sxm";
    const testing::Run fit = testing::memcalc("fit " + moe + " --dp 8 --zero 3 --format json");
    REQUIRE(fit.status == 0);
    CHECK(fit.out == testing::memcalc("fit " + moe +
                                      " --dp 8 --zero 3 --format json "
                                      "--activations architecture")
                         .out);
}
