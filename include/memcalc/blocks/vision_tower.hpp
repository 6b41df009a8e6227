#pragma once
/// What a micro-batch's images keep through the step: their pixels, and where the tower trains,
/// its blocks' saved tensors (or, checkpointed, their inputs) and its mergers'. On the input side:
/// the tower runs before the first layer and its backward after the embedding's.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "memcalc/blocks/layer.hpp"
#include "memcalc/blocks/layer_builder.hpp"
#include "memcalc/vision.hpp"

namespace memcalc {

/// A micro-batch's images, each of width x height pixels.
struct ImageInput {
    std::uint64_t images = 0;
    std::uint64_t width = 0, height = 0;

    bool any() const { return images > 0; }
};

/// The tower's patches of one image (VisionTower::patches).
inline std::uint64_t patches_per_image(const VisionTower& v, const ImageInput& in) {
    return v.patches(in.width, in.height);
}

/// One of the tower's blocks as memcalc's layer blocks write it: attention over one image's
/// patches (bidirectional: no mask is built, eager's scores are as causal attention's), biased
/// q, k and v (fused, Qwen's), 2-D rotary (Qwen's), its MLP and norms.
inline Architecture tower_block(const VisionTower& v, std::uint64_t patches) {
    Architecture m;
    m.name = "vision tower";
    m.hidden = v.hidden, m.heads = v.heads, m.ffn = v.ffn, m.layers = 1, m.vocab = 1;
    m.max_positions = patches;
    m.mlp = v.gated_mlp ? Mlp::gated : Mlp::plain;
    m.activation = v.gated_mlp ? Activation::silu : Activation::gelu_tanh;
    m.norm = v.layernorm ? Norm::layernorm : Norm::rmsnorm;
    m.bias = Bias::all, m.fused_qkv = v.fused_qkv;
    m.position = v.rotary ? Position::rotary : Position::none;
    return m;
}

/// Gemma 3's projector (Gemma3MultiModalProjector, read from its code, not measured): the tower's
/// post-LayerNorm keeps its input and each patch's mean and 1/std; the average pool keeps nothing;
/// the pooled tokens' RMSNorm keeps its fp32 input and output, the projection its input.
inline void projector_rows(detail::TableBuilder& t, const VisionTower& v, std::uint64_t per_image,
                           std::uint64_t images, std::uint64_t d) {
    constexpr Shape per_patch{"n_img", ActivationSplit::replicated};
    const Count patches = Count(per_image) * images,
                tokens = Count(per_image / (v.merge * v.merge)) * images;
    t.add("vision post-LayerNorm", "its input", "its backward", per_patch, patches * v.hidden, d);
    t.add("vision post-LayerNorm", "each patch's mean and 1/std (fp32)", "its backward", per_patch,
          patches * 2, 4);
    t.add("vision projector", "the RMSNorm's fp32 input and output", "their backward", per_patch,
          tokens * v.hidden, 4, Keep::always, 2);
    t.add("vision projector", "the projection's input", "the weight's gradient", per_patch,
          tokens * v.hidden, d);
}

/// The rows a micro-batch's images add on the input side under `mode`; `trains`: the tower's
/// weights train (a frozen tower over pixels that need no gradient keeps nothing).
inline std::vector<SavedTensor> image_rows(const VisionTower& v, const ImageInput& in,
                                           Precision precision, Attention attention,
                                           Runtime runtime, Recompute mode, bool trains) {
    const std::uint64_t n = patches_per_image(v, in),
                        pixels = v.channels * v.temporal_patch * v.patch * v.patch;
    const Count patches = Count(n) * in.images;
    const std::uint64_t d = bytes_per_element(precision.compute);
    // Whole on every tensor-parallel rank: the tower is not split.
    constexpr Shape per_patch{"n_img", ActivationSplit::replicated};
    std::vector<SavedTensor> rows;
    detail::TableBuilder t(rows);
    t.add("pixel values", "the processor's patches (fp32)", "the batch's input", per_patch,
          patches * pixels, 4);
    if (!trains) return rows;
    if (mode == Recompute::full) {
        t.add("vision tower (checkpointed blocks)", "each block's input",
              "recomputed in its backward", per_patch, patches * v.hidden,
              bytes_per_element(precision.stream), Keep::always, v.depth);
    } else {
        t.add("patch embedding", "the pixels cast to the weights' dtype", "the weight's gradient",
              per_patch, patches * pixels, d);
        const LayerActivations block =
            architecture_layer(tower_block(v, n), n, in.images, precision, attention, runtime);
        for (const SavedTensor& row : block.rows)  // each block's, D of them
            t.add(Label("vision tower: " + std::string(row.op)), Label(std::string(row.tensor)),
                  Label(std::string(row.why)), Shape{per_patch.symbol, per_patch.split},
                  row.elements, row.bytes_per_element, Keep::always, v.depth);
    }
    if (v.pooled_projector) {
        projector_rows(t, v, n, in.images, d);
        return rows;
    }
    // Each merger (and deepstack merger): its norm's fp32 input; the normalised patches, fc1's
    // output (GELU's input) and GELU's (fc2's input), every patch's width.
    const std::uint64_t mergers = 1 + v.deepstack;
    t.add("vision mergers", "the norm's fp32 input", "its backward", per_patch, patches * v.hidden,
          4, Keep::always, mergers);
    t.add("vision mergers", "the normalised patches, fc1's and GELU's outputs", "their backward",
          per_patch, patches * v.hidden, d, Keep::always, 3 * mergers);
    return rows;
}

}  // namespace memcalc
