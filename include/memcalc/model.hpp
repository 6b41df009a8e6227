#pragma once
/// The architecture of a decoder-only transformer: what a preset or a model file describes.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcalc/error.hpp"
#include "memcalc/launches.hpp"
#include "memcalc/vision.hpp"

namespace memcalc {

enum class Mlp { gated, plain };         ///< gated: SwiGLU/GeGLU, three h x f matrices; plain: two
enum class Norm { rmsnorm, layernorm };  ///< RMSNorm keeps a weight; LayerNorm a weight and a bias
/// Which linear layers carry a bias vector: none; q, k and v; all four attention projections; every
/// one.
enum class Bias { none, qkv, attention, all };
enum class Position {
    rotary,
    learned,
    none
};  ///< only learned position embeddings hold parameters
/// The MLP's non-linearity (SiLU makes a gated MLP SwiGLU); what each keeps is a row of
/// activation_functions.hpp: gelu_new, gelu_fast and quick_gelu are chains of Python ops.
enum class Activation {
    silu,
    gelu,
    gelu_tanh,
    relu,
    gelu_new,
    gelu_fast,
    quick_gelu,
    clamped_swiglu,
    relu2
};
/// Where eager attention's causal mask comes from: causal_mask_buffers' rows.
enum class CausalMaskBuffer { none, per_layer, per_layer_added, per_layer_bool };

/// A causal mask as a row: whether each layer registers a max_positions^2 buffer (else one
/// additive mask is built per forward); whether that buffer is floating, cast with the weights
/// (else bool, a byte an element, never cast); and how the scores meet it: masked_fill-ed, which
/// keeps the comparison; selected by torch.where on the buffer's own view, which keeps nothing
/// new; or else added out of place, which keeps nothing but makes the scores the mask's dtype.
struct CausalMaskBufferRow {
    CausalMaskBuffer id;
    std::string_view name;  ///< the model file's spelling
    bool registered;
    bool cast;
    bool filled;
    bool selected;

