#pragma once
/// Linear layers: the inputs they keep, their frozen forward and their backward's sums.
#include <algorithm>
#include <cstdint>
#include <string>

#include "memcalc/blocks/adapters.hpp"

namespace memcalc::detail {

/// bitsandbytes' MatMul4Bit before 0.43.2 keeps its input though only the input's gradient, which
/// reads the weight alone, is made (LayerTuning::quantized_keep_inputs).
inline const std::string kept_by_4bit_matmul = " (kept by bitsandbytes' 4-bit matmul)";
inline const std::string kept_by_4bit_why = "MatMul4Bit's ctx.tensors holds it until backward";

/// The linears of `readers` whose 4-bit matmul keeps their input: none where it needs no gradient
/// (MatMul4Bit keeps it only when its input or weight does).
inline std::uint64_t kept_by_4bit(const TableBuilder& t, LinearSet readers) {
    const bool keeps = t.tuning.quantized_keep_inputs && t.input_grad();
    return keeps ? linears_in(readers & t.tuning.quantized) : 0;
}

/// Which row keeps the input of a layer's linears, if any.
enum class InputRow : std::uint8_t {
    none,     ///< no row: autograd saves nothing of it
    last,     ///< the row just made
    earlier,  ///< a row made before (a parallel layer's shared norm: the q/k/v projections' row)
};
inline InputRow input_row(bool kept) { return kept ? InputRow::last : InputRow::none; }

/// What follows the linears of `readers` under fine-tuning: their adapters' rows, then, where every
/// reader is frozen, their forward's workspace with those rows made (the input alive unless a row
/// keeps it). In backward, an adapted linear's input gradient is summed from the base linears'
/// and the adapters', once the adapters' rows and an input the last row keeps are freed (an
/// earlier row's is alive: its readers' backward is still to run) and the gradients of the
/// linears' adapters and every later tensor written. An
/// adapter's path runs first (autograd takes the latest made): lora_A's input gradient, in its
/// input's dtype (an fp32 adapter's cast of x), with the dropout's, or with its cast back; where
/// several linears read the input, beside the sum so far. Then each sum holds the sum so far, the
/// next gradient and their sum.
inline void after_linears(TableBuilder& t, const Sizes& z, const std::string& op, LinearSet readers,
                          Count tokens, Count elements, const Shape& shape,
                          std::uint64_t input_bytes, InputRow input,
                          const LinearOutput& output = {}, Count stream = {}) {
    if (linears_in(readers & t.tuning.adapted) > 0) {
        const std::uint64_t in = input_bytes, own = adapter_upcast(t, z, in) ? dtype::fp32 : in;
        const std::uint64_t path = t.tuning.adapter_dropout ? 2 * own : own + (own != in ? in : 0);
        const std::uint64_t bytes = std::max(3 * in, path + (linears_in(readers) > 1 ? in : 0));
        t.workspace_at(
            input == InputRow::last ? t.size() - 1 : t.size(), true, op + " backward (LoRA)",
            "its input's gradient: an adapter's path, or the sum so far, the next and their sum",
            bytes_of(bytes, std::string(Text(shape.symbol))), elements * bytes,
            first_linear(readers & t.tuning.adapted), shape.split);
    }
    adapter_rows(t, z, op, readers, tokens, elements, shape, input_bytes);
    merged_padding_rows(t, z, op, readers, tokens, output.elements);
    scaled_output_rows(t, z, op, readers, tokens);
    if ((readers & ~t.tuning.frozen) == 0 && t.tuning.any())
        frozen_linear_work(t, z, op, input != InputRow::none ? Count(0) : elements * input_bytes,
                           output, readers, stream);
}

/// A casting linear's temporaries (Sizes::casts, torchao's): its forward's and its backward's,
/// each the peak of its pass's steps for the largest linear reading `elements` (the op's input),
/// whose output is `output`. Counted whole on every rank: under tensor parallelism the weight's
/// and the output's casts are a shard's (leans high).
inline void linear_casts_work(TableBuilder& t, const Sizes& z, const std::string& op,
                              Count elements, const LinearOutput& output) {
    if (z.casts == nullptr) return;
    if (output.elements == Count(0))
        throw error(op + ": " + std::string(z.casts->name) + " linears here are not modelled");
    const Count out = output.largest > Count(0) ? output.largest : output.elements;
    const Count width_in = elements.value() / z.tokens.value();
    const LinearOperands x{elements, width_in * (out.value() / z.tokens.value()), out, z.d,
                           z.compiled};
    const std::string casts = std::string(z.casts->name) + " casts";
    const std::string formula = "its steps' peak: " + std::string(z.casts->format);
    t.workspace_at(t.size(), false, op, casts + " of its input and weight, and its output", formula,
                   cast_pass_peak(z.casts->forward, x), Linear::none, ActivationSplit::replicated);
    t.workspace_at(t.size(), true, op + " backward",
                   casts + " of its output's gradient, weight and input, and the input's gradient",
                   formula, cast_pass_peak(z.casts->backward, x), output.weight,
                   ActivationSplit::replicated);
}

/// A linear input in the compute dtype (the attention's output, the down projection's): kept while
/// a reader's weight gets a gradient, or while an adapter reads it undropped; then what follows the
/// linears.
inline void linear_input_row(TableBuilder& t, const Sizes& z, const std::string& op,
                             const std::string& what, const Shape& shape, Count tokens,
                             Count elements, LinearSet readers, const LinearOutput& output = {},
                             Count stream = {}) {
    const bool trained = (readers & ~t.tuning.frozen) != 0;
    const bool held = kept_by_4bit(t, readers) > 0;
    const bool kept = trained || held ||
                      ((readers & t.tuning.adapted) != 0 && !t.tuning.adapter_dropout &&
                       !adapter_upcast(t, z, z.d));
    if (kept)
        t.add(op,
              trained ? what
              : held  ? what + kept_by_4bit_matmul
                      : what + " (LoRA A's input)",
              !trained && held ? kept_by_4bit_why : "weight gradient = input^T x output gradient",
              shape, elements, z.d, Keep::always, 1, RowFacts{}.held_by_graph(!trained && held));
    if (trained) linear_casts_work(t, z, op, elements, output);
    after_linears(t, z, op, readers, tokens, elements, shape, z.d, input_row(kept), output, stream);
}

/// Bytes of `symbol`'s elements stored as `s`: "1 sbh", "(1/2 + 1/16) sbh".
inline std::string storage_formula(const Storage& s, const std::string& symbol) {
    if (s.plain()) return bytes_of(bytes_per_element(s.dtype), symbol);
    return "(" + std::to_string(dtype_bits(s.dtype)) + "/8 + " +
           std::to_string(bytes_per_element(s.scale)) + "/" + std::to_string(s.block) + ") " +
           symbol;
}

/// A linear's input saved cast once to `s`: one row of a whole-byte dtype; else a row of its packed
/// values and one of its block scales, each in bytes ("sbh/2", "sbh/16"), the scales' row holding
/// the cast's per-tensor bytes too (NVFP4's fp32 amax).
inline void narrow_input_rows(TableBuilder& t, const Storage& s, const std::string& op,
                              const std::string& what, const Shape& shape, Count elements,
                              const RowFacts& facts) {
    const std::string why = "weight gradient = input^T x output gradient";
    if (s.plain()) {
        t.add(op, what + ", cast once to " + dtype_name(s.dtype), why, shape, elements,
              bytes_per_element(s.dtype), Keep::always, 1, facts);
        return;
    }
    const std::uint64_t per_byte = 8 / dtype_bits(s.dtype), n = elements.value();
    const std::string symbol = shape.symbol;
    const Shape packed{intern(symbol + "/" + std::to_string(per_byte)).data(), shape.split};
    const Shape scales{intern(symbol + "/" + std::to_string(s.block)).data(), shape.split};
    t.add(op, what + ", cast once to " + dtype_name(s.dtype) + " (columnwise, two a byte)", why,
          packed, Count((n + per_byte - 1) / per_byte), 1, Keep::always, 1, facts);
    t.add(op,
          what + ": its cast's " + dtype_name(s.scale) + " scales, one per " +
              std::to_string(s.block),
          why, scales,
          Count((n + s.block - 1) / s.block +
                (s.per_tensor + bytes_per_element(s.scale) - 1) / bytes_per_element(s.scale)),
          bytes_per_element(s.scale), Keep::always, 1, facts);
}

/// What the projections reading a stream tensor keep: that tensor, or under autocast a copy of it
/// cast to the compute dtype by each of the `projections` (autocast caches only the weights'
/// casts). Separate projections are counted, as transformers writes LLaMA's: a fused one casts once
/// (leans high). Narrow (fp8) linears save one cast, as Megatron-LM's fused QKV and gate/up layers
/// make it, and the tensor itself is not kept (Transformer Engine's LayerNormLinear writes its
/// norm's output in fp8); their backward casts the output's gradient to fp8 and transposes it for
/// the two GEMMs (TE 1.x's fp8_cast_transpose_fused), a temporary of 2 narrow bytes per output
/// element while it runs. `readers`: the linears reading the tensor, for fine-tuning: a frozen one
/// keeps no input (autograd saves it for the weight's gradient alone), and under autocast each
/// adapter's lora_A casts it again; 0 where every reader trains. Returns whether the row is the
/// tensor itself (or its casts): none is kept when every reader is frozen and no adapter reads it
/// undropped. The adapters' own rows follow from adapter_rows.
inline bool projection_input_row(TableBuilder& t, const Sizes& z, const std::string& op,
                                 const std::string& what, Count elements, const Shape& shape,
                                 std::uint64_t projections, const LinearOutput& output = {},
                                 LinearSet readers = 0, const RowFacts& facts = {}) {
    if (readers != 0 && t.tuning.any()) {
        const std::uint64_t trained = linears_in(readers & ~t.tuning.frozen),
                            adapters = linears_in(readers & t.tuning.adapted);
        if (trained == 0) {
            if (z.narrow) return false;  // a frozen narrow linear saves no cast of its input
            const std::uint64_t held = kept_by_4bit(t, readers);
            const bool undropped_reads_x =
                adapters > 0 && !t.tuning.adapter_dropout && !adapter_upcast(t, z, z.s);
            // Under autocast each 4-bit linear keeps its own cast (Linear4bit casts x itself).
            const std::uint64_t copies =
                z.autocast ? adapters + held : (undropped_reads_x || held > 0 ? 1 : 0);
            if (copies > 0)
                t.add(
                    op,
                    z.autocast ? what + ", cast to " + dtype_name(z.compute) +
                                     (held > 0 ? " by each LoRA A and 4-bit linear"
                                               : " by each LoRA A (autocast)")
                    : held > 0 ? what + kept_by_4bit_matmul
                               : what + " (LoRA A's input)",
                    held > 0 ? kept_by_4bit_why : "A's gradient = input^T x its output's gradient",
                    shape, elements, z.d, Keep::always, copies, facts.held_by_graph(held > 0));
            return copies > 0;
        }
        projections = std::min(projections, trained) + (z.autocast ? adapters : 0);
    }
    if (z.narrow) {
        narrow_input_rows(t, *z.narrow, op, what, shape, elements, facts);
        if (output.elements > Count(0))
            t.workspace_at(
                t.size(), true, op + " backward",
                "its output's gradient cast to " + storage_name(*z.narrow) +
                    (z.narrow->plain() ? " and transposed" : ", rowwise and columnwise"),
                "2 x " + storage_formula(*z.narrow, std::string(Text(output.symbol))) +
                    (z.narrow->per_tensor > 0 ? " + " + std::to_string(2 * z.narrow->per_tensor)
                                              : ""),
                z.narrow->tensor_bytes(output.elements) * 2, output.weight, output.split);
        return true;
    }
    if (!z.autocast) {
        t.add(op, what, "weight gradient = input^T x output gradient", shape, elements, z.d,
              Keep::always, 1, facts);
        linear_casts_work(t, z, op, elements, output);
        return true;
    }
    t.add(op,
          what + ", cast to " + dtype_name(z.compute) + " by each of " +
              std::to_string(projections) + " (autocast)",
          "weight gradient = input^T x output gradient", shape, elements, z.d, Keep::always,
          projections, facts);
    return true;
}

}  // namespace memcalc::detail
