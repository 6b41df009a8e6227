#pragma once
/// A Mamba mixer in place of attention: what a Mamba-1 mixer (Jamba's) keeps for backward, in the
/// two ways transformers runs it: its slow path (pure PyTorch, use_mamba_kernels false: every
/// step's state is kept, measured on CPU by validation/reference_trainer.py) and mamba_ssm's fused
/// kernels (causal_conv1d_fn and selective_scan_fn, use_mamba_kernels true: their
/// save_for_backward lists, read from the code, not measured). d_i: d_inner, N: d_state, r:
/// dt_rank, K: d_conv.
#include <cstdint>
#include <string>
#include <tuple>

#include "memcalc/blocks/linear.hpp"

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
/// for `s` tokens of `b` sequences in `d`-byte activations, written to `t` in forward order: its
/// rows, and its temporaries while the rows before them are live (Workspace::linear).
/// `frozen_norms`: the inner norms' weights take no gradient, so keep no normalised input.
/// `mean_saves_input`: before torch 2.2 each inner norm's mean() keeps x^2 in fp32.
class MambaMixer {
public:
    MambaMixer(TableBuilder& t, const Architecture& m, std::uint64_t s, std::uint64_t b,
               std::uint64_t d, bool frozen_norms, bool mean_saves_input = false)
        : t_(t),
          x_(m.ssm),
          s_(s),
          b_(b),
          d_(d),
          frozen_norms_(frozen_norms),
          mean_saves_input_(mean_saves_input),
          tokens_(Count(s) * b),
          di_(Count(x_.d_inner)),
          N_(Count(x_.d_state)),
          r_(Count(x_.dt_rank)),
          sbdi_(tokens_ * di_),
          sbdiN_(sbdi_ * N_) {}

    void write() {
        add("in_proj", "its output: x and the gate z, one storage",
            "the convolution's gradient reads x; SiLU(z)'s reads z", ssm_shape::sb2di, sbdi_ * 2,
            d_);
        if (x_.kernels)
            fused();
        else
            slow();
    }

private:
    void add(Label op, Label tensor, Label why, const Shape& shape, Count elements,
             std::uint64_t bytes, Keep keep = Keep::always, std::uint64_t copies = 1) {
        t_.add(op, tensor, why, shape, elements, bytes, keep, copies);
    }
    void work(bool backward, Label op, Label tensor, Label formula, Count bytes, Linear linear) {
        t_.workspace(backward, op, tensor, formula, bytes, linear);
    }

    /// transformers' slow_forward, as it runs with no cache and no padding mask.
    void slow() {
        conv_rows();
        x_proj_rows();
        if (x_.inner_norms) {
            dt_proj_input_row();
            add("C norm", "its output C", "each step's y = state C reads C", ssm_shape::sbN,
                tokens_ * N_, d_);
        }
        softplus_rows();
        discretisation_rows();
        recurrence_rows();
        gate_rows();
        recurrence_backward_work();
    }

    /// mamba_ssm's kernels: causal_conv1d_fn keeps x (a view of in_proj's output);
    /// selective_scan_fn copies each operand whose last stride is not 1 and keeps u, delta, A, B,
    /// C, D, z, delta_bias and its chunk states x. Counted with a contiguous copy of u and z each
    /// (leaning high).
    void fused() {
        add("conv1d (causal_conv1d_fn)", "its output u (x_proj's input)",
            "x_proj's weight gradient reads u", ssm_shape::sbdi, sbdi_, d_);
        x_proj_rows();
        if (x_.inner_norms) dt_proj_input_row();
        selective_scan_rows();
        add("out_proj", "its input (the gated scan output)",
            "weight gradient = input^T x output gradient", ssm_shape::sbdi, sbdi_, d_);
    }

    /// The slow path's convolution and SiLU, to u.
    void conv_rows() {
        add("conv1d + SiLU", "the convolution's output, padded to s + K - 1",
            "SiLU's derivative is evaluated at its input", ssm_shape::conv,
            Count(s_ + x_.d_conv - 1) * b_ * di_, d_);
        add("SiLU", "its output u (x_proj's input, and u D's)",
            "x_proj's weight gradient and D's read u", ssm_shape::sbdi, sbdi_, d_);
    }

    /// dt, B and C: x_proj's output, RMSNormed each (Jamba); the norms upcast views of it to fp32.
    void x_proj_rows() {
        if (!x_.inner_norms) {
            add("x_proj", "its output (dt, B and C, one storage)",
                "dt_proj reads dt; the scan reads B and C", ssm_shape::sbx, tokens_ * (r_ + N_ * 2),
                d_);
            return;
        }
        if (d_ ==
            dtype::fp32)  // x.to(fp32) returns the view itself: pow keeps x_proj's whole output
            add("dt, B and C norms (RMSNorm)", "x_proj's output, fp32 (one storage)",
                "pow(x, 2) and x * rsqrt need x", ssm_shape::sbx, tokens_ * (r_ + N_ * 2),
                dtype::fp32);
        for (const auto& [what, width, shape] : {std::tuple{"dt norm", r_, ssm_shape::sbr},
                                                 {"B norm", N_, ssm_shape::sbN},
                                                 {"C norm", N_, ssm_shape::sbN}})
            inner_norm_rows(what, width, shape);
    }

