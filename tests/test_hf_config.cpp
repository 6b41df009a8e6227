#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <sstream>

#include "memcalc/params.hpp"
#include "model_file.hpp"
#include "run_program.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
const std::string configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";

json read_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}
}  // namespace

TEST_CASE("real config.json files give their checkpoints' exact counts", "[hf_config]") {
    // tests/configs holds copies of published config.json files; manifest.json gives each one's
    // exact num_parameters() and where that figure was published.
    const json manifest = read_json(configs + "manifest.json");
    std::set<std::string> families;
    for (const auto& [name, entry] : manifest.items()) {
        CAPTURE(name);
        const auto file = cli::load_hf_config(configs + name + ".json");
        CHECK(parameter_table(file.architecture).total().value() ==
              entry["published_parameters"].get<std::uint64_t>());
        CHECK(file.architecture.name == name);
        families.insert(entry["model_type"].get<std::string>());
    }
    CHECK(manifest.size() >= 20);
    // Every model_type has a real config here but Falcon's old names, the multimodal config whose
    // text_config is another type's (llama4), and those whose config.json was not found published
    // with an exact count (phimoe, llama4_text: tested on their shapes below; falcon_h1's counts
    // are published rounded: test_falcon_h1.cpp).
    const std::set<std::string> without_config = {"RefinedWebModel", "RefinedWeb",  "llama4",
                                                  "phimoe",          "llama4_text", "falcon_h1"};
    for (const auto& type : cli::supported_model_types()) {
        CAPTURE(type);
        CHECK(families.count(type) + without_config.count(type) == 1);
    }
}

TEST_CASE(
    "the README's table of model types has a row for every type the reader knows, with "
    "its manifest counts",
    "[hf_config][readme]") {
    std::ifstream in(std::string(MEMCALC_SOURCE_DIR) + "/docs/model-files.md");
    std::stringstream text;
    text << in.rdbuf();
    const std::string page = text.str();
    const std::string table = page.substr(page.find("## Model types"));
    std::set<std::string> listed;
    std::istringstream lines(table.substr(0, table.find("\n## ")));
    for (std::string line; std::getline(lines, line);)
        if (line.rfind("| ", 0) == 0) listed.insert(line.substr(2, line.find(" |", 2) - 2));
    for (const auto& type : cli::supported_model_types()) {
        CAPTURE(type);
        CHECK(listed.count(type) == 1);
    }
    // Each published count of the manifest, with the name it is published under, in its type's row.
    const json manifest = read_json(configs + "manifest.json");
    for (const auto& [name, entry] : manifest.items()) {
        CAPTURE(name);
        const std::string type = entry["model_type"].get<std::string>();
        const std::size_t row = table.find("| " + type + " |");
        REQUIRE(row != std::string::npos);
        const std::string line = table.substr(row, table.find('\n', row) - row);
        std::string count = std::to_string(entry["published_parameters"].get<std::uint64_t>());
        for (int at = static_cast<int>(count.size()) - 3; at > 0; at -= 3) count.insert(at, ",");
        CHECK_THAT(line, Catch::Contains(name + " " + count));
    }
}

TEST_CASE("the help of --config names every model_type the reader knows", "[hf_config][cli]") {
    // 1.2.0's listed 13 of 28.
    const auto help = testing::memcalc("--help");
    REQUIRE(help.status == 0);
    const std::string flat = [&] {
        std::string s;
        for (char c : help.out) s += c == '\n' ? ' ' : c;  // a name may sit at a line's end
        return s;
    }();
    for (const auto& type : cli::supported_model_types()) {
        CAPTURE(type);
        CHECK((flat.find(" " + type + ",") != std::string::npos ||
               flat.find(" " + type + ")") != std::string::npos ||
               flat.find(" " + type + " ") != std::string::npos));
    }
}

