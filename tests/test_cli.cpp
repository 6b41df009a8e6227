// Tests of the built program: what a person, a script and a CI job see.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

#include "doc_pages.hpp"
#include "run_program.hpp"

using nlohmann::json;

namespace {
/// "{}" placeholders filled in order with each value's text (JSON numbers as they print).
template <typename... Values>
std::string fmt(std::string pattern, const Values&... values) {
    std::vector<std::string> texts;
    const auto text = [](const auto& v) {
        std::ostringstream out;
        out << v;
        return out.str();
    };
    (texts.push_back(text(values)), ...);
    std::string out;
    std::size_t next = 0;
    for (std::size_t i = 0; i < pattern.size(); ++i) {
        if (pattern.compare(i, 2, "{}") == 0 && next < texts.size()) {
            out += texts[next++];
            ++i;
        } else {
            out += pattern[i];
        }
    }
    return out;
}

std::size_t count_lines(const std::string& text) {
    return static_cast<std::size_t>(std::count(text.begin(), text.end(), '\n'));
}
}  // namespace

TEST_CASE("the chapter's command prints the chapter's figures", "[cli][chapter]") {
    const auto run = testing::memcalc("--preset llama-7b --seq 4096 --recompute selective");
    REQUIRE(run.status == 0);
    CHECK(run.err.empty());
    CHECK_THAT(run.out, Catch::Contains("Parameters: 6,738,415,616"));
    CHECK_THAT(run.out, Catch::Contains("107,814,649,856 B  107.8 GB"));
    CHECK_THAT(run.out, Catch::Contains("104,152,956,928 B (104.2 GB) without recomputation"));
    CHECK_THAT(run.out, Catch::Contains("Peak: 116.1 GB at backward 32 (116,095,778,816 B)"));
    // The sections come in the documented order.
    const auto at = [&](const char* s) { return run.out.find(s); };
    CHECK(at("Parameters:") < at("Training state:"));
    CHECK(at("Training state:") < at("Activations of one layer"));
    CHECK(at("Activations of one layer") < at("Timeline"));
    CHECK(at("Timeline") < at("Peak:"));
}

TEST_CASE("the three recomputation modes' peaks as printed", "[cli][chapter]") {
    using Row = std::pair<const char*, const char*>;
    const auto [mode, line] = GENERATE(table<const char*, const char*>({
        Row{"none", "Peak: 199.5 GB at loss"},
        Row{"selective", "Peak: 116.1 GB at backward 32"},
        Row{"full", "Peak: 110.7 GB at backward 1"},
    }));
    const auto run =
        testing::memcalc(std::string("--preset llama-7b --seq 4096 --recompute ") + mode);
    REQUIRE(run.status == 0);
    CHECK_THAT(run.out, Catch::Contains(line));
}

TEST_CASE("JSON carries the stable keys with exact integers", "[cli][json]") {
    const auto run =
        testing::memcalc("--preset llama-7b --seq 4096 --recompute full --format json");
    REQUIRE(run.status == 0);
    const json j = json::parse(run.out);
    CHECK(j["parameters"]["total"].get<std::uint64_t>() == 6738415616ULL);
    CHECK(j["state"]["bytes"].get<std::uint64_t>() == 107814649856ULL);
    CHECK(j["activations"]["kept_bytes"].get<std::uint64_t>() == 32ULL * 2 * 4096 * 4096);
    CHECK(j["activations"]["bytes"].get<std::uint64_t>() == 104152956928ULL);
    CHECK(j["peak"]["bytes"].get<std::uint64_t>() == 110698217472ULL);
    CHECK(j["peak"]["step"] == "backward 1");
    CHECK(j["settings"]["recompute"] == "full");
    REQUIRE(j["timeline"].size() == 66);
    CHECK(j["timeline"][0]["step"] == "forward 1");
    CHECK(j["timeline"][32]["step"] == "loss");
    CHECK(j["timeline"][65]["step"] == "optimizer");
    for (const auto& step : j["timeline"]) {
        std::uint64_t sum = 0;
        for (const auto& [key, bytes] : step["by_category"].items())
            sum += bytes.get<std::uint64_t>();
        CHECK(sum == step["bytes"].get<std::uint64_t>());
    }
}

TEST_CASE("activations double with the micro-batch through the program", "[cli][json]") {
    const json one =
        json::parse(testing::memcalc("--preset mistral-7b --seq 2048 -b 1 --format json").out);
    const json two =
        json::parse(testing::memcalc("--preset mistral-7b --seq 2048 -b 2 --format json").out);
    CHECK(two["activations"]["bytes"].get<std::uint64_t>() ==
          2 * one["activations"]["bytes"].get<std::uint64_t>());
}

TEST_CASE("a sweep prints one row or object per combination", "[cli][sweep]") {
    const auto csv =
        testing::memcalc("--preset llama-7b --seq 1024,2048,4096 --recompute all --format csv");
    REQUIRE(csv.status == 0);
    CHECK(count_lines(csv.out) == 1 + 9);
    CHECK(
        csv.out.rfind(
            "model,seq,micro_batch,recompute,recipe,activations,attention,parameters,state_bytes,",
            0) == 0);
    CHECK_THAT(csv.out, Catch::Contains("llama-7b,4096,1,selective,mixed-adam,korthikanti,eager,"
                                        "6738415616,107814649856,104152956928,"
                                        "18253611008,116095778816,backward 32,"));

    const auto j = testing::memcalc("--preset gpt2 --seq 256,512 -b 1,2 --format json");
    REQUIRE(j.status == 0);
    const json all = json::parse(j.out);
    REQUIRE(all.is_array());
    CHECK(all.size() == 4);
    CHECK(all[3]["settings"]["seq"] == 512);
    CHECK(all[3]["settings"]["micro_batch"] == 2);

    const auto table = testing::memcalc("--preset gpt2 --seq 256,512");
    REQUIRE(table.status == 0);
    CHECK(count_lines(table.out) == 3);
}

TEST_CASE("a sweep's lists are multiplied before a row is made: past --sweep-limit it is refused",
          "[cli][sweep][limit]") {
    // memcalc 1.2 spooled the 4e8 rows (73 GB of CSV) before printing anything.
    const auto huge = testing::shell(
        "L=$(seq -s, 1 20000); timeout 20 memcalc --preset llama-7b "
        "--seq $L -b $L --format csv | wc -c");
    CHECK(huge.out == "0\n");
    CHECK(huge.err ==
          "memcalc: a sweep of 400,000,000 configurations (--seq 20000 x --micro-batch "
          "20000) exceeds the limit of 1,000,000: shorten the lists or raise "
          "--sweep-limit\n");
    // Every list counts, the layouts' too, and the limit is the user's to raise.
    const auto layouts = testing::memcalc(
        "--preset llama-7b --seq 1024,2048 --dp 1,2 --tp 1,2 "
        "--zero 0,1 --recompute all --sweep-limit 47");
    CHECK(layouts.status == 2);
    CHECK_THAT(layouts.err, Catch::Contains("48 configurations (--seq 2 x --recompute 3 x --dp 2 x "
                                            "--tp 2 x --zero 2) exceeds the limit of 47"));
    const auto raised = testing::memcalc(
        "--preset llama-7b --seq 1024,2048 --dp 1,2 --tp 1,2 "
        "--zero 0,1 --recompute all --sweep-limit 48 "
        "--format csv");
    CHECK(raised.status == 0);
    CHECK(count_lines(raised.out) == 1 + 48);
}

