#pragma once
/// Linear layers' outputs and LoRA/DoRA/QLoRA adapters beside them.
#include <algorithm>
#include <cstdint>
#include <string>

#include "memcalc/blocks/dropout.hpp"
#include "memcalc/blocks/layer_builder.hpp"
#include "memcalc/blocks/sizes.hpp"

namespace memcalc::detail {

/// The output of the linear layer(s) reading a saved input: what a narrow linear's backward casts.
struct LinearOutput {
    Count elements;     ///< none: not counted (a linear that is no Transformer Engine module)
    Label symbol = "";  ///< its elements in the paper's letters: "sb(ad) + 2 sb(kd)"
    Linear weight = Linear::none;  ///< the first linear whose gradient the backward writes (q)
    /// A column-parallel output divides by tp; a row-parallel one's gradient is gathered whole.
    ActivationSplit split = ActivationSplit::tensor;
    Count largest;  ///< the largest one linear's output, where several share the input; none:
                    ///< elements
    /// Made between the readers and still alive when the last one runs: a gated MLP's act(gate(x)),
    /// which transformers computes before up(x). Elements in the compute dtype.
    Count between;
};

inline constexpr Shape sbr{"sbr",
                           ActivationSplit::replicated};  ///< a LoRA adapter's r-wide intermediate

inline std::uint64_t linears_in(LinearSet set) {
    std::uint64_t n = 0;
    for (; set != 0; set &= set - 1) ++n;
    return n;
}

/// Whether each adapter casts its input (of `input_bytes`) to fp32, peft's fp32 adapters beside a
/// 16-bit model: a copy per adapter. Under autocast the input is the fp32 stream already.
inline bool adapter_upcast(const TableBuilder& t, const Sizes& z, std::uint64_t input_bytes) {
    return t.tuning.adapter_fp32 && !z.autocast && input_bytes != dtype::fp32;
}

/// An adapter's own dtype: fp32, or the model's (under autocast lora_A computes in the compute
/// dtype).
inline std::uint64_t adapter_bytes(const TableBuilder& t, const Sizes& z) {
    return t.tuning.adapter_fp32 && !z.autocast ? dtype::fp32 : z.d;
}

inline constexpr Shape sbo{"sb(out)",
                           ActivationSplit::tensor};  ///< a column-parallel linear's output
inline constexpr Shape sbo_whole{
    "sb(out)", ActivationSplit::replicated};  ///< a row-parallel one's, gathered whole
inline constexpr Shape out_vector{
    "out", ActivationSplit::replicated};  ///< a value per output row (leans high)
inline constexpr Shape weight_shape{"out x in",
                                    ActivationSplit::tensor};  ///< a copy of a linear's weight

/// Whether DoRA's forward makes a copy of the base weight in the adapter's dtype: a 4-bit base is
/// dequantised, a base of another dtype cast (peft's dequantize_module_weight(...).to(x.dtype)).
inline bool dora_weight_copied(const TableBuilder& t, const Sizes& z) {
    return t.tuning.dequantized > Count(0) || adapter_bytes(t, z) != z.d || z.autocast;
}

/// DoRA (peft's DoraLinearLayer) adds, per adapted linear among `readers`, out = m / ||W + B A|| x
/// (base output) - base output + m / ||W + B A|| x B A x x scaling, with the norm detached: the
/// products keep the base output (in the model's dtype; with a dropout peft recomputes it as
/// F.linear(dropout(x), W) in the adapter's) and B A x (the adapter's), and three vectors of out (m
/// / norm, it minus 1, the norm). With a dropout that F.linear keeps W for x's gradient: a copy
/// where W was dequantised or cast. Measured per layer on CPU (validation/results/cpu-dora.txt).
inline void dora_rows(TableBuilder& t, const Sizes& z, const std::string& op, LinearSet readers,
                      Count tokens) {
    if (!t.tuning.dora) return;
    const std::uint64_t own = adapter_bytes(t, z);
    const bool dropped = t.tuning.adapter_dropout;
    for (const LinearRow& l : linear_rows) {
        if ((readers & t.tuning.adapted & bit(l.linear)) == 0) continue;
        const AdaptedShape& w = t.tuning.shapes[static_cast<std::size_t>(l.linear)];
        const Shape& out = l.row_parallel ? sbo_whole : sbo;
        const std::string at = op + ": DoRA (" + l.tensor + ")";
        t.add(at, dropped ? "the base output, F.linear(dropout(x), W)" : "the base output",
              "the magnitude's gradient = (base output + B A x) x its output's gradient", out,
              tokens * w.out, dropped ? own : z.d);
        t.add(at, "B A x, the adapter's output", "the magnitude's gradient", out, tokens * w.out,
              own);
        t.add(at, "m / ||W + B A||, it minus 1, and the norm",
              "the products' and the division's gradients", out_vector, Count(w.out) * w.modules,
              own, Keep::always, 3);
        if (dropped && dora_weight_copied(t, z))
            t.add(at,
                  t.tuning.dequantized > Count(0) ? "the base weight, dequantised"
                                                  : "the base weight, cast",
                  "x's gradient through F.linear(dropout(x), W) = its output's gradient x W",
                  weight_shape, Count(w.out) * w.in * w.modules, own);
    }
}

/// A's output width among `readers`' adapters: r, or r a part for a merged adapter.
inline std::uint64_t adapted_rank(const TableBuilder& t, LinearSet readers) {
    std::uint64_t rank = 0;
    for (const LinearRow& l : linear_rows)
        if ((readers & t.tuning.adapted & bit(l.linear)) != 0)
            rank = std::max(rank, t.tuning.shapes[static_cast<std::size_t>(l.linear)].rank);
    return rank > 0 ? rank : t.tuning.rank;
}

/// What each LoRA adapter among `readers` keeps beside its frozen linear, as peft's Linear runs
/// base(x) + lora_B(lora_A(dropout(x.to(adapter dtype)))) * scaling over `tokens` tokens of input
/// `elements`: with a dropout its mask (or CPU noise) and, unless autocast's cast of it is counted
/// with the input, the dropped-out input that lora_A reads; undropped, an fp32 adapter's cast of x;
/// A's r-wide output, which lora_B keeps. The scaling and the sum keep nothing (measured).
inline void adapter_rows(TableBuilder& t, const Sizes& z, const std::string& op, LinearSet readers,
                         Count tokens, Count elements, const Shape& shape,
                         std::uint64_t input_bytes) {
    const std::uint64_t adapters = linears_in(readers & t.tuning.adapted);
    if (adapters == 0) return;
    const std::string each =
        adapters > 1 ? " (each of " + std::to_string(adapters) + " adapters)" : "";
    const bool upcast = adapter_upcast(t, z, input_bytes);
    const std::uint64_t own = adapter_bytes(t, z);
    if (t.tuning.adapter_dropout) {
        const DType input = upcast || input_bytes == dtype::fp32 ? DType::fp32 : z.compute;
        if (t.input_grad())  // a dropout keeps its mask for its input's gradient alone
            dropout_row(t, z, input, op + ": LoRA dropout" + each, shape, elements, Keep::always,
                        adapters);
        if (!z.autocast)
            t.add(op + ": LoRA A", "its input, the dropped-out input" + each,
                  "A's gradient = input^T x its output's gradient", shape, elements,
                  upcast ? dtype::fp32 : input_bytes, Keep::always, adapters);
    } else if (upcast) {
        t.add(op + ": LoRA A", "its input, cast to fp32 for the fp32 adapter" + each,
              "A's gradient = input^T x its output's gradient", shape, elements, dtype::fp32,
              Keep::always, adapters);
    }
    t.add(op + ": LoRA B", "its input, A's r-wide output" + each,
          "B's gradient = input^T x its output's gradient", sbr, tokens * adapted_rank(t, readers),
          own, Keep::always, adapters);
    dora_rows(t, z, op, readers, tokens);
    t.input_grad(true);  // the adapter's output joins the graph
}

/// LLaMA-Adapter v2's scaled linears among `readers` (LayerTuning::scaled: lit-gpt's
/// AdapterV2Linear, scale x (linear(x) + bias)): the product keeps the sum for the scale's
/// gradient, whether or not anything before needed one (the bias does), in the compute dtype, or
/// fp32 under autocast (a bf16 output plus an fp32 bias). The output needs a gradient from here.
/// `head`: the output head's, over the vocabulary.
inline void scaled_output_rows(TableBuilder& t, const Sizes& z, const std::string& op,
                               LinearSet readers, Count tokens, bool head = false) {
    const LinearSet scaled = readers & t.tuning.scaled;
    if (scaled == 0) return;
    const bool quiet = t.quiet();
    t.quiet(false);
    for (const LinearRow& l : linear_rows) {
        if ((scaled & bit(l.linear)) == 0) continue;
        const AdaptedShape& w = t.tuning.shapes[static_cast<std::size_t>(l.linear)];
        t.add(op + ": adapter v2 (" + l.tensor + ")", "its output plus the adapter's bias",
              "the scale's gradient = that x the output's gradient",
              head             ? shape::sbV
              : l.row_parallel ? sbo_whole
                               : sbo,
              tokens * w.out, z.autocast ? dtype::fp32 : z.d);
    }
    t.quiet(quiet);
    t.input_grad(true);
}

/// A merged adapter (LoraVariantRow::merged) over part of a fused linear's output, `fused`
/// elements: lit-gpt's zero_pad index_copies B's output into zeros of the fused width, and
/// index_copy keeps its source for the size of its gradient (and the index, int64 a column).
inline void merged_padding_rows(TableBuilder& t, const Sizes& z, const std::string& op,
                                LinearSet readers, Count tokens, Count fused) {
    if (!t.tuning.merged) return;
    for (const LinearRow& l : linear_rows) {
        if ((readers & t.tuning.adapted & bit(l.linear)) == 0) continue;
        const AdaptedShape& w = t.tuning.shapes[static_cast<std::size_t>(l.linear)];
        if (!w.fused || tokens * w.out >= fused) continue;  // apart, or every part: no padding
        const std::string at = op + ": LoRA zero padding (index_copy)";
        t.add(at, "its source, B's output at the adapted parts' width",
              "the source's gradient is the output's, selected and shaped as the source", sbo,
              tokens * w.out, adapter_bytes(t, z));
        t.add(at, "the index of the adapted columns, int64", "the gradient is selected by it",
              out_vector, Count(w.out), 8);
    }
}

/// The forward of frozen linears whose input no row keeps: that input is alive while they run,
/// beside their outputs and what is made between them (a gated MLP's activation:
/// LinearOutput::between) and, beside the MLP, the residual stream the layer adds them to
/// (`stream`); an adapter's lora_B output scaled and its sum with the base output follow, in the
/// adapter's dtype (an fp32 adapter's sum is promoted to fp32; on CPU the add first copies the
/// narrower operand to that dtype, as it does the scores before the mask: Sizes::upcast). Counted
/// at the last reader, with every output made: leaning high where only an earlier one is adapted.
/// Measured: the whole step under full recomputation peaks here when nothing is saved
/// (validation/results/cpu-lora-step.json).
inline void frozen_linear_work(TableBuilder& t, const Sizes& z, const std::string& op,
                               Count input_alive, const LinearOutput& out, LinearSet readers,
                               Count stream = {}) {
    if (out.elements == Count(0)) return;  // a linear whose outputs are not tabled: not counted
    const bool adapted = (readers & t.tuning.adapted) != 0;
    const std::uint64_t own = adapter_bytes(t, z), sum = std::max(own, z.d);
    const std::uint64_t copy = !z.kernels->casts_on_read && own != z.d ? sum : 0;
    const Count largest = out.largest > Count(0) ? out.largest : out.elements;
    const Count bytes = input_alive + stream + (out.elements + out.between) * z.d +
                        (adapted ? largest * (own + copy + sum) : Count(0));
    const std::string copied = copy ? ", its CPU copy of the base output" : "";
    t.workspace(false, op + " (frozen)",
                adapted
                    ? "its input and outputs, an adapter's scaled output" + copied + " and the sum"
                    : "its input and outputs",
                adapted ? std::string("input + outputs + (scaled + ") + (copy ? "copy + " : "") +
                              "sum) x the largest"
                        : "input + outputs",
                bytes, out.weight);
}

/// torch's non-reentrant checkpoint reruns a layer's forward when its backward first reads a saved
/// tensor; the ops before that read have run. An adapter beside the layer's last linear, whose
/// output goes straight to the residual add, is reached through ops that save nothing (the cast
/// back to the base's dtype, the sum, the scaling): the scaled output's gradient in the adapter's
/// dtype, and for an adapter of another dtype the base output's gradient cast back, are alive while
/// the forward reruns. `elements`: that linear's output.
inline Count adapter_gradients_at_rerun(const TableBuilder& t, const Sizes& z, Count elements) {
    const std::uint64_t own = adapter_bytes(t, z);
    return elements * (own + (own != z.d ? z.d : 0));
}

}  // namespace memcalc::detail
