#pragma once
/// The saved-tensor table of one layer derived from the architecture itself: what PyTorch's eager
/// autograd keeps for backward when the layer is written as HuggingFace transformers writes it
/// (RMSNorm upcast to fp32, q/k/v with key/value heads, rotary, eager or fused attention, gated or
/// plain MLPs, mixture-of-experts routing), and the temporaries its ops make while they run. The
/// profile is current CUDA PyTorch (2.2 or later): LayerNorm keeps fp32 statistics, and mean() keeps
/// no copy of its input; Platform::cpu swaps in the CPU kernels that differ.
/// validation/reference_trainer.py counts the same tensors in a real framework.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memcalc/activation_functions.hpp"
#include "memcalc/activations.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/model.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

namespace detail {

/// Builds a table row by row: each row one saved storage, `copies` x `per_copy` elements; and,
/// when given lists for them, the workspaces of the ops and the op-level policy's outputs beyond the rows.
class TableBuilder {
public:
    explicit TableBuilder(std::vector<SavedTensor>& rows, std::vector<Workspace>* work = nullptr,
                          std::vector<PolicyOutput>* policy = nullptr)
        : rows_(rows), work_(work), policy_(policy) {}

    /// Whether torchtitan's op-level policy saves the output of the layer's next linear, in forward
    /// order: a bias-free one runs as aten.mm (a biased one as addmm, not on the save list), and the
    /// policy saves every mm but every second, counting per checkpointed call (its forward and its
    /// recomputation count alike). While `every_mm` is set each mm counts as saved: an upper bound.
    bool linear_saved(bool biased) {
        if (biased) return false;
        ++mm_count_;
        return every_mm_ || mm_count_ % 2 == 1;
    }
    void every_mm(bool on) { every_mm_ = on; }
    /// Starts a part of the layer (Module): every row and workspace added from now on belongs to it.
    /// Returns the part it ends, for a nested part to restore.
    Module current_section() const { return module_; }
    Module section(Module m) {
        const Module before = module_;
        module_ = m;
        return before;
    }
    /// The last row is the module's input itself, which its checkpoint keeps.
    void mark_module_input() { rows_.back().role = ModuleRole::input; }
    void row_role_at(std::size_t row, ModuleRole role) { rows_.at(row).role = role; }
    /// The last row's storage is a norm's output, which recomputing the norm discards.
    void mark_norm_output(bool is = true) { rows_.back().norm_output = is; }
    /// The current module's checkpoint keeps a tensor no other row keeps: a row counted only when it
    /// is recomputed (select_modules drops it otherwise).
    void checkpoint_input(Label tensor, const Shape& shape, Count elements, std::uint64_t bytes_per_element,
                          bool norm_output = false) {
        add(std::string(module_name(module_)) + " checkpoint", tensor, "the checkpoint reruns the module from it", shape,
            elements, bytes_per_element, Keep::only_selective);
        rows_.back().role = ModuleRole::checkpoint;
        rows_.back().norm_output = norm_output;
    }
    /// The last row is the output of an op the policy saves (SavedTensor::policy_saved).
    void mark_policy_saved(bool saved = true) { rows_.back().policy_saved = saved; }
    /// An output the policy saves that no row is, made after the rows added so far.
    void policy_output(bool saved, Label op, Label tensor, const Shape& shape, Count elements,
                       std::uint64_t bytes_per_element) {
        if (!saved || !policy_) return;
        policy_->push_back({rows_.size(), {op, tensor, "the op-level policy saves it; the recomputation reuses it",
                                           shape.symbol, 1, bytes_per_element, Keep::always, elements,
                                           elements * bytes_per_element, shape.split}});
        policy_->back().tensor.policy_saved = true;
    }

    /// A temporary of the op running now, by default while the rows added so far are live.
    /// `gradients_from`: in backward, the first parameter tensor of the layer whose gradient exists.
    void workspace(bool backward, Label op, Label tensor, Label formula, Count bytes, Label gradients_from = "") {
        workspace_at(rows_.size(), backward, op, tensor, formula, bytes, gradients_from);
    }
    void workspace_at(std::size_t absent_from, bool backward, Label op, Label tensor, Label formula, Count bytes,
                      Label gradients_from = "") {
        push({backward, op, tensor, formula, bytes, ActivationSplit::tensor, absent_from, gradients_from, false});
    }
    /// A temporary at the layer's last op (Workspace::layer_end), on the residual stream.
    void layer_end(Label op, Label tensor, Label formula, Count bytes) {
        push({false, op, tensor, formula, bytes, ActivationSplit::sequence, rows_.size(), {}, true});
    }
    std::size_t size() const { return rows_.size(); }
    /// The last row is the layer's input itself (SavedTensor::layer_input).
    void mark_layer_input(bool is_input) { rows_.back().layer_input = is_input; }
    void mark_layer_input_at(std::size_t row) { rows_.at(row).layer_input = true; }

