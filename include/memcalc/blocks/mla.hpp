#pragma once
/// Latent attention (DeepSeek's MLA).
#include <string>

#include "memcalc/blocks/attention_parts.hpp"

namespace memcalc::detail {

/// Latent attention's shapes (r_q, r_kv: the latents; d_n, d_r, d_v: the nope, rotary and v widths
/// per head). Megatron-LM's down projections are whole on every tensor-parallel rank, and so are
/// the latents they make (gathered across the sequence under sequence parallelism).
namespace latent_shape {
inline constexpr Shape sbrq{"sb(r_q)", ActivationSplit::replicated};    ///< the query latent
inline constexpr Shape sbrkv{"sb(r_kv)", ActivationSplit::replicated};  ///< the key/value latent
inline constexpr Shape sbrkvr{"sb(r_kv+d_r)",
                              ActivationSplit::replicated};  ///< the latent beside k's rotary part
inline constexpr Shape sb{"sb", ActivationSplit::replicated};  ///< a value per token of a latent
inline constexpr Shape sbqk{"sb(a(d_n+d_r))", ActivationSplit::tensor};  ///< q or k at every head
inline constexpr Shape sbkvb{"sb(a(d_n+d_v))",
                             ActivationSplit::tensor};  ///< kv_b_proj's output: k's nope part and v
inline constexpr Shape sbv{"sb(a d_v)", ActivationSplit::tensor};  ///< v, or the attention's output
}  // namespace latent_shape

/// Latent attention as transformers' DeepseekV3Attention (and V2's) runs it:
/// q_b_proj(q_a_layernorm( q_a_proj(x))) or q_proj(x); kv_a_proj_with_mqa(x) split into the latent
/// and k's rotary part; kv_b_proj( kv_a_layernorm(latent)) split into k's nope part and v; rotary
/// on q's and k's rope parts (q * cos saves cos alone: a shared table); q and k concatenated from
/// their parts, k's rope part expanded to every head. The kernel saves q, k and v: eager matmul
/// keeps a view of v, and so kv_b_proj's whole output, unless b > 1 makes it copy v;
/// flash_attention_2 pads v to q's width with F.pad (a new tensor) when d_v != d_n + d_r;
/// Megatron-LM copies v contiguous for Transformer Engine's kernel (latent_v_padded false).
/// Megatron-LM's mla_up_proj recomputation drops the up projections' outputs (q, k, v: the rows
/// that say so) and keeps their inputs. The projections' part: the down projections, the latents'
/// norms, the up projections' inputs and rotary; returns whether the op-level policy saves
/// kv_b_proj's output.
inline bool latent_projection_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    namespace ls = latent_shape;
    const LatentAttention& a = m.mla;
    const bool biased = m.bias == Bias::attention, q_latent = a.q_lora_rank > 0;
    const Count latent_q = z.tokens * a.q_lora_rank, latent_kv = z.tokens * a.kv_lora_rank;
    const Count latent_and_rope = z.tokens * (a.kv_lora_rank + a.qk_rope_head_dim);
    // The op-level policy counts the mms in forward order: q_a_proj or q_proj, q_b_proj,
    // kv_a_proj_with_mqa, kv_b_proj. Its outputs count as extra even where a norm keeps that very
    // storage (fp32): leaning high.
    const std::string first =
        q_latent ? "q_a_proj and kv_a_proj_with_mqa" : "q_proj and kv_a_proj_with_mqa";
    const LinearSet first_readers = bit(q_latent ? Linear::q_a : Linear::q) | bit(Linear::kv_a);
    projection_input_row(t, z, first, "their input", z.sbh, shape::sbh, 2, {}, first_readers,
                         RowFacts{}.output_of_norm(!z.autocast && !z.narrow));
    adapter_rows(t, z, first, first_readers, z.tokens, z.sbh, shape::sbh, z.s);
    if (q_latent) {
        t.policy_output(t.linear_saved(biased, latent_q, m.hidden), "q_a_proj", "its output",
                        ls::sbrq, latent_q, z.d);
        rmsnorm_rows(t, z, "q_a_layernorm", ls::sbrq, latent_q, ls::sb, z.tokens, "token", z.d,
                     m.rmsnorm_fp32_scale);
        projection_input_row(t, z, "q_b_proj", "its input (the normalised query latent)", latent_q,
                             ls::sbrq, 1, {}, bit(Linear::q_b));
        adapter_rows(t, z, "q_b_proj", bit(Linear::q_b), z.tokens, latent_q, ls::sbrq, z.d);
    }
    t.policy_output(t.linear_saved(false, z.sbq, q_latent ? a.q_lora_rank : m.hidden),
                    q_latent ? "q_b_proj" : "q_proj", "its output", ls::sbqk, z.sbq, z.d);
    t.policy_output(t.linear_saved(biased, latent_and_rope, m.hidden), "kv_a_proj_with_mqa",
                    "its output", ls::sbrkvr, latent_and_rope, z.d);
    // The latent is a slice of kv_a_proj_with_mqa's output: in fp32, x.to(float32) is that view
    // itself.
    rmsnorm_rows(t, z, "kv_a_layernorm", ls::sbrkv, latent_kv, ls::sb, z.tokens, "token", z.d,
                 m.rmsnorm_fp32_scale,
                 SavedStorage{"kv_a_proj_with_mqa's output, which its input views (fp32)",
                              ls::sbrkvr, latent_and_rope});
    projection_input_row(t, z, "kv_b_proj", "its input (the normalised key/value latent)",
                         latent_kv, ls::sbrkv, 1, {}, bit(Linear::kv_b));
    adapter_rows(t, z, "kv_b_proj", bit(Linear::kv_b), z.tokens, latent_kv, ls::sbrkv, z.d);
    const bool kv_b_saved = t.linear_saved(
        false, z.tokens * m.heads * (a.qk_nope_head_dim + a.v_head_dim), a.kv_lora_rank);
    rotary_rows(t, m, z);
    // The input read by both down projections; kv_a_proj_with_mqa's output split into the latent
    // and k's rope part.
    t.launch(LaunchOp::gradient_sum);
    t.launch(LaunchOp::split);
    return kv_b_saved;
}

