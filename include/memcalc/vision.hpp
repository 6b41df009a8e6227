#pragma once
/// A vision tower before the language model: a ViT whose merged patches join the sequence
/// (Qwen2.5-VL's Qwen2_5_VisionTransformerPretrainedModel, Qwen3-VL's Qwen3VLVisionModel, Gemma 3's
/// SigLIP tower and projector).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "memcalc/error.hpp"

namespace memcalc {

/// Patches embedded by a convolution over channels x temporal_patch x patch x patch pixels, an
/// optional learned position table, `depth` blocks (two norms, a fused qkv and its projection,
/// an MLP, every linear biased), and a merger of merge x merge patches (a norm, two linears)
/// into the language model's width; Qwen3-VL adds deepstack mergers, each its own merger with its
/// norm after the merge. Gemma 3's projector instead: SigLIP's post-LayerNorm, an average pool of
/// merge x merge patches, an RMSNorm and one bias-free linear. mllama's tiled tower cuts each
/// image into at most `tiles` square tiles of image_size, a class token beside each tile's
/// patches, learned position and tile embeddings chosen by the image's aspect ratio (one of
/// `aspect_ratios`, each table gated), `depth` local blocks then `global_depth` gated ones
/// (q, k, v and o without biases), and a projector of the last block's output beside
/// `intermediate_layers` earlier ones into the language model's width. Its parameters are counted
/// (Part::vision) and train or freeze (--frozen vision); what a micro-batch's images keep through
/// the step is blocks/vision_tower.hpp's. depth 0: no tower.
struct VisionTower {
    std::uint64_t depth = 0;
    std::uint64_t hidden = 0;
    std::uint64_t heads = 0;
    std::uint64_t ffn = 0;
    std::uint64_t patch = 0;
    std::uint64_t temporal_patch = 1;
    std::uint64_t channels = 3;
    std::uint64_t merge = 1;          ///< spatial_merge_size: merge x merge patches a token
    std::uint64_t out_hidden = 0;     ///< the mergers' output: the language model's width
    std::uint64_t position_rows = 0;  ///< a learned position table's rows (Qwen3-VL); 0: none
    std::uint64_t deepstack = 0;      ///< Qwen3-VL's deepstack mergers
    std::uint64_t image_size = 0;     ///< every image resized to its square (SigLIP); 0: as given
    std::uint64_t tiles = 0;          ///< mllama's max_num_tiles; 0: an untiled tower
    std::uint64_t global_depth = 0;   ///< mllama's gated global blocks after the local ones
    std::uint64_t aspect_ratios = 0;  ///< mllama's supported_aspect_ratios
    std::uint64_t intermediate_layers = 0;  ///< block outputs the projector reads beside the last
    bool gated_mlp = false;   ///< gate, up and down (Qwen2.5-VL) or fc1 and fc2 (Qwen3-VL)
    bool layernorm = false;   ///< LayerNorms, weight and bias (Qwen3-VL), or RMSNorms (Qwen2.5-VL)
    bool patch_bias = false;  ///< the patch convolution's bias (Qwen3-VL)
    bool rotary = false;      ///< 2-D rotary on each block's q and k (Qwen's)
    bool fused_qkv = true;    ///< one qkv linear (Qwen's) or q, k and v apart (SigLIP's)
    bool pooled_projector = false;  ///< Gemma 3's projector, not Qwen's merger
    bool attention_bias = true;     ///< q, k, v (or qkv) and the projection biased (not mllama's)

