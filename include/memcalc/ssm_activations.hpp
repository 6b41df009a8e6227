#pragma once
/// What a Mamba-1 mixer (Jamba's) keeps for backward, in the two ways transformers runs it: its
/// slow path (pure PyTorch, use_mamba_kernels false: every step's state is kept, measured on CPU by
/// validation/reference_trainer.py) and mamba_ssm's fused kernels (causal_conv1d_fn and
/// selective_scan_fn, use_mamba_kernels true: their save_for_backward lists, read from the code,
/// not measured). d_i: d_inner, N: d_state, r: dt_rank, K: d_conv.
#include <cstdint>
#include <string>
#include <tuple>

#include "memcalc/activations.hpp"
#include "memcalc/linears.hpp"
#include "memcalc/model.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

/// The shapes of a Mamba mixer's tensors. Everything d_i wide splits by channels across
/// tensor-parallel ranks; x_proj's output (dt, B, C) is summed across them, so whole on each.
namespace ssm_shape {
inline constexpr Shape sb2di{"sb(2d_i)",
                             ActivationSplit::tensor};  ///< in_proj's output: x and the gate z
inline constexpr Shape conv{"(s+K-1)b(d_i)",
                            ActivationSplit::tensor};  ///< the convolution's padded output
inline constexpr Shape sbdi{"sb(d_i)", ActivationSplit::tensor};  ///< a d_i-wide tensor per token
inline constexpr Shape sbdiN{"sb(d_i N)",
                             ActivationSplit::tensor};  ///< a state per token (discretised A, B)
inline constexpr Shape states{"(s-1)b(d_i N)",
                              ActivationSplit::tensor};  ///< the slow path's states, one per step
inline constexpr Shape bdiN{"b(d_i N)", ActivationSplit::tensor};  ///< one state per sequence
inline constexpr Shape diN{"d_i N", ActivationSplit::tensor};      ///< A
inline constexpr Shape di{"d_i", ActivationSplit::tensor};         ///< D, dt_proj's bias
inline constexpr Shape chunks{
    "b(d_i)(2N)c", ActivationSplit::tensor};  ///< selective_scan's state per 2048-token chunk
inline constexpr Shape sbr{"sbr", ActivationSplit::replicated};  ///< dt
inline constexpr Shape sbN{"sbN", ActivationSplit::replicated};  ///< B or C
inline constexpr Shape sbx{"sb(r+2N)",
                           ActivationSplit::replicated};       ///< x_proj's output: dt, B and C
inline constexpr Shape sb{"sb", ActivationSplit::replicated};  ///< a value per token of dt, B or C
}  // namespace ssm_shape

/// selective_scan_fn keeps its state at the end of every chunk of this many tokens (mamba_ssm's
/// selective_scan_fwd: n_chunks = ceil(seqlen / 2048)).
inline constexpr std::uint64_t selective_scan_chunk = 2048;