    bool added() const { return !filled && !selected; }
};

inline constexpr std::array<CausalMaskBufferRow, 4> causal_mask_buffers{{
    // name                                  registered cast filled selected
    {CausalMaskBuffer::none, "none", false, false, false, false},  // transformers' LLaMA: + mask
    {CausalMaskBuffer::per_layer, "per_layer", true, true, true, false},  // nanoGPT: bias == 0
    {CausalMaskBuffer::per_layer_added, "per_layer_added", true, true, false, false},  // llama2.c
    // transformers' GPT-2 (to 4.52): a bool `bias` buffer, torch.where(bias[...], w, min)
    {CausalMaskBuffer::per_layer_bool, "per_layer_bool", true, false, false, true},
}};

inline const CausalMaskBufferRow& causal_mask_buffer(CausalMaskBuffer id) {
    for (const auto& row : causal_mask_buffers)
        if (row.id == id) return row;
    return causal_mask_buffers.front();
}
/// Norms on the queries and keys, before rotary: none; an RMSNorm over each head's d values whose
/// one weight of d the heads share (Qwen3, Gemma 3: q_norm, k_norm in transformers); or one RMSNorm
/// over the whole projection, a*d and k*d values with a weight each (OLMo 2); or an L2 norm of each
/// head's q and k after rotary, without a weight (Llama 4's use_qk_norm, Llama4TextL2Norm).
enum class QkNorm { none, per_head, whole, l2 };
/// Where a sequential layer's two norms sit (norms_per_layer 2): before each branch (pre, LLaMA's),
/// or on each branch's output before its residual add (post, OLMo 2's). 4 is both; 1 one shared
/// pre-norm.
enum class NormPosition { pre, post };

inline const char* qk_norm_name(QkNorm n) {
    return n == QkNorm::per_head ? "per_head"
           : n == QkNorm::whole  ? "whole"
           : n == QkNorm::l2     ? "l2"
                                 : "none";
}
inline const char* norm_position_name(NormPosition p) {
    return p == NormPosition::post ? "post" : "pre";
}
/// Where transformers' rotary embedding module lives, which sets what a step holds of cos and sin.
enum class RotaryEmbedding { shared, per_layer, per_layer_cached, shared_fp32 };
/// A router's per-expert bias of E: none; a trainable Parameter (gpt-oss's router Linear); or a
/// registered buffer that num_parameters() does not count (DeepSeek-V3's e_score_correction_bias,
/// register_buffer in transformers' modeling_deepseek_v3.py), updated from load statistics.
enum class RouterBias { none, trainable, buffer };
inline constexpr std::array<std::pair<RouterBias, std::string_view>, 3> router_bias_names{
    {{RouterBias::none, "none"},
     {RouterBias::trainable, "trainable"},
     {RouterBias::buffer, "buffer"}}};
inline std::string_view router_bias_name(RouterBias b) {
    return router_bias_names[static_cast<std::size_t>(b)].second;
}
/// How a MoE block's router picks and weights its experts in training: a softmax over the logits
/// and top-k (Mixtral's; renormalised where renormalize_topk), or Phi-3.5-MoE's sparsemixer, two
/// passes of a masked softmax, a Gumbel-sampled expert, a gathered weight and its Heun correction
/// (top 2 alone).
enum class Router { softmax_topk, sparsemixer };
inline constexpr std::array<std::pair<Router, std::string_view>, 2> router_names{
    {{Router::softmax_topk, "softmax_topk"}, {Router::sparsemixer, "sparsemixer"}}};
inline std::string_view router_name(Router r) {
    return router_names[static_cast<std::size_t>(r)].second;
}
/// Which tokens a MoE block's experts compute over in the model's own code, and how they get
/// there: routed (each expert its token-slots, gathered by index, weighted and index_added back:
/// Mixtral's loop), permuted (Megatron-LM's token dispatchers: the slots permuted by index, which
/// keeps nothing, the routing weights multiplied inside the experts' activation, the outputs
/// unpermuted, which keeps nothing), or every token through every expert, the router's scores
/// multiplied into the input (transformers' Llama4TextMoe: a repeat and two bmm).
enum class ExpertDispatch { routed, every_token, permuted };
inline constexpr std::array<std::pair<ExpertDispatch, std::string_view>, 3> expert_dispatch_names{
    {{ExpertDispatch::routed, "routed"},
     {ExpertDispatch::every_token, "every_token"},
     {ExpertDispatch::permuted, "permuted"}}};
inline std::string_view expert_dispatch_name(ExpertDispatch d) {
    return expert_dispatch_names[static_cast<std::size_t>(d)].second;
}

/// How RMSNorm runs, a row each (rmsnorm_kernels).
enum class RmsnormKernel { torch, fused, torch_input_dtype };
/// A way RMSNorm runs: `fused`, one kernel keeping x and 1/rms; else PyTorch's ops, on an fp32
/// copy of x where `upcast`, else in x's own dtype, keeping x (or its copy), 1/rms and x_norm.
struct RmsnormKernelRow {
    RmsnormKernel id;
    std::string_view name;  ///< the model file's spelling
    bool fused, upcast;
};
inline constexpr std::array<RmsnormKernelRow, 3> rmsnorm_kernels{{
    {RmsnormKernel::torch, "torch", false, true},  // transformers' RMSNorm: x.to(float32) first
    {RmsnormKernel::fused, "fused", true, false},  // Transformer Engine's, Apex's FusedRMSNorm
    // lit-gpt's RMSNorm (lit_gpt/rmsnorm.py @8641822): x * x, mean, rsqrt in x's dtype
    {RmsnormKernel::torch_input_dtype, "torch_input_dtype", false, false},
}};
inline const RmsnormKernelRow& rmsnorm_kernel(RmsnormKernel k) {
    return rmsnorm_kernels[static_cast<std::size_t>(k)];
}
/// Whether torch.compile runs each layer (torchtune's and torchtitan's per-block compile): its
/// AOTAutograd partition recomputes pointwise chains in backward instead of keeping them.
enum class Compile { none, layers };
inline const char* compile_name(Compile c) { return c == Compile::none ? "none" : "layers"; }
inline const char* rmsnorm_kernel_name(RmsnormKernel k) {
    return rmsnorm_kernel(k).name.data();  // a literal: terminated
}

/// A rotary embedding as a row: whether every attention layer makes its own cos and sin (autograd
/// then saves a pair per layer), and whether it registers cos and sin caches of max_positions x
/// head_dim beside its inv_freq (head_dim / 2), buffers that model.to(dtype) casts with the
/// weights.
struct RotaryEmbeddingRow {
    RotaryEmbedding id;
    std::string_view name;  ///< the model file's spelling
    bool per_layer_tables;  ///< each layer's cos and sin of s x head_dim, saved by q * cos and
                            ///< rotate_half(q) * sin
    bool cached;            ///< each layer registers its cos and sin caches
    std::string_view source;
    /// Kernels each layer's forward launches to make its cos and sin (counted on CPU:
    /// validation/kernel_launches.py), outside autograd: none in backward.
    Launches table_launches;
    bool fp32_tables = false;  ///< the shared cos and sin are fp32, whatever the compute dtype
};

/// transformers' models/llama/modeling_llama.py in three eras (Mistral's and others' are copies).
inline constexpr std::array<RotaryEmbeddingRow, 4> rotary_embeddings{{
    {RotaryEmbedding::shared,
     "shared",
     false,
     false,
     "4.45 and later: the model's one rotary_emb computes cos and sin once per forward "
     "(position_ids "
     "(1, s)) and passes them to every layer",
     {0, 0}},
    {RotaryEmbedding::per_layer,
     "per_layer",
     true,
     false,
     "4.40-4.44: each LlamaAttention's own rotary_emb computes cos and sin of (1, s, head_dim) "
     "from its "
     "inv_freq each forward",
     {8, 0}},
    {RotaryEmbedding::per_layer_cached,
     "per_layer_cached",
     true,
     true,
     "4.31-4.38: each LlamaAttention's rotary_emb registers cos_cached and sin_cached of "
     "max_positions x "
     "head_dim in torch.get_default_dtype(); forward returns cos_cached[:s].to(x.dtype) and "
     "apply_rotary_pos_emb gathers cos[position_ids], a new (1, s, head_dim) tensor per layer "
     "(4.38 "
     "keeps the caches for BC and computes the same tensor from inv_freq)",
     {2, 0}},
    {RotaryEmbedding::shared_fp32,
     "shared_fp32",
     false,
     false,
     "lit-gpt's: the model's cos and sin buffers, remade in the default dtype (fp32) when "
     "model.max_seq_length is set and sliced for every layer",
     {0, 0},
     true},
}};

inline const RotaryEmbeddingRow& rotary_embedding(RotaryEmbedding id) {
    for (const auto& row : rotary_embeddings)
        if (row.id == id) return row;
    return rotary_embeddings.front();
}

/// Multi-head latent attention (DeepSeek-V2 and V3, transformers' modeling_deepseek_v2/v3.py): q
/// comes from a latent of q_lora_rank (or a plain q_proj), k and v from one latent of kv_lora_rank,
/// each latent RMSNormed; every head's q and k are a part without rotary (nope) and a rotary part,
/// k's rotary part one for all heads, read from the latent's projection beside the latent.
/// kv_lora_rank 0: none. DeepSeek-V3.2 adds a lightning indexer (DeepSeek Sparse Attention), which
/// scores every key for each query from the query latent and picks the index_topk that attention
/// reads; index_heads 0: none.
struct LatentAttention {
    std::uint64_t q_lora_rank =
        0;  ///< the query latent's width; 0: a plain q_proj (DeepSeek-V2-Lite)
    std::uint64_t kv_lora_rank = 0;      ///< the key/value latent's width; 0: standard attention
    std::uint64_t qk_nope_head_dim = 0;  ///< per head, the part of q and k that rotary leaves alone
    std::uint64_t qk_rope_head_dim = 0;  ///< per head, the rotary part
    std::uint64_t v_head_dim = 0;        ///< per head, v's width (and the attention output's)
    std::uint64_t index_heads = 0;       ///< the indexer's heads (index_n_heads); 0: no indexer
    std::uint64_t index_head_dim = 0;    ///< its q and k width per head, rotary part first
    std::uint64_t index_topk = 0;        ///< the keys each query attends to

