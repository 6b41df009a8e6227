// Building an architecture from a HuggingFace config.json: each model_type names its keys its own
// way.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "json_reader.hpp"
#include "memcalc/params.hpp"
#include "model_file.hpp"

namespace memcalc::cli {
namespace {

using nlohmann::json;

/// transformers' ACT2FN names, each to the row of what it runs: "gelu_new" and "gelu_fast" are
/// chains of Python ops, "gelu_pytorch_tanh" is torch's fused tanh kernel
/// (src/transformers/activations.py).
const std::vector<std::pair<std::string, Activation>> hf_activations = {
    {"silu", Activation::silu},
    {"swish", Activation::silu},
    {"gelu", Activation::gelu},
    {"gelu_pytorch_tanh", Activation::gelu_tanh},
    {"relu", Activation::relu},
    {"gelu_new", Activation::gelu_new},
    {"gelu_fast", Activation::gelu_fast},
    {"quick_gelu", Activation::quick_gelu},
    // BLOOM's own GeLUFunction keeps only its input, as a fused kernel does (modeling_bloom.py)
    {"bloom_gelu", Activation::gelu_tanh},
    {"relu2", Activation::relu2},  // ReLUSquaredActivation: Nemotron-H's MLP
};

Activation activation_named(const JsonReader& in, const char* key, const std::string& value) {
    std::string names;
    for (const auto& [name, activation] : hf_activations) {
        if (name == value) return activation;
        names += (names.empty() ? "" : ", ") + name;
    }
    in.fail(std::string(key) + " '" + value + "' is not an activation memcalc knows (" + names +
            ")");
}

/// The first of several spellings of one key that the file has ("n_embd", "hidden_size").
const char* spelled(const JsonReader& in, std::initializer_list<const char*> keys) {
    for (const char* k : keys)
        if (in.has(k)) return k;
    return *keys.begin();  // absent: the first spelling names it in the "missing key" message
}

/// LLaMA and its descendants share one set of keys.
void llama_like(const JsonReader& in, Architecture& m, bool tied_default,
                const char* ffn_key = "intermediate_size") {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.kv_heads = in.positive_or("num_key_value_heads", 0);
    m.head_dim = in.positive_or("head_dim", 0);
    m.ffn = in.positive(ffn_key);
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive_or("max_position_embeddings", 0);
    m.mlp = Mlp::gated, m.norm = Norm::rmsnorm, m.position = Position::rotary;
    const char* act = spelled(in, {"hidden_activation", "hidden_act"});
    m.activation = in.has(act) ? activation_named(in, act, in.text_or(act, "")) : Activation::silu;
    m.tied_embeddings = in.flag_or("tie_word_embeddings", tied_default);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
}

/// Each layer's attention window from transformers' layer_types ("sliding_attention" layers get
/// sliding_window, "full_attention" ones none), or `sliding(i)` where the config has none. Layers
/// alike: the model's window; else a kind per window and the runs of layers in order.
void read_windows(const JsonReader& in, Architecture& m,
                  const std::function<bool(std::uint64_t)>& sliding) {
    const std::uint64_t window = in.count_if_given("sliding_window").value_or(0);
    std::vector<std::uint64_t> per_layer;
    if (const auto types = in.texts_if_given("layer_types")) {
        if (types->size() != m.layers)
            in.fail("layer_types has " + std::to_string(types->size()) +
                    " entries; num_hidden_layers is " + std::to_string(m.layers));
        for (const auto& type : *types) {
            if (type != "sliding_attention" && type != "full_attention")
                in.fail("layer_types entry '" + type +
                        "' is not an attention memcalc models (full_attention, sliding_attention)");
            per_layer.push_back(type == "sliding_attention" ? window : 0);
        }
    } else {
        for (std::uint64_t i = 0; i < m.layers; ++i) per_layer.push_back(sliding(i) ? window : 0);
    }
    if (std::all_of(per_layer.begin(), per_layer.end(),
                    [&](std::uint64_t w) { return w == per_layer.front(); })) {
        m.window = per_layer.empty() ? 0 : per_layer.front();
        return;
    }
    std::vector<std::uint64_t> kinds;  // the window of each kind, first seen first
    for (const std::uint64_t w : per_layer) {
        auto it = std::find(kinds.begin(), kinds.end(), w);
        if (it == kinds.end()) {
            kinds.push_back(w);
            m.layer_kinds.push_back({w == 0 ? "full_attention" : "sliding_attention", {}, {}, {}});
            m.layer_kinds.back().window = w;
            it = kinds.end() - 1;
        }
        const std::size_t kind = static_cast<std::size_t>(it - kinds.begin());
        if (!m.layer_pattern.empty() && m.layer_pattern.back().kind == kind)
            ++m.layer_pattern.back().count;
        else
            m.layer_pattern.push_back({kind, 1});
    }
}

/// LLaMA's keys and its biases, the MLP's width under `ffn_key`.
void llama_with_ffn(const JsonReader& in, Architecture& m, const char* ffn_key) {
    llama_like(in, m, false, ffn_key);
    const bool attention_bias = in.flag_or("attention_bias", false),
               mlp_bias = in.flag_or("mlp_bias", false);
    if (mlp_bias && !attention_bias)
        in.fail("mlp_bias without attention_bias is not a bias layout memcalc models");
    m.bias = mlp_bias ? Bias::all : attention_bias ? Bias::attention : Bias::none;
}

void llama(const JsonReader& in, Architecture& m) { llama_with_ffn(in, m, "intermediate_size"); }

/// Mistral: LLaMA's keys and a sliding_window for every layer (null in v0.3).
void mistral(const JsonReader& in, Architecture& m) {
    llama(in, m);
    read_windows(in, m, [](std::uint64_t) { return true; });
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
    // use_sliding_window: layers from max_window_layers on slide (Qwen3Config's layer_types).
    const bool sliding = in.flag_or("use_sliding_window", false);
    const std::uint64_t first_sliding = in.count_if_given("max_window_layers").value_or(28);
    if (sliding || in.has("layer_types"))
        read_windows(in, m, [&](std::uint64_t i) { return sliding && i >= first_sliding; });
}

/// Dense and MoE layers in one model, first layer first: the model's fields are the MoE layers';
/// a layer where `routed(i)` is false is a dense kind of width `dense_ffn`.
void dense_and_moe_layers(Architecture& m, std::uint64_t dense_ffn,
                          const std::function<bool(std::uint64_t)>& routed) {
    if (m.layers > max_layers) return;  // validate() names it
    std::vector<LayerRun> runs;
    for (std::uint64_t i = 0; i < m.layers; ++i) {
        const std::size_t kind = routed(i) ? 0 : 1;
        if (!runs.empty() && runs.back().kind == kind)
            ++runs.back().count;
        else
            runs.push_back({kind, 1});
    }
    if (runs.size() == 1 && runs.front().kind == 0) return;  // every layer routes
    m.layer_kinds = {{"moe", {}, {}, {}}, {"dense", dense_ffn, std::uint64_t{0}, {}}};
    m.layer_pattern = std::move(runs);
    if (m.layer_pattern.size() == 1) m = m.kind_view(1);  // no layer routes: a dense model
}

/// Qwen2-MoE's and Qwen3-MoE's experts: a MoE block in every decoder_sparse_step-th layer not in
/// mlp_only_layers, a dense MLP of intermediate_size elsewhere (Qwen2MoeDecoderLayer).
void qwen_moe_layers(const JsonReader& in, Architecture& m) {
    const std::uint64_t dense_ffn = m.ffn;
    m.experts = in.positive("num_experts");
    m.experts_per_token = in.positive("num_experts_per_tok");
    m.ffn = in.positive("moe_intermediate_size");
    m.renormalize_topk =
        in.flag_or("norm_topk_prob", false);  // the configs' default: used as they are
    const std::uint64_t step = in.positive_or("decoder_sparse_step", 1);
    const std::vector<std::uint64_t> dense_only = in.counts_or_empty("mlp_only_layers");
    dense_and_moe_layers(m, dense_ffn, [&](std::uint64_t i) {
        return (i + 1) % step == 0 &&
               std::find(dense_only.begin(), dense_only.end(), i) == dense_only.end();
    });
}

/// Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2's attention, and beside the routed experts one
/// shared expert of shared_expert_intermediate_size scaled by sigmoid(shared_expert_gate(x))
/// (modeling_qwen2_moe.py).
void qwen2_moe(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.bias = in.flag_or("qkv_bias", true) ? Bias::qkv : Bias::none;
    if (in.flag_or("use_sliding_window", false))
        in.fail("use_sliding_window true (Qwen's sliding-window layers) is not modelled");
    m.shared_ffn = in.positive("shared_expert_intermediate_size");
    m.shared_expert_gate = true;
    qwen_moe_layers(in, m);
}

/// Qwen3-MoE: Qwen3's attention (q_norm, k_norm) and routed experts alone (modeling_qwen3_moe.py).
void qwen3_moe(const JsonReader& in, Architecture& m) {
    qwen3(in, m);
    qwen_moe_layers(in, m);
}

/// Phi-3.5-MoE: Mixtral's experts, LayerNorms with biases, q/k/v/o biases when attention_bias, a
/// biased head when lm_head_bias (modular_phimoe.py); its sparsemixer router (top 2, no
/// renormalisation) and, when input_jitter_noise, the MoE input's in-place jitter.
void phimoe(const JsonReader& in, Architecture& m) {
    mixtral(in, m);
    m.router = Router::sparsemixer, m.renormalize_topk = false;
    m.input_jitter = in.probability_or("input_jitter_noise", 0);
    m.norm = Norm::layernorm;
    m.bias = in.flag_or("attention_bias", false) ? Bias::attention : Bias::none;
    m.head_bias = in.flag_or("lm_head_bias", false);
}

/// Llama 4's text model (modeling_llama4.py): MoE layers at moe_layers (by default every
/// interleave_moe_layer_step-th) with num_local_experts experts and one shared expert, each of
/// intermediate_size, a bias-free router whose top-k logits pass a sigmoid, no renormalisation;
/// dense layers of intermediate_size_mlp. The layers no_rope_layers marks 1 (by default all but
/// every no_rope_layer_interval-th) have rotary, chunked attention of attention_chunk_size and,
/// with use_qk_norm, a weightless L2 norm of q and k; the others (NoPE) attend over the whole
/// sequence and, with attn_temperature_tuning, scale their queries per position. Its experts run
/// over every token (Llama4TextMoe) and its eager attention softmaxes in the scores' dtype. None of
/// it holds parameters beyond the experts' and the MLPs'.
void llama4_text(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.bias = in.flag_or("attention_bias", false) ? Bias::attention : Bias::none;
    const std::uint64_t dense_ffn = in.positive("intermediate_size_mlp");
    m.experts = in.positive("num_local_experts");
    m.experts_per_token = in.positive("num_experts_per_tok");
    m.shared_ffn = m.ffn;
    m.renormalize_topk = false;
    m.softmax_fp32 = false;
    m.expert_dispatch = ExpertDispatch::every_token;
    m.qk_norm = in.flag_or("use_qk_norm", true) ? QkNorm::l2 : QkNorm::none;
    // Early configs wrote attn_temperature_tuning as a number (4); any non-zero one turns it on.
    m.attention_temperature = in.flag_or_count("attn_temperature_tuning", true);
    const std::uint64_t chunk =
        in.has("attention_chunk_size") ? in.positive("attention_chunk_size") : 0;
    const bool listed = in.has("moe_layers");
    const std::vector<std::uint64_t> moe_layers = in.counts_or_empty("moe_layers");
    const std::uint64_t step = in.positive_or("interleave_moe_layer_step", 1);
    std::vector<std::uint64_t> rope =
        in.counts_or_empty("no_rope_layers");  // 1: rotary; empty: the default
    const std::uint64_t interval = in.positive_or("no_rope_layer_interval", 4);
    if (rope.empty())
        for (std::uint64_t i = 0; i < m.layers && i <= max_layers; ++i)
            rope.push_back((i + 1) % interval != 0);
    if (rope.size() < std::min(m.layers, max_layers))
        in.fail("no_rope_layers has " + std::to_string(rope.size()) +
                " entries; num_hidden_layers is " + std::to_string(m.layers));
    m.attention_chunk = chunk;
    if (m.layers > max_layers) return;  // validate() names it
    // A kind per (MoE or dense, rotary or NoPE) pair that has layers, first seen first.
    std::vector<std::pair<bool, bool>> seen;
    std::vector<LayerRun> runs;
    for (std::uint64_t i = 0; i < m.layers; ++i) {
        const bool routed =
            listed ? std::find(moe_layers.begin(), moe_layers.end(), i) != moe_layers.end()
                   : (i + 1) % step == 0;
        const std::pair kind{routed, rope[i] != 0};
        auto it = std::find(seen.begin(), seen.end(), kind);
        if (it == seen.end()) {
            seen.push_back(kind);
            LayerKind k{
                std::string(routed ? "moe" : "dense") + (kind.second ? "" : "_nope"), {}, {}, {}};
            if (!routed) k.ffn = dense_ffn, k.experts = 0;
            if (!kind.second)
                k.position = Position::none, k.qk_norm = QkNorm::none, k.attention_chunk = 0;
            m.layer_kinds.push_back(std::move(k));
            it = seen.end() - 1;
        }
        const std::size_t index = static_cast<std::size_t>(it - seen.begin());
        if (!runs.empty() && runs.back().kind == index)
            ++runs.back().count;
        else
            runs.push_back({index, 1});
    }
    m.layer_pattern = std::move(runs);
    if (m.layer_kinds.size() == 1) m = m.kind_view(0);  // every layer alike
}

void gemma(const JsonReader& in, Architecture& m) { llama_like(in, m, true); }

void gemma2(const JsonReader& in, Architecture& m) {
    llama_like(in, m, true);
    m.norms_per_layer = 4;  // before and after both attention and MLP
}

/// Gemma 3's text model: Gemma 2's four norms a layer, q_norm and k_norm per head; its
/// sliding-window layers keep what full-attention ones keep in training (eager attention masks a
/// full s x s score matrix; a fused kernel keeps a log-sum-exp per row either way). gemma3's
/// multimodal config nests it.
void gemma3_text(const JsonReader& in, Architecture& m) {
    gemma2(in, m);
    m.qk_norm = QkNorm::per_head;
    // Every sliding_window_pattern-th layer full (Gemma3TextConfig's default layer_types).
    const std::uint64_t pattern = in.positive_or("sliding_window_pattern", 6);
    read_windows(in, m, [&](std::uint64_t i) { return (i + 1) % pattern != 0; });
}

/// OLMo 2 (modeling_olmo2.py): LLaMA's keys; RMSNorms after attention and after the MLP, none
/// before; q_norm and k_norm over the whole projections; RMSNorm scales in fp32 before casting
/// back.
void olmo2(const JsonReader& in, Architecture& m) {
    llama(in, m);
    m.norm_position = NormPosition::post;
    m.qk_norm = QkNorm::whole;
    m.rmsnorm_fp32_scale = true;
}

/// gpt-oss (modeling_gpt_oss.py): biased q/k/v/o, a sink logit per head, alternating sliding and
/// full layers, experts with biases and a biased router, the clamped SwiGLU, softmax in the logits'
/// dtype. The checkpoint stores the experts as MXFP4 blocks and scales; counted as
/// num_parameters().
void gpt_oss(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.head_dim = in.positive_or("head_dim", 64);
    m.experts = in.positive("num_local_experts");
    m.experts_per_token = in.positive(spelled(in, {"num_experts_per_tok", "experts_per_token"}));
    m.bias = in.flag_or("attention_bias", true) ? Bias::all : Bias::none;
    if (m.bias == Bias::none)
        in.fail(
            "attention_bias false: gpt-oss's experts keep their biases; not a layout memcalc "
            "models");
    m.activation = Activation::clamped_swiglu;
    m.attention_sinks = true, m.router_bias = RouterBias::trainable, m.rmsnorm_fp32_scale = true;
    m.softmax_fp32 = false;
    m.stacked_experts = true;  // GptOssExperts' training loop indexes gate_up_proj[expert_idx]
    read_windows(in, m,
                 [](std::uint64_t i) { return i % 2 == 0; });  // GptOssConfig: sliding, full, ...
}

/// DeepSeek-V2 and V3 (modeling_deepseek_v2.py, modeling_deepseek_v3.py): LLaMA's keys, latent
/// attention, the first first_k_dense_replace layers dense (intermediate_size), the rest
/// mixture-of-experts layers of n_routed_experts experts of moe_intermediate_size beside
/// n_shared_experts shared ones (one MLP n_shared_experts times as wide). V3's router registers
/// e_score_correction_bias as a buffer; its routed_scaling_factor and topk_method (group-limited,
/// bias-corrected choice) hold no parameters. head_dim, where a saved config carries it, is the
/// rotary width (transformers sets it to qk_rope_head_dim): the q/k width comes from the parts.
void deepseek(const JsonReader& in, Architecture& m, bool v3) {
    llama_like(in, m, false);
    m.head_dim = 0;
    m.bias = in.flag_or("attention_bias", false) ? Bias::attention : Bias::none;
    m.mla = {in.positive_or("q_lora_rank", 0), in.positive("kv_lora_rank"),
             in.positive("qk_nope_head_dim"), in.positive("qk_rope_head_dim"),
             in.positive("v_head_dim")};
    if (in.positive_or("moe_layer_freq", 1) != 1)
        in.fail("moe_layer_freq " + std::to_string(in.positive("moe_layer_freq")) +
                " (experts in every n-th layer) is not modelled: memcalc reads DeepSeek's 1");
    if (!in.has("n_routed_experts")) return;  // a dense model
    const std::uint64_t dense_layers =
        std::min(in.count_if_given("first_k_dense_replace").value_or(0), m.layers);
    const std::uint64_t dense_ffn = m.ffn;
    m.ffn = in.positive("moe_intermediate_size");
    m.experts = in.positive("n_routed_experts");
    m.experts_per_token = in.positive("num_experts_per_tok");
    m.shared_ffn = in.count_if_given("n_shared_experts").value_or(0) * m.ffn;
    m.router_bias = v3 ? RouterBias::buffer : RouterBias::none;
    m.router_input_fp32 = v3;  // DeepseekV3TopkRouter: F.linear(x.float(), weight.float())
    m.renormalize_topk =
        in.flag_or("norm_topk_prob", v3);  // the configs' defaults: V2 false, V3 true
    if (dense_layers == 0) return;
    m.layer_kinds = {{"dense", dense_ffn, std::uint64_t{0}, std::nullopt},
                     {"moe", std::nullopt, std::nullopt, std::nullopt}};
    m.layer_pattern = {{0, dense_layers}};
    if (dense_layers < m.layers) m.layer_pattern.push_back({1, m.layers - dense_layers});
}

/// DeepSeek-V3.2 (modeling_deepseek_v32.py): V3's keys and its lightning indexer's,
/// index_n_heads, index_head_dim and index_topk (DeepseekV32Config's defaults 64, 128, 2048).
void deepseek_v32(const JsonReader& in, Architecture& m) {
    deepseek(in, m, true);
    m.mla.index_heads = in.positive_or("index_n_heads", 64);
    m.mla.index_head_dim = in.positive_or("index_head_dim", 128);
    m.mla.index_topk = in.positive_or("index_topk", 2048);
}

/// GLM-4.5 (modeling_glm4_moe.py): LLaMA's keys with head_dim; q, k and v biased when
/// attention_bias (o_proj never); with use_qk_norm, q_norm and k_norm of head_dim that the heads
/// share; the first first_k_dense_replace layers dense (intermediate_size), the rest
/// n_routed_experts experts of moe_intermediate_size beside n_shared_experts shared ones (one MLP
/// that many times as wide) and a router whose e_score_correction_bias is a buffer, as
/// DeepSeek-V3's. partial_rotary_factor turns part of each head and holds no parameters; memcalc
/// counts rotary's tensors at the full head width (a partial rotation's are not measured).
void glm4_moe(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.bias = in.flag_or("attention_bias", false) ? Bias::qkv : Bias::none;
    m.qk_norm = in.flag_or("use_qk_norm", false) ? QkNorm::per_head : QkNorm::none;
    const std::uint64_t dense_ffn = m.ffn;
    m.ffn = in.positive("moe_intermediate_size");
    m.experts = in.positive("n_routed_experts");
    m.experts_per_token = in.positive("num_experts_per_tok");
    m.shared_ffn = in.count_if_given("n_shared_experts").value_or(1) * m.ffn;
    m.router_bias = RouterBias::buffer;
    m.router_input_fp32 = true;  // DeepSeek-V3's router, which Glm4MoeTopkRouter inherits
    m.renormalize_topk = in.flag_or("norm_topk_prob", true);
    // Glm4MoeConfig's default: one dense layer first.
    const std::uint64_t dense_layers = in.count_if_given("first_k_dense_replace").value_or(1);
    dense_and_moe_layers(m, dense_ffn, [&](std::uint64_t i) { return i >= dense_layers; });
}

/// MiniMax-M2 (modeling_minimax_m2.py): LLaMA's keys with head_dim, no biases; q_norm and k_norm
/// over the whole projections, cast back before the weight as the layer norms are; in every layer
/// num_local_experts experts of intermediate_size, the top num_experts_per_tok of a sigmoid chosen
/// with an e_score_correction_bias buffer and renormalised. transformers' model builds the q/k
/// norms and no shared expert whatever use_qk_norm, qk_norm_type and shared_intermediate_size say
/// (MiniMax's configs: true, "per_layer", 0), nor use_mtp's modules; rotary_dim turns part of each
/// head (no parameters).
void minimax_m2(const JsonReader& in, Architecture& m) {
    mixtral(in, m);
    m.head_dim = in.positive_or("head_dim", 128);  // MiniMaxM2Config's default
    m.qk_norm = QkNorm::whole;
    m.router_bias = RouterBias::buffer;
    m.input_jitter = in.probability_or("router_jitter_noise", 0);
}

/// Jamba (modeling_jamba.py): LLaMA's keys without rotary (its attention has no position encoding);
/// attention in layers i % attn_layer_period == attn_layer_offset, a Mamba-1 mixer in the others;
/// num_experts experts in layers i % expert_layer_period == expert_layer_offset (a router without
/// bias, top-k of an fp32 softmax, not renormalised), a dense MLP of intermediate_size elsewhere.
/// The mixer: d_inner = mamba_expand x hidden, dt_rank ceil(hidden / 16) when "auto", RMSNorms on
/// dt, B and C.
void jamba(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.position = Position::none;
    m.head_dim = 0;  // JambaAttention: hidden / heads
    const std::uint64_t experts = in.positive_or("num_experts", 16);
    m.experts_per_token = experts > 1 ? in.positive_or("num_experts_per_tok", 2) : 0;
    m.renormalize_topk = false;
    m.ssm.d_inner = in.positive_or("mamba_expand", 2) * m.hidden;
    m.ssm.d_state = in.positive_or("mamba_d_state", 16);
    m.ssm.d_conv = in.positive_or("mamba_d_conv", 4);
    const bool auto_rank = in.is_text("mamba_dt_rank") && in.text_or("mamba_dt_rank", "") == "auto";
    if (in.is_text("mamba_dt_rank") && !auto_rank)
        in.fail("mamba_dt_rank must be a positive integer or \"auto\"");
    m.ssm.dt_rank =
        !in.has("mamba_dt_rank") || auto_rank ? (m.hidden + 15) / 16 : in.positive("mamba_dt_rank");
    m.ssm.conv_bias = in.flag_or("mamba_conv_bias", true);
    m.ssm.proj_bias = in.flag_or("mamba_proj_bias", false);
    m.ssm.inner_norms = true;
    m.ssm.kernels = in.flag_or("use_mamba_kernels", true);
    if (m.layers > max_layers) return;  // validate() names it
    const std::uint64_t attn_period = in.positive_or("attn_layer_period", 8),
                        attn_offset = in.count_if_given("attn_layer_offset").value_or(4);
    const std::uint64_t moe_period = in.positive_or("expert_layer_period", 2),
                        moe_offset = in.count_if_given("expert_layer_offset").value_or(1);
    // Each layer's (mixer, routed) pair is a kind, first seen first.
    std::vector<std::pair<Mixer, bool>> kinds;
    std::vector<LayerRun> runs;
    for (std::uint64_t i = 0; i < m.layers; ++i) {
        const std::pair<Mixer, bool> layer{
            i % attn_period == attn_offset ? Mixer::attention : Mixer::mamba,
            experts > 1 && i % moe_period == moe_offset};
        auto it = std::find(kinds.begin(), kinds.end(), layer);
        if (it == kinds.end()) it = kinds.insert(kinds.end(), layer);
        const std::size_t kind = static_cast<std::size_t>(it - kinds.begin());
        if (!runs.empty() && runs.back().kind == kind)
            ++runs.back().count;
        else
            runs.push_back({kind, 1});
    }
    m.experts = experts > 1 ? experts : 0;
    if (kinds.size() == 1) {  // every layer alike
        m.mixer = kinds[0].first;
        if (!kinds[0].second) m.experts = 0, m.experts_per_token = 0;
        return;
    }
    for (const auto& [mixer, routed] : kinds) {
        LayerKind k{std::string(mixer_name(mixer)) + (routed ? "+moe" : "+mlp"), std::nullopt,
                    routed ? std::nullopt : std::optional<std::uint64_t>(0), std::nullopt};
        k.mixer = mixer;
        m.layer_kinds.push_back(k);
    }
    m.layer_pattern = std::move(runs);
}

/// Layers that differ in their mixer alone, first layer first: one kind a mixer, first seen first
/// (every layer alike: the model's own mixer).
void mixer_kinds(Architecture& m, const std::vector<Mixer>& per_layer) {
    std::vector<Mixer> kinds;
    std::vector<LayerRun> runs;
    for (const Mixer mixer : per_layer) {
        auto it = std::find(kinds.begin(), kinds.end(), mixer);
        if (it == kinds.end()) it = kinds.insert(kinds.end(), mixer);
        const std::size_t kind = static_cast<std::size_t>(it - kinds.begin());
        if (!runs.empty() && runs.back().kind == kind)
            ++runs.back().count;
        else
            runs.push_back({kind, 1});
    }
    if (kinds.size() == 1) {
        m.mixer = kinds[0];
        return;
    }
    for (const Mixer mixer : kinds) {
        m.layer_kinds.push_back({mixer_name(mixer), {}, {}, {}});
        m.layer_kinds.back().mixer = mixer;
    }
    m.layer_pattern = std::move(runs);
}

/// mllama's language model (MllamaTextModel): LLaMA's layers, a cross-attention layer at each
/// cross_attention_layers index, a token embedding of vocab_size + 8 rows (the image token's
/// among them; lm_head predicts vocab_size).
void mllama_text(const JsonReader& in, Architecture& m) {
    llama_like(in, m, false);
    m.embedding_rows = m.vocab + 8;
    if (m.layers > max_layers) return;  // validate() names it
    std::vector<Mixer> per_layer(m.layers, Mixer::attention);
    for (const std::uint64_t i : in.counts_or_empty("cross_attention_layers")) {
        if (i >= m.layers)
            in.fail("cross_attention_layers entry " + std::to_string(i) +
                    " is past num_hidden_layers (" + std::to_string(m.layers) + ")");
        per_layer[i] = Mixer::cross_attention;
    }
    mixer_kinds(m, per_layer);
}

/// Each layer's mixer from transformers' layer_types, where the config has it: a row of `names`
/// per entry (the first two names say what is taken), else `per_layer` as it is.
void layer_type_mixers(const JsonReader& in, const Architecture& m,
                       const std::vector<std::pair<std::string, Mixer>>& names,
                       std::vector<Mixer>& per_layer) {
    const auto types = in.texts_if_given("layer_types");
    if (!types) return;
    if (types->size() != m.layers)
        in.fail("layer_types has " + std::to_string(types->size()) +
                " entries; num_hidden_layers is " + std::to_string(m.layers));
    for (std::size_t i = 0; i < types->size(); ++i) {
        const auto row = std::find_if(names.begin(), names.end(),
                                      [&](const auto& n) { return n.first == (*types)[i]; });
        if (row == names.end())
            in.fail("layer_types entry '" + (*types)[i] + "' is not " + names[0].first + " or " +
                    names[1].first);
        per_layer[i] = row->second;
    }
}

/// A Mamba-2 mixer's keys as Granite 4.0 H and Falcon-H1 spell them, its inner width `d_inner`
/// (`named`: where that comes from).
void mamba2_widths(const JsonReader& in, Architecture& m, std::uint64_t d_inner,
                   const std::string& named) {
    StateSpace& x = m.ssm;
    x.d_inner = d_inner;
    x.heads = in.positive_or("mamba_n_heads", 128);
    if (x.d_inner % x.heads != 0)
        in.fail("mamba_n_heads (" + std::to_string(x.heads) + ") must divide " + named + " (" +
                std::to_string(x.d_inner) + ")");
    const bool auto_head = in.is_text("mamba_d_head") && in.text_or("mamba_d_head", "") == "auto";
    if (in.is_text("mamba_d_head") && !auto_head)
        in.fail("mamba_d_head must be a positive integer or \"auto\"");
    const std::uint64_t head =
        !in.has("mamba_d_head") || auto_head ? x.d_inner / x.heads : in.positive("mamba_d_head");
    if (head * x.heads != x.d_inner)
        in.fail("mamba_d_head (" + std::to_string(head) + ") x mamba_n_heads (" +
                std::to_string(x.heads) + ") must be " + named + " (" + std::to_string(x.d_inner) +
                ")");
    x.groups = in.positive_or("mamba_n_groups", 1);
    x.d_state = in.positive_or("mamba_d_state", 256);
    x.d_conv = in.positive_or("mamba_d_conv", 4);
    x.chunk = in.positive_or("mamba_chunk_size", 256);
    x.conv_bias = in.flag_or("mamba_conv_bias", true);
    x.proj_bias = in.flag_or("mamba_proj_bias", false);
    x.dt_rank = 0, x.inner_norms = false, x.kernels = true;
}

/// Granite 4.0 H's Mamba-2 mixer (GraniteMoeHybridConfig, GraniteMoeHybridMambaLayer): d_inner =
/// mamba_expand x hidden, split into mamba_n_heads heads of mamba_d_head ("auto": d_inner / heads);
/// B and C in mamba_n_groups groups of mamba_d_state; the scan in chunks of mamba_chunk_size. Only
/// mamba_ssm's kernels are modelled (transformers runs them when mamba_ssm and causal_conv1d are
/// installed and the model is on a GPU).
void granite_mamba2(const JsonReader& in, Architecture& m) {
    mamba2_widths(in, m, in.positive_or("mamba_expand", 2) * m.hidden,
                  "mamba_expand x hidden_size");
}

/// Granite 4.0 H (modeling_granitemoehybrid.py): RMSNorms before the mixer and the MLP; the mixer
/// per layer_types entry ("mamba": Mamba-2, "attention": GQA with attention_bias on q, k, v and
/// o; default every layer Mamba-2), rotary only where position_embedding_type is "rope"; after
/// it num_local_experts experts of intermediate_size (a bias-free router, a softmax over the top
/// num_experts_per_tok logits in fp32) beside a shared gated MLP of shared_intermediate_size, or
/// that shared MLP alone when num_local_experts is 0. embedding_multiplier, attention_multiplier,
/// residual_multiplier and logits_scaling scale activations and hold no parameters.
void granitemoehybrid(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.kv_heads = in.positive_or("num_key_value_heads", 0);
    m.head_dim = in.positive_or("head_dim", 0);
    m.vocab = in.positive_or("vocab_size", 32000);
    m.max_positions = in.positive_or("max_position_embeddings", 2048);
    m.mlp = Mlp::gated, m.norm = Norm::rmsnorm;
    m.activation = activation_named(in, "hidden_act", in.text_or("hidden_act", "silu"));
    m.tied_embeddings = in.flag_or("tie_word_embeddings", false);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.bias = in.flag_or("attention_bias", false) ? Bias::attention : Bias::none;
    const std::string position = in.text_or("position_embedding_type", "nope");
    if (position != "rope" && position != "nope")
        in.fail("position_embedding_type '" + position +
                "' is not one memcalc models (rope, nope)");
    m.position = position == "rope" ? Position::rotary : Position::none;
    const std::uint64_t experts = in.count_if_given("num_local_experts").value_or(8);
    const std::uint64_t shared = in.positive_or("shared_intermediate_size", 1024);
    if (experts > 0) {
        m.experts = experts, m.experts_per_token = in.positive_or("num_experts_per_tok", 2);
        m.ffn = in.positive_or("intermediate_size", 11008), m.shared_ffn = shared;
        m.renormalize_topk = true;  // the softmax over the top-k logits alone
    } else {
        m.ffn = shared;  // the shared MLP is the layer's whole MLP
    }
    granite_mamba2(in, m);
    if (m.layers > max_layers) return;  // validate() names it
    std::vector<Mixer> per_layer(m.layers, Mixer::mamba2);
    layer_type_mixers(in, m, {{"mamba", Mixer::mamba2}, {"attention", Mixer::attention}},
                      per_layer);
    mixer_kinds(m, per_layer);
}

/// Falcon-H1 (modeling_falcon_h1.py, FalconH1DecoderLayer): LLaMA's keys with head_dim given, its
/// default vocabulary 128000 and untied head; in every layer attention and a Mamba-2 mixer side by
/// side on one RMSNorm's output (Mixer::attention_mamba2), then a gated MLP. The mixer is
/// mamba_d_ssm wide (null: mamba_expand x hidden_size), its gated RMSNorm where mamba_rms_norm;
/// in_proj's bias is mamba_proj_bias, out_proj's projectors_bias. The multipliers scale
/// activations (each a copy) and the mup_vector buffer, and hold no parameters.
void falcon_h1(const JsonReader& in, Architecture& m) {
    llama(in, m);
    m.mixer = Mixer::attention_mamba2;
    const std::uint64_t d_ssm =
        in.positive_or("mamba_d_ssm", in.positive_or("mamba_expand", 2) * m.hidden);
    mamba2_widths(in, m, d_ssm, "mamba_d_ssm");
    m.ssm.gated_norm = in.flag_or("mamba_rms_norm", false);
    if (in.flag_or("projectors_bias", false) != m.ssm.proj_bias)
        in.fail(
            "projectors_bias differs from mamba_proj_bias: memcalc models out_proj's and "
            "in_proj's biases together");
}

/// Qwen3-Next's Gated DeltaNet in StateSpace's names (Qwen3NextGatedDeltaNet): v's
/// linear_num_value_heads heads of linear_value_head_dim are d_inner, q's and k's
/// linear_num_key_heads heads of linear_key_head_dim the groups of d_state; a bias-free depthwise
/// convolution of linear_conv_kernel_dim taps; fla's chunk of 64 tokens.
void gated_deltanet_widths(const JsonReader& in, Architecture& m) {
    StateSpace& x = m.ssm;
    x.heads = in.positive_or("linear_num_value_heads", 32);
    x.groups = in.positive_or("linear_num_key_heads", 16);
    if (x.heads % x.groups != 0)
        in.fail("linear_num_key_heads (" + std::to_string(x.groups) +
                ") must divide linear_num_value_heads (" + std::to_string(x.heads) + ")");
    x.d_inner = x.heads * in.positive_or("linear_value_head_dim", 128);
    x.d_state = in.positive_or("linear_key_head_dim", 128);
    x.d_conv = in.positive_or("linear_conv_kernel_dim", 4);
    x.chunk = 64;  // chunk_gated_delta_rule's fixed chunk
    x.dt_rank = 0, x.conv_bias = false, x.proj_bias = false, x.inner_norms = false;
    x.kernels = true;
}

/// Qwen3-Next's mixers: gated full attention with q/k norms per head where layer_types (or
/// full_attention_interval) says, a Gated DeltaNet elsewhere.
void hybrid_linear_attention(const JsonReader& in, Architecture& m) {
    m.qk_norm = QkNorm::per_head, m.attention_output_gate = true;
    gated_deltanet_widths(in, m);
    if (m.layers > max_layers) return;  // validate() names it
    const std::uint64_t interval = in.positive_or("full_attention_interval", 4);
    std::vector<Mixer> per_layer;
    for (std::uint64_t i = 0; i < m.layers; ++i)
        per_layer.push_back((i + 1) % interval == 0 ? Mixer::attention : Mixer::gated_deltanet);
    layer_type_mixers(
        in, m, {{"linear_attention", Mixer::gated_deltanet}, {"full_attention", Mixer::attention}},
        per_layer);
    mixer_kinds(m, per_layer);
}

/// Qwen3-Next's layers past LLaMA's keys: every one MoE with a gated shared expert, mixers as
/// hybrid_linear_attention reads them.
void qwen3_next_layers(const JsonReader& in, Architecture& m) {
    m.shared_ffn = in.positive("shared_expert_intermediate_size");
    m.shared_expert_gate = true;
    qwen_moe_layers(in, m);
    if (!m.layer_kinds.empty())
        in.fail(
            "decoder_sparse_step or mlp_only_layers with dense layers beside linear attention "
            "is not modelled (every layer MoE is)");
    hybrid_linear_attention(in, m);
}

/// Qwen3-Next (modeling_qwen3_next.py): Qwen3's keys; full attention (gated: q_proj twice as wide,
/// q_norm and k_norm per head; partial_rotary_factor turns part of each head, no parameters) in
/// the layers layer_types names "full_attention", else every full_attention_interval-th, a Gated
/// DeltaNet in the others; every layer MoE with a gated shared expert, as Qwen2-MoE's. Its
/// zero-centred RMSNorms (weight + 1) hold as many parameters. The checkpoint's mtp.* module is
/// not in transformers' model: the import leaves it out (mtp_layers 0) and says its size.
void qwen3_next(const JsonReader& in, Architecture& m) {
    llama(in, m);
    qwen3_next_layers(in, m);
}

/// Qwen3.5-MoE's language model (modeling_qwen3_5_moe.py, qwen3_5_moe_text): Qwen3-Next's layers;
/// its config may leave intermediate_size out, as every layer routes.
void qwen3_5_moe_text(const JsonReader& in, Architecture& m) {
    llama_with_ffn(in, m, spelled(in, {"intermediate_size", "moe_intermediate_size"}));
    qwen3_next_layers(in, m);
}

/// Qwen3.5's language model (modeling_qwen3_5.py, qwen3_5_text): Qwen3-Next's layers with a
/// dense gated MLP of intermediate_size in each; its checkpoint's mtp.* module, as Qwen3-Next's.
void qwen3_5_text(const JsonReader& in, Architecture& m) {
    llama(in, m);
    hybrid_linear_attention(in, m);
}

/// Nemotron-H's layers, one block each, as hybrid_override_pattern spells them a character a layer
/// (modeling_nemotron_h.py, NemotronHBlock): a kind per character, first seen first. An MLP layer
/// of a model with experts is dense: its own width, no experts.
void nemotron_blocks(const JsonReader& in, Architecture& m, const std::string& pattern,
                     std::uint64_t dense_ffn) {
    struct Block {
        char symbol;
        const char* name;
        Mixer mixer;
        bool has_mlp;
    };
    static constexpr Block blocks[] = {{'M', "mamba2", Mixer::mamba2, false},
                                       {'*', "attention", Mixer::attention, false},
                                       {'-', "mlp", Mixer::none, true},
                                       {'E', "moe", Mixer::none, true}};
    std::string seen;  // the kinds' symbols, first seen first
    std::vector<LayerRun> runs;
    for (const char c : pattern) {
        const auto* block = std::find_if(std::begin(blocks), std::end(blocks),
                                         [&](const Block& b) { return b.symbol == c; });
        if (block == std::end(blocks))
            in.fail("hybrid_override_pattern has '" + std::string(1, c) +
                    "'; memcalc reads M (Mamba-2), * (attention), - (MLP) and E (experts)");
        if (seen.find(c) == std::string::npos) seen += c;
        const std::size_t kind = seen.find(c);
        if (!runs.empty() && runs.back().kind == kind)
            ++runs.back().count;
        else
            runs.push_back({kind, 1});
    }
    if (seen.size() > max_layer_kinds)
        in.fail("hybrid_override_pattern has " + std::to_string(seen.size()) +
                " kinds of layer; memcalc holds at most " + std::to_string(max_layer_kinds));
    for (const char c : seen) {
        const Block& b = *std::find_if(std::begin(blocks), std::end(blocks),
                                       [&](const Block& x) { return x.symbol == c; });
        LayerKind kind{b.name, {}, {}, {}};
        kind.mixer = b.mixer, kind.has_mlp = b.has_mlp;
        if (c == '-' && m.experts > 0) kind.ffn = dense_ffn, kind.experts = 0;
        m.layer_kinds.push_back(kind);
    }
    m.layer_pattern = std::move(runs);
}

/// Nemotron 3's MoE layers (NemotronHMoE, DeepSeek-V3's block): n_routed_experts plain MLPs of
/// moe_intermediate_size (up, mlp_hidden_act, down; stacked tensors indexed by view), the top
/// num_experts_per_tok of a sigmoid router on an fp32 copy of its input with an
/// e_score_correction_bias buffer, renormalised by norm_topk_prob, beside n_shared_experts plain
/// MLPs of moe_shared_expert_intermediate_size. Returns the dense MLP layers' width.
std::uint64_t nemotron_experts(const JsonReader& in, Architecture& m) {
    const std::uint64_t dense_ffn = m.ffn;
    if (in.has("moe_latent_size"))
        in.fail(
            "moe_latent_size (a latent MoE: Nemotron 3 Super's projections around the "
            "experts) is not modelled");
    m.ffn = in.positive("moe_intermediate_size");
    m.experts = in.positive("n_routed_experts");
    m.experts_per_token = in.positive("num_experts_per_tok");
    m.shared_ffn = in.count_if_given("n_shared_experts").value_or(1) *
                   in.positive("moe_shared_expert_intermediate_size");
    m.router_bias = RouterBias::buffer;
    m.router_input_fp32 = true;  // DeepseekV3TopkRouter: F.linear(x.float(), weight.float())
    m.renormalize_topk = in.flag_or("norm_topk_prob", true);
    return dense_ffn;
}

/// Nemotron-H's Mamba-2 mixer (NemotronHMamba2Mixer): d_inner = mamba_num_heads x mamba_head_dim
/// (not expand x hidden), B and C in n_groups groups of ssm_state_size, conv_kernel taps; use_bias
/// on in_proj and out_proj.
void nemotron_mamba2(const JsonReader& in, Architecture& m) {
    StateSpace& x = m.ssm;
    x.heads = in.positive_or("mamba_num_heads", 128);
    x.d_inner = x.heads * in.positive_or("mamba_head_dim", 64);
    x.groups = in.positive_or("n_groups", 8);
    x.d_state = in.positive_or("ssm_state_size", 128);
    x.d_conv = in.positive_or("conv_kernel", 4);
    x.chunk = in.positive_or("chunk_size", 128);
    x.conv_bias = in.flag_or("use_conv_bias", true);
    x.proj_bias = in.flag_or("use_bias", false);
    x.kernels = in.flag_or("use_mamba_kernels", true);
    x.dt_rank = 0, x.inner_norms = false;
}

/// Nemotron-H (modeling_nemotron_h.py): each layer an RMSNorm and one block, per
/// hybrid_override_pattern: a Mamba-2 mixer, GQA attention without position encoding
/// (attention_bias on q, k, v and o), a plain MLP of intermediate_size (up, then mlp_hidden_act,
/// relu2 by default, then down; mlp_bias) or experts (Nemotron 3: nemotron_experts); a final norm,
/// an untied head by default.
void nemotron_h(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("hidden_size");
    m.layers = in.positive("num_hidden_layers");
    m.heads = in.positive("num_attention_heads");
    m.kv_heads = in.positive_or("num_key_value_heads", 0);
    m.head_dim =
        in.has("head_dim") ? in.positive("head_dim") : in.positive_or("attention_head_dim", 0);
    m.vocab = in.positive_or("vocab_size", 131072);
    m.max_positions = in.positive_or("max_position_embeddings", 4096);
    m.ffn = in.positive_or("intermediate_size", 21504);
    m.mlp = Mlp::plain, m.norm = Norm::rmsnorm, m.position = Position::none;
    m.activation = activation_named(in, "mlp_hidden_act", in.text_or("mlp_hidden_act", "relu2"));
    m.bias = in.flag_or("attention_bias", false) ? Bias::attention : Bias::none;
    if (in.flag_or("mlp_bias", false))
        in.fail("mlp_bias true (biases on the MLP's projections alone) is not modelled");
    m.tied_embeddings = in.flag_or("tie_word_embeddings", false);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    nemotron_mamba2(in, m);
    if (!in.is_text("hybrid_override_pattern"))
        in.fail("missing key 'hybrid_override_pattern' (a string: M, *, - or E a layer)");
    const std::string pattern = in.text_or("hybrid_override_pattern", "");
    if (pattern.size() != m.layers)
        in.fail("hybrid_override_pattern has " + std::to_string(pattern.size()) +
                " layers; num_hidden_layers is " + std::to_string(m.layers));
    const std::uint64_t dense_ffn =
        pattern.find('E') != std::string::npos ? nemotron_experts(in, m) : m.ffn;
    nemotron_blocks(in, m, pattern, dense_ffn);
}

void phi3(const JsonReader& in, Architecture& m) {
    llama_like(in, m,
               false);  // fused qkv_proj and gate_up_proj hold the same parameters as separate ones
    m.hidden_dropout = in.probability_or("resid_pdrop", 0);
    // Phi3MLP's gate_up_proj is one nn.Linear, chunked in two. Its qkv_proj is one too, but its k
    // is rotated into a tensor of its own, where fused_qkv's k/v cache is GPT-2's views: left to
    // --fused-qkv.
    m.fused_gate_up = true;
}

void gpt2(const JsonReader& in, Architecture& m) {
    m.hidden = in.positive("n_embd");
    m.layers = in.positive("n_layer");
    m.heads = in.positive("n_head");
    m.ffn = in.positive_or("n_inner", 4 * m.hidden);  // null means 4 h
    m.vocab = in.positive("vocab_size");
    m.max_positions = in.positive("n_positions");
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all,
    m.position = Position::learned;
    m.activation =
        activation_named(in, "activation_function", in.text_or("activation_function", "gelu_new"));
    m.tied_embeddings = in.flag_or("tie_word_embeddings", true);
    m.attention_dropout = in.probability_or("attn_pdrop", 0);
    m.hidden_dropout = in.probability_or("resid_pdrop", 0);
    m.softmax_fp32 = false;          // its eager attention takes the softmax in the compute dtype
    m.attention_output_held = true;  // GPT2Block's attn_output
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
        in.fail("word_embed_proj_dim (" + std::to_string(projection) +
                ") differs from hidden_size (" + std::to_string(m.hidden) +
                "): OPT-350m's project_in/project_out layers are not modelled");
    if (!in.flag_or("do_layer_norm_before", true))
        in.fail("do_layer_norm_before false (post-norm OPT) is not modelled");
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.position = Position::learned;
    m.bias = in.flag_or("enable_bias", true) ? Bias::all : Bias::none;
    m.activation =
        activation_named(in, "activation_function", in.text_or("activation_function", "relu"));
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
    if (!m.parallel_attention)
        m.norms_per_layer = 2,
        m.attention_output_held = true;  // FalconDecoderLayer's attention_output
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
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all,
    m.activation = Activation::gelu_tanh;
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
    m.mlp = Mlp::plain, m.norm = Norm::layernorm,
    m.position = Position::rotary;  // rotary_pct: no parameters
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
    if (in.flag_or("qk_layernorm", false))
        in.fail("qk_layernorm true (LayerNorms on q and k) is not modelled");
    // One LayerNorm feeds attention and MLP in parallel; every linear has a bias, the head too.
    m.mlp = Mlp::plain, m.norm = Norm::layernorm, m.bias = Bias::all, m.position = Position::rotary;
    m.parallel_attention = true, m.norms_per_layer = 1, m.head_bias = true;
    m.activation = activation_named(in, "hidden_act", in.text_or("hidden_act", "gelu_new"));
    m.tied_embeddings = in.flag_or("tie_word_embeddings", false);
    m.attention_dropout = in.probability_or("attention_dropout", 0);
    m.hidden_dropout = in.probability_or("resid_pdrop", 0);
}

/// The keys Qwen's vision configs share (Qwen2_5_VLVisionConfig, Qwen3VLVisionConfig).
void qwen_vision(const JsonReader& in, VisionTower& v) {
    v.depth = in.positive("depth");
    v.hidden = in.positive("hidden_size");
    v.heads = in.positive("num_heads");
    v.ffn = in.positive("intermediate_size");
    v.patch = in.positive("patch_size");
    v.temporal_patch = in.positive_or("temporal_patch_size", 2);
    v.merge = in.positive("spatial_merge_size");
    v.out_hidden = in.positive("out_hidden_size");
    v.rotary = true;  // VisionRotaryEmbedding: 2-D rotary over each block's q and k
}

/// Qwen2.5-VL's tower (modeling_qwen2_5_vl.py): a bias-free Conv3d patch embedding, RMSNorms, a
/// biased gated MLP, the merger's ln_q an RMSNorm; no position table (2-D rotary).
void qwen2_5_vl_vision(const JsonReader&, const JsonReader& in, Architecture& m) {
    VisionTower& v = m.vision;
    qwen_vision(in, v);
    v.channels = in.positive_or("in_channels", in.positive_or("in_chans", 3));
    v.gated_mlp = true;
}

/// Qwen3-VL's tower (modeling_qwen3_vl.py): a biased Conv3d, a learned position table of
/// num_position_embeddings, LayerNorms, fc1 and fc2, and a deepstack merger per
/// deepstack_visual_indexes entry (Qwen3VLVisionConfig's default: three).
void qwen3_vl_vision(const JsonReader&, const JsonReader& in, Architecture& m) {
    VisionTower& v = m.vision;
    qwen_vision(in, v);
    v.channels = in.positive_or("in_channels", 3);
    v.position_rows = in.positive_or("num_position_embeddings", 2304);
    v.deepstack = in.has("deepstack_visual_indexes")
                      ? in.counts_or_empty("deepstack_visual_indexes").size()
                      : 3;
    v.layernorm = true, v.patch_bias = true;
}

/// Gemma 3's tower and projector (modeling_gemma3.py, Gemma3MultiModalProjector; SigLIP's
/// SiglipVisionModel): every image resized to image_size, patch_size patches through a biased
/// convolution and a learned position table, LayerNorms, q, k and v apart (biased), fc1 and fc2
/// (gelu_pytorch_tanh), a post-LayerNorm; then the projector pools the patches to
/// mm_tokens_per_image tokens (an average of merge x merge), RMSNorms them and projects them,
/// bias-free, to the language model's width.
void gemma3_vision(const JsonReader& top, const JsonReader& in, Architecture& m) {
    VisionTower& v = m.vision;
    v.depth = in.positive("num_hidden_layers");
    v.hidden = in.positive("hidden_size");
    v.heads = in.positive("num_attention_heads");
    v.ffn = in.positive("intermediate_size");
    v.patch = in.positive("patch_size");
    v.image_size = in.positive("image_size");
    v.channels = in.positive_or("num_channels", 3);
    if (in.flag_or("vision_use_head", true))
        in.fail("vision_use_head true (SigLIP's attention-pooling head) is not modelled");
    const std::uint64_t side = v.image_size / v.patch,
                        tokens = top.positive_or("mm_tokens_per_image", 256);
    const auto per_side = static_cast<std::uint64_t>(std::llround(std::sqrt(double(tokens))));
    if (per_side * per_side != tokens || side == 0 || side % per_side != 0)
        top.fail("mm_tokens_per_image " + std::to_string(tokens) +
                 " must be the square of a divisor of image_size / patch_size (" +
                 std::to_string(side) + ")");
    v.merge = side / per_side;
    v.position_rows = side * side;
    v.out_hidden = m.hidden;
    v.layernorm = true, v.patch_bias = true, v.fused_qkv = false, v.pooled_projector = true;
}

/// mllama's tiled tower (modeling_mllama.py's MllamaVisionModel, v4.53.0; MllamaVisionConfig's
/// defaults where a key is absent): tiles of image_size, a bias-free patch convolution, LayerNorms,
/// q, k, v and o without biases, fc1 and fc2 biased; the projector reads the last block's output
/// beside one per intermediate_layers_indices entry (vision_output_dim wide).
void mllama_vision(const JsonReader&, const JsonReader& in, Architecture& m) {
    VisionTower& v = m.vision;
    v.depth = in.positive_or("num_hidden_layers", 32);
    v.global_depth = in.count_if_given("num_global_layers").value_or(8);
    v.hidden = in.positive_or("hidden_size", 1280);
    v.heads = in.positive_or(spelled(in, {"attention_heads", "num_attention_heads"}), 16);
    v.ffn = in.positive_or("intermediate_size", 5120);
    v.patch = in.positive_or("patch_size", 14);
    v.image_size = in.positive_or("image_size", 448);
    v.channels = in.positive_or("num_channels", 3);
    v.tiles = in.positive_or("max_num_tiles", 4);
    v.aspect_ratios = in.entries_or("supported_aspect_ratios", 8);
    v.intermediate_layers = in.has("intermediate_layers_indices")
                                ? in.counts_or_empty("intermediate_layers_indices").size()
                                : 5;
    const std::uint64_t output = (1 + v.intermediate_layers) * v.hidden;
    if (in.positive_or("vision_output_dim", output) != output)
        in.fail("vision_output_dim must be hidden_size x (1 + intermediate_layers_indices' " +
                std::to_string(v.intermediate_layers) + ") = " + std::to_string(output));
    v.out_hidden = m.hidden;
    v.layernorm = true, v.fused_qkv = false, v.attention_bias = false;
}

using Reader = std::function<void(const JsonReader&, Architecture&)>;
/// Reads a tower into the architecture from the config's top level and its vision_config.
using VisionReader = void (*)(const JsonReader&, const JsonReader&, Architecture&);

/// A vision-language model_type (its language model's reader is in `families`) and its tower's
/// reader. Their
/// configs nest the language model in text_config, over top-level keys that older files (Qwen2.5-VL
/// as published) keep there.
struct VisionLanguage {
    const char* type;
    VisionReader vision;
};
const VisionLanguage vision_language_types[] = {
    {"qwen2_5_vl", qwen2_5_vl_vision},
    {"qwen3_vl", qwen3_vl_vision},
    {"qwen3_vl_moe", qwen3_vl_vision},
    {"qwen3_5", qwen3_vl_vision},  // Qwen3_5VisionModel: Qwen3-VL's, deepstack_visual_indexes []
    {"qwen3_5_moe", qwen3_vl_vision},
    {"gemma3", gemma3_vision},
    {"mllama", mllama_vision},
};

const VisionLanguage* vision_language(const std::string& type) {
    for (const VisionLanguage& v : vision_language_types)
        if (type == v.type) return &v;
    return nullptr;
}
const std::vector<std::pair<std::string, Reader>> families = {
    {"llama", llama},
    {"mistral", mistral},
    {"mixtral", mixtral},
    {"qwen2", qwen2},
    {"gemma", gemma},
    {"gemma2", gemma2},
    {"phi3", phi3},
    {"gpt2", gpt2},
    {"opt", opt},
    {"falcon", falcon},
    {"bloom", bloom},
    {"gpt_neox", gpt_neox},
    {"phi", phi},
    {"qwen3", qwen3},
    {"gemma3_text", gemma3_text},
    {"gemma3", gemma3_text},  // its text_config; its tower: vision_language_types
    {"qwen2_moe", qwen2_moe},
    {"qwen3_moe", qwen3_moe},
    {"phimoe", phimoe},
    {"llama4_text", llama4_text},
    {"llama4", llama4_text},  // its text_config, as gemma3's
    {"mllama", mllama_text},  // its text_config; its tower: vision_language_types
    {"deepseek_v2", [](const JsonReader& in, Architecture& m) { deepseek(in, m, false); }},
    {"deepseek_v3", [](const JsonReader& in, Architecture& m) { deepseek(in, m, true); }},
    {"deepseek_v32", deepseek_v32},
    {"glm4_moe", glm4_moe},
    {"minimax_m2", minimax_m2},
    {"olmo2", olmo2},
    {"gpt_oss", gpt_oss},
    {"jamba", jamba},
    {"granitemoehybrid", granitemoehybrid},
    {"nemotron_h", nemotron_h},
    {"falcon_h1", falcon_h1},
    {"qwen3_next", qwen3_next},
    {"qwen2_5_vl", qwen2},  // the language model; its tower: vision_language_types
    {"qwen3_vl", qwen3},
    {"qwen3_vl_moe", qwen3_moe},
    {"qwen3_5", qwen3_5_text},
    {"qwen3_5_moe", qwen3_5_moe_text},  // Qwen3NextSparseMoeBlock in every layer
    {"RefinedWebModel", falcon},
    {"RefinedWeb", falcon},  // Falcon's files from before transformers adopted it
};

/// DeepSeek-V3's multi-token-prediction layers (num_nextn_predict_layers): in the checkpoint, not
/// in the causal LM that num_parameters() counts. Each is one more layer of the last kind, enorm
/// and hnorm (h each), eh_proj (2h x h) and shared_head.norm (h); its embedding and head are stored
/// again, copies of the model's. Said in the description, so a check of a checkpoint's total can
/// account for them.
std::string next_token_layers_note(const JsonReader& in, const Architecture& m) {
    if (!in.has("num_nextn_predict_layers")) return "";
    const std::uint64_t n = in.count_if_given("num_nextn_predict_layers").value_or(0);
    if (n == 0) return "";
    Architecture with = m;  // the modules as a training program holds them (mtp_layers)
    with.mtp_layers = 1;
    const Count per_layer(parameter_table(with).total().value() -
                          parameter_table(m).total().value());
    const Count copies = Count(m.vocab) * m.hidden * (m.tied_embeddings ? 1 : 2);
    return "the checkpoint also holds " + std::to_string(n) + " multi-token-prediction layer" +
           (n == 1 ? "" : "s") +
           " (num_nextn_predict_layers) that num_parameters() does not count: " +
           std::to_string((per_layer * n).value()) +
           " parameters (buffers aside), and a copy of the embedding and head each (" +
           std::to_string((copies * n).value()) + ")";
}

/// Qwen3-Next's checkpoint beside transformers' model: its mtp.* module (fc over the embedding's
/// and the hidden states' norms, a full-attention MoE layer, a norm), and its kernels' sources.
std::string qwen3_next_note(const Architecture& m) {
    Architecture with = m;
    with.mtp_layers = 1;  // mtp.layers.0: the last layer's kind, full attention
    const std::uint64_t module =
        parameter_table(with).total().value() - parameter_table(m).total().value();
    return "the checkpoint also holds one multi-token-prediction module (mtp.*) that "
           "transformers' model leaves out: " +
           std::to_string(module) +
           " parameters (--mtp-layers 1 trains it); its Gated DeltaNet layers' saved tensors are "
           "fla's chunk_gated_delta_rule's, causal_conv1d_fn's and FusedRMSNormGated's, read from "
           "their code and not measured; rotary is counted over the whole head "
           "(partial_rotary_factor turns a part)";
}

}  // namespace

std::vector<std::string> supported_model_types() {
    std::vector<std::string> names;
    for (const auto& [name, unused] : families) names.push_back(name);
    return names;
}

namespace {

/// What the user should know of an import of a model_type, whatever its config says: one row each.
struct TypeNote {
    const char* type;
    const char* note;
};
constexpr TypeNote type_notes[] = {
    {"gpt_oss",
     "the checkpoint stores the experts as MXFP4 blocks and scales, counted here as the "
     "parameters they dequantise to"},
    {"nemotron_h",
     "its Mamba-2 layers' saved tensors are mamba_ssm's mamba_split_conv1d_scan_combined's, "
     "read from its code and not measured; each layer holds one block (a Mamba-2 mixer, "
     "attention, an MLP or experts) after its own RMSNorm; experts as transformers' loop "
     "over them runs, each token-slot gathered, weighted and index_added back"},
    {"falcon_h1",
     "its Mamba-2 mixers' saved tensors are mamba_ssm's mamba_split_conv1d_scan_combined's "
     "(transformers trains with it when mamba_ssm and causal_conv1d are installed), read "
     "from its code and not measured; each branch keeps its own scaled copy of the norm's "
     "output, as FalconH1DecoderLayer multiplies it; lm_head_multiplier makes a second "
     "tensor of the logits' size for a moment, not counted"},
    {"deepseek_v32",
     "its indexer runs as transformers' DeepseekV32Indexer does, under torch.no_grad: it "
     "keeps nothing for backward and its weights take no gradient there, though memcalc "
     "counts their gradients and optimizer state (leaning high); its fp32 scores over "
     "every key at each of its heads are a forward temporary (measured on CPU: "
     "validation/sparse_indexer_live.py); attention runs dense under the top-k mask (eager), "
     "or (flash) a sparse kernel is assumed to keep the top-k indices"},
    {"llama4",
     "its MoE layers are counted as transformers' Llama4TextMoe trains them, every expert "
     "over every token (E x the routed slots; --moe-kernel grouped-gemm, or --profile "
     "megatron, counts the routed slots alone); chunked attention keeps what full attention "
     "keeps (eager masks a full s x s score matrix); a fused kernel given an explicit "
     "chunked mask (SDPA's) would keep that mask, s^2 b bytes, which is not counted"},
};

/// mllama's: what its text-only steps run and what memcalc counts of the rest.
std::string mllama_note(const Architecture& m) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    std::uint64_t cross = 0;
    for (std::size_t k = 0; k < m.kind_count(); ++k)
        if (m.kind_view(k).mixer == Mixer::cross_attention) cross += m.layers_of_kind(k);
    return "its tiled vision tower (" + n(m.vision.depth) + " local and " +
           n(m.vision.global_depth) + " global blocks of " + n(m.vision.hidden) +
           ") and projector are counted with the language model's parameters and train with them "
           "(--frozen vision freezes them); a micro-batch's images (--images N; each padded to " +
           n(m.vision.tiles) + " tiles of " + n(m.vision.tile_tokens()) +
           " tokens) run through the tower and the " + n(cross) +
           " cross-attention layers read their tokens, as modeling_mllama.py runs them (the "
           "eager cross-attention layer and tower measured on CPU); a step of "
           "text alone skips those layers, which then keep "
           "nothing: their and the tower's parameters get no gradient in plain PyTorch (None), "
           "but memcalc counts their gradients and optimizer state (leaning high); serving "
           "caches their k and v over the images' tokens (transformers' cache; SGLang's pool; "
           "vLLM no longer serves mllama)";
}

/// The notes that depend on the config: Jamba's kernels, Granite's Mamba-2 layers, a tower.
void config_notes(const std::string& type, const Architecture& m, std::vector<std::string>& notes) {
    if (type == "jamba")
        notes.push_back(
            m.ssm.kernels
                ? "its Mamba layers' saved tensors are mamba_ssm's fused kernels' "
                  "(use_mamba_kernels), read from their code and not measured, leaning high where "
                  "a contiguous copy may not be made; serving keeps a state per sequence in those "
                  "layers, no KV cache"
                : "its Mamba layers run transformers' slow path (use_mamba_kernels false), which "
                  "keeps every step's state: s b d_inner d_state fp32 values several times a "
                  "layer");
    if (type == "granitemoehybrid" && m.any_mixer(Mixer::mamba2))
        notes.push_back(
            "its Mamba-2 layers' saved tensors are mamba_ssm's mamba_split_conv1d_scan_combined's "
            "(transformers trains with it when mamba_ssm and causal_conv1d are installed), read "
            "from its code and not measured; without them transformers runs torch_forward, which "
            "is not modelled; its router takes the softmax of the top-k logits, counted as a "
            "renormalised top-k softmax; logits_scaling divides the logits into a second tensor "
            "of their size, not counted");
    if (type == "qwen3_next" || type.rfind("qwen3_5", 0) == 0) notes.push_back(qwen3_next_note(m));
    if (m.vision.tiled())
        notes.push_back(mllama_note(m));
    else if (m.vision.enabled())
        notes.push_back(
            "its vision tower (" + std::to_string(m.vision.depth) + " blocks of " +
            std::to_string(m.vision.hidden) +
            ") is counted with the language model's parameters and trains with them (--frozen "
            "vision freezes it); a micro-batch's images (--images N --image-size WxH) keep their "
            "pixels and, where the tower trains, its blocks' tensors as memcalc's layers keep "
            "theirs (not measured on the tower itself); without them the step is text-only");
}

/// What the user should know of an import of `type`, printed beside its estimate and kept in its
/// description.
std::vector<std::string> import_notes(const std::string& type, const JsonReader& in,
                                      const Architecture& m) {
    std::vector<std::string> notes;
    if (const std::string mtp = next_token_layers_note(in, m); !mtp.empty()) notes.push_back(mtp);
    config_notes(type, m, notes);
    const std::string family = type == "llama4_text" ? "llama4" : type;
    for (const TypeNote& row : type_notes)
        if (family == row.type) notes.push_back(row.note);
    return notes;
}

/// model_types whose layers hold a block shape memcalc has no row for yet: refused by name, with
/// what is missing, rather than counted with a wrong shape.
bool is_object_at(const json& document, const char* key) {
    return document.contains(key) && document.at(key).is_object();
}

/// A vision-language config's language-model keys: its text_config's over the top level's (older
/// files keep them at the top; tie_word_embeddings stays there in newer ones).
json language_model_keys(const json& document) {
    json keys = document;
    keys.erase("vision_config");
    keys.erase("text_config");
    if (is_object_at(document, "text_config"))
        for (const auto& [key, value] : document.at("text_config").items()) keys[key] = value;
    return keys;
}

/// A nested text_config's keys over its config class's defaults, as transformers fills them:
/// Gemma3TextConfig's (configuration_gemma3.py; the published gemma-3-4b-it names few keys) and
/// MllamaTextConfig's (configuration_mllama.py, v4.53.0).
json text_keys_with_defaults(const std::string& type, const json& text) {
    static const std::map<std::string, json> defaults = {
        {"gemma3",
         {{"vocab_size", 262208u},
          {"hidden_size", 2304u},
          {"intermediate_size", 9216u},
          {"num_hidden_layers", 26u},
          {"num_attention_heads", 8u},
          {"num_key_value_heads", 4u},
          {"head_dim", 256u},
          {"hidden_activation", "gelu_pytorch_tanh"},
          {"max_position_embeddings", 131072u},
          {"sliding_window", 4096u}}},
        {"mllama",
         {{"vocab_size", 128256u},
          {"hidden_size", 4096u},
          {"intermediate_size", 14336u},
          {"num_hidden_layers", 40u},
          {"num_attention_heads", 32u},
          {"num_key_value_heads", 8u},
          {"max_position_embeddings", 131072u},
          {"cross_attention_layers", {3u, 8u, 13u, 18u, 23u, 28u, 33u, 38u}}}},
    };
    const auto row = defaults.find(type);
    json keys = row == defaults.end() ? json::object() : row->second;
    for (const auto& [key, value] : text.items()) keys[key] = value;
    return keys;
}

/// The keys the language model's reader takes: a nested text_config (Gemma 3's and mllama's with
/// their config classes' defaults under it, Llama 4's as it is), a vision-language config's
/// text_config over its top level, or none: the top level itself.
std::optional<json> language_model_json(const std::string& type, const json& document,
                                        const JsonReader& in, bool tower) {
    const bool nested = type == "gemma3" || type == "llama4" || type == "mllama";
    if (nested && !is_object_at(document, "text_config"))
        in.fail("model_type " + type + " needs its language model's keys in a text_config object");
    if (nested) return text_keys_with_defaults(type, document.at("text_config"));
    if (tower) return language_model_keys(document);
    return std::nullopt;
}

std::optional<std::string> unmodelled_reason(const std::string& type) {
    static const std::pair<const char*, const char*> types[] = {
        {"glm_moe_dsa",
         "GLM-5's layers (glm4_moe's experts beside DeepSeek-V3.2's sparse attention) are not "
         "modelled"},
    };
    for (const auto& [name, reason] : types)
        if (type == name) return std::string(reason);
    return std::nullopt;
}

}  // namespace