    /// One of the dt, B and C norms, over `width` of x_proj's output per token.
    void inner_norm_rows(const char* what, Count width, const Shape& shape) {
        const std::string op = std::string(what) + " (RMSNorm)";
        if (d_ != dtype::fp32)
            add(op, "its input, upcast to fp32", "pow(x, 2) and x * rsqrt need x", shape,
                tokens_ * width, dtype::fp32);
        if (mean_saves_input_)
            add(op, "x^2, fp32 (mean's input)", "mean's backward keeps its input before torch 2.2",
                shape, tokens_ * width, dtype::fp32);
        add(op, "1/rms per token, fp32", "rsqrt's gradient is written in its output", ssm_shape::sb,
            tokens_, dtype::fp32);
        if (!frozen_norms_)
            add(op, "the normalised input",
                "the weight's gradient is x_norm x the output's gradient", shape, tokens_ * width,
                d_);
    }

    /// dt_proj's input, the dt norm's output (x_proj's output itself without the norms).
    void dt_proj_input_row() {
        add("dt_proj", "its input (the dt norm's output)",
            "weight gradient = input^T x output gradient", ssm_shape::sbr, tokens_ * r_, d_);
    }

    /// delta = softplus(dt_proj(dt)).
    void softplus_rows() {
        add("softplus", "its input (dt_proj's output)",
            "softplus's derivative is evaluated at its input", ssm_shape::sbdi, sbdi_, d_);
        add("softplus", "its output delta", "delta A and delta B read it", ssm_shape::sbdi, sbdi_,
            d_);
    }

    /// A = -exp(A_log), discretised as exp(A delta) and delta B u, in fp32.
    void discretisation_rows() {
        add("A = -exp(A_log)", "exp's output, fp32", "exp's gradient is written in its output",
            ssm_shape::diN, di_ * N_, dtype::fp32);
        add("A = -exp(A_log)", "A, fp32", "A delta's gradient w.r.t. delta reads A", ssm_shape::diN,
            di_ * N_, dtype::fp32);
        work(false, "exp(A delta)", "A delta, fp32, before exp", "4 sb(d_i N)",
             sbdiN_ * dtype::fp32, Linear::none);
        add("exp(A delta)", "discretised A, fp32",
            "exp's gradient is written in its output; every step reads it", ssm_shape::sbdiN,
            sbdiN_, dtype::fp32);
        add("delta B", "B upcast to fp32", "delta B's gradient w.r.t. delta reads B",
            ssm_shape::sbN, tokens_ * N_, dtype::fp32);
        add("delta B u", "delta B, fp32", "its product with u reads it", ssm_shape::sbdiN, sbdiN_,
            dtype::fp32);
        if (d_ != dtype::fp32)
            add("delta B u", "u upcast to fp32", "the product's gradient w.r.t. delta B reads u",
                ssm_shape::sbdi, sbdi_, dtype::fp32);
    }

    /// state = dA state + dBu, one step per token, and y = state C.
    void recurrence_rows() {
        add("the recurrence",
            std::string("the first state (zeros, ") + std::to_string(d_) + " bytes)",
            "state = dA state + dBu reads the state", ssm_shape::bdiN, Count(b_) * di_ * N_, d_);
        if (s_ > 1)
            add("the recurrence", "every later state but the last, fp32",
                "each step's product reads the state before it", ssm_shape::states,
                Count(s_ - 1) * b_ * di_ * N_, dtype::fp32);
        if (d_ != dtype::fp32)
            add("y = state C", "every state cast to the compute dtype",
                "the product's gradient w.r.t. C reads it", ssm_shape::sbdiN, sbdiN_, d_);
        else
            add("y = state C", "the last state, fp32", "the product's gradient w.r.t. C reads it",
                ssm_shape::bdiN, Count(b_) * di_ * N_, dtype::fp32);
    }

    /// (y + u D) SiLU(z), out_proj's input.
    void gate_rows() {
        add("(y + u D) SiLU(z)", "y + u D", "the product's gradient w.r.t. SiLU(z) reads it",
            ssm_shape::sbdi, sbdi_, d_);
        add("(y + u D) SiLU(z)", "SiLU(z)", "the product's gradient w.r.t. y reads it",
            ssm_shape::sbdi, sbdi_, d_);
        add("out_proj", "its input", "weight gradient = input^T x output gradient", ssm_shape::sbdi,
            sbdi_, d_);
    }

