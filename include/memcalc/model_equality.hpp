#pragma once
/// Whether two models are the same, field by field (what lets estimate() keep the last model's
/// tables). Each struct's fields are counted at compile time, so that a field added to one of them
/// and not compared here stops the build instead of making two models look alike.
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

#include "memcalc/model.hpp"
#include "memcalc/vision.hpp"

namespace memcalc {
namespace detail {

/// Converts to any field's type; only ever named in unevaluated brace-initialisations.
struct AnyField {
    template <class T>
    operator T&() const;
};

template <class T, class Indices, class = void>
struct BraceInitializes : std::false_type {};
template <class T, std::size_t... I>
struct BraceInitializes<T, std::index_sequence<I...>,
                        std::void_t<decltype(T{(void(I), AnyField{})...})>> : std::true_type {};

/// The fields of aggregate T: the most initialisers its brace-initialisation takes.
template <class T, std::size_t N = 0>
constexpr std::size_t field_count() {
    if constexpr (BraceInitializes<T, std::make_index_sequence<N + 1>>::value)
        return field_count<T, N + 1>();
    else
        return N;
}

inline auto fields(const LatentAttention& x) {
    return std::tie(x.q_lora_rank, x.kv_lora_rank, x.qk_nope_head_dim, x.qk_rope_head_dim,
                    x.v_head_dim, x.index_heads, x.index_head_dim, x.index_topk);
}

inline auto fields(const StateSpace& x) {
    return std::tie(x.d_inner, x.d_state, x.d_conv, x.dt_rank, x.conv_bias, x.proj_bias,
                    x.inner_norms, x.kernels, x.gated_norm, x.heads, x.groups, x.chunk);
}

inline auto fields(const VisionTower& x) {
    return std::tie(x.depth, x.hidden, x.heads, x.ffn, x.patch, x.temporal_patch, x.channels,
                    x.merge, x.out_hidden, x.position_rows, x.deepstack, x.image_size, x.tiles,
                    x.global_depth, x.aspect_ratios, x.intermediate_layers, x.gated_mlp,
                    x.layernorm, x.patch_bias, x.rotary, x.fused_qkv, x.pooled_projector,
                    x.attention_bias);
}

inline auto fields(const LayerKind& x) {
    return std::tie(x.name, x.ffn, x.experts, x.experts_per_token, x.shared_ffn,
                    x.shared_expert_gate, x.router_bias, x.window, x.attention_chunk, x.position,
                    x.qk_norm, x.mixer, x.has_mlp);
}

inline auto fields(const LayerRun& x) { return std::tie(x.kind, x.count); }

/// The widths first: two models that differ mostly differ there, and the comparison stops early.
inline auto fields(const Architecture& x) {
    return std::tuple_cat(
        std::tie(x.hidden, x.layers, x.heads, x.kv_heads, x.head_dim, x.ffn, x.vocab,
                 x.max_positions, x.position_rows, x.embedding_rows, x.mlp, x.norm, x.bias,
                 x.position, x.tied_embeddings, x.head_bias, x.experts, x.experts_per_token,
                 x.activation, x.norms_per_layer, x.parallel_attention, x.embedding_norm,
                 x.attention_dropout, x.hidden_dropout, x.mlp_dropout, x.softmax_fp32),
        std::tie(x.attention_output_held, x.causal_mask_buffer, x.mask_in_product, x.fused_qkv,
                 x.fused_gate_up, x.repeat_kv, x.embedding_outputs_held, x.input_require_grads,
                 x.params_in_model_order, x.logits_fp32, x.qk_norm, x.norm_position,
                 x.rmsnorm_fp32_scale, x.rmsnorm_kernel, x.compile, x.fused_glu, x.latent_v_padded,
                 x.sequence_first, x.q_heads_first, x.router_input_fp32, x.attention_sinks,
                 x.attention_output_gate, x.stacked_experts, x.window, x.attention_chunk,
                 x.mtp_layers),
        std::tie(x.attention_temperature, x.expert_dispatch, x.router, x.input_jitter,
                 x.rotary_embedding, x.shared_ffn, x.shared_expert_gate, x.router_bias,
                 x.renormalize_topk, x.expert_imbalance, x.mla, x.mixer, x.ssm, x.vision,
                 x.cross_attention_tokens, x.has_mlp, x.layer_kinds, x.layer_pattern, x.name));
}

/// Element by element, in order, stopping at the first that differs (a fold the compiler inlines
/// whole, where std::tuple's operator== recurses through a call a field).
template <class Tuple, std::size_t... I>
bool same_fields(const Tuple& a, const Tuple& b, std::index_sequence<I...>) {
    return ((std::get<I>(a) == std::get<I>(b)) && ...);
}
/// Flattened, so that no tuple of references is built (every estimate() compares its model).
template <class T>
[[gnu::flatten]] bool same(const T& a, const T& b) {
    using Fields = decltype(fields(a));
    return same_fields(fields(a), fields(b), std::make_index_sequence<std::tuple_size_v<Fields>>());
}

template <class T>
constexpr bool compares_every_field() {
    return std::tuple_size_v<decltype(fields(std::declval<const T&>()))> == field_count<T>();
}
static_assert(compares_every_field<LatentAttention>() && compares_every_field<StateSpace>() &&
                  compares_every_field<VisionTower>() && compares_every_field<LayerKind>() &&
                  compares_every_field<LayerRun>() && compares_every_field<Architecture>(),
              "a model struct has a field that fields() does not list: add it there");

}  // namespace detail

inline bool operator==(const LatentAttention& a, const LatentAttention& b) {
    return detail::same(a, b);
}
inline bool operator==(const StateSpace& a, const StateSpace& b) { return detail::same(a, b); }
inline bool operator==(const VisionTower& a, const VisionTower& b) { return detail::same(a, b); }
inline bool operator==(const LayerKind& a, const LayerKind& b) { return detail::same(a, b); }
inline bool operator==(const LayerRun& a, const LayerRun& b) { return detail::same(a, b); }
/// Every field equal (a NaN dropout never is: two such models are taken as different).
inline bool operator==(const Architecture& a, const Architecture& b) { return detail::same(a, b); }
inline bool operator!=(const Architecture& a, const Architecture& b) { return !(a == b); }

}  // namespace memcalc
