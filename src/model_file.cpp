#include "model_file.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "memcalc/activation_functions.hpp"
#include "memcalc/error.hpp"
#include "memcalc/program_facts.hpp"
#include "json_reader.hpp"
#include "suggest.hpp"

namespace memcalc::cli {
namespace {

using nlohmann::json;

const std::vector<std::string> architecture_keys = {"hidden",
                                                    "layers",
                                                    "heads",
                                                    "kv_heads",
                                                    "head_dim",
                                                    "ffn",
                                                    "vocab",
                                                    "max_positions",
                                                    "position_rows",
                                                    "embedding_rows",
                                                    "mlp",
                                                    "norm",
                                                    "bias",
                                                    "position",
                                                    "tied_embeddings",
                                                    "experts",
                                                    "experts_per_token",
                                                    "activation",
                                                    "norms_per_layer",
                                                    "parallel_attention",
                                                    "embedding_norm",
                                                    "attention_dropout",
                                                    "hidden_dropout",
                                                    "mlp_dropout",
                                                    "head_bias",
                                                    "qk_norm",
                                                    "shared_ffn",
                                                    "shared_expert_gate",
                                                    "router_bias",
                                                    "renormalize_topk",
                                                    "expert_imbalance",
                                                    "q_lora_rank",
                                                    "kv_lora_rank",
                                                    "qk_nope_head_dim",
                                                    "qk_rope_head_dim",
                                                    "v_head_dim",
                                                    "index_n_heads",
                                                    "index_head_dim",
                                                    "index_topk",
                                                    "norm_position",
                                                    "attention_sinks",
                                                    "attention_output_gate",
                                                    "window",
                                                    "attention_chunk",
                                                    "attention_temperature",
                                                    "router",
                                                    "input_jitter",
                                                    "mtp_layers",
                                                    "mixer",
                                                    "mamba_inner",
                                                    "mamba_state",
                                                    "mamba_conv",
                                                    "mamba_dt_rank",
                                                    "mamba_conv_bias",
                                                    "mamba_proj_bias",
                                                    "mamba_inner_norms",
                                                    "mamba_kernels",
                                                    "mamba_heads",
                                                    "mamba_groups",
                                                    "mamba_chunk",
                                                    "mamba_gated_norm"};
const std::vector<std::string> metadata_keys = {"name", "description", "source",
                                                "published_parameters"};
const std::vector<std::string> kind_keys = {"name",
                                            "ffn",
                                            "experts",
                                            "experts_per_token",
                                            "shared_ffn",
                                            "shared_expert_gate",
                                            "router_bias",
                                            "window",
                                            "attention_chunk",
                                            "position",
                                            "qk_norm",
                                            "mixer",
                                            "has_mlp"};

const std::map<std::string, Position> position_choices = {
    {"rotary", Position::rotary}, {"learned", Position::learned}, {"none", Position::none}};
const std::map<std::string, QkNorm> qk_norm_choices = {{"none", QkNorm::none},
                                                       {"per_head", QkNorm::per_head},
                                                       {"whole", QkNorm::whole},
                                                       {"l2", QkNorm::l2}};
const std::map<std::string, Mixer> mixer_choices = {{"attention", Mixer::attention},
                                                    {"mamba", Mixer::mamba},
                                                    {"mamba2", Mixer::mamba2},
                                                    {"none", Mixer::none},
                                                    {"gated_deltanet", Mixer::gated_deltanet},
                                                    {"attention_mamba2", Mixer::attention_mamba2},
                                                    {"cross_attention", Mixer::cross_attention}};

std::map<std::string, RouterBias> router_bias_choices() {
    std::map<std::string, RouterBias> choices;
    for (const auto& [id, name] : router_bias_names) choices.emplace(name, id);
    return choices;
}

/// "layer_kinds": [{"name": "dense", "ffn": 18432, "experts": 0}, {"name": "moe"}] and
/// "layer_pattern": [{"kind": "dense", "layers": 3}, {"kind": "moe", "layers": 58}], first layer
/// first.
void read_layer_kinds(const json& document, const std::string& origin, Architecture& m) {
    const bool kinds = document.contains("layer_kinds"),
               pattern = document.contains("layer_pattern");
    if (!kinds && !pattern) return;
    if (!kinds || !pattern)
        throw error(origin + ": layer_kinds and layer_pattern go together: give both or neither");
    const json& list = document.at("layer_kinds");
    if (!list.is_array() || list.empty())
        throw error(origin + ": layer_kinds must be a non-empty array of objects");
    std::vector<std::string> names;
    for (std::size_t i = 0; i < list.size(); ++i) {
        const std::string where = origin + ": layer_kinds[" + std::to_string(i) + "]";
        expect_object(list[i], where, "a kind of layer", kind_keys);
        const JsonReader in(list[i], where);
        LayerKind kind{in.shown_text_or("name", ""), in.count_if_given("ffn"),
                       in.count_if_given("experts"), in.count_if_given("experts_per_token"),
                       in.count_if_given("shared_ffn")};
        if (in.has("shared_expert_gate"))
            kind.shared_expert_gate = in.flag_or("shared_expert_gate", false);
        if (in.has("router_bias"))
            kind.router_bias = in.choice_or("router_bias", router_bias_choices(), RouterBias::none);
        kind.window = in.count_if_given("window");
        kind.attention_chunk = in.count_if_given("attention_chunk");
        if (in.has("position"))
            kind.position = in.choice_or("position", position_choices, Position::rotary);
        if (in.has("qk_norm"))
            kind.qk_norm = in.choice_or("qk_norm", qk_norm_choices, QkNorm::none);
        if (in.has("mixer")) kind.mixer = in.choice_or("mixer", mixer_choices, Mixer::attention);
        if (in.has("has_mlp")) kind.has_mlp = in.flag_or("has_mlp", true);
        if (kind.name.empty()) in.fail("name must be a non-empty string");
        if (std::find(names.begin(), names.end(), kind.name) != names.end())
            in.fail("name '" + kind.name + "' is given twice");
        if (kind.ffn == std::uint64_t{0}) in.fail("ffn must be a positive integer (got 0)");
        names.push_back(kind.name);
        m.layer_kinds.push_back(std::move(kind));
    }
    const json& runs = document.at("layer_pattern");
    if (!runs.is_array() || runs.empty())
        throw error(origin + ": layer_pattern must be a non-empty array of objects");
    for (std::size_t i = 0; i < runs.size(); ++i) {
        const std::string where = origin + ": layer_pattern[" + std::to_string(i) + "]";
        expect_object(runs[i], where, "a run of layers", {"kind", "layers"});
        const JsonReader in(runs[i], where);
        const std::string name = in.text_or("kind", "");
        const auto it = std::find(names.begin(), names.end(), name);
        if (it == names.end())
            in.fail("kind '" + name + "' is not in layer_kinds" + did_you_mean(name, names));
        m.layer_pattern.push_back(
            {static_cast<std::size_t>(it - names.begin()), in.positive("layers")});
    }
}

/// The sizes and the layer's shape: name to position_rows.
void read_shape(const JsonReader& in, Architecture& m, const std::string& default_name) {
    m.name = in.shown_text_or("name", default_name);
    m.hidden = in.positive("hidden");
    m.layers = in.positive("layers");
    m.heads = in.positive("heads");
    m.kv_heads = in.positive_or("kv_heads", 0);
    m.head_dim = in.positive_or("head_dim", 0);
    m.ffn = in.positive("ffn");
    m.vocab = in.positive("vocab");
    m.max_positions = in.positive_or("max_positions", 0);
    m.mlp = in.choice_or<Mlp>("mlp", {{"gated", Mlp::gated}, {"plain", Mlp::plain}}, Mlp::gated);
    m.norm = in.choice_or<Norm>(
        "norm", {{"rmsnorm", Norm::rmsnorm}, {"layernorm", Norm::layernorm}}, Norm::rmsnorm);
    m.bias = in.choice_or<Bias>("bias",
                                {{"none", Bias::none},
                                 {"qkv", Bias::qkv},
                                 {"attention", Bias::attention},
                                 {"all", Bias::all}},
                                Bias::none);
    m.position = in.choice_or("position", position_choices, Position::rotary);
    m.tied_embeddings = in.flag_or("tied_embeddings", false);
    m.experts = in.positive_or("experts", 0);
    m.experts_per_token = in.positive_or("experts_per_token", 0);
    m.position_rows = in.positive_or("position_rows", 0);
    m.embedding_rows = in.positive_or("embedding_rows", 0);
}

/// The layer's details: the activation function to the router's.
/// Every program fact (program_facts.hpp): a flag as a JSON boolean, any other by its name.
void read_program_facts(const JsonReader& in, Architecture& m) {
    const Architecture defaults;
    for_each_program_fact([&](const auto& row) {
        using Value = std::decay_t<decltype(row.values[0])>;
        const std::string key(row.key);
        if constexpr (std::is_same_v<Value, bool>) {
            m.*row.member = in.flag_or(key.c_str(), defaults.*row.member);
        } else {
            std::map<std::string, Value> choices;
            for (const Value v : row.values) choices.emplace(row.name(v), v);
            m.*row.member = in.choice_or(key.c_str(), choices, defaults.*row.member);
        }
    });
}

void read_details(const JsonReader& in, Architecture& m) {
    std::map<std::string, Activation> activations;
    for (const auto& f : activation_functions) activations.emplace(f.name, f.id);
    m.activation = in.choice_or<Activation>(
        "activation", activations, m.mlp == Mlp::gated ? Activation::silu : Activation::gelu_tanh);
    m.norms_per_layer = in.positive_or("norms_per_layer", 2);
    m.parallel_attention = in.flag_or("parallel_attention", false);
    m.embedding_norm = in.flag_or("embedding_norm", false);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("hidden_dropout", 0);
    m.mlp_dropout = in.probability_or("mlp_dropout", 0);
    m.head_bias = in.flag_or("head_bias", false);
    m.qk_norm = in.choice_or("qk_norm", qk_norm_choices, QkNorm::none);
    m.norm_position = in.choice_or<NormPosition>(
        "norm_position", {{"pre", NormPosition::pre}, {"post", NormPosition::post}},
        NormPosition::pre);
    m.attention_sinks = in.flag_or("attention_sinks", false);
    m.attention_output_gate = in.flag_or("attention_output_gate", false);
    m.window = in.count_if_given("window").value_or(0);
    m.attention_chunk = in.count_if_given("attention_chunk").value_or(0);
    m.attention_temperature = in.flag_or("attention_temperature", false);
    std::map<std::string, Router> routers;
    for (const auto& [id, name] : router_names) routers.emplace(name, id);
    m.router = in.choice_or("router", routers, Router::softmax_topk);
    m.input_jitter = in.probability_or("input_jitter", 0);
    m.mtp_layers = in.count_if_given("mtp_layers").value_or(0);
    m.shared_ffn = in.count_if_given("shared_ffn").value_or(0);
    m.shared_expert_gate = in.flag_or("shared_expert_gate", false);
    m.router_bias = in.choice_or("router_bias", router_bias_choices(), RouterBias::none);
    m.renormalize_topk = in.flag_or("renormalize_topk", true);
    m.expert_imbalance = in.number_or("expert_imbalance", 1.0);
}

/// Latent attention and the Mamba mixer.
void read_mla_and_mamba(const JsonReader& in, Architecture& m) {
    // Latent attention (DeepSeek): HF config.json's names; kv_lora_rank > 0 turns it on.
    m.mla = {in.count_if_given("q_lora_rank").value_or(0), in.positive_or("kv_lora_rank", 0),
             in.positive_or("qk_nope_head_dim", 0), in.positive_or("qk_rope_head_dim", 0),
             in.positive_or("v_head_dim", 0)};
    // DeepSeek-V3.2's sparse-attention indexer: HF config.json's names.
    m.mla.index_heads = in.count_if_given("index_n_heads").value_or(0);
    m.mla.index_head_dim = in.count_if_given("index_head_dim").value_or(0);
    m.mla.index_topk = in.count_if_given("index_topk").value_or(0);
    // A Mamba-1 mixer (Jamba) or a Mamba-2 one (Granite 4.0 H): its widths wherever some layer
    // is one.
    m.mixer = in.choice_or("mixer", mixer_choices, Mixer::attention);
    m.ssm.d_inner = in.count_if_given("mamba_inner").value_or(0);
    m.ssm.d_state = in.count_if_given("mamba_state").value_or(0);
    m.ssm.d_conv = in.count_if_given("mamba_conv").value_or(0);
    m.ssm.dt_rank = in.count_if_given("mamba_dt_rank").value_or(0);
    m.ssm.conv_bias = in.flag_or("mamba_conv_bias", true);
    m.ssm.proj_bias = in.flag_or("mamba_proj_bias", false);
    m.ssm.inner_norms = in.flag_or("mamba_inner_norms", false);
    m.ssm.kernels = in.flag_or("mamba_kernels", true);
    m.ssm.heads = in.count_if_given("mamba_heads").value_or(0);
    m.ssm.groups = in.count_if_given("mamba_groups").value_or(0);
    m.ssm.chunk = in.count_if_given("mamba_chunk").value_or(0);
    m.ssm.gated_norm = in.flag_or("mamba_gated_norm", true);
}

/// "vision": a vision tower's fields (vision.hpp's tables), each named by its key.
void read_vision(const json& document, const std::string& origin, Architecture& m) {
    if (!document.contains("vision")) return;
    const std::string where = origin + " (vision)";
    std::vector<std::string> keys;
    for (const auto& f : vision_counts) keys.emplace_back(f.key);
    for (const auto& f : vision_flags) keys.emplace_back(f.key);
    expect_object(document.at("vision"), where, "a vision tower", keys);
    const JsonReader in(document.at("vision"), where);
    for (const auto& f : vision_counts) {
        const std::string key(f.key);
        m.vision.*f.member = in.count_if_given(key.c_str()).value_or(m.vision.*f.member);
    }
    for (const auto& f : vision_flags) {
        const std::string key(f.key);
        m.vision.*f.member = in.flag_or(key.c_str(), m.vision.*f.member);
    }
    if (m.vision.depth == 0) in.fail("missing key 'depth' (a positive integer)");
}

}  // namespace

ModelFile parse_model_json(std::string_view text, const std::string& origin,
                           const std::string& default_name) {
    const json document = parse_json(text, origin);
    std::vector<std::string> known = architecture_keys;
    known.insert(known.end(), metadata_keys.begin(), metadata_keys.end());
    known.insert(known.end(), {"layer_kinds", "layer_pattern", "vision"});
    for_each_program_fact([&](const auto& row) { known.emplace_back(row.key); });
    expect_object(document, origin, "a model", known);

    const JsonReader in(document, origin);
    ModelFile file;
    Architecture& m = file.architecture;
    read_shape(in, m, default_name);
    read_details(in, m);
    read_program_facts(in, m);
    read_mla_and_mamba(in, m);
    file.description = in.shown_text_or("description", "");
    file.source = in.shown_text_or("source", "");
    if (in.has("published_parameters"))
        file.published_parameters = in.positive("published_parameters");
    read_layer_kinds(document, origin, m);
    read_vision(document, origin, m);

    try {
        validate(m);
    } catch (const error& e) {
        throw error(origin + ": " + e.what());
    }
    return file;
}

std::string read_text_file(const std::string& path, const std::string& what) {
    const std::string named = what + " '" + path + "'";
    // A regular file only: a device (/dev/zero) or a FIFO would be read without end or wait
    // forever.
    std::error_code code;
    const auto status = std::filesystem::status(path, code);
    if (code) throw error("cannot read " + named + ": " + code.message());
    if (!std::filesystem::is_regular_file(status))
        throw error("cannot read " + named + ": not a regular file");
    const auto size = std::filesystem::file_size(path, code);
    if (code) throw error("cannot read " + named + ": " + code.message());
    if (size > max_input_bytes)
        throw error(named + " is " + std::to_string(size) + " bytes; memcalc reads at most " +
                    std::to_string(max_input_bytes) + " (16 MiB)");
    std::ifstream stream(path, std::ios::binary);
    if (!stream) throw error("cannot read " + named);
    remember_input(path);  // no output of this run may replace it
    std::string text(static_cast<std::size_t>(size), '\0');
    stream.read(text.data(), static_cast<std::streamsize>(size));
    if (stream.bad() || static_cast<std::uintmax_t>(stream.gcount()) != size ||
        stream.peek() != std::char_traits<char>::eof())
        throw error("cannot read " + named + ": it changed while being read");
    return text;
}

namespace {
std::vector<InputFile>& recorded_inputs() {
    thread_local std::vector<InputFile> inputs;  // the Python module may run two commands at once
    return inputs;
}
}  // namespace

void remember_input(const std::string& path) {
    struct stat file {};
    if (stat(path.c_str(), &file) != 0)
        return;  // gone since it was opened: the read fails and says why
    recorded_inputs().push_back({path, file.st_dev, file.st_ino});
}

const std::vector<InputFile>& inputs_read() { return recorded_inputs(); }

void forget_inputs() { recorded_inputs().clear(); }

ModelFile load_model_file(const std::string& path) {
    return parse_model_json(read_text_file(path, "model file"), path,
                            std::filesystem::path(path).stem().string());
}

}  // namespace memcalc::cli