    bool enabled() const { return kv_lora_rank > 0; }
    bool indexed() const { return index_heads > 0; }
    std::uint64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

/// What mixes tokens in a layer: attention, or a Mamba selective state-space mixer (Mamba-1, as
/// transformers' JambaMambaMixer and MambaMixer hold it; Mamba-2, as its Mamba2Mixer and
/// GraniteMoeHybridMambaLayer hold it), a Gated DeltaNet (Qwen3-Next's linear attention,
/// transformers' Qwen3NextGatedDeltaNet), none: a layer of an MLP or experts alone (Nemotron-H's
/// "-" and "E" layers), or attention and a Mamba-2 mixer side by side on one normed input, their
/// outputs summed (Falcon-H1's, transformers' FalconH1DecoderLayer), or cross-attention to the
/// images' tokens (mllama's MllamaCrossAttentionDecoderLayer: q from the stream, k and v from the
/// vision tower's states, both normed per head, each branch gated by tanh of a learned scalar).
enum class Mixer {
    attention,
    mamba,
    mamba2,
    none,
    gated_deltanet,
    attention_mamba2,
    cross_attention
};
inline const char* mixer_name(Mixer x) {
    constexpr const char* names[] = {"attention",      "mamba",          "mamba2",
                                     "none",           "gated_deltanet", "attention_mamba2",
                                     "cross_attention"};
    return names[static_cast<int>(x)];
}
/// Whether `x` holds a state-space mixer: a state per sequence (a Gated DeltaNet's recurrent
/// state is one too).
inline bool state_space(Mixer x) {
    return x == Mixer::mamba || x == Mixer::mamba2 || x == Mixer::gated_deltanet ||
           x == Mixer::attention_mamba2;
}
/// Whether `x` holds a Mamba-2 mixer, alone or beside attention.
inline bool has_mamba2(Mixer x) { return x == Mixer::mamba2 || x == Mixer::attention_mamba2; }
/// Whether `x` attends over the sequence (a KV cache, attention's core).
inline bool attends(Mixer x) { return x == Mixer::attention || x == Mixer::attention_mamba2; }

/// A Mamba-1 mixer's widths (Gu and Dao 2023; transformers' modeling_jamba.py): in_proj makes x and
/// the gate z (d_inner each), a depthwise causal conv1d of d_conv taps, x_proj makes dt (dt_rank),
/// B and C (d_state each), dt_proj widens dt back to d_inner, A_log (d_inner x d_state) and D
/// (d_inner). `kernels`: mamba_ssm's fused kernels (config use_mamba_kernels; causal_conv1d_fn and
/// selective_scan_fn keep what they save), else transformers' slow path, which keeps every step's
/// state. A Mamba-2 mixer (Dao and Gu 2024) has no x_proj or dt_proj (dt_rank 0): in_proj makes z
/// and x (d_inner each), B and C (groups x d_state each) and dt (one per head); the convolution
/// runs over x, B and C; A_log, D and dt's bias hold one value per head of d_inner / heads
/// channels, and a gated RMSNorm of d_inner feeds out_proj. Only mamba_ssm's kernels are modelled
/// for it. A Gated DeltaNet (Yang et al. 2024; Qwen3-Next) has Mamba-2's shapes under other names:
/// v is x (d_inner = linear_num_value_heads x linear_value_head_dim, heads: the value heads), q and
/// k are C and B (groups: linear_num_key_heads, d_state: linear_key_head_dim), so its convolution
/// runs over the same d_inner + 2GN channels and its state per head is d_state x d_inner / heads;
/// in_proj_qkvz makes z beside them and in_proj_ba a beta and a gate per head; chunk is fla's 64.
struct StateSpace {
    std::uint64_t d_inner = 0;  ///< 0: no Mamba layers
    std::uint64_t d_state = 0;  ///< N
    std::uint64_t d_conv = 0;   ///< the convolution's taps
    std::uint64_t dt_rank = 0;  ///< r
    bool conv_bias = true;
    bool proj_bias = false;  ///< in_proj's and out_proj's biases
    bool inner_norms =
        false;  ///< Jamba's RMSNorms on dt, B and C (dt_layernorm, b_layernorm, c_layernorm)
    bool kernels = true;
    /// Mamba-2: the gated RMSNorm before out_proj (false: Falcon-H1 0.5B's mamba_rms_norm, the
    /// gate applied by the scan alone).
    bool gated_norm = true;
    std::uint64_t heads = 0;   ///< Mamba-2: its heads (mamba_n_heads); 0 under Mamba-1
    std::uint64_t groups = 0;  ///< Mamba-2: B and C's groups (mamba_n_groups)
    std::uint64_t chunk = 0;   ///< Mamba-2: the scan's chunk in tokens (mamba_chunk_size)

