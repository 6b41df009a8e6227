#pragma once
/// A Mamba mixer in place of attention.
#include <cstdint>

#include "memcalc/blocks/linear.hpp"
#include "memcalc/ssm_activations.hpp"

namespace memcalc::detail {

/// A Mamba layer's mixer (ssm_activations.hpp) in place of attention: in_proj keeps its input, the
/// norm's output, as q/k/v do. Autocast, narrow linears and fine-tuning of its tensors are not
/// modelled.
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
    const auto add = [&](Label op, Label tensor, Label why, const Shape& shape, Count elements,
                         std::uint64_t bytes, Keep keep = Keep::always, std::uint64_t copies = 1) {
        t.add(op, tensor, why, shape, elements, bytes, keep, copies);
    };
    const auto work = [&](bool backward, Label op, Label tensor, Label formula, Count bytes,
                          Linear weight_gradient) {
        t.workspace(backward, op, tensor, formula, bytes, weight_gradient);
    };
    mamba_mixer_rows(m, z.seq, micro_batch, z.d, false, add, work);
}

}  // namespace memcalc::detail
