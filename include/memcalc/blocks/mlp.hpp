#pragma once
/// MLPs: plain and gated, each activation function as its row keeps it.
#include <cstdint>
#include <string>

#include "memcalc/activation_functions.hpp"
#include "memcalc/blocks/dropout.hpp"
#include "memcalc/blocks/mlp_inputs.hpp"

namespace memcalc::detail {

/// The tensors the MLP's activation function keeps (its row in activation_functions.hpp), read from
/// `input`, the projection it follows; `input_saved`: the op-level policy saves that projection's
/// output. `inputs_only`: a fused GLU kernel recomputes the rest in backward. `compiled`: inside a
/// compiled layer, which keeps what the function's row says.
inline void activation_rows(TableBuilder& t, const ActivationFunction& fn, const Shape& shape,
                            Count sbf, const std::string& prefix, const std::string& input,
                            std::uint64_t d, bool input_saved, bool inputs_only = false,
                            bool compiled = false, TorchVersion torch = TorchVersion::v2_2) {
    for (std::size_t i = 0; i < fn.kept_count(); ++i) {
        const ActivationTensor& kept = fn.kept[i];
        if ((inputs_only && !kept.input) || !fn.kept_when(compiled, torch, i)) continue;
        const std::string op =
            prefix + std::string(fn.label) + (kept.op.empty() ? "" : ": " + std::string(kept.op));
        const std::string tensor(kept.tensor);
        const bool is_input = kept.input;
        // The input of moe_act's checkpoint is its input.
        t.add(op, is_input ? tensor + " (" + input + ")" : tensor, std::string(kept.why), shape,
              sbf, d, Keep::always, 1,
              RowFacts{}
                  .saved_by_policy(is_input && input_saved)
                  .input_of_module(is_input && t.current_section() == Module::moe_act));
    }
}

/// The down projection's input, which nothing else keeps: in the compute dtype, or its one narrow
/// cast.
inline void down_projection_input_row(TableBuilder& t, const Sizes& z, const std::string& prefix,
                                      const std::string& what, const Shape& shape, Count sbf,
                                      const LinearOutput& output, Linear down) {
    if (z.narrow)
        projection_input_row(t, z, prefix + "down projection", what, sbf, shape, 1, output,
                             bit(down));
    else
        linear_input_row(t, z, prefix + "down projection", what, shape,
                         Count(output.elements.value() / (z.sbh.value() / z.tokens.value())), sbf,
                         bit(down), output,
                         // The MLP's input, which its caller holds: the norm's output, in the
                         // stream's dtype (fp32 under autocast, measured: nanoGPT's ln_2 output
                         // beside its frozen c_proj, cpu-third-party-lora.json).
                         z.sbh * z.s);
}

/// What a 4-bit down projection's backward adds to its input's gradient: the weight dequantised,
/// to the dtype it was quantised from and then cast (both alive before the product), the cast
/// alone beside the gradient it makes (bitsandbytes' MatMul4Bit.backward); none for another.
inline Count dequantized_down(const TableBuilder& t, const Sizes& z, Linear down, Count sbf,
                              const LinearOutput& output) {
    if ((t.tuning.quantized & bit(down)) == 0 || down != Linear::down) return Count(0);
    const Count weight =
        Count((sbf.value() / z.tokens.value()) * (output.elements.value() / z.tokens.value()));
    const Count both = weight * dequantized_bytes(t.tuning.dequantized_from, z.compute);
    const Count gradient = sbf * z.d;
    return both > weight * z.d + gradient ? Count(both.value() - gradient.value()) : weight * z.d;
}

/// The down projection's input row and its backward. `dropped`: a dropout between its output and
/// the residual add, whose backward makes the output's gradient. `recomputed`: a compiled layer
/// keeps no input; its backward makes it again (the activation's output) for the weight's gradient.
inline void down_projection_row(TableBuilder& t, const Sizes& z, const std::string& prefix,
                                const std::string& what, const Shape& shape, Count sbf,
                                const LinearOutput& output, Linear down, bool dropped = false,
                                bool recomputed = false) {
    if (!recomputed)
        down_projection_input_row(t, z, prefix, what, shape, sbf, output, down);
    else
        linear_casts_work(t, z, prefix + "down projection", sbf, output);
    // Its backward: its input's gradient beside its own weight's, every row up to its input still
    // live. From the second micro-batch on that fresh gradient counts here, not at the weightless
    // ops around it (measured, peak_live.py: GPT-2, full recomputation, 2 micro-batches peaks at
    // this AddmmBackward0; oneDNN's scratchpad beside it is not counted). After a residual dropout
    // its output's gradient is a tensor of its own, the dropout's backward's, live beside the one
    // the residual passes on (measured, as above, with dropout).
    if (z.narrow) return;
    const std::string symbol(Text(shape.symbol));
    const std::uint64_t inputs = recomputed ? 2 : 1;  // its gradient, and the input made again
    const Count gradients = (sbf * inputs + (dropped ? output.elements : Count(0))) * z.d;
    const Count weight = dequantized_down(t, z, down, sbf, output);
    t.workspace_at(
        t.size(), true, prefix + "down projection backward",
        std::string(recomputed ? "its input, made again, and its gradient"
                               : "its input's gradient") +
            (dropped ? ", and its output's from the residual dropout" : "") +
            (weight > Count(0) ? ", beside its 4-bit weight dequantised" : ""),
        bytes_of(inputs * z.d, symbol) +
            (dropped ? " + " + bytes_of(z.d, std::string(Text(output.symbol))) : std::string()) +
            (weight > Count(0) ? " + its weight" : ""),
        gradients + weight, down, shape.split);
}

/// A dense feed-forward block over `tokens` tokens (all of them, or those routed to the experts). A
/// dropout inside it (mlp_dropout, nn.TransformerEncoderLayer's) acts on the down projection's
/// input. `dropped`: a residual dropout follows the block (down_projection_row's).
class MlpBlock {
public:
    MlpBlock(TableBuilder& t, const Architecture& m, const Sizes& z, const Shape& shape, Count sbf,
             const std::string& prefix, Linear down_linear, bool dropped)
        : t_(t),
          m_(m),
          z_(z),
          shape_(shape),
          sbf_(sbf),
          prefix_(prefix),
          fn_(activation_function(m.activation)),
          down_linear_(down_linear),
          dropped_(dropped),
          dropout_(m.mlp_dropout > 0),
          biased_(m.bias == Bias::all),
          outer_(t.current_section()),
          // Measured for dense MLPs; the experts' own loops keep eager's rows.
          compiled_(z.compiled && outer_ != Module::moe),
          output_recomputed_(compiled_ && fn_.compiled_on(z.runtime.torch).recomputes_output) {}

