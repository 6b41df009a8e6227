#pragma once
/// The parameter table: one row per tensor of the architecture, exact integer counts.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <vector>

#include "memcalc/dtype.hpp"
#include "memcalc/linears.hpp"
#include "memcalc/model.hpp"
#include "memcalc/text.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

enum class Part {
    embedding,
    attention,
    mlp,
    router,
    norms,
    final_norm,
    head,
    adapter,
    vision
};  // adapter: LoRA's (finetune.hpp); vision: a vision tower's (vision.hpp)

/// When a tensor's gradient appears in the backward pass: the head side first, each layer after its
/// own backward step, the input side (embeddings) last.
enum class Group { input, layer, head };

/// How a tensor divides across a tensor-parallel group (Megatron-LM's column and row splits).
enum class ParamSplit {
    replicated,  ///< norms, row-parallel biases, the router, learned positions
    tensor,      ///< q, k, v, o and the MLP matrices: split by heads or by MLP columns
    vocab,       ///< the embedding and the output head: ceil(V / tp) rows each
};

/// A parameter tensor's dimensions, held in place: at most three (experts x rows x columns).
class Dims {
public:
    Dims(std::initializer_list<std::uint64_t> dims) : size_(dims.size()) {
        if (size_ > values_.size())
            throw std::logic_error("a parameter tensor has at most 3 dimensions");
        std::copy(dims.begin(), dims.end(), values_.begin());
    }
    /// The tensor stacked `n` times (a mixture-of-experts layer's E experts): `n` leads.
    void stack(std::uint64_t n) {
        if (size_ == values_.size())
            throw std::logic_error("a parameter tensor has at most 3 dimensions");
        std::copy_backward(begin(), end(), values_.begin() + size_ + 1);
        values_[0] = n;
        ++size_;
    }
    const std::uint64_t* begin() const { return values_.data(); }
    const std::uint64_t* end() const { return values_.data() + size_; }
    std::size_t size() const { return size_; }
    std::vector<std::uint64_t> vector() const { return {begin(), end()}; }

private:
    std::array<std::uint64_t, 3> values_{};
    std::size_t size_;
};

struct ParamRow {
    /// A trainable row of `dims`, its count their product. A constructor, so that the table's rows
    /// are made in place: a row built aside and copied in is read back in wider pieces than it was
    /// written, which stalls every row on store-to-load forwarding.
    ParamRow(Part part_, Group group_, Text tensor_, Text shape_, Dims dims_, ParamSplit split_,
             bool expert_, std::uint8_t kind_, Linear linear_ = Linear::none,
             ParamRole role_ = ParamRole::weight)
        : part(part_),
          group(group_),
          tensor(tensor_),
          shape(shape_),
          dims(dims_),
          count(1),
          split(split_),
          expert(expert_),
          kind(kind_),
          linear(linear_),
          role(role_) {
        for (auto d : dims) count *= d;
    }

    Part part;
    Group group;
    Text tensor;  ///< "q_proj", "gate_proj", "final_norm.weight"
    Text shape;   ///< in the paper's letters: "h x a*d", "E x h x f"
    Dims dims;    ///< the same shape in numbers
    Count count;  ///< product of dims; per layer for Group::layer rows
    ParamSplit split = ParamSplit::replicated;
    bool expert =
        false;  ///< one of a mixture-of-experts layer's experts: split by expert parallelism
    /// Whether the optimiser steps it: a frozen tensor keeps its weights alone (no gradient, master
    /// copy or optimiser state), in `storage` when given (a 4-bit base model), else the recipe's
    /// dtype.
    bool trainable = true;
    std::optional<Storage> storage;  ///< frozen tensors only
    std::uint8_t kind =
        0;  ///< Group::layer rows: the kind of layer (Architecture::layer_kinds) it belongs to
    /// The linear it belongs to (an adapter's: the one it sits beside); none for a norm, a
    /// convolution, A_log, an embedding.
    Linear linear = Linear::none;
    ParamRole role = ParamRole::weight;  ///< a norm's or convolution's bias is a bias too
    bool mtp = false;  ///< of a multi-token-prediction module (in Group::head: the last stage's)

