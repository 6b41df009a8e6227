// Program facts (program_facts.hpp): each an option that says what its model-file key says, of any
// model; listed with its default; a wrong value named.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/program_facts.hpp"
#include "run_program.hpp"

using nlohmann::json;

namespace {

const std::string base = std::string(MEMCALC_SOURCE_DIR) + "/validation/models/mixtral-tiny.json";
// Autocast on CPU kernels, eager attention, the architecture model: where every fact tells.
const std::string settings =
    " --activations architecture --recipe amp-adam --platform cpu --seq 64 -b 2 --format json";

/// What a run says of the step: its peak and its activations, or its exit status and error.
std::string figures(const testing::Run& run) {
    if (run.status != 0) return "status " + std::to_string(run.status);
    const json j = json::parse(run.out);
    return j["peak"].dump() + j["activations"].dump();
}

/// The base model file with `key` set to `value` (a JSON value's text), as a file of its own.
std::string model_with(const std::string& key, const std::string& value) {
    std::ifstream in(base);
    json model = json::parse(in);
    model[key] = json::parse(value);
    const std::string path = "/tmp/memcalc_program_fact_" + key + ".json";
    std::ofstream(path) << model.dump();
    return path;
}

}  // namespace

TEST_CASE("each program fact's option says what its model-file key says",
          "[cli][program][slow-sanitized]") {
    std::size_t compared = 0;
    memcalc::for_each_program_fact([&](const auto& row) {
        for (const auto& value : row.values) {
            const std::string name = row.name(value), key(row.key);
            INFO(key << " " << name);
            const bool flag = name == "true" || name == "false";
            const std::string file = model_with(key, flag ? name : "\"" + name + "\"");
            const testing::Run by_key = testing::memcalc("--model-file " + file + settings);
            const testing::Run by_option = testing::memcalc("--model-file " + base + " " +
                                                            row.option() + " " + name + settings);
            CHECK(figures(by_option) == figures(by_key));
            CHECK(by_key.status == 0);
            std::remove(file.c_str());
            ++compared;
        }
    });
    CHECK(compared >= 18);
}

TEST_CASE("a program fact's option changes the figures it is about", "[cli][program]") {
    const auto peak = [](const std::string& options) {
        const testing::Run run = testing::memcalc("--model-file " + base + options + settings);
        REQUIRE(run.status == 0);
        return json::parse(run.out)["peak"]["bytes"].get<std::uint64_t>();
    };
    // Under autocast one cast of the q/k/v projections' input instead of three.
    CHECK(peak(" --fused-qkv true") < peak(" --fused-qkv false"));
    // A registered mask per layer, and its comparison kept for backward.
    CHECK(peak(" --causal-mask-buffer per_layer") > peak(" --causal-mask-buffer none"));
    // Added to the scores, the buffer keeps nothing: each layer one s x s bool less (s 64).
    const auto layer = [](const std::string& options) {
        const testing::Run run = testing::memcalc("--model-file " + base + options + settings);
        REQUIRE(run.status == 0);
        return json::parse(run.out)["activations"]["layer_bytes"].get<std::uint64_t>();
    };
    CHECK(layer(" --causal-mask-buffer per_layer") -
              layer(" --causal-mask-buffer per_layer_added") ==
          64 * 64);
}

TEST_CASE("embeddings' outputs held by the forward live through its steps, on the first stage",
          "[cli][program]") {
    // step -> bytes, of the first stage's timeline
    const auto steps = [](const std::string& options) {
        const testing::Run run = testing::memcalc(
            "--preset gpt2 --seq 128 -b 2 --activations architecture --format json" + options);
        REQUIRE(run.status == 0);
        std::map<std::string, std::uint64_t> bytes;
        const json report = json::parse(run.out);
        for (const json& step : report["timeline"])
            bytes[step["step"].get<std::string>()] = step["bytes"].get<std::uint64_t>();
        return bytes;
    };
    const auto held = steps(" --embedding-outputs-held true");
    const auto let_go = steps("");
    const std::uint64_t h = 768, locals = (128 * 2 * h + 128 * h) * 2;  // tok_emb, pos_emb: bf16
    for (const char* step : {"forward 1", "forward 12"})
        CHECK(held.at(step) - let_go.at(step) == locals);
    for (const char* step : {"backward 12", "backward 1", "optimizer"})
        CHECK(held.at(step) == let_go.at(step));
}

