#pragma once
/// The compute side of the trade: matrix-multiply FLOPs of one training step and what
/// recomputation adds. Floating point, because a large run's FLOPs exceed 2^64.
#include <algorithm>
#include <array>
#include <cstdint>

#include "memcalc/activations.hpp"
#include "memcalc/layers.hpp"
#include "memcalc/model.hpp"

namespace memcalc {

/// A figure for each kind of layer.
using KindFlops = std::array<double, max_layer_kinds>;

struct ComputeCost {
    double attention_core = 0;  ///< of a layer's forward, Q K^T and attention over V
    double head_forward = 0;    ///< the output head's logits (and multi-token prediction's)
    KindFlops kind_forward{};   ///< one layer's forward pass of each kind
    double step = 0;            ///< forward + backward (twice the forward), no recomputation
    double recompute = 0;       ///< what the chosen recomputation adds
    double recompute_fraction() const { return step > 0 ? recompute / step : 0; }
    /// One layer's forward pass (the first kind's, when layers differ).
    double layer_forward() const { return kind_forward[0]; }
};

namespace detail {

/// The attention's projections' FLOPs over `T` tokens: q (and its output gate), k, v and the
/// output projection, or latent attention's down and up projections, then o_proj.
inline double projection_flops(const Architecture& m, double T) {
    const double h = static_cast<double>(m.hidden);
    const double q = static_cast<double>(m.heads * m.head_size());
    const double kv = static_cast<double>(m.key_value_heads() * m.head_size());
    const double v =
        static_cast<double>(m.heads * m.value_head_size());  // = q but under latent attention
    const double gate = m.attention_output_gate ? q : 0;     // q_proj's second half
    if (!m.mla.enabled()) return 2 * T * h * (q + gate + 2 * kv) + 2 * T * q * h;
    const LatentAttention& a = m.mla;
    const double latent = static_cast<double>(a.kv_lora_rank),
                 rope = static_cast<double>(a.qk_rope_head_dim);
    const double nope_and_v = static_cast<double>(m.heads * (a.qk_nope_head_dim + a.v_head_dim));
    const double q_side = a.q_lora_rank == 0 ? h * q : static_cast<double>(a.q_lora_rank) * (h + q);
    return 2 * T * (q_side + h * (latent + rope) + latent * nope_and_v + v * h);
}

/// DeepSeek-V3.2's indexer over `T` tokens of sequences of `seq`: wq_b, wk and weights_proj, the
/// scores of every key at each of its heads and their weighted sum; forward only (no_grad).
inline double indexer_flops(const Architecture& layer, double T, double seq) {
    const LatentAttention& a = layer.mla;
    if (!attends(layer.mixer) || !a.indexed()) return 0;
    const double A = static_cast<double>(a.index_heads), D = static_cast<double>(a.index_head_dim);
    const double h = static_cast<double>(layer.hidden);
    return 2 * T * (static_cast<double>(a.q_lora_rank) * A * D + h * (D + A)) +
           2 * T * seq * A * (D + 1);
}

/// A layer's feed-forward FLOPs over `T` tokens of width `h`: its active experts' (or its dense
/// MLP's) `mlp_matrices` products each, the router, a shared expert and its gate.
inline double mlp_flops(const Architecture& layer, double T, double h, double mlp_matrices) {
    if (!layer.has_mlp) return 0;
    return 2 * T * h * static_cast<double>(layer.ffn) * mlp_matrices *
               static_cast<double>(layer.active_experts()) +
           (layer.is_moe() ? 2 * T * h * static_cast<double>(layer.experts) : 0) +
           2 * T * h * static_cast<double>(layer.shared_ffn) * mlp_matrices +
           (layer.shared_expert_gate ? 2 * T * h : 0);
}

/// A Mamba mixer's matrices (in_proj, x_proj, dt_proj, out_proj) over `T` tokens of width `h`; its
/// scan and convolution are element-wise, left out as the rest are.
inline double mamba_mixer_flops(const Architecture& layer, double T, double h) {
    const StateSpace& x = layer.ssm;
    return 2 * T * static_cast<double>(x.d_inner) *
           (3 * h + static_cast<double>(x.dt_rank + 2 * x.d_state) +
            static_cast<double>(x.dt_rank));
}

/// A Mamba-2 mixer's matrices over `T` tokens of width `h` in sequences of `seq`: in_proj and
/// out_proj, and the state-space duality's chunked products (Dao and Gu 2024, section 6;
/// mamba_ssm's ssd_combined.py): per chunk of Q tokens, C B^T in each group (2 T Q G N), its masked
/// product with x (2 T Q d_i), each chunk's state B^T x (2 T N d_i) and the states read out by C (2
/// T N d_i). Q is the chunk or the sequence if shorter; every block counted whole, its causal half
/// too (leaning high).
inline double mamba2_mixer_flops(const Architecture& layer, double T, double h, double seq) {
    const StateSpace& x = layer.ssm;
    const double di = static_cast<double>(x.d_inner), N = static_cast<double>(x.d_state);
    const double Q = std::min(static_cast<double>(x.chunk), seq);
    const double groups = static_cast<double>(x.groups) * N;
    return 2 * T * h * static_cast<double>(x.in_proj_width()) + 2 * T * di * h +
           2 * T * Q * (di + groups) + 4 * T * N * di;
}

/// A Gated DeltaNet's matrices over `T` tokens of width `h` in sequences of `seq`: in_proj_qkvz,
/// in_proj_ba and out_proj, and per chunk of Q tokens (fla's chunk_gated_delta_rule) K K^T and Q
/// K^T in each head (4 T Q H N), w and u (2 T Q (H N + d_i)), the intra-chunk product with v (2 T
/// Q d_i), and the state's update and read-out (6 T N d_i). Every block counted whole (leaning
/// high).
inline double deltanet_mixer_flops(const Architecture& layer, double T, double h, double seq) {
    const StateSpace& x = layer.ssm;
    const double di = static_cast<double>(x.d_inner), N = static_cast<double>(x.d_state);
    const double HN = static_cast<double>(x.heads) * N;
    const double Q = std::min(static_cast<double>(x.chunk), seq);
    return 2 * T * h * static_cast<double>(x.deltanet_in_width()) + 2 * T * di * h +
           2 * T * Q * (3 * HN + 2 * di) + 6 * T * N * di;
}

/// mllama's cross-attention's core over `T` tokens, each against its sequence's N image tokens:
/// Q K^T and the weights over V.
inline double cross_attention_core_flops(const Architecture& layer, double T) {
    const double N = static_cast<double>(layer.cross_attention_tokens);
    return 4 * T * N * static_cast<double>(layer.heads * layer.head_size());
}

/// mllama's cross-attention over `T` tokens of sequences of `seq`: q and o over the tokens, k and
/// v over the images' (N T / seq), and its core. Zero in a step of text alone, which skips it.
inline double cross_attention_flops(const Architecture& layer, double T, double h, double seq) {
    const double N = static_cast<double>(layer.cross_attention_tokens);
    const double q = static_cast<double>(layer.heads * layer.head_size());
    const double kv = static_cast<double>(layer.key_value_heads() * layer.head_size());
    return 4 * T * h * q + 4 * (N * T / seq) * h * kv + cross_attention_core_flops(layer, T);
}

/// A layer's mixer's FLOPs over `T` tokens of sequences of `seq`: a Mamba mixer's, attention's
/// `projections` and `core`, or both side by side.
inline double mixer_flops(const Architecture& layer, double T, double h, double seq,
                          double projections, double core) {
    switch (layer.mixer) {
        case Mixer::mamba: return mamba_mixer_flops(layer, T, h);
        case Mixer::mamba2: return mamba2_mixer_flops(layer, T, h, seq);
        case Mixer::none: return 0;
        case Mixer::cross_attention: return cross_attention_flops(layer, T, h, seq);
        case Mixer::gated_deltanet: return deltanet_mixer_flops(layer, T, h, seq);
        case Mixer::attention_mamba2:
            return mamba2_mixer_flops(layer, T, h, seq) + projections + core;
        case Mixer::attention: break;
    }
    return projections + core;
}

}  // namespace detail

/// Of the layers' linear FLOPs, the attention projections' share (the rest the feed-forward
/// blocks'): what half of a layer's tensor-parallel collectives, a collective matmul's, run beside.
inline double projection_share(const Architecture& m) {
    double projections = 0, mlp = 0;
    const double h = static_cast<double>(m.hidden);
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        const Architecture v = m.layer_kinds.empty() ? m : m.kind_view(k);
        const double n = static_cast<double>(m.layers_of_kind(k));
        if (attends(v.mixer)) projections += n * detail::projection_flops(v, 1);
        mlp += n * detail::mlp_flops(v, 1, h, v.mlp == Mlp::gated ? 3 : 2);
    }
    return projections + mlp > 0 ? projections / (projections + mlp) : 0.5;
}