    /// Its linear's weight or bias (an adapter's rows are not): the rows a linear's gradient is.
    bool of_linear(Linear l) const {
        return linear == l && (role == ParamRole::weight || role == ParamRole::bias);
    }
};

struct ParameterTable {
    std::vector<ParamRow> rows;
    std::uint64_t layers = 0;
    std::size_t kinds = 1;  ///< kinds of layer: rows of each follow in turn
    std::array<std::uint64_t, max_layer_kinds> kind_layers{};  ///< how many layers each kind has
    std::vector<LayerRun> runs;  ///< the kinds' order, first layer first
                                 ///< (Architecture::layer_pattern; none: one kind)
    std::uint64_t hidden = 0;    ///< the model's width: a linear's side of it is not split by tp

    /// Parameters of one part; per-layer parts count one layer of each kind.
    Count part(Part p) const {
        Count sum;
        for (const auto& r : rows)
            if (r.part == p) sum += r.count;
        return sum;
    }
    Count group(Group g) const {
        Count sum;
        for (const auto& r : rows)
            if (r.group == g) sum += r.count;
        return sum;
    }
    /// One layer of kind `kind`.
    Count per_layer(std::size_t kind = 0) const {
        Count sum;
        for (const auto& r : rows)
            if (r.group == Group::layer && r.kind == kind) sum += r.count;
        return sum;
    }
    /// A row's count in the whole model: a layer row once per layer of its kind.
    Count in_model(const ParamRow& r) const {
        return r.group == Group::layer ? Count(kind_layers[r.kind]) * r.count : r.count;
    }
    Count total() const {
        Count sum;
        for (const auto& r : rows) sum += in_model(r);
        return sum;
    }
};

inline const char* part_name(Part p) {
    switch (p) {
        case Part::embedding: return "embedding";
        case Part::attention: return "attention";
        case Part::mlp: return "mlp";
        case Part::router: return "router";
        case Part::norms: return "norms";
        case Part::final_norm: return "final_norm";
        case Part::head: return "head";
        case Part::adapter: return "adapter";
        case Part::vision: return "vision";
    }
    return "?";
}

namespace detail {
/// parameter_table's rows, added a block of the model at a time in the table's order.
struct ParameterRows {
    const Architecture& m;
    ParameterTable& t;
    std::uint64_t h = m.hidden, V = m.vocab;
    std::uint64_t q = m.heads * m.head_size();               // a*d, the query width
    std::uint64_t kv = m.key_value_heads() * m.head_size();  // k*d, the key/value width
    std::uint8_t kind = 0;                                   // of the layer rows being added
    bool mtp = false;  // adding a multi-token-prediction module: its rows join the head's group
    static constexpr ParamSplit split = ParamSplit::tensor;
    struct NormNames {
        Text weight, bias;
    };

    void add(Part part, Group group, Text tensor, Text shape, Dims dims,
             ParamSplit how = ParamSplit::replicated, bool expert = false,
             Linear linear = Linear::none, ParamRole role = ParamRole::weight) {
        if (mtp) group = Group::head;
        t.rows.emplace_back(part, group, tensor, shape, dims, how, expert,
                            group == Group::layer ? kind : std::uint8_t{0}, linear, role);
        t.rows.back().mtp = mtp;
    }
    /// A layer's linear `l`: its weight's row or its bias's, named as linear_rows names them.
    void weight(Linear l, Part part, Text shape, Dims dims, ParamSplit how = ParamSplit::replicated,
                bool expert = false) {
        add(part, Group::layer, linear_row(l).tensor, shape, dims, how, expert, l);
    }
    void bias(Linear l, Part part, Text shape, Dims dims, ParamSplit how = ParamSplit::replicated,
              bool expert = false) {
        add(part, Group::layer, linear_row(l).bias, shape, dims, how, expert, l, ParamRole::bias);
    }
    void add_norm(Part part, Group group, NormNames name) {
        add(part, group, name.weight, "h", {h});
        if (m.norm == Norm::layernorm)
            add(part, group, name.bias, "h", {h}, ParamSplit::replicated, false, Linear::none,
                ParamRole::bias);
    }

