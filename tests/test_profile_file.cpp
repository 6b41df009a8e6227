// Framework profiles: every built-in one reads back from its listing as itself, a profile sets what
// its flags would, a flag given overrides it, and every bad file or name gets one message.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "profile_file.hpp"
#include "render.hpp"
#include "run_program.hpp"

using namespace memcalc;
using memcalc::cli::parse_profile_json;

namespace {
bool same(const Framework& a, const Framework& b) {
    bool equal = true;
    for_each_switch([&](const auto& row) { equal = equal && a.*row.member == b.*row.member; });
    return equal;
}

/// The flags that spell out a profile's values, as a user would type them without it.
std::string flags_of(const Framework& f) {
    std::string flags;
    for_each_switch(
        [&](const auto& row) { flags += " " + row.option() + " " + row.name(f.*row.member); });
    return flags;
}
}  // namespace

TEST_CASE("every listed profile reads back as itself", "[profile_file]") {
    const auto listed =
        nlohmann::json::parse(cli::render_listing(cli::profiles_listing(), cli::Format::json));
    REQUIRE(listed.size() == framework_profiles.size());
    for (std::size_t i = 0; i < framework_profiles.size(); ++i) {
        const FrameworkProfile& builtin = framework_profiles[i];
        CAPTURE(builtin.name);
        const FrameworkProfile read = parse_profile_json(listed[i].dump(), "listed");
        CHECK(read.name == builtin.name);
        CHECK(read.description == builtin.description);
        CHECK(read.source == builtin.source);
        CHECK(same(read.framework, builtin.framework));
    }
    CHECK(find_profile(default_profile) != nullptr);
    CHECK(same(find_profile(default_profile)->framework,
               Framework{}));  // the chapter's figures stay the default
}

TEST_CASE("a profile file's missing keys are the default profile's", "[profile_file]") {
    const FrameworkProfile p =
        parse_profile_json(R"({"name": "mine", "optimizer_impl": "foreach"})", "p");
    Framework expected;
    expected.optimizer = OptimizerImpl::foreach;
    CHECK(same(p.framework, expected));
}

TEST_CASE("a profile file's CUBLAS_WORKSPACE_CONFIG sizes cuBLAS's workspaces", "[profile_file]") {
    const FrameworkProfile p =
        parse_profile_json(R"({"name": "tests", "cublas_workspace_config": ":4096:8:16:8"})", "p");
    CHECK(p.framework.cublas_workspace == (std::uint64_t{4096} * 8 + 16 * 8) * 1024);
    CHECK_FALSE(parse_profile_json(R"({"name": "x"})", "p").framework.cublas_workspace);
}

TEST_CASE("every bad profile file gets one message naming the key and the value",
          "[profile_file]") {
    using Case = std::pair<std::string, std::string>;  // file text, what the message says
    auto [text, message] = GENERATE(table<std::string, std::string>({
        Case{"[]", "expected a JSON object describing a framework profile (got array)"},
        Case{R"({"name": "x", "platform": "gpu"})",
             "platform must be one of cpu, cuda (got 'gpu')"},
        Case{R"({"name": "x", "attention": "flsh"})", "did you mean 'flash'"},
        Case{R"({"name": "x", "optimizer_impl": "fused-adam"})", "optimizer_impl must be one of"},
        Case{R"({"name": "x", "grad_buffer": true})",
             "grad_buffer must be a string (got boolean true)"},
        Case{R"({"name": "x", "grad_bufer": "lazy"})",
             "unknown key 'grad_bufer' (did you mean 'grad_buffer'?)"},
        Case{R"({"name": ""})", "name must not be empty"},
        Case{R"({"platform": "cuda"})", "missing key 'name'"},
        Case{R"({"name": "x", "cublas_workspace_config": "4096:8"})",
             "cublas_workspace_config '4096:8' is not ':SIZE:COUNT' pairs"},
    }));
    CAPTURE(text);
    CHECK_THROWS_WITH(parse_profile_json(text, "p.json"),
                      Catch::StartsWith("p.json: ") && Catch::Contains(message));
}

