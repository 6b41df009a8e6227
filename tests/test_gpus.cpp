// GPUs by name: every built-in one reads back from its listing as itself, --gpu gives what its
// memory given by hand gives, and bad names and files are named.
#include <catch2/catch.hpp>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "gpu_file.hpp"
#include "render.hpp"
#include "run_program.hpp"

using namespace memcalc;
using memcalc::cli::parse_gpu_json;

TEST_CASE("every listed GPU reads back as itself", "[gpus]") {
    const auto listed = nlohmann::json::parse(cli::render_listing(cli::gpus_listing(), cli::Format::json));
    REQUIRE(listed.size() == gpus.size());
    for (std::size_t i = 0; i < gpus.size(); ++i) {
        CAPTURE(gpus[i].name);
        const Gpu read = parse_gpu_json(listed[i].dump(), "listed");  // memory_gib is shown, not read
        CHECK(read.name == gpus[i].name);
        CHECK(read.memory == gpus[i].memory);
        CHECK(read.memory.value() % (1u << 20) == 0);  // as the driver reports it: whole MiB
        CHECK(!gpus[i].source.empty());
        CHECK(find_gpu(gpus[i].name) == &gpus[i]);
    }
}

TEST_CASE("a GPU by name gives what its memory given by hand gives, in fit, plan and the estimate", "[gpus][cli]") {
    const Gpu& h100 = *find_gpu("h100-sxm");
    const std::string bytes = std::to_string(h100.memory.value()) + "B";
    // (The plan's own JSON says how long it took: its CSV is compared.)
    for (const std::string run : {"fit --preset llama-7b --recompute selective --format json", "--preset llama-7b --seq 4096",
                                  "plan --preset llama-7b --gpus 8 --seq 4096 --global-batch 64 --top 3 --format csv"}) {
        CAPTURE(run);
        const auto by_name = testing::memcalc(run + " --gpu h100-sxm");
        const auto by_hand = testing::memcalc(run + " --device-memory " + bytes);
        CHECK(by_name.status == 0);
        CHECK(by_name.out == by_hand.out);
    }
    // The "80 GB" of its name is 6.5% short of what the H100 reports: the longest sequence differs.
    const auto nominal = testing::memcalc("fit --preset llama-3.2-1b --recompute full --device-memory 80GB --format csv");
    const auto reported = testing::memcalc("fit --preset llama-3.2-1b --recompute full --gpu h100-sxm --format csv");
    CHECK(nominal.out != reported.out);
}

TEST_CASE("a GPU file, an unknown name, or two memories at once", "[gpus][cli]") {
    const std::string path = "gpu_file_test.json";
    {
        std::ofstream out(path);
        out << R"({"name": "my-card", "memory_bytes": 25757220864})";
    }
    const auto by_file = testing::memcalc("fit --preset gpt2 --gpu-file " + path + " --format csv");
    const auto by_name = testing::memcalc("fit --preset gpt2 --gpu rtx-4090 --format csv");
    CHECK(by_file.status == 0);
    CHECK(by_file.out == by_name.out);
    using Row = std::pair<std::string, std::string>;  // arguments, what stderr says
    auto [args, message] = GENERATE(table<std::string, std::string>({
        Row{"--gpu h100", "unknown --gpu 'h100' (did you mean 'h100-sxm'?); 'memcalc gpus' lists them"},
        Row{"--gpu h100-sxm --device-memory 80GB", "excludes"},
        Row{"--gpu-file no-such-gpu.json", "GPU file 'no-such-gpu.json'"},
        Row{"", "fit needs --device-memory or --gpu"},
    }));
    const auto r = testing::memcalc("fit --preset gpt2 " + args);
    CAPTURE(args);
    CHECK(r.status != 0);
    CHECK(r.out.empty());
    CHECK(r.err.find(message) != std::string::npos);
    CHECK_THROWS_WITH(parse_gpu_json(R"({"name": "x", "memory_bytes": 0})", "g.json"),
                      "g.json: memory_bytes must be a positive integer (got 0)");
    CHECK_THROWS_WITH(parse_gpu_json(R"({"name": "x", "memory": 80})", "g.json"), Catch::Contains("unknown key 'memory'"));
    CHECK_THROWS_WITH(parse_gpu_json(R"({"name": "x", "memory_bytes": 1073741824, "memory_gib": "2.00"})", "g.json"),
                      "g.json: memory_gib is \"2.00\", but memory_bytes makes it \"1.00\"");
    std::remove(path.c_str());
}
