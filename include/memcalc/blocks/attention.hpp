#pragma once
/// Attention: MHA/GQA with eager, fused (flash) and op-level policies, or MLA.
#include <algorithm>
#include <cstdint>
#include <string>

#include "memcalc/blocks/attention_parts.hpp"
#include "memcalc/blocks/dropout.hpp"
#include "memcalc/blocks/mla.hpp"
#include "memcalc/blocks/mlp_inputs.hpp"
#include "memcalc/blocks/output_projection.hpp"
#include "memcalc/blocks/prompt_adapter.hpp"
#include "memcalc/blocks/sparse_indexer.hpp"

namespace memcalc::detail {

/// Multi-head or grouped-query attention's inputs: the q/k/v projections' input, their norms,
/// rotary and temperature, q, k and v as the products keep them.
inline void mha_input_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                           Attention attention, bool reads_norm_output) {
    constexpr LinearSet qkv = bit(Linear::q) | bit(Linear::k) | bit(Linear::v);
    const bool shared = m.parallel_attention && m.norms_per_layer == 1 && !z.autocast && !z.narrow;
    const LinearSet mlp =
        m.is_moe() ? bit(Linear::router) : mlp_input_readers(m);  // reading it too
    // One fused linear's output is all three (its adapter's and its casts' too); else q's is the
    // largest of one.
    const LinearOutput qkv_out{z.sbq + z.sbkv * 2,
                               "sb(ad) + 2 sb(kd)",
                               Linear::q,
                               ActivationSplit::tensor,
                               m.fused_qkv ? Count(0) : z.sbq,
                               {}};
    // Without a norm before attention (OLMo 2) the projections read the layer's input itself.
    const bool itself = !z.autocast && !z.narrow && reads_norm_output;
    const bool kept = projection_input_row(
        t, z, "q/k/v projections", shared ? "their input, shared with the MLP" : "their input",
        z.sbh, shape::sbh, m.fused_qkv ? 1 : 3, qkv_out, shared ? qkv | mlp : qkv,
        RowFacts{}.output_of_norm(itself).input_of_layer(itself && !m.norms_before_branches()));
    after_linears(t, z, "q/k/v projections", qkv, z.tokens, z.sbh, shape::sbh, z.s, input_row(kept),
                  qkv_out);
    t.gradient(qkv_out.weight);
    if (!m.fused_qkv) t.launch(LaunchOp::gradient_sum, 2);  // q's, k's and v's input gradients
    if (m.position == Position::rotary) t.launch(LaunchOp::rotary, 2);  // q and k
    qk_norm_rows(t, m, z);
    rotary_rows(t, m, z);
    temperature_rows(t, m, z);
    qkv_rows(t, m, z, attention);
}

/// What a program copies around a fused kernel whose layouts are not its own. A sequence-first
/// program (Architecture::sequence_first) with a kernel that takes batch-first tensors alone: q, k
/// and v, contiguous and batch-first, beside the projection's output in forward; and where b > 1
/// the kernel's output, which comes back as a transposed view that Transformer Engine's linear
/// makes contiguous (module/base.py:1639-1640) and keeps, beside the kernel's own, and its
/// gradient, made contiguous for the kernel's backward (at b = 1 the view is contiguous already).
/// A heads-first q (Architecture::q_heads_first) with a kernel whose output follows q's layout:
/// the output, copied token-major for the output projection, and copied batch-first in backward.
struct LayoutCopies {
    bool inputs = false, output = false, heads_first = false;
};

inline LayoutCopies layout_copies(const Architecture& m, const Sizes& z) {
    const AttentionKernel kernel = z.runtime.attention_kernel;
    if (m.sequence_first && batch_first_only(kernel))
        return {true, z.tokens.value() / z.seq > 1, false};
    if (m.q_heads_first && output_follows_q(kernel)) return {false, true, true};
    return {};
}