    bool enabled() const { return d_inner > 0; }
    /// Mamba-2: the convolution's channels, x, B and C.
    std::uint64_t conv_channels() const { return d_inner + 2 * groups * d_state; }
    /// Mamba-2: in_proj's outputs, z, x, B, C and dt.
    std::uint64_t in_proj_width() const { return d_inner + conv_channels() + heads; }
    /// Gated DeltaNet: in_proj_qkvz's and in_proj_ba's outputs, q, k, v, z, beta and the gate.
    std::uint64_t deltanet_in_width() const { return d_inner + conv_channels() + 2 * heads; }
};

/// A kind of layer: what differs from the model's fields in some of its layers (DeepSeek's first
/// dense layers beside its mixture-of-experts ones; Llama 4's interleaved dense and MoE layers). A
/// field left empty is the model's. New per-layer variants (a window, a mixer) are fields here.
struct LayerKind {
    std::string name;
    std::optional<std::uint64_t> ffn;      ///< feed-forward width (per expert)
    std::optional<std::uint64_t> experts;  ///< 0: a dense feed-forward block
    std::optional<std::uint64_t> experts_per_token;
    // Initialised, so that a kind listing only the fields above stays a complete aggregate.
    std::optional<std::uint64_t> shared_ffn =
        std::nullopt;  ///< the shared experts' total width; 0: none
    std::optional<bool> shared_expert_gate = std::nullopt;
    std::optional<RouterBias> router_bias = std::nullopt;
    /// Sliding-window attention's window in tokens; 0: full causal attention.
    std::optional<std::uint64_t> window = std::nullopt;
    /// Chunked attention's chunk in tokens; 0: none (Llama 4's rotary layers chunk, its NoPE ones
    /// do not).
    std::optional<std::uint64_t> attention_chunk = std::nullopt;
    std::optional<Position> position =
        std::nullopt;  ///< none: a NoPE layer of a rotary model (Llama 4)
    std::optional<QkNorm> qk_norm = std::nullopt;
    std::optional<Mixer> mixer = std::nullopt;  ///< a Mamba layer among attention ones (Jamba)
    /// false: a layer of its mixer alone, no MLP or experts (Nemotron-H's "M" and "*" layers).
    std::optional<bool> has_mlp = std::nullopt;
};

/// `count` consecutive layers of one kind (an index into Architecture::layer_kinds).
struct LayerRun {
    std::size_t kind = 0;
    std::uint64_t count = 0;
};

/// At most this many kinds of layer in one model: per-kind figures are held in place, not
/// allocated.
inline constexpr std::size_t max_layer_kinds = 4;

struct Architecture {
    std::string name;
    std::uint64_t hidden = 0;    ///< h, the model width
    std::uint64_t layers = 0;    ///< L
    std::uint64_t heads = 0;     ///< a, query heads
    std::uint64_t kv_heads = 0;  ///< key/value heads (grouped-query attention); 0 means = heads
    std::uint64_t head_dim = 0;  ///< per-head width; 0 means hidden / heads
    std::uint64_t ffn = 0;       ///< f, the feed-forward width (per expert for MoE)
    std::uint64_t vocab = 0;     ///< V
    std::uint64_t max_positions = 0;  ///< longest sequence the model was trained on
    std::uint64_t position_rows =
        0;  ///< rows of a learned position table; 0 means max_positions (OPT adds 2)
    /// Rows of the token embedding; 0 means vocab (mllama's has vocab + 8, the head vocab).
    std::uint64_t embedding_rows = 0;
    Mlp mlp = Mlp::gated;
    Norm norm = Norm::rmsnorm;
    Bias bias = Bias::none;
    Position position = Position::rotary;
    bool tied_embeddings = false;  ///< the output head reuses the token embedding matrix
    bool head_bias = false;        ///< the output head has a bias vector of V (Phi-2)
    std::uint64_t experts = 0;     ///< mixture-of-experts feed-forward experts; 0 means dense
    std::uint64_t experts_per_token = 0;  ///< top-k routing; 0 means 1 for MoE models
    Activation activation = Activation::silu;
    std::uint64_t norms_per_layer =
        2;  ///< 2: before attention and MLP; 1: one shared (parallel); 4: Gemma 2's sandwich
    bool parallel_attention =
        false;  ///< attention and MLP read the same input and add to one residual (GPT-J, Falcon)
    bool embedding_norm = false;   ///< a LayerNorm right after the token embedding (BLOOM)
    double attention_dropout = 0;  ///< dropout probability on the attention weights
    double hidden_dropout = 0;     ///< dropout probability on each residual branch
    double mlp_dropout =
        0;  ///< dropout inside the MLP, on the down projection's input (nn.TransformerEncoderLayer)
    bool softmax_fp32 = true;  ///< eager attention takes its softmax in fp32 (LLaMA-style code
                               ///< does; GPT-2's does not)
    /// The layer's code keeps the attention's output in a name of its own until it returns
    /// (transformers' GPT2Block, a sequential FalconDecoderLayer); LLaMA-style code rebinds
    /// hidden_states, freeing it at the add.
    bool attention_output_held = false;
    CausalMaskBuffer causal_mask_buffer =
        CausalMaskBuffer::none;  ///< eager attention's mask: built per forward, or a buffer per
                                 ///< layer
    /// Eager attention adds its (built) mask inside the product: torch's MultiheadAttention runs
    /// baddbmm(mask, q, k^T), one s x s tensor, which autocast casts with q and k; else the mask is
    /// added out of place, the sum in the mask's dtype (transformers' eager attention).
    bool mask_in_product = false;
    /// q, k and v are one linear (GPT-2's c_attn, nanoGPT's, torch's in_proj): autocast casts its
    /// input once, not once per projection.
    bool fused_qkv = false;
    /// A gated MLP's gate and up are one linear (Phi-3's gate_up_proj): autocast casts its input
    /// once, and its output is both.
    bool fused_gate_up = false;
    /// With fewer key/value heads than query heads, the code repeats k and v to every query head
    /// before a fused attention kernel (torchtune's, torchtitan's, transformers' sdpa path before
    /// torch 2.5), and the kernel keeps the copies; else it hands the kernel the grouped heads.
    /// Eager attention's code repeats them either way.
    bool repeat_kv = false;
    /// The model's forward keeps the token (and learned position) embeddings' outputs in names of
    /// their own until it returns (nanoGPT's tok_emb and pos_emb), beside their sum.
    bool embedding_outputs_held = false;
    /// The embedding's output requires grad even when nothing before the first layer trains
    /// (transformers' enable_input_require_grads, which peft's prepare_model_for_kbit_training and
    /// gradient checkpointing over frozen embeddings call); false: a frozen embedding's output
    /// needs none, so the first layer keeps nothing before its first adapter (lit-gpt's loop).
    bool input_require_grads = true;
    /// A one-tensor-at-a-time optimiser steps the parameters in one group in the model's order
    /// (torch.optim.AdamW(model.parameters())), so the head follows the final norm; else in groups
    /// whose order memcalc does not know (the Trainer's weight-decay groups: the head after the
    /// last layer's matrix), leaning high.
    bool params_in_model_order = false;
    /// The forward returns its logits upcast to fp32 (transformers' LLaMA-family code, 4.30 to
    /// 4.44: logits = logits.float()), the head's own freed at once: what a loop holds is fp32.
    bool logits_fp32 = false;
    QkNorm qk_norm = QkNorm::none;  ///< norms on q and k before rotary (Qwen3, Gemma 3, OLMo 2)
    NormPosition norm_position =
        NormPosition::pre;  ///< with norms_per_layer 2: before or after each branch
    /// RMSNorm multiplies its weight into the fp32 normalised input and then casts back (T5's, OLMo
    /// 2's, gpt-oss's), so autograd keeps that input in fp32; LLaMA's casts back first and keeps it
    /// narrow.
    bool rmsnorm_fp32_scale = false;
    RmsnormKernel rmsnorm_kernel = RmsnormKernel::torch;  ///< PyTorch's ops or one fused kernel
    /// Each layer compiled: the min-cut partition keeps what a fused kernel would (RMSNorm's input
    /// and 1/rms, a GLU's gate and up) and recomputes the pointwise tensors the table marks.
    Compile compile = Compile::none;
    /// A gated MLP's act(gate) x up is one kernel that keeps only gate and up and recomputes act in
    /// backward (Megatron-LM's bias_swiglu_impl, Transformer Engine's, Liger's); else torch's ops,
    /// whose product keeps act's output as well.
    bool fused_glu = false;
    /// Latent attention under a fused kernel that needs one head width pads v to q's with F.pad
    /// and copies the output's unpadded slice for o_proj (transformers' flash_attention_2); else
    /// the kernel takes v at its own width, copied contiguous, and o_proj reads its output as is
    /// (Transformer Engine's fused attention under Megatron-LM's MLA).
    bool latent_v_padded = true;
    /// The layers hold their activations sequence-first, [s, b, h] (Megatron-LM's): a fused
    /// attention kernel that takes batch-first tensors alone (flash-attn's) gets contiguous copies
    /// of q, k and v, and where b > 1 the output projection copies the kernel's output, handed back
    /// as a transposed view, while the kernel keeps its own (Transformer Engine's FlashAttention).
    bool sequence_first = false;
    /// q reaches a fused attention kernel as a contiguous heads-first [b, a, s, d] tensor
    /// (lit-gpt's: its rotary torch.cat follows the permute of the fused q/k/v output), not a
    /// transposed view of [b, s, a, d]: a kernel whose output follows q's layout
    /// (FlashAttention-2's, cuDNN's) hands it back heads-first, the program's transpose and reshape
    /// copy it for the output projection beside the kernel's own, and the kernel's backward copies
    /// it batch-first.
    bool q_heads_first = false;
    /// The router's linear runs on an fp32 copy of its input, which it keeps (F.linear(x.float(),
    /// w.float()): transformers' DeepSeek-V3 router, Megatron-LM's fp32 router before July 2025).
    bool router_input_fp32 = false;
    /// Each attention head has a learnable logit (gpt-oss's sinks): the softmax runs over s + 1
    /// columns.
    bool attention_sinks = false;
    /// q_proj also makes a gate per query channel, twice as wide, and the attention's output is
    /// multiplied by its sigmoid before o_proj (Qwen3-Next's gated attention).
    bool attention_output_gate = false;
    /// The experts are one stacked E x ... parameter per projection, which the training loop
    /// indexes with a tensor for each expert that has tokens: a copy of its weights that the matmul
    /// keeps (gpt-oss).
    bool stacked_experts = false;
    /// Sliding-window attention's window in tokens (a LayerKind may set its own); 0: full
    /// attention. Training memory does not depend on it: eager attention masks a full s x s score
    /// matrix, and a fused kernel keeps a log-sum-exp per row either way. A KV cache would (issue
    /// 16).
    std::uint64_t window = 0;
    /// Chunked attention (Llama 4's attention_chunk_size): each query sees the keys of its own
    /// chunk of this many tokens; 0: none. Like a window it leaves training's tensors as they are:
    /// transformers' eager attention masks a full s x s score matrix (create_chunked_causal_mask),
    /// a fused kernel keeps a log-sum-exp per row; eager builds one mask more for it.
    std::uint64_t attention_chunk = 0;
    /// Multi-token prediction (DeepSeek-V3's; Megatron-LM's --mtp-num-layers): after the last
    /// layer, on the last pipeline stage, this many modules, each a layer of the last kind fed by
    /// the hidden states and the next token's embedding (a norm each, concatenated, projected 2h
    /// to h), then a final norm and the head and loss again; 0: none.
    std::uint64_t mtp_layers = 0;
    /// Queries scaled by a per-position temperature in the layers without rotary (Llama 4's
    /// attn_temperature_tuning): the product keeps the s fp32 scales.
    bool attention_temperature = false;
    ExpertDispatch expert_dispatch =
        ExpertDispatch::routed;            ///< which tokens the experts compute over
    Router router = Router::softmax_topk;  ///< how the router weights its experts
    /// Phi-3.5-MoE's input_jitter_noise: in training the MoE block's input is multiplied in place
    /// by noise uniform in [1 - it, 1 + it], which the product keeps; 0: none.
    double input_jitter = 0;
    RotaryEmbedding rotary_embedding =
        RotaryEmbedding::shared;  ///< one cos and sin per forward, or each layer's own
    /// Shared experts: one gated-or-plain MLP of this width that every token passes beside the
    /// routed experts (DeepSeek's n_shared_experts x moe_intermediate_size, Qwen2-MoE's
    /// shared_expert_intermediate_size, Llama 4's one); 0: none. Only in MoE layers.
    std::uint64_t shared_ffn = 0;
    bool shared_expert_gate =
        false;  ///< Qwen2-MoE: sigmoid(Linear(h, 1)) scales the shared expert's output
    RouterBias router_bias = RouterBias::none;
    bool renormalize_topk =
        true;  ///< the top-k probabilities divided by their sum (Qwen2-MoE's norm_topk_prob)
    /// The busiest expert's routed token-slots over the balanced share (s b k / E), every expert
    /// counted at it: 1 is memcalc's assumption, an even load; a capacity factor with padding
    /// (Megatron-LM's --moe-expert-capacity-factor, --moe-pad-expert-input-to-capacity) is it
    /// exactly, and it bounds an uneven dropless router from above.
    double expert_imbalance = 1.0;
    LatentAttention mla;  ///< multi-head latent attention's widths (DeepSeek); none by default
    Mixer mixer = Mixer::attention;  ///< what mixes tokens (a LayerKind may set its own)
    StateSpace ssm;                  ///< the Mamba layers' widths, where any layer is one
    VisionTower vision;              ///< a vision tower before the first layer; none by default
    /// The image tokens each sequence's cross-attention layers read (mllama's): set by a step
    /// from its images (Settings::images), never by a model file; 0: those layers skipped.
    std::uint64_t cross_attention_tokens = 0;
    /// false: no MLP or experts after the mixer (a LayerKind may say so).
    bool has_mlp = true;
    /// Kinds of layer and their order, first layer first. Both empty: every layer is the model's
    /// own fields (one kind). The runs' counts sum to `layers`.
    std::vector<LayerKind> layer_kinds;
    std::vector<LayerRun> layer_pattern;