TEST_CASE("a single configuration in CSV is the sweep's header and one row", "[cli][csv]") {
    const auto run = testing::memcalc("--preset llama-7b --seq 4096 --format csv");
    REQUIRE(run.status == 0);
    CHECK(count_lines(run.out) == 2);
    CHECK_THAT(run.out, Catch::Contains(",199539351552,loss,"));
}

TEST_CASE("units gib switches to binary units", "[cli]") {
    const auto run =
        testing::memcalc("--preset llama-7b --seq 4096 --recompute selective --units gib");
    CHECK_THAT(run.out, Catch::Contains("Peak: 108.1 GiB at backward 32"));
}

TEST_CASE("timeline flag prints every step; the default prints a compact list", "[cli]") {
    const auto all = testing::memcalc("--preset llama-7b --seq 4096 --timeline");
    const auto compact = testing::memcalc("--preset llama-7b --seq 4096");
    CHECK_THAT(all.out, Catch::Contains("forward 17"));
    CHECK_THAT(all.out, Catch::Contains("backward 17"));
    CHECK_THAT(compact.out, !Catch::Contains("forward 17"));
    CHECK_THAT(compact.out, Catch::Contains("forward 32"));
}

TEST_CASE("per-layer flag prints the op-by-op table alone", "[cli]") {
    const auto run = testing::memcalc("--preset decoder --per-layer");
    REQUIRE(run.status == 0);
    CHECK_THAT(run.out, Catch::Contains("34 sbh + 5 as^2b  4,992"));
    CHECK_THAT(run.out, !Catch::Contains("Peak:"));
    const json j = json::parse(testing::memcalc("--preset decoder --per-layer --format json").out);
    CHECK(j["layer_bytes"] == 4992);
    CHECK(j["tensors"].size() == 14);
}

TEST_CASE("presets and recipes are listed", "[cli]") {
    const auto run = testing::memcalc("presets");
    REQUIRE(run.status == 0);
    CHECK_THAT(run.out, Catch::Contains("llama-7b"));
    CHECK_THAT(run.out, Catch::Contains("6,738,415,616"));
    const json j = json::parse(testing::memcalc("presets --format json").out);
    CHECK(j.size() >= 14);
    for (const auto& p : j)
        if (!p["published_parameters"].is_null())
            CHECK(p["parameters"] == p["published_parameters"]);
    CHECK_THAT(testing::memcalc("recipes").out, Catch::Contains("mixed-adam-fp32-grads"));
    CHECK(count_lines(testing::memcalc("recipes --format csv").out) ==
          json::parse(testing::memcalc("recipes --format json").out).size() + 1);
}

TEST_CASE("help explains with examples and version prints the version", "[cli]") {
    const auto help = testing::memcalc("--help");
    CHECK(help.status == 0);
    CHECK_THAT(help.out, Catch::Contains("Examples:"));
    CHECK_THAT(help.out, Catch::Contains("--recompute"));
    CHECK_THAT(testing::memcalc("--version").out, Catch::Contains("memcalc 1.2.0"));
}

TEST_CASE("every --help fits 120 columns but for the example commands", "[cli]") {
    for (const std::string command : {"", "plan ", "fit ", "serve ", "rl "}) {
        std::istringstream lines(testing::memcalc(command + "--help").out);
        for (std::string line; std::getline(lines, line);) {
            if (line.rfind("  memcalc ", 0) == 0) continue;  // to be copied whole
            CAPTURE(command, line);
            CHECK(line.size() <= 120);
        }
    }
}

TEST_CASE("every example a command's --help shows runs", "[cli][slow-sanitized]") {
    for (const std::string command : {"", "plan ", "fit ", "serve ", "rl "}) {
        const std::string help = testing::memcalc(command + "--help").out;
        const auto examples = help.find("\nExamples:\n");
        REQUIRE(examples != std::string::npos);
        std::istringstream lines(help.substr(examples + 11));
        std::size_t ran = 0;
        for (std::string line; std::getline(lines, line) && line.rfind("  memcalc ", 0) == 0;) {
            const std::string args = line.substr(10);
            // A model file or folder of the reader's own: nothing here to run it on.
            if (args.find("my-model.json") != std::string::npos ||
                args.find("Llama-2-7b-hf") != std::string::npos)
                continue;
            CAPTURE(args);
            CHECK(testing::memcalc(args).status == 0);
            ++ran;
        }
        CAPTURE(command);
        CHECK(ran >= 2);
    }
}

TEST_CASE("the architecture-aware model through the program", "[cli][architecture]") {
    const auto run = testing::memcalc(
        "--preset llama-3-8b --seq 8192 --activations architecture --attention flash --format "
        "json");
    REQUIRE(run.status == 0);
    const json j = json::parse(run.out);
    CHECK(j["settings"]["activations"] == "architecture");
    CHECK(j["settings"]["attention"] == "flash");
    CHECK(j["activations"]["model"] == "architecture");
    for (const auto& t : j["activations"]["tensors"]) CHECK(t["symbol"] != "as^2b");
    CHECK(j["activations"]["head_bytes"].get<std::uint64_t>() > 0);
    CHECK(j["activations"]["input_side_bytes"].get<std::uint64_t>() > 0);
    // The chapter's figures do not move unless the architecture model is asked for.
    const json chapter = json::parse(
        testing::memcalc("--preset llama-7b --seq 4096 --activations korthikanti --format json")
            .out);
    CHECK(chapter["peak"]["bytes"].get<std::uint64_t>() == 199539351552ULL);

    const auto table =
        testing::memcalc("--preset mixtral-8x7b --seq 1024 --activations architecture --per-layer");
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("why backward needs it"));
    CHECK_THAT(table.out, Catch::Contains("router softmax"));
    CHECK_THAT(table.out, Catch::Contains("Head and loss"));
}

TEST_CASE("recompute op through the program: the policy's outputs named and counted",
          "[cli][architecture]") {
    const auto run = testing::memcalc(
        "--preset llama-3-8b --seq 8192 --activations architecture --attention flash "
        "--recompute op --format json");
    REQUIRE(run.status == 0);
    const json j = json::parse(run.out);
    CHECK(j["settings"]["recompute"] == "op");
    std::uint64_t kept = j["activations"]["layer_input_bytes"].get<std::uint64_t>();
    for (const auto& t : j["activations"]["tensors"])
        if (t["kept"].get<bool>()) kept += t["bytes"].get<std::uint64_t>();
    REQUIRE(j["activations"]["policy_output_tensors"].size() ==
            2);  // q's output and the down projection's
    for (const auto& t : j["activations"]["policy_output_tensors"])
        kept += t["bytes"].get<std::uint64_t>();
    CHECK(j["activations"]["kept_layer_bytes"].get<std::uint64_t>() == kept);
    // The other modes' JSON has no such key.
    const json none = json::parse(
        testing::memcalc("--preset llama-3-8b --seq 8192 --activations architecture --format json")
            .out);
    CHECK_FALSE(none["activations"].contains("policy_output_tensors"));
    const auto table = testing::memcalc(
        "--preset llama-3-8b --seq 8192 --activations architecture --recompute op --per-layer");
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("op outputs the policy saves beyond the rows"));
    CHECK_THAT(table.out, Catch::Contains("the layer's input and the saved op outputs"));
}