TEST_CASE("a profile gives the estimate its flags give; a flag given overrides it",
          "[profile_file][cli]") {
    const std::string run =
        "--preset gpt2 --seq 1024 --activations architecture --recompute selective --microbatches "
        "2 --format csv";
    for (const auto& profile : framework_profiles) {
        CAPTURE(profile.name);
        const auto by_profile = testing::memcalc(run + " --profile " + std::string(profile.name));
        const auto by_flags = testing::memcalc(run + flags_of(profile.framework));
        CHECK(by_profile.status == 0);
        CHECK(by_profile.out == by_flags.out);
    }
    // megatron's every value overridden by the default profile's.
    const auto overridden = testing::memcalc(
        run + " --profile megatron --grad-buffer lazy --attention eager --loss fp32 --logits held");
    const auto plain = testing::memcalc(run);
    CHECK(overridden.status == 0);
    CHECK(overridden.out == plain.out);
    // The profiles differ where their values do: megatron's persistent buffer holds gradients at
    // every step.
    const auto megatron = testing::memcalc(run + " --profile megatron");
    CHECK(megatron.out != plain.out);
}

TEST_CASE("a profile file through the program gives the estimate of the profile it copies",
          "[profile_file][cli]") {
    const std::string path = "profile_file_test.json";
    {
        std::ofstream out(path);
        out << nlohmann::json::parse(testing::memcalc("profiles --format json").out)[2]
                   .dump();  // megatron
    }
    const std::string run = "--preset gpt2 --seq 1024 --activations architecture --format csv";
    const auto by_name = testing::memcalc(run + " --profile megatron");
    const auto by_file = testing::memcalc(run + " --profile-file " + path);
    CHECK(by_file.status == 0);
    CHECK(by_file.out == by_name.out);
    const auto fit = testing::memcalc(
        "fit --preset gpt2 --activations architecture --device-memory 24GB --profile-file " + path);
    const auto fit_named = testing::memcalc(
        "fit --preset gpt2 --activations architecture --device-memory 24GB --profile megatron");
    CHECK(fit.status == 0);
    CHECK(fit.out == fit_named.out);
    const auto both = testing::memcalc(run + " --profile megatron --profile-file " + path);
    CHECK(both.status != 0);
    CHECK(both.out.empty());
    CHECK(both.err.find("excludes") != std::string::npos);
    std::remove(path.c_str());
}

TEST_CASE(
    "a profile the formula cannot follow, said with it, or one that does not exist, is refused",
    "[profile_file][cli]") {
    using Case = std::pair<std::string, std::string>;  // arguments, what stderr says
    auto [args, message] = GENERATE(table<std::string, std::string>({
        Case{"--profile megatrn", "unknown --profile 'megatrn' (did you mean 'megatron'?)"},
        Case{"--profile megatron --activations korthikanti",
             "--profile megatron (--attention flash) needs --activations architecture"},
        Case{"--profile cpu-replication --activations korthikanti",
             "--profile cpu-replication (--platform cpu) needs --activations architecture"},
        Case{"--platform cpu --activations korthikanti",
             "--platform cpu needs --activations architecture"},
        Case{"--platform gpu", "--platform must be cuda or cpu (got 'gpu')"},
        Case{"--profile-file no-such-profile.json", "profile file 'no-such-profile.json'"},
    }));
    const auto r = testing::memcalc("--preset gpt2 --seq 1024 " + args);
    CAPTURE(args);
    CHECK(r.status != 0);
    CHECK(r.out.empty());
    CHECK(r.err.find(message) != std::string::npos);
    // The formula with the megatron profile's other values: eager attention given overrides its
    // flash.
    CHECK(
        testing::memcalc("--preset gpt2 --seq 1024 --profile megatron --attention eager").status ==
        0);
}