    /// One saved storage of `copies` x `per_copy` elements of `shape`, which says how it divides
    /// across ranks.
    void add(Label op, Label tensor, Label why, const Shape& shape, Count per_copy, std::uint64_t bytes_per_element,
             Keep keep = Keep::always, std::uint64_t copies = 1) {
        const Count elements = per_copy * copies;
        rows_.push_back({op, tensor, why, shape.symbol, copies, bytes_per_element, keep, elements,
                         elements * bytes_per_element, shape.split});
        rows_.back().module = module_;
    }

private:
    void push(Workspace w) {
        w.module = module_;
        if (work_) work_->push_back(w);
    }

    std::vector<SavedTensor>& rows_;
    std::vector<Workspace>* work_;
    std::vector<PolicyOutput>* policy_;
    std::uint64_t mm_count_ = 0;
    bool every_mm_ = false;
    Module module_ = Module::none;
};

/// The sizes a layer's tensors are made of, for sequence s and micro-batch b.
struct Sizes {
    std::uint64_t seq;  ///< s
    Count tokens;    ///< s b
    Count sbh;       ///< the residual stream
    Count sbq;       ///< queries: s b a d
    Count sbkv;      ///< keys or values: s b k d
    Count sbf;       ///< the MLP's hidden width
    Count scores;    ///< a s^2 b
    DType compute;   ///< the recipe's compute dtype
    std::uint64_t d; ///< its bytes per activation
    DType stream;    ///< the residual stream's dtype: the compute dtype, or the weights' under autocast
    std::uint64_t s; ///< its bytes per element
    bool autocast;   ///< each matmul saves a copy of its input cast to the compute dtype
    /// Linear layers save their inputs cast once to this narrower dtype (Transformer Engine's fp8).
    std::optional<DType> narrow;
    Platform platform;
    /// Bytes per element of the copy a CPU kernel makes of a compute-dtype operand when the other is
    /// the stream's wider dtype (autocast's fp32 mask or residual): CUDA kernels cast as they read.
    std::uint64_t upcast;

    Sizes(const Architecture& m, std::uint64_t seq, std::uint64_t b, Precision p, Platform where = Platform::cuda)
        : seq(seq),
          tokens(Count(seq) * b),
          sbh(tokens * m.hidden),
          sbq(tokens * m.heads * m.head_size()),
          sbkv(tokens * m.key_value_heads() * m.head_size()),
          sbf(tokens * m.ffn),
          scores(Count(m.heads) * seq * seq * b),
          compute(p.compute),
          d(bytes_per_element(p.compute)),
          stream(p.stream),
          s(bytes_per_element(p.stream)),
          autocast(p.autocast),
          narrow(p.linear_inputs),
          platform(where),
          upcast(where == Platform::cpu && s != d ? s : 0) {}

