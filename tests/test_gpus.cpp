// GPUs by name: every built-in one reads back from its listing as itself, --gpu gives what its
// memory given by hand gives, and bad names and files are named.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <tuple>
#include <nlohmann/json.hpp>

#include "gpu_file.hpp"
#include "memcalc/attention_kernels.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/step_time.hpp"
#include "render.hpp"
#include "run_program.hpp"

using namespace memcalc;
using memcalc::cli::parse_gpu_json;

TEST_CASE("every listed GPU reads back as itself", "[gpus]") {
    const auto listed =
        nlohmann::json::parse(cli::render_listing(cli::gpus_listing(), cli::Format::json));
    REQUIRE(listed.size() == gpus.size());
    for (std::size_t i = 0; i < gpus.size(); ++i) {
        CAPTURE(gpus[i].name);
        const Gpu read =
            parse_gpu_json(listed[i].dump(), "listed");  // memory_gib is shown, not read
        CHECK(read.name == gpus[i].name);
        CHECK(read.memory == gpus[i].memory);
        CHECK(read.peak_bf16_flops == gpus[i].peak_bf16_flops);
        CHECK(read.peak_fp8_flops == gpus[i].peak_fp8_flops);
        CHECK(read.intra_node_bandwidth == gpus[i].intra_node_bandwidth);
        CHECK(read.inter_node_bandwidth == gpus[i].inter_node_bandwidth);
        CHECK(read.gpus_per_node == gpus[i].gpus_per_node);
        CHECK(read.host_bandwidth == gpus[i].host_bandwidth);
        CHECK(read.performance_source == gpus[i].performance_source);
        CHECK(read.network_source == gpus[i].network_source);
        CHECK(!gpus[i].performance_source.empty());
        CHECK(!gpus[i].network_source.empty());
        // Dense figures: fp8, where there is one, runs at twice bf16's rate on every listed part
        // (the L40S's datasheet: 733 against 362.05).
        if (gpus[i].peak_fp8_flops != 0)
            CHECK(gpus[i].peak_fp8_flops == Approx(2.0 * gpus[i].peak_bf16_flops).epsilon(0.03));
        CHECK(read.memory.value() % (1u << 20) == 0);  // as the driver reports it: whole MiB
        CHECK(!gpus[i].source.empty());
        CHECK(find_gpu(gpus[i].name) == &gpus[i]);
    }
}