    /// The input side. A tied head's gradient appears with the head, so the shared matrix joins
    /// that group.
    void input_side() {
        if (m.embedding_rows == 0)
            add(Part::embedding, m.tied_embeddings ? Group::head : Group::input, "token_embedding",
                "V x h", {V, h}, ParamSplit::vocab);
        else  // mllama's: more rows than the head predicts
            add(Part::embedding, Group::input, "token_embedding", "V_e x h", {m.embedding_rows, h},
                ParamSplit::vocab);
        if (m.position == Position::learned)
            add(Part::embedding, Group::input, "position_embedding", "P x h",
                {m.learned_positions(), h});
        if (m.embedding_norm)
            add_norm(Part::embedding, Group::input,
                     {"embedding_norm.weight", "embedding_norm.bias"});
        vision_tower();
    }

    /// A vision tower (VisionTower) on the input side, where its gradients appear last, whole on
    /// every tensor-parallel rank; a block's tensors stacked over the depth (D).
    void vision_tower() {
        const VisionTower& v = m.vision;
        if (!v.enabled()) return;
        const std::uint64_t hv = v.hidden, D = v.blocks(), f = v.ffn;
        vision_row("visual.patch_embed", "h_v x C*T*P*P",
                   {hv, v.channels * v.temporal_patch * v.patch * v.patch});
        if (v.patch_bias) vision_row("visual.patch_embed.bias", "h_v", {hv}, true);
        if (v.position_rows > 0) vision_row("visual.pos_embed", "P_v x h_v", {v.position_rows, hv});
        if (v.tiled()) tile_embeddings();
        vision_row("visual.blocks.norms", v.layernorm ? "D x 4h_v" : "D x 2h_v",
                   {D, (v.layernorm ? 4 : 2) * hv});
        vision_row("visual.blocks.attn.qkv", "D x h_v x 3h_v", {D, hv, 3 * hv});
        if (v.attention_bias)
            vision_row("visual.blocks.attn.qkv.bias", "D x 3h_v", {D, 3 * hv}, true);
        vision_row("visual.blocks.attn.proj", "D x h_v x h_v", {D, hv, hv});
        if (v.attention_bias) vision_row("visual.blocks.attn.proj.bias", "D x h_v", {D, hv}, true);
        if (v.global_depth > 0)  // tanh-gated attention and MLP
            vision_row("visual.global_blocks.gates", "D_g x 2", {v.global_depth, 2});
        const std::uint64_t ins = v.gated_mlp ? 2 : 1;  // gate and up, or fc1
        vision_row(v.gated_mlp ? "visual.blocks.mlp.gate_up" : "visual.blocks.mlp.fc1",
                   v.gated_mlp ? "D x h_v x 2f_v" : "D x h_v x f_v", {D, hv, ins * f});
        vision_row(v.gated_mlp ? "visual.blocks.mlp.gate_up.bias" : "visual.blocks.mlp.fc1.bias",
                   v.gated_mlp ? "D x 2f_v" : "D x f_v", {D, ins * f}, true);
        vision_row(v.gated_mlp ? "visual.blocks.mlp.down" : "visual.blocks.mlp.fc2",
                   "D x f_v x h_v", {D, f, hv});
        vision_row(v.gated_mlp ? "visual.blocks.mlp.down.bias" : "visual.blocks.mlp.fc2.bias",
                   "D x h_v", {D, hv}, true);
        if (v.pooled_projector) {  // Gemma 3's: SigLIP's post-LayerNorm, an RMSNorm, a linear
            vision_row("visual.post_layernorm", "2h_v", {2 * hv});
            vision_row("multi_modal_projector.mm_soft_emb_norm", "h_v", {hv});
            vision_row("multi_modal_projector.mm_input_projection", "h_v x h", {hv, v.out_hidden});
        } else if (v.tiled()) {  // mllama's: the last block's output and n earlier ones
            const std::uint64_t in = (1 + v.intermediate_layers) * hv;
            vision_row("multi_modal_projector", "(n+1)h_v x h", {in, v.out_hidden});
            vision_row("multi_modal_projector.bias", "h", {v.out_hidden}, true);
        } else {
            vision_mergers();
        }
    }

