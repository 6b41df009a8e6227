#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <nlohmann/json.hpp>

#include "memcalc/params.hpp"
#include "model_file.hpp"
#include "doc_pages.hpp"

using namespace memcalc;
using memcalc::cli::parse_model_json;

namespace {
const char* const valid =
    R"({"hidden": 4096, "layers": 32, "heads": 32, "ffn": 11008, "vocab": 32000})";

// The valid model with one key replaced (or added) by `key: value`.
std::string model_with(const std::string& key, const std::string& value) {
    auto j = nlohmann::json::parse(valid);
    j[key] = nlohmann::json::parse(value);
    return j.dump();
}
std::string model_without(const std::string& key) {
    auto j = nlohmann::json::parse(valid);
    j.erase(key);
    return j.dump();
}
}  // namespace

TEST_CASE("a minimal model file takes the LLaMA defaults", "[model_file]") {
    const auto file = parse_model_json(valid, "my.json", "my");
    CHECK(file.architecture.name == "my");
    CHECK(parameter_table(file.architecture).total().value() == 6738415616ULL);
    CHECK_FALSE(file.published_parameters.has_value());
}

TEST_CASE("every bad model file gets one message naming the key and value", "[model_file]") {
    using Row = std::pair<std::string, std::string>;
    const auto [text, message] = GENERATE(table<std::string, std::string>({
        Row{R"({"hidden": 4096,)", "my.json: malformed JSON: parse error at line 1, column 17"},
        Row{"[1, 2]", "expected a JSON object describing a model (got array)"},
        Row{model_without("vocab"), "my.json: missing key 'vocab'"},
        Row{model_with("hidden", "\"4096\""),
            "hidden must be a positive integer (got string \"4096\")"},
        Row{model_with("hidden", "4096.5"),
            "hidden must be a positive integer below 2^64 (got 4096.5)"},
        Row{model_with("layers", "-3"), "layers must be a positive integer (got -3)"},
        Row{model_with("layers", "0"), "layers must be a positive integer (got 0)"},
        Row{model_with("ffn", "1e30"), "ffn must be a positive integer below 2^64"},
        Row{model_with("heads", "30"), "heads (30) must divide hidden (4096)"},
        Row{model_with("kv_heads", "5"), "kv_heads (5) must divide heads (32)"},
        Row{model_with("hiden", "4096"), "unknown key 'hiden' (did you mean 'hidden'?)"},
        Row{model_with("mlp", "\"swiglu\""), "mlp must be one of gated, plain (got 'swiglu')"},
        Row{model_with("norm", "\"rmsnrom\""), "(got 'rmsnrom') (did you mean 'rmsnorm'?)"},
        Row{model_with("vocab", "[[[1]]]"), "vocab must be a positive integer (got array)"},
        Row{model_with("tied_embeddings", "1"),
            "tied_embeddings must be true or false (got number 1)"},
        Row{model_with("position", "\"learned\""),
            "max_positions must be a positive integer for learned position"},
        Row{model_with("experts_per_token", "2"), "experts_per_token (2) needs experts > 0"},
        Row{model_with("activation", "\"gelu_neww\""),
            "activation must be one of clamped_swiglu, gelu, gelu_fast, gelu_new, gelu_tanh, "
            "quick_gelu, relu, relu2, silu (got 'gelu_neww') (did you mean 'gelu_new'?)"},
        Row{model_with("mlp_dropout", "1.5"),
            "mlp_dropout must be a probability in [0, 1) (got number 1.5)"},
        Row{model_with("mlp_dropout", "\"0.1\""),
            "mlp_dropout must be a probability in [0, 1) (got string \"0.1\")"},
        Row{model_with("causal_mask_buffer", "\"per-layer\""),
            "causal_mask_buffer must be one of none, per_layer, per_layer_added, per_layer_bool "
            "(got 'per-layer') "
            "(did you mean "
            "'per_layer'?)"},
        Row{model_with("causal_mask_buffer", "\"per_layer\""),
            "max_positions must be a positive integer for causal_mask_buffer"},
        Row{model_with("rotary_embedding", "\"per-layer\""),
            "rotary_embedding must be one of per_layer, per_layer_cached, shared, shared_fp32 (got "
            "'per-layer') "
            "(did you mean 'per_layer'?)"},
        Row{model_with("rotary_embedding", "\"per_layer_cached\""),
            "max_positions must be a positive integer for rotary_embedding per_layer_cached"},
    }));
    CAPTURE(text);
    CHECK_THROWS_WITH(parse_model_json(text, "my.json", "my"), Catch::Contains(message));
}