    /// Writes the block; returns whether the op-level policy saves the down projection's output,
    /// which the caller places.
    bool write() {
        // The routed experts' activation, from its input (the first projections' outputs) to the
        // down projection's.
        if (outer_ == Module::moe) t_.section(Module::moe_act);
        if (m_.mlp == Mlp::gated)
            gated();
        else
            plain();
        t_.section(outer_);
        return t_.linear_saved(biased_, sbf_, m_.hidden);  // sbf x h, as the down projection
    }

private:
    /// The down projection's output: row-parallel, the width of the stream for as many tokens.
    LinearOutput down_output() const {
        const bool routed = Text(shape_.symbol) == Text(shape::sbkf.symbol);
        return {Count(sbf_.value() / m_.ffn) * m_.hidden,
                routed ? "sbk(h)" : "sbh",
                Linear::down,
                ActivationSplit::replicated,
                {},
                {}};
    }

    /// The dropout's backward: its incoming gradient and its input's, beside its mask or noise.
    void dropout_rows() {
        dropout_row(t_, z_, z_.compute, prefix_ + "MLP dropout", shape_, sbf_);
        t_.workspace(true, prefix_ + "MLP dropout backward",
                     "its incoming gradient and its input's gradient",
                     bytes_of(2 * z_.d, shape_.symbol), Count(2 * z_.d) * sbf_);
    }