/// Latent attention's kernel inputs (latent_projection_rows' doc): q, k and v as the kernel keeps
/// them, which Megatron-LM's mla_up_proj recomputation drops and reruns.
inline void latent_kernel_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                               Attention attention, bool kv_b_saved) {
    namespace ls = latent_shape;
    const LatentAttention& a = m.mla;
    const bool eager = attention == Attention::eager;
    const Count latent_and_rope = z.tokens * (a.kv_lora_rank + a.qk_rope_head_dim);
    const Count kv_b_out = z.tokens * m.heads * (a.qk_nope_head_dim + a.v_head_dim);
    const std::string dropped = "; Megatron's mla_up_proj recomputation drops it";
    const bool padded = !eager && a.v_head_dim != m.head_size() && m.latent_v_padded;
    const bool copied = !eager && !m.latent_v_padded;  // value.contiguous(), at its own width
    const bool viewed =
        !eager || z.tokens == Count(z.seq);  // as qkv_rows: matmul copies a strided v when b > 1
    // Megatron-LM's mla_up_proj: the up projections and rotary rerun from the normalised latents
    // (their rows above) and k's rope part before rotary, a view that keeps kv_a_proj_with_mqa's
    // whole output (which in fp32 the latent's norm keeps already).
    t.section(Module::mla_up_proj);
    // q and kv_b_proj's output split into their parts; rotary on q's and k's rope parts, k's
    // expanded to every head; q and k concatenated (transformers' DeepseekV3Attention).
    t.launch(LaunchOp::split, 2);
    t.launch(LaunchOp::rotary, 2);
    t.launch(LaunchOp::expand_gradient);
    t.launch(LaunchOp::concat, 2);
    if (z.d != dtype::fp32)
        t.checkpoint_input(
            "k's rope part before rotary: kv_a_proj_with_mqa's output, which it views", ls::sbrkvr,
            latent_and_rope, z.d);
    const std::string kernel = eager ? "attention over V" : "flash attention";
    const std::string v_why = eager ? "the gradient w.r.t. the weights is the output's gradient x v"
                                    : "the kernel's backward reads v";
    if (padded || copied) {
        t.policy_output(kv_b_saved, "kv_b_proj", "its output", ls::sbkvb, kv_b_out, z.d);
    } else {
        t.add(kernel, "kv_b_proj's output (k's nope part and v), which v views", v_why + dropped,
              ls::sbkvb, kv_b_out, z.d, viewed ? Keep::always : Keep::only_selective, 1,
              RowFacts{}.saved_by_policy(kv_b_saved));
        if (!viewed) {  // matmul's copy, inside the core attention
            const Module up = t.section(Module::attention);
            t.add(kernel, "v, copied contiguous by matmul", v_why, ls::sbv, z.sbv, z.d,
                  Keep::not_selective);
            t.section(up);
        }
    }
    const std::string qk_op = eager ? "Q K^T" : "flash attention";
    t.add(qk_op, "q: its nope part and its rotated rope part, concatenated",
          "the gradient w.r.t. k is q x the scores' gradient" + dropped, ls::sbqk, z.sbq, z.d);
    t.add(qk_op,
          "k: kv_b_proj's nope part and the rotated rope part expanded to every head, concatenated",
          "the gradient w.r.t. q is the scores' gradient x k" + dropped, ls::sbqk, z.sbq, z.d);
    if (padded)
        t.add(kernel, "v, padded to q's head width (F.pad)", v_why + dropped, ls::sbqk, z.sbq, z.d);
    if (copied) t.add(kernel, "v, copied contiguous", v_why + dropped, ls::sbv, z.sbv, z.d);
    t.section(Module::attention);
}

/// Latent attention (latent_projection_rows, then latent_kernel_rows).
inline void latent_attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                                  Attention attention) {
    latent_kernel_rows(t, m, z, attention, latent_projection_rows(t, m, z));
}

}  // namespace memcalc::detail
