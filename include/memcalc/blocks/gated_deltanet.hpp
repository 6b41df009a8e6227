#pragma once
/// A Gated DeltaNet mixer in place of attention (Yang, Kautz and Hatamizadeh 2024; transformers'
/// Qwen3NextGatedDeltaNet), as it trains with fla's kernels installed: causal_conv1d_fn over q, k
/// and v, chunk_gated_delta_rule (fla/ops/gated_delta_rule/chunk.py) with q and k L2-normed in the
/// kernel, FusedRMSNormGated before out_proj. Its saves, read from the code and not measured, are
/// the rows below; where a view may or may not be copied the copy is counted (leaning high).
/// StateSpace's names: d_i = H value heads x d_v, q and k G heads of N, repeated to H heads for
/// the kernel; Q: fla's 64-token chunk, c: the chunks of a sequence.
#include <cstdint>
#include <string>

#include "memcalc/blocks/linear.hpp"
#include "memcalc/blocks/mamba.hpp"

namespace memcalc {

/// The shapes of a Gated DeltaNet's tensors, each split by heads across tensor-parallel ranks.
namespace deltanet_shape {
inline constexpr Shape qkv{"sb(d_i+2GN)", ActivationSplit::tensor};  ///< q, k and v concatenated
inline constexpr Shape sbH{"sbH", ActivationSplit::tensor};          ///< a value per token and head
inline constexpr Shape sbHN{"sb(HN)", ActivationSplit::tensor};      ///< q or k repeated to H heads
inline constexpr Shape sbHQ{"sbHQ", ActivationSplit::tensor};        ///< A: a chunk's row per token
inline constexpr Shape H{"H", ActivationSplit::tensor};              ///< a value per head
}  // namespace deltanet_shape

namespace detail {

/// The kernels' temporaries beside what they keep, for `b` sequences of `s` tokens in `d`-byte
/// activations: in forward the chunk states h (bc H N d_v = bc d_i N), w, u and v_new, and q and k
/// repeated to every value head; in backward h again with its fp32 gradient, w, u and v_new again
/// and the gradients of q, k, w, v and u (leaning high: every one counted live at once).
inline void deltanet_workspaces(TableBuilder& t, const StateSpace& x, std::uint64_t s,
                                std::uint64_t b, std::uint64_t d) {
    const Count tokens = Count(s) * b;
    const std::uint64_t di = x.d_inner, HN = x.heads * x.d_state;
    const std::uint64_t chunks = (s + x.chunk - 1) / x.chunk;
    const Count states = Count(b) * chunks * di * x.d_state;
    const std::string D = std::to_string(d);
    t.workspace(false, "chunk_gated_delta_rule",
                "the chunk states h, w, u and v_new, q and k repeated to every value head",
                D + " bc(d_i N) + " + D + " sb(2d_i + 3HN)",
                states * d + tokens * (2 * di + 3 * HN) * d);
    t.workspace(true, "chunk_gated_delta_rule backward",
                "h and its fp32 gradient, w, u and v_new again, the gradients of q, k, w, v and u",
                std::to_string(d + dtype::fp32) + " bc(d_i N) + " + D + " sb(4d_i + 6HN)",
                states * (d + dtype::fp32) + tokens * (4 * di + 6 * HN) * d, Linear::mamba_out);
}

/// What the mixer keeps after in_proj's input (the caller's row), for `tokens` tokens in `d`-byte
/// activations, in forward order; each row names the function whose save it is.
inline void deltanet_mixer_rows(TableBuilder& t, const StateSpace& x, Count tokens,
                                std::uint64_t d) {
    const Count di(x.d_inner), H(x.heads), HN = Count(x.heads) * x.d_state;
    // causal_conv1d's CausalConv1dFn.forward saves its input x: torch.cat(q, k, v), transposed.
    t.add("causal_conv1d_fn", "its input: q, k and v concatenated",
          "the convolution's backward reads x", deltanet_shape::qkv, tokens * x.conv_channels(), d);
    // g = -exp(A_log.float()) * softplus(a.float() + dt_bias): softplus keeps its input, the
    // product both factors, exp its output.
    t.add("-exp(A_log) softplus(a + dt_bias)", "softplus's input and output, fp32",
          "softplus's gradient; the product's w.r.t. exp(A_log)", deltanet_shape::sbH, tokens * H,
          dtype::fp32, Keep::always, 2);
    t.add("-exp(A_log) softplus(a + dt_bias)", "exp's output and its negation, fp32",
          "exp's gradient; the product's w.r.t. softplus", deltanet_shape::H, H, dtype::fp32,
          Keep::always, 2);
    t.add("beta = sigmoid(b)", "its output (also the kernel's beta)",
          "sigmoid's gradient; the kernel's backward", deltanet_shape::sbH, tokens * H, d);
    // fla's ChunkGatedDeltaRuleFunction.forward: save_for_backward(q, q_rstd, k, k_rstd, v, g,
    // beta, A, ...), q and k after l2norm_fwd at every value head, g its chunked cumsum.
    t.add("chunk_gated_delta_rule", "q and k, L2-normed, at every value head",
          "the kernel's backward reruns the chunks from them", deltanet_shape::sbHN, HN * tokens, d,
          Keep::always, 2);
    t.add("chunk_gated_delta_rule", "q's and k's 1/norm, fp32", "l2norm_bwd", deltanet_shape::sbH,
          tokens * H, dtype::fp32, Keep::always, 2);
    t.add("chunk_gated_delta_rule", "v, made contiguous (input_guard)", "the kernel's backward",
          ssm_shape::sbdi, tokens * di, d);
    t.add("chunk_gated_delta_rule", "g's cumulative sum per chunk, fp32", "the kernel's backward",
          deltanet_shape::sbH, tokens * H, dtype::fp32);
    t.add("chunk_gated_delta_rule", "A: (I + beta K K^T)^-1 per chunk", "the kernel's backward",
          deltanet_shape::sbHQ, tokens * H * x.chunk, d);
    // fla's FusedRMSNormGated: its input (the kernel's output), the gate z and 1/rms per head row.
    t.add("FusedRMSNormGated", "its input, the kernel's output", "the norm's backward",
          ssm_shape::sbdi, tokens * di, d);
    t.add("FusedRMSNormGated", "the gate z, made contiguous", "the norm's backward",
          ssm_shape::sbdi, tokens * di, d);
    t.add("FusedRMSNormGated", "rstd: 1/rms per token and head, fp32", "the norm's backward",
          deltanet_shape::sbH, tokens * H, dtype::fp32);
    t.add("out_proj", "its input, the gated norm's output",
          "weight gradient = input^T x output gradient", ssm_shape::sbdi, tokens * di, d);
}

/// A Gated DeltaNet layer's mixer in place of attention: in_proj_qkvz and in_proj_ba keep their
/// one input, the norm's output. Autocast, narrow linears and fine-tuning are not modelled.
inline void deltanet_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                          std::uint64_t micro_batch) {
    if (z.autocast || z.narrow)
        throw error(
            "Gated DeltaNet layers under autocast or fp8 linears are not modelled (a bf16 or fp32 "
            "recipe is)");
    if (t.tuning.any())
        throw error(
            "fine-tuning (frozen parts or LoRA) of a model with Gated DeltaNet layers is not "
            "modelled");
    const LinearOutput in_out{z.tokens * m.ssm.deltanet_in_width(),
                              "sb(2d_i+2GN+2H)",
                              Linear::deltanet_qkvz,
                              ActivationSplit::tensor,
                              {},
                              {}};
    projection_input_row(t, z, "in_proj_qkvz and in_proj_ba", "their input", z.sbh, shape::sbh, 1,
                         in_out, 0,
                         RowFacts{}.output_of_norm().input_of_layer(!m.norms_before_branches()));
    deltanet_mixer_rows(t, m.ssm, z.tokens, z.d);
    deltanet_workspaces(t, m.ssm, z.seq, micro_batch, z.d);
}

}  // namespace detail

}  // namespace memcalc