TEST_CASE("a parallel layout through the program: every stage and the most loaded",
          "[cli][parallel]") {
    const auto run = testing::memcalc(
        "--preset llama-2-70b --seq 4096 --tp 8 --sp --pp 4 --dp 2 --zero 1 --global-batch 128 "
        "--recompute selective --format json");
    REQUIRE(run.status == 0);
    const json j = json::parse(run.out);
    CHECK(j["settings"]["parallel"]["devices"] == 64);
    CHECK(j["settings"]["parallel"]["microbatches"] == 64);  // 128 / (1 x 2)
    REQUIRE(j["ranks"].size() == 4);
    CHECK(j["ranks"][0]["holds_embedding"] == true);
    CHECK(j["ranks"][3]["holds_head"] == true);
    CHECK(j["ranks"][0]["in_flight"] == 4);
    std::uint64_t highest = 0;
    for (const auto& rank : j["ranks"])
        highest = std::max(highest, rank["peak"]["bytes"].get<std::uint64_t>());
    CHECK(j["peak"]["bytes"].get<std::uint64_t>() == highest);
    CHECK(j["peak"]["stage"] == 0);
    // Each rank's peak by category: its parts sum to its bytes, its state among them, and the
    // stages differ.
    for (const auto& rank : j["ranks"]) {
        std::uint64_t sum = 0;
        for (const auto& [key, bytes] : rank["peak"]["by_category"].items())
            sum += bytes.get<std::uint64_t>();
        CHECK(sum == rank["peak"]["bytes"].get<std::uint64_t>());
        CHECK(rank["peak"]["by_category"]["weights"] == rank["state"]["weights"]);
    }
    CHECK(j["ranks"][0]["peak"]["by_category"]["kept_activations"] !=
          j["ranks"][3]["peak"]["by_category"]["kept_activations"]);

    const auto table = testing::memcalc(
        "--preset llama-2-70b --seq 4096 --tp 8 --pp 4 --dp 2 --zero 1 --global-batch 128");
    REQUIRE(table.status == 0);
    CHECK_THAT(
        table.out,
        Catch::Contains("Parallel layout: 64 devices = dp 2 x tp 8 x pp 4, ZeRO-1 over 2 ranks"));
    CHECK_THAT(table.out, Catch::Contains("<- most loaded"));
    CHECK_THAT(table.out, Catch::Contains("Peak per device:"));
}

TEST_CASE("other tools' figures beside memcalc's and offload to host memory", "[cli][parallel]") {
    const auto megatron = testing::memcalc(
        "--preset llama-2-70b --seq 4096 --dp 8 --tp 8 --sp --zero 1 --recompute selective "
        "--recipe mixed-adam-fp32-grads --compare megatron --format json");
    REQUIRE(megatron.status == 0);
    const json m = json::parse(megatron.out)["compare"];
    CHECK(m["tool"] == "megatron");
    CHECK(m["megatron"]["bytes_per_parameter"].get<double>() == Approx(6 + 12.0 / 8));
    CHECK(m["megatron"]["padded_vocab"] == 32768);
    // With the 18-byte recipe both count the same state but for one detail: Megatron pads the
    // vocabulary to 32,768 rows. (Its formula divided the norms by tp too until PR #4687, May 2026;
    // now both keep them whole on every rank, so that term is gone.)
    const double per_parameter = 6 + 12.0 / 8;
    const double vocab_rows = (32768.0 - 32000) * 8192 * 2 / 8;
    CHECK(m["megatron"]["weight_and_optimizer_bytes"].get<double>() ==
          Approx(m["memcalc"]["state_bytes"].get<double>() + vocab_rows * per_parameter)
              .epsilon(1e-9));

    const auto deepspeed = testing::memcalc(
        "--preset llama-7b --seq 2048 --dp 16 --zero 3 --offload optimizer --compare deepspeed");
    REQUIRE(deepspeed.status == 0);
    CHECK_THAT(deepspeed.out,
               Catch::Contains(
                   "Compared with DeepSpeed's ZeRO-3 model-state estimator (8 GPUs per node)"));
    CHECK_THAT(deepspeed.out, Catch::Contains("optimizer offloaded to host memory"));
    const json d = json::parse(
        testing::memcalc(
            "--preset llama-7b --seq 2048 --dp 16 --zero 3 --offload optimizer --format json")
            .out);
    // The master copy, Adam's moments and an fp32 copy of the gradients, 16 bytes per parameter,
    // sharded 16 ways, live in host memory; the device keeps its weights' shard and no gradients.
    CHECK(d["ranks"][0]["host_bytes"].get<std::uint64_t>() == (6738415616ULL + 15) / 16 * 16);
    CHECK(d["ranks"][0]["state"]["optimizer_state"] == 0);
    CHECK(d["ranks"][0]["state"]["gradients"] == 0);
}

TEST_CASE("memcalc fit answers per recomputation mode in every format",
          "[cli][fit][slow-sanitized]") {
    const auto run = testing::memcalc(
        "fit --preset llama-7b --device-memory 141GB --reserve 2GiB --format json");
    REQUIRE(run.status == 0);
    const json j = json::parse(run.out);
    CHECK(j["command"] == "fit");
    CHECK(j["search"] == "seq");
    CHECK(j["capacity_bytes"].get<std::uint64_t>() == 141000000000ULL - (1ULL << 30) * 2);
    REQUIRE(j["results"].size() == 3);
    std::uint64_t previous = 0;
    for (const auto& r : j["results"]) {  // recomputation buys sequence length
        CHECK(r["peak"]["bytes"].get<std::uint64_t>() <= j["capacity_bytes"].get<std::uint64_t>());
        CHECK(r["first_over"]["size"].get<std::uint64_t>() ==
              r["largest"].get<std::uint64_t>() + 1);
        CHECK(r["largest"].get<std::uint64_t>() > previous);
        previous = r["largest"].get<std::uint64_t>();
    }
    // The answer agrees with the estimate for that size.
    const auto largest = j["results"][1]["largest"].get<std::uint64_t>();
    const json at = json::parse(
        testing::memcalc("--preset llama-7b --recompute selective --format json --seq " +
                         std::to_string(largest))
            .out);
    CHECK(at["peak"]["bytes"] == j["results"][1]["peak"]["bytes"]);

    const auto table = testing::memcalc(
        "fit --preset llama-7b --device-memory 80GB --dp 8 --zero 3 --seq 4096 --recompute full");
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out,
               Catch::Contains("the largest micro-batch whose device figure (high end) fits"));
    CHECK(count_lines(
              testing::memcalc("fit --preset gpt2 --device-memory 24GiB --format csv").out) == 4);
}