    std::uint64_t key_value_heads() const { return kv_heads == 0 ? heads : kv_heads; }
    /// The width of each head's q and k (under latent attention its nope and rotary parts
    /// together).
    std::uint64_t head_size() const {
        if (mla.enabled()) return mla.qk_head_dim();
        return head_dim == 0 ? (heads == 0 ? 0 : hidden / heads) : head_dim;
    }
    /// The width of each head's v and of the attention's output per head.
    std::uint64_t value_head_size() const { return mla.enabled() ? mla.v_head_dim : head_size(); }
    /// The width rotary turns, and of its cos and sin tables.
    std::uint64_t rotary_dim() const { return mla.enabled() ? mla.qk_rope_head_dim : head_size(); }
    std::uint64_t token_embedding_rows() const {
        return embedding_rows == 0 ? vocab : embedding_rows;
    }
    std::uint64_t learned_positions() const {
        return position_rows == 0 ? max_positions : position_rows;
    }
    bool is_moe() const { return experts > 0; }
    /// Whether this layer (a kind's view) runs in the step: all do but mllama's cross-attention
    /// layers in a step of text alone, which transformers' MllamaTextModel skips (their
    /// parameters idle, no gradient).
    bool runs_in_step() const {
        return mixer != Mixer::cross_attention || cross_attention_tokens > 0;
    }
    /// Whether norms sit before the attention and MLP branches (pre, sandwich, or one shared).
    bool norms_before_branches() const {
        return norms_per_layer != 2 || norm_position == NormPosition::pre;
    }
    /// Whether norms sit on the branches' outputs, before the residual adds (sandwich, post).
    bool norms_after_branches() const {
        return norms_per_layer == 4 || norm_position == NormPosition::post;
    }
    std::uint64_t active_experts() const {
        return is_moe() ? (experts_per_token == 0 ? 1 : experts_per_token) : 1;
    }
    /// The token-slots the experts compute over, of `tokens` tokens: s b k when the load is even;
    /// else each expert's ceil(s b k x imbalance / E), at most every token, for all E.
    std::uint64_t dispatched_slots(std::uint64_t tokens) const {
        const std::uint64_t slots = tokens * active_experts();
        if (expert_imbalance == 1.0 || !is_moe()) return slots;
        const double busiest =
            std::ceil(static_cast<double>(slots) * expert_imbalance / static_cast<double>(experts));
        return std::min(tokens, static_cast<std::uint64_t>(busiest)) * experts;
    }