    bool enabled() const { return depth > 0; }
    bool tiled() const { return tiles > 0; }
    /// Every block, local and global.
    std::uint64_t blocks() const { return depth + global_depth; }
    /// A tile's patches and its class token (mllama's num_patches).
    std::uint64_t tile_tokens() const { return (image_size / patch) * (image_size / patch) + 1; }
    /// The merger's width: merge x merge patches side by side.
    std::uint64_t merged() const { return hidden * merge * merge; }
    /// The patches of an image of `width` x `height` pixels: a fixed size's, or each side rounded
    /// to the nearest multiple of patch x merge (Qwen's smart_resize, whose pixel bounds are not
    /// applied: give the size it makes), at least one merge.
    std::uint64_t patches(std::uint64_t width, std::uint64_t height) const {
        if (image_size > 0) return (image_size / patch) * (image_size / patch);
        const std::uint64_t unit = patch * merge;
        const auto side = [&](std::uint64_t pixels) {
            return std::max<std::uint64_t>(1, (pixels + unit / 2) / unit) * merge;
        };
        return side(width) * side(height);
    }
};

/// A field of the tower by its model-file key: one row each, read, written and compiled alike.
template <class T>
struct VisionField {
    std::string_view key;
    T VisionTower::*member;
};

inline constexpr std::array<VisionField<std::uint64_t>, 16> vision_counts{{
    {"depth", &VisionTower::depth},
    {"hidden", &VisionTower::hidden},
    {"heads", &VisionTower::heads},
    {"ffn", &VisionTower::ffn},
    {"patch", &VisionTower::patch},
    {"temporal_patch", &VisionTower::temporal_patch},
    {"channels", &VisionTower::channels},
    {"merge", &VisionTower::merge},
    {"out_hidden", &VisionTower::out_hidden},
    {"position_rows", &VisionTower::position_rows},
    {"deepstack", &VisionTower::deepstack},
    {"image_size", &VisionTower::image_size},
    {"tiles", &VisionTower::tiles},
    {"global_depth", &VisionTower::global_depth},
    {"aspect_ratios", &VisionTower::aspect_ratios},
    {"intermediate_layers", &VisionTower::intermediate_layers},
}};

inline constexpr std::array<VisionField<bool>, 7> vision_flags{{
    {"gated_mlp", &VisionTower::gated_mlp},
    {"layernorm", &VisionTower::layernorm},
    {"patch_bias", &VisionTower::patch_bias},
    {"rotary", &VisionTower::rotary},
    {"fused_qkv", &VisionTower::fused_qkv},
    {"pooled_projector", &VisionTower::pooled_projector},
    {"attention_bias", &VisionTower::attention_bias},
}};

/// mllama's tiles: square tiles of a fixed size, each aspect ratio's tables, no merger.
inline void validate_tiles(const VisionTower& v) {
    const bool tiled_fields =
        v.global_depth > 0 || v.aspect_ratios > 0 || v.intermediate_layers > 0;
    if (!v.tiled() && tiled_fields)
        throw error("vision global_depth, aspect_ratios and intermediate_layers need tiles > 0");
    if (!v.tiled()) return;
    if (v.image_size == 0 || v.aspect_ratios == 0)
        throw error("vision tiles needs image_size (a tile's side) and aspect_ratios");
    if (v.merge != 1 || v.temporal_patch != 1 || v.deepstack > 0 || v.pooled_projector)
        throw error(
            "vision tiles (mllama's tower) takes no merge, temporal_patch, deepstack or "
            "pooled_projector");
    if (v.intermediate_layers > v.depth)
        throw error("vision intermediate_layers (" + std::to_string(v.intermediate_layers) +
                    ") must not exceed depth (" + std::to_string(v.depth) + ")");
}

/// Throws memcalc::error naming the first field that makes the tower impossible.
inline void validate(const VisionTower& v) {
    if (!v.enabled()) return;
    for (const auto& f : vision_counts) {
        const bool may_be_zero = f.key == "position_rows" || f.key == "deepstack" ||
                                 f.key == "image_size" || f.key == "tiles" ||
                                 f.key == "global_depth" || f.key == "aspect_ratios" ||
                                 f.key == "intermediate_layers";
        if (!may_be_zero && v.*f.member == 0)
            throw error("vision " + std::string(f.key) + " must be a positive integer (got 0)");
    }
    if (v.hidden % v.heads != 0)
        throw error("vision heads (" + std::to_string(v.heads) + ") must divide vision hidden (" +
                    std::to_string(v.hidden) + ")");
    // A fixed size's patches pool merge x merge into whole tokens.
    if (v.image_size > 0 && v.image_size % (v.patch * v.merge) != 0)
        throw error("vision image_size (" + std::to_string(v.image_size) +
                    ") must be a multiple of patch x merge (" + std::to_string(v.patch * v.merge) +
                    ")");
    validate_tiles(v);
}

}  // namespace memcalc
