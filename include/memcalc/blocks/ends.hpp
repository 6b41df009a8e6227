#pragma once
/// The model's ends: the embedding side, the forward's buffers, the KV cache, the head and loss.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memcalc/blocks/attention_parts.hpp"
#include "memcalc/blocks/dropout.hpp"
#include "memcalc/blocks/linear.hpp"
#include "memcalc/blocks/mla.hpp"
#include "memcalc/blocks/norm.hpp"

namespace memcalc {

/// What the embedding side saves from the first forward step until the last backward step.
inline std::vector<SavedTensor> input_side_saved(const Architecture& m, std::uint64_t seq,
                                                 std::uint64_t micro_batch, Precision precision,
                                                 Runtime runtime = {}) {
    const detail::Sizes z(m, seq, micro_batch, precision, runtime);
    const std::uint64_t d = z.d;
    std::vector<SavedTensor> rows;
    detail::TableBuilder t(rows);
    t.add("token embedding", "the token ids (int64)", "the gradient is scattered into their rows",
          shape::ids, z.tokens, 8);
    if (m.position == Position::learned)  // arange(s), the same for every sequence
        t.add("position embedding", "the position ids (int64)",
              "the gradient is scattered into their rows", detail::per_position, Count(seq), 8);
    const RotaryEmbeddingRow& rotary = rotary_embedding(m.rotary_embedding);
    if (m.position == Position::rotary && !rotary.per_layer_tables) {
        t.add("rotary embedding",
              rotary.fp32_tables ? "cos and sin tables, fp32, shared by every layer"
                                 : "cos and sin tables, shared by every layer",
              "q and k were multiplied by them", shape::sd, Count(seq) * m.rotary_dim(),
              rotary.fp32_tables ? dtype::fp32 : d, Keep::always, 2);
        rows.back().every_stage = true;  // each pipeline stage builds its own
    }
    if (m.embedding_norm) detail::norm_rows(t, m, z, "embedding norm");
    if (m.hidden_dropout > 0)  // the embedding's output: the stream's dtype
        detail::dropout_row(t, z, z.stream, "embedding dropout", shape::sbh, z.sbh);
    return rows;
}

/// What the first stage's forward holds in names of its own until it returns, beside the stream:
/// the embeddings' outputs where the code keeps them (Architecture::embedding_outputs_held), in the
/// stream's dtype; a learned position embedding's of (s, h), whatever the batch.
inline std::vector<SavedTensor> forward_locals(const Architecture& m, std::uint64_t seq,
                                               std::uint64_t micro_batch, Precision precision) {
    std::vector<SavedTensor> rows;
    if (!m.embedding_outputs_held) return rows;
    const detail::Sizes z(m, seq, micro_batch, precision);
    detail::TableBuilder t(rows);
    t.add("token embedding", "its output (the forward's local)", "held until the forward returns",
          shape::sbh, z.sbh, z.s);
    if (m.position == Position::learned)
        t.add("position embedding", "its output (the forward's local)",
              "held until the forward returns", shape::sh, Count(seq) * m.hidden, z.s);
    for (SavedTensor& row : rows) row.forward_local = true;
    return rows;
}

/// What one forward pass builds for all its layers and drops when it returns, after the loss: eager
/// attention's causal mask, s^2 b values of the embeddings' dtype (the stream's), as transformers
/// builds it. None where each layer masks with its registered buffer instead. `masks`: transformers
/// builds one per attention window (gpt-oss's and Gemma 3's sliding layers have their own beside
/// the full layers').
inline std::vector<SavedTensor> forward_buffers(std::uint64_t seq, std::uint64_t micro_batch,
                                                Precision precision, Attention attention,
                                                CausalMaskBuffer buffer = CausalMaskBuffer::none,
                                                std::uint64_t masks = 1) {
    const std::uint64_t d = bytes_per_element(precision.stream);
    std::vector<SavedTensor> rows;
    // The fused kernel masks inside.
    if (attention == Attention::flash || causal_mask_buffer(buffer).registered) return rows;
    detail::TableBuilder t(rows);
    t.add("causal mask",
          masks > 1 ? "0 or -inf per query and key, one per attention window, made once per forward"
                    : "0 or -inf per query and key, made once per forward",
          "added to every layer's scores", shape::mask, Count(seq) * seq * micro_batch, d,
          Keep::always, masks);
    return rows;
}

/// What the model's output adds when it keeps each layer's k and v (use_cache): post-rotary, of the
/// key/value heads, in the compute dtype, as transformers' attention hands them back. Where
/// backward saves those very tensors (no repeat, or selective recomputation's checkpoint inputs)
/// they add nothing; the repeated copies eager attention saves, or full recomputation's bare input,
/// leave them extra (measured: validation/results/cpu-buffers.json).
/// A fused q/k/v projection's cached k and v are views of its whole output (GPT-2's `present`),
/// which the cache keeps whole, q's part too. Its saved tensors share it where they are its views
/// (selective's checkpoint of them; eager's at b = 1); eager attention's batched matmul copies q,
/// k and v for b > 1, and a checkpointed layer keeps none of it.
inline std::vector<SavedTensor> fused_kv_cache_rows(const detail::Sizes& z, Attention attention,
                                                    Recompute mode) {
    std::vector<SavedTensor> rows;
    const bool shared =
        mode == Recompute::selective ||
        (mode == Recompute::none && (attention != Attention::eager || z.tokens == Count(z.seq)));
    if (shared) return rows;
    detail::TableBuilder t(rows);
    t.add("k/v cache (the model's output)", "the fused q/k/v output's q, which k and v share",
          "use_cache hands back views of it", shape::sbq, z.sbq, z.d);
    t.add("k/v cache (the model's output)", "the fused q/k/v output's k and v",
          "use_cache hands them back", shape::sbkv, z.sbkv, z.d, Keep::always, 2);
    return rows;
}

inline std::vector<SavedTensor> kv_cache_rows(const Architecture& m, std::uint64_t seq,
                                              std::uint64_t micro_batch, Precision precision,
                                              Attention attention, Recompute mode) {
    const detail::Sizes z(m, seq, micro_batch, precision);
    const bool repeated = detail::repeats_kv(m, attention);
    std::vector<SavedTensor> rows;
    if (m.mla.enabled()) {
        // Latent attention caches k and v before flash's padding: v a view of kv_b_proj's output,
        // which backward keeps only where it keeps v itself (eager at b = 1, selective's
        // checkpoint).
        detail::TableBuilder t(rows);
        const bool bare = checkpoints_layer(mode),
                   padded = attention == Attention::flash &&
                            (m.value_head_size() != m.head_size() || !m.latent_v_padded);
        const bool copied =
            attention == Attention::eager && mode == Recompute::none && z.tokens != Count(seq);
        if (bare)
            t.add("k/v cache (the model's output)", "k, every head", "use_cache hands it back",
                  detail::latent_shape::sbqk, z.sbq, z.d);
        if (bare || padded || copied)
            t.add("k/v cache (the model's output)", "kv_b_proj's output, which the cached v views",
                  "use_cache hands v back", detail::latent_shape::sbkvb,
                  z.tokens * m.heads * (m.mla.qk_nope_head_dim + m.mla.v_head_dim), z.d);
        return rows;
    }
    if (m.fused_qkv) return fused_kv_cache_rows(z, attention, mode);
    if (mode == Recompute::selective || (mode == Recompute::none && !repeated)) return rows;
    detail::TableBuilder t(rows);
    t.add("k/v cache (the model's output)", "k after rotary and v, k heads",
          "use_cache hands them back", shape::sbkv, z.sbkv, z.d, Keep::always, 2);
    return rows;
}

/// The loss's dtype: its log-probabilities and their gradients. None for a fused kernel, which
/// writes the gradient over the logits and keeps nothing of the vocabulary's width. Autocast runs
/// cross_entropy in fp32 whatever its input (CUDA's op lists; measured on CPU); a kernel on the
/// logits as they are takes fp32 logits (`logits_fp32`: the model returns them so) as fp32.
inline std::optional<DType> loss_dtype(LossKernel loss, Precision precision,
                                       bool logits_fp32 = false) {
    const DType as_they_are = precision.autocast || logits_fp32 ? DType::fp32 : precision.compute;
    switch (loss) {
        case LossKernel::fp32: return DType::fp32;
        case LossKernel::bf16: return as_they_are;
        case LossKernel::fused: return std::nullopt;
        case LossKernel::fp32_inplace: return DType::fp32;
        case LossKernel::chunked: return DType::fp32;  // logits_chunk.float(), whatever the recipe
        case LossKernel::fused_linear: return std::nullopt;
        case LossKernel::chunked_bf16: return as_they_are;
        case LossKernel::chunked_compiled: return std::nullopt;  // a chunk's fp32 never kept
    }
    return DType::fp32;
}

/// Passes over the logits' width a loss kernel's ops make beyond the element-wise passes over its
/// saved rows: temporaries each written once and read once (EagerTraffic), in the loss dtype
/// (`wide`) or the logits' (`narrow`), forward and backward; `upcasts`: and a copy of the logits in
/// the loss dtype where it is wider (its gradient cast back), as the kernels' code runs them.
struct LossPasses {
    std::uint8_t forward_wide, backward_wide, forward_narrow, backward_narrow;
    bool upcasts;
    /// Kernels it launches, forward and backward (a chunked kernel's, for each chunk).
    Launches launches;
};

/// By LossKernel. Eager cross_entropy: NLL's backward writes a dense gradient that log-softmax's
/// backward reads. Megatron-LM's VocabParallelCrossEntropy subtracts the max, exponentiates and
/// divides its fp32 copy in place; backward subtracts the one-hot and scales in place, then casts.
/// A fused kernel writes the gradient over the logits, which backward scales in place. Liger's
/// fused linear cross-entropy writes each chunk's logits and their gradient on the way.
/// Launches: eager cross_entropy's upcast, log_softmax, nll and its weight's zeros, and their
/// backward (counted on CPU);
/// Megatron-LM's: its copy, max, subtraction, exp, sum, division and the target's gather, and in
/// backward the one-hot's subtraction, scale and cast (read from cross_entropy.py); a fused
/// kernel's one each way; Liger's, for each chunk its product with the head, the loss and the
/// gradient's product back.
inline constexpr std::array<LossPasses, 8> loss_passes{{
    {0, 1, 0, 0, true, {4, 3}},   // fp32
    {0, 1, 0, 0, true, {3, 2}},   // bf16 (an upcast only under autocast)
    {0, 0, 1, 1, false, {1, 1}},  // fused
    {3, 2, 0, 1, false, {7, 3}},  // fp32_inplace: its fp32 copy a saved row
    {0, 1, 0, 0, true, {4, 3}},   // chunked: fp32's, a chunk at a time
    {0, 0, 2, 0, false, {3, 2}},  // fused_linear
    {0, 1, 0, 0, true, {3, 2}},   // chunked_bf16: bf16's, a chunk at a time
    {0, 0, 1, 1, false, {2, 2}},  // chunked_compiled: inductor's, read once each way a chunk
}};
static_assert(loss_passes.size() == static_cast<std::size_t>(LossKernel::chunked_compiled) + 1,
              "a row for every loss kernel, in LossKernel's order");

/// The loss kernel's temporaries (loss_passes) over `logits` elements in the compute dtype (fp32
/// where the model returns them so).
inline void loss_temporaries(detail::TableBuilder& t, LossKernel loss, Precision precision,
                             Count logits, bool logits_fp32) {
    LossPasses passes = loss_passes[static_cast<std::size_t>(loss)];
    const std::uint64_t narrow = logits_fp32 ? dtype::fp32 : bytes_per_element(precision.compute);
    const auto logp = loss_dtype(loss, precision, logits_fp32);
    const std::uint64_t wide = logp ? bytes_per_element(*logp) : narrow;
    if (passes.upcasts && wide > narrow) ++passes.forward_wide, ++passes.backward_narrow;
    const auto add = [&](bool backward, std::uint64_t wide_passes, std::uint64_t narrow_passes) {
        t.temporaries(backward, backward ? "loss backward" : "loss",
                      logits * (wide_passes * wide + narrow_passes * narrow),
                      ActivationSplit::vocab);
    };
    add(false, passes.forward_wide, passes.forward_narrow);
    add(true, passes.backward_wide, passes.backward_narrow);
}

/// The final norm, the head and the loss as a program: what they save for their backward pass
/// (from the loss step until the head's backward, at the start of backward L) and their ops'
/// workspaces (the final norm's backward, which the loss step ends with).
inline LayerActivations head_program(const Architecture& m, std::uint64_t seq,
                                     std::uint64_t micro_batch, Precision precision,
                                     Runtime runtime = {}, LossKernel loss = LossKernel::fp32,
                                     const LayerTuning& tuning = {}) {
    const detail::Sizes z(m, seq, micro_batch, precision, runtime);
    LayerActivations head;
    std::vector<SavedTensor>& rows = head.rows;
    detail::TableBuilder t(rows, &head, tuning);
    detail::norm_rows(t, m, z, "final norm");
    loss_temporaries(t, loss, precision, z.tokens * m.vocab, m.logits_fp32);
    if (loss == LossKernel::fused_linear) {  // keeps no input: the gradient its forward wrote
        t.add("loss (fused linear)", "the hidden states' gradient, made in forward",
              "backward hands it on", shape::sbh, z.sbh, z.s);
        return head;
    }
    // Megatron-LM's output layer is no Transformer Engine module: its input stays in the compute
    // dtype.
    detail::projection_input_row(t, z.wide_linears(), "output head", "its input", z.sbh, shape::sbh,
                                 1, {}, bit(Linear::head));
    detail::scaled_output_rows(t, z, "output head", bit(Linear::head), z.tokens, true);
    if (loss == LossKernel::fp32_inplace)
        t.add("loss (softmax in place)", "an fp32 copy of the logits, softmaxed in place",
              "the gradient is written over it", shape::sbV, z.tokens * m.vocab, dtype::fp32);
    else if (const auto logp = loss_dtype(loss, precision, m.logits_fp32))
        t.add("loss (log-softmax)", std::string("log-probabilities, ") + dtype_name(*logp),
              "log-softmax's gradient is written in its output", shape::sbV, z.tokens * m.vocab,
              bytes_per_element(*logp));
    if (loss == LossKernel::chunked_compiled)  // measured on torch 2.6: the chunk, and these
        t.add("loss (compiled chunk)", "max and log-sum-exp per token, fp32",
              "backward rebuilds the softmax from the chunk and them", shape::ids, z.tokens, 8);
    t.add("loss (NLL)", "the target ids (int64)", "which log-probability each token's loss picked",
          shape::ids, z.tokens, 8);
    return head;
}

/// What the head and the loss save for their backward pass (head_program's rows).
inline std::vector<SavedTensor> head_saved(const Architecture& m, std::uint64_t seq,
                                           std::uint64_t micro_batch, Precision precision,
                                           Runtime runtime = {}, LossKernel loss = LossKernel::fp32,
                                           const LayerTuning& tuning = {}) {
    return head_program(m, seq, micro_batch, precision, runtime, loss, tuning).rows;
}

inline Count saved_bytes(const std::vector<SavedTensor>& rows) {
    Count sum;
    for (const auto& r : rows) sum += r.bytes;
    return sum;
}

}  // namespace memcalc
