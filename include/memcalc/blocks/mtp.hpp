#pragma once
/// Multi-token prediction's modules (Architecture::mtp_layers) as the head's program carries them.
/// Megatron-LM's MultiTokenPredictionBlock (core 0.13, multi_token_prediction.py) runs after the
/// last layer, before the head, and its backward follows the head's: what it saves lives from the
/// loss step to the start of backward, as the head's own rows do. Nothing in it is recomputed.
#include <cstdint>
#include <string>

#include "memcalc/blocks/ends.hpp"

namespace memcalc {

namespace detail {
/// Each module's own rows before its layer's: the next tokens' ids (rolled: a new tensor, which
/// the embedding keeps), the norms of their embedding and of the hidden states (whose input is
/// the head's, kept already), eh_proj's input (both norms' outputs concatenated).
inline void mtp_input_rows(LayerActivations& module, const Architecture& m, const Sizes& z,
                           const LayerTuning& tuning) {
    TableBuilder t(module.rows, &module, tuning);
    t.add("embedding", "the next tokens' ids (rolled, int64)",
          "the gradient is scattered into their rows", shape::ids, z.tokens, 8);
    norm_rows(t, m, z, "embedding norm");
    norm_rows(t, m, z, "hidden-state norm", true);
    constexpr Shape sb2h{"sb(2h)", ActivationSplit::sequence};
    t.add("eh_proj", "its input, both norms' outputs concatenated",
          "its weight's gradient is input^T x grad", sb2h, z.sbh * 2, z.d);
}
}  // namespace detail

/// Adds each module's saves to `head`: its own rows, `layer`'s rows as it keeps them without
/// recomputation (a layer of the last kind), and a second final norm, head and loss (a fused
/// loss's logits among them: the module's own, held until its backward).
inline void add_mtp_rows(LayerActivations& head, const Architecture& m,
                         const LayerActivations& layer, std::uint64_t seq,
                         std::uint64_t micro_batch, Precision precision, Runtime runtime,
                         LossKernel loss, const LayerTuning& tuning) {
    if (m.mtp_layers == 0) return;
    LayerActivations module;
    detail::mtp_input_rows(module, m, detail::Sizes(m, seq, micro_batch, precision, runtime),
                           tuning);
    for (SavedTensor row : layer.rows)
        if (row.kept(Recompute::none)) module.rows.push_back((row.keep = Keep::always, row));
    for (const SavedTensor& row :
         head_program(m, seq, micro_batch, precision, runtime, loss, tuning).rows)
        module.rows.push_back(row);
    if (loss == LossKernel::fused) {  // the main head's logits are the loop's (LogitsLife)
        const detail::Sizes z(m, seq, micro_batch, precision, runtime);
        detail::TableBuilder t(module.rows, &module, tuning);
        t.add("loss (fused)", "the logits, the gradient written over them",
              "backward hands them on", shape::sbV, z.tokens * m.vocab, z.d);
    }
    for (std::uint64_t i = 0; i < m.mtp_layers; ++i)
        for (SavedTensor row : module.rows) {
            row.op = intern("multi-token prediction: " + std::string(row.op));
            head.rows.push_back(row);
        }
}

}  // namespace memcalc
