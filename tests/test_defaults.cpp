// Defaults that follow the flags (issue 36): a setting the formula cannot describe takes the
// architecture model, and says so once; a model whose layers the formula does not describe does
// too; the chapter's command stays the formula's.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
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

TEST_CASE("one verdict: the device figure's high end against the device less --reserve",
          "[cli][defaults]") {
    const std::string run = "--preset llama-7b --seq 2048 --dp 8 --zero 3 --gpu h100-sxm";
    const auto report = [&](const std::string& more) {
        const testing::Run r = testing::memcalc(run + more + " --format json");
        REQUIRE(r.status == 0);
        return nlohmann::json::parse(r.out);
    };
    const nlohmann::json j = report("");
    const std::uint64_t memory = 81559ULL << 20;
    CHECK(j["device"]["memory_bytes"] == memory);
    CHECK(j["device"]["reserve_bytes"] == 0);  // the context and the rest are modelled now
    CHECK(j["device"]["usable_bytes"] == memory);
    const std::int64_t peak = j["peak"]["bytes"].get<std::int64_t>();
    const std::int64_t high = j["peak"]["device_band"]["high_bytes"].get<std::int64_t>();
    CHECK(high > peak);
    CHECK(j["peak"]["spare_bytes"] == std::int64_t(memory) - high);
    CHECK(j["peak"]["fits"] == (j["peak"]["spare_bytes"].get<std::int64_t>() >= 0));
    CHECK(report(" --reserve 1GiB")["peak"]["spare_bytes"] ==
          std::int64_t(memory - (1ULL << 30)) - high);
    // The CSV's last three columns say the same; without a device they are empty.
    const std::string csv = testing::memcalc(run + " --format csv").out;
    const std::string row = csv.substr(csv.find('\n') + 1);
    CHECK_THAT(row, Catch::EndsWith(std::to_string(memory) + ",true," +
                                    std::to_string(std::int64_t(memory) - high) + "\n"));
    CHECK_THAT(testing::memcalc("--preset llama-7b --format csv").out, Catch::EndsWith(",,,\n"));
    CHECK(report("").contains("device"));
    const testing::Run bare = testing::memcalc("--preset llama-7b --format json");
    CHECK(nlohmann::json::parse(bare.out)["peak"]["fits"].is_null());
    // A reserve needs a device.
    const testing::Run lone = testing::memcalc("--preset llama-7b --reserve 1GiB");
    CHECK(lone.status == 2);
    CHECK_THAT(lone.err, Catch::Contains("--reserve 1GiB needs --device-memory"));
}

TEST_CASE("fit's largest size is the largest the estimate says fits", "[cli][defaults]") {
    const std::string model =
        "--preset llama-7b --dp 8 --zero 3 --gpu a100-80gb --recompute full --multiple-of 256";
    const testing::Run fit = testing::memcalc("fit " + model + " --format json");
    REQUIRE(fit.status == 0);
    const nlohmann::json answer = nlohmann::json::parse(fit.out);
    INFO(answer.dump());
    const std::uint64_t largest = answer["results"][0]["largest"].get<std::uint64_t>();
    const auto fits = [&](std::uint64_t seq) {
        const testing::Run r = testing::memcalc(
            "--preset llama-7b --dp 8 --zero 3 --gpu a100-80gb --recompute full "
            "--format json --seq " +
            std::to_string(seq));
        REQUIRE(r.status == 0);
        return nlohmann::json::parse(r.out)["peak"]["fits"].get<bool>();
    };
    CHECK(fits(largest));
    CHECK_FALSE(fits(largest + 256));
}

TEST_CASE("attention sdpa gives the fused kernel's figures", "[cli][defaults]") {
    const std::string run = "--preset llama-3-8b --seq 2048 --format json --attention ";
    const testing::Run sdpa = testing::memcalc(run + "sdpa");
    REQUIRE(sdpa.status == 0);
    CHECK(sdpa.out == testing::memcalc(run + "flash").out);
}

TEST_CASE("a setting that shards nothing says so", "[cli][defaults]") {
    const testing::Run alone = testing::memcalc("--preset llama-7b --zero 1");
    CHECK(alone.status == 0);
    CHECK(alone.err == "memcalc: --zero 1 over one data-parallel rank shards nothing\n");
    CHECK_THAT(testing::memcalc("--preset llama-7b --zero 3").err,
               Catch::Contains("shards nothing (the layers' gathered weights are still counted)"));
    CHECK(testing::memcalc("--preset llama-7b --zero 3 --dp 8").err.empty());
}

TEST_CASE("memcalc optimizers says which steps are fused kernels", "[cli][defaults]") {
    const testing::Run run = testing::memcalc("optimizers --format json");
    REQUIRE(run.status == 0);
    const nlohmann::json rows = nlohmann::json::parse(run.out);
    REQUIRE(rows.size() == 6);
    std::map<std::string, std::string> step;
    for (const auto& row : rows) step[row["name"]] = row["step"];
    CHECK_THAT(step["adam-8bit"], Catch::StartsWith("fused: its own kernel"));  // bitsandbytes'
    CHECK_THAT(step["adafactor"], Catch::StartsWith("for-loop: its own Python loop"));
    CHECK_THAT(step["adam"], Catch::StartsWith("as --optimizer-impl says"));
    CHECK_THAT(testing::memcalc("optimizers").out, Catch::Contains("adam-8bit"));
}

TEST_CASE("plan's pins keep the layouts they do not constrain", "[cli][defaults][plan]") {
    // A ZeRO stage says nothing of a single replica: it was dropped, now planned with stage 0.
    const std::string run =
        "plan --preset llama-7b --gpu h100-sxm --gpus 8 --seq 4096 "
        "--global-batch 8 --dp 1 --format json";
    const testing::Run pinned = testing::memcalc(run + " --zero 1");
    REQUIRE(pinned.status == 0);
    const nlohmann::json layouts = nlohmann::json::parse(pinned.out)["layouts"];
    REQUIRE_FALSE(layouts.empty());
    CHECK(layouts[0]["dp"] == 1);
    CHECK(layouts[0]["zero"] == 0);
    CHECK(layouts == nlohmann::json::parse(testing::memcalc(run).out)["layouts"]);
}

TEST_CASE(
    "each pipeline stage's device has its reserved and device figures; the verdict weighs "
    "the fullest",
    "[cli][defaults]") {
    const testing::Run r = testing::memcalc(
        "--preset llama-7b --seq 4096 --pp 4 --microbatches 8 --gpu h100-sxm --format json");
    REQUIRE(r.status == 0);
    const nlohmann::json j = nlohmann::json::parse(r.out);
    std::int64_t fullest = 0;
    for (const auto& rank : j["ranks"]) {
        const auto& peak = rank["peak"];
        CHECK(peak["reserved_bytes"].get<std::int64_t>() >= peak["bytes"].get<std::int64_t>());
        CHECK(peak["device_high_bytes"].get<std::int64_t>() >=
              peak["device_bytes"].get<std::int64_t>());
        fullest = std::max(fullest, peak["device_high_bytes"].get<std::int64_t>());
    }
    CHECK(j["peak"]["device_band"]["high_bytes"] == fullest);
    CHECK(j["peak"]["spare_bytes"] == std::int64_t(81559ULL << 20) - fullest);
}