ModelFile parse_hf_config(std::string_view text, const std::string& origin,
                          const std::string& default_name) {
    const json document = parse_json(text, origin);
    if (!document.is_object())
        throw error(origin + ": expected a config.json object (got " +
                    std::string(document.type_name()) + ")");
    const JsonReader in(document, origin);
    if (!in.has("model_type")) in.fail("missing key 'model_type'");
    const std::string type = in.text_or("model_type", "");
    const auto family = std::find_if(families.begin(), families.end(),
                                     [&](const auto& f) { return f.first == type; });
    if (family == families.end()) {
        if (const auto reason = unmodelled_reason(type))
            in.fail("model_type '" + type + "' is not modelled yet: " + *reason);
        std::string names;
        for (const auto& name : supported_model_types())
            names += (names.empty() ? "" : ", ") + name;
        // No nearest name: a near spelling is often another family ("qwen3" is not "qwen2").
        in.fail("model_type '" + type + "' is not supported; memcalc reads " + names);
    }
    ModelFile file;
    file.architecture.name = default_name;
    const VisionLanguage* tower = vision_language(type);
    const std::optional<json> language = language_model_json(type, document, in, tower != nullptr);
    family->second(language ? JsonReader(*language, origin + " (text_config)") : in,
                   file.architecture);
    if (tower != nullptr) {
        if (!is_object_at(document, "vision_config"))
            in.fail("model_type " + type +
                    " needs its vision tower's keys in a vision_config object");
        tower->vision(in, JsonReader(document.at("vision_config"), origin + " (vision_config)"),
                      file.architecture);
    }
    try {
        validate(file.architecture);
    } catch (const error& e) {
        throw error(origin + ": " + e.what());
    }
    file.notes = import_notes(type, in, file.architecture);
    file.description = "imported from " + origin + " (model_type " + type +
                       (language && !tower ? ", text_config: the language model alone" : "") + ")";
    for (const std::string& note : file.notes) file.description += "; " + note;
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
