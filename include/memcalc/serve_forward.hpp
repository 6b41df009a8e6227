#pragma once
/// A serving forward's temporaries, as tensors in the order made: one forward of the language
/// model with no autograd, and before a prefill the vision tower's pass over its images.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "memcalc/blocks/vision_tower.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/model.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// `count` tensors of `bytes` each: how a rank's memory is made, for the allocator's replay.
struct TensorRun {
    Count bytes;
    std::uint64_t count = 1;
};

namespace detail {
/// k and v of `keys` tokens repeated to every query head of a rank of `tp`, in bf16, as
/// transformers' SDPA path makes them for grouped heads (repeat_kv; v4.53 always, later versions
/// where a mask is given or torch is before 2.5); none without grouped heads.
inline Count repeated_kv(const Architecture& m, std::uint64_t keys, std::uint64_t tp) {
    const std::uint64_t kv = m.key_value_heads(), heads = m.heads / tp;
    const std::uint64_t kv_heads = kv < tp ? 1 : kv / tp;
    if (m.mla.enabled() || kv_heads >= heads) return 0;
    return Count(keys) * (2 * heads * m.head_size()) * dtype::bf16;
}

/// The largest temporaries of one forward of `tokens` tokens on a rank of `tp`, in bf16 with no
/// autograd, ending in the logits of `rows` sequences' last tokens, as tensors in the order made:
/// the residual stream and the norm's output, then the larger of attention's q, k, v and output (a
/// fused kernel: no scores; `repeats_kv`: beside them k and v repeated to every query head, as
/// transformers' SDPA path gives the kernel no grouped heads) and the MLP's gate/up output and
/// product (per routed slot for experts, beside the gathered tokens, their outputs and the router's
/// fp32 logits), and the logits in bf16 and an fp32 copy for sampling.
inline std::vector<TensorRun> forward_temporaries(const Architecture& m, std::uint64_t tokens,
                                                  std::uint64_t rows, std::uint64_t tp,
                                                  bool repeats_kv = false) {
    const std::uint64_t N = tokens, kv = m.key_value_heads();
    const std::uint64_t heads = m.heads / tp, d = m.head_size();
    const std::uint64_t kv_heads = m.mla.enabled() || kv < tp ? 1 : kv / tp;
    // DeepSeek-V3.2's indexer scores every cached key for each token: fp32 logits (vLLM's
    // fp8_mqa_logits), N x N for a prefill of N.
    const Count indexer = m.mla.indexed() ? Count(N) * N * dtype::fp32 : Count(0);
    const Count attention = Count(N) * (2 * heads * d + 2 * kv_heads * d) * dtype::bf16 + indexer +
                            (repeats_kv ? repeated_kv(m, N, tp) : Count(0));
    Count mlp;
    m.every_kind([&](const Architecture& v) {
        if (!v.has_mlp) return true;
        const Count slots = Count(N) * v.active_experts();
        Count here = slots * (ceil_div(Count(v.ffn), tp).value() * (v.mlp == Mlp::gated ? 3 : 2)) *
                     dtype::bf16;
        if (v.is_moe())
            here += slots * m.hidden * (2 * dtype::bf16) + Count(N) * v.experts * dtype::fp32;
        mlp = std::max(mlp, here);
        return true;
    });
    // A Mamba mixer's prefill: in_proj's x and z, the convolution's output, delta, the scan's
    // output and its gate, d_i wide each, in bf16 (mamba_ssm's kernels), counted beside attention's
    // as the larger.
    if (m.any_mixer(Mixer::mamba))
        mlp = std::max(mlp, Count(N) * (6 * (m.ssm.d_inner / tp)) * dtype::bf16);
    // Mamba-2's: in_proj's output, the convolution's, the scan's and the gated norm's; a Gated
    // DeltaNet's the same with its in_proj_qkvz's and in_proj_ba's outputs.
    if (m.any_kind([](const Architecture& v) {
            return has_mamba2(v.mixer) || v.mixer == Mixer::gated_deltanet;
        })) {
        const StateSpace& x = m.ssm;
        const std::uint64_t in =
            m.any_mixer(Mixer::gated_deltanet) ? x.deltanet_in_width() : x.in_proj_width();
        const std::uint64_t wide = in + x.conv_channels() + 2 * x.d_inner;
        mlp = std::max(mlp, Count(N) * (wide / tp) * dtype::bf16);
    }
    const Count stream = Count(N) * m.hidden * dtype::bf16;
    const Count logits = Count(rows) * ceil_div(Count(m.vocab), tp).value();
    return {{stream, 2},
            {std::max(attention, mlp), 1},
            {logits * dtype::bf16, 1},
            {logits * dtype::fp32, 1}};
}

/// Bytes of `runs` together.
inline Count total_bytes(const std::vector<TensorRun>& runs) {
    Count out;
    for (const TensorRun& run : runs) out += Count(run.count) * run.bytes;
    return out;
}

/// The vision encoder's pass before a prefill, as vLLM budgets it (encoder_cache_manager.py's
/// compute_encoder_budget, gpu_model_runner.py's profile_run; read, not measured): as many of the
/// largest images as `budget` tokens need, at least one, at most `sequences` x images per prompt,
/// encoded at once; their outputs, the language model's width in bf16, stay cached while the
/// language model's forward runs. The tower's forward: memcalc's block over their patches, whole
/// on every rank (vLLM splits some towers: leaning high).
struct EncoderPass {
    std::uint64_t items = 0, tokens_per_item = 0;
    Count outputs;                       ///< bytes
    std::vector<TensorRun> temporaries;  ///< the stream and a block's largest, no logits
};

inline EncoderPass encoder_pass(const Architecture& m, const ImageInput& images,
                                std::uint64_t budget, std::uint64_t sequences) {
    const VisionTower& v = m.vision;
    const std::uint64_t patches = v.patches(images.width, images.height);
    EncoderPass e;
    e.tokens_per_item = patches / (v.merge * v.merge);
    const std::uint64_t needed = budget / e.tokens_per_item + (budget % e.tokens_per_item != 0);
    const std::uint64_t most =
        sequences > needed / images.images ? needed : sequences * images.images;
    e.items = std::min(needed, most);
    e.outputs = Count(e.items) * e.tokens_per_item * v.out_hidden * dtype::bf16;
    e.temporaries =
        forward_temporaries(tower_block(v, patches), (Count(e.items) * patches).value(), 0, 1);
    e.temporaries.resize(2);
    return e;
}

/// The larger of two sets of tensors alive at different times.
inline const std::vector<TensorRun>& larger_of(const std::vector<TensorRun>& a,
                                               const std::vector<TensorRun>& b) {
    return total_bytes(a) > total_bytes(b) ? a : b;
}

/// mllama's images before a prefill as transformers' generate() runs them (MllamaModel.forward,
/// modeling_mllama.py v4.53.0; read, not measured): every image of the chunk's `sequences` at
/// once, each padded to max_num_tiles tiles of N tokens. Kept through the language model's
/// forward: the projector's output (the cross-attention states) and the tower's own output, its
/// last and intermediate block outputs side by side (vision_outputs holds it). The tower's pass:
/// the pixels (fp32) and their cast, every local block's output (its encoder runs with
/// output_hidden_states), the tiles' mask, then the larger of a block's temporaries and the
/// intermediate outputs stacked, and unpadded with the last's, for the concatenation.
inline EncoderPass tiled_encoder_pass(const Architecture& m, const ImageInput& images,
                                      std::uint64_t sequences) {
    const VisionTower& v = m.vision;
    EncoderPass e;
    e.items = (Count(sequences) * images.images).value();
    e.tokens_per_item = v.tiles * v.tile_tokens();
    const std::uint64_t n = v.tiles * ((v.tile_tokens() + 7) / 8 * 8);  // an image's, padded
    const Count tokens = Count(e.items) * e.tokens_per_item, padded = Count(e.items) * n;
    const std::uint64_t stacked = v.intermediate_layers * v.hidden;
    e.outputs = tokens * v.out_hidden * dtype::bf16 + tokens * (stacked + v.hidden) * dtype::bf16;
    const Count pixels = Count(e.items) * v.tiles * v.channels * v.image_size * v.image_size;
    std::vector<TensorRun> block = forward_temporaries(tower_block(v, n), padded.value(), 0, 1);
    block.resize(2);
    const std::vector<TensorRun> collected{{padded * stacked * dtype::bf16, 1},
                                           {tokens * (stacked + v.hidden) * dtype::bf16, 1}};
    e.temporaries = {{pixels * dtype::fp32, 1},
                     {pixels * dtype::bf16, 1},
                     {padded * v.hidden * dtype::bf16, v.depth + 1},
                     {Count(e.items) * n * n * dtype::bf16, 1}};
    const std::vector<TensorRun>& last = larger_of(block, collected);
    e.temporaries.insert(e.temporaries.end(), last.begin(), last.end());
    return e;
}

/// A prefill's `forward` with what mllama's cross-attention layers add over its `tokens`, of
/// `sequences` each reading m.cross_attention_tokens image tokens (modeling_mllama.py v4.53.0):
/// held through the forward, the cross-attention mask in bf16 (_prepare_cross_attention_mask) and
/// beside it a layer's k and v repeated to every query head (repeat_kv: SDPA with a mask is given
/// no grouped heads); before the forward, while the mask is made, the processor's int64 mask
/// repeated to every image token, 1 minus it (fp32) and that cast. The larger of the two.
inline std::vector<TensorRun> with_cross_attention(std::vector<TensorRun> forward,
                                                   const Architecture& m, Count tokens,
                                                   std::uint64_t sequences) {
    const std::uint64_t keys = m.cross_attention_tokens;
    const Count mask = tokens * keys;
    const std::vector<TensorRun> making{
        {mask * 8, 1}, {mask * dtype::fp32, 1}, {mask * dtype::bf16, 1}};
    forward.push_back({mask * dtype::bf16, 1});
    if (m.key_value_heads() < m.heads)
        forward.push_back({Count(sequences) * keys * m.heads * m.head_size() * dtype::bf16, 2});
    return larger_of(making, forward);
}

/// `model`'s forward temporaries after the encoder's pass: its outputs first, then the larger of
/// the tower's temporaries and the model's (the tower's are freed before the model runs).
inline std::vector<TensorRun> after_encoder(std::vector<TensorRun> model, const EncoderPass& e) {
    std::vector<TensorRun> runs{{e.outputs, 1}};
    const auto& larger = larger_of(e.temporaries, model);
    runs.insert(runs.end(), larger.begin(), larger.end());
    return runs;
}

}  // namespace detail

}  // namespace memcalc
