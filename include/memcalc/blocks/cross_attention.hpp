#pragma once
/// mllama's cross-attention layer with images (MllamaCrossAttentionDecoderLayer and
/// MllamaTextCrossAttention, transformers v4.53.0 modeling_mllama.py): q from the normed stream, k
/// and v projected from the tower's states (the images' tokens, kept once on the input side),
/// both normed per head, no rotary; attention over the images' tokens under the cross-attention
/// mask; a tanh gate on each branch, the MLP's output first multiplied by the full-text-row mask.
/// Read from that code, not measured.
#include "memcalc/blocks/attention.hpp"

namespace memcalc::detail {

inline constexpr Shape one_value{"1", ActivationSplit::replicated};  ///< a gate's tanh

/// tanh(gate): its output, one value, which tanh's backward and the product with it read.
inline void gate_tanh_row(TableBuilder& t, const Sizes& z, const char* gate) {
    t.add(gate, "its output, one value", "tanh's gradient and the product's read it", one_value,
          Count(1), z.d);
}

/// The attention over the images' tokens, its q and k normed per head as its parameters are
/// (params.hpp's cross_attention) and never rotated, and what tanh(cross_attn_attn_gate) x its
/// output keeps: that output, for the gate's gradient.
inline void cross_attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                                 Attention attention) {
    Architecture cross = m;
    cross.qk_norm = QkNorm::per_head, cross.position = Position::none;
    attention_rows(t, cross, z.with_keys(m, m.cross_attention_tokens), attention);
    t.section(Module::attention);
    gate_tanh_row(t, z, "tanh(attention gate)");
    t.add("tanh(attention gate) x output", "the output projection's output",
          "the gate's gradient is the output's gradient x it", shape::sbh, z.sbh, z.d);
}

/// After a cross-attention layer's MLP: the full-text-row mask times its output keeps the mask
/// (one value a token; the product's gradient w.r.t. the output is the mask), and
/// tanh(cross_attn_mlp_gate) times that product keeps the product.
inline void cross_attention_mlp_gate_rows(TableBuilder& t, const Sizes& z) {
    t.add("full-text-row mask x MLP output", "the mask, a value a token",
          "the output's gradient is the mask x the product's", shape::sb, z.tokens, z.d);
    gate_tanh_row(t, z, "tanh(MLP gate)");
    t.add("tanh(MLP gate) x masked output", "the masked output",
          "the gate's gradient is the product's gradient x it", shape::sbh, z.sbh, z.d);
}

/// The cross-attention mask (b, 1, s, images' tokens), built once a step and, under a fused
/// kernel (SDPA with a mask runs its memory-efficient kernel), kept by every cross-attention layer
/// for its backward: once on the input side. Eager attention adds it and keeps nothing of it.
inline void cross_attention_mask_rows(TableBuilder& t, const Architecture& m, std::uint64_t seq,
                                      std::uint64_t micro_batch, Precision precision,
                                      Attention attention) {
    if (m.cross_attention_tokens == 0 || attention != Attention::flash) return;
    constexpr Shape mask{"sNb", ActivationSplit::replicated};
    t.add("cross-attention mask", "(b, 1, s, the images' tokens)",
          "each cross-attention layer's fused kernel keeps it for its backward", mask,
          Count(seq) * micro_batch * m.cross_attention_tokens,
          bytes_per_element(precision.compute));
}

}  // namespace memcalc::detail
