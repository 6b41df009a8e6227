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
#include "memcalc/parallel.hpp"
#include "memcalc/vision.hpp"

namespace memcalc {

/// A micro-batch's images, each of width x height pixels.
struct ImageInput {
    std::uint64_t images = 0;
    std::uint64_t width = 0, height = 0;

    bool any() const { return images > 0; }
};

/// Throws where `in`'s images cannot run through `m`: it has no tower, or the tower takes each at
/// its own size and none is given.
inline void check_images(const Architecture& m, const ImageInput& in) {
    if (!in.any()) return;
    if (!m.vision.enabled())
        throw error("images " + std::to_string(in.images) + ": " + model_name(m) +
                    " has no vision tower");
    if ((in.width == 0 || in.height == 0) && m.vision.image_size == 0)
        throw error("images " + std::to_string(in.images) +
                    " need their size in pixels (--image-size WIDTHxHEIGHT): " + model_name(m) +
                    "'s tower takes each at its own size");
}

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

/// `rows` on the input side: whole on every tensor-parallel rank (the tower is not split), each
/// `copies` times.
inline void add_per_patch(detail::TableBuilder& t, const std::vector<SavedTensor>& rows,
                          std::uint64_t copies, const std::string& prefix = "") {
    constexpr Shape per_patch{"n_img", ActivationSplit::replicated};
    for (const SavedTensor& row : rows)
        t.add(Label(prefix + std::string(row.op)), Label(std::string(row.tensor)),
              Label(std::string(row.why)), per_patch, row.elements, row.bytes_per_element,
              Keep::always, copies);
}

/// Gemma 3's projector (Gemma3MultiModalProjector) after SigLIP's post-LayerNorm, written by the
/// layers' norm rows (their kernel and version facts): the LayerNorm's; the average pool keeps its
/// input, a contiguous copy of the patches (avg_pool2d's backward reads it: measured with torch
/// 1.13's autograd); the pooled tokens' RMSNorm, scaled in fp32 (Gemma's); the projection's input.
inline void projector_rows(detail::TableBuilder& t, const VisionTower& v, const ImageInput& in,
                           Precision precision, Runtime runtime) {
    const std::uint64_t n = patches_per_image(v, in);
    const Architecture m = tower_block(v, n);
    const detail::Sizes z(m, n, in.images, precision, runtime);
    const Count tokens = Count(n / (v.merge * v.merge)) * in.images;
    std::vector<SavedTensor> rows;
    detail::TableBuilder own(rows);
    detail::norm_rows(own, m, z, "vision post-norm");
    own.add("vision projector: average pool", "its input, the patches made contiguous",
            "avg_pool2d's backward reads its input", shape::sbh, z.sbh, z.d);
    detail::rmsnorm_rows(own, z, "vision projector", shape::sbh, tokens * v.hidden, shape::sb,
                         tokens, "token", z.d, true);
    own.add("vision projector: projection", "its input", "the weight's gradient", shape::sbh,
            tokens * v.hidden, z.d);
    add_per_patch(t, rows, 1);
}

/// The image tokens each sequence's cross-attention layers read (mllama's): its share of the
/// micro-batch's images, each padded to max_num_tiles tiles of a class token and N patches.
inline std::uint64_t cross_attention_tokens(const VisionTower& v, const ImageInput& in,
                                            std::uint64_t micro_batch) {
    if (!v.tiled() || !in.any()) return 0;
    return ceil_div(Count(in.images), micro_batch).value() * v.tiles * v.tile_tokens();
}

namespace detail {
/// mllama's tower before and around its blocks (MllamaVisionModel, transformers v4.53.0): the patch
/// convolution's input cast; the pre- and post-tile embeddings' lookups (T h an image) and the
/// gated tile position embedding's (T N h), each kept for its gate's gradient, and the
/// aspect-ratio ids the three look up; the gates' tanh values (three in the embeddings' five
/// products, two a global block); layernorm_pre over the tiles' N tokens, layernorm_post over
/// their padded ones (`padded`: Sizes of the blocks).
inline void tile_embedding_rows(TableBuilder& t, const VisionTower& v, const ImageInput& in,
                                Precision precision, Runtime runtime, const Sizes& padded) {
    constexpr Shape per_patch{"n_img", ActivationSplit::replicated};
    const std::uint64_t d = bytes_per_element(precision.compute), tile = v.tile_tokens();
    const Count tiles = Count(in.images) * v.tiles;
    t.add("patch embedding", "the tiles' pixels cast to the weights' dtype",
          "the weight's gradient", per_patch, tiles * v.channels * v.image_size * v.image_size, d);
    t.add("pre- and post-tile embeddings x tanh(gate)", "their lookups, a row a tile",
          "each gate's gradient reads its lookup", per_patch, tiles * v.hidden, d, Keep::always, 2);
    t.add("tanh(gate) x tile position embedding", "the embedding's lookup",
          "the gate's gradient reads it", per_patch, tiles * tile * v.hidden, d);
    t.add("tile embeddings", "the aspect-ratio ids (int64), one an image",
          "each embedding's gradient is scattered into their rows", per_patch, Count(in.images), 8);
    t.add("the gates' tanh", "their values and 1 - the position gate's",
          "the gates' gradients and the products' read them", per_patch,
          Count(5 + 2 * v.global_depth), d);
    const Architecture block = tower_block(v, tile);
    std::vector<SavedTensor> norms;
    TableBuilder own(norms);
    norm_rows(own, block, Sizes(block, tile * v.tiles, in.images, precision, runtime),
              "vision layernorm_pre");
    norm_rows(own, block, padded, "vision layernorm_post");
    add_per_patch(t, norms, 1);
}

/// mllama's tower over one micro-batch's images, each padded to its tiles: the embeddings' rows,
/// every block over the image's tiles at once (each tile's tokens padded to a multiple of 8), each
/// global block's two gated outputs, a fused kernel's tiles mask, and the projector's input: the
/// last output beside the intermediate ones, of the unpadded tokens. Measured on CPU (eager):
/// validation/tiled_tower_saved.py.
inline void tiled_tower_rows(TableBuilder& t, const VisionTower& v, const ImageInput& in,
                             Precision precision, Attention attention, Runtime runtime,
                             Recompute mode) {
    constexpr Shape per_patch{"n_img", ActivationSplit::replicated};
    const std::uint64_t d = bytes_per_element(precision.compute);
    const std::uint64_t tile = v.tile_tokens(), n = v.tiles * ((tile + 7) / 8 * 8);
    const Architecture block = tower_block(v, n);
    const Sizes z(block, n, in.images, precision, runtime);
    tile_embedding_rows(t, v, in, precision, runtime, z);
    if (mode == Recompute::full) {
        t.add("vision tower (checkpointed blocks)", "each block's input",
              "recomputed in its backward", per_patch, z.sbh, bytes_per_element(precision.stream),
              Keep::always, v.blocks());
    } else {
        const LayerActivations layer =
            architecture_layer(block, n, in.images, precision, attention, runtime);
        add_per_patch(t, layer.rows, v.blocks(), "vision tower: ");
        t.add("vision global blocks: tanh(gate) x output", "the attention's and the MLP's outputs",
              "each gate's gradient reads its branch's output", per_patch, z.sbh, d, Keep::always,
              2 * v.global_depth);
    }
    if (attention == Attention::flash)  // SDPA with a mask runs its memory-efficient kernel
        t.add("vision attention mask", "the tiles' mask, (n_tiles x padded tokens)^2 an image",
              "each block's fused kernel keeps it for its backward", per_patch,
              Count(in.images) * n * n, d);
    t.add("multi_modal_projector", "its input, the last and the intermediate outputs",
          "the weight's gradient", per_patch,
          Count(in.images) * v.tiles * tile * (1 + v.intermediate_layers) * v.hidden, d);
}

/// mllama's images on the input side: the processor's tiles (every image padded to max_num_tiles),
/// the tower's rows where it trains, and the projector's output, the states every
/// cross-attention layer's k and v projections read (kept once, whatever trains).
inline void tiled_image_rows(TableBuilder& t, const VisionTower& v, const ImageInput& in,
                             Precision precision, Attention attention, Runtime runtime,
                             Recompute mode, bool trains) {
    constexpr Shape per_patch{"n_img", ActivationSplit::replicated};
    const Count tokens = Count(in.images) * v.tiles * v.tile_tokens();
    t.add("pixel values", "the processor's tiles (fp32)", "the batch's input", per_patch,
          Count(in.images) * v.tiles * v.channels * v.image_size * v.image_size, 4);
    if (trains) tiled_tower_rows(t, v, in, precision, attention, runtime, mode);
    t.add("cross-attention states", "the projector's output",
          "every cross-attention layer's k and v projections read it", per_patch,
          tokens * v.out_hidden, bytes_per_element(precision.compute));
}
}  // namespace detail

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
    if (v.tiled()) {
        detail::tiled_image_rows(t, v, in, precision, attention, runtime, mode, trains);
        return rows;
    }
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
        add_per_patch(t, block.rows, v.depth, "vision tower: ");  // each block's, D of them
    }
    if (v.pooled_projector) {
        projector_rows(t, v, in, precision, runtime);
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