TEST_CASE("Qwen2-MoE's shared expert and gate, Qwen3-MoE's experts, their dense layers",
          "[hf_config][experts]") {
    const auto qwen2 = cli::load_hf_config(configs + "qwen1.5-moe-a2.7b.json").architecture;
    CHECK(qwen2.shared_ffn == 5632);
    CHECK(qwen2.shared_expert_gate);
    CHECK_FALSE(qwen2.renormalize_topk);  // norm_topk_prob false
    CHECK(qwen2.ffn == 1408);
    CHECK(qwen2.layer_kinds.empty());
    const auto qwen3 = cli::load_hf_config(configs + "qwen3-30b-a3b.json").architecture;
    CHECK(qwen3.renormalize_topk);
    CHECK(qwen3.shared_ffn == 0);
    CHECK(qwen3.qk_norm == QkNorm::per_head);
    // decoder_sparse_step 2 and mlp_only_layers [1]: layers 0, 1 and 2 dense (intermediate_size), 3
    // MoE, ...
    json sparse = read_json(configs + "qwen1.5-moe-a2.7b.json");
    sparse["decoder_sparse_step"] = 2, sparse["mlp_only_layers"] = {1};
    const auto mixed = cli::parse_hf_config(sparse.dump(), "q.json", "q").architecture;
    REQUIRE(mixed.layer_pattern.size() == 22);
    CHECK(mixed.layers_of_kind(0) == 11);  // MoE: 3, 5, ..., 23
    CHECK(mixed.layers_of_kind(1) == 13);
    const std::uint64_t h = 2048, moe = 570560512, dense = 4 * h * h + 3 * h + 2 * h + 3 * h * 5632;
    const std::uint64_t outside = 2 * 151936 * h + h;
    CHECK(parameter_table(mixed).total().value() == 11 * moe + 13 * dense + outside);
    CHECK(parameter_table(mixed.kind_view(1)).per_layer().value() == dense);
    sparse["mlp_only_layers"] = "1";
    CHECK_THROWS_WITH(cli::parse_hf_config(sparse.dump(), "q.json", "q"),
                      Catch::Contains("mlp_only_layers must be an array of non-negative integers"));
}

TEST_CASE("GLM-4.5's layers: dense then DeepSeek-style experts, q/k/v biases, q/k norms per head",
          "[hf_config][experts]") {
    const auto glm = cli::load_hf_config(configs + "glm-4.7.json");
    const Architecture& m = glm.architecture;
    // first_k_dense_replace 3: three dense layers of intermediate_size, then 89 MoE layers.
    REQUIRE(m.layer_pattern.size() == 2);
    CHECK(m.layers_of_kind(1) == 3);
    CHECK(m.layers_of_kind(0) == 89);
    CHECK(m.kind_view(1).ffn == 12288);
    CHECK(!m.kind_view(1).is_moe());
    CHECK(m.kind_view(0).experts == 160);
    CHECK(m.kind_view(0).ffn == 1536);
    CHECK(m.kind_view(0).shared_ffn == 1536);  // n_shared_experts 1
    CHECK(m.router_bias == RouterBias::buffer);
    CHECK(m.bias == Bias::qkv);  // attention_bias: q, k, v; o_proj never
    CHECK(m.qk_norm == QkNorm::per_head);
    CHECK(m.head_size() == 128);  // head_dim beside 96 heads of a 5120 width
    // Attention: q, k, v with biases, o, and q_norm, k_norm of head_dim.
    const std::uint64_t h = 5120, q = 96 * 128, kv = 8 * 128;
    const std::uint64_t attention = h * q + q + 2 * (h * kv + kv) + q * h + 2 * 128;
    const std::uint64_t routed = 160 * 3 * h * 1536 + 3 * h * 1536 + 160 * h;
    const ParameterTable t = parameter_table(m);
    CHECK(t.per_layer(0).value() == attention + 2 * h + routed);
    CHECK(t.per_layer(1).value() == attention + 2 * h + 3 * h * 12288);
    // The checkpoint's total: the router buffers, the MTP layer (a MoE layer, enorm, hnorm,
    // shared_head.norm, eh_proj) with its router buffer, and its copies of the embedding and head.
    const std::uint64_t mtp = t.per_layer(0).value() + 3 * h + 2 * h * h;
    CHECK(glm.description.find(std::to_string(mtp) + " parameters") != std::string::npos);
    CHECK(t.total().value() + 89 * 160 + mtp + 160 + 2 * 151552 * h == 358337791296ULL);

    const auto air = cli::load_hf_config(configs + "glm-4.5-air.json");
    CHECK(air.architecture.layers_of_kind(1) == 1);
    CHECK(air.architecture.qk_norm == QkNorm::none);  // use_qk_norm false
    const ParameterTable a = parameter_table(air.architecture);
    const std::uint64_t air_mtp = a.per_layer(0).value() + 3 * 4096 + 2 * 4096ULL * 4096;
    CHECK(a.total().value() + 46 * 128 + air_mtp + 2 * 151552ULL * 4096 == 110468824832ULL);
    // The two switches, each its parameters exactly: q/k norms, then the q, k, v biases.
    json air_config = read_json(configs + "glm-4.5-air.json");
    air_config["use_qk_norm"] = true;
    const auto normed = cli::parse_hf_config(air_config.dump(), "g.json", "g").architecture;
    CHECK(parameter_table(normed).total().value() - a.total().value() == 46 * 2 * 128);
    air_config["use_qk_norm"] = false, air_config["attention_bias"] = false;
    const auto plain = cli::parse_hf_config(air_config.dump(), "g.json", "g").architecture;
    CHECK(a.total().value() - parameter_table(plain).total().value() ==
          46 * (96 * 128 + 2 * 8 * 128));
    CHECK(parameter_table(cli::load_preset("glm-4.5").architecture).total() == t.total());
    CHECK(parameter_table(cli::load_preset("glm-4.5-air").architecture).total() == a.total());
}