    /// mllama's tables before and after the local blocks (R aspect ratios and a padding row, T
    /// tiles of N patches and a class token): a gated position and tile embedding, pre- and
    /// post-tile embeddings with a gate each, and the LayerNorms around the local blocks.
    void tile_embeddings() {
        const VisionTower& v = m.vision;
        const std::uint64_t hv = v.hidden, rows = v.aspect_ratios + 1, N = v.tile_tokens();
        vision_row("visual.class_embedding", "h_v", {hv});
        vision_row("visual.gated_positional_embedding", "(N+1) x h_v", {N, hv});
        vision_row("visual.gated_positional_embedding.tile_embedding", "(R+1) x T*(N+1)*h_v",
                   {rows, v.tiles * N * hv});
        vision_row("visual.tile_positional_embeddings", "2 x (R+1) x T*h_v",
                   {2, rows, v.tiles * hv});
        vision_row("visual.embedding_gates", "3", {3});
        vision_row("visual.layernorm_pre_post", "2 x 2h_v", {2, 2 * hv});
    }

    /// Qwen's merger of merge x merge patches (h_m wide) and Qwen3-VL's deepstack mergers: the
    /// merger normalises each patch before merging (h_v), a deepstack one after (h_m).
    void vision_mergers() {
        const VisionTower& v = m.vision;
        const std::uint64_t hv = v.hidden, hm = v.merged();
        vision_row("visual.merger.norm", v.layernorm ? "2h_v" : "h_v",
                   {(v.layernorm ? 2 : 1) * hv});
        vision_row("visual.merger.fc1", "h_m x h_m", {hm, hm});
        vision_row("visual.merger.fc1.bias", "h_m", {hm}, true);
        vision_row("visual.merger.fc2", "h_m x h", {hm, v.out_hidden});
        vision_row("visual.merger.fc2.bias", "h", {v.out_hidden}, true);
        if (const std::uint64_t n = v.deepstack; n > 0) {
            vision_row("visual.deepstack_mergers.norm", "n x 2h_m", {n, 2 * hm});
            vision_row("visual.deepstack_mergers.fc1", "n x h_m x h_m", {n, hm, hm});
            vision_row("visual.deepstack_mergers.fc1.bias", "n x h_m", {n, hm}, true);
            vision_row("visual.deepstack_mergers.fc2", "n x h_m x h", {n, hm, v.out_hidden});
            vision_row("visual.deepstack_mergers.fc2.bias", "n x h", {n, v.out_hidden}, true);
        }
    }

    void vision_row(Text tensor, Text shape, Dims dims, bool bias = false) {
        add(Part::vision, Group::input, tensor, shape, dims, ParamSplit::replicated, false,
            Linear::none, bias ? ParamRole::bias : ParamRole::weight);
    }

    /// Latent attention, as transformers' DeepseekV3Attention holds it (d_n, d_r, d_v: the nope,
    /// rotary and v widths per head; r_q, r_kv: the latents). Megatron-LM's MultiLatentAttention
    /// keeps the down projections and the latents' norms whole on every tensor-parallel rank and
    /// splits the up projections and o_proj by heads. attention_bias adds q_a_proj's,
    /// kv_a_proj_with_mqa's and o_proj's.
    void latent_attention() {
        const LatentAttention& a = m.mla;
        const bool biased = m.bias == Bias::attention;
        if (a.q_lora_rank == 0) {
            weight(Linear::q, Part::attention, "h x a*(d_n+d_r)", {h, q}, split);
        } else {
            weight(Linear::q_a, Part::attention, "h x r_q", {h, a.q_lora_rank});
            if (biased) bias(Linear::q_a, Part::attention, "r_q", {a.q_lora_rank});
            add(Part::norms, Group::layer, "q_a_layernorm.weight", "r_q", {a.q_lora_rank});
            weight(Linear::q_b, Part::attention, "r_q x a*(d_n+d_r)", {a.q_lora_rank, q}, split);
        }
        weight(Linear::kv_a, Part::attention, "h x (r_kv+d_r)",
               {h, a.kv_lora_rank + a.qk_rope_head_dim});
        if (biased)
            bias(Linear::kv_a, Part::attention, "r_kv+d_r", {a.kv_lora_rank + a.qk_rope_head_dim});
        add(Part::norms, Group::layer, "kv_a_layernorm.weight", "r_kv", {a.kv_lora_rank});
        weight(Linear::kv_b, Part::attention, "r_kv x a*(d_n+d_v)",
               {a.kv_lora_rank, m.heads * (a.qk_nope_head_dim + a.v_head_dim)}, split);
        weight(Linear::o, Part::attention, "a*d_v x h", {m.heads * a.v_head_dim, h}, split);
        if (a.indexed()) sparse_indexer();
    }