/// The fused kernel's output and the output projection's input: one tensor, or two where the
/// projection reads a copy (a narrow cast, the unpadded slice of a padded output, a layout copy).
inline void flash_output_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                              const Shape& output, const LayoutCopies& copies) {
    const bool layout_copy = copies.output;
    // v padded to q's width (latent attention) makes an output as wide: the output projection
    // reads a copy of its unpadded slice, and the padded output is the kernel's alone.
    const bool padded = m.value_head_size() != m.head_size() && m.latent_v_padded;
    const std::string why = "backward needs the output for the softmax gradient";
    const RowFacts policy = RowFacts{}.saved_by_policy();
    if (t.tuning.prompt_tokens > 0 && !padded && !z.narrow) {
        // The output projection reads the gated prompt's sum, not this (prompt_attention_rows).
        t.add("flash attention",
              copies.heads_first ? "its output, heads-first (q's layout)" : "its output", why,
              output, z.sbv, z.d, Keep::always, 1, policy);
        return;
    }
    if (padded) {
        t.add("flash attention", "its output, padded to q's head width", why, latent_shape::sbqk,
              z.sbq, z.d, Keep::not_selective, 1, policy);
        projection_input_row(t, z, "output projection",
                             "its input (the output's unpadded slice, copied)", z.sbv, output, 1,
                             output_projection(z), bit(Linear::o));
    } else if (z.narrow || layout_copy) {
        const char* kernel_layout =
            copies.heads_first ? "its output, heads-first (q's layout)" : "its output, batch-first";
        const char* copied = copies.heads_first ? "its input (the output copied token-major)"
                                                : "its input (the output copied sequence-first)";
        t.add("flash attention", layout_copy ? kernel_layout : "its output", why, output, z.sbv,
              z.d, Keep::always, 1, policy);
        projection_input_row(t, z, "output projection", layout_copy ? copied : "its input", z.sbv,
                             output, 1, output_projection(z), bit(Linear::o));
    } else {
        // A 4-bit output projection's ctx holds it too (bitsandbytes before 0.43.2).
        const bool held = kept_by_4bit(t, bit(Linear::o)) > 0;
        t.add("flash attention", "its output (also the output projection's input)", why, output,
              z.sbv, z.d, Keep::always, 1, policy.held_by_graph(held));
        linear_casts_work(t, z, "output projection", z.sbv, output_projection(z));
    }
    adapter_rows(t, z, "output projection", bit(Linear::o), z.tokens, z.sbv, output, z.d);
    scaled_output_rows(t, z, "output projection", bit(Linear::o), z.tokens);
}

/// A fused (flash) kernel's core attention: `output` is its output's shape (a d_v wide per head).
inline void flash_core_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                            const Shape& output) {
    // A fused kernel never stores the s x s scores: it keeps its output and a log-sum-exp per
    // row and recomputes the scores block by block in backward. Both are the kernel's outputs,
    // which the op-level policy saves (the SDPA kernels are on its list): its recomputation skips
    // the kernel, Q K^T and the weights times V as compute_cost counts them.
    t.spare(2.0 * static_cast<double>(z.tokens.value()) * static_cast<double>(z.seq) *
            static_cast<double>(m.heads * (m.head_size() + m.value_head_size())));
    t.launch(LaunchOp::flash_core);
    t.launch(LaunchOp::merge_heads);
    const LayoutCopies copies = layout_copies(m, z);
    if (copies.inputs)  // at b = 1 q's transpose is contiguous and not copied: leaning high
        t.workspace(false, "flash attention", "q, k and v copied batch-first",
                    bytes_of(z.d, "sb(ad)") + " + " + bytes_of(2 * z.d, "sb(kd)"),
                    Count(z.d) * z.sbq + Count(2 * z.d) * z.sbkv);
    t.add("flash attention", "log-sum-exp per query row, fp32",
          "backward rebuilds the softmax from it", shape::asb, Count(m.heads) * z.tokens,
          dtype::fp32, Keep::not_selective, 1, RowFacts{}.saved_by_policy());
    flash_output_rows(t, m, z, output, copies);
    // FlashAttention-2's backward: dq accumulated in fp32, dq, dk, dv, and a row sum per query;
    // Where k and v were repeated for it, dk and dv at every query head and their sums per group;
    // the output's gradient (a heads-first output itself) made contiguous batch-first where the
    // output was copied.
    const bool repeated = repeats_kv(m, Attention::flash);
    const Count work = z.sbq * (dtype::fp32 + z.d) + Count(2 * z.d) * z.sbkv +
                       (repeated ? Count(2 * z.d) * z.sbq : 0) +
                       Count(m.heads) * z.tokens * dtype::fp32 +
                       (copies.output ? Count(z.d) * z.sbv : 0);
    t.workspace(true, "flash attention backward",
                std::string(repeated ? "dq (fp32 accumulator and result), dk, dv at every head and "
                                       "summed, row sums"
                                     : "dq (fp32 accumulator and result), dk, dv, row sums") +
                    (!copies.output       ? ""
                     : copies.heads_first ? ", the output copied batch-first"
                                          : ", the output's gradient copied batch-first"),
                bytes_of(dtype::fp32 + z.d, "sb(ad)") + " + " + bytes_of(2 * z.d, "sb(kd)") +
                    (repeated ? " + " + bytes_of(2 * z.d, "sb(ad)") : "") + " + 4 asb" +
                    (copies.output ? " + " + bytes_of(z.d, "sb(a d_v)") : ""),
                work);
}