TEST_CASE("MiniMax-M2: q/k norms over the whole projections, experts in every layer",
          "[hf_config][experts]") {
    const auto file = cli::load_hf_config(configs + "minimax-m2.json");
    const Architecture& m = file.architecture;
    CHECK(m.layer_kinds.empty());
    CHECK(m.experts == 256);
    CHECK(m.active_experts() == 8);
    CHECK(m.ffn == 1536);
    CHECK(m.shared_ffn == 0);
    CHECK(m.bias == Bias::none);
    CHECK(m.qk_norm == QkNorm::whole);
    CHECK(m.router_bias == RouterBias::buffer);
    CHECK(m.renormalize_topk);
    CHECK(m.head_size() == 128);
    CHECK(file.notes.empty());  // num_mtp_modules: not in transformers' model, nor the checkpoint
    // q_norm of 48 x 128 and k_norm of 8 x 128: a weight per element of each projection.
    const std::uint64_t h = 3072, q = 48 * 128, kv = 8 * 128;
    const std::uint64_t attention = 2 * h * q + 2 * h * kv + q + kv;
    const ParameterTable t = parameter_table(m);
    CHECK(t.per_layer().value() == attention + 2 * h + 256 * 3 * h * 1536 + 256 * h);
    // The published total: num_parameters() and the 62 e_score_correction_bias buffers.
    CHECK(t.total().value() + 62 * 256 == 228689764864ULL);
    CHECK(parameter_table(cli::load_preset("minimax-m2").architecture).total() == t.total());
}

TEST_CASE("Phi-3.5-MoE: LayerNorms with biases, q/k/v/o biases, a biased head",
          "[hf_config][experts]") {
    // Phi-3.5-MoE-instruct's shape keys (its config.json: attention_bias and lm_head_bias true).
    const json phi = {
        {"model_type", "phimoe"},  {"hidden_size", 4096},       {"intermediate_size", 6400},
        {"num_hidden_layers", 32}, {"num_attention_heads", 32}, {"num_key_value_heads", 8},
        {"num_local_experts", 16}, {"num_experts_per_tok", 2},  {"vocab_size", 32064},
        {"attention_bias", true},  {"lm_head_bias", true},      {"tie_word_embeddings", false}};
    const auto m = cli::parse_hf_config(phi.dump(), "phi.json", "phi").architecture;
    CHECK(m.norm == Norm::layernorm);
    CHECK(m.bias == Bias::attention);
    CHECK(m.head_bias);
    // 41,873,153,344: the total quoted for Phi-3.5-MoE beside Phi-3.5-mini's 3,821,079,552 (README:
    // sources).
    CHECK(parameter_table(m).total().value() == 41873153344ULL);
}

