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
/// merge x merge patches, an RMSNorm and one bias-free linear. Its parameters are counted
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
    bool gated_mlp = false;           ///< gate, up and down (Qwen2.5-VL) or fc1 and fc2 (Qwen3-VL)
    bool layernorm = false;   ///< LayerNorms, weight and bias (Qwen3-VL), or RMSNorms (Qwen2.5-VL)
    bool patch_bias = false;  ///< the patch convolution's bias (Qwen3-VL)
    bool rotary = false;      ///< 2-D rotary on each block's q and k (Qwen's)
    bool fused_qkv = true;    ///< one qkv linear (Qwen's) or q, k and v apart (SigLIP's)
    bool pooled_projector = false;  ///< Gemma 3's projector, not Qwen's merger

    bool enabled() const { return depth > 0; }
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

inline constexpr std::array<VisionField<std::uint64_t>, 12> vision_counts{{
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
}};

inline constexpr std::array<VisionField<bool>, 6> vision_flags{{
    {"gated_mlp", &VisionTower::gated_mlp},
    {"layernorm", &VisionTower::layernorm},
    {"patch_bias", &VisionTower::patch_bias},
    {"rotary", &VisionTower::rotary},
    {"fused_qkv", &VisionTower::fused_qkv},
    {"pooled_projector", &VisionTower::pooled_projector},
}};

/// Throws memcalc::error naming the first field that makes the tower impossible.
inline void validate(const VisionTower& v) {
    if (!v.enabled()) return;
    for (const auto& f : vision_counts) {
        const bool may_be_zero =
            f.key == "position_rows" || f.key == "deepstack" || f.key == "image_size";
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
}

}  // namespace memcalc