TEST_CASE("memcalc plan ranks the layouts that fit", "[cli][plan][slow-sanitized]") {
    const auto run = testing::memcalc(
        "plan --preset llama-2-70b --gpus 64 --device-memory 80GB --seq 4096 --global-batch 512 "
        "--top 5 --format json");
    REQUIRE(run.status == 0);
    CHECK(run.err.empty());  // no progress line when stderr is not a terminal
    const json j = json::parse(run.out);
    CHECK(j["command"] == "plan");
    CHECK(j["evaluated"].get<std::uint64_t>() > j["fitting"].get<std::uint64_t>());
    REQUIRE(j["layouts"].size() == 5);
    for (const auto& l : j["layouts"]) {
        CHECK(l["dp"].get<std::uint64_t>() * l["tp"].get<std::uint64_t>() *
                  l["pp"].get<std::uint64_t>() * l["cp"].get<std::uint64_t>() ==
              64);
        CHECK(l["peak"]["bytes"].get<std::uint64_t>() <= j["capacity_bytes"].get<std::uint64_t>());
    }
    // The first layout, estimated on its own, has the same peak.
    const json& best = j["layouts"][0];
    const auto one = testing::memcalc(fmt(
        "--preset llama-2-70b --seq 4096 --format json --dp {} --tp {} --pp {} --cp {} --zero {} "
        "--micro-batch {} --global-batch 512 --recompute {} --offload {}{}",
        best["dp"], best["tp"], best["pp"], best["cp"], best["zero"], best["micro_batch"],
        best["recompute"].get<std::string>(), best["offload"].get<std::string>(),
        best["sequence_parallel"].get<bool>() ? " --sp" : ""));
    REQUIRE(one.status == 0);
    CHECK(json::parse(one.out)["peak"]["bytes"] == best["peak"]["bytes"]);
    CHECK(count_lines(testing::memcalc("plan --preset llama-7b --gpus 8 --device-memory 80GB --seq "
                                       "2048 --global-batch 64 --top 3 "
                                       "--format csv")
                          .out) == 4);
}

TEST_CASE("output files are written whole or not at all", "[cli][output]") {
    const std::string path = "memcalc_output_test.json";
    std::remove(path.c_str());
    const auto ok = testing::memcalc("--preset llama-7b --seq 4096 --format json --output " + path);
    CHECK(ok.status == 0);
    CHECK(ok.out.empty());
    std::ifstream written(path);
    std::stringstream text;
    text << written.rdbuf();
    CHECK(json::parse(text.str())["peak"]["bytes"] == 199539351552ULL);

    // A failing run leaves the earlier file as it was, and no temporary file beside it.
    const auto bad = testing::memcalc("--preset llama-7b --seq 0 --format json --output " + path);
    CHECK(bad.status == 2);
    std::ifstream still(path);
    std::stringstream again;
    again << still.rdbuf();
    CHECK(again.str() == text.str());
    CHECK_FALSE(std::ifstream(path + ".memcalc-tmp").good());
    std::remove(path.c_str());

    const auto unwritable =
        testing::memcalc("--preset llama-7b --output /nonexistent-dir/out.json");
    CHECK(unwritable.status == 1);
    CHECK_THAT(unwritable.err, Catch::Contains("cannot write '/nonexistent-dir/out.json'"));
}

TEST_CASE("a HuggingFace config.json through the program", "[cli]") {
    const auto run = testing::memcalc(std::string("--config ") + MEMCALC_SOURCE_DIR +
                                      "/tests/configs/gemma-2-9b-it.json --seq 8 --format csv");
    REQUIRE(run.status == 0);
    CHECK_THAT(run.out,
               Catch::Contains("gemma-2-9b-it,8,1,none,mixed-adam,korthikanti,eager,9241705984,"));
}

TEST_CASE("a user's model file is accepted", "[cli]") {
    const std::string path = "memcalc_cli_model.json";
    std::ofstream(path)
        << R"({"name": "tiny", "hidden": 64, "layers": 2, "heads": 4, "ffn": 256, "vocab": 100})";
    const auto run = testing::memcalc("--model-file " + path + " --seq 32 --format json");
    std::remove(path.c_str());
    REQUIRE(run.status == 0);
    CHECK(json::parse(run.out)["model"]["name"] == "tiny");
}