/// Eager attention's scores before the softmax: their temporaries, and a registered mask's
/// comparison.
inline void eager_scores_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const CausalMaskBufferRow& mask = causal_mask_buffer(m.causal_mask_buffer);
    if (mask.filled) t.launch(LaunchOp::mask_fill);
    if (mask.selected) t.launch(LaunchOp::mask_select);
    if (mask.filled)
        // nanoGPT: masked_fill(bias[:, :, :s, :s] == 0, -inf) keeps the comparison's new s x s bool
        // tensor for backward (measured: validation/results/cpu-buffers.json).
        t.add("masked_fill (registered mask)", "bias == 0 (bool), broadcast over batch and heads",
              "the gradient is zeroed where the mask was filled", shape::ss, Count(z.seq) * z.seq,
              dtype::mask, Keep::not_selective);
    if (mask.filled || mask.selected) {
        // The scores stay in the compute dtype, the scaled ones and the masked ones at once;
        // torch.where's condition is the bool buffer's own view (GPT-2's), nothing new.
        t.workspace(false, mask.filled ? "Q K^T / sqrt(d), masked_fill" : "Q K^T / sqrt(d), where",
                    "the scaled scores and the masked ones",
                    bytes_of(2 * z.d, z.keyed.scores.symbol), Count(2 * z.d) * z.scores);
    } else if (m.mask_in_product) {
        // baddbmm(mask, q / sqrt(d), k^T): the scores alone, in the compute dtype.
        t.workspace(false, "baddbmm(mask, Q / sqrt(d), K^T)", "the scores, the mask added",
                    bytes_of(z.d, z.keyed.scores.symbol), Count(z.d) * z.scores);
    } else {
        // Q K^T, then / sqrt(d) and + mask, each out of place: two s x s score tensors at once,
        // before softmax makes the first saved one. The mask has the stream's dtype, which the sum
        // takes (on CPU through an upcast copy of the scores).
        const std::uint64_t scores = z.d + std::max(z.d, z.s + z.upcast);
        t.workspace(false, "Q K^T / sqrt(d) + mask",
                    z.upcast
                        ? "the scaled scores, and their upcast copy and their sum with the mask"
                        : "the scaled scores, and the scores or their sum with the mask",
                    bytes_of(scores, z.keyed.scores.symbol), Count(scores) * z.scores);
    }
}

/// The softmax's saved output (and the weights over V cast back, without a dropout).
inline void softmax_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                         Count softmax_elements, bool softmax_fp32) {
    const bool dropout = m.attention_dropout > 0;
    if (softmax_fp32) {
        t.add("softmax",
              m.attention_sinks ? "its output over s + 1 columns, fp32" : "its output, fp32",
              "softmax's gradient is written in its output", z.keyed.scores, softmax_elements,
              dtype::fp32, Keep::not_selective);
        if (!dropout)
            t.add("attention over V",
                  std::string("the weights, cast back to ") + dtype_name(z.compute),
                  "the gradient w.r.t. v is weights^T x the output's gradient", z.keyed.scores,
                  z.scores, z.d, Keep::not_selective);
    } else {
        t.add("softmax",
              std::string(dropout ? "its output" : "its output (also the weights over V)") +
                  (m.attention_sinks ? ", s + 1 columns" : ""),
              "softmax's gradient is written in its output", z.keyed.scores, softmax_elements, z.d,
              Keep::not_selective);
    }
}