    /// The same sizes for a linear layer that runs in the compute dtype (a router, Megatron-LM's head).
    Sizes wide_linears() const {
        Sizes wide = *this;
        wide.narrow.reset();
        return wide;
    }
};

/// "4 as^2b" for 4 bytes of `symbol`.
inline std::string bytes_of(std::uint64_t bytes, const std::string& symbol) {
    return std::to_string(bytes) + " " + symbol;
}

/// A normalisation layer's saved tensors. `what` names it ("attention norm"). `input_kept`: its input
/// is a tensor another row already keeps (a parallel layer's second norm reads the layer input too).
/// `layer_input`: it reads the layer's input, so a saved input that is no copy is the checkpoint itself.
/// HF's RMSNorm over `elements` values of `input` bytes each, normalised in `rows` rows:
/// x.float(); x * rsqrt(mean(x^2) + eps); weight * result.to(input dtype). The upcast is a new tensor
/// unless x is fp32 already. Returns whether the saved input is x itself (no copy).
inline bool rmsnorm_rows(TableBuilder& t, const std::string& what, const Shape& shape, Count elements,
                         const Shape& row_shape, Count rows, const std::string& row_name, std::uint64_t input) {
    t.add(what + " (RMSNorm)", input == dtype::fp32 ? "its input (fp32)" : "its input, upcast to fp32",
          "pow(x, 2) and x * rsqrt need x", shape, elements, dtype::fp32);
    t.add(what + " (RMSNorm)", "1/rms per " + row_name + ", fp32", "rsqrt's gradient is written in its output",
          row_shape, rows, dtype::fp32);
    t.add(what + " (RMSNorm)", "the normalised input", "the weight's gradient is x_norm x the output's gradient",
          shape, elements, input);
    return input == dtype::fp32;
}

/// Returns whether a row of it, or of an earlier norm (`input_kept`), is its input itself.
inline bool norm_rows(TableBuilder& t, const Architecture& m, const Sizes& z, const std::string& what,
                      bool input_kept = false, bool layer_input = false) {
    if (m.norm == Norm::rmsnorm) {
        // On the residual stream, in its dtype (fp32 under autocast, where the input kept is the stream itself).
        const std::size_t input_row = t.size();
        const bool keeps_input = rmsnorm_rows(t, what, shape::sbh, z.sbh, shape::sb, z.tokens, "token", z.s);
        if (keeps_input && layer_input) t.mark_layer_input_at(input_row);
        if (keeps_input) t.row_role_at(input_row, ModuleRole::input);
        return keeps_input || input_kept;
    } else {
        if (!input_kept) {
            t.add(what + " (LayerNorm)", "its input", "normalisation's gradient needs the input", shape::sbh, z.sbh, z.s);
            t.mark_layer_input(layer_input);
            t.mark_module_input();
        }
        // CUDA keeps the statistics in fp32; the CPU kernel in its input's dtype.
        const bool fp32 = z.platform == Platform::cuda;
        t.add(what + " (LayerNorm)", std::string("mean and 1/std per token, ") + (fp32 ? "fp32" : dtype_name(z.stream)),
              "so backward need not recompute them", shape::sb, z.tokens, fp32 ? dtype::fp32 : z.s, Keep::always, 2);
        return true;
    }
}

/// A dropout's saved tensor: CUDA's kernel keeps a 1-byte mask; on CPU, F.dropout multiplies by a
/// noise tensor of the input's dtype (`input`: bernoulli / (1 - p)) and the product keeps that.
inline void dropout_row(TableBuilder& t, const Sizes& z, DType input, const std::string& op, const Shape& shape,
                        Count elements, Keep keep = Keep::always) {
    if (z.platform == Platform::cuda)
        t.add(op, "mask (1 byte)", "which elements were zeroed", shape, elements, dtype::mask, keep);
    else
        t.add(op, std::string("noise (") + dtype_name(input) + ", CPU F.dropout)",
              "the gradient is multiplied by the same noise", shape, elements, bytes_per_element(input), keep);
}

/// What the projections reading a stream tensor keep: that tensor, or under autocast a copy of it cast
/// to the compute dtype by each of the `projections` (autocast caches only the weights' casts).
/// Separate projections are counted, as transformers writes LLaMA's: a fused one casts once (leans high).
/// Narrow (fp8) linears save one cast, as Megatron-LM's fused QKV and gate/up layers make it, and the
/// tensor itself is not kept (Transformer Engine's LayerNormLinear writes its norm's output in fp8).
inline void projection_input_row(TableBuilder& t, const Sizes& z, const std::string& op, const std::string& what,
                                 Count elements, const Shape& shape, std::uint64_t projections) {
    if (z.narrow) {
        t.add(op, what + ", cast once to " + dtype_name(*z.narrow), "weight gradient = input^T x output gradient",
              shape, elements, bytes_per_element(*z.narrow));
        return;
    }
    if (!z.autocast) {
        t.add(op, what, "weight gradient = input^T x output gradient", shape, elements, z.d);
        return;
    }
    t.add(op, what + ", cast to " + dtype_name(z.compute) + " by each of " + std::to_string(projections) + " (autocast)",
          "weight gradient = input^T x output gradient", shape, elements, z.d, Keep::always, projections);
}

/// The linear layers that read the MLP's input: gate and up, or up alone.
inline std::uint64_t mlp_input_projections(const Architecture& m) { return m.mlp == Mlp::gated ? 2 : 1; }

/// q, k and v as the attention products keep them. With fewer key/value heads than query heads,
/// eager attention repeats k and v to every head (a copy); selective recomputation's checkpoint
/// keeps the un-repeated k and v instead.
/// The op-level policy's q, k and v projection outputs: a row where the attention saves that very storage
/// (no rotary, no repeat, and the fused kernel's input or, at micro-batch 1, a view matmul keeps), else
/// an output of its own; eager attention's matmul copies a transposed operand when b > 1.
inline void qkv_rows(TableBuilder& t, const Architecture& m, const Sizes& z, Attention attention) {
    const bool rotary = m.position == Position::rotary;
    const bool changed = rotary || m.qk_norm != QkNorm::none;  // q and k are no longer the projections' outputs
    const bool repeated = attention == Attention::eager && m.key_value_heads() < m.heads;
    const bool qkv_bias = m.bias != Bias::none;
    const bool saved[3] = {t.linear_saved(qkv_bias), t.linear_saved(qkv_bias), t.linear_saved(qkv_bias)};
    const bool viewed = attention == Attention::flash || z.tokens == Count(z.seq);
    const bool shared[3] = {!changed && viewed, !changed && !repeated && viewed, !repeated && viewed};
    const char* names[3] = {"q projection", "k projection", "v projection"};
    for (int i = 0; i < 3; ++i)
        t.policy_output(saved[i] && !shared[i], names[i], "its output", i == 0 ? shape::sbq : shape::sbkv,
                        i == 0 ? z.sbq : z.sbkv, z.d);
    t.add("Q K^T", rotary ? "q after rotary" : "q", "the gradient w.r.t. k is q x the scores' gradient", shape::sbq,
          z.sbq, z.d);
    t.mark_policy_saved(saved[0] && shared[0]);
    for (int i : {1, 2}) {
        const bool key = i == 1;
        const std::string what = std::string(key ? "k" : "v") + (rotary && key ? " after rotary" : "");
        const std::string op = key ? "Q K^T" : "attention over V";
        const std::string why = key ? "the gradient w.r.t. q is the scores' gradient x k"
                                    : "the gradient w.r.t. the weights is the output's gradient x v";
        if (repeated) {
            t.add(op, what + ", repeated to every query head", why, shape::sbq, z.sbq, z.d, Keep::not_selective);
            t.add("selective checkpoint", what + " (k heads), an input of the core attention",
                  "the checkpoint reruns the core attention from it", shape::sbkv, z.sbkv, z.d, Keep::only_selective);
        } else {
            t.add(op, what, why, shape::sbkv, z.sbkv, z.d);
            t.mark_policy_saved(saved[i] && shared[i]);
        }
    }
}

/// Qwen3's and Gemma 3's q_norm and k_norm: an RMSNorm of each head's projection output, before rotary.
inline void qk_norm_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.qk_norm == QkNorm::none) return;
    rmsnorm_rows(t, "q_norm", shape::sbq, z.sbq, shape::asb, z.tokens * m.heads, "query head and token", z.d);
    rmsnorm_rows(t, "k_norm", shape::sbkv, z.sbkv, shape::ksb, z.tokens * m.key_value_heads(), "key head and token", z.d);
}