TEST_CASE(
    "Llama 4's text model: interleaved dense and MoE layers, one shared expert, the multimodal "
    "text_config",
    "[hf_config][experts]") {
    // Llama 4 Maverick's text_config shape: 128 experts in every second layer, dense layers of
    // 16384.
    json maverick = {{"model_type", "llama4_text"}, {"hidden_size", 5120},
                     {"intermediate_size", 8192},   {"intermediate_size_mlp", 16384},
                     {"num_hidden_layers", 48},     {"num_attention_heads", 40},
                     {"num_key_value_heads", 8},    {"head_dim", 128},
                     {"vocab_size", 202048},        {"num_local_experts", 128},
                     {"num_experts_per_tok", 1},    {"interleave_moe_layer_step", 2},
                     {"use_qk_norm", true},         {"attention_chunk_size", 8192},
                     {"tie_word_embeddings", false}};
    const auto m = cli::parse_hf_config(maverick.dump(), "l.json", "l").architecture;
    CHECK(m.shared_ffn == 8192);
    CHECK_FALSE(m.renormalize_topk);
    // Layer 0 is dense (moe_layers = 1, 3, ..., 47); every 4th layer (3, 7, ...) is a NoPE MoE
    // layer.
    CHECK(m.layers_of_kind(0) == 24);
    CHECK(m.layers_of_kind(1) + m.layers_of_kind(2) == 24);
    CHECK(m.kind_view(0).experts == 0);
    // 400,711,848,960: Maverick's decoder, the public safetensors total less its vision encoder and
    // projector.
    CHECK(parameter_table(m).total().value() == 400711848960ULL);
    // Scout's shape: 16 experts in every layer, no dense kind.
    json scout = maverick;
    scout["num_local_experts"] = 16, scout["interleave_moe_layer_step"] = 1;
    const auto every = cli::parse_hf_config(scout.dump(), "l.json", "l").architecture;
    CHECK(every.every_kind([](const Architecture& v) { return v.is_moe(); }));
    const std::uint64_t h = 5120, attention = 2 * h * 40 * 128 + 2 * h * 8 * 128;
    const std::uint64_t layer = attention + 2 * h + h * 16 + 16 * 3 * h * 8192 + 3 * h * 8192;
    CHECK(parameter_table(every).total().value() == 48 * layer + 2 * 202048 * h + h);
    // moe_layers given outright wins over the step.
    scout["moe_layers"] = {
        0, 47};  // layer 0 rotary, layer 47 NoPE: two kinds of one layer each, four in all
    const auto two = cli::parse_hf_config(scout.dump(), "l.json", "l").architecture;
    CHECK(two.layer_kinds.size() == 4);
    CHECK(two.layers_of_kind(0) + two.layers_of_kind(3) == 2);
    // The multimodal config: its text_config alone.
    const json nested = {{"model_type", "llama4"},
                         {"text_config", maverick},
                         {"vision_config", {{"hidden_size", 1408}}}};
    const cli::ModelFile multimodal = cli::parse_hf_config(nested.dump(), "l.json", "l");
    CHECK(parameter_table(multimodal.architecture).total().value() == 400711848960ULL);
    CHECK(multimodal.description.find("text_config: the language model alone") !=
          std::string::npos);
}

TEST_CASE("family quirks come through the importer", "[hf_config]") {
    const auto gemma2 = cli::load_hf_config(configs + "gemma-2-9b-it.json").architecture;
    CHECK(gemma2.norms_per_layer == 4);
    CHECK(gemma2.head_size() == 256);
    CHECK(gemma2.tied_embeddings);
    const auto opt = cli::load_hf_config(configs + "opt-125m.json").architecture;
    CHECK(opt.learned_positions() == opt.max_positions + 2);
    CHECK(opt.activation == Activation::relu);
    const auto bloom = cli::load_hf_config(configs + "bloomz-560m.json").architecture;
    CHECK(bloom.embedding_norm);
    CHECK(bloom.position == Position::none);
    const auto mixtral = cli::load_hf_config(configs + "mixtral-8x7b-instruct.json").architecture;
    CHECK(mixtral.experts == 8);
    CHECK(mixtral.active_experts() == 2);
    const auto qwen = cli::load_hf_config(configs + "qwen2-0.5b.json").architecture;
    CHECK(qwen.bias == Bias::qkv);
    CHECK(qwen.tied_embeddings);
}