/// The attention's dropout: its forward's temporaries and what its backward and the product with
/// V keep.
inline void attention_dropout_rows(TableBuilder& t, const Sizes& z) {
    // Its forward holds its input, the noise (CPU) or mask it draws and its output at once:
    // under recomputation, which keeps none of them, the core attention's largest moment
    // (measured, peak_live.py: GPT-2 with dropout, full recomputation, forward 1 peaks at
    // F.dropout's product).
    const std::uint64_t drawn = z.kernels->dropout_mask ? dtype::mask : z.d;
    t.workspace(false, "attention dropout",
                z.kernels->dropout_mask ? "its mask and its output" : "its noise and its output",
                bytes_of(drawn + z.d, z.keyed.scores.symbol), Count(drawn + z.d) * z.scores);
    dropout_row(t, z, z.compute, "attention dropout", z.keyed.scores, z.scores,
                Keep::not_selective);
    t.add("attention over V", "the dropped-out weights",
          "the gradient w.r.t. v is weights^T x the output's gradient", z.keyed.scores, z.scores,
          z.d, Keep::not_selective);
}

/// The product with V's backward and the output projection's input.
inline void over_v_rows(TableBuilder& t, const Sizes& z, const Shape& output) {
    // The product with V's backward, the core attention's first: the weights' gradient and v's
    // beside the attention output's gradient (its incoming one), the output projection's input and
    // all after it freed. A CPU kernel also copies two strided operands contiguous (measured:
    // torch 1.13's BmmBackward0 on CPU).
    const std::uint64_t over_v = (2 + z.kernels->bmm_backward_copies) * z.d;
    t.workspace_at(t.size(), true, "attention over V backward",
                   z.kernels->bmm_backward_copies > 0
                       ? "the weights' gradient, the output's and v's, two contiguous copies"
                       : "the weights' gradient, the output's and v's",
                   bytes_of(z.d, z.keyed.scores.symbol) + " + " + bytes_of(over_v, "sb(a d_v)"),
                   Count(z.d) * z.scores + Count(over_v) * z.sbv);
    // Under a prompt the output projection reads the gated sum (prompt_attention_rows), not this.
    if (t.tuning.prompt_tokens > 0) return;
    if (z.narrow)
        projection_input_row(t, z, "output projection", "its input", z.sbv, output, 1,
                             output_projection(z), bit(Linear::o));
    else
        linear_input_row(t, z, "output projection", "its input", output, z.tokens, z.sbv,
                         bit(Linear::o), output_projection(z));
}

/// The softmax's own temporaries, forward and backward, beside its output's row.
inline void softmax_work(TableBuilder& t, const Architecture& m, const Sizes& z,
                         std::size_t softmax_row, Count softmax_elements, bool softmax_fp32) {
    // Softmax's input lives beside its output; its backward holds its output's gradient and the
    // tensors it makes (the input's gradient among them). Only CUDA's fp16 is upcast on the fly:
    // otherwise an fp32 copy is softmaxed, and the backward's tensors are fp32.
    const std::uint64_t out = softmax_fp32 ? dtype::fp32 : z.d;
    const bool on_read = z.kernels->softmax_upcasts_fp16_on_read && z.compute == DType::fp16;
    const bool copy = softmax_fp32 && !on_read && z.s != dtype::fp32;
    const std::uint64_t forward = z.s + (copy ? dtype::fp32 : 0),
                        backward =
                            out + z.kernels->softmax_backward_tensors * (copy ? dtype::fp32 : z.s);
    t.workspace_at(softmax_row + 1, false, "softmax",
                   copy ? "its input and its fp32 copy" : "its input",
                   bytes_of(forward, z.keyed.scores.symbol), Count(forward) * softmax_elements);
    // The product with V's backward has made v's gradient before the softmax's runs, and freed v,
    // which it alone saved; selective recomputation's checkpoint holds an unrepeated v still
    // (measured: cpu-rotary-wide512).
    if (m.key_value_heads() == m.heads) t.held_by_checkpoint(z.sbv * z.d);
    t.workspace_at(softmax_row + 1, true, "softmax backward",
                   "the gradients of its output and its input",
                   bytes_of(backward, z.keyed.scores.symbol), Count(backward) * softmax_elements);
}