/// The cos and sin a layer's own rotary embedding makes (rotary_embeddings' per-layer rows): of
/// (1, s, head_dim) whatever the batch (position_ids is (1, s)), in v's dtype, the compute dtype; q *
/// cos and rotate_half(q) * sin save them, and k's products the same two. Outside selective
/// recomputation's checkpoint, so only full recomputation drops them.
inline void rotary_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.position != Position::rotary || !rotary_embedding(m.rotary_embedding).per_layer_tables) return;
    t.add("rotary embedding (this layer's)", "cos and sin for the sequence's positions",
          "q and k were multiplied by them", shape::sd, Count(z.seq) * m.head_size(), z.d, Keep::always, 2);
}

inline void attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z, Attention attention) {
    projection_input_row(t, z, "q/k/v projections",
                         m.parallel_attention && m.norms_per_layer == 1 && !z.autocast && !z.narrow
                             ? "their input, shared with the MLP"
                                                                                       : "their input",
                         z.sbh, shape::sbh, 3);
    t.mark_norm_output(!z.autocast && !z.narrow);
    qk_norm_rows(t, m, z);
    rotary_rows(t, m, z);
    qkv_rows(t, m, z, attention);
    // Korthikanti's selective checkpoint: its rows are those Keep marks, its input q, k and v above.
    t.section(Module::core_attn);
    if (attention == Attention::flash) {
        // A fused kernel never stores the s x s scores: it keeps its output and a log-sum-exp per row
        // and recomputes the scores block by block in backward.
        // Both are the kernel's outputs, which the op-level policy saves (the SDPA kernels are on its list).
        t.add("flash attention", "log-sum-exp per query row, fp32", "backward rebuilds the softmax from it", shape::asb,
              Count(m.heads) * z.tokens, dtype::fp32, Keep::not_selective);
        t.mark_policy_saved();
        t.add("flash attention", z.narrow ? "its output" : "its output (also the output projection's input)",
              "backward needs the output for the softmax gradient", shape::sbq, z.sbq, z.d);
        t.mark_policy_saved();
        if (z.narrow)  // beside the kernel's own copy
            projection_input_row(t, z, "output projection", "its input", z.sbq, shape::sbq, 1);
        // FlashAttention-2's backward: dq accumulated in fp32, dq, dk, dv, and a row sum per query.
        const Count work = z.sbq * (dtype::fp32 + z.d) + Count(2 * z.d) * z.sbkv + Count(m.heads) * z.tokens * dtype::fp32;
        t.workspace(true, "flash attention backward", "dq (fp32 accumulator and result), dk, dv, row sums",
                    bytes_of(dtype::fp32 + z.d, "sb(ad)") + " + " + bytes_of(2 * z.d, "sb(kd)") + " + 4 asb", work,
                    "o_proj");
        return;
    }
    const bool dropout = m.attention_dropout > 0;
    if (m.causal_mask_buffer == CausalMaskBuffer::per_layer) {
        // nanoGPT: masked_fill(bias[:, :, :s, :s] == 0, -inf) keeps the comparison's new s x s bool
        // tensor for backward (measured: validation/results/cpu-buffers.json); the scores stay in the
        // compute dtype, the scaled ones and the filled ones at once.
        t.add("masked_fill (registered mask)", "bias == 0 (bool), broadcast over batch and heads",
              "the gradient is zeroed where the mask was filled", shape::ss, Count(z.seq) * z.seq, dtype::mask,
              Keep::not_selective);
        t.workspace(false, "Q K^T / sqrt(d), masked_fill", "the scaled scores and the filled ones",
                    bytes_of(2 * z.d, "as^2b"), Count(2 * z.d) * z.scores);
    } else {
        // Q K^T, then / sqrt(d) and + mask, each out of place: two s x s score tensors at once, before
        // softmax makes the first saved one. The mask has the stream's dtype, which the sum takes (on CPU
        // through an upcast copy of the scores).
        const std::uint64_t scores = z.d + std::max(z.d, z.s + z.upcast);
        t.workspace(false, "Q K^T / sqrt(d) + mask",
                    z.upcast ? "the scaled scores, and their upcast copy and their sum with the mask"
                             : "the scaled scores, and the scores or their sum with the mask",
                    bytes_of(scores, "as^2b"), Count(scores) * z.scores);
    }
    const std::size_t softmax_row = t.size();
    // An fp32 sum (autocast's) softmaxes to fp32, as does CUDA autocast's softmax on any input.
    const bool softmax_fp32 = m.softmax_fp32 || z.autocast;
    if (softmax_fp32) {
        t.add("softmax", "its output, fp32", "softmax's gradient is written in its output", shape::scores, z.scores,
              dtype::fp32, Keep::not_selective);
        if (!dropout)
            t.add("attention over V", std::string("the weights, cast back to ") + dtype_name(z.compute),
                  "the gradient w.r.t. v is weights^T x the output's gradient", shape::scores, z.scores, z.d,
                  Keep::not_selective);
    } else {
        t.add("softmax", dropout ? "its output" : "its output (also the weights over V)",
              "softmax's gradient is written in its output", shape::scores, z.scores, z.d, Keep::not_selective);
    }
    if (dropout) {
        dropout_row(t, z, z.compute, "attention dropout", shape::scores, z.scores, Keep::not_selective);
        t.add("attention over V", "the dropped-out weights", "the gradient w.r.t. v is weights^T x the output's gradient",
              shape::scores, z.scores, z.d, Keep::not_selective);
    }
    if (z.narrow) projection_input_row(t, z, "output projection", "its input", z.sbq, shape::sbq, 1);
    else t.add("output projection", "its input", "weight gradient = input^T x output gradient", shape::sbq, z.sbq, z.d);

    // Softmax's input lives beside its output; its backward holds the gradients of both. Upcasting
    // on the fly is CUDA's: the CPU kernel softmaxes an fp32 copy and returns an fp32 gradient.
    const std::uint64_t out = softmax_fp32 ? dtype::fp32 : z.d;
    const bool copy = softmax_fp32 && z.platform == Platform::cpu && z.s != dtype::fp32;
    const std::uint64_t forward = z.s + (copy ? dtype::fp32 : 0), backward = out + (copy ? dtype::fp32 : z.s);
    t.workspace_at(softmax_row + 1, false, "softmax", copy ? "its input and its fp32 copy" : "its input",
                   bytes_of(forward, "as^2b"), Count(forward) * z.scores);
    t.workspace_at(softmax_row + 1, true, "softmax backward", "the gradients of its output and its input",
                   bytes_of(backward, "as^2b"), Count(backward) * z.scores, "o_proj");
}

