#pragma once
/// LLaMA-Adapter's prompt (lit-gpt's adapter.py, LayerTuning::prompt_tokens): every query attends
/// to the layer's learned prompt through SDPA with a boolean mask, which PyTorch's CUDA dispatch
/// runs on its memory-efficient kernel, and the result, gated per head, joins the attention's
/// output. The prompt's keys and values are cached once, outside any graph (the loop's first
/// validation, under no_grad, makes them), so nothing of them is kept here.
#include <cstdint>

#include "memcalc/blocks/linear.hpp"
#include "memcalc/blocks/output_projection.hpp"

namespace memcalc::detail {

inline const Shape prompt_bias{"s(p16)", ActivationSplit::replicated};  ///< per query, prompt key
inline const Shape prompt_lse{"a(s32)b", ActivationSplit::tensor};      ///< per head, query row

/// The prompt attention's rows, after the attention's own kernel. Where q needs a gradient the
/// kernel keeps its mask made a bias in the compute dtype, padded to 16 columns (pad_bias), and a
/// log-sum-exp per query row, fp32, 32 rows aligned; the gate's product keeps the kernel's output
/// (written batch-first) for the gate's gradient, whether or not q needs one. The output projection
/// reads the gated sum (a copy, where the attention's output was heads-first), which needs a
/// gradient from here: what keeps it (a 4-bit projection's ctx) keeps it even in the first
/// prompted layer. `output`: the attention output's shape.
inline void prompt_attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                                  const Shape& output) {
    const std::uint64_t p = t.tuning.prompt_tokens, b = z.tokens.value() / z.seq;
    const auto round_up = [](std::uint64_t n, std::uint64_t to) { return (n + to - 1) / to * to; };
    t.add("prompt attention", "its mask as a bias, padded to 16 columns",
          "backward adds it to the scores it remakes", prompt_bias, Count(z.seq * round_up(p, 16)),
          z.d);
    t.add("prompt attention", "log-sum-exp per query row, fp32, 32-row aligned",
          "backward rebuilds the softmax from it", prompt_lse,
          Count(m.heads * round_up(z.seq, 32) * b), dtype::fp32);
    const bool quiet = t.quiet(), input_grad = t.input_grad();
    t.quiet(false);
    t.add("prompt gate", "the prompt attention's output",
          "the gate's gradient sums its output's gradient times it", shape::sbq, z.sbq, z.d);
    t.input_grad(true);
    projection_input_row(t, z, "output projection", "its input (the gated sum)", z.sbv, output, 1,
                         output_projection(z), bit(Linear::o));
    scaled_output_rows(t, z, "output projection", bit(Linear::o), z.tokens);
    t.input_grad(input_grad);
    t.quiet(quiet);
    t.workspace(false, "prompt gate", "the gated output and its sum with the attention's",
                bytes_of(2 * z.d, "sb(ad)"), Count(2 * z.d) * z.sbq);
    if (!t.input_grad()) return;  // q needs no gradient: the gate's alone, a sum
    t.workspace(true, "prompt attention backward",
                "its output's gradient through the gate, dq, and a row sum per query",
                bytes_of(2 * z.d, "sb(ad)") + " + 4 asb",
                Count(2 * z.d) * z.sbq + Count(m.heads) * z.tokens * dtype::fp32);
}

}  // namespace memcalc::detail
