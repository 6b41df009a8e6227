#pragma once
/// Falcon-H1's mixer (transformers' FalconH1DecoderLayer.forward, modeling_falcon_h1.py): a
/// Mamba-2 mixer and attention side by side on the layer's normed input, each reading its own copy
/// of it scaled by ssm_in_multiplier or attention_in_multiplier (a product by a Python float:
/// autograd keeps none of its inputs, the projections keep the copy); the norm's output, and the
/// mixer's output scaled by ssm_out_multiplier once it is made, are held until the two are summed.
#include <cstdint>

#include "memcalc/blocks/attention.hpp"
#include "memcalc/blocks/mamba2.hpp"

namespace memcalc::detail {

/// The mixer first, as the layer's forward runs it, on mamba_ssm's fused kernel: in_proj's output
/// is multiplied by the mup_vector buffer (FalconH1Mixer.cuda_kernels_forward) into zxbcdt, the
/// product's input and output side by side for a moment; then attention.
inline void attention_mamba2_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                                  std::uint64_t micro_batch, Attention attention) {
    require_plain_mamba2(t, z);
    // The norm's output stays bound to hidden_states until the sum: no row keeps it. Backward
    // runs attention's branch first (made later), its gradient of that output held for this one.
    const Count sbh = z.sbh * z.d;
    t.branch_held("the norm's output (hidden_states), held until the sum", sbh,
                  "the norm output's gradient from attention, held for in_proj's", sbh);
    mamba2_input_row(t, m, z, RowFacts{});  // hidden_states * ssm_in_multiplier
    const Count zxbcdt = z.tokens * m.ssm.in_proj_width() * z.d;
    t.workspace(false, "in_proj(x) * mup_vector", "in_proj's output and zxbcdt, its product",
                std::to_string(z.d) + " sb(2d_i+2GN+H) x 2", zxbcdt * 2);
    mamba2_mixer_rows(t, m.ssm, z.tokens, z.d);
    mamba2_workspaces(t, m.ssm, z.seq, micro_batch, z.d);
    t.gradient(Linear::mamba_out);
    t.branch_held("the norm's output and the Mamba-2 output (x ssm_out_multiplier), held", sbh * 2,
                  "the sum's gradient, held for the Mamba-2 branch", sbh);
    attention_rows(t, m, z, attention, false);  // on hidden_states * attention_in_multiplier
    t.branch_held("", Count(0), "", Count(0));
}

}  // namespace memcalc::detail