TEST_CASE("Qwen3 and Gemma 3 norm q and k per head; gemma3 reads its text_config",
          "[hf_config][qk_norm]") {
    const auto qwen3 = cli::load_hf_config(configs + "qwen3-8b.json").architecture;
    CHECK(qwen3.qk_norm == QkNorm::per_head);
    CHECK(qwen3.head_size() == 128);
    const auto gemma3 = cli::load_hf_config(configs + "gemma-3-1b-pt.json").architecture;
    CHECK(gemma3.qk_norm == QkNorm::per_head);
    CHECK(gemma3.norms_per_layer == 4);
    CHECK(gemma3.tied_embeddings);
    // Two weights of head_dim per layer: what a model without them lacks, exactly.
    Architecture bare = qwen3;
    bare.qk_norm = QkNorm::none;
    CHECK(parameter_table(qwen3).total().value() - parameter_table(bare).total().value() ==
          36 * 2 * 128);

    // The multimodal config's language model is the same text model, beside its tower.
    const json text = read_json(configs + "gemma-3-1b-pt.json");
    json nested = read_json(configs + "gemma-3-4b-it.json");
    nested["text_config"] = text;
    const auto from_nested = cli::parse_hf_config(nested.dump(), "g.json", "g").architecture;
    const ParameterTable with_tower = parameter_table(from_nested);
    CHECK(with_tower.total().value() - with_tower.part(Part::vision).value() ==
          parameter_table(gemma3).total().value());
    CHECK_THROWS_WITH(
        cli::parse_hf_config(R"({"model_type": "gemma3"})", "g.json", "g"),
        "g.json: model_type gemma3 needs its language model's keys in a text_config object");
    // Keys its text_config leaves out take Gemma3TextConfig's defaults, as transformers' do.
    nested["text_config"] = json::object({{"num_hidden_layers", 2}});
    const auto defaults = cli::parse_hf_config(nested.dump(), "g.json", "g").architecture;
    CHECK(defaults.hidden == 2304);
    CHECK(defaults.heads == 8);
    CHECK(defaults.kv_heads == 4);
    CHECK(defaults.head_dim == 256);
    CHECK(defaults.vocab == 262208);
    CHECK(defaults.layers == 2);
    // use_sliding_window: the layers from max_window_layers on slide, and keep what full ones keep.
    json sliding = read_json(configs + "qwen3-8b.json");
    sliding["use_sliding_window"] = true, sliding["sliding_window"] = 4096,
    sliding["max_window_layers"] = 28;
    const auto windowed = cli::parse_hf_config(sliding.dump(), "q.json", "q").architecture;
    CHECK(windowed.layers_of_kind(1) == 8);
    CHECK(parameter_table(windowed).total() == parameter_table(qwen3).total());
}

TEST_CASE("a config.json the importer cannot read says which key or type", "[hf_config]") {
    using Row = std::pair<std::string, std::string>;
    const auto [text, message] = GENERATE(table<std::string, std::string>({
        Row{R"({"hidden_size": 8})", "c.json: missing key 'model_type'"},
        Row{R"({"model_type": "mamba"})",
            "model_type 'mamba' is not supported; memcalc reads llama, mistral"},
        Row{R"({"model_type": "llama", "hidden_size": 64})",
            "c.json: missing key 'num_hidden_layers'"},
        Row{R"({"model_type": "gpt2", "n_embd": "768"})",
            "n_embd must be a positive integer (got string \"768\")"},
        Row{R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4,
               "intermediate_size": 128, "vocab_size": 10, "hidden_act": "swiglu2"})",
            "hidden_act 'swiglu2' is not an activation memcalc knows"},
        Row{R"({"model_type": "opt", "hidden_size": 1024, "num_hidden_layers": 24,
            "num_attention_heads": 16,
               "ffn_dim": 4096, "vocab_size": 50272, "max_position_embeddings": 2048,
               "word_embed_proj_dim": 512})",
            "word_embed_proj_dim (512) differs from hidden_size (1024)"},
        Row{R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 6,
               "intermediate_size": 128, "vocab_size": 10})",
            "c.json: heads (6) must divide hidden (64)"},
        Row{"{\"model_type\": ", "c.json: malformed JSON"},
    }));
    CAPTURE(text);
    CHECK_THROWS_WITH(cli::parse_hf_config(text, "c.json", "c"), Catch::Contains(message));
}

