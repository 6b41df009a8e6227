#pragma once
// Architectures written out by hand, so the core's tests do not depend on the preset files.
#include "memcalc/model.hpp"
#include "memcalc/tape/from_program.hpp"

namespace fixtures {

inline memcalc::Architecture llama_7b() {
    memcalc::Architecture m;
    m.name = "llama-7b";
    m.hidden = 4096, m.layers = 32, m.heads = 32, m.ffn = 11008, m.vocab = 32000,
    m.max_positions = 2048;
    return m;  // gated MLP, RMSNorm, no biases, rotary, untied: the defaults
}

inline memcalc::Architecture gpt2_small() {
    memcalc::Architecture m;
    m.name = "gpt2";
    m.hidden = 768, m.layers = 12, m.heads = 12, m.ffn = 3072, m.vocab = 50257,
    m.max_positions = 1024;
    m.mlp = memcalc::Mlp::plain, m.norm = memcalc::Norm::layernorm, m.bias = memcalc::Bias::all;
    m.position = memcalc::Position::learned, m.tied_embeddings = true;
    m.activation = memcalc::Activation::gelu_tanh, m.softmax_fp32 = false;
    return m;
}

inline memcalc::Architecture mistral_7b() {
    memcalc::Architecture m;
    m.name = "mistral-7b";
    m.hidden = 4096, m.layers = 32, m.heads = 32, m.kv_heads = 8, m.ffn = 14336, m.vocab = 32000;
    return m;
}

/// The chapter's small Decoder: width 16, 2 heads, sequence 8, feed-forward twice the width.
inline memcalc::Architecture decoder() {
    memcalc::Architecture m = gpt2_small();
    m.name = "decoder";
    m.hidden = 16, m.layers = 2, m.heads = 2, m.ffn = 32, m.vocab = 65, m.max_positions = 8;
    return m;
}

/// Mixtral 8x7B: Mistral 7B's layers with 8 experts, 2 a token.
inline memcalc::Architecture mixtral() {
    memcalc::Architecture m = mistral_7b();
    m.name = "mixtral", m.experts = 8, m.experts_per_token = 2;
    return m;
}

/// A mixture-of-experts model whose first two layers are dense, as DeepSeek's are.
inline memcalc::Architecture dense_then_moe() {
    memcalc::Architecture m;
    m.name = "dense-then-moe";
    m.hidden = 512, m.layers = 8, m.heads = 8, m.kv_heads = 4, m.ffn = 256, m.vocab = 1000,
    m.max_positions = 2048;
    m.experts = 8, m.experts_per_token = 2;
    m.layer_kinds = {{"dense", 2048, 0, {}}, {"moe", {}, {}, {}}};
    m.layer_pattern = {{0, 2}, {1, 6}};
    return m;
}

/// What workspace `w` of `layer` (one of its own) is to its step under `mode`: its tape's sweep.
inline memcalc::WorkspaceSum swept(const memcalc::LayerActivations& layer,
                                   const memcalc::Workspace& w, memcalc::Recompute mode) {
    return memcalc::tape::workspace_sums(layer, mode)[std::size_t(&w - layer.work.data())];
}

}  // namespace fixtures
