// Building an architecture from a HuggingFace config.json: each model_type names its keys its own way.
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "json_reader.hpp"
#include "model_file.hpp"

namespace memcalc::cli {
namespace {

using nlohmann::json;

/// transformers' ACT2FN names, each to the row of what it runs: "gelu_new" and "gelu_fast" are
/// chains of Python ops, "gelu_pytorch_tanh" is torch's fused tanh kernel (src/transformers/activations.py).
const std::vector<std::pair<std::string, Activation>> hf_activations = {
    {"silu", Activation::silu},         {"swish", Activation::silu},
    {"gelu", Activation::gelu},         {"gelu_pytorch_tanh", Activation::gelu_tanh},
    {"relu", Activation::relu},         {"gelu_new", Activation::gelu_new},
    {"gelu_fast", Activation::gelu_fast}, {"quick_gelu", Activation::quick_gelu},
    // BLOOM's own GeLUFunction keeps only its input, as a fused kernel does (modeling_bloom.py)
    {"bloom_gelu", Activation::gelu_tanh},
};

Activation activation_named(const JsonReader& in, const char* key, const std::string& value) {
    std::string names;
    for (const auto& [name, activation] : hf_activations) {
        if (name == value) return activation;
        names += (names.empty() ? "" : ", ") + name;
    }
    in.fail(std::string(key) + " '" + value + "' is not an activation memcalc knows (" + names + ")");
}

/// The first of several spellings of one key that the file has ("n_embd", "hidden_size").
const char* spelled(const JsonReader& in, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
        if (in.has(k)) return k;
    return *keys.begin();  // absent: the first spelling names it in the "missing key" message
}

/// LLaMA and its descendants share one set of keys.
void llama_like(const JsonReader& in, Architecture& m, bool tied_default) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.kv_heads = in.positive_or("num_key_value_heads", 0);
    m.head_dim = in.positive_or("head_dim", 0);
    m.ffn = in.positive("intermediate_size");
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive_or("max_position_embeddings", 0);
    m.mlp = Mlp::gated, m.norm = Norm::rmsnorm, m.position = Position::rotary;
    const char* act = spelled(in, {"hidden_activation", "hidden_act"});
    m.activation = in.has(act) ? activation_named(in, act, in.text_or(act, "")) : Activation::silu;
    m.tied_embeddings = in.flag_or("tie_word_embeddings", tied_default);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
}

void llama(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    const bool attention_bias = in.flag_or("attention_bias", false), mlp_bias = in.flag_or("mlp_bias", false);
    if (mlp_bias && !attention_bias) in.fail("mlp_bias without attention_bias is not a bias layout memcalc models");
    m.bias = mlp_bias ? Bias::all : attention_bias ? Bias::attention : Bias::none;
}

void mixtral(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.experts = in.positive("num_local_experts");
    m.experts_per_token = in.positive("num_experts_per_tok");
}

void qwen2(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.bias = Bias::qkv;  // Qwen2 always has q, k and v biases
}

/// Qwen3: LLaMA's keys, head_dim given, q_norm and k_norm per head (modeling_qwen3.py).
void qwen3(const JsonReader& in, Architecture& m) {
    llama(in, m);
    m.qk_norm = QkNorm::per_head;
    if (in.flag_or("use_sliding_window", false))
        in.fail("use_sliding_window true (Qwen's sliding-window layers) is not modelled");
}

void gemma(const JsonReader& in, Architecture& m) { llama_like(in, m, true); }

void gemma2(const JsonReader& in, Architecture& m) {
    llama_like(in, m, true);
    m.norms_per_layer = 4;  // before and after both attention and MLP
}

/// Gemma 3's text model: Gemma 2's four norms a layer, q_norm and k_norm per head; its sliding-window
/// layers keep what full-attention ones keep in training (eager attention masks a full s x s score
/// matrix; a fused kernel keeps a log-sum-exp per row either way). gemma3's multimodal config nests it.
void gemma3_text(const JsonReader& in, Architecture& m) {
    gemma2(in, m);
    m.qk_norm = QkNorm::per_head;
}

void phi3(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);  // fused qkv_proj and gate_up_proj hold the same parameters as separate ones
    m.hidden_dropout = in.probability_or("resid_pdrop", 0);
}