    /// DeepSeek-V3.2's lightning indexer (transformers' DeepseekV32Indexer; A_i, D_i: its heads and
    /// their width): q from the query latent, one k for every head, a LayerNorm on k, a weight per
    /// head; whole on every tensor-parallel rank (DeepSeek's own code keeps them whole).
    void sparse_indexer() {
        const LatentAttention& a = m.mla;
        add(Part::attention, Group::layer, "indexer.wq_b", "r_q x A_i*D_i",
            {a.q_lora_rank, a.index_heads * a.index_head_dim});
        add(Part::attention, Group::layer, "indexer.wk", "h x D_i", {h, a.index_head_dim});
        add(Part::norms, Group::layer, "indexer.k_norm.weight", "D_i", {a.index_head_dim});
        add(Part::norms, Group::layer, "indexer.k_norm.bias", "D_i", {a.index_head_dim},
            ParamSplit::replicated, false, Linear::none, ParamRole::bias);
        add(Part::attention, Group::layer, "indexer.weights_proj", "h x A_i", {h, a.index_heads});
    }

    /// A Mamba-1 mixer, as transformers' JambaMambaMixer holds it (d_i: d_inner, N: d_state, r:
    /// dt_rank, K: d_conv), in the attention part. Split like Megatron-LM's Mamba mixer: every
    /// d_i-wide tensor by channels across tensor-parallel ranks; dt, B and C's norms whole on each.
    void mamba() {
        const StateSpace& x = m.ssm;
        const std::uint64_t di = x.d_inner, N = x.d_state, r = x.dt_rank;
        weight(Linear::mamba_in, Part::attention, "h x 2d_i", {h, 2 * di}, split);
        if (x.proj_bias) bias(Linear::mamba_in, Part::attention, "2d_i", {2 * di}, split);
        add(Part::attention, Group::layer, "conv1d.weight", "d_i x 1 x K", {di, 1, x.d_conv},
            split);
        if (x.conv_bias)
            add(Part::attention, Group::layer, "conv1d.bias", "d_i", {di}, split, false,
                Linear::none, ParamRole::bias);
        weight(Linear::mamba_x, Part::attention, "d_i x (r+2N)", {di, r + 2 * N}, split);
        weight(Linear::mamba_dt, Part::attention, "r x d_i", {r, di}, split);
        bias(Linear::mamba_dt, Part::attention, "d_i", {di}, split);
        add(Part::attention, Group::layer, "A_log", "d_i x N", {di, N}, split);
        add(Part::attention, Group::layer, "D", "d_i", {di}, split);
        if (x.inner_norms) {
            add(Part::norms, Group::layer, "dt_layernorm.weight", "r", {r});
            add(Part::norms, Group::layer, "b_layernorm.weight", "N", {N});
            add(Part::norms, Group::layer, "c_layernorm.weight", "N", {N});
        }
        weight(Linear::mamba_out, Part::attention, "d_i x h", {di, h}, split);
        if (x.proj_bias) bias(Linear::mamba_out, Part::attention, "h", {h});
    }