TEST_CASE(
    "bad input: one line on stderr naming the value and a non-zero exit with nothing on stdout",
    "[cli][errors]") {
    std::ofstream("memcalc_bad.json") << "{\"hidden\": 4096,\n \"layers\": }";
    std::ofstream("memcalc_heads.json")
        << R"({"hidden": 100, "layers": 2, "heads": 3, "ffn": 400, "vocab": 10})";
    std::ofstream("memcalc_twice.json")
        << R"({"hidden": 64, "hidden": 128, "layers": 2, "heads": 2, "ffn": 8, "vocab": 10})";
    std::ofstream("memcalc_valid.json")
        << R"({"hidden": 64, "layers": 2, "heads": 2, "ffn": 8, "vocab": 10})";
    using Row = std::tuple<std::string, int, std::string>;
    const auto [args, status, message] = GENERATE(table<std::string, int, std::string>({
        Row{"--preset llama7b", 1, "unknown preset 'llama7b' (did you mean 'llama-7b'?)"},
        Row{"--preset llama-7b --seq 0", 2, "--seq must be a positive integer (got '0')"},
        Row{"--preset llama-7b --seq -4096", 2, "--seq must be a positive integer (got '-4096')"},
        Row{"--preset llama-7b --seq 4k", 2, "--seq must be a positive integer (got '4k')"},
        Row{"--preset llama-7b --seq 1024,,2048", 2, "--seq: empty item in '1024,,2048'"},
        Row{"--preset llama-7b --seq 99999999999999999999", 2,
            "--seq is too large (got '99999999999999999999'"},
        Row{"--preset llama-7b --seq 1099511627776", 1,
            "seq 1099511627776 with micro-batch 1 needs more bytes"},
        Row{"--preset llama-7b -b 0", 2, "--micro-batch must be a positive integer (got '0')"},
        Row{"--preset llama-7b --recompute some", 2,
            "--recompute must be none, selective, full, op or all (got 'some')"},
        Row{"--preset llama-7b --recompute op", 1,
            "recompute op needs the architecture activation model"},
        Row{"--preset llama-7b --activations architecture --recompute op --tp 2", 1,
            "recompute op with tp 2 is not modelled"},
        Row{"--preset llama-7b --recipe adam", 2,
            "unknown --recipe 'adam' (did you mean 'adam-8bit'?)"},
        Row{"--preset llama-7b --units tb", 2, "--units: tb not in {gb,gib}"},
        Row{"--preset llama-7b --format yaml", 2, "--format: yaml not in {table,json,csv}"},
        Row{"--preset llama-7b --frobnicate", 2, "--frobnicate"},
        Row{"", 2, "give one model: --preset NAME"},
        Row{"--preset llama-7b --attention flash --activations korthikanti", 2,
            "--attention flash needs --activations architecture"},
        Row{"--preset llama-7b --activations formula", 2,
            "--activations: formula not in {korthikanti,architecture}"},
        Row{"--preset llama-7b --attention flsh", 2,
            "--attention must be eager, flash (or sdpa) or a comma list of them (got 'flsh') (did "
            "you mean 'flash'?)"},
        Row{"--preset llama-7b --activations architecture --platform gpu", 2,
            "--platform must be cuda or cpu (got 'gpu')"},
        Row{"--preset llama-7b --platform cpu --activations korthikanti", 2,
            "--platform cpu needs --activations architecture"},
        Row{"--preset llama-7b --optimizer-impl forloop", 2,
            "--optimizer-impl must be fused, foreach or for-loop (got 'forloop') (did you mean "
            "'for-loop'?)"},
        Row{"--preset llama-7b --tp 3", 1, "tp (3) must divide heads (32)"},
        Row{"--preset llama-7b --tp 0", 2, "--tp must be a positive integer (got '0')"},
        Row{"--preset llama-7b --sp", 2, "--sp (sequence parallelism) needs --tp greater than 1"},
        Row{"--preset llama-7b --zero 4", 2, "--zero must be 0, 1, 2 or 3 (got '4')"},
        Row{"--preset llama-7b --dp 4 --global-batch 10", 2,
            "--global-batch 10 is not a multiple of micro-batch x dp"},
        Row{"--preset llama-7b --pp 2 --microbatches 3 --global-batch 4", 2,
            "--microbatches 3 disagrees with --global-batch 4"},
        Row{"--preset llama-7b --vpp 2", 1, "vpp (2) needs pp > 1"},
        Row{"--preset llama-7b --offload parameters --zero 2 --dp 2", 1,
            "offloading parameters needs ZeRO stage 3"},
        Row{"--preset llama-7b --compare vllm", 2, "--compare: vllm not in {megatron,deepspeed}"},
        Row{"fit --preset llama-7b", 2, "fit needs --device-memory"},
        Row{"fit --preset llama-7b --device-memory eighty", 2,
            "--device-memory must be a size such as 80GB, 80GiB, 1.5TB or 512B (got 'eighty')"},
        // Issue 12's defects, each as its reproducer.
        Row{"--preset llama-7b --seq 8 -b 9223372036854775808 --dp 2 --global-batch 4", 2,
            "micro-batch x dp = 9223372036854775808 x 2, which exceeds 2^64"},
        Row{"fit --preset llama-7b --device-memory 80GB -b 9223372036854775808 --dp 2 "
            "--global-batch 4",
            2, "which exceeds 2^64"},
        Row{"--preset llama-7b --seq 8 --pp 2 --vpp 2 --microbatches 9223372036854775808", 1,
            "microbatches (9223372036854775808) exceeds the 2^40"},
        Row{"--preset llama-7b --seq 8 --pp 2 --vpp 9223372036854775809", 1,
            "pp x vpp (2 x 9223372036854775809) must divide layers (32)"},
        Row{"--model-file /dev/zero --seq 8", 1,
            "cannot read model file '/dev/zero': not a regular file"},
        Row{"--model-file memcalc_twice.json --seq 8", 1,
            "memcalc_twice.json: key 'hidden' appears twice in one object"},
        Row{"--format json fit --preset llama-7b --device-memory 80GB", 2,
            "--format comes before 'fit', which does not see it"},
        Row{"--output memcalc_never.txt fit --preset llama-7b --device-memory 80GB", 2,
            "--output comes before 'fit'"},
        Row{"--preset llama-7b --seq ''", 2, "--seq needs a value (got '')"},
        Row{"--preset llama-7b --seq 8 --dp ''", 2, "--dp needs a value (got '')"},
        Row{"--preset llama-7b --seq 8 --zero ''", 2, "--zero needs a value (got '')"},
        Row{"--preset llama-7b --seq 8 --cp ''", 2, "--cp needs a value (got '')"},
        Row{"fit --preset llama-7b --device-memory 80", 2,
            "--device-memory 80 has no unit: write 80GB, 80GiB, or 80B for bytes"},
        Row{"--preset llama-7b --seq 8 --plot memcalc_never.png", 2,
            "--plot writes SVG: give a name ending in .svg"},
        Row{"--preset llama-7b --seq 8,16 --activations architecture --attention eager,flash "
            "--plot memcalc_never.svg",
            2, "this one varies --attention"},
        Row{"--preset llama-7b --seq 8,16 -b 1,2 --plot memcalc_never.svg", 2,
            "this one varies both --seq and --micro-batch"},
        Row{"fit --preset llama-7b --device-memory 80GB --multiple-of 18446744073709551615 --cp 2",
            2, "least common multiple exceeds 2^64"},
        Row{"--model-file memcalc_valid.json --seq 8 --output memcalc_valid.json", 2,
            "--output 'memcalc_valid.json' is the input 'memcalc_valid.json': refusing to "
            "overwrite it"},
        // Issue 11's options.
        Row{"--preset llama-7b --grad-buffer fixed", 2,
            "--grad-buffer must be lazy, persistent or stepped (got 'fixed')"},
        Row{"--preset llama-7b --seq 8 --pp 2 --first-stage-layers 40", 1, "exceeds layers (32)"},
        // pp 5 splits as plan would (5 + 3 x 7 + 6); 31 stages of 32 layers cannot.
        Row{"--preset llama-7b --seq 8 --pp 31", 1,
            "pp (31) must divide layers (32), or give the first and last stages"},
        Row{"--preset llama-7b --seq 8 --offload optimizer", 1,
            "offloading the optimizer needs a ZeRO stage"},
        Row{"fit --preset llama-7b --device-memory 1GB --reserve 2GiB", 2,
            "--reserve 2GiB leaves nothing of --device-memory 1GB"},
        Row{"fit --preset llama-7b --device-memory 80GB --tp 1,2", 2, "fit takes one layout"},
        Row{"fit --preset llama-7b --device-memory 80GB --tp 3", 1,
            "tp (3) must divide heads (32)"},
        Row{"plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 2048 --global-batch 8 --tp "
            "0",
            2, "--tp"},
        Row{"plan --preset llama-7b --gpus 8 --device-memory 80GB --global-batch 8", 2,
            "plan needs --seq"},
        Row{"plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 2048 --global-batch 8 "
            "--microbatches stages",
            2, "--microbatches must be a comma list of counts, or pp (got 'stages')"},
        Row{"plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 2048 --global-batch 8 "
            "--sp --no-sp",
            2, "--sp excludes --no-sp"},
        Row{"plan --preset gpt2 --gpus 8 --device-memory 80GB --seq 4096 --global-batch 8", 1,
            "seq 4096 exceeds the 1024 learned positions of gpt2"},
        Row{"--config memcalc_missing.json", 1, "cannot read config file 'memcalc_missing.json'"},
        Row{"--config memcalc_heads.json", 1, "memcalc_heads.json: missing key 'model_type'"},
        Row{"--preset gpt2 --seq 4096", 1, "seq 4096 exceeds the 1024 learned positions of gpt2"},
        Row{"--preset gpt2 --seq 8,16 --per-layer", 2, "--per-layer shows one configuration"},
        Row{"--model-file memcalc_missing.json", 1,
            "cannot read model file 'memcalc_missing.json'"},
        Row{"--model-file memcalc_bad.json", 1,
            "memcalc_bad.json: malformed JSON: parse error at line 2, column 12"},
        Row{"--model-file memcalc_heads.json --seq 8", 1, "heads (3) must divide hidden (100)"},
    }));
    CAPTURE(args);
    const auto run = testing::memcalc(args);
    CHECK(run.status == status);
    CHECK(run.out.empty());
    CHECK(count_lines(run.err) == 1);
    CHECK(run.err.rfind("memcalc: ", 0) == 0);
    CHECK_THAT(run.err, Catch::Contains(message));
    std::remove("memcalc_bad.json");
    std::remove("memcalc_heads.json");
    std::remove("memcalc_twice.json");
    std::remove("memcalc_valid.json");
    CHECK_FALSE(std::ifstream("memcalc_never.txt"));
    CHECK_FALSE(std::ifstream("memcalc_never.png"));
    CHECK_FALSE(std::ifstream("memcalc_never.svg"));
}