/// The tensors the MLP's activation function keeps (its row in activation_functions.hpp), read from
/// `input`, the projection it follows; `input_saved`: the op-level policy saves that projection's output.
inline void activation_rows(TableBuilder& t, const ActivationFunction& fn, const Shape& shape, Count sbf,
                            const std::string& prefix, const std::string& input, std::uint64_t d, bool input_saved) {
    for (std::size_t i = 0; i < fn.kept_count(); ++i) {
        const ActivationTensor& kept = fn.kept[i];
        const std::string op = prefix + std::string(fn.label) + (kept.op.empty() ? "" : ": " + std::string(kept.op));
        const std::string tensor(kept.tensor);
        const bool is_input = tensor == "its input";
        t.add(op, is_input ? tensor + " (" + input + ")" : tensor, std::string(kept.why), shape, sbf, d);
        t.mark_policy_saved(is_input && input_saved);
        if (is_input && t.current_section() == Module::moe_act) t.mark_module_input();  // the checkpoint's input
    }
}

/// The down projection's input, which nothing else keeps: in the compute dtype, or its one narrow cast.
inline void down_projection_row(TableBuilder& t, const Sizes& z, const std::string& prefix, const std::string& what,
                                const Shape& shape, Count sbf) {
    if (z.narrow) projection_input_row(t, z, prefix + "down projection", what, sbf, shape, 1);
    else t.add(prefix + "down projection", what, "weight gradient = input^T x output gradient", shape, sbf, z.d);
}