TEST_CASE("a missing model file is named", "[model_file]") {
    CHECK_THROWS_WITH(cli::load_model_file("/no/such/model.json"),
                      Catch::Contains("'/no/such/model.json'"));
}

TEST_CASE("model files load from disk named by their stem", "[model_file]") {
    const std::string path = "memcalc_test_model.json";
    std::ofstream(path) << valid;
    CHECK(cli::load_model_file(path).architecture.name == "memcalc_test_model");
    std::remove(path.c_str());
}

TEST_CASE("every preset's count equals its published exact count", "[model_file][presets]") {
    // Independent of the preset files: the figures as published (checkpoints, model cards).
    using Row = std::pair<const char*, std::uint64_t>;
    const auto [name, published] = GENERATE(table<const char*, std::uint64_t>({
        Row{"llama-7b", 6738415616ULL},         Row{"llama-13b", 13015864320ULL},
        Row{"llama-33b", 32528943616ULL},       Row{"llama-65b", 65285660672ULL},
        Row{"llama-2-70b", 68976648192ULL},     Row{"llama-3-8b", 8030261248ULL},
        Row{"llama-3-70b", 70553706496ULL},     Row{"mistral-7b", 7241732096ULL},
        Row{"mixtral-8x7b", 46702792704ULL},    Row{"gpt2", 124439808ULL},
        Row{"gpt2-medium", 354823168ULL},       Row{"gpt2-large", 774030080ULL},
        Row{"gpt2-xl", 1557611200ULL},          Row{"llama-3.2-1b", 1235814400ULL},
        Row{"mistral-7b-v0.3", 7248023552ULL},  Row{"qwen2-0.5b", 494032768ULL},
        Row{"qwen2.5-7b", 7615616512ULL},       Row{"qwen2.5-72b", 72706203648ULL},
        Row{"gemma-2b", 2506172416ULL},         Row{"gemma-7b", 8537680896ULL},
        Row{"gemma-2-2b", 2614341888ULL},       Row{"gemma-2-9b", 9241705984ULL},
        Row{"phi-3-mini", 3821079552ULL},       Row{"opt-125m", 125239296ULL},
        Row{"opt-1.3b", 1315758080ULL},         Row{"bloom-560m", 559214592ULL},
        Row{"bloom-7b1", 7069016064ULL},        Row{"falcon-rw-1b", 1311625216ULL},
        Row{"pythia-1b", 1011781632ULL},        Row{"phi-2", 2779683840ULL},
        Row{"llama-3.1-405b", 405853388800ULL}, Row{"qwen3-8b", 8190735360ULL},
        Row{"gemma-3-1b", 999885952ULL},        Row{"qwen1.5-moe-a2.7b", 14315784192ULL},
        Row{"qwen3-30b-a3b", 30532122624ULL},   Row{"phi-3.5-moe", 41873153344ULL},
        Row{"gemma-3-27b", 27432406640ULL},     Row{"qwen3.5-35b-a3b", 35951822704ULL},
    }));
    CAPTURE(name);
    const auto file = cli::load_preset(name);
    CHECK(parameter_table(file.architecture).total().value() == published);
    REQUIRE(file.published_parameters.has_value());
    CHECK(*file.published_parameters == published);
    CHECK_FALSE(file.source.empty());
}

TEST_CASE("every shipped preset loads and agrees with its own published figure and names a source",
          "[presets]") {
    const auto names = cli::preset_names();
    CHECK(names.size() >= 20);
    for (const auto& name : names) {
        CAPTURE(name);
        const auto file = cli::load_preset(name);
        CHECK(file.architecture.name == name);
        CHECK_FALSE(file.source.empty());
        if (file.published_parameters)
            CHECK(parameter_table(file.architecture).total().value() == *file.published_parameters);
    }
}