TEST_CASE("files are written whole, by the run that succeeds, through links, never over an input",
          "[cli][output]") {
    // A run that fails writes no plot (issue 12: it used to leave p.svg behind).
    std::remove("memcalc_plot.svg");
    CHECK(testing::memcalc("--preset llama-7b --seq 1024,2048 --per-layer --plot memcalc_plot.svg")
              .status == 2);
    CHECK_FALSE(std::ifstream("memcalc_plot.svg"));
    // Four writers racing for one file: each succeeds, and the file is one whole report. In a
    // folder of its own, so that no other test's temporary (ctest -j) is taken for one left behind.
    const std::string dir = "memcalc_race_" + std::to_string(getpid());
    REQUIRE(testing::shell("rm -rf " + dir + " && mkdir " + dir).status == 0);
    for (int round = 0; round < 10; ++round) {
        const auto race =
            testing::shell("cd " + dir +
                           " && for i in 1 2 3 4; do (memcalc --preset llama-7b --seq $((512 * i)) "
                           "--format json --output "
                           "memcalc_race.json; echo $? > memcalc_race.$i) & done; wait; cat "
                           "memcalc_race.1 memcalc_race.2 memcalc_race.3 "
                           "memcalc_race.4 | grep -vc '^0$'; rm -f memcalc_race.[1-4]");
        CHECK(race.out == "0\n");
        std::ifstream file(dir + "/memcalc_race.json");
        std::stringstream text;
        text << file.rdbuf();
        CHECK_NOTHROW(json::parse(text.str()));
    }
    CHECK(testing::shell("ls -a " + dir + " | grep -c memcalc-").out ==
          "0\n");  // no temporary left behind
    testing::shell("rm -rf " + dir);
    // Through a symbolic link: the target gets the report, the link stays a link.
    std::ofstream("memcalc_target.csv") << "old";
    CHECK(
        testing::shell("chmod 640 memcalc_target.csv && ln -sf memcalc_target.csv memcalc_link.csv")
            .status == 0);
    CHECK(testing::memcalc("--preset llama-7b --seq 64 --format csv --output memcalc_link.csv")
              .status == 0);
    CHECK(testing::shell("test -L memcalc_link.csv && stat -c %a memcalc_target.csv").out ==
          "640\n");
    std::ifstream target("memcalc_target.csv");
    std::string first;
    std::getline(target, first);
    CHECK(first.rfind("model,seq", 0) == 0);
    std::remove("memcalc_link.csv");
    std::remove("memcalc_target.csv");
}

TEST_CASE("a failed write to standard output is reported", "[cli][output]") {
    const auto run = testing::shell("memcalc --preset llama-7b --seq 64 > /dev/full");
    CHECK(run.status == 1);
    CHECK_THAT(run.err, Catch::Contains(
                            "memcalc: cannot write to standard output: No space left on device"));
}

TEST_CASE("control characters in a model's name reach no output raw", "[cli][output]") {
    std::ofstream("memcalc_escape.json")
        << R"({"name": "evil\u001b[31m\nforged<x>", "hidden": 64, "layers": 2, "heads": 4,
            "ffn": 256, "vocab": 100})";
    for (const char* format : {"table", "csv", "json"}) {
        const auto run =
            testing::memcalc(std::string("--model-file memcalc_escape.json --seq 16 --format ") +
                             format + " --plot memcalc_escape.svg");
        CAPTURE(format);
        REQUIRE(run.status == 0);
        CHECK(run.out.find('\x1b') == std::string::npos);
        if (std::string(format) == "json")
            CHECK(json::parse(run.out)["model"]["name"] == "evil\\x1b[31m\\x0aforged<x>");
        else
            CHECK_THAT(run.out, Catch::Contains("evil\\x1b[31m\\x0aforged<x>"));
    }
    const auto svg = testing::shell(
        std::string("/usr/bin/python3 -c \"import xml.dom.minidom as m; "
                    "print(m.parse('memcalc_escape.svg').documentElement.tagName)\""));
    CHECK(svg.out == "svg\n");
    std::remove("memcalc_escape.json");
    std::remove("memcalc_escape.svg");
}

TEST_CASE(
    "plan without --gpus finds the fewest, in whole nodes of --gpu; pinned options hold; rows "
    "carry times",
    "[cli][plan][slow-sanitized]") {
    const auto nodes = testing::memcalc(
        "plan --preset llama-2-70b --gpu h100-sxm --seq 4096 --global-batch 64 --top 3 --format "
        "json");
    REQUIRE(nodes.status == 0);
    const json j = json::parse(nodes.out);
    const std::uint64_t n = j["gpus"].get<std::uint64_t>();
    CHECK(n % 8 == 0);
    CHECK(j["gpus_searched"] == "whole nodes");
    REQUIRE(j["layouts"].size() > 0);
    for (const auto& l : j["layouts"]) {
        CHECK(l["gpus"] == n);
        CHECK(l["step_seconds"].get<double>() > 0);
        CHECK(l["tokens_per_second_per_gpu"].get<double>() > 0);
    }
    CHECK(j["layouts"][0]["step_seconds"].get<double>() <=
          j["layouts"][1]["step_seconds"].get<double>());
    if (n > 8) {  // one node fewer: nothing fits
        const json fewer = json::parse(
            testing::memcalc(
                fmt("plan --preset llama-2-70b --gpu h100-sxm --seq 4096 --global-batch 64 "
                    "--top 3 --format json --gpus {}",
                    n - 8))
                .out);
        CHECK(fewer["fitting"] == 0);
    }
    // Any count with --device-memory; no GPU speeds, so no times.
    const json any = json::parse(
        testing::memcalc(
            "plan --preset llama-7b --device-memory 24GB --seq 2048 --global-batch 16 --top 2 "
            "--format json")
            .out);
    CHECK(any["gpus_searched"] == "any count");
    REQUIRE(any["layouts"].size() > 0);
    CHECK(any["layouts"][0]["step_seconds"].is_null());
    const json fewer = json::parse(
        testing::memcalc(
            fmt("plan --preset llama-7b --device-memory 24GB --seq 2048 --global-batch 16 "
                "--top 2 --format json --gpus {}",
                any["gpus"].get<std::uint64_t>() - 1))
            .out);
    CHECK(fewer["fitting"] == 0);
    // Pinned: every row has them.
    const json pinned = json::parse(
        testing::memcalc(
            "plan --preset llama-2-70b --gpu h100-sxm --gpus 64 --seq 4096 --global-batch 512 "
            "--tp 8 --zero 1 --pp 2 --sp --recompute selective -b 1 --top 50 --format json")
            .out);
    REQUIRE(pinned["layouts"].size() > 0);
    for (const auto& l : pinned["layouts"]) {
        CHECK(l["tp"] == 8);
        // a ZeRO stage pins the layouts with replicas to shard over; a lone one keeps stage 0
        CHECK((l["zero"] == 1 || (l["dp"] == 1 && l["zero"] == 0)));
        CHECK(l["pp"] == 2);
        CHECK(l["sequence_parallel"] == true);
        CHECK(l["recompute"] == "selective");
        CHECK(l["micro_batch"] == 1);
    }
    const auto table = testing::memcalc(
        "plan --preset llama-7b --gpu a100-80gb --seq 2048 --global-batch 16 --top 2");
    CHECK_THAT(table.out, Catch::Contains("The fewest devices, in whole nodes of 8"));
    CHECK_THAT(table.out, Catch::Contains("tokens/s/GPU"));
}