TEST_CASE("a known but unmodelled type is refused by name, with what it lacks", "[hf_config]") {
    const auto [type, lacks] = GENERATE(table<std::string, std::string>({
        {"glm_moe_dsa", "sparse attention"},
    }));
    CHECK_THROWS_WITH(
        cli::parse_hf_config(json{{"model_type", type}}.dump(), "c.json", "c"),
        Catch::StartsWith("c.json: model_type '" + type + "' is not modelled yet: ") &&
            Catch::Contains(lacks));
}

TEST_CASE(
    "an unknown model_type gets the list of known ones, never a nearest name from another family",
    "[hf_config]") {
    // "qwen4" is one edit from "qwen3" and "qwen2", "lama" one from "llama": a guess across
    // families misleads.
    for (const std::string type : {"qwen4", "lama", "gemma4", "mamba"}) {
        CAPTURE(type);
        const std::string text = json{{"model_type", type}}.dump();
        CHECK_THROWS_WITH(cli::parse_hf_config(text, "c.json", "c"),
                          Catch::StartsWith("c.json: model_type '" + type +
                                            "' is not supported; memcalc reads llama, ") &&
                              !Catch::Contains("did you mean"));
    }
}

TEST_CASE("a config named config.json takes its folder's name", "[hf_config]") {
    const std::string dir = "memcalc_test_dir/Tiny-Llama";
    std::system(("mkdir -p " + dir).c_str());
    std::ofstream(dir + "/config.json")
        << R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 10})";
    CHECK(cli::load_hf_config(dir + "/config.json").architecture.name == "Tiny-Llama");
    std::system("rm -rf memcalc_test_dir");
}

TEST_CASE("transformers' activation names map to the row of what they run",
          "[hf_config][activation_functions]") {
    // ACT2FN: gelu_new and gelu_fast are chains of Python ops, gelu_pytorch_tanh torch's fused
    // kernel.
    using Row = std::pair<std::string, Activation>;
    const auto [name, activation] = GENERATE(table<std::string, Activation>({
        Row{"gelu_new", Activation::gelu_new},
        Row{"gelu_pytorch_tanh", Activation::gelu_tanh},
        Row{"gelu", Activation::gelu},
        Row{"silu", Activation::silu},
        Row{"swish", Activation::silu},
        Row{"relu", Activation::relu},
        Row{"gelu_fast", Activation::gelu_fast},
        Row{"quick_gelu", Activation::quick_gelu},
        Row{"bloom_gelu", Activation::gelu_tanh},
    }));
    CAPTURE(name);
    const std::string gpt2 =
        R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
                                 "n_positions": 64, "activation_function": ")" +
        name + "\"}";
    CHECK(cli::parse_hf_config(gpt2, "c.json", "c").architecture.activation == activation);
    const std::string llama =
        R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4,
                                  "intermediate_size": 128, "vocab_size": 10, "hidden_act": ")" +
        name + "\"}";
    CHECK(cli::parse_hf_config(llama, "c.json", "c").architecture.activation == activation);
}

TEST_CASE("GPT-2's and Phi-2's published configs run gelu_new's ops; Gemma's the fused tanh kernel",
          "[hf_config][activation_functions]") {
    CHECK(cli::load_hf_config(configs + "gpt2.json").architecture.activation ==
          Activation::gelu_new);
    CHECK(cli::load_hf_config(configs + "phi-2.json").architecture.activation ==
          Activation::gelu_new);
    CHECK(cli::load_hf_config(configs + "gemma-2b.json").architecture.activation ==
          Activation::gelu_tanh);
    CHECK(cli::load_hf_config(configs + "pythia-1b.json").architecture.activation ==
          Activation::gelu);
    // The presets say the same as their configs.
    for (const char* name : {"gpt2", "phi-2"})
        CHECK(cli::load_preset(name).architecture.activation ==
              cli::load_hf_config(configs + name + ".json").architecture.activation);
    CHECK_THROWS_WITH(
        cli::parse_hf_config(R"({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
                                                "vocab_size": 100, "n_positions": 64,
                                                "activation_function": "gelu_neww"})",
                             "c.json", "c"),
        Catch::Contains("activation_function 'gelu_neww' is not an activation memcalc knows (silu, "
                        "swish, gelu,"));
}
