#pragma once
/// Attention's inputs: q, k and v as the products keep them, q/k norms, rotary, temperature.
#include <string>

#include "memcalc/blocks/norm.hpp"
#include "memcalc/blocks/linear.hpp"

namespace memcalc::detail {

/// Whether the layer scales its queries by a per-position temperature (Llama 4's NoPE layers).
inline bool temperature_tuned(const Architecture& m) {
    return m.attention_temperature && m.position == Position::none;
}

inline constexpr Shape per_position{
    "s", ActivationSplit::replicated};  ///< a value per position, any batch

/// Llama 4's attn_temperature_tuning: q times log1p(floor((position + 1) / floor_scale)) x
/// attn_scale + 1, scales of (1, s, 1, 1) in fp32 expanded over the batch, which the product keeps
/// (its fp32 result is cast back: a new q of the same size, which the q row counts).
inline void temperature_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (!temperature_tuned(m)) return;
    t.add("attention temperature (q x scales)", "the per-position scales, fp32",
          "q's gradient is scaled by them", per_position, Count(z.seq), dtype::fp32);
}

/// Whether k and v reach the attention copied to every query head: eager attention's code repeats
/// grouped heads, and a fused kernel's caller may (Architecture::repeat_kv).
inline bool repeats_kv(const Architecture& m, Attention attention) {
    return m.key_value_heads() < m.heads && (attention == Attention::eager || m.repeat_kv);
}

/// v, a view of one fused linear's output, keeps all of it where q and k became copies (rotary):
/// q's and k's parts beside v's (lit-gpt's qkv.split; validation/third_party/litgpt_run.py).
inline void fused_output_rows(TableBuilder& t, const Sizes& z, const std::string& op) {
    const char* why = "v is a view of the fused q/k/v output, which it keeps whole";
    t.add(op, "q's part of the fused q/k/v output", why, shape::sbq, z.sbq, z.d);
    t.add(op, "k's part of the fused q/k/v output", why, z.keyed.kv, z.sbkv, z.d);
}

/// q, k and v as the attention products keep them. With fewer key/value heads than query heads,
/// eager attention repeats k and v to every head (a copy); selective recomputation's checkpoint
/// keeps the un-repeated k and v instead.
/// The op-level policy's q, k and v projection outputs: a row where the attention saves that very
/// storage (no rotary, no repeat, and the fused kernel's input or, at micro-batch 1, a view matmul
/// keeps), else an output of its own; eager attention's matmul copies a transposed operand when b
/// > 1.
inline void qkv_rows(TableBuilder& t, const Architecture& m, const Sizes& z, Attention attention) {
    const bool rotary = m.position == Position::rotary;
    // q and k are no longer the projections' outputs (the temperature makes a new q; k stays
    // counted as changed).
    const bool changed = rotary || m.qk_norm != QkNorm::none || temperature_tuned(m);
    const bool repeated = repeats_kv(m, attention);
    const bool qkv_bias = m.bias != Bias::none;
    if (repeated) t.launch(LaunchOp::repeat_kv, 2);  // k and v
    // Eager attention's Q K^T hands k's gradient back transposed: copied for the reshape's.
    if (repeated && attention == Attention::eager) t.launch(LaunchOp::gradient_copy);
    const bool saved[3] = {t.linear_saved(qkv_bias, z.sbq, m.hidden),
                           t.linear_saved(qkv_bias, z.sbkv, m.hidden),
                           t.linear_saved(qkv_bias, z.sbkv, m.hidden)};
    const bool viewed = attention == Attention::flash || z.tokens == Count(z.seq);
    const bool shared[3] = {!changed && viewed, !changed && !repeated && viewed,
                            !repeated && viewed};
    const char* names[3] = {"q projection", "k projection", "v projection"};
    for (int i = 0; i < 3; ++i)
        t.policy_output(saved[i] && !shared[i], names[i], "its output",
                        i == 0 ? shape::sbq : z.keyed.kv, i == 0 ? z.sbq : z.sbkv, z.d);
    t.add("Q K^T", rotary ? "q after rotary" : "q",
          "the gradient w.r.t. k is q x the scores' gradient", shape::sbq, z.sbq, z.d, Keep::always,
          1, RowFacts{}.saved_by_policy(saved[0] && shared[0]));
    for (int i : {1, 2}) {
        const bool key = i == 1;
        const std::string what =
            std::string(key ? "k" : "v") + (rotary && key ? " after rotary" : "");
        const std::string op = key ? "Q K^T" : "attention over V";
        const std::string why =
            key ? "the gradient w.r.t. q is the scores' gradient x k"
                : "the gradient w.r.t. the weights is the output's gradient x v";
        if (repeated) {  // every query head's copy: s b a d, or the images' tokens' (cross)
            t.add(op, what + ", repeated to every query head", why, z.keyed.repeated,
                  z.sbkv * (m.heads / m.key_value_heads()), z.d, Keep::not_selective);
            t.add("selective checkpoint", what + " (k heads), an input of the core attention",
                  "the checkpoint reruns the core attention from it", z.keyed.kv, z.sbkv, z.d,
                  Keep::only_selective);
        } else {
            t.add(op, what, why, z.keyed.kv, z.sbkv, z.d, Keep::always, 1,
                  RowFacts{}.saved_by_policy(saved[i] && shared[i]));
        }
        if (!key && m.fused_qkv && changed && shared[2]) fused_output_rows(t, z, op);
    }
}