    /// A Mamba-2 mixer, as transformers' GraniteMoeHybridMambaLayer (and Mamba2Mixer) hold it
    /// (d_i: d_inner, N: d_state, G: groups, H: heads, K: d_conv), in the attention part: in_proj
    /// makes z, x, B, C and dt; the depthwise convolution runs over x, B and C; dt_bias, A_log
    /// and D hold one value a head; the gated RMSNorm's weight is d_i wide. Split like
    /// Megatron-LM's Mamba mixer (its groups and heads across tensor-parallel ranks), so every
    /// tensor here by its channels.
    void mamba2() {
        const StateSpace& x = m.ssm;
        const std::uint64_t di = x.d_inner, H = x.heads, conv = x.conv_channels();
        weight(Linear::mamba_in, Part::attention, "h x (2d_i+2GN+H)", {h, x.in_proj_width()},
               split);
        if (x.proj_bias)
            bias(Linear::mamba_in, Part::attention, "2d_i+2GN+H", {x.in_proj_width()}, split);
        add(Part::attention, Group::layer, "conv1d.weight", "(d_i+2GN) x 1 x K",
            {conv, 1, x.d_conv}, split);
        if (x.conv_bias)
            add(Part::attention, Group::layer, "conv1d.bias", "d_i+2GN", {conv}, split, false,
                Linear::none, ParamRole::bias);
        add(Part::attention, Group::layer, "dt_bias", "H", {H}, split);
        add(Part::attention, Group::layer, "A_log", "H", {H}, split);
        add(Part::attention, Group::layer, "D", "H", {H}, split);
        if (x.gated_norm) add(Part::norms, Group::layer, "norm.weight", "d_i", {di}, split);
        weight(Linear::mamba_out, Part::attention, "d_i x h", {di, h}, split);
        if (x.proj_bias) bias(Linear::mamba_out, Part::attention, "h", {h});
    }

    /// A Gated DeltaNet, as transformers' Qwen3NextGatedDeltaNet holds it (StateSpace's names:
    /// d_i = H value heads x d_v, q and k G key heads x N), in the attention part: in_proj_qkvz
    /// makes q, k, v and z, in_proj_ba beta and the gate's input per value head; the depthwise
    /// convolution runs over q, k and v without a bias; dt_bias and A_log hold one value a head;
    /// the gated RMSNorm's weight is one head's d_v, shared by every head. Split by heads like
    /// Mamba-2.
    void gated_deltanet() {
        const StateSpace& x = m.ssm;
        const std::uint64_t di = x.d_inner, H = x.heads, conv = x.conv_channels();
        weight(Linear::deltanet_qkvz, Part::attention, "h x (2GN+2d_i)",
               {h, x.deltanet_in_width() - 2 * H}, split);
        weight(Linear::deltanet_ba, Part::attention, "h x 2H", {h, 2 * H}, split);
        add(Part::attention, Group::layer, "conv1d.weight", "(d_i+2GN) x 1 x K",
            {conv, 1, x.d_conv}, split);
        add(Part::attention, Group::layer, "dt_bias", "H", {H}, split);
        add(Part::attention, Group::layer, "A_log", "H", {H}, split);
        add(Part::norms, Group::layer, "norm.weight", "d_i/H", {di / H});  // the gated RMSNorm
        weight(Linear::mamba_out, Part::attention, "d_i x h", {di, h}, split);
    }

    /// Attention: a query heads, k key/value heads of width d; an output gate doubles q_proj; q
    /// and k normed as `qk` (the layer kind's).
    void attention(QkNorm qk) {
        const bool gated = m.attention_output_gate;
        const std::uint64_t q_out = gated ? 2 * q : q;
        weight(Linear::q, Part::attention, gated ? "h x 2a*d" : "h x a*d", {h, q_out}, split);
        weight(Linear::k, Part::attention, "h x k*d", {h, kv}, split);
        weight(Linear::v, Part::attention, "h x k*d", {h, kv}, split);
        if (m.bias != Bias::none) {
            bias(Linear::q, Part::attention, gated ? "2a*d" : "a*d", {q_out}, split);
            bias(Linear::k, Part::attention, "k*d", {kv}, split);
            bias(Linear::v, Part::attention, "k*d", {kv}, split);
        }
        if (qk == QkNorm::per_head) {  // one weight of d, shared by every head
            add(Part::norms, Group::layer, "q_norm.weight", "d", {m.head_size()});
            add(Part::norms, Group::layer, "k_norm.weight", "d", {m.head_size()});
        } else if (qk == QkNorm::whole) {  // one weight over the whole projection (OLMo 2)
            add(Part::norms, Group::layer, "q_norm.weight", "a*d", {q});
            add(Part::norms, Group::layer, "k_norm.weight", "k*d", {kv});
        }
        if (m.attention_sinks)
            add(Part::attention, Group::layer, "sinks", "a", {m.heads}, split);  // a logit per head
        weight(Linear::o, Part::attention, "a*d x h", {q, h}, split);
    }