namespace detail {

/// The mixer's saved tensors after its input norm (whose output in_proj keeps: the caller's row),
/// for `s` tokens of `b` sequences in `d`-byte activations. `add(op, tensor, why, shape, elements,
/// bytes)` appends a row; `work(backward, op, tensor, formula, bytes, weight_gradient)` a temporary
/// while the rows so far are live (Workspace::weight_gradient).
template <class Add, class Work>
void mamba_mixer_rows(const Architecture& m, std::uint64_t s, std::uint64_t b, std::uint64_t d,
                      bool frozen_norms, Add add, Work work) {
    const StateSpace& x = m.ssm;
    const Count tokens = Count(s) * b, di = Count(x.d_inner), N = Count(x.d_state),
                r = Count(x.dt_rank);
    const Count sbdi = tokens * di, sbdiN = sbdi * N;
    const std::string bytes_d = std::to_string(d);
    add("in_proj", "its output: x and the gate z, one storage",
        "the convolution's gradient reads x; SiLU(z)'s reads z", ssm_shape::sb2di, sbdi * 2, d);
    // dt, B and C: x_proj's output, RMSNormed each (Jamba); the norms upcast views of it to fp32.
    const auto inner_norms = [&] {
        if (!x.inner_norms) {
            add("x_proj", "its output (dt, B and C, one storage)",
                "dt_proj reads dt; the scan reads B and C", ssm_shape::sbx, tokens * (r + N * 2),
                d);
            return;
        }
        if (d ==
            dtype::fp32)  // x.to(fp32) returns the view itself: pow keeps x_proj's whole output
            add("dt, B and C norms (RMSNorm)", "x_proj's output, fp32 (one storage)",
                "pow(x, 2) and x * rsqrt need x", ssm_shape::sbx, tokens * (r + N * 2),
                dtype::fp32);
        for (const auto& [what, width, shape] : {std::tuple{"dt norm", r, ssm_shape::sbr},
                                                 {"B norm", N, ssm_shape::sbN},
                                                 {"C norm", N, ssm_shape::sbN}}) {
            const std::string op = std::string(what) + " (RMSNorm)";
            if (d != dtype::fp32)
                add(op, "its input, upcast to fp32", "pow(x, 2) and x * rsqrt need x", shape,
                    tokens * width, dtype::fp32);
            add(op, "1/rms per token, fp32", "rsqrt's gradient is written in its output",
                ssm_shape::sb, tokens, dtype::fp32);
            if (!frozen_norms)
                add(op, "the normalised input",
                    "the weight's gradient is x_norm x the output's gradient", shape,
                    tokens * width, d);
        }
    };
    if (!x.kernels) {
        // transformers' slow_forward, as it runs with no cache and no padding mask.
        add("conv1d + SiLU", "the convolution's output, padded to s + K - 1",
            "SiLU's derivative is evaluated at its input", ssm_shape::conv,
            Count(s + x.d_conv - 1) * b * di, d);
        add("SiLU", "its output u (x_proj's input, and u D's)",
            "x_proj's weight gradient and D's read u", ssm_shape::sbdi, sbdi, d);
        inner_norms();
        if (x.inner_norms)
            add("dt_proj", "its input (the dt norm's output)",
                "weight gradient = input^T x output gradient", ssm_shape::sbr, tokens * r, d);
        if (x.inner_norms)
            add("C norm", "its output C", "each step's y = state C reads C", ssm_shape::sbN,
                tokens * N, d);
        add("softplus", "its input (dt_proj's output)",
            "softplus's derivative is evaluated at its input", ssm_shape::sbdi, sbdi, d);
        add("softplus", "its output delta", "delta A and delta B read it", ssm_shape::sbdi, sbdi,
            d);
        add("A = -exp(A_log)", "exp's output, fp32", "exp's gradient is written in its output",
            ssm_shape::diN, di * N, dtype::fp32);
        add("A = -exp(A_log)", "A, fp32", "A delta's gradient w.r.t. delta reads A", ssm_shape::diN,
            di * N, dtype::fp32);
        work(false, "exp(A delta)", "A delta, fp32, before exp", "4 sb(d_i N)", sbdiN * dtype::fp32,
             Linear::none);
        add("exp(A delta)", "discretised A, fp32",
            "exp's gradient is written in its output; every step reads it", ssm_shape::sbdiN, sbdiN,
            dtype::fp32);
        add("delta B", "B upcast to fp32", "delta B's gradient w.r.t. delta reads B",
            ssm_shape::sbN, tokens * N, dtype::fp32);
        add("delta B u", "delta B, fp32", "its product with u reads it", ssm_shape::sbdiN, sbdiN,
            dtype::fp32);
        if (d != dtype::fp32)
            add("delta B u", "u upcast to fp32", "the product's gradient w.r.t. delta B reads u",
                ssm_shape::sbdi, sbdi, dtype::fp32);
        add("the recurrence", std::string("the first state (zeros, ") + bytes_d + " bytes)",
            "state = dA state + dBu reads the state", ssm_shape::bdiN, Count(b) * di * N, d);
        if (s > 1)
            add("the recurrence", "every later state but the last, fp32",
                "each step's product reads the state before it", ssm_shape::states,
                Count(s - 1) * b * di * N, dtype::fp32);
        if (d != dtype::fp32)
            add("y = state C", "every state cast to the compute dtype",
                "the product's gradient w.r.t. C reads it", ssm_shape::sbdiN, sbdiN, d);
        else
            add("y = state C", "the last state, fp32", "the product's gradient w.r.t. C reads it",
                ssm_shape::bdiN, Count(b) * di * N, dtype::fp32);
        add("(y + u D) SiLU(z)", "y + u D", "the product's gradient w.r.t. SiLU(z) reads it",
            ssm_shape::sbdi, sbdi, d);
        add("(y + u D) SiLU(z)", "SiLU(z)", "the product's gradient w.r.t. y reads it",
            ssm_shape::sbdi, sbdi, d);
        add("out_proj", "its input", "weight gradient = input^T x output gradient", ssm_shape::sbdi,
            sbdi, d);
        // Backward accumulates the gradients of dA and dBu from each step's slice: two full fp32
        // buffers and a full-size temporary per slice's backward.
        // Counted beside a fresh weight gradient, as before (leaning high; not measured): its
        // gradient of delta goes on to dt_proj's.
        work(true, "the recurrence backward",
             "gradients of dA and dB u, and one step's slice gradient, fp32", "12 sb(d_i N)",
             sbdiN * (3 * dtype::fp32), Linear::mamba_dt);
        return;
    }
    // mamba_ssm's kernels: causal_conv1d_fn keeps x (a view of in_proj's output); selective_scan_fn
    // copies each operand whose last stride is not 1 and keeps u, delta, A, B, C, D, z, delta_bias
    // and its chunk states x. Counted with a contiguous copy of u and z each (leaning high).
    add("conv1d (causal_conv1d_fn)", "its output u (x_proj's input)",
        "x_proj's weight gradient reads u", ssm_shape::sbdi, sbdi, d);
    inner_norms();
    if (x.inner_norms)
        add("dt_proj", "its input (the dt norm's output)",
            "weight gradient = input^T x output gradient", ssm_shape::sbr, tokens * r, d);
    add("selective_scan_fn", "u, copied contiguous", "the scan's backward reruns it from u",
        ssm_shape::sbdi, sbdi, d);
    add("selective_scan_fn", "delta (dt_proj's output, copied contiguous)", "the scan's backward",
        ssm_shape::sbdi, sbdi, d);
    add("selective_scan_fn", "B and C, copied contiguous", "the scan's backward", ssm_shape::sbN,
        tokens * N, d, Keep::always, 2);
    add("selective_scan_fn", "the gate z, copied contiguous", "the scan's backward",
        ssm_shape::sbdi, sbdi, d);
    add("selective_scan_fn", "A = -exp(A_log) and exp's output, fp32",
        "the scan's backward; exp's gradient", ssm_shape::diN, di * N, dtype::fp32, Keep::always,
        2);
    add("selective_scan_fn", "D and dt_proj's bias, fp32", "the scan's backward", ssm_shape::di, di,
        dtype::fp32, Keep::always, 2);
    const std::uint64_t n_chunks = (s + selective_scan_chunk - 1) / selective_scan_chunk;
    add("selective_scan_fn", "the state at each 2048-token chunk's end, fp32",
        "the scan's backward starts each chunk from it", ssm_shape::chunks,
        Count(b) * di * N * 2 * n_chunks, dtype::fp32);
    add("out_proj", "its input (the gated scan output)",
        "weight gradient = input^T x output gradient", ssm_shape::sbdi, sbdi, d);
}

}  // namespace detail