TEST_CASE("the presets the planner needs, with speeds", "[gpus]") {
    for (const char* name : {"a100-40gb", "a100-80gb", "h100-sxm", "h100-pcie", "h800", "h200",
                             "b200", "mi300x", "l40s", "rtx-4090"}) {
        CAPTURE(name);
        const Gpu* g = find_gpu(name);
        REQUIRE(g != nullptr);
        CHECK(g->peak_bf16_flops > 0);
        CHECK(g->intra_node_bandwidth > 0);
        CHECK(g->gpus_per_node > 0);
        // The host link offload crosses: PCIe Gen4 x16 (32 GB/s each way) or Gen5 x16 (64).
        CHECK((g->host_bandwidth == 32'000'000'000ULL || g->host_bandwidth == 64'000'000'000ULL));
        CHECK_THAT(std::string(g->network_source), Catch::Contains("host link: PCIe Gen"));
    }
    CHECK(find_gpu("a100-80gb")->host_bandwidth == 32'000'000'000ULL);
    CHECK(find_gpu("rtx-4090")->host_bandwidth == 32'000'000'000ULL);
    for (const char* gen5 : {"h100-sxm", "h100-pcie", "h800", "h200", "b200", "mi300x"})
        CHECK(find_gpu(gen5)->host_bandwidth == 64'000'000'000ULL);
    // An H800 is an H100 SXM with less NVLink.
    CHECK(find_gpu("h800")->peak_bf16_flops == find_gpu("h100-sxm")->peak_bf16_flops);
    CHECK(find_gpu("h800")->intra_node_bandwidth < find_gpu("h100-sxm")->intra_node_bandwidth);
    const auto listed =
        nlohmann::json::parse(cli::render_listing(cli::gpus_listing(), cli::Format::json));
    CHECK(listed[2]["peak_bf16_flops"] == 989400000000000ULL);
    CHECK(listed[3]["inter_node_bytes_per_second"].is_null());  // h100-pcie: no standard NIC
    CHECK(listed[2]["host_bytes_per_second"] == 64000000000ULL);
    const std::string table = cli::render_listing(cli::gpus_listing(), cli::Format::table);
    CHECK_THAT(table, Catch::Contains("bf16 TFLOP/s"));
    CHECK_THAT(table, Catch::Contains("989.4"));
    CHECK_THAT(table, Catch::Contains("host GB/s"));
    const std::string csv = cli::render_listing(cli::gpus_listing(), cli::Format::csv);
    CHECK_THAT(csv,
               Catch::Contains(",gpus_per_node,host_bytes_per_second,memory_bytes_per_second\n"));
    CHECK(listed[2]["memory_bytes_per_second"] == 3350000000000ULL);  // H100 SXM's HBM3
    CHECK(listed[2]["gemm_efficiency"] == 0.7);  // the step time's assumptions, listed
    CHECK_THAT(table, Catch::Contains("memory GB/s"));
}

TEST_CASE("the GPUs users name, each at its driver's total in MiB", "[gpus]") {
    using Row = std::tuple<std::string, std::uint64_t, bool>;  // name, MiB, has BF16
    auto [name, mib, bf16] = GENERATE(table<std::string, std::uint64_t, bool>({
        Row{"rtx-3090", 24576, true},
        Row{"rtx-a6000", 49140, true},
        Row{"l40", 46068, true},
        Row{"h20", 97871, true},
        Row{"a800-80gb", 81920, true},
        Row{"v100-16gb", 16384, false},  // Volta: FP16 tensor cores, no BF16
        Row{"v100-32gb", 32768, false},
        Row{"mi250x", 65520, true},  // one GCD: what PyTorch and rocm-smi call a device
        Row{"mi325x", 262128, true},
        Row{"b300", 275040, true},
        Row{"rtx-5090", 32607, true},
    }));
    CAPTURE(name);
    const Gpu* g = find_gpu(name);
    REQUIRE(g != nullptr);
    CHECK(g->memory.value() == mib << 20);
    CHECK((g->peak_bf16_flops > 0) == bf16);
    CHECK(g->intra_node_bandwidth > 0);
    CHECK(g->gpus_per_node > 0);
    CHECK(g->host_bandwidth > 0);
    CHECK_THAT(std::string(g->network_source), Catch::Contains("host link: PCIe Gen"));
    // Where no driver output was found, the source says what the figure is assumed from.
    if (name == "l40" || name == "mi250x" || name == "mi325x")
        CHECK_THAT(std::string(g->source), Catch::StartsWith("assumed"));
}

TEST_CASE("the h20 GPU is the 96 GB H20, not the 141 GB H200 its name begins", "[gpus][cli]") {
    const Gpu& h20 = *find_gpu("h20");
    CHECK(h20.memory.value() < find_gpu("h200")->memory.value());
    CHECK_THAT(std::string(find_gpu("mi250x")->description), Catch::Contains("GCD"));
    const std::string run = "fit --preset llama-7b --recompute full --format csv";
    const auto by_name = testing::memcalc(run + " --gpu h20");
    CHECK(by_name.status == 0);
    CHECK(by_name.err.empty());
    CHECK(
        by_name.out ==
        testing::memcalc(run + " --device-memory " + std::to_string(h20.memory.value()) + "B").out);
    CHECK(by_name.out != testing::memcalc(run + " --gpu h200").out);
    // A near miss of it still names it.
    CHECK_THAT(testing::memcalc(run + " --gpu h2O").err, Catch::Contains("'h20'"));
}

TEST_CASE(
    "a GPU by name gives its memory given by hand, with its own device rows where by hand "
    "each row is its highest",
    "[gpus][cli][slow-sanitized]") {
    const Gpu& h100 = *find_gpu("h100-sxm");
    const std::string bytes = std::to_string(h100.memory.value()) + "B";
    const std::string fit =
        "fit --preset llama-7b --recompute selective --dp 8 --zero 3 --format json";
    const auto fit_by_name = nlohmann::json::parse(testing::memcalc(fit + " --gpu h100-sxm").out);
    const auto fit_by_hand =
        nlohmann::json::parse(testing::memcalc(fit + " --device-memory " + bytes).out);
    CHECK(fit_by_name["capacity_bytes"] == fit_by_hand["capacity_bytes"]);
    CHECK(fit_by_hand["results"][0]["largest"].get<std::uint64_t>() <=
          fit_by_name["results"][0]["largest"].get<std::uint64_t>());
    const std::string run = "--preset llama-7b --seq 4096 --format json";
    const auto by_name = nlohmann::json::parse(testing::memcalc(run + " --gpu h100-sxm").out);
    const auto by_hand =
        nlohmann::json::parse(testing::memcalc(run + " --device-memory " + bytes).out);
    CHECK(by_name["peak"]["bytes"] == by_hand["peak"]["bytes"]);
    CHECK(by_name["peak"]["reserved"]["gpu"] == "h100-sxm");
    CHECK(by_hand["peak"]["reserved"]["gpu"].is_null());
    CHECK(by_name["peak"]["device_bytes"].get<std::uint64_t>() <=
          by_hand["peak"]["device_bytes"].get<std::uint64_t>());
    // The plan: the same memory (the GPU's speeds also time and so rank them, and what each
    // search weighs depends on its ranking: plan_top ranks layouts out before their peak).
    const std::string plan =
        "plan --preset llama-7b --gpus 8 --seq 4096 --global-batch 64 --top 3 --format json";
    const auto named = nlohmann::json::parse(testing::memcalc(plan + " --gpu h100-sxm").out);
    const auto plan_by_hand =
        nlohmann::json::parse(testing::memcalc(plan + " --device-memory " + bytes).out);
    CHECK(named["complete"] == true);
    CHECK(plan_by_hand["complete"] == true);
    CHECK(named["layouts"].size() == 3);
    CHECK(plan_by_hand["layouts"].size() == 3);
    CHECK(named["capacity_bytes"] == plan_by_hand["capacity_bytes"]);
    // A file of the listing's row for it gives the plan what the name gives: memory and speeds.
    const auto listed =
        nlohmann::json::parse(cli::render_listing(cli::gpus_listing(), cli::Format::json));
    const std::string path = "gpu_file_speeds_test.json";
    {
        std::ofstream out(path);
        out << listed[2].dump();  // h100-sxm
    }
    const std::string csv =
        "plan --preset llama-7b --seq 4096 --global-batch 64 --top 3 --format csv";
    const auto by_file = testing::memcalc(csv + " --gpu-file " + path);
    CHECK(by_file.status == 0);
    CHECK(by_file.out == testing::memcalc(csv + " --gpu h100-sxm").out);
    // Every row timed: its step_seconds field is not empty.
    std::istringstream lines(by_file.out);
    std::string header, line;
    std::getline(lines, header);
    const auto field = [](const std::string& row, std::size_t n) {
        std::istringstream cells(row);
        std::string cell;
        for (std::size_t i = 0; i <= n; ++i) std::getline(cells, cell, ',');
        return cell;
    };
    std::size_t step_column = 0;
    while (step_column < 64 && field(header, step_column) != "step_seconds") ++step_column;
    REQUIRE(step_column < 64);
    std::size_t rows = 0;
    for (; std::getline(lines, line); ++rows) CHECK_FALSE(field(line, step_column).empty());
    CHECK(rows == 3);
    std::remove(path.c_str());
    // The "80 GB" of its name is 6.5% short of what the H100 reports: the longest sequence differs.
    const auto nominal = testing::memcalc(
        "fit --preset llama-3.2-1b --recompute full --device-memory 80GB --format csv");
    const auto reported =
        testing::memcalc("fit --preset llama-3.2-1b --recompute full --gpu h100-sxm --format csv");
    CHECK(nominal.out != reported.out);
}

TEST_CASE("a GPU file, an unknown name, or two memories at once", "[gpus][cli]") {
    const std::string path = "gpu_file_test.json";
    {
        std::ofstream out(path);
        out << R"({"name": "my-card", "memory_bytes": 25757220864})";
    }
    // A GPU of one's own has the memory of its file; its device rows are each the highest.
    const auto by_file =
        testing::memcalc("fit --preset gpt2 --gpu-file " + path + " --format json");
    const auto by_name = testing::memcalc("fit --preset gpt2 --gpu rtx-4090 --format json");
    CHECK(by_file.status == 0);
    const auto file_fit = nlohmann::json::parse(by_file.out);
    const auto name_fit = nlohmann::json::parse(by_name.out);
    CHECK(file_fit["capacity_bytes"] == name_fit["capacity_bytes"]);
    for (std::size_t i = 0; i < 3; ++i)
        CHECK(file_fit["results"][i]["largest"].get<std::uint64_t>() <=
              name_fit["results"][i]["largest"].get<std::uint64_t>());
    using Row = std::pair<std::string, std::string>;  // arguments, what stderr says
    auto [args, message] = GENERATE(table<std::string, std::string>({
        Row{"--gpu h100",
            "unknown --gpu 'h100' (did you mean 'h100-sxm', 'h100-pcie' or 'h100-hbm2e-500w'?); "
            "'memcalc gpus' lists them"},
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
    CHECK_THROWS_WITH(parse_gpu_json(R"({"name": "x", "memory": 80})", "g.json"),
                      Catch::Contains("unknown key 'memory'"));
    // The step time's assumptions, replaced by a file's own, in their ranges.
    const Gpu tuned = parse_gpu_json(
        R"({"name": "x", "memory_bytes": 1, "gemm_efficiency": 0.55, "attention_efficiency": 1,
            "inter_node_latency_seconds": 0, "launch_seconds": 5e-6})",
        "g.json");
    CHECK(tuned.gemm_efficiency == 0.55);
    CHECK(tuned.launch_seconds == 5e-6);
    CHECK(tuned.attention_efficiency == 1);
    CHECK(tuned.inter_node_latency == 0);
    CHECK(tuned.intra_node_latency == Gpu{}.intra_node_latency);
    CHECK_THROWS_WITH(
        parse_gpu_json(R"({"name": "x", "memory_bytes": 1, "gemm_efficiency": 1.5})", "g.json"),
        "g.json: gemm_efficiency must be in (0, 1] (got 1.5)");
    CHECK_THROWS_WITH(parse_gpu_json(R"({"name": "x", "memory_bytes": 1,
                                        "intra_node_latency_seconds": -1})",
                                     "g.json"),
                      "g.json: intra_node_latency_seconds must be 0 to 1 s (got -1)");
    CHECK_THROWS_WITH(
        parse_gpu_json(R"({"name": "x", "memory_bytes": 1, "launch_seconds": 2})", "g.json"),
        "g.json: launch_seconds must be 0 to 1 s (got 2)");
    // The speeds are optional (absent or null: unknown), and positive integers when given.
    const Gpu speeds = parse_gpu_json(
        R"({"name": "x", "memory_bytes": 1073741824, "peak_bf16_flops": 1000000000000,
                                          "peak_fp8_flops": null, "gpus_per_node": 4})",
        "g.json");
    CHECK(speeds.peak_bf16_flops == 1000000000000ULL);
    CHECK(speeds.peak_fp8_flops == 0);
    CHECK(speeds.gpus_per_node == 4);
    CHECK_THROWS_WITH(
        parse_gpu_json(R"({"name": "x", "memory_bytes": 1073741824, "peak_bf16_flops": -1})",
                       "g.json"),
        "g.json: peak_bf16_flops must be a positive integer (got -1)");
    CHECK_THROWS_WITH(
        parse_gpu_json(R"({"name": "x", "memory_bytes": 1073741824, "gpus_per_node": "8"})",
                       "g.json"),
        Catch::Contains("gpus_per_node must be a positive integer"));
    CHECK_THROWS_WITH(
        parse_gpu_json(
            R"({"name": "x", "memory_bytes": 1073741824, "intra_node_bytes_per_second": 4.5e11})",
            "g.json"),
        Catch::Contains("intra_node_bytes_per_second must be a positive integer"));
    CHECK_THROWS_WITH(
        parse_gpu_json(R"({"name": "x", "memory_bytes": 1073741824, "memory_gib": "2.00"})",
                       "g.json"),
        "g.json: memory_gib is \"2.00\", but memory_bytes makes it \"1.00\"");
    std::remove(path.c_str());
}