/// A dense feed-forward block over `tokens` tokens (all of them, or those routed to the experts). A
/// dropout inside it (mlp_dropout, nn.TransformerEncoderLayer's) acts on the down projection's input.
/// Returns whether the op-level policy saves the down projection's output, which the caller places.
inline bool mlp_rows(TableBuilder& t, const Architecture& m, const Sizes& z, const Shape& shape, Count sbf,
                     const std::string& prefix) {
    const ActivationFunction& fn = activation_function(m.activation);
    const bool biased = m.bias == Bias::all;
    const std::string act = prefix + std::string(fn.label);
    const bool dropout = m.mlp_dropout > 0;
    // The routed experts' activation, from its input (the first projections' outputs) to the down projection's.
    const Module outer = t.current_section();
    if (outer == Module::moe) t.section(Module::moe_act);
    const auto end_act = [&] { t.section(outer); };
    // The dropout's backward: its incoming gradient and its input's, beside its mask or noise.
    const auto dropout_rows = [&] {
        dropout_row(t, z, z.compute, prefix + "MLP dropout", shape, sbf);
        t.workspace(true, prefix + "MLP dropout backward", "its incoming gradient and its input's gradient",
                    bytes_of(2 * z.d, shape.symbol), Count(2 * z.d) * sbf, "down_proj");
    };
    if (m.mlp == Mlp::gated) {
        const bool gate_saved = t.linear_saved(biased), up_saved = t.linear_saved(biased);  // act(gate(x)) * up(x)
        activation_rows(t, fn, shape, sbf, prefix, "the gate projection's output", z.d, gate_saved);
        t.add(prefix + "gate x up", std::string(fn.label) + "'s output", "the up branch's gradient is act(gate) x grad",
              shape, sbf, z.d);
        t.add(prefix + "gate x up", "the up projection's output", "the gate branch's gradient is up x grad", shape,
              sbf, z.d);
        t.mark_policy_saved(up_saved);
        if (outer == Module::moe) t.mark_module_input();  // with the gate's, moe_act's input
        // gate x up's backward: its incoming gradient and one for each factor, the down projection's
        // input already freed; the activation's own backward, after it, holds less.
        t.workspace(true, prefix + "gate x up backward", "its incoming gradient and the gradients of both factors",
                    bytes_of(3 * z.d, shape.symbol), Count(3 * z.d) * sbf, "down_proj");
        if (dropout) dropout_rows();
        down_projection_row(t, z, prefix, dropout ? "its input (gate x up, dropped out)" : "its input (gate x up)",
                            shape, sbf);
        end_act();
        return t.linear_saved(biased);
    }
    activation_rows(t, fn, shape, sbf, prefix, "the up projection's output", z.d, t.linear_saved(biased));
    // An output the function keeps is the down projection's input, unless a dropout comes between.
    if (fn.keeps_output && dropout)
        t.add(act, "its output", "its derivative is read from its output", shape, sbf, z.d);
    const std::size_t act_end = t.size();
    if (dropout) dropout_rows();
    down_projection_row(t, z, prefix,
                        dropout ? "its input (the dropped-out hidden)" : "its input (" + std::string(fn.label) + "'s output)",
                        shape, sbf);
    const std::uint64_t work = fn.backward_workspace * z.d;
    t.workspace_at(fn.keeps_output && !dropout ? t.size() : act_end, true, act + " backward",
                   fn.kernel == ActivationKernel::fused ? "its incoming gradient and its input's gradient"
                                                        : "its incoming gradient and the last product's two gradients",
                   bytes_of(work, shape.symbol), Count(work) * sbf, "down_proj");
    end_act();
    return t.linear_saved(biased);
}

/// HF's sparse mixture-of-experts block: route, gather each expert's tokens, run it, weight, scatter.
inline void moe_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const std::uint64_t k = m.active_experts();
    const Count slots = z.tokens * k;  // every token goes to k experts: s b k rows in all, whatever the routing
    t.policy_output(t.linear_saved(false), "router", "its logits", shape::sbE, z.tokens * m.experts, z.d);
    t.add("router softmax", "routing probabilities, fp32", "softmax's gradient is written in its output", shape::sbE,
          z.tokens * m.experts, dtype::fp32);
    t.add("top-k", "the chosen experts' indices (int64)", "to scatter the gradient back", shape::sbk, slots, 8);
    t.add("renormalise top-k", "the top-k probabilities, fp32", "division's gradient needs the numerator", shape::sbk,
          slots, dtype::fp32);
    t.add("renormalise top-k", "their sum per token, fp32", "division's gradient needs the denominator", shape::sb,
          z.tokens, dtype::fp32);
    t.add("dispatch", "token and slot indices per expert (2 x int64)", "index and index_add need them", shape::sbk, slots,
          16);
    // Gathered from the stream: under autocast fp32, and each expert's first projections cast it again.
    // Narrow linears keep only their cast of it.
    if (z.narrow)
        projection_input_row(t, z, "experts: first projections", "the gathered tokens", slots * m.hidden, shape::sbkh, 1);
    else
        t.add("dispatch", "the gathered tokens", "the expert's first projections need their input", shape::sbkh,
              slots * m.hidden, z.s);
    if (z.autocast)
        projection_input_row(t, z, "experts: first projections", "the gathered tokens", slots * m.hidden, shape::sbkh,
                             mlp_input_projections(m));
    // Which experts' mms the op-level policy saves depends on how many experts the routing fills and in
    // what order: counted as if it saved every one (an upper bound; about half are).
    t.every_mm(true);
    const bool down_saved = mlp_rows(t, m, z, shape::sbkf, slots * m.ffn, "experts: ");
    t.every_mm(false);
    t.add("expert output x weight", "the expert outputs", "the routing weight's gradient", shape::sbkh, slots * m.hidden,
          z.d);
    t.mark_policy_saved(down_saved);
    // transformers casts the routing weights to the stream's dtype, which the weighted outputs take.
    t.add("expert output x weight", std::string("the routing weights, ") + dtype_name(z.stream),
          "the expert output's gradient", shape::sbk, slots, z.s);
    t.add("combine (index_add)", "the weighted expert outputs", "index_add keeps its source", shape::sbkh,
          slots * m.hidden, z.s);
}

}  // namespace detail