/// Korthikanti et al.'s GPT layer with its attention replaced by a Mamba mixer as the fused kernels
/// keep it (mamba_ssm; `d`-byte activations): the LayerNorm, the MLP and the dropout masks as the
/// paper's.
inline LayerActivations korthikanti_mamba_layer(const Architecture& m, std::uint64_t seq,
                                                std::uint64_t micro_batch, std::uint64_t d) {
    LayerActivations gpt = korthikanti_layer(m, seq, micro_batch, d);
    LayerActivations layer;
    layer.rows.push_back(gpt.rows[0]);  // the norm's input, the layer's own
    const auto add = [&](Label op, Label tensor, Label why, const Shape& shape, Count elements,
                         std::uint64_t bytes, Keep keep = Keep::always, std::uint64_t copies = 1) {
        SavedTensor& r = layer.rows.emplace_back();
        r.op = op, r.tensor = tensor, r.why = why, r.symbol = shape.symbol, r.copies = copies;
        r.bytes_per_element = bytes, r.keep = keep, r.elements = elements * copies,
        r.bytes = r.elements * bytes;
        r.split = shape.split;
    };
    add("in_proj", "its input", "weight gradient = input^T x output gradient", shape::sbh,
        Count(seq) * micro_batch * m.hidden, d);
    Architecture fused = m;
    fused.ssm.kernels = true,
    fused.ssm.inner_norms = false;  // the paper's layer has no inner norms
    detail::mamba_mixer_rows(fused, seq, micro_batch, d, false, add,
                             [](bool, Label, Label, Label, Count, Linear) {});
    for (std::size_t i = 8; i < gpt.rows.size(); ++i)
        layer.rows.push_back(gpt.rows[i]);  // residual dropout on
    layer.input_bytes = gpt.input_bytes, layer.checkpoint_tensors = gpt.checkpoint_tensors;
    return layer;
}

}  // namespace memcalc