void gpt2(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("n_embd");
    m.layers = in.positive("n_layer");
    m.heads = in.positive("n_head");
    m.ffn = in.positive_or("n_inner", 4 * m.hidden);  // null means 4 h
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive("n_positions");
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all, m.position = Position::learned;
    m.activation = activation_named(in, "activation_function", in.text_or("activation_function", "gelu_new"));
    m.tied_embeddings = in.flag_or("tie_word_embeddings", true);
    m.attention_dropout = in.probability_or("attn_pdrop", 0);
    m.hidden_dropout = in.probability_or("resid_pdrop", 0);
    m.softmax_fp32 = false;  // its eager attention takes the softmax in the compute dtype
}

void opt(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.ffn = in.positive("ffn_dim");
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive("max_position_embeddings");
    m.position_rows = m.max_positions + 2;  // OPT's learned positions start at offset 2
    const std::uint64_t projection = in.positive_or("word_embed_proj_dim", m.hidden);
    if (projection != m.hidden)
        in.fail("word_embed_proj_dim (" + std::to_string(projection) + ") differs from hidden_size (" +
                std::to_string(m.hidden) + "): OPT-350m's project_in/project_out layers are not modelled");
    if (!in.flag_or("do_layer_norm_before", true)) in.fail("do_layer_norm_before false (post-norm OPT) is not modelled");
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.position = Position::learned;
    m.bias = in.flag_or("enable_bias", true) ? Bias::all : Bias::none;
    m.activation = activation_named(in, "activation_function", in.text_or("activation_function", "relu"));
    m.tied_embeddings = in.flag_or("tie_word_embeddings", true);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("dropout", 0);
    m.softmax_fp32 = false;  // its eager attention takes the softmax in the compute dtype
}

void falcon(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive(spelled(in, {"num_hidden_layers", "n_layer"}));
    m.heads = in.positive(spelled(in, {"num_attention_heads", "n_head"}));
    m.vocab = in.positive("vocab_size");
    m.ffn = in.positive_or("ffn_hidden_size", 4 * m.hidden);
    m.max_positions = in.positive_or("max_position_embeddings", 2048);
    const bool new_architecture = in.flag_or("new_decoder_architecture", false);
    if (new_architecture) {
        m.kv_heads = in.positive(spelled(in, {"num_kv_heads", "n_head_kv"}));
        m.norms_per_layer = in.positive_or("num_ln_in_parallel_attn", 2);
    } else {
        m.kv_heads = in.flag_or("multi_query", true) ? 1 : 0;
        m.norms_per_layer = 1;
    }
    m.parallel_attention = new_architecture || in.flag_or("parallel_attn", true);
    if (!m.parallel_attention) m.norms_per_layer = 2;
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.activation = Activation::gelu;
    m.bias = in.flag_or("bias", false) ? Bias::all : Bias::none;
    m.position = in.flag_or("alibi", false) ? Position::none : Position::rotary;
    m.tied_embeddings = in.flag_or("tie_word_embeddings", true);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("hidden_dropout", 0);
    m.softmax_fp32 = false;  // its eager attention takes the softmax in the compute dtype
}

void bloom(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive(spelled(in, {"hidden_size", "n_embed"}));
    m.layers = in.positive(spelled(in, {"n_layer", "num_hidden_layers"}));
    m.heads = in.positive(spelled(in, {"n_head", "num_attention_heads"}));
    m.vocab = in.positive("vocab_size");
    m.ffn = 4 * m.hidden;
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all, m.activation = Activation::gelu_tanh;
    m.position = Position::none;  // ALiBi: no position parameters
    m.embedding_norm = true;
    m.tied_embeddings = in.flag_or("tie_word_embeddings", true);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("hidden_dropout", 0);
}