/// One layer's saved tensors as PyTorch keeps them for this architecture, `d`-byte activations.
/// `modules`: what selective recomputation checkpoints (select_modules); none ({0}): the table unselected,
/// every module's checkpoint rows in it.
inline LayerActivations architecture_layer(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch,
                                           Precision precision, Attention attention, Platform platform = Platform::cuda,
                                           ModuleSet modules = {}) {
    const detail::Sizes z(m, seq, micro_batch, precision, platform);
    const std::uint64_t d = z.d;
    LayerActivations layer;
    detail::TableBuilder t(layer.rows, &layer.work, &layer.policy_outputs);
    const bool shared_norm = m.parallel_attention && m.norms_per_layer == 1;

    // Megatron-LM's layernorm module: input_layernorm and pre_mlp_layernorm. Its checkpoint keeps the
    // norm's input: a row of the norm's where that is the input itself, else a copy of its own.
    const auto layer_norm = [&](const std::string& what, bool input_kept, bool layer_input) {
        t.section(Module::layernorm);
        if (!detail::norm_rows(t, m, z, what, input_kept, layer_input))
            t.checkpoint_input("the norm's input (the residual stream)", shape::sbh, z.sbh, z.s);
    };
    layer_norm(shared_norm ? "layer norm" : "attention norm", false, true);
    t.section(Module::attention);
    detail::attention_rows(t, m, z, attention);
    t.section(Module::none);
    t.policy_output(t.linear_saved(m.bias == Bias::attention || m.bias == Bias::all), "output projection", "its output",
                    shape::sbh, z.sbh, z.d);
    if (m.norms_per_layer == 4) detail::norm_rows(t, m, z, "post-attention norm");
    if (m.hidden_dropout > 0 && !m.parallel_attention)
        detail::dropout_row(t, z, z.compute, "attention residual dropout", shape::sbh, z.sbh);

    layer.mlp_half_from = t.size();
    if (!shared_norm) layer_norm("MLP norm", m.parallel_attention, false);
    t.section(m.is_moe() ? Module::moe : Module::mlp);
    // Under autocast a shared norm's output is cast again by the MLP's projections (the router, for
    // experts); narrow linears save their own cast of it.
    // A router is no Transformer Engine module: it keeps its input in the compute dtype.
    const detail::Sizes& mlp_sizes = m.is_moe() ? z.wide_linears() : z;
    // The module's checkpoint keeps the norm's output: the row below where it is that very storage.
    const bool input_is_norm_output = !mlp_sizes.autocast && !mlp_sizes.narrow;
    if (!shared_norm || z.autocast || z.narrow) {
        detail::projection_input_row(t, mlp_sizes, m.is_moe() ? "router and experts" : "MLP up projections",
                                     "their input", z.sbh, shape::sbh, m.is_moe() ? 1 : detail::mlp_input_projections(m));
        if (input_is_norm_output) t.mark_module_input(), t.mark_norm_output();
    }
    if (!input_is_norm_output) t.checkpoint_input("the norm's output", shape::sbh, z.sbh, z.s, true);
    if (m.is_moe()) {
        detail::moe_rows(t, m, z);
    } else {
        t.policy_output(detail::mlp_rows(t, m, z, shape::sbf, z.sbf, ""), "MLP down projection", "its output", shape::sbh,
                        z.sbh, z.d);
    }
    t.section(Module::none);
    if (m.norms_per_layer == 4) detail::norm_rows(t, m, z, "post-MLP norm");
    if (m.hidden_dropout > 0)
        detail::dropout_row(t, z, z.compute, m.parallel_attention ? "residual dropout" : "MLP residual dropout",
                            shape::sbh, z.sbh);

    // The last add: the MLP's output (compute dtype) and the sum (the stream's), beside the residual
    // stream's earlier tensors that no row keeps (a LayerNorm keeps its input; an RMSNorm only an fp32
    // copy, which is the stream itself when that is fp32).
    const bool norm_keeps_stream = m.norm == Norm::layernorm || z.s == dtype::fp32;
    const std::uint64_t stream = (m.parallel_attention ? (norm_keeps_stream ? 2 * d + z.s : 2 * d + 2 * z.s)
                                                       : (norm_keeps_stream ? d + z.s : d + 3 * z.s)) +
                                 z.upcast;
    const std::string what =
        std::string(m.parallel_attention
                        ? (norm_keeps_stream ? "the attention's and the MLP's outputs, the sum"
                                             : "the layer's input, the attention's and the MLP's outputs, the sum")
                        : (norm_keeps_stream ? "the MLP's output and the sum"
                                             : "the layer's input, the attention half's sum, the MLP's output, the sum")) +
        (z.upcast ? ", the MLP's output upcast (CPU)" : "");
    t.layer_end("residual add (the layer's last op)", what, detail::bytes_of(stream, "sbh"), Count(stream) * z.sbh);

    layer.input_bytes = z.sbh * z.s;  // the checkpoint keeps the layer's input
    if (modules.bits != 0) select_modules(layer, modules);
    return layer;
}