    /// mllama's cross-attention: attention's bias-free projections (k and v read the tower's
    /// states, projected to h), q and k normed per head, a tanh gate on the branch.
    void cross_attention() {
        weight(Linear::q, Part::attention, "h x a*d", {h, q}, split);
        weight(Linear::k, Part::attention, "h x k*d", {h, kv}, split);
        weight(Linear::v, Part::attention, "h x k*d", {h, kv}, split);
        add(Part::norms, Group::layer, "q_norm.weight", "d", {m.head_size()});
        add(Part::norms, Group::layer, "k_norm.weight", "d", {m.head_size()});
        weight(Linear::o, Part::attention, "a*d x h", {q, h}, split);
        add(Part::attention, Group::layer, "cross_attn_attn_gate", "1", {1});
    }

    /// One layer's mixer (attention, Mamba, or both) with the norms around it; `view`: its kind.
    /// A state-space mixer's tensors, where the layer has one (Falcon-H1's beside attention).
    void state_space_mixer(Mixer mixer) {
        if (mixer == Mixer::mamba) mamba();
        if (has_mamba2(mixer)) mamba2();
        if (mixer == Mixer::gated_deltanet) gated_deltanet();
    }
    /// Attention's tensors: latent or standard, and o_proj's bias; `view`: the layer's kind.
    void attention_mixer(const Architecture& view) {
        if (m.mla.enabled())
            latent_attention();
        else
            attention(view.qk_norm);
        if (m.bias == Bias::attention || m.bias == Bias::all)
            bias(Linear::o, Part::attention, "h", {h});
    }
    void mixer_block(const Architecture& view) {
        if (view.mixer == Mixer::none) return;  // a layer of its MLP or experts alone
        if (m.norms_before_branches())
            add_norm(Part::norms, Group::layer,
                     m.norms_per_layer == 1
                         ? NormNames{"layer_norm.weight", "layer_norm.bias"}
                         : NormNames{"attention_norm.weight", "attention_norm.bias"});
        state_space_mixer(view.mixer);
        if (attends(view.mixer)) attention_mixer(view);
        if (view.mixer == Mixer::cross_attention) cross_attention();
        if (m.norms_after_branches())
            add_norm(Part::norms, Group::layer,
                     {"post_attention_norm.weight", "post_attention_norm.bias"});
    }

    /// One layer's feed-forward block, once per expert for mixture-of-experts layers, with the
    /// norms around it; `view`: its kind.
    void mlp_block(const Architecture& view) {
        if (!view.has_mlp) return;  // a layer of its mixer alone
        const std::uint64_t f = view.ffn, E = view.experts;
        if (m.norms_per_layer >= 2 && m.norms_before_branches())
            add_norm(Part::norms, Group::layer, {"mlp_norm.weight", "mlp_norm.bias"});
        const bool moe = view.is_moe();
        // `shape` for a dense layer, `experts_shape` for E stacked experts.
        auto mlp = [&](Linear l, ParamRole role, Text shape, Text experts_shape, Dims dims,
                       ParamSplit s) {
            if (moe) dims.stack(E);
            const LinearRow& names = linear_row(l);
            add(Part::mlp, Group::layer, role == ParamRole::bias ? names.bias : names.tensor,
                moe ? experts_shape : shape, dims, s, moe, l, role);
        };
        constexpr ParamRole w = ParamRole::weight, b = ParamRole::bias;
        if (moe) weight(Linear::router, Part::router, "h x E", {h, E});
        if (view.router_bias == RouterBias::trainable) bias(Linear::router, Part::router, "E", {E});
        if (m.mlp == Mlp::gated) mlp(Linear::gate, w, "h x f", "E x h x f", {h, f}, split);
        mlp(Linear::up, w, "h x f", "E x h x f", {h, f}, split);
        mlp(Linear::down, w, "f x h", "E x f x h", {f, h}, split);
        if (m.bias == Bias::all) {
            if (m.mlp == Mlp::gated) mlp(Linear::gate, b, "f", "E x f", {f}, split);
            mlp(Linear::up, b, "f", "E x f", {f}, split);
            mlp(Linear::down, b, "h", "E x h", {h},
                ParamSplit::replicated);  // a row-parallel layer adds its bias once
        }
        // Shared experts: one dense MLP of width f_s beside the routed ones, split like a dense
        // layer's.
        if (const std::uint64_t fs = view.shared_ffn; fs > 0) {
            if (m.mlp == Mlp::gated)
                weight(Linear::shared_gate, Part::mlp, "h x f_s", {h, fs}, split);
            weight(Linear::shared_up, Part::mlp, "h x f_s", {h, fs}, split);
            weight(Linear::shared_down, Part::mlp, "f_s x h", {fs, h}, split);
        }
        if (view.shared_expert_gate)
            weight(Linear::shared_expert_gate, Part::router, "h x 1", {h, 1});
        if (view.mixer == Mixer::cross_attention)  // its MLP's tanh gate
            add(Part::mlp, Group::layer, "cross_attn_mlp_gate", "1", {1});
        if (m.norms_after_branches())
            add_norm(Part::norms, Group::layer, {"post_mlp_norm.weight", "post_mlp_norm.bias"});
    }