    std::size_t kind_count() const { return layer_kinds.empty() ? 1 : layer_kinds.size(); }
    /// The kind of the last layer, which a multi-token-prediction module's layer is.
    std::size_t last_kind() const { return layer_pattern.empty() ? 0 : layer_pattern.back().kind; }
    /// The layer runs, first layer first: one run of every layer when no kinds are given.
    std::vector<LayerRun> runs() const {
        return layer_pattern.empty() ? std::vector<LayerRun>{{0, layers}} : layer_pattern;
    }
    /// How many layers are of kind `kind`.
    std::uint64_t layers_of_kind(std::size_t kind) const {
        if (layer_pattern.empty()) return kind == 0 ? layers : 0;
        std::uint64_t n = 0;
        for (const auto& run : layer_pattern)
            if (run.kind == kind) n += run.count;
        return n;
    }
    /// The model as one layer of kind `kind` sees it: the kind's fields in place of the model's.
    Architecture kind_view(std::size_t kind) const {
        Architecture v = *this;
        v.layer_kinds.clear(), v.layer_pattern.clear();
        if (kind >= layer_kinds.size()) return v;
        const LayerKind& k = layer_kinds[kind];
        if (k.ffn) v.ffn = *k.ffn;
        if (k.experts) v.experts = *k.experts;
        if (k.experts_per_token) v.experts_per_token = *k.experts_per_token;
        if (k.window) v.window = *k.window;
        if (k.attention_chunk) v.attention_chunk = *k.attention_chunk;
        if (k.position) v.position = *k.position;
        if (k.qk_norm) v.qk_norm = *k.qk_norm;
        if (k.shared_ffn) v.shared_ffn = *k.shared_ffn;
        if (k.shared_expert_gate) v.shared_expert_gate = *k.shared_expert_gate;
        if (k.router_bias) v.router_bias = *k.router_bias;
        if (k.mixer) v.mixer = *k.mixer;
        if (k.has_mlp) v.has_mlp = *k.has_mlp;
        if (v.experts == 0) {  // a dense kind of a MoE model routes nothing and shares no expert
            v.experts_per_token = 0, v.shared_ffn = 0, v.shared_expert_gate = false;
            v.router_bias = RouterBias::none;
        }
        return v;
    }
    /// Whether `test` holds for the view of every kind that has layers.
    template <class Test>
    bool every_kind(Test test) const {
        if (layer_kinds.empty()) return test(*this);
        for (std::size_t k = 0; k < kind_count(); ++k)
            if (layers_of_kind(k) > 0 && !test(kind_view(k))) return false;
        return true;
    }
    /// How many different attention masks the layers need: one per (window, chunk) pair, full
    /// causal attention counting as one.
    std::uint64_t distinct_windows() const {
        std::vector<std::pair<std::uint64_t, std::uint64_t>> seen;
        for (std::size_t k = 0; k < kind_count(); ++k) {
            if (!layer_kinds.empty() && layers_of_kind(k) == 0) continue;
            const Architecture v = layer_kinds.empty() ? *this : kind_view(k);
            const std::pair mask{v.window, v.attention_chunk};
            if (std::find(seen.begin(), seen.end(), mask) == seen.end()) seen.push_back(mask);
        }
        return seen.size();
    }
    /// Whether any layer mixes with `mixer`.
    /// Whether some kind of layer's view satisfies `holds`.
    template <class Predicate>
    bool any_kind(Predicate holds) const {
        return !every_kind([&](const Architecture& v) { return !holds(v); });
    }
    bool any_mixer(Mixer mixer) const {
        return any_kind([&](const Architecture& v) { return v.mixer == mixer; });
    }
    /// Whether any layer has experts.
    bool any_moe() const {
        return any_kind([](const Architecture& v) { return v.is_moe(); });
    }
};

namespace detail {
inline void require_positive(const char* field, std::uint64_t value) {
    if (value == 0) throw error(std::string(field) + " must be a positive integer (got 0)");
}
}  // namespace detail

/// The timeline holds 2 L + 2 steps; real models have at most a few hundred layers.
inline constexpr std::uint64_t max_layers = 100000;

inline void validate(const Architecture& m);

/// The kinds and their pattern: every run names a kind, the runs cover every layer, and each kind's
/// view of the model is valid itself.
inline void validate_layer_kinds(const Architecture& m) {
    if (m.layer_kinds.empty() && m.layer_pattern.empty()) return;
    if (m.layer_kinds.empty() || m.layer_pattern.empty())
        throw error("layer_kinds and layer_pattern go together: give both or neither");
    if (m.layer_kinds.size() > max_layer_kinds)
        throw error("layer_kinds has " + std::to_string(m.layer_kinds.size()) +
                    " kinds; memcalc models at most " + std::to_string(max_layer_kinds));
    std::uint64_t covered = 0;
    for (const auto& run : m.layer_pattern) {
        if (run.kind >= m.layer_kinds.size())
            throw error("layer_pattern names kind " + std::to_string(run.kind) + " of " +
                        std::to_string(m.layer_kinds.size()));
        if (run.count == 0)
            throw error("a layer_pattern run of '" + m.layer_kinds[run.kind].name +
                        "' has 0 layers");
        covered += std::min(run.count, max_layers + 1);
        covered = std::min(covered, max_layers + 1);
    }
    if (covered != m.layers)
        throw error("layer_pattern covers " +
                    (covered > max_layers ? "more than " + std::to_string(max_layers)
                                          : std::to_string(covered)) +
                    " layers; the model has " + std::to_string(m.layers));
    for (std::size_t k = 0; k < m.layer_kinds.size(); ++k) {
        try {
            validate(m.kind_view(k));
        } catch (const error& e) {
            throw error("layer kind '" + m.layer_kinds[k].name + "': " + e.what());
        }
    }
}

/// The lightning indexer's widths: all three or none; its q reads the query latent and its heads
/// split rotary's width off the front.
inline void validate_sparse_indexer(const LatentAttention& a) {
    if (!a.indexed()) {
        for (auto [field, value] :
             {std::pair{"index_head_dim", a.index_head_dim}, {"index_topk", a.index_topk}})
            if (value != 0)
                throw error(std::string(field) + " (" + std::to_string(value) +
                            ") is a width of the sparse-attention indexer: it needs index_n_heads");
        return;
    }
    detail::require_positive("index_topk", a.index_topk);
    if (a.q_lora_rank == 0)
        throw error("index_n_heads (" + std::to_string(a.index_heads) +
                    "): the indexer's q reads the query latent, which needs q_lora_rank > 0");
    if (a.index_head_dim < a.qk_rope_head_dim || a.index_head_dim == 0)
        throw error("index_head_dim (" + std::to_string(a.index_head_dim) +
                    ") must hold the rotary part, qk_rope_head_dim (" +
                    std::to_string(a.qk_rope_head_dim) + ")");
}

/// Latent attention's widths, and the fields of standard attention it replaces or cannot have.
inline void validate_latent_attention(const Architecture& m) {
    const LatentAttention& a = m.mla;
    if (!a.enabled()) {
        for (auto [field, value] : {std::pair{"q_lora_rank", a.q_lora_rank},
                                    {"qk_nope_head_dim", a.qk_nope_head_dim},
                                    {"qk_rope_head_dim", a.qk_rope_head_dim},
                                    {"v_head_dim", a.v_head_dim},
                                    {"index_n_heads", a.index_heads}})
            if (value != 0)
                throw error(std::string(field) + " (" + std::to_string(value) +
                            ") is a width of latent attention: it needs kv_lora_rank > 0");
        return;
    }
    detail::require_positive("qk_nope_head_dim", a.qk_nope_head_dim);
    detail::require_positive("qk_rope_head_dim", a.qk_rope_head_dim);
    detail::require_positive("v_head_dim", a.v_head_dim);
    if (a.qk_rope_head_dim % 2 != 0)
        throw error("qk_rope_head_dim must be even: rotary turns pairs (got " +
                    std::to_string(a.qk_rope_head_dim) + ")");
    if (m.head_dim != 0 && m.head_dim != a.qk_head_dim())
        throw error("head_dim (" + std::to_string(m.head_dim) +
                    ") is qk_nope_head_dim + qk_rope_head_dim (" + std::to_string(a.qk_head_dim()) +
                    ") under latent attention");
    if (m.key_value_heads() != m.heads)
        throw error("kv_heads (" + std::to_string(m.kv_heads) +
                    ") must equal heads under latent attention: kv_b_proj "
                    "makes k and v for every head");
    if (m.fused_qkv)
        throw error(
            "fused_qkv with latent attention: its q and kv projections are low-rank pairs, "
            "no q/k/v linear to fuse");
    if (m.position != Position::rotary)
        throw error("latent attention needs position rotary: its rope parts are rotary");
    if (m.qk_norm != QkNorm::none)
        throw error(std::string("qk_norm ") + qk_norm_name(m.qk_norm) +
                    " is not a norm of latent attention");
    if (m.attention_output_gate)
        throw error("attention_output_gate under latent attention is not modelled");
    if (m.bias == Bias::qkv || m.bias == Bias::all)
        throw error(
            "bias under latent attention is none or attention (attention_bias: q_a_proj, "
            "kv_a_proj_with_mqa "
            "and o_proj)");
    validate_sparse_indexer(a);
}

/// A layer of one block (no mixer, or no MLP): it holds the other, with its own norm before it.
inline void validate_single_block(const Architecture& m) {
    if (m.mixer != Mixer::none && m.has_mlp) return;
    if (m.mixer == Mixer::none && !m.has_mlp)
        throw error("mixer none with has_mlp false: a layer holds no block");
    if (m.parallel_attention || m.norms_per_layer != 2)
        throw error(std::string(m.has_mlp ? "mixer none" : "has_mlp false") +
                    " (a layer of one block) needs norms_per_layer 2 and no parallel_attention");
}

/// A Mamba layer's widths: all given where a layer is one, none where none is.
inline void validate_state_space(const Architecture& m) {
    const StateSpace& x = m.ssm;
    if (!state_space(m.mixer)) return;  // each kind's view is validated in turn
    detail::require_positive("mamba_inner", x.d_inner);
    detail::require_positive("mamba_state", x.d_state);
    detail::require_positive("mamba_conv", x.d_conv);
    if (m.mla.enabled())
        throw error(std::string("mixer ") + mixer_name(m.mixer) +
                    " with latent attention: a layer has one mixer");
    if (m.mixer == Mixer::mamba) return detail::require_positive("mamba_dt_rank", x.dt_rank);
    detail::require_positive("mamba_heads", x.heads);
    detail::require_positive("mamba_groups", x.groups);
    detail::require_positive("mamba_chunk", x.chunk);
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    if (x.d_inner % x.heads != 0)
        throw error("mamba_heads (" + n(x.heads) + ") must divide mamba_inner (" + n(x.d_inner) +
                    ")");
    if (x.heads % x.groups != 0)
        throw error("mamba_groups (" + n(x.groups) + ") must divide mamba_heads (" + n(x.heads) +
                    ")");
    if (!x.kernels && m.mixer == Mixer::gated_deltanet)
        throw error(
            "mixer gated_deltanet without fla's kernels (mamba_kernels false: transformers' "
            "torch_chunk_gated_delta_rule) is not modelled");
    if (!x.kernels)
        throw error(
            "mixer mamba2 without mamba_ssm's kernels (mamba_kernels false: transformers' "
            "torch_forward) is not modelled; its Mamba-2 layers run mamba_ssm's "
            "mamba_split_conv1d_scan_combined when mamba_ssm and causal_conv1d are installed");
}

// validate's pieces, in its order: the first field that fails names the error.

/// The widths, the layer count and the heads.
inline void validate_widths(const Architecture& m) {
    detail::require_positive("hidden", m.hidden);
    detail::require_positive("layers", m.layers);
    if (m.layers > max_layers)
        throw error("layers (" + std::to_string(m.layers) + ") exceeds the " +
                    std::to_string(max_layers) + " that memcalc models");
    detail::require_positive("heads", m.heads);
    detail::require_positive("ffn", m.ffn);
    detail::require_positive("vocab", m.vocab);
    if (m.head_dim == 0 && !m.mla.enabled() && m.hidden % m.heads != 0)
        throw error("heads (" + std::to_string(m.heads) + ") must divide hidden (" +
                    std::to_string(m.hidden) + ") unless head_dim is given");
    if (m.key_value_heads() > m.heads || m.heads % m.key_value_heads() != 0)
        throw error("kv_heads (" + std::to_string(m.kv_heads) + ") must divide heads (" +
                    std::to_string(m.heads) + ")");
}

/// The tables' sizes: learned positions', a causal mask buffer's, the token embedding's.
inline void validate_position_tables(const Architecture& m) {
    if (m.position == Position::learned && m.learned_positions() == 0)
        throw error(
            "max_positions must be a positive integer for learned position embeddings (got 0)");
    if (causal_mask_buffer(m.causal_mask_buffer).registered && m.max_positions == 0)
        throw error("max_positions must be a positive integer for causal_mask_buffer " +
                    std::string(causal_mask_buffer(m.causal_mask_buffer).name) + " (got 0)");
    // The head's rows index the embedding's: more rows there are tokens the head never predicts.
    if (m.embedding_rows != 0 && m.embedding_rows < m.vocab)
        throw error("embedding_rows (" + std::to_string(m.embedding_rows) +
                    ") must be at least vocab (" + std::to_string(m.vocab) + ")");
    if (m.tied_embeddings && m.token_embedding_rows() != m.vocab)
        throw error("embedding_rows (" + std::to_string(m.embedding_rows) +
                    ") must be vocab under tied_embeddings: the head is the embedding");
}

/// A cross-attention layer reads the vision tower's states beside a layer of the usual shape.
inline void validate_cross_attention(const Architecture& m) {
    if (m.mixer != Mixer::cross_attention) return;
    if (!m.vision.enabled())
        throw error("mixer cross_attention reads a vision tower's states: give the vision keys");
    if (m.mla.enabled() || m.parallel_attention || m.norms_per_layer != 2 || !m.has_mlp)
        throw error(
            "mixer cross_attention is mllama's layer: standard attention, then an MLP, "
            "norms_per_layer 2, no parallel_attention");
}

/// The norms in a layer and where they stand.
inline void validate_norms(const Architecture& m) {
    if (m.norms_per_layer != 1 && m.norms_per_layer != 2 && m.norms_per_layer != 4)
        throw error("norms_per_layer must be 1, 2 or 4 (got " + std::to_string(m.norms_per_layer) +
                    ")");
    if (m.norm_position == NormPosition::post && (m.norms_per_layer != 2 || m.parallel_attention))
        throw error(
            "norm_position post needs norms_per_layer 2 and a sequential layer (got "
            "norms_per_layer " +
            std::to_string(m.norms_per_layer) +
            (m.parallel_attention ? ", parallel_attention)" : ")"));
    if (m.norms_per_layer == 1 && !m.parallel_attention)
        throw error(
            "norms_per_layer 1 needs parallel_attention: a sequential layer normalises twice");
    // Of the dense layers' MLP: experts' and shared experts' linears are never fused.
    if (m.fused_gate_up && m.mlp != Mlp::gated)
        throw error("fused_gate_up needs a gated MLP, a gate and an up to fuse (mlp is plain)");
}

/// The routed and shared experts and their router.
inline void validate_experts(const Architecture& m) {
    if (!m.is_moe() && m.experts_per_token != 0)
        throw error("experts_per_token (" + std::to_string(m.experts_per_token) +
                    ") needs experts > 0");
    if (m.is_moe() && m.active_experts() > m.experts)
        throw error("experts_per_token (" + std::to_string(m.experts_per_token) +
                    ") must not exceed experts (" + std::to_string(m.experts) + ")");
    if (!m.is_moe() && m.shared_ffn != 0)
        throw error("shared_ffn (" + std::to_string(m.shared_ffn) +
                    ") needs experts > 0: a shared expert sits beside routed ones");
    if (m.shared_expert_gate && m.shared_ffn == 0)
        throw error("shared_expert_gate needs shared_ffn > 0");
    if (m.shared_ffn != 0 && m.bias == Bias::all)
        throw error("shared_ffn with bias all (biased shared experts) is not modelled");
    if (!m.is_moe() && m.router_bias != RouterBias::none)
        throw error("router_bias needs experts > 0");
    if (!(m.expert_imbalance >= 1.0 && m.expert_imbalance <= 1e6))
        throw error("expert_imbalance must be a number from 1 to 1e6 (got " +
                    std::to_string(m.expert_imbalance) + ")");
    if (!m.is_moe() && m.expert_imbalance != 1.0) throw error("expert_imbalance needs experts > 0");
    if (m.is_moe() && m.router == Router::sparsemixer && m.active_experts() != 2)
        throw error("router sparsemixer picks 2 experts (got experts_per_token " +
                    std::to_string(m.active_experts()) + ")");
}

/// Throws memcalc::error naming the first field that makes the architecture impossible.
inline void validate(const Architecture& m) {
    validate_widths(m);
    validate_position_tables(m);
    if ((m.qk_norm == QkNorm::per_head || m.qk_norm == QkNorm::whole) && m.norm != Norm::rmsnorm)
        throw error(std::string("qk_norm ") + (m.qk_norm == QkNorm::whole ? "whole" : "per_head") +
                    " is an RMSNorm: it needs norm rmsnorm");
    if (m.position == Position::rotary && rotary_embedding(m.rotary_embedding).cached &&
        m.max_positions == 0)
        throw error(
            "max_positions must be a positive integer for rotary_embedding per_layer_cached (got "
            "0)");
    validate_norms(m);
    for (auto [field, p] : {std::pair{"attention_dropout", m.attention_dropout},
                            {"hidden_dropout", m.hidden_dropout},
                            {"mlp_dropout", m.mlp_dropout}})
        if (!(p >= 0 && p < 1))
            throw error(std::string(field) + " must be a probability in [0, 1) (got " +
                        std::to_string(p) + ")");
    validate_latent_attention(m);
    validate_state_space(m);
    validate_single_block(m);
    validate_cross_attention(m);
    validate_experts(m);
    if (m.mtp_layers > m.layers)
        throw error("mtp_layers " + std::to_string(m.mtp_layers) + " is more than the model's " +
                    std::to_string(m.layers) + " layers");
    if (!(m.input_jitter >= 0 && m.input_jitter < 1))
        throw error("input_jitter must be in [0, 1) (got " + std::to_string(m.input_jitter) + ")");
    if (m.is_moe() && m.expert_dispatch == ExpertDispatch::every_token &&
        (m.mlp != Mlp::gated || m.bias == Bias::all))
        throw error(
            "expert_dispatch every_token is Llama4TextMoe's: it needs gated, bias-free experts");
    validate_layer_kinds(m);
    validate(m.vision);
}

/// The model as messages name it: its name, or "the model" when it has none.
inline std::string model_name(const Architecture& m) {
    return m.name.empty() ? std::string("the model") : m.name;
}

}  // namespace memcalc