/// What the embedding side saves from the first forward step until the last backward step.
inline std::vector<SavedTensor> input_side_saved(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch,
                                                 Precision precision, Platform platform = Platform::cuda) {
    const detail::Sizes z(m, seq, micro_batch, precision, platform);
    const std::uint64_t d = z.d;
    std::vector<SavedTensor> rows;
    detail::TableBuilder t(rows);
    t.add("token embedding", "the token ids (int64)", "the gradient is scattered into their rows", shape::ids,
                     z.tokens, 8);
    if (m.position == Position::rotary && !rotary_embedding(m.rotary_embedding).per_layer_tables)
        t.add("rotary embedding", "cos and sin tables, shared by every layer", "q and k were multiplied by them", shape::sd,
              Count(seq) * m.head_size(), d, Keep::always, 2);
    if (m.embedding_norm) detail::norm_rows(t, m, z, "embedding norm");
    if (m.hidden_dropout > 0)  // the embedding's output: the stream's dtype
        detail::dropout_row(t, z, z.stream, "embedding dropout", shape::sbh, z.sbh);
    return rows;
}

/// What one forward pass builds for all its layers and drops when it returns, after the loss: eager
/// attention's causal mask, s^2 b values of the embeddings' dtype (the stream's), as transformers builds it.
/// None where each layer masks with its registered buffer instead.
inline std::vector<SavedTensor> forward_buffers(std::uint64_t seq, std::uint64_t micro_batch, Precision precision,
                                                Attention attention,
                                                CausalMaskBuffer buffer = CausalMaskBuffer::none) {
    const std::uint64_t d = bytes_per_element(precision.stream);
    std::vector<SavedTensor> rows;
    // The fused kernel masks inside.
    if (attention == Attention::flash || buffer == CausalMaskBuffer::per_layer) return rows;
    detail::TableBuilder t(rows);
    t.add("causal mask", "0 or -inf per query and key, made once per forward", "added to every layer's scores",
                     shape::mask, Count(seq) * seq * micro_batch, d);
    return rows;
}

/// What the model's output adds when it keeps each layer's k and v (use_cache): post-rotary, of the
/// key/value heads, in the compute dtype, as transformers' attention hands them back. Where backward
/// saves those very tensors (no repeat, or selective recomputation's checkpoint inputs) they add
/// nothing; the repeated copies eager attention saves, or full recomputation's bare input, leave them
/// extra (measured: validation/results/cpu-buffers.json).
inline std::vector<SavedTensor> kv_cache_rows(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch,
                                              Precision precision, Attention attention, Recompute mode) {
    const detail::Sizes z(m, seq, micro_batch, precision);
    const bool repeated = attention == Attention::eager && m.key_value_heads() < m.heads;
    std::vector<SavedTensor> rows;
    if (mode == Recompute::selective || (mode == Recompute::none && !repeated)) return rows;
    detail::TableBuilder t(rows);
    t.add("k/v cache (the model's output)", "k after rotary and v, k heads", "use_cache hands them back",
          shape::sbkv, z.sbkv, z.d, Keep::always, 2);
    return rows;
}

/// The loss's dtype: its log-probabilities and their gradients. None for a fused kernel, which
/// writes the gradient over the logits and keeps nothing of the vocabulary's width. Autocast runs
/// cross_entropy in fp32 whatever its input (CUDA's op lists; measured on CPU).
inline std::optional<DType> loss_dtype(LossKernel loss, Precision precision) {
    switch (loss) {
        case LossKernel::fp32: return DType::fp32;
        case LossKernel::bf16: return precision.autocast ? DType::fp32 : precision.compute;
        case LossKernel::fused: return std::nullopt;
        case LossKernel::fp32_inplace: return DType::fp32;
    }
    return DType::fp32;
}

/// What the head and the loss save for their backward pass: from the loss step until the head's
/// backward, at the start of backward L.
inline std::vector<SavedTensor> head_saved(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch,
                                           Precision precision, Platform platform = Platform::cuda,
                                           LossKernel loss = LossKernel::fp32) {
    const detail::Sizes z(m, seq, micro_batch, precision, platform);
    std::vector<SavedTensor> rows;
    detail::TableBuilder t(rows);
    detail::norm_rows(t, m, z, "final norm");
    // Megatron-LM's output layer is no Transformer Engine module: its input stays in the compute dtype.
    detail::projection_input_row(t, z.wide_linears(), "output head", "its input", z.sbh, shape::sbh, 1);
    if (loss == LossKernel::fp32_inplace)
        t.add("loss (softmax in place)", "an fp32 copy of the logits, softmaxed in place",
              "the gradient is written over it", shape::sbV, z.tokens * m.vocab, dtype::fp32);
    else if (const auto logp = loss_dtype(loss, precision))
        t.add("loss (log-softmax)", std::string("log-probabilities, ") + dtype_name(*logp),
              "log-softmax's gradient is written in its output", shape::sbV, z.tokens * m.vocab, bytes_per_element(*logp));
    t.add("loss (NLL)", "the target ids (int64)", "which log-probability each token's loss picked", shape::ids,
                     z.tokens, 8);
    return rows;
}

inline Count saved_bytes(const std::vector<SavedTensor>& rows) {
    Count sum;
    for (const auto& r : rows) sum += r.bytes;
    return sum;
}

}  // namespace memcalc