void gpt_neox(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.ffn = in.positive("intermediate_size");
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive_or("max_position_embeddings", 0);
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.position = Position::rotary;  // rotary_pct: no parameters
    m.bias = in.flag_or("attention_bias", true) ? Bias::all : Bias::none;
    m.activation = activation_named(in, "hidden_act", in.text_or("hidden_act", "gelu"));
    m.parallel_attention = in.flag_or("use_parallel_residual", true);  // two LayerNorms either way
    m.tied_embeddings = in.flag_or("tie_word_embeddings", false);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("hidden_dropout", 0);
}

void phi(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.kv_heads = in.positive_or("num_key_value_heads", 0);
    m.ffn = in.positive("intermediate_size");
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive_or("max_position_embeddings", 0);
    if (in.flag_or("qk_layernorm", false)) in.fail("qk_layernorm true (LayerNorms on q and k) is not modelled");
    // One LayerNorm feeds attention and MLP in parallel; every linear has a bias, the head too.
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all, m.position = Position::rotary;
    m.parallel_attention = true, m.norms_per_layer = 1, m.head_bias = true;
    m.activation = activation_named(in, "hidden_act", in.text_or("hidden_act", "gelu_new"));
    m.tied_embeddings = in.flag_or("tie_word_embeddings", false);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("resid_pdrop", 0);
}

using Reader = std::function<void(const JsonReader&, Architecture&)>;
const std::vector<std::pair<std::string, Reader>> families = {
    {"llama", llama}, {"mistral", llama}, {"mixtral", mixtral}, {"qwen2", qwen2}, {"gemma", gemma},
    {"gemma2", gemma2}, {"phi3", phi3}, {"gpt2", gpt2}, {"opt", opt}, {"falcon", falcon}, {"bloom", bloom},
    {"gpt_neox", gpt_neox}, {"phi", phi}, {"qwen3", qwen3}, {"gemma3_text", gemma3_text},
    {"gemma3", gemma3_text},  // its text_config: the language model alone, the vision tower not counted
    {"RefinedWebModel", falcon}, {"RefinedWeb", falcon},  // Falcon's files from before transformers adopted it
};

}  // namespace

std::vector<std::string> supported_model_types() {
    std::vector<std::string> names;
    for (const auto& [name, unused] : families) names.push_back(name);
    return names;
}

ModelFile parse_hf_config(std::string_view text, const std::string& origin, const std::string& default_name) {
    const json document = parse_json(text, origin);
    if (!document.is_object()) throw error(origin + ": expected a config.json object (got " +
                                           std::string(document.type_name()) + ")");
    const JsonReader in(document, origin);
    if (!in.has("model_type")) in.fail("missing key 'model_type'");
    const std::string type = in.text_or("model_type", "");
    const auto family = std::find_if(families.begin(), families.end(), [&](const auto& f) { return f.first == type; });
    if (family == families.end()) {
        std::string names;
        for (const auto& name : supported_model_types()) names += (names.empty() ? "" : ", ") + name;
        // No nearest name: a near spelling is often another family ("qwen3" is not "qwen2").
        in.fail("model_type '" + type + "' is not supported; memcalc reads " + names);
    }
    ModelFile file;
    file.architecture.name = default_name;
    // A multimodal config nests its language model's keys (Gemma 3's text_config).
    const bool nested = type == "gemma3";
    if (nested && !(document.contains("text_config") && document.at("text_config").is_object()))
        in.fail("model_type gemma3 needs its language model's keys in a text_config object");
    family->second(nested ? JsonReader(document.at("text_config"), origin + " (text_config)") : in, file.architecture);
    file.description = "imported from " + origin + " (model_type " + type + (nested ? ", text_config: the language "
                                                                                      "model alone" : "") + ")";
    try {
        validate(file.architecture);
    } catch (const error& e) {
        throw error(origin + ": " + e.what());
    }
    return file;
}

ModelFile load_hf_config(const std::string& path) {
    const std::filesystem::path p(path);
    // ".../Llama-2-7b-hf/config.json" is the model Llama-2-7b-hf; "qwen2-7b.json" is qwen2-7b.
    std::string name = p.stem().string();
    if (name == "config" && p.has_parent_path() && !p.parent_path().filename().empty())
        name = p.parent_path().filename().string();
    return parse_hf_config(read_text_file(path, "config file"), path, name);
}

}  // namespace memcalc::cli