    /// One multi-token-prediction module (Architecture::mtp_layers; Megatron-LM's
    /// MultiTokenPredictionLayer): the embedding's and the hidden states' norms, eh_proj over
    /// their concatenation (column-parallel), a layer of the last kind, its final norm. Its
    /// embedding and head are the model's.
    void mtp_module(const Architecture& last) {
        mtp = true;
        add_norm(Part::norms, Group::head, {"mtp.enorm.weight", "mtp.enorm.bias"});
        add_norm(Part::norms, Group::head, {"mtp.hnorm.weight", "mtp.hnorm.bias"});
        add(Part::head, Group::head, "mtp.eh_proj", "2h x h", {2 * h, h}, split);
        mixer_block(last);
        mlp_block(last);
        add_norm(Part::final_norm, Group::head, {"mtp.final_norm.weight", "mtp.final_norm.bias"});
        mtp = false;
    }

    /// The head side.
    void head_side() {
        add_norm(Part::final_norm, Group::head, {"final_norm.weight", "final_norm.bias"});
        if (!m.tied_embeddings)
            add(Part::head, Group::head, linear_row(Linear::head).tensor, "h x V", {h, V},
                ParamSplit::vocab, false, Linear::head);
        if (m.head_bias)
            add(Part::head, Group::head, linear_row(Linear::head).bias, "V", {V}, ParamSplit::vocab,
                false, Linear::head, ParamRole::bias);
    }
};
}  // namespace detail

inline ParameterTable parameter_table(const Architecture& m) {
    validate(m);
    ParameterTable t;
    t.layers = m.layers, t.hidden = m.hidden;
    t.kinds = m.kind_count();
    for (std::size_t k = 0; k < t.kinds; ++k) t.kind_layers[k] = m.layers_of_kind(k);
    t.runs = m.layer_pattern;
    t.rows.reserve(28 * t.kinds);
    detail::ParameterRows rows{m, t};
    rows.input_side();
    // The layers, a kind at a time (one kind: every layer alike).
    for (std::size_t k = 0; k < t.kinds; ++k) {
        rows.kind = static_cast<std::uint8_t>(k);
        Architecture kind_view;  // one kind: the model itself, not copied
        const Architecture& view = m.layer_kinds.empty() ? m : (kind_view = m.kind_view(k));
        rows.mixer_block(view);
        rows.mlp_block(view);
    }
    rows.head_side();
    if (m.mtp_layers > 0) {
        const std::size_t last = m.last_kind();
        Architecture kind_view;  // as above
        const Architecture& view = m.layer_kinds.empty() ? m : (kind_view = m.kind_view(last));
        rows.kind = static_cast<std::uint8_t>(last);
        for (std::uint64_t i = 0; i < m.mtp_layers; ++i) rows.mtp_module(view);
    }
    return t;
}

namespace detail {
/// Why a model's parameters cannot be counted: its widths, whose product passes 64 bits.
inline std::string parameter_overflow(const Architecture& m) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    return "the parameter count of " + model_name(m) + " overflows 64 bits (hidden " + n(m.hidden) +
           ", layers " + n(m.layers) + ", ffn " + n(m.ffn) + ", vocab " + n(m.vocab) + ")";
}
}  // namespace detail

}  // namespace memcalc