namespace {
/// A plan's layouts (`args` after "plan") as JSON: at least one.
json plan_layouts(const std::string& args) {
    const json j = json::parse(testing::memcalc("plan " + args + " --top 1000 --format json").out);
    REQUIRE(j["layouts"].size() > 0);
    return j["layouts"];
}
}  // namespace

TEST_CASE("plan says when no layout is valid, and honours --recompute and --micro-batch",
          "[cli][plan][slow-sanitized]") {
    const auto none = testing::memcalc(
        "plan --preset llama-7b --gpus 31 --device-memory 80GB --seq 2048 --global-batch 8");
    REQUIRE(none.status == 0);
    CHECK_THAT(none.out, Catch::Contains("No layout of 31 devices is valid"));
    const std::string eight =
        "--preset llama-7b --gpus 8 --device-memory 80GB --seq 2048 "
        "--global-batch 16 ";
    for (const auto& l : plan_layouts(eight + "--recompute full -b 2")) {
        CHECK(l["recompute"] == "full");
        CHECK(l["micro_batch"] == 2);
    }
    // --microbatches pp: as many micro-batches as stages; --no-sp: no sequence parallelism.
    for (const auto& l : plan_layouts(eight + "--microbatches pp --no-sp")) {
        CHECK(l["microbatches"] == l["pp"]);
        CHECK(l["sequence_parallel"] == false);
    }
}

TEST_CASE(
    "fit of the micro-batch keeps the global batch: the answer runs, the next divisor does not fit",
    "[cli][fit]") {
    const json j = json::parse(
        testing::memcalc("fit --preset llama-7b --device-memory 141GB --seq 1024 --global-batch 8 "
                         "--recompute none --format json")
            .out);
    const auto& r = j["results"][0];
    const std::uint64_t b = r["largest"].get<std::uint64_t>();
    CHECK(8 % b == 0);
    const auto ok = testing::memcalc("--preset llama-7b --seq 1024 --global-batch 8 -b " +
                                     std::to_string(b) + " --format json");
    REQUIRE(ok.status == 0);
    CHECK(json::parse(ok.out)["peak"]["bytes"] == r["peak"]["bytes"]);
    CHECK(r["first_over"]["size"].get<std::uint64_t>() ==
          2 * b);  // 2 and 4 divide 8: the next divisor
    // A micro-batch that does not divide the global batch is not an answer the estimate would
    // refuse.
    CHECK(testing::memcalc("--preset llama-7b --seq 1024 --global-batch 8 -b 3").status == 2);
}

TEST_CASE("every command in the README and the docs prints what the page shows",
          "[cli][readme][slow-sanitized]") {
    // The ```console blocks of README.md and docs/*.md: "$ memcalc ..." lines, each followed by its
    // exact output. scripts/update-readme-examples.py rewrites them all.
    struct Example {
        std::string page, command, output;
    };
    std::vector<Example> examples;
    std::size_t pages = 0;
    for (const auto& page : testing::doc_pages()) {
        ++pages;
        std::istringstream text(page.text);
        bool in_console = false;
        for (std::string line; std::getline(text, line);) {
            if (line.rfind("```", 0) == 0) {
                in_console = !in_console && line == "```console";
                continue;
            }
            if (!in_console) continue;
            if (line.rfind("$ ", 0) == 0)
                examples.push_back({page.name, line.substr(2), ""});
            else if (!examples.empty())
                examples.back().output += line + "\n";
        }
    }
    REQUIRE(pages > 10);
    const auto in_readme = std::count_if(examples.begin(), examples.end(),
                                         [](const Example& e) { return e.page == "README.md"; });
    CHECK(in_readme >= 10);
    REQUIRE(examples.size() > static_cast<std::size_t>(in_readme));
    for (const auto& e : examples) {
        CAPTURE(e.page, e.command);
        const auto run =
            testing::shell(std::string("cd '") + MEMCALC_SOURCE_DIR + "' && " + e.command);
        CHECK(run.status == 0);
        CHECK(run.out == e.output);
    }
}

TEST_CASE("the README is short and leads to every docs page, each in the site's nav",
          "[cli][readme]") {
    const auto pages = testing::doc_pages();
    REQUIRE(pages.front().name == "README.md");
    const std::string& readme = pages.front().text;
    CHECK(std::count(readme.begin(), readme.end(), '\n') <= 300);
    std::ifstream config(std::string(MEMCALC_SOURCE_DIR) + "/mkdocs.yml");
    REQUIRE(config);
    const std::string nav((std::istreambuf_iterator<char>(config)),
                          std::istreambuf_iterator<char>());
    for (std::size_t i = 1; i < pages.size(); ++i) {
        const std::string file = pages[i].name.substr(5);  // less "docs/"
        CAPTURE(file);
        CHECK(nav.find(": " + file + "\n") != std::string::npos);
        if (file != "index.md") CHECK(readme.find("(docs/" + file) != std::string::npos);
    }
    // The set-up commands (.ci/run reads them from the README) stand on the install page as they
    // are.
    const auto install = std::find_if(pages.begin(), pages.end(), [](const testing::DocPage& p) {
        return p.name == "docs/install.md";
    });
    REQUIRE(install != pages.end());
    int blocks = 0;
    for (std::size_t at = readme.find("```sh\n"); at != std::string::npos;
         at = readme.find("```sh\n", at + 1), ++blocks) {
        const std::string block = readme.substr(at, readme.find("```\n", at + 6) + 4 - at);
        CAPTURE(block);
        CHECK(install->text.find(block) != std::string::npos);
    }
    CHECK(blocks == 2);
}

TEST_CASE("a sweep streams: its JSON is the array nlohmann would print, and past 1 MiB it spools",
          "[cli][sweep][slow-sanitized]") {
    const auto sweep =
        testing::memcalc("--preset llama-7b --seq 64,128,256 --recompute all --format json");
    REQUIRE(sweep.status == 0);
    const json all = json::parse(sweep.out);
    CHECK(all.size() == 9);
    CHECK(sweep.out == all.dump(2) + "\n");
    // 105,000 CSV rows, over 16 MiB: spooled to a temporary file, then printed or written whole.
    std::string seqs;
    for (int s = 1; s <= 5000; ++s) seqs += (s > 1 ? "," : "") + std::to_string(s);
    const auto big = testing::memcalc("--preset llama-7b --seq " + seqs +
                                      " -b 1,2,3,4,5,6,7 --recompute all --format csv");
    REQUIRE(big.status == 0);
    CHECK(big.out.size() > (16u << 20));
    CHECK(std::count(big.out.begin(), big.out.end(), '\n') == 1 + 3 * 7 * 5000);
    REQUIRE(
        testing::memcalc("--preset llama-7b --seq " + seqs +
                         " -b 1,2,3,4,5,6,7 --recompute all --format csv --output memcalc_big.csv")
            .status == 0);
    std::ifstream file("memcalc_big.csv", std::ios::binary);
    std::stringstream text;
    text << file.rdbuf();
    CHECK(text.str() == big.out);
    std::remove("memcalc_big.csv");
}