namespace {
/// Every field of a model file, written out: what the program would see of it. A field added to
/// Architecture or ModelFile goes here, and into src/preset_compiler.cpp, which writes the presets.
std::string every_field(const cli::ModelFile& file) {
    const Architecture& m = file.architecture;
    std::ostringstream out;
    out.precision(17);
    out << m.name << '|' << m.hidden << '|' << m.layers << '|' << m.heads << '|' << m.kv_heads
        << '|' << m.head_dim << '|' << m.ffn << '|' << m.vocab << '|' << m.max_positions << '|'
        << m.position_rows << '|' << int(m.mlp) << '|' << int(m.norm) << '|' << int(m.bias) << '|'
        << int(m.position) << '|' << m.tied_embeddings << '|' << m.head_bias << '|' << m.experts
        << '|' << m.experts_per_token << '|' << int(m.activation) << '|' << m.norms_per_layer << '|'
        << m.parallel_attention << '|' << m.embedding_norm << '|' << m.attention_dropout << '|'
        << m.hidden_dropout << '|' << m.mlp_dropout << '|' << m.softmax_fp32 << "|mla "
        << m.mla.q_lora_rank << ' ' << m.mla.kv_lora_rank << ' ' << m.mla.qk_nope_head_dim << ' '
        << m.mla.qk_rope_head_dim << ' ' << m.mla.v_head_dim << "|mixer " << mixer_name(m.mixer)
        << ' ' << m.ssm.d_inner << ' ' << m.ssm.d_state << ' ' << m.ssm.d_conv << ' '
        << m.ssm.dt_rank << ' ' << m.ssm.conv_bias << m.ssm.proj_bias << m.ssm.inner_norms
        << m.ssm.kernels << ' ' << m.ssm.heads << ' ' << m.ssm.groups << ' ' << m.ssm.chunk;
    const auto given = [&](const std::optional<std::uint64_t>& n) {
        return n ? std::to_string(*n) : std::string("-");
    };
    for (const auto& k : m.layer_kinds)
        out << "|kind " << k.name << ' ' << given(k.ffn) << ' ' << given(k.experts) << ' '
            << given(k.experts_per_token) << ' ' << (k.mixer ? mixer_name(*k.mixer) : "-");
    for (const auto& run : m.layer_pattern) out << "|run " << run.kind << ' ' << run.count;
    out << '|' << file.description << '|' << file.source << '|' << given(file.published_parameters);
    return out.str();
}
}  // namespace

TEST_CASE("every compiled preset is its JSON file as the model-file reader reads it", "[presets]") {
    std::size_t files = 0;
    for (const auto& entry :
         std::filesystem::directory_iterator(std::string(MEMCALC_SOURCE_DIR) + "/presets")) {
        if (entry.path().extension() != ".json") continue;
        const std::string name = entry.path().stem().string();
        CAPTURE(name);
        ++files;
        const auto parsed = parse_model_json(cli::read_text_file(entry.path().string(), "preset"),
                                             "preset " + name, name);
        CHECK(every_field(cli::load_preset(name)) == every_field(parsed));
    }
    CHECK(files == cli::preset_names().size());
    // Doubles go through text and back: a dropout of 0.1 must be the same double both ways.
    CHECK(cli::load_preset("gpt2").architecture.attention_dropout == 0.1);
}

TEST_CASE("the Decoder preset has the chapter's shape", "[presets]") {
    const auto d = cli::load_preset("decoder").architecture;
    CHECK(d.hidden == 16);
    CHECK(d.heads == 2);
    CHECK(d.ffn == 32);
    CHECK(d.max_positions == 8);
}

TEST_CASE("an unknown preset suggests the nearest name", "[presets]") {
    CHECK_THROWS_WITH(cli::load_preset("llama7b"),
                      Catch::Contains("unknown preset 'llama7b' (did you mean 'llama-7b'?)"));
    CHECK_THROWS_WITH(cli::load_preset("bert"), !Catch::Contains("did you mean"));
}

TEST_CASE("every model the README and the docs show in JSON reads as a valid model",
          "[model_file][readme]") {
    int models = 0;
    for (const auto& page : testing::doc_pages()) {
        std::istringstream text(page.text);
        std::string line, block;
        bool in_json = false;
        while (std::getline(text, line)) {
            if (line == "```json") {
                in_json = true, block.clear();
            } else if (in_json && line == "```") {
                in_json = false;
                if (block.find("\"hidden\"") == std::string::npos) continue;  // not a model
                CAPTURE(page.name, block);
                CHECK_NOTHROW(parse_model_json(block, page.name, "readme"));
                ++models;
            } else if (in_json) {
                block += line + "\n";
            }
        }
    }
    CHECK(models >= 2);
}