TEST_CASE("program facts are listed with their defaults; a wrong value is named",
          "[cli][program]") {
    const json listed = json::parse(testing::memcalc("program-facts --format json").out);
    const memcalc::Architecture defaults;
    std::size_t row_index = 0;
    memcalc::for_each_program_fact([&](const auto& row) {
        REQUIRE(row_index < listed.size());
        const json& entry = listed[row_index++];
        CHECK(entry["key"] == std::string(row.key));
        CHECK(entry["option"] == row.option());
        CHECK(entry["default"] == std::string(row.name(defaults.*row.member)));
    });
    CHECK(row_index == listed.size());
    const testing::Run wrong = testing::memcalc("--preset llama-7b --fused-qkv yes");
    CHECK(wrong.status == 2);
    CHECK(wrong.out.empty());
    CHECK_THAT(wrong.err, Catch::Contains("--fused-qkv must be false or true (got 'yes')"));
    // Said of a --config model as well.
    const testing::Run config =
        testing::memcalc("--config " + std::string(MEMCALC_SOURCE_DIR) +
                         "/tests/models/pygmalion-7b/config.json --causal-mask-buffer per_layer");
    CHECK(config.status == 0);
}

TEST_CASE("a profile's own program facts hold over the model's, an option over both",
          "[cli][program]") {
    const auto repeat_kv = [](const std::string& options) {
        const testing::Run run = testing::memcalc("--preset llama-3-8b --seq 128 " + options +
                                                  " --activations architecture --format json");
        REQUIRE(run.status == 0);
        return json::parse(run.out)["model"]["repeat_kv"].get<bool>();
    };
    CHECK_FALSE(repeat_kv("--profile fsdp2"));
    CHECK(repeat_kv("--profile torchtitan"));  // its attention repeats k and v before SDPA
    CHECK_FALSE(repeat_kv("--profile torchtitan --repeat-kv false"));
    CHECK(repeat_kv("--profile hf-trainer"));
    const testing::Run nanogpt = testing::memcalc(
        "--preset gpt2 --seq 128 --profile nanogpt --activations architecture --format json");
    REQUIRE(nanogpt.status == 0);
    CHECK(json::parse(nanogpt.out)["model"]["embedding_outputs_held"] == true);  // model.py:177

    // A profile file says them as the listing prints them; a wrong one is named.
    const std::string path = "/tmp/memcalc_profile_program_facts.json";
    std::ofstream(path) << R"({"name": "mine", "attention": "flash",
                              "program_facts": "repeat_kv=true, fused_qkv=false"})";
    CHECK(repeat_kv("--profile-file " + path));
    std::ofstream(path) << R"({"name": "mine", "program_facts": "repeat_kv=yes"})";
    const testing::Run wrong = testing::memcalc("--preset llama-3-8b --profile-file " + path);
    CHECK(wrong.status == 1);  // a bad file, as any other key of it
    CHECK(wrong.out.empty());
    CHECK_THAT(wrong.err, Catch::Contains("program_facts must be KEY=VALUE items of 'memcalc "
                                          "program-facts' (got 'repeat_kv=yes')"));
    std::remove(path.c_str());
}

TEST_CASE(
    "a fused RMSNorm kernel keeps its input as it is and 1/rms: four sbh less a norm than "
    "PyTorch's ops",
    "[program-facts][norm]") {
    const Architecture base = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    CAPTURE(base.name);
    Settings s;
    s.seq = 512, s.micro_batch = 2, s.activations = ActivationModel::architecture;
    s.recipe = builtin_recipe("bf16-adam");
    Architecture fused = base;
    fused.rmsnorm_kernel = RmsnormKernel::fused;
    const Report torch_ops = estimate(base, s), one_kernel = estimate(fused, s);
    const std::uint64_t sbh = 512ULL * 2 * base.hidden;
    // Each of the layer's two norms: an fp32 copy of x (4 sbh) and x_norm (2 sbh) become x itself
    // (2 sbh); 1/rms stays.
    CHECK(saved_bytes(torch_ops.layer.rows).value() - saved_bytes(one_kernel.layer.rows).value() ==
          2 * 4 * sbh);
    std::size_t rows = 0;
    for (const auto& row : one_kernel.layer.rows)
        if (std::string(row.op).find("(RMSNorm, fused)") != std::string::npos) ++rows;
    CHECK(rows == 4);
    // The megatron profile says it (Transformer Engine's TENorm), as a fact of its own code.
    const auto& program = find_profile("megatron")->program;
    REQUIRE(!program.empty());
    CHECK(std::string(program[0].first) == "rmsnorm_kernel");
    CHECK(std::string(program[0].second) == "fused");
}
