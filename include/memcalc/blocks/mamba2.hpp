#pragma once
/// A Mamba-2 mixer in place of attention (Dao and Gu 2024; transformers'
/// GraniteMoeHybridMambaLayer, Mamba2Mixer): what it keeps for backward as it trains with
/// mamba_ssm's kernels installed, cuda_kernels_forward's training branch calling
/// mamba_split_conv1d_scan_combined (mamba_ssm/ops/triton/ssd_combined.py). Its save_for_backward
/// list, read from the code and not measured, is the rows below. The convolution's output, the
/// chunk states and the gated norm's output are recomputed in its backward, not kept: they are
/// its forward's and its backward's temporaries (workspaces, leaning high). transformers'
/// torch_forward (no kernels) is refused (validate_state_space). d_i: d_inner, N: d_state, G:
/// groups, H: heads, Q: the chunk, c: the chunks of a sequence.
#include <cstdint>
#include <string>

#include "memcalc/blocks/linear.hpp"
#include "memcalc/blocks/mamba.hpp"

namespace memcalc {

/// The shapes of a Mamba-2 mixer's tensors. Megatron-LM splits its heads and groups across
/// tensor-parallel ranks, so each tensor by its channels.
namespace ssm_shape {
inline constexpr Shape zxbcdt{"sb(2d_i+2GN+H)",
                              ActivationSplit::tensor};      ///< in_proj's output: z, x, B, C, dt
inline constexpr Shape H{"H", ActivationSplit::tensor};      ///< a value per head
inline constexpr Shape sbG{"sbG", ActivationSplit::tensor};  ///< a value per token and group
}  // namespace ssm_shape

namespace detail {

/// The fused function's temporaries beside what it keeps, for `b` sequences of `s` tokens in
/// `d`-byte activations (ssd_combined.py): in forward the convolution's output, the chunk states
/// (fp32, then passed in the activations' dtype), dt and its cumulative sum per chunk (fp32), C
/// B^T per chunk (fp32) and the gated norm's output, out_proj's input; in backward the
/// convolution's output again, its gradient and zxbcdt's, the norm's output again and the
/// output's gradient through out_proj, the states and their gradients (fp32), C B^T and its
/// gradient. Its backward writes out_proj's, the convolution's and the norm's weight gradients.
inline void mamba2_workspaces(TableBuilder& t, const StateSpace& x, std::uint64_t s,
                              std::uint64_t b, std::uint64_t d) {
    const Count tokens = Count(s) * b;
    const std::uint64_t di = x.d_inner, conv = x.conv_channels();
    const std::uint64_t chunks = (s + x.chunk - 1) / x.chunk;
    const Count states = Count(b) * chunks * x.d_inner * x.d_state;
    const Count cumsums = Count(b) * x.heads * chunks * x.chunk * (2 * dtype::fp32);
    const Count cb = Count(b) * chunks * x.groups * x.chunk * x.chunk * dtype::fp32;
    const std::string D = std::to_string(d);
    // out_proj's input: the gated norm's output, or y x silu(z) where the mixer has no norm.
    const std::string gated = x.gated_norm ? "the gated norm's output" : "the gated output";
    t.workspace(false, "mamba_split_conv1d_scan_combined",
                "the convolution's output, the chunk states, dt and its cumsum, C B^T, " + gated,
                D + " sb(d_i+2GN) + " + std::to_string(4 + d) +
                    " bc(d_i N) + 8 bHcQ + 4 bcGQ^2 + " + D + " sb(d_i)",
                tokens * conv * d + states * (dtype::fp32 + d) + cumsums + cb + tokens * di * d);
    t.workspace(true, "mamba_split_conv1d_scan_combined backward",
                "the convolution's output and its gradient, zxbcdt's gradient, " + gated +
                    ", the output's gradient, the states and their gradients, C B^T and its "
                    "gradient",
                D + " sb(2(d_i+2GN) + (2d_i+2GN+H) + 2d_i) + 8 bc(d_i N) + 8 bHcQ + 8 bcGQ^2",
                tokens * (conv * 2 + x.in_proj_width() + di * 2) * d + states * (2 * dtype::fp32) +
                    cumsums + cb * 2,
                Linear::mamba_out);
}

/// The mixer's saved tensors after in_proj's input (the caller's row), for `tokens` tokens in
/// `d`-byte activations, written to `t` in forward order. Each row names the file and function
/// whose save it is.
inline void mamba2_mixer_rows(TableBuilder& t, const StateSpace& x, Count tokens, std::uint64_t d) {
    const Count di(x.d_inner), H(x.heads), G(x.groups);
    // ssd_combined.py, MambaSplitConv1dScanCombinedFn.forward: save_for_backward(zxbcdt, ...).
    t.add("mamba_split_conv1d_scan_combined", "zxbcdt: in_proj's output (z, x, B, C and dt)",
          "the backward reruns the convolution from x, B and C and reads z and dt",
          ssm_shape::zxbcdt, tokens * x.in_proj_width(), d);
    // modeling_granitemoehybrid.py, cuda_kernels_forward: A = -torch.exp(A_log.float()), exp
    // keeping its output; the same save_for_backward keeps A.
    t.add("A = -exp(A_log)", "exp's output and A, fp32", "exp's gradient; the scan's backward",
          ssm_shape::H, H, dtype::fp32, Keep::always, 2);
    // ssd_combined.py, the same save_for_backward: out_x, _mamba_chunk_scan_combined_fwd's output
    // before the gated norm.
    t.add("mamba_split_conv1d_scan_combined", "out_x: the scan's output y + x D",
          "the gated norm's backward and the recomputed out_proj input read it", ssm_shape::sbdi,
          tokens * di, d);
    // layernorm_gated.py, _layer_norm_fwd (called by the same forward): rstd, one per token and
    // group, kept by the same save_for_backward; None without the norm (rmsnorm_weight None).
    if (x.gated_norm)
        t.add("gated RMSNorm", "rstd: 1/rms per token and group, fp32",
              "the norm's backward and the recomputed out_proj input", ssm_shape::sbG, tokens * G,
              dtype::fp32);
}

/// What a Mamba-2 mixer's rows do not model: autocast, narrow linears, fine-tuning.
inline void require_plain_mamba2(const TableBuilder& t, const Sizes& z) {
    if (z.autocast || z.narrow)
        throw error(
            "Mamba-2 layers under autocast or fp8 linears are not modelled (a bf16 or fp32 recipe "
            "is)");
    if (t.tuning.any())
        throw error(
            "fine-tuning (frozen parts or LoRA) of a model with Mamba-2 layers is not modelled");
}

/// in_proj's saved input: `facts` say whose storage it is.
inline void mamba2_input_row(TableBuilder& t, const Architecture& m, const Sizes& z,
                             const RowFacts& facts) {
    const LinearOutput in_out{z.tokens * m.ssm.in_proj_width(),
                              "sb(2d_i+2GN+H)",
                              Linear::mamba_in,
                              ActivationSplit::tensor,
                              {},
                              {}};
    projection_input_row(t, z, "in_proj", "its input", z.sbh, shape::sbh, 1, in_out, 0, facts);
}

/// A Mamba-2 layer's mixer in place of attention: in_proj keeps its input, the norm's output, as
/// q/k/v do. Autocast, narrow linears and fine-tuning of its tensors are not modelled.
inline void mamba2_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                        std::uint64_t micro_batch) {
    require_plain_mamba2(t, z);
    mamba2_input_row(t, m, z,
                     RowFacts{}.output_of_norm().input_of_layer(!m.norms_before_branches()));
    mamba2_mixer_rows(t, m.ssm, z.tokens, z.d);
    mamba2_workspaces(t, m.ssm, z.seq, micro_batch, z.d);
}

}  // namespace detail

}  // namespace memcalc