/// Eager attention's core: the scores, the softmax, a dropout, the product with V.
inline void eager_core_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                            const Shape& output) {
    eager_scores_rows(t, m, z);
    // Attention sinks (gpt-oss): a column of per-head logits joins the scores, the row's max is
    // taken off (max keeps its indices), the softmax runs over s + 1 columns and the sink's column
    // is dropped by a view, so the softmax's output is the storage the product with V keeps.
    const Count softmax_elements =
        z.scores + (m.attention_sinks ? Count(m.heads) * z.tokens : Count(0));
    if (m.attention_sinks) {
        t.add("scores - max (sinks)", "the row maxima's indices (int64)",
              "max's gradient goes to the maximum", shape::asb, Count(m.heads) * z.tokens, 8,
              Keep::not_selective);
        t.launch(LaunchOp::attention_sinks);
    }
    const std::size_t softmax_row = t.size();
    // Under autocast an fp32 mask added out of place (the stream's dtype) makes the scores fp32; a
    // fill, or a mask added inside the product (cast with it), leaves them in the compute dtype,
    // which CUDA autocast's softmax still runs in fp32 and CPU autocast's does not.
    const bool fp32_sum = z.s == dtype::fp32 && causal_mask_buffer(m.causal_mask_buffer).added() &&
                          !m.mask_in_product;
    const bool softmax_fp32 =
        m.softmax_fp32 || (z.autocast && (fp32_sum || z.kernels->autocast_softmax_fp32));
    softmax_rows(t, m, z, softmax_elements, softmax_fp32);
    t.launch(LaunchOp::eager_core);
    t.launch(LaunchOp::merge_heads);
    if (softmax_fp32 && z.d != dtype::fp32) t.launch(LaunchOp::softmax_casts);
    if (m.attention_dropout > 0) attention_dropout_rows(t, z);
    over_v_rows(t, z, output);
    softmax_work(t, m, z, softmax_row, softmax_elements, softmax_fp32);
}

/// Gated attention's output gate (Qwen3-Next): gate, reshaped out of q_proj's output into a
/// tensor of its own, passes a sigmoid, and the product with the attention's output (kept above)
/// is the output projection's input.
inline void output_gate_rows(TableBuilder& t, const Sizes& z) {
    if (z.narrow || t.tuning.any())
        throw error("an attention output gate under fp8 linears or fine-tuning is not modelled");
    t.add("sigmoid(gate)", "its output", "sigmoid's gradient; the product's w.r.t. the output",
          shape::sbq, z.sbq, z.d);
    t.add("output x sigmoid(gate)", "the product, the output projection's input",
          "weight gradient = input^T x output gradient", shape::sbq, z.sbq, z.d);
}

/// Attention's rows; `reads_norm_output` false where its projections read a copy of the norm's
/// output (Falcon-H1's, scaled beside a Mamba-2 mixer) rather than that output itself.
inline void attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                           Attention attention, bool reads_norm_output = true) {
    if (m.mla.enabled())
        latent_attention_rows(t, m, z, attention);
    else
        mha_input_rows(t, m, z, attention, reads_norm_output);
    if (m.mla.indexed()) sparse_indexer_rows(t, m, z, attention);
    // Korthikanti's selective checkpoint: its rows are those Keep marks, its input q, k and v
    // above.
    t.section(Module::core_attn);
    const Shape& output =
        m.mla.enabled() ? latent_shape::sbv : shape::sbq;  // of a d_v wide per head
    if (attention == Attention::flash)
        flash_core_rows(t, m, z, output);
    else
        eager_core_rows(t, m, z, output);
    if (t.tuning.prompt_tokens > 0) prompt_attention_rows(t, m, z, output);
    if (m.attention_output_gate) output_gate_rows(t, z);
    t.held_beside("", Count(0));
}

}  // namespace memcalc::detail