/// q_norm and k_norm, before rotary: an RMSNorm of each head's projection output (Qwen3's, Gemma
/// 3's), or of the whole projection output, one 1/rms per token (OLMo 2's). Llama 4's L2 norm comes
/// after rotary, weightless: x.float() (a copy), x * rsqrt(mean(x^2) + eps), cast back; its fp32
/// copy and the 1/rms per head and token are kept.
inline void qk_norm_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const bool fp32 = m.rmsnorm_fp32_scale;
    if (m.qk_norm == QkNorm::l2) {
        rmsnorm_rows(t, z, "q L2 norm", shape::sbq, z.sbq, shape::asb, z.tokens * m.heads,
                     "query head and token", z.d, false, std::nullopt, false);
        rmsnorm_rows(t, z, "k L2 norm", z.keyed.kv, z.sbkv, z.keyed.per_head,
                     z.key_tokens * m.key_value_heads(), "key head and token", z.d, false,
                     std::nullopt, false);
    } else if (m.qk_norm == QkNorm::per_head) {
        rmsnorm_rows(t, z, "q_norm", shape::sbq, z.sbq, shape::asb, z.tokens * m.heads,
                     "query head and token", z.d, fp32);
        rmsnorm_rows(t, z, "k_norm", z.keyed.kv, z.sbkv, z.keyed.per_head,
                     z.key_tokens * m.key_value_heads(), "key head and token", z.d, fp32);
    } else if (m.qk_norm == QkNorm::whole) {
        rmsnorm_rows(t, z, "q_norm (whole width)", shape::sbq, z.sbq, shape::sb, z.tokens, "token",
                     z.d, fp32);
        rmsnorm_rows(t, z, "k_norm (whole width)", shape::sbkv, z.sbkv, shape::sb, z.tokens,
                     "token", z.d, fp32);
    }
}

/// The cos and sin a layer's own rotary embedding makes (rotary_embeddings' per-layer rows): of
/// (1, s, head_dim) whatever the batch (position_ids is (1, s)), in v's dtype, the compute dtype; q
/// * cos and rotate_half(q) * sin save them, and k's products the same two. Outside selective
/// recomputation's checkpoint, so only full recomputation drops them.
inline void rotary_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.position != Position::rotary || !rotary_embedding(m.rotary_embedding).per_layer_tables)
        return;
    t.launch(rotary_embedding(m.rotary_embedding).table_launches);
    t.add("rotary embedding (this layer's)", "cos and sin for the sequence's positions",
          "q and k were multiplied by them", shape::sd, Count(z.seq) * m.rotary_dim(), z.d,
          Keep::always, 2);
}

}  // namespace memcalc::detail
