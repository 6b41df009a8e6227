// Loading: what materialising and wrapping the model holds before the first step, per method.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/loading.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
Report sharded(std::uint64_t dp, std::uint64_t seq) {
    Settings s;
    s.seq = seq, s.recompute = Recompute::full;
    s.recipe = builtin_recipe("bf16-adam");
    s.parallel.dp = dp, s.parallel.zero = 3;
    return estimate(fixtures::llama_7b(), s);
}
}  // namespace

TEST_CASE("each loading method's device peak follows its row", "[loading]") {
    const Report r = sharded(8, 2048);
    const RankReport& rank = r.busiest();
    const auto peak = [&](const char* name) {
        return loading_peak(r, rank, *loading_method(name), 8);
    };
    const Count whole = rank.parameters * 2;  // bf16, unsharded
    const Count layer = r.parameters->per_layer() * 2;
    CHECK(peak("to-device").device_bytes == whole);
    CHECK(peak("host-then-move").device_bytes == whole);
    CHECK(peak("fsdp2-on-device").device_bytes == whole * 2);
    CHECK(peak("fsdp1").device_bytes == rank.state.weights + layer);
    CHECK(peak("fsdp1-rank0").device_bytes == peak("fsdp1").device_bytes);
    CHECK(peak("fsdp2-meta").device_bytes < peak("fsdp1").device_bytes);  // a tensor < a layer
    CHECK(peak("fsdp2-meta").device_bytes > rank.state.weights);
    // The host: one model a node when rank 0 reads it, one a rank when every rank does.
    const Count model = r.parameter_count * 2;
    CHECK(peak("to-device").host_bytes_per_node == Count(0));
    CHECK(peak("fsdp1-rank0").host_bytes_per_node == model);
    CHECK(peak("fsdp1").host_bytes_per_node == model * 8);
    CHECK(peak("host-then-move").host_bytes_per_node == model * 16);
    // ZeRO-3 over data parallelism loads by wrapping; one device straight to it.
    CHECK(default_loading(r.settings.parallel).name == std::string("fsdp1"));
    CHECK(default_loading(Parallelism{}).name == std::string("to-device"));
}

TEST_CASE("a loading peak above the step's is said so", "[loading]") {
    // Sharded over 64 ranks at 256 tokens, the step holds little; a whole model moved onto the
    // device before sharding holds more than it.
    const Report r = sharded(64, 256);
    CHECK(fullest_loading(r, *loading_method("fsdp2-on-device"), 8).above_step);
    CHECK_FALSE(fullest_loading(r, *loading_method("fsdp1"), 8).above_step);
}

TEST_CASE("memcalc --loading: JSON's loading, the table's line, and a bad method named",
          "[loading][cli]") {
    const auto r = testing::memcalc(
        "--preset llama-7b --seq 256 --recipe bf16-adam --dp 64 --zero 3 --recompute full "
        "--gpu rtx-3090 --loading fsdp2-on-device --format json");
    REQUIRE(r.status == 0);
    const auto loading = nlohmann::json::parse(r.out).at("loading");
    CHECK(loading.at("method") == "fsdp2-on-device");
    CHECK(loading.at("above_step") == true);
    CHECK(loading.at("fits") == false);  // two copies of 13.5 GB on a 24 GB card
    CHECK(loading.at("device_high_bytes").get<std::uint64_t>() >=
          loading.at("device_bytes").get<std::uint64_t>());
    const auto table = testing::memcalc(
        "--preset llama-7b --seq 256 --recipe bf16-adam --dp 64 --zero 3 --recompute full "
        "--gpu rtx-3090 --loading fsdp2-on-device");
    CHECK_THAT(table.out, Catch::Contains("loading runs out of memory first"));
    const auto bad = testing::memcalc("--preset llama-7b --loading bogus");
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK_THAT(bad.err, Catch::Contains("(got 'bogus')"));
}

TEST_CASE("fit and plan weigh a loading method's peak where one is named",
          "[loading][cli][slow-sanitized]") {
    const std::string fit =
        "fit --preset llama-7b --recipe bf16-adam --dp 64 --zero 3 --gpu rtx-3090 --micro-batch 1 "
        "--recompute full --format json";
    const auto largest = [](const std::string& out) {
        return nlohmann::json::parse(out).at("results").at(0).at("largest");
    };
    const auto plain = testing::memcalc(fit);
    const auto sharded = testing::memcalc(fit + " --loading fsdp1");
    const auto whole = testing::memcalc(fit + " --loading fsdp2-on-device");
    REQUIRE(plain.status == 0);
    REQUIRE(sharded.status == 0);
    REQUIRE(whole.status == 0);
    // A unit at a time passes under the step; two whole copies of 13.5 GB never fit 24 GB.
    CHECK(largest(sharded.out) == largest(plain.out));
    CHECK(largest(plain.out).is_number());
    CHECK(largest(whole.out).is_null());
    const std::string plan =
        "plan --preset llama-7b --gpu rtx-3090 --seq 1024 --global-batch 64 --gpus 64 --zero 3 "
        "--tp 1 --pp 1 --top 2 --format json";
    const auto layouts = [](const std::string& out) {
        return nlohmann::json::parse(out).at("layouts").size();
    };
    const auto planned = testing::memcalc(plan), loaded = testing::memcalc(plan +
                                                                           " --loading "
                                                                           "fsdp2-on-device");
    REQUIRE(planned.status == 0);
    REQUIRE(loaded.status == 0);
    CHECK(layouts(planned.out) == 2);
    CHECK(layouts(loaded.out) == 0);
    CHECK(testing::memcalc(plan + " --loading bogus").status != 0);
}
