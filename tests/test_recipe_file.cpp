// Recipes of one's own, in the schema `memcalc recipes --format json` prints: every built-in one
// reads back as itself, and every bad file gets one message naming the key and the value.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "memcalc/estimate.hpp"
#include "recipe_file.hpp"
#include "render.hpp"
#include "run_program.hpp"

using namespace memcalc;
using memcalc::cli::parse_recipe_json;

namespace {
const char* const bf16_adam =
    R"({"name": "my-adam", "weights": "bf16", "gradients": "bf16", "master": "fp32",
        "activations": "bf16", "optimizer": "adam"})";

std::string recipe_with(const std::string& key, const std::string& value) {
    auto j = nlohmann::json::parse(bf16_adam);
    j[key] = nlohmann::json::parse(value);
    return j.dump();
}
}  // namespace

TEST_CASE("every listed recipe reads back as itself, byte counts checked", "[recipe_file]") {
    const auto listed =
        nlohmann::json::parse(cli::render_listing(cli::recipes_listing(), cli::Format::json));
    REQUIRE(listed.size() == recipes.size());
    for (std::size_t i = 0; i < recipes.size(); ++i) {
        const Recipe& builtin = recipes[i];
        CAPTURE(builtin.name);
        const Recipe read = parse_recipe_json(listed[i].dump(), "listed");
        CHECK(read.name == builtin.name);
        CHECK(read.weights == builtin.weights);
        CHECK(read.gradients == builtin.gradients);
        CHECK(read.master == builtin.master);
        CHECK(read.activations == builtin.activations);
        CHECK(read.optimizer.name == builtin.optimizer.name);
        CHECK(read.state == builtin.state);
        CHECK(read.autocast == builtin.autocast);
        CHECK(read.linears.has_value() == builtin.linears.has_value());
        CHECK(read.casts == builtin.casts);
        CHECK(read.bytes_per_parameter() == builtin.bytes_per_parameter());
        // The same estimate, to the byte.
        Architecture m;
        m.hidden = 1024, m.layers = 8, m.heads = 16, m.ffn = 4096, m.vocab = 32000;
        Settings a, b;
        a.seq = b.seq = 2048, a.recipe = builtin, b.recipe = read;
        if (builtin.casts != nullptr && builtin.casts->gathered_weight_bytes != 0)
            a.parallel.zero = b.parallel.zero = 3;  // it gathers under FSDP alone
        CHECK(estimate(m, a).peak_step().bytes.total() == estimate(m, b).peak_step().bytes.total());
    }
}

TEST_CASE("a recipe file may differ from every built-in one", "[recipe_file]") {
    const Recipe fp16 = parse_recipe_json(recipe_with("weights", "\"fp16\""),
                                          "f");  // a name no byte count could give
    CHECK(std::string(dtype_name(fp16.weights)) == "fp16");
    const Recipe no_master = parse_recipe_json(recipe_with("master", "null"), "f");
    CHECK(!no_master.master);
    CHECK(no_master.bytes_per_parameter() == 12);
    const Recipe sgd = parse_recipe_json(recipe_with("optimizer", "\"sgd-momentum\""), "f");
    CHECK(sgd.bytes_per_parameter() == 12);
    // A file from before the optimiser's state had a dtype of its own meant fp32.
    CHECK(parse_recipe_json(bf16_adam, "f").optimizer_bytes() == 8);
    const Recipe bf16_state = parse_recipe_json(recipe_with("state", "\"bf16\""), "f");
    CHECK(bf16_state.optimizer_bytes() == 4);
    CHECK(bf16_state.step_temporary_bytes() == 2);
    CHECK(bf16_state.optimizer_state() == "Adam m, v (bf16)");
}

TEST_CASE("every bad recipe file gets one message naming the key and the value", "[recipe_file]") {
    using Case = std::pair<std::string, std::string>;  // file text, what the message says
    auto [text, message] = GENERATE(table<std::string, std::string>({
        Case{"[]", "expected a JSON object describing a recipe (got array)"},
        Case{recipe_with("weights", "\"bf61\""), "weights must be one of"},
        Case{recipe_with("weights", "\"bf61\""), "did you mean 'bf16'"},
        Case{recipe_with("weights", "\"nf4\""),
             "(got 'nf4')"},  // stored only: never a computed dtype
        Case{recipe_with("linear_casts", "\"torchao-fp8\""), "linear_casts must be one of"},
        Case{recipe_with("optimizer", "\"adamw8\""),
             "optimizer must be one of adafactor, adam, adam-8bit, lion, muon, sgd-momentum (got "
             "'adamw8')"},
        Case{recipe_with("state", "\"fp4\""), "state must be one of"},
        Case{recipe_with("master", "4"), "master must be a string (got number 4)"},
        Case{recipe_with("wieghts", "\"bf16\""), "unknown key 'wieghts'"},
        Case{recipe_with("name", "\"\""), "name must not be empty"},
        Case{recipe_with("weight_bytes", "4"),
             "weight_bytes is 4, but the dtypes and the optimiser make it 2"},
        Case{R"({"name": "x", "weights": "bf16", "gradients": "bf16", "activations": "bf16"})",
             "missing key 'optimizer'"},
        Case{R"({"name": "x", "name": "y"})", "key 'name' appears twice"},
    }));
    CAPTURE(text);
    CHECK_THROWS_WITH(parse_recipe_json(text, "r.json"),
                      Catch::StartsWith("r.json: ") && Catch::Contains(message));
}

TEST_CASE(
    "a recipe file through the program (--recipe-file) gives the estimate of the recipe it names",
    "[recipe_file][cli]") {
    const std::string path = "recipe_file_test.json";
    {
        std::ofstream out(path);
        out << nlohmann::json::parse(testing::memcalc("recipes --format json").out)[2]
                   .dump();  // mixed-adam-fp32-grads
    }
    const auto by_name = testing::memcalc(
        "--preset llama-7b --seq 4096 --recipe mixed-adam-fp32-grads --format csv");
    const auto by_file =
        testing::memcalc("--preset llama-7b --seq 4096 --recipe-file " + path + " --format csv");
    CHECK(by_file.status == 0);
    CHECK(by_file.out == by_name.out);
    const auto both =
        testing::memcalc("--preset llama-7b --recipe mixed-adam --recipe-file " + path);
    CHECK(both.status != 0);
    CHECK(both.out.empty());
    CHECK(both.err.find("excludes") != std::string::npos);
    const auto missing =
        testing::memcalc("--preset llama-7b --seq 4096 --recipe-file no-such-recipe.json");
    CHECK(missing.status != 0);
    CHECK(missing.out.empty());
    CHECK(missing.err.find("recipe file 'no-such-recipe.json'") != std::string::npos);
    std::remove(path.c_str());
}