TEST_CASE("one layer's op tape (--ops) in every format", "[cli][ops]") {
    const auto table = testing::memcalc("--preset llama-7b --seq 512 --ops --recompute selective");
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("Op tape of one layer under selective recomputation"));
    CHECK_THAT(table.out, Catch::Contains("rebuild"));
    CHECK_THAT(table.out, Catch::Contains("Peak:"));
    const auto run = testing::memcalc(
        "--preset llama-3-8b --seq 256 --activations architecture --recompute full "
        "--tp 2 --sp --ops --format json");
    REQUIRE(run.status == 0);
    const json ops = json::parse(run.out)["activations"]["ops"];
    REQUIRE(ops.size() > 20);
    for (const auto& e : ops)
        for (const char* key : {"phase", "op", "event", "tensor", "bytes", "live"})
            CHECK(e.contains(key));
    CHECK(ops.back()["live"] == 0);
    const auto per_layer =
        json::parse(testing::memcalc("--preset decoder --per-layer --ops --format json").out);
    CHECK(per_layer["ops"].size() > 10);
    const auto csv = testing::memcalc("--preset decoder --ops --format csv");
    CHECK(csv.out.rfind("phase,op,event,tensor,bytes,live\n", 0) == 0);
    const auto sweep = testing::memcalc("--preset decoder --seq 128,256 --ops");
    CHECK(sweep.status != 0);
    CHECK_THAT(sweep.err, Catch::Contains("--ops shows one configuration"));
    CHECK(sweep.out.empty());
}

TEST_CASE("a CSV sweep's rows off its lines are the rows each micro-batch alone prints",
          "[cli][sweep][lines][slow-sanitized]") {
    // 40 micro-batches draw lines (micro_batch_line.hpp); one alone is made whole.
    const std::string common =
        "--preset llama-3-8b --seq 100,640 --recompute all --activations architecture "
        "--pp 2 --dp 2 --zero 1 --format csv --micro-batch ";
    std::string batches;
    for (int b = 1; b <= 40; ++b) batches += (b > 1 ? "," : "") + std::to_string(b);
    const auto swept = testing::memcalc(common + batches);
    REQUIRE(swept.status == 0);
    std::set<std::string> alone;  // every row of the runs of one micro-batch each
    for (int b = 1; b <= 40; ++b) {
        const auto one = testing::memcalc(common + std::to_string(b));
        REQUIRE(one.status == 0);
        std::istringstream rows(one.out);
        std::string row;
        std::getline(rows, row);  // the header
        while (std::getline(rows, row)) alone.insert(row);
    }
    std::istringstream rows(swept.out);
    std::string row;
    std::getline(rows, row);
    std::size_t count = 0;
    while (std::getline(rows, row)) {
        CAPTURE(row);
        CHECK(alone.count(row) == 1);
        ++count;
    }
    CHECK(count == alone.size());
    CHECK(count == 2 * 40 * 3);
}

TEST_CASE("a CSV sweep made on worker threads prints what one thread prints",
          "[cli][sweep][threads]") {
    std::string batches;  // 600 micro-batches: two pieces of one sequence length
    for (int b = 1; b <= 600; ++b) batches += (b > 1 ? "," : "") + std::to_string(b);
    const std::string plot = "/tmp/memcalc_threads_test.svg";
    const std::string sweep = GENERATE_COPY(
        std::string("--preset gpt2 --seq 64,128,256,512 --micro-batch 1,2,3,5,8,13,21,34,40 "
                    "--recompute all"),
        "--preset llama-3.2-1b --seq 512 --micro-batch " + batches + " --recompute all",
        std::string("--preset gpt2 --seq 64,128 --micro-batch 1,2,4 --tp 1,2 --pp 1,2 --dp 2"),
        std::string("--preset gpt2 --seq 128,256 --micro-batch 1,2 --gpu h100-sxm"),
        std::string("--preset gpt2 --seq 256 --micro-batch 1,2 --dp 1,2 --global-batch 8"),
        std::string("--preset gpt2 --seq 64,512,2048,128 --micro-batch 1,2,3 --recompute all"),
        "--preset gpt2 --seq 64,128,256 --recompute all --plot " + plot);
    CAPTURE(sweep);
    const auto svg = [&] {
        std::ifstream in(plot);
        std::stringstream text;
        text << in.rdbuf();
        std::remove(plot.c_str());
        return text.str();
    };
    const auto one = testing::shell("MEMCALC_THREADS=1 memcalc " + sweep + " --format csv");
    const std::string one_svg = svg();
    const auto three = testing::shell("MEMCALC_THREADS=3 memcalc " + sweep + " --format csv");
    CHECK(three.status == one.status);
    CHECK(three.out == one.out);  // every row, in order; nothing where a row fails
    CHECK(three.err == one.err);
    CHECK(svg() == one_svg);
    if (sweep.find("2048") != std::string::npos) {  // past GPT-2's 1,024 positions: the error alone
        CHECK(one.status != 0);
        CHECK(one.out.empty());
    } else {
        CHECK(one.status == 0);
        CHECK(std::count(one.out.begin(), one.out.end(), '\n') > 4);
    }
}

TEST_CASE("a JSON sweep made on worker threads prints what one thread prints",
          "[cli][sweep][threads]") {
    const std::string sweep = GENERATE(
        as<std::string>{}, "--preset gpt2 --seq 64,128,256 --micro-batch 1,2,3 --recompute all",
        "--preset gpt2 --seq 64,64,128 --micro-batch 1,2 --tp 1,2 --dp 2",
        "--preset gpt2 --seq 64,2048,128 --micro-batch 1,2");
    CAPTURE(sweep);
    const auto one = testing::shell("MEMCALC_THREADS=1 memcalc " + sweep + " --format json");
    const auto three = testing::shell("MEMCALC_THREADS=3 memcalc " + sweep + " --format json");
    CHECK(three.status == one.status);
    CHECK(three.out == one.out);
    CHECK(three.err == one.err);
    if (one.status == 0)  // one array of every configuration's object, in order
        CHECK(nlohmann::json::parse(one.out).size() >= 6);
    else
        CHECK(one.out.empty());
}

TEST_CASE("MEMCALC_THREADS takes a count from 1 to 256 and names anything else",
          "[cli][sweep][threads]") {
    const std::string value = GENERATE(as<std::string>{}, "0", "257", "two", "-1", "1.5");
    const auto run = testing::shell("MEMCALC_THREADS=" + value +
                                    " memcalc --preset gpt2 --seq 64,128 --format csv");
    CHECK(run.status != 0);
    CHECK(run.out.empty());
    CHECK(run.err.find("MEMCALC_THREADS must be a count of threads from 1 to 256 (got '" + value +
                       "')") != std::string::npos);
}

TEST_CASE("no test's name begins with '-', which ctest would hand Catch as an option",
          "[cli][tests]") {
    // "--help fits ..." once ran Catch's --help under ctest: it printed usage and passed untested.
    std::size_t files = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator(std::string(MEMCALC_SOURCE_DIR) + "/tests")) {
        if (entry.path().extension() != ".cpp") continue;
        ++files;
        std::ifstream in(entry.path());
        std::string line;
        for (std::size_t n = 1; std::getline(in, line); ++n) {
            CAPTURE(entry.path().filename().string(), n);
            CHECK(line.find("TEST_CASE(\"-") == std::string::npos);
        }
    }
    CHECK(files > 50);
}