    /// Backward accumulates the gradients of dA and dBu from each step's slice: two full fp32
    /// buffers and a full-size temporary per slice's backward. Counted beside a fresh weight
    /// gradient, as before (leaning high; not measured): its gradient of delta goes on to
    /// dt_proj's.
    void recurrence_backward_work() {
        work(true, "the recurrence backward",
             "gradients of dA and dB u, and one step's slice gradient, fp32", "12 sb(d_i N)",
             sbdiN_ * (3 * dtype::fp32), Linear::mamba_dt);
    }

    /// selective_scan_fn's saved operands and its state at each chunk's end.
    void selective_scan_rows() {
        add("selective_scan_fn", "u, copied contiguous", "the scan's backward reruns it from u",
            ssm_shape::sbdi, sbdi_, d_);
        add("selective_scan_fn", "delta (dt_proj's output, copied contiguous)",
            "the scan's backward", ssm_shape::sbdi, sbdi_, d_);
        add("selective_scan_fn", "B and C, copied contiguous", "the scan's backward",
            ssm_shape::sbN, tokens_ * N_, d_, Keep::always, 2);
        add("selective_scan_fn", "the gate z, copied contiguous", "the scan's backward",
            ssm_shape::sbdi, sbdi_, d_);
        add("selective_scan_fn", "A = -exp(A_log) and exp's output, fp32",
            "the scan's backward; exp's gradient", ssm_shape::diN, di_ * N_, dtype::fp32,
            Keep::always, 2);
        add("selective_scan_fn", "D and dt_proj's bias, fp32", "the scan's backward", ssm_shape::di,
            di_, dtype::fp32, Keep::always, 2);
        const std::uint64_t n_chunks = (s_ + selective_scan_chunk - 1) / selective_scan_chunk;
        add("selective_scan_fn", "the state at each 2048-token chunk's end, fp32",
            "the scan's backward starts each chunk from it", ssm_shape::chunks,
            Count(b_) * di_ * N_ * 2 * n_chunks, dtype::fp32);
    }

    TableBuilder& t_;
    const StateSpace& x_;
    const std::uint64_t s_, b_, d_;
    const bool frozen_norms_, mean_saves_input_;
    const Count tokens_, di_, N_, r_;
    const Count sbdi_, sbdiN_;  ///< a d_i-wide tensor and a state per token
};

/// A Mamba layer's mixer in place of attention: in_proj keeps its input, the norm's output, as
/// q/k/v do. Autocast, narrow linears and fine-tuning of its tensors are not modelled.
inline void mamba_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                       std::uint64_t micro_batch) {
    if (z.autocast || z.narrow)
        throw error(
            "Mamba layers under autocast or fp8 linears are not modelled (a bf16 or fp32 recipe "
            "is)");
    if (t.tuning.any())
        throw error(
            "fine-tuning (frozen parts or LoRA) of a model with Mamba layers is not modelled");
    const LinearOutput in_out{z.tokens * (2 * m.ssm.d_inner), "sb(2d_i)", Linear::mamba_in,
                              ActivationSplit::tensor,        {},         {}};
    projection_input_row(t, z, "in_proj", "its input", z.sbh, shape::sbh, 1, in_out, 0,
                         RowFacts{}.output_of_norm().input_of_layer(!m.norms_before_branches()));
    MambaMixer(t, m, z.seq, micro_batch, z.d, false, z.torch->mean_saves_input).write();
}

}  // namespace detail

/// Korthikanti et al.'s GPT layer with its attention replaced by a Mamba mixer as the fused kernels
/// keep it (mamba_ssm; `d`-byte activations): the LayerNorm, the MLP and the dropout masks as the
/// paper's. The formula model's, beside korthikanti_layer (activations.hpp) in all but its file:
/// it writes the mixer's rows above.
inline LayerActivations korthikanti_mamba_layer(const Architecture& m, std::uint64_t seq,
                                                std::uint64_t micro_batch, std::uint64_t d) {
    LayerActivations gpt = korthikanti_layer(m, seq, micro_batch, d);
    LayerActivations layer;
    layer.rows.push_back(gpt.rows[0]);   // the norm's input, the layer's own
    detail::TableBuilder t(layer.rows);  // rows alone: no program
    t.add("in_proj", "its input", "weight gradient = input^T x output gradient", shape::sbh,
          Count(seq) * micro_batch * m.hidden, d);
    Architecture fused = m;
    fused.ssm.kernels = true,
    fused.ssm.inner_norms = false;  // the paper's layer has no inner norms
    detail::MambaMixer(t, fused, seq, micro_batch, d, false).write();
    for (std::size_t i = 8; i < gpt.rows.size(); ++i)
        layer.rows.push_back(gpt.rows[i]);  // residual dropout on
    layer.input_bytes = gpt.input_bytes, layer.checkpoint_tensors = gpt.checkpoint_tensors;
    return layer;
}

}  // namespace memcalc