/// Counts 2 m n k per (m x k) . (k x n) product; element-wise ops are left out. Each kind of layer
/// counts its own feed-forward block, times its layers.
/// `modules`: what selective recomputation re-runs (the norms and the MoE activation: no matrix
/// products). `recomputed`: under partial recomputation, the layers of each kind that rerun their
/// forward (none: all). `spared`: under the op-level policy, the forward FLOPs of each kind of
/// layer whose outputs it saves (LayerActivations::policy_spared_flops; none: it reruns them all).
inline ComputeCost compute_cost(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch,
                                Recompute mode, ModuleSet modules = {},
                                const KindCounts* recomputed = nullptr,
                                const KindFlops* spared = nullptr) {
    const double T = static_cast<double>(seq) * static_cast<double>(micro_batch);  // tokens
    const double h = static_cast<double>(m.hidden);
    const double q = static_cast<double>(m.heads * m.head_size());
    const double mlp_matrices = m.mlp == Mlp::gated ? 3 : 2;

    ComputeCost c;
    const double v =
        static_cast<double>(m.heads * m.value_head_size());  // = q but under latent attention
    c.attention_core =
        2 * T * static_cast<double>(seq) * (q + v);  // Q K^T and (weights . V), every head
    const double projections = detail::projection_flops(m, T);
    c.head_forward = 2 * T * h * static_cast<double>(m.vocab);
    double forward = c.head_forward, no_backward = 0;
    const auto add_layers = [&](const Architecture& layer, std::uint64_t count, std::size_t kind) {
        const double mlp = detail::mlp_flops(layer, T, h, mlp_matrices);
        // A Mamba mixer's matrices in place of attention's.
        const double mixer = detail::mixer_flops(layer, T, h, static_cast<double>(seq), projections,
                                                 c.attention_core);
        const bool runs = layer.runs_in_step();  // mllama's cross-attention: only with images
        const double core = attends(layer.mixer) ? c.attention_core
                            : runs && layer.mixer == Mixer::cross_attention
                                ? detail::cross_attention_core_flops(layer, T)
                                : 0;
        const double indexer = detail::indexer_flops(layer, T, static_cast<double>(seq));
        const double layer_forward = runs ? mixer + mlp + indexer : 0;
        const double skipped =
            mode == Recompute::op && spared ? std::min((*spared)[kind], layer_forward) : 0;
        c.kind_forward[kind] = layer_forward;
        forward += static_cast<double>(count) * layer_forward;
        no_backward += static_cast<double>(count) * indexer;
        // Selective re-runs the modules it checkpoints (the core attention, and the MLP or MoE
        // block's matrix products where recompute_modules names them); full re-runs each layer's
        // whole forward pass, op all of it but what its policy saved.
        const double selective =
            (modules.has(Module::core_attn) ? core : 0) +
            (runs && modules.has(layer.is_moe() ? Module::moe : Module::mlp) ? mlp : 0);
        c.recompute += static_cast<double>(recomputed ? (*recomputed)[kind] : count) *
                       (checkpoints_layer(mode)        ? layer_forward - skipped
                        : mode == Recompute::selective ? selective
                                                       : 0);
    };
    if (m.layer_kinds.empty()) add_layers(m, m.layers, 0);
    for (std::size_t k = 0; k < m.layer_kinds.size(); ++k)
        add_layers(m.kind_view(k), m.layers_of_kind(k), k);
    // Multi-token prediction's modules, on the head's stage and never recomputed (Megatron-LM
    // core 0.13): each eh_proj (2h to h), a layer of the last kind and the logits again.
    const double mtp = static_cast<double>(m.mtp_layers) *
                       (2 * T * 2 * h * h + c.kind_forward[m.last_kind()] + c.head_forward);
    c.head_forward += mtp, forward += mtp;
    c.step = 3 * forward - 2 * no_backward;  // backward: twice the forward, where it runs
    return c;
}

}  // namespace memcalc
