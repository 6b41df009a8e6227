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
/// output.
inline void activation_rows(TableBuilder& t, const ActivationFunction& fn, const Shape& shape,
                            Count sbf, const std::string& prefix, const std::string& input,
                            std::uint64_t d, bool input_saved) {
    for (std::size_t i = 0; i < fn.kept_count(); ++i) {
        const ActivationTensor& kept = fn.kept[i];
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
/// cast. `dropped`: a dropout between its output and the residual add, whose backward makes the
/// output's gradient.
inline void down_projection_row(TableBuilder& t, const Sizes& z, const std::string& prefix,
                                const std::string& what, const Shape& shape, Count sbf,
                                const LinearOutput& output, Linear down, bool dropped = false) {
    if (z.narrow)
        projection_input_row(t, z, prefix + "down projection", what, sbf, shape, 1, output,
                             bit(down));
    else
        linear_input_row(t, z, prefix + "down projection", what, shape,
                         Count(output.elements.value() / (z.sbh.value() / z.tokens.value())), sbf,
                         bit(down), output,
                         z.sbh * z.d);  // the MLP's input, which its caller holds (the stream:
                                        // its stream_beside)
    // Its backward: its input's gradient beside its own weight's, every row up to its input still
    // live. From the second micro-batch on that fresh gradient counts here, not at the weightless
    // ops around it (measured, peak_live.py: GPT-2, full recomputation, 2 micro-batches peaks at
    // this AddmmBackward0; oneDNN's scratchpad beside it is not counted). After a residual dropout
    // its output's gradient is a tensor of its own, the dropout's backward's, live beside the one
    // the residual passes on (measured, as above, with dropout).
    if (z.narrow) return;
    t.workspace_at(
        t.size(), true, prefix + "down projection backward",
        dropped ? "its input's gradient, and its output's from the residual dropout"
                : "its input's gradient",
        bytes_of(z.d, std::string(Text(shape.symbol))) +
            (dropped ? " + " + bytes_of(z.d, std::string(Text(output.symbol))) : std::string()),
        (sbf + (dropped ? output.elements : Count(0))) * z.d, output.weight, down, shape.split);
}

/// A dense feed-forward block over `tokens` tokens (all of them, or those routed to the experts). A
/// dropout inside it (mlp_dropout, nn.TransformerEncoderLayer's) acts on the down projection's
/// input. Returns whether the op-level policy saves the down projection's output, which the caller
/// places. `dropped`: a residual dropout follows the block (down_projection_row's).
inline bool mlp_rows(TableBuilder& t, const Architecture& m, const Sizes& z, const Shape& shape,
                     Count sbf, const std::string& prefix, Linear down_linear = Linear::down,
                     bool dropped = false) {
    const ActivationFunction& fn = activation_function(m.activation);
    const bool biased = m.bias == Bias::all;
    const std::string act = prefix + std::string(fn.label);
    const bool dropout = m.mlp_dropout > 0;
    // The down projection's output: row-parallel, the width of the stream for as many tokens.
    const bool routed = Text(shape.symbol) == Text(shape::sbkf.symbol);
    const LinearOutput down{Count(sbf.value() / m.ffn) * m.hidden,
                            routed ? "sbk(h)" : "sbh",
                            Linear::down,
                            ActivationSplit::replicated,
                            {},
                            {}};
    // The routed experts' activation, from its input (the first projections' outputs) to the down
    // projection's.
    const Module outer = t.current_section();
    if (outer == Module::moe) t.section(Module::moe_act);
    const auto end_act = [&] { t.section(outer); };
    // The dropout's backward: its incoming gradient and its input's, beside its mask or noise.
    const auto dropout_rows = [&] {
        dropout_row(t, z, z.compute, prefix + "MLP dropout", shape, sbf);
        t.workspace(true, prefix + "MLP dropout backward",
                    "its incoming gradient and its input's gradient",
                    bytes_of(2 * z.d, shape.symbol), Count(2 * z.d) * sbf, Linear::down);
    };
    if (m.mlp == Mlp::gated) {
        const bool gate_saved = t.linear_saved(biased),
                   up_saved = t.linear_saved(biased);  // act(gate(x)) * up(x)
        activation_rows(t, fn, shape, sbf, prefix, "the gate projection's output", z.d, gate_saved);
        t.add(prefix + "gate x up", std::string(fn.label) + "'s output",
              "the up branch's gradient is act(gate) x grad", shape, sbf, z.d);
        t.add(prefix + "gate x up", "the up projection's output",
              "the gate branch's gradient is up x grad", shape, sbf, z.d, Keep::always, 1,
              RowFacts{}.saved_by_policy(up_saved).input_of_module(
                  outer == Module::moe));  // with the gate's, moe_act's input
        if (!fn.up_branch.empty())
            t.add(prefix + "gate x up", std::string(fn.up_branch),
                  "the gate branch's gradient is (up branch) x grad", shape, sbf, z.d);
        // gate x up's backward: its incoming gradient and one for each factor, the down
        // projection's input already freed; the activation's own backward, after it, holds less.
        t.workspace(true, prefix + "gate x up backward",
                    "its incoming gradient and the gradients of both factors",
                    bytes_of(3 * z.d, shape.symbol), Count(3 * z.d) * sbf, Linear::down);
        if (dropout) dropout_rows();
        down_projection_row(
            t, z, prefix, dropout ? "its input (gate x up, dropped out)" : "its input (gate x up)",
            shape, sbf, down, down_linear, dropped);
        end_act();
        return t.linear_saved(biased);
    }
    activation_rows(t, fn, shape, sbf, prefix, "the up projection's output", z.d,
                    t.linear_saved(biased));
    // An output the function keeps is the down projection's input, unless a dropout comes between.
    if (fn.keeps_output && dropout)
        t.add(act, "its output", "its derivative is read from its output", shape, sbf, z.d);
    const std::size_t act_end = t.size();
    if (dropout) dropout_rows();
    down_projection_row(t, z, prefix,
                        dropout ? "its input (the dropped-out hidden)"
                                : "its input (" + std::string(fn.label) + "'s output)",
                        shape, sbf, down, down_linear, dropped);
    const std::uint64_t work = fn.backward_workspace * z.d;
    t.workspace_at(fn.keeps_output && !dropout ? t.size() : act_end, true, act + " backward",
                   fn.kernel == ActivationKernel::fused
                       ? "its incoming gradient and its input's gradient"
                       : "its incoming gradient and the last product's two gradients",
                   bytes_of(work, shape.symbol), Count(work) * sbf, Linear::down);
    end_act();
    return t.linear_saved(biased);
}

}  // namespace memcalc::detail