    /// act(gate(x)) * up(x).
    void gated() {
        const bool gate_saved = t_.linear_saved(biased_, sbf_, m_.hidden),
                   up_saved = t_.linear_saved(biased_, sbf_, m_.hidden);
        activation_rows(t_, fn_, shape_, sbf_, prefix_, "the gate projection's output", z_.d,
                        gate_saved, m_.fused_glu, compiled_, z_.runtime.torch);
        // One kernel where fused; else the function's and the product's. Gate and up read one
        // input: its gradients summed, unless one linear makes both.
        t_.launch(m_.fused_glu ? launches_of(LaunchOp::fused_glu) : fn_.launches);
        if (!m_.fused_glu) t_.launch(LaunchOp::gated_product);
        if (!m_.fused_gate_up) t_.launch(LaunchOp::gradient_sum);
        if (!m_.fused_glu && !output_recomputed_)
            t_.add(prefix_ + "gate x up", std::string(fn_.label) + "'s output",
                   "the up branch's gradient is act(gate) x grad", shape_, sbf_, z_.d);
        t_.add(prefix_ + "gate x up", "the up projection's output",
               "the gate branch's gradient is up x grad", shape_, sbf_, z_.d, Keep::always, 1,
               RowFacts{}.saved_by_policy(up_saved).input_of_module(
                   outer_ == Module::moe));  // with the gate's, moe_act's input
        if (!fn_.up_branch.empty())
            t_.add(prefix_ + "gate x up", std::string(fn_.up_branch),
                   "the gate branch's gradient is (up branch) x grad", shape_, sbf_, z_.d);
        // gate x up's backward: its incoming gradient and one for each factor, the down
        // projection's input already freed; the activation's own backward, after it, holds less.
        t_.workspace(true, prefix_ + "gate x up backward",
                     "its incoming gradient and the gradients of both factors",
                     bytes_of(3 * z_.d, shape_.symbol), Count(3 * z_.d) * sbf_);
        if (dropout_) dropout_rows();
        down_projection_row(
            t_, z_, prefix_,
            dropout_ ? "its input (gate x up, dropped out)" : "its input (gate x up)", shape_, sbf_,
            down_output(), down_linear_, dropped_);
    }

    /// act(up(x)).
    void plain() {
        const std::string act = prefix_ + std::string(fn_.label);
        activation_rows(t_, fn_, shape_, sbf_, prefix_, "the up projection's output", z_.d,
                        t_.linear_saved(biased_, sbf_, m_.hidden), false, compiled_,
                        z_.runtime.torch);
        t_.launch(fn_.launches);
        // An output the function keeps is the down projection's input, unless a dropout comes
        // between.
        if (fn_.keeps_output && dropout_)
            t_.add(act, "its output", "its derivative is read from its output", shape_, sbf_, z_.d);
        const std::size_t act_end = t_.size();
        if (dropout_) dropout_rows();
        down_projection_row(t_, z_, prefix_,
                            dropout_ ? "its input (the dropped-out hidden)"
                                     : "its input (" + std::string(fn_.label) + "'s output)",
                            shape_, sbf_, down_output(), down_linear_, dropped_,
                            output_recomputed_ && !dropout_);
        const std::uint64_t work = fn_.backward_workspace * z_.d;
        t_.workspace_at(fn_.keeps_output && !dropout_ ? t_.size() : act_end, true,
                        act + " backward",
                        fn_.kernel == ActivationKernel::fused
                            ? "its incoming gradient and its input's gradient"
                            : "its incoming gradient and the last product's two gradients",
                        bytes_of(work, shape_.symbol), Count(work) * sbf_);
    }

    TableBuilder& t_;
    const Architecture& m_;
    const Sizes& z_;
    const Shape& shape_;
    Count sbf_;
    const std::string& prefix_;
    const ActivationFunction& fn_;
    Linear down_linear_;
    bool dropped_, dropout_, biased_;
    Module outer_;
    bool compiled_;  ///< a compiled layer's dense MLP: the function's row says what it keeps
    bool output_recomputed_;  ///< and the partition makes the function's output again
};

/// The MLP block's rows and ops (MlpBlock); returns whether the op-level policy saves the down
/// projection's output, which the caller places.
inline bool mlp_rows(TableBuilder& t, const Architecture& m, const Sizes& z, const Shape& shape,
                     Count sbf, const std::string& prefix, Linear down_linear = Linear::down,
                     bool dropped = false) {
    return MlpBlock(t, m, z, shape, sbf, prefix, down_linear, dropped).write();
}

}  // namespace memcalc::detail