TEST_CASE("a fused attention kernel's measured share of the peak, on its architecture's GPUs",
          "[gpus][time]") {
    const Gpu h100 = *find_gpu("h100-sxm"), h200 = *find_gpu("h200"), a100 = *find_gpu("a100-80gb");
    // By hand from the FlashAttention-3 paper's H100 rates: 3 forward FLOPs counted for the
    // kernel's 1 forward and 2.5 backward.
    const double fa2 = 3 / (1 / 333e12 + 2.5 / 318e12) / 989.4e12;
    CHECK(fa2 == Approx(0.2791).epsilon(1e-3));
    CHECK(attention_efficiency(h100, true, AttentionKernel::flash_attention_2) == Approx(fa2));
    CHECK(attention_efficiency(h100, true, AttentionKernel::cudnn) ==
          Approx(3 / (1 / 529e12 + 2.5 / 518e12) / 989.4e12));
    CHECK(attention_efficiency(h200, true, AttentionKernel::flash_attention_3) ==
          Approx(3 / (1 / 602e12 + 2.5 / 559e12) / 989.4e12));  // Hopper: the H100's share
    // Unmeasured on Ampere, and eager attention runs no fused kernel: the GPU's assumption.
    CHECK(attention_efficiency(a100, true, AttentionKernel::cudnn) == a100.attention_efficiency);
    CHECK(attention_efficiency(h100, false, AttentionKernel::cudnn) == h100.attention_efficiency);
    // The megatron profile runs Transformer Engine's choice, cuDNN; torch's programs SDPA's.
    CHECK(find_profile("megatron")->framework.attention_kernel == AttentionKernel::cudnn);
    CHECK(find_profile("torchtitan")->framework.attention_kernel ==
          AttentionKernel::flash_attention_2);

    // The step's attention seconds at that share: half the scores computed under a causal mask.
    DeviceWork work;
    work.flops = 1e16, work.attention_flops = 1e15, work.attention_computed = 0.5;
    Parallelism one;
    const double peak = static_cast<double>(h100.peak_bf16_flops);
    CHECK(compute_seconds(h100, one, work).attention ==
          Approx(0.5e15 / (peak * h100.attention_efficiency)));
    work.attention_efficiency = fa2;
    CHECK(compute_seconds(h100, one, work).attention == Approx(0.5e15 / (peak * fa2)));
}
