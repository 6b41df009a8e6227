#pragma once
/// Normalisation blocks: RMSNorm (as transformers writes it) and LayerNorm.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "memcalc/blocks/layer_builder.hpp"
#include "memcalc/blocks/sizes.hpp"

namespace memcalc::detail {

/// A normalisation layer's saved tensors. `what` names it ("attention norm"). `input_kept`: its
/// input is a tensor another row already keeps (a parallel layer's second norm reads the layer
/// input too). `layer_input`: it reads the layer's input, so a saved input that is no copy is the
/// checkpoint itself. HF's RMSNorm over `elements` values of `input` bytes each, normalised in
/// `rows` rows: x.float(); x * rsqrt(mean(x^2) + eps); weight * result.to(input dtype). The upcast
/// is a new tensor unless x is fp32 already. `fp32_scale`: the weight multiplies the fp32 result
/// before the cast back (Architecture::rmsnorm_fp32_scale), which keeps it in fp32. Returns whether
/// the saved input is x itself. `fp32_input`: the saved fp32 input when it is x itself, a view of a
/// wider storage that it keeps whole.
struct SavedStorage {
    std::string what;
    Shape shape;
    Count elements;
};
/// RMSNorm's backward op by op, as torch's autograd formulas run it (validation/norm_backward.py
/// lists each allocation on CPU): the weight's product holds its incoming gradient and its two
/// products (the weight's only where it trains) in the normalised input's dtype, `out` bytes; x *
/// rsqrt the gradient upcast to the ops' dtype (`work` bytes: fp32, or x's without the upcast) and
/// its two products; pow(x, 2), after mean's backward, five such tensors: x * rsqrt's part of x's
/// gradient, mean's, and pow's three. `x2`, `rms`, `normalised`: their rows' indices (x2 and
/// normalised may be absent).
struct RmsnormRows {
    std::size_t x2, rms, normalised, end;
    static constexpr std::size_t none = ~std::size_t{0};
};
inline void rmsnorm_backward_work(TableBuilder& t, const std::string& what, const Shape& shape,
                                  Count elements, const RmsnormRows& at, bool weighted,
                                  std::uint64_t out, std::uint64_t work) {
    const std::string op = what + " (RMSNorm) backward";
    const auto add = [&](std::size_t before, const char* step, const char* tensors,
                         std::uint64_t bytes) {
        t.workspace_at(before, true, op + ": " + step, tensors, bytes_of(bytes, shape.symbol),
                       elements * bytes, Linear::none, shape.split);
    };
    if (weighted) {
        const bool trains = !t.tuning.frozen_norms;
        add(at.end, "x_norm * weight",
            trains ? "its incoming gradient and both products"
                   : "its incoming gradient and x_norm's",
            (trains ? 3 : 2) * out);
    }
    const bool fp32 = work == dtype::fp32;
    add(at.normalised == RmsnormRows::none ? at.end : at.normalised, "x * rsqrt",
        fp32 ? "the gradient in fp32 and both products" : "the gradient and both products",
        3 * work);
    add(at.x2 == RmsnormRows::none ? at.rms : at.x2, "pow(x, 2)",
        fp32 ? "x's gradient so far, mean's, and pow's three, fp32"
             : "x's gradient so far, mean's, and pow's three",
        5 * work);
}

/// Eager RMSNorm's kernels pass their intermediates through memory (EagerTraffic), in the ops'
/// dtype (`work` bytes): forward,
/// pow(x, 2)'s output (unless mean keeps it, a row) and x * rsqrt's; backward, the temporaries of
/// rmsnorm_backward_work's steps but the gradients the element-wise passes count (the incoming
/// one, x's): the weight's products, x * rsqrt's upcast gradient and its two products, and pow's
/// three and mean's.
inline void rmsnorm_temporaries(TableBuilder& t, const std::string& what, const Shape& shape,
                                Count elements, const RmsnormRows& at, bool weighted,
                                std::uint64_t out, std::uint64_t work) {
    const std::uint64_t forward = (at.x2 == RmsnormRows::none ? work : 0) + work;
    t.temporaries(false, what + " (RMSNorm)", elements * forward, shape.split);
    const std::uint64_t products = weighted ? (t.tuning.frozen_norms ? 1 : 2) * out : 0;
    t.temporaries(true, what + " (RMSNorm) backward", elements * (products + 7 * work),
                  shape.split);
}

/// A fused RMSNorm kernel (Transformer Engine's, Apex's FusedRMSNorm) keeps its input as it is
/// (unless a row kept it already: `input_kept`) and 1/rms per row in fp32; its backward is one
/// kernel, the incoming gradient and the input's.
inline bool fused_rmsnorm_rows(TableBuilder& t, const std::string& what, const Shape& shape,
                               Count elements, const Shape& row_shape, Count rows,
                               const std::string& row_name, std::uint64_t input,
                               const RowFacts& input_facts = {}, bool input_kept = false) {
    t.launch(LaunchOp::fused_norm);
    const std::string op = what + " (RMSNorm, fused)";
    if (!input_kept)
        t.add(op, "its input", "the kernel's backward reads x", shape, elements, input,
              Keep::always, 1, input_facts);
    t.add(op, "1/rms per " + row_name + ", fp32", "so backward need not recompute it", row_shape,
          rows, dtype::fp32);
    t.workspace_at(t.size(), true, op + " backward", "its incoming gradient and its input's",
                   bytes_of(2 * input, shape.symbol), elements * (2 * input), Linear::none,
                   shape.split);
    return true;
}

/// `weighted`: false for a norm without a weight (Llama 4's L2 norm of q and k), which keeps no
/// x_norm. Before torch 2.2 mean() keeps its input, x^2 (z.torch). The ops run on an fp32 copy
/// of x, or in x's own dtype where the kernel does not upcast (Sizes::rmsnorm_upcast), keeping x
/// itself, x^2 and 1/rms in it.
inline bool rmsnorm_rows(TableBuilder& t, const Sizes& z, const std::string& what,
                         const Shape& shape, Count elements, const Shape& row_shape, Count rows,
                         const std::string& row_name, std::uint64_t input, bool fp32_scale = false,
                         const std::optional<SavedStorage>& fp32_input = std::nullopt,
                         bool weighted = true, const RowFacts& input_facts = {}) {
    if (z.fused_rmsnorm && weighted && !fp32_scale)
        return fused_rmsnorm_rows(t, what, shape, elements, row_shape, rows, row_name, input,
                                  input_facts);
    const std::uint64_t work = z.rmsnorm_upcast ? dtype::fp32 : input;
    const std::string in = work == dtype::fp32 ? "fp32" : dtype_name(z.compute);
    t.launch(LaunchOp::rmsnorm);
    if (!t.input_grad()) {  // x needs no gradient: a trained weight's product keeps x_norm alone
        if (weighted && !t.tuning.frozen_norms)
            t.add(what + " (RMSNorm)", "the normalised input",
                  "the weight's gradient is x_norm x the output's gradient", shape, elements,
                  fp32_scale ? dtype::fp32 : input);
        return false;
    }
    if (input != work) t.launch(LaunchOp::rmsnorm_casts);  // x.float() and the cast back
    if (input == work && fp32_input)
        t.add(what + " (RMSNorm)", fp32_input->what, "pow(x, 2) and x * rsqrt need x",
              fp32_input->shape, fp32_input->elements, work, Keep::always, 1, input_facts);
    else
        t.add(what + " (RMSNorm)",
              input == work ? "its input (" + in + ")" : "its input, upcast to fp32",
              "pow(x, 2) and x * rsqrt need x", shape, elements, work, Keep::always, 1,
              input == work ? input_facts : RowFacts{});
    RmsnormRows at{RmsnormRows::none, 0, RmsnormRows::none, 0};
    if (z.torch->mean_saves_input) {
        at.x2 = t.size();
        t.add(what + " (RMSNorm)", "x^2, " + in + " (mean's input)",
              "mean's backward keeps its input before torch 2.2", shape, elements, work);
    }
    at.rms = t.size();
    t.add(what + " (RMSNorm)", "1/rms per " + row_name + ", " + in,
          "rsqrt's gradient is written in its output", row_shape, rows, work);
    const std::uint64_t out = fp32_scale ? dtype::fp32 : input;
    if (weighted &&
        !t.tuning.frozen_norms) {  // autograd keeps x_norm only for a weight that gets a gradient
        at.normalised = t.size();
        t.add(what + " (RMSNorm)",
              fp32_scale ? "the normalised input, fp32" : "the normalised input",
              "the weight's gradient is x_norm x the output's gradient", shape, elements, out);
    }
    at.end = t.size();
    rmsnorm_backward_work(t, what, shape, elements, at, weighted, out, work);
    if (!z.compiled) rmsnorm_temporaries(t, what, shape, elements, at, weighted, out, work);
    return input == work;
}

/// `branch_output`: a post-norm, reading a branch's output in the compute dtype, not the residual
/// stream. Returns whether a row of it, or of an earlier norm (`input_kept`), is its input itself.
inline bool norm_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                      const std::string& what, bool input_kept = false, bool layer_input = false,
                      bool branch_output = false) {
    const std::uint64_t input = branch_output ? z.d : z.s;
    // A compiled layer's partition keeps what the fused kernel keeps: measured for the layer's own
    // norms of LLaMA's form (validation/compile_partitioner.py); the others keep eager's rows.
    const bool compiled_like_fused = z.compiled && !m.rmsnorm_fp32_scale;
    if (m.norm == Norm::rmsnorm && (z.fused_rmsnorm || compiled_like_fused))
        return fused_rmsnorm_rows(t, what, shape::sbh, z.sbh, shape::sb, z.tokens, "token", input,
                                  RowFacts{}.input_of_layer(layer_input).input_of_module(),
                                  input_kept);
    if (m.norm == Norm::rmsnorm) {
        // On the residual stream, in its dtype (fp32 under autocast, where the input kept is the
        // stream itself), or on a branch's output in the compute dtype.
        // Where its saved input is x itself, that is the module's input (and maybe the layer's).
        const bool keeps_input =
            rmsnorm_rows(t, z, what, shape::sbh, z.sbh, shape::sb, z.tokens, "token", input,
                         m.rmsnorm_fp32_scale, std::nullopt, true,
                         RowFacts{}.input_of_layer(layer_input).input_of_module());
        return keeps_input || input_kept;
    } else {
        if (!input_kept) {
            t.add(what + " (LayerNorm)", "its input", "normalisation's gradient needs the input",
                  shape::sbh, z.sbh, input, Keep::always, 1,
                  RowFacts{}.input_of_layer(layer_input).input_of_module());
        }
        t.launch(LaunchOp::layer_norm);
        const bool fp32 = z.kernels->norm_statistics_fp32;  // else in its input's dtype
        t.add(what + " (LayerNorm)",
              std::string("mean and 1/std per token, ") +
                  (fp32 ? "fp32" : dtype_name(branch_output ? z.compute : z.stream)),
              "so backward need not recompute them", shape::sb, z.tokens,
              fp32 ? dtype::fp32 : input, Keep::always, 2);
        // Its backward, one kernel: the incoming gradient and its input's.
        t.workspace_at(t.size(), true, what + " (LayerNorm) backward",
                       "its incoming gradient and its input's gradient",
                       bytes_of(2 * input, shape::sbh.symbol), z.sbh * (2 * input), Linear::none,
                       shape::sbh.split);
        return true;
    }
}

}  // namespace memcalc::detail
