#pragma once
/// The tensors one transformer layer keeps for its backward pass, and what each recomputation mode
/// keeps or rebuilds. The reference table is Korthikanti et al. 2022 (Reducing Activation
/// Recomputation in Large Transformer Models, section 4.1): s b h (34 + 5 a s / h) bytes per layer.
#include <cstdint>
#include <string>
#include <vector>

#include "memcalc/model.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

enum class Recompute { none, selective, full };

inline const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::none: return "none";
        case Recompute::selective: return "selective";
        case Recompute::full: return "full";
    }
    return "?";
}

/// Where the per-layer table comes from: Korthikanti et al.'s formula (the chapter's), or the
/// architecture's own ops as PyTorch's eager implementations save them.
enum class ActivationModel { korthikanti, architecture };
/// Eager attention materialises the s x s scores; a fused (flash) kernel keeps a log-sum-exp per row.
enum class Attention { eager, flash };

inline const char* activation_model_name(ActivationModel m) {
    return m == ActivationModel::korthikanti ? "korthikanti" : "architecture";
}
inline const char* attention_name(Attention a) { return a == Attention::eager ? "eager" : "flash"; }

/// Which recomputation modes keep a saved tensor from its forward step to its backward step.
/// (Full recomputation keeps only the layer's input, whatever the row says.)
enum class Keep {
    always,          ///< every mode but full
    not_selective,   ///< made inside the core attention: selective recomputation rebuilds it
    only_selective,  ///< an input of the core attention that only selective recomputation's checkpoint saves
};

inline const char* keep_name(Keep k) {
    switch (k) {
        case Keep::always: return "always";
        case Keep::not_selective: return "not_selective";
        case Keep::only_selective: return "only_selective";
    }
    return "?";
}

/// How a saved tensor divides across a tensor-parallel group (Korthikanti et al. 2022, Table 2).
enum class ActivationSplit {
    tensor,      ///< inside a tensor-parallel region (per head, per MLP column, per vocabulary slice): / tp
    sequence,    ///< on the residual stream (norms, dropout, the linear layers' inputs): / tp with sequence parallelism
    replicated,  ///< the same on every tensor-parallel rank (token ids, rotary tables)
    vocab,       ///< vocabulary-parallel logits: ceil(V / tp) of the V columns
};

/// One tensor saved for backward: `copies` tensors of `symbol` elements each.
struct SavedTensor {
    std::string op;        ///< the op that saves it
    std::string tensor;    ///< what it saves
    std::string why;       ///< why backward needs it
    std::string symbol;    ///< element count in the paper's letters: "sbh", "as^2b"
    std::uint64_t copies;  ///< how many such tensors ("Q and K" is 2 sbh elements)
    std::uint64_t bytes_per_element;
    Keep keep;
    Count elements;
    Count bytes;
    ActivationSplit split = ActivationSplit::tensor;

    bool kept(Recompute mode) const {
        switch (mode) {
            case Recompute::none: return keep != Keep::only_selective;
            case Recompute::selective: return keep != Keep::not_selective;
            case Recompute::full: return false;
        }
        return true;
    }
};

struct LayerActivations {
    std::vector<SavedTensor> rows;
    Count input_bytes;  ///< the layer's input: all that full recomputation keeps

    Count sum(Recompute mode) const {
        Count total;
        for (const auto& r : rows)
            if (r.kept(mode)) total += r.bytes;
        return total;
    }
    /// Everything the layer saves with no recomputation.
    Count total() const { return sum(Recompute::none); }
    /// Bytes a layer holds from its forward step until its backward step.
    Count kept(Recompute mode) const { return mode == Recompute::full ? input_bytes : sum(mode); }
    /// Bytes a layer's backward step rebuilds by running part of its forward again.
    Count rebuilt(Recompute mode) const {
        switch (mode) {
            case Recompute::none: return 0;
            case Recompute::selective: {
                Count inside;
                for (const auto& r : rows)
                    if (r.keep == Keep::not_selective) inside += r.bytes;
                return inside;
            }
            case Recompute::full: return total();
        }
        return 0;
    }
};

/// Korthikanti et al.'s GPT layer (4h GELU MLP, dropout, `d`-byte activations, 1-byte masks).
/// With d = 2 its rows add up to s b h (34 + 5 a s / h) bytes.
inline LayerActivations korthikanti_layer(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch,
                                          std::uint64_t d) {
    const Count sbh = Count(seq) * micro_batch * m.hidden;
    const Count as2b = Count(m.heads) * seq * seq * micro_batch;
    LayerActivations layer;
    // `split`: tensor-parallel rows hold 24 sbh / t + 5 as^2b / t of the total; the other 10 sbh sit
    // on the residual stream, replicated unless sequence parallelism splits them.
    auto row = [&](const char* op, const char* tensor, const char* why, bool scores, std::uint64_t copies,
                   std::uint64_t bytes, ActivationSplit split) {
        const Count elements = Count(copies) * (scores ? as2b : sbh);
        layer.rows.push_back({op, tensor, why, scores ? "as^2b" : "sbh", copies, bytes,
                              scores ? Keep::not_selective : Keep::always, elements, elements * bytes, split});
    };
    constexpr auto T = ActivationSplit::tensor, S = ActivationSplit::sequence;
    // clang-format off
    //  op                            tensor kept              why backward needs it                                   s x s  copies  bytes  split
    row("attention LayerNorm",        "its input",             "normalisation's gradient needs the input (mean, var)",  false, 1, d, S);
    row("QKV projection",             "its input",             "weight gradient = input^T x output gradient",           false, 1, d, S);
    row("Q K^T",                      "Q and K",               "each is the other's factor in the gradient",            false, 2, d, T);
    row("softmax",                    "its output",            "softmax's gradient is written in its output",           true,  1, d, T);
    row("attention dropout",          "mask",                  "which scores were zeroed",                              true,  1, dtype::mask, T);
    row("attention over V",           "dropout output",        "gradient w.r.t. V needs the attention weights",         true,  1, d, T);
    row("attention over V",           "V",                     "gradient w.r.t. the weights needs V",                   false, 1, d, T);
    row("output projection",          "its input",             "weight gradient = input^T x output gradient",           false, 1, d, T);
    row("attention residual dropout", "mask",                  "which elements were zeroed",                            false, 1, dtype::mask, S);
    row("MLP LayerNorm",              "its input",             "normalisation's gradient needs the input (mean, var)",  false, 1, d, S);
    row("MLP up projection",          "its input",             "weight gradient = input^T x output gradient",           false, 1, d, S);
    row("GELU",                       "its input (4h wide)",   "GELU's derivative is evaluated at its input",           false, 4, d, T);
    row("MLP down projection",        "its input (4h wide)",   "weight gradient = input^T x output gradient",           false, 4, d, T);
    row("MLP residual dropout",       "mask",                  "which elements were zeroed",                            false, 1, dtype::mask, S);
    // clang-format on
    layer.input_bytes = sbh * d;
    return layer;
}

}  // namespace memcalc
