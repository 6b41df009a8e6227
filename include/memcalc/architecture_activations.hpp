#pragma once
/// The saved-tensor table of one layer derived from the architecture itself: what PyTorch's eager
/// autograd keeps for backward when the layer is written as HuggingFace transformers writes it
/// (RMSNorm upcast to fp32, q/k/v with key/value heads, rotary, eager or fused attention, gated or
/// plain MLPs, mixture-of-experts routing), and the temporaries its ops make while they run. The
/// profile is current CUDA PyTorch (2.2 or later): LayerNorm keeps fp32 statistics, and mean()
/// keeps no copy of its input; where kernels differ, an op reads its fact (kernels.hpp).
/// validation/reference_trainer.py counts the same tensors in a real framework.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memcalc/activation_functions.hpp"
#include "memcalc/activations.hpp"
#include "memcalc/finetune.hpp"
#include "memcalc/kernels.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/model.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/ssm_activations.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

namespace detail {

/// What a row is to the recomputations besides its Keep, given when it is made (SavedTensor's
/// fields of the same names).
struct RowFacts {
    bool layer_input = false;   ///< the layer's input itself, the same storage
    bool policy_saved = false;  ///< the output of an op the op-level policy saves
    bool norm_output = false;   ///< a norm's output, which recomputing the norm discards
    ModuleRole role = ModuleRole::inside;

    RowFacts input_of_layer(bool is = true) const { return with(&RowFacts::layer_input, is); }
    RowFacts saved_by_policy(bool is = true) const { return with(&RowFacts::policy_saved, is); }
    RowFacts output_of_norm(bool is = true) const { return with(&RowFacts::norm_output, is); }
    /// The module's input itself, which its checkpoint keeps.
    RowFacts input_of_module(bool is = true) const {
        RowFacts f = *this;
        if (is) f.role = ModuleRole::input;
        return f;
    }

private:
    RowFacts with(bool RowFacts::*field, bool is) const {
        RowFacts f = *this;
        f.*field = is;
        return f;
    }
};

/// Builds a table row by row: each row one saved storage, `copies` x `per_copy` elements; and,
/// given a layer, its program: the rows, its ops' workspaces, the op-level policy's outputs beyond
/// the rows and what is alive beside each op, in the order the forward makes them.
class TableBuilder {
public:
    explicit TableBuilder(std::vector<SavedTensor>& rows, LayerActivations* layer = nullptr,
                          LayerTuning tuning = {})
        : tuning(tuning), rows_(rows), layer_(layer) {
        if (layer_) layer_->program.reserve(96), places_.reserve(96);
    }

    /// What fine-tuning changes: frozen linears and norms keep nothing for their weights'
    /// gradients, and LoRA's adapters keep their own inputs.
    const LayerTuning tuning;

    /// Whether torchtitan's op-level policy saves the output of the layer's next linear, in forward
    /// order: a bias-free one runs as aten.mm (a biased one as addmm, not on the save list), and
    /// the policy saves every mm but every second, counting per checkpointed call (its forward and
    /// its recomputation count alike). While `every_mm` is set each mm counts as saved: an upper
    /// bound.
    bool linear_saved(bool biased) {
        if (biased) return false;
        ++mm_count_;
        return every_mm_ || mm_count_ % 2 == 1;
    }
    void every_mm(bool on) { every_mm_ = on; }
    /// Starts a part of the layer (Module): every row and workspace added from now on belongs to
    /// it. Returns the part it ends, for a nested part to restore.
    Module current_section() const { return module_; }
    Module section(Module m) {
        const Module before = module_;
        module_ = m;
        return before;
    }
    /// The current module's checkpoint keeps a tensor no other row keeps: a row counted only when
    /// it is recomputed (select_modules drops it otherwise).
    void checkpoint_input(Label tensor, const Shape& shape, Count elements,
                          std::uint64_t bytes_per_element, bool norm_output = false) {
        RowFacts facts = RowFacts{}.output_of_norm(norm_output);
        facts.role = ModuleRole::checkpoint;
        add(std::string(module_name(module_)) + " checkpoint", tensor,
            "the checkpoint reruns the module from it", shape, elements, bytes_per_element,
            Keep::only_selective, 1, facts);
    }
    /// An output the policy saves that no row is, made after the rows added so far.
    void policy_output(bool saved, Label op, Label tensor, const Shape& shape, Count elements,
                       std::uint64_t bytes_per_element) {
        if (!saved || !layer_) return;
        auto& outputs = layer_->policy_outputs;
        place(rows_.size(), Order::policy, StepKind::policy, outputs.size());
        outputs.push_back({{op, tensor, "the op-level policy saves it; the recomputation reuses it",
                            shape.symbol, 1, bytes_per_element, Keep::always, elements,
                            elements * bytes_per_element, shape.split}});
        outputs.back().tensor.policy_saved = true;
    }

    /// A temporary of the op running now, while the rows added so far are live: in forward
    /// beside the residual stream's tensors (stream_beside). `gradients_from`: in backward, the
    /// first parameter tensor of the layer whose gradient exists.
    void workspace(bool backward, Label op, Label tensor, Label formula, Count bytes,
                   Label gradients_from = "") {
        workspace_at(rows_.size(), backward, op, tensor, formula, bytes, gradients_from);
    }
    /// The same, run before row `before` is made (in backward: after its backward has run).
    void workspace_at(std::size_t before, bool backward, Label op, Label tensor, Label formula,
                      Count bytes, Label gradients_from = "",
                      ActivationSplit split = ActivationSplit::tensor) {
        if (!layer_) return;
        if (!backward) {  // the residual stream's tensors the caller holds
            constexpr std::uint8_t all = 0xf;
            constexpr std::uint8_t not_checkpointed =
                Beside::mode_bit(Recompute::none) | Beside::mode_bit(Recompute::selective);
            add_beside(before, {"the residual stream (its caller's)", stream_other_,
                                ActivationSplit::sequence, Holder::caller, all});
            add_beside(before, {"the layer's input", stream_input_, ActivationSplit::sequence,
                                Holder::caller, not_checkpointed});
        } else if (checkpoint_held_.value() > 0) {
            add_beside(before, {"a gradient the checkpoint still holds", checkpoint_held_,
                                ActivationSplit::tensor, Holder::checkpoint,
                                Beside::mode_bit(Recompute::selective)});
        }
        checkpoint_held_ = Count(0);
        push(before, {backward, op, tensor, formula, bytes, split, gradients_from, module_,
                      backward ? Text{} : uncast_from_});
    }
    /// Forward workspaces added from now on run before tensor `first` (and every later one) is
    /// cast.
    void casts_pending(Text first) { uncast_from_ = first; }
    /// The residual stream's tensors no row keeps, alive beside the forward workspaces added from
    /// now on: the layer's input, which a checkpointed layer keeps anyway, and in the MLP half the
    /// attention half's sum (or, in a parallel layer, the attention's output).
    void stream_beside(Count layer_input, Count other) {
        stream_input_ = layer_input;
        stream_other_ = other;
    }
    /// The last workspace's op has no weights (Workspace::weightless).
    void weightless() {
        if (layer_) layer_->work.back().weightless = true;
    }
    /// Under selective recomputation, a gradient alive beside the next backward op that the
    /// checkpoint still holds where elsewhere it takes its saved tensor's place.
    void held_by_checkpoint(Count bytes) { checkpoint_held_ = bytes; }
    /// The MLP half begins (StepKind::mlp_half).
    void mlp_half() {
        if (layer_) place(rows_.size(), Order::marker, StepKind::mlp_half, 0);
    }
    /// A temporary at the layer's last op, after its modules have returned (StepKind::layer_end),
    /// on the residual stream.
    void layer_end(Label op, Label tensor, Label formula, Count bytes) {
        if (!layer_) return;
        place(at_end, Order::op, StepKind::layer_end, 0);
        push(at_end,
             {false, op, tensor, formula, bytes, ActivationSplit::sequence, {}, module_, {}});
    }
    std::size_t size() const { return rows_.size(); }

    /// One saved storage of `copies` x `per_copy` elements of `shape`, which says how it divides
    /// across ranks.
    void add(Label op, Label tensor, Label why, const Shape& shape, Count per_copy,
             std::uint64_t bytes_per_element, Keep keep = Keep::always, std::uint64_t copies = 1,
             const RowFacts& facts = {}) {
        const Count elements = per_copy * copies;
        if (layer_) place(rows_.size(), Order::row, StepKind::row, rows_.size());
        rows_.push_back({op, tensor, why, shape.symbol, copies, bytes_per_element, keep, elements,
                         elements * bytes_per_element, shape.split, facts.layer_input,
                         facts.policy_saved, module_, facts.role, facts.norm_output});
    }

private:
    /// Where a step goes among those before the same row: ops, then the policy's outputs, then
    /// the MLP half's marker, then the row.
    enum class Order : std::uint8_t { op, policy, marker, row };
    struct Place {
        std::size_t before;  ///< the row it precedes
        Order order;
    };
    static constexpr std::size_t at_end = ~std::size_t{0};

    /// Inserts a step into the program after every step placed before it or with it.
    void place(std::size_t before, Order order, StepKind kind, std::size_t index) {
        const Place p{before, order};
        std::size_t k = places_.size();
        const auto after = [&](const Place& q) {
            return q.before > p.before || (q.before == p.before && q.order > p.order);
        };
        while (k > 0 && after(places_[k - 1])) --k;
        places_.insert(places_.begin() + std::ptrdiff_t(k), p);
        layer_->program.insert(layer_->program.begin() + std::ptrdiff_t(k),
                               ProgramStep{kind, std::uint32_t(index)});
    }
    void add_beside(std::size_t before, const Beside& b) {
        if (b.bytes.value() == 0) return;
        place(before, Order::op, StepKind::beside, layer_->beside.size());
        layer_->beside.push_back(b);
    }
    void push(std::size_t before, const Workspace& w) {
        place(before, Order::op, StepKind::op, layer_->work.size());
        layer_->work.push_back(w);
    }

    std::vector<SavedTensor>& rows_;
    LayerActivations* layer_;
    std::vector<Place> places_;  ///< each program step's place, to insert later ones by
    Count checkpoint_held_;      ///< held_by_checkpoint's, for the next backward op
    std::uint64_t mm_count_ = 0;
    bool every_mm_ = false;
    Module module_ = Module::none;
    Text uncast_from_;  ///< casts_pending's
    Count stream_input_, stream_other_;
};

/// The sizes a layer's tensors are made of, for sequence s and micro-batch b.
struct Sizes {
    std::uint64_t seq;  ///< s
    Count tokens;       ///< s b
    Count sbh;          ///< the residual stream
    Count sbq;          ///< queries: s b a d
    Count sbkv;         ///< keys or values: s b k d
    Count sbv;          ///< the attention's output (and values at every head): s b a d_v
    Count sbf;          ///< the MLP's hidden width
    Count scores;       ///< a s^2 b
    DType compute;      ///< the recipe's compute dtype
    std::uint64_t d;    ///< its bytes per activation
    DType
        stream;  ///< the residual stream's dtype: the compute dtype, or the weights' under autocast
    std::uint64_t s;  ///< its bytes per element
    bool autocast;    ///< each matmul saves a copy of its input cast to the compute dtype
    /// Linear layers save their inputs cast once to this narrower dtype (Transformer Engine's fp8).
    std::optional<DType> narrow;
    const KernelFacts* kernels;  ///< the platform's (kernel_rows)
    /// Bytes per element of the copy a kernel that does not cast as it reads makes of a compute-
    /// dtype operand when the other is the stream's wider dtype (autocast's fp32 mask or residual).
    std::uint64_t upcast;

    Sizes(const Architecture& m, std::uint64_t seq, std::uint64_t b, Precision p,
          Platform where = Platform::cuda)
        : seq(seq),
          tokens(Count(seq) * b),
          sbh(tokens * m.hidden),
          sbq(tokens * m.heads * m.head_size()),
          sbkv(tokens * m.key_value_heads() * m.head_size()),
          sbv(tokens * m.heads * m.value_head_size()),
          sbf(tokens * m.ffn),
          scores(Count(m.heads) * seq * seq * b),
          compute(p.compute),
          d(bytes_per_element(p.compute)),
          stream(p.stream),
          s(bytes_per_element(p.stream)),
          autocast(p.autocast),
          narrow(p.linear_inputs),
          kernels(&kernels_of(where)),
          upcast(!kernels->casts_on_read && s != d ? s : 0) {}

    /// The same sizes for a linear layer that runs in the compute dtype (a router, Megatron-LM's
    /// head).
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

/// A normalisation layer's saved tensors. `what` names it ("attention norm"). `input_kept`: its
/// input is a tensor another row already keeps (a parallel layer's second norm reads the layer
/// input too). `layer_input`: it reads the layer's input, so a saved input that is no copy is the
/// checkpoint itself. HF's RMSNorm over `elements` values of `input` bytes each, normalised in
/// `rows` rows: x.float(); x * rsqrt(mean(x^2) + eps); weight * result.to(input dtype). The upcast
/// is a new tensor unless x is fp32 already. `fp32_scale`: the weight multiplies the fp32 result
/// before the cast back (Architecture::rmsnorm_fp32_scale), which keeps it in fp32. Returns whether
/// the saved input is x itself. `fp32_input`: the saved fp32 input when it is x itself, a view of a
/// wider storage that it keeps whole.
struct SavedStorage {
    std::string what;
    Shape shape;
    Count elements;
};
/// `weighted`: false for a norm without a weight (Llama 4's L2 norm of q and k), which keeps no
/// x_norm.
inline bool rmsnorm_rows(TableBuilder& t, const std::string& what, const Shape& shape,
                         Count elements, const Shape& row_shape, Count rows,
                         const std::string& row_name, std::uint64_t input, bool fp32_scale = false,
                         const std::optional<SavedStorage>& fp32_input = std::nullopt,
                         bool weighted = true, const RowFacts& input_facts = {}) {
    if (input == dtype::fp32 && fp32_input)
        t.add(what + " (RMSNorm)", fp32_input->what, "pow(x, 2) and x * rsqrt need x",
              fp32_input->shape, fp32_input->elements, dtype::fp32, Keep::always, 1, input_facts);
    else
        t.add(what + " (RMSNorm)",
              input == dtype::fp32 ? "its input (fp32)" : "its input, upcast to fp32",
              "pow(x, 2) and x * rsqrt need x", shape, elements, dtype::fp32, Keep::always, 1,
              input == dtype::fp32 ? input_facts : RowFacts{});
    t.add(what + " (RMSNorm)", "1/rms per " + row_name + ", fp32",
          "rsqrt's gradient is written in its output", row_shape, rows, dtype::fp32);
    if (weighted &&
        !t.tuning.frozen_norms)  // autograd keeps x_norm only for a weight that gets a gradient
        t.add(what + " (RMSNorm)",
              fp32_scale ? "the normalised input, fp32" : "the normalised input",
              "the weight's gradient is x_norm x the output's gradient", shape, elements,
              fp32_scale ? dtype::fp32 : input);
    return input == dtype::fp32;
}

/// `branch_output`: a post-norm, reading a branch's output in the compute dtype, not the residual
/// stream. Returns whether a row of it, or of an earlier norm (`input_kept`), is its input itself.
inline bool norm_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                      const std::string& what, bool input_kept = false, bool layer_input = false,
                      bool branch_output = false) {
    const std::uint64_t input = branch_output ? z.d : z.s;
    if (m.norm == Norm::rmsnorm) {
        // On the residual stream, in its dtype (fp32 under autocast, where the input kept is the
        // stream itself), or on a branch's output in the compute dtype.
        // Where its saved input is x itself, that is the module's input (and maybe the layer's).
        const bool keeps_input = rmsnorm_rows(
            t, what, shape::sbh, z.sbh, shape::sb, z.tokens, "token", input, m.rmsnorm_fp32_scale,
            std::nullopt, true, RowFacts{}.input_of_layer(layer_input).input_of_module());
        return keeps_input || input_kept;
    } else {
        if (!input_kept) {
            t.add(what + " (LayerNorm)", "its input", "normalisation's gradient needs the input",
                  shape::sbh, z.sbh, input, Keep::always, 1,
                  RowFacts{}.input_of_layer(layer_input).input_of_module());
        }
        const bool fp32 = z.kernels->norm_statistics_fp32;  // else in its input's dtype
        t.add(what + " (LayerNorm)",
              std::string("mean and 1/std per token, ") +
                  (fp32 ? "fp32" : dtype_name(branch_output ? z.compute : z.stream)),
              "so backward need not recompute them", shape::sb, z.tokens,
              fp32 ? dtype::fp32 : input, Keep::always, 2);
        return true;
    }
}

/// A dropout's saved tensor: CUDA's kernel keeps a 1-byte mask; on CPU, F.dropout multiplies by a
/// noise tensor of the input's dtype (`input`: bernoulli / (1 - p)) and the product keeps that.
inline void dropout_row(TableBuilder& t, const Sizes& z, DType input, const std::string& op,
                        const Shape& shape, Count elements, Keep keep = Keep::always,
                        std::uint64_t copies = 1) {
    if (z.kernels->dropout_mask)
        t.add(op, "mask (1 byte)", "which elements were zeroed", shape, elements, dtype::mask, keep,
              copies);
    else
        t.add(op, std::string("noise (") + dtype_name(input) + ", CPU F.dropout)",
              "the gradient is multiplied by the same noise", shape, elements,
              bytes_per_element(input), keep, copies);
}

/// The output of the linear layer(s) reading a saved input: what a narrow linear's backward casts.
struct LinearOutput {
    Count elements;     ///< none: not counted (a linear that is no Transformer Engine module)
    Label symbol = "";  ///< its elements in the paper's letters: "sb(ad) + 2 sb(kd)"
    Label weight = "";  ///< the first weight whose gradient the backward writes ("q_proj")
    /// A column-parallel output divides by tp; a row-parallel one's gradient is gathered whole.
    ActivationSplit split = ActivationSplit::tensor;
    Count largest;  ///< the largest one linear's output, where several share the input; none:
                    ///< elements
    /// Made between the readers and still alive when the last one runs: a gated MLP's act(gate(x)),
    /// which transformers computes before up(x). Elements in the compute dtype.
    Count between;
};

inline constexpr Shape sbr{"sbr",
                           ActivationSplit::replicated};  ///< a LoRA adapter's r-wide intermediate

inline std::uint64_t linears_in(LinearSet set) {
    std::uint64_t n = 0;
    for (; set != 0; set &= set - 1) ++n;
    return n;
}

/// Whether each adapter casts its input (of `input_bytes`) to fp32, peft's fp32 adapters beside a
/// 16-bit model: a copy per adapter. Under autocast the input is the fp32 stream already.
inline bool adapter_upcast(const TableBuilder& t, const Sizes& z, std::uint64_t input_bytes) {
    return t.tuning.adapter_fp32 && !z.autocast && input_bytes != dtype::fp32;
}

/// An adapter's own dtype: fp32, or the model's (under autocast lora_A computes in the compute
/// dtype).
inline std::uint64_t adapter_bytes(const TableBuilder& t, const Sizes& z) {
    return t.tuning.adapter_fp32 && !z.autocast ? dtype::fp32 : z.d;
}

inline constexpr Shape sbo{"sb(out)",
                           ActivationSplit::tensor};  ///< a column-parallel linear's output
inline constexpr Shape sbo_whole{
    "sb(out)", ActivationSplit::replicated};  ///< a row-parallel one's, gathered whole
inline constexpr Shape out_vector{
    "out", ActivationSplit::replicated};  ///< a value per output row (leans high)
inline constexpr Shape weight_shape{"out x in",
                                    ActivationSplit::tensor};  ///< a copy of a linear's weight

/// Whether DoRA's forward makes a copy of the base weight in the adapter's dtype: a 4-bit base is
/// dequantised, a base of another dtype cast (peft's dequantize_module_weight(...).to(x.dtype)).
inline bool dora_weight_copied(const TableBuilder& t, const Sizes& z) {
    return t.tuning.dequantized > Count(0) || adapter_bytes(t, z) != z.d || z.autocast;
}

/// DoRA (peft's DoraLinearLayer) adds, per adapted linear among `readers`, out = m / ||W + B A|| x
/// (base output) - base output + m / ||W + B A|| x B A x x scaling, with the norm detached: the
/// products keep the base output (in the model's dtype; with a dropout peft recomputes it as
/// F.linear(dropout(x), W) in the adapter's) and B A x (the adapter's), and three vectors of out (m
/// / norm, it minus 1, the norm). With a dropout that F.linear keeps W for x's gradient: a copy
/// where W was dequantised or cast. Measured per layer on CPU (validation/results/cpu-dora.txt).
inline void dora_rows(TableBuilder& t, const Sizes& z, const std::string& op, LinearSet readers,
                      Count tokens) {
    if (!t.tuning.dora) return;
    const std::uint64_t own = adapter_bytes(t, z);
    const bool dropped = t.tuning.adapter_dropout;
    for (const LinearRow& l : linear_rows) {
        if ((readers & t.tuning.adapted & bit(l.linear)) == 0) continue;
        const AdaptedShape& w = t.tuning.shapes[static_cast<std::size_t>(l.linear)];
        const Shape& out = l.row_parallel ? sbo_whole : sbo;
        const std::string at = op + ": DoRA (" + l.tensor + ")";
        t.add(at, dropped ? "the base output, F.linear(dropout(x), W)" : "the base output",
              "the magnitude's gradient = (base output + B A x) x its output's gradient", out,
              tokens * w.out, dropped ? own : z.d);
        t.add(at, "B A x, the adapter's output", "the magnitude's gradient", out, tokens * w.out,
              own);
        t.add(at, "m / ||W + B A||, it minus 1, and the norm",
              "the products' and the division's gradients", out_vector, Count(w.out) * w.modules,
              own, Keep::always, 3);
        if (dropped && dora_weight_copied(t, z))
            t.add(at,
                  t.tuning.dequantized > Count(0) ? "the base weight, dequantised"
                                                  : "the base weight, cast",
                  "x's gradient through F.linear(dropout(x), W) = its output's gradient x W",
                  weight_shape, Count(w.out) * w.in * w.modules, own);
    }
}

/// What each LoRA adapter among `readers` keeps beside its frozen linear, as peft's Linear runs
/// base(x) + lora_B(lora_A(dropout(x.to(adapter dtype)))) * scaling over `tokens` tokens of input
/// `elements`: with a dropout its mask (or CPU noise) and, unless autocast's cast of it is counted
/// with the input, the dropped-out input that lora_A reads; undropped, an fp32 adapter's cast of x;
/// A's r-wide output, which lora_B keeps. The scaling and the sum keep nothing (measured).
inline void adapter_rows(TableBuilder& t, const Sizes& z, const std::string& op, LinearSet readers,
                         Count tokens, Count elements, const Shape& shape,
                         std::uint64_t input_bytes) {
    const std::uint64_t adapters = linears_in(readers & t.tuning.adapted);
    if (adapters == 0) return;
    const std::string each =
        adapters > 1 ? " (each of " + std::to_string(adapters) + " adapters)" : "";
    const bool upcast = adapter_upcast(t, z, input_bytes);
    const std::uint64_t own = adapter_bytes(t, z);
    if (t.tuning.adapter_dropout) {
        const DType input = upcast || input_bytes == dtype::fp32 ? DType::fp32 : z.compute;
        dropout_row(t, z, input, op + ": LoRA dropout" + each, shape, elements, Keep::always,
                    adapters);
        if (!z.autocast)
            t.add(op + ": LoRA A", "its input, the dropped-out input" + each,
                  "A's gradient = input^T x its output's gradient", shape, elements,
                  upcast ? dtype::fp32 : input_bytes, Keep::always, adapters);
    } else if (upcast) {
        t.add(op + ": LoRA A", "its input, cast to fp32 for the fp32 adapter" + each,
              "A's gradient = input^T x its output's gradient", shape, elements, dtype::fp32,
              Keep::always, adapters);
    }
    t.add(op + ": LoRA B", "its input, A's r-wide output" + each,
          "B's gradient = input^T x its output's gradient", sbr, tokens * t.tuning.rank, own,
          Keep::always, adapters);
    dora_rows(t, z, op, readers, tokens);
}

/// The forward of frozen linears whose input no row keeps: that input is alive while they run,
/// beside their outputs and what is made between them (a gated MLP's activation:
/// LinearOutput::between) and, beside the MLP, the residual stream the layer adds them to
/// (`stream`); an adapter's lora_B output scaled and its sum with the base output follow, in the
/// adapter's dtype (an fp32 adapter's sum is promoted to fp32; on CPU the add first copies the
/// narrower operand to that dtype, as it does the scores before the mask: Sizes::upcast). Counted
/// at the last reader, with every output made: leaning high where only an earlier one is adapted.
/// Measured: the whole step under full recomputation peaks here when nothing is saved
/// (validation/results/cpu-lora-step.json).
inline void frozen_linear_work(TableBuilder& t, const Sizes& z, const std::string& op,
                               Count input_alive, const LinearOutput& out, LinearSet readers,
                               Count stream = {}) {
    if (out.elements == Count(0)) return;  // a linear whose outputs are not tabled: not counted
    const bool adapted = (readers & t.tuning.adapted) != 0;
    const std::uint64_t own = adapter_bytes(t, z), sum = std::max(own, z.d);
    const std::uint64_t copy = !z.kernels->casts_on_read && own != z.d ? sum : 0;
    const Count largest = out.largest > Count(0) ? out.largest : out.elements;
    const Count bytes = input_alive + stream + (out.elements + out.between) * z.d +
                        (adapted ? largest * (own + copy + sum) : Count(0));
    const std::string copied = copy ? ", its CPU copy of the base output" : "";
    t.workspace(false, op + " (frozen)",
                adapted
                    ? "its input and outputs, an adapter's scaled output" + copied + " and the sum"
                    : "its input and outputs",
                adapted ? std::string("input + outputs + (scaled + ") + (copy ? "copy + " : "") +
                              "sum) x the largest"
                        : "input + outputs",
                bytes);
}

/// torch's non-reentrant checkpoint reruns a layer's forward when its backward first reads a saved
/// tensor; the ops before that read have run. An adapter beside the layer's last linear, whose
/// output goes straight to the residual add, is reached through ops that save nothing (the cast
/// back to the base's dtype, the sum, the scaling): the scaled output's gradient in the adapter's
/// dtype, and for an adapter of another dtype the base output's gradient cast back, are alive while
/// the forward reruns. `elements`: that linear's output.
inline Count rerun_gradients(const TableBuilder& t, const Sizes& z, Count elements) {
    const std::uint64_t own = adapter_bytes(t, z);
    return elements * (own + (own != z.d ? z.d : 0));
}

/// What follows the linears of `readers` under fine-tuning: their adapters' rows, then, where every
/// reader is frozen, their forward's workspace with those rows made (the input alive unless
/// `input_kept`). In backward, an adapted linear's input gradient is summed from the base linears'
/// and the adapters', once the adapters' rows and a kept input (the last row, when `input_kept`)
/// are freed and the gradients of the linears' adapters and every later tensor written. An
/// adapter's path runs first (autograd takes the latest made): lora_A's input gradient, in its
/// input's dtype (an fp32 adapter's cast of x), with the dropout's, or with its cast back; where
/// several linears read the input, beside the sum so far. Then each sum holds the sum so far, the
/// next gradient and their sum.
inline void after_linears(TableBuilder& t, const Sizes& z, const std::string& op, LinearSet readers,
                          Count tokens, Count elements, const Shape& shape,
                          std::uint64_t input_bytes, bool input_kept,
                          const LinearOutput& output = {}, Count stream = {}) {
    if (linears_in(readers & t.tuning.adapted) > 0) {
        const std::uint64_t in = input_bytes, own = adapter_upcast(t, z, in) ? dtype::fp32 : in;
        const std::uint64_t path = t.tuning.adapter_dropout ? 2 * own : own + (own != in ? in : 0);
        const std::uint64_t bytes = std::max(3 * in, path + (linears_in(readers) > 1 ? in : 0));
        t.workspace_at(
            input_kept ? t.size() - 1 : t.size(), true, op + " backward (LoRA)",
            "its input's gradient: an adapter's path, or the sum so far, the next and their sum",
            bytes_of(bytes, std::string(Text(shape.symbol))), elements * bytes, output.weight,
            shape.split);
    }
    adapter_rows(t, z, op, readers, tokens, elements, shape, input_bytes);
    if ((readers & ~t.tuning.frozen) == 0 && t.tuning.any())
        frozen_linear_work(t, z, op, input_kept ? Count(0) : elements * input_bytes, output,
                           readers, stream);
}

/// A linear input in the compute dtype (the attention's output, the down projection's): kept while
/// a reader's weight gets a gradient, or while an adapter reads it undropped; then what follows the
/// linears.
inline void linear_input_row(TableBuilder& t, const Sizes& z, const std::string& op,
                             const std::string& what, const Shape& shape, Count tokens,
                             Count elements, LinearSet readers, const LinearOutput& output = {},
                             Count stream = {}) {
    const bool trained = (readers & ~t.tuning.frozen) != 0;
    const bool kept = trained || ((readers & t.tuning.adapted) != 0 && !t.tuning.adapter_dropout &&
                                  !adapter_upcast(t, z, z.d));
    if (kept)
        t.add(op, trained ? what : what + " (LoRA A's input)",
              "weight gradient = input^T x output gradient", shape, elements, z.d);
    after_linears(t, z, op, readers, tokens, elements, shape, z.d, kept, output, stream);
}

/// What the projections reading a stream tensor keep: that tensor, or under autocast a copy of it
/// cast to the compute dtype by each of the `projections` (autocast caches only the weights'
/// casts). Separate projections are counted, as transformers writes LLaMA's: a fused one casts once
/// (leans high). Narrow (fp8) linears save one cast, as Megatron-LM's fused QKV and gate/up layers
/// make it, and the tensor itself is not kept (Transformer Engine's LayerNormLinear writes its
/// norm's output in fp8); their backward casts the output's gradient to fp8 and transposes it for
/// the two GEMMs (TE 1.x's fp8_cast_transpose_fused), a temporary of 2 narrow bytes per output
/// element while it runs. `readers`: the linears reading the tensor, for fine-tuning: a frozen one
/// keeps no input (autograd saves it for the weight's gradient alone), and under autocast each
/// adapter's lora_A casts it again; 0 where every reader trains. Returns whether the row is the
/// tensor itself (or its casts): none is kept when every reader is frozen and no adapter reads it
/// undropped. The adapters' own rows follow from adapter_rows.
inline bool projection_input_row(TableBuilder& t, const Sizes& z, const std::string& op,
                                 const std::string& what, Count elements, const Shape& shape,
                                 std::uint64_t projections, const LinearOutput& output = {},
                                 LinearSet readers = 0, const RowFacts& facts = {}) {
    if (readers != 0 && t.tuning.any()) {
        const std::uint64_t trained = linears_in(readers & ~t.tuning.frozen),
                            adapters = linears_in(readers & t.tuning.adapted);
        if (trained == 0) {
            if (z.narrow) return false;  // a frozen narrow linear saves no cast of its input
            const bool undropped_reads_x =
                adapters > 0 && !t.tuning.adapter_dropout && !adapter_upcast(t, z, z.s);
            const std::uint64_t copies = z.autocast ? adapters : (undropped_reads_x ? 1 : 0);
            if (copies > 0)
                t.add(op,
                      z.autocast ? what + ", cast to " + dtype_name(z.compute) +
                                       " by each LoRA A (autocast)"
                                 : what + " (LoRA A's input)",
                      "A's gradient = input^T x its output's gradient", shape, elements, z.d,
                      Keep::always, copies, facts);
            return copies > 0;
        }
        projections = std::min(projections, trained) + (z.autocast ? adapters : 0);
    }
    if (z.narrow) {
        t.add(op, what + ", cast once to " + dtype_name(*z.narrow),
              "weight gradient = input^T x output gradient", shape, elements,
              bytes_per_element(*z.narrow), Keep::always, 1, facts);
        const std::uint64_t cast = 2 * bytes_per_element(*z.narrow);
        if (output.elements > Count(0))
            t.workspace_at(t.size(), true, op + " backward",
                           std::string("its output's gradient cast to ") + dtype_name(*z.narrow) +
                               " and transposed",
                           bytes_of(cast, std::string(Text(output.symbol))), output.elements * cast,
                           output.weight, output.split);
        return true;
    }
    if (!z.autocast) {
        t.add(op, what, "weight gradient = input^T x output gradient", shape, elements, z.d,
              Keep::always, 1, facts);
        return true;
    }
    t.add(op,
          what + ", cast to " + dtype_name(z.compute) + " by each of " +
              std::to_string(projections) + " (autocast)",
          "weight gradient = input^T x output gradient", shape, elements, z.d, Keep::always,
          projections, facts);
    return true;
}

/// The linear layers that read the MLP's input: gate and up, or up alone.
inline std::uint64_t mlp_input_projections(const Architecture& m) {
    return m.mlp == Mlp::gated ? 2 : 1;
}
inline LinearSet mlp_input_readers(const Architecture& m, bool shared = false) {
    return bit(shared ? Linear::shared_up : Linear::up) |
           (m.mlp == Mlp::gated ? bit(shared ? Linear::shared_gate : Linear::gate) : 0);
}

/// Their outputs, `sbf` elements each, of `shape`: the first weight they write a gradient to.
inline LinearOutput mlp_input_output(const Architecture& m, Count sbf, const Shape& shape) {
    const std::uint64_t n = mlp_input_projections(m);
    // act(gate(x)) is made before up(x) runs.
    return {sbf * n,
            n == 1 ? std::string(Text(shape.symbol))
                   : std::to_string(n) + " " + std::string(Text(shape.symbol)),
            n == 1 ? "up_proj" : "gate_proj",
            ActivationSplit::tensor,
            sbf,
            n == 1 ? Count(0) : sbf};
}

/// Whether the layer scales its queries by a per-position temperature (Llama 4's NoPE layers).
inline bool temperature_tuned(const Architecture& m) {
    return m.attention_temperature && m.position == Position::none;
}

inline constexpr Shape per_position{
    "s", ActivationSplit::replicated};  ///< a value per position, any batch

/// Llama 4's attn_temperature_tuning: q times log1p(floor((position + 1) / floor_scale)) x
/// attn_scale + 1, scales of (1, s, 1, 1) in fp32 expanded over the batch, which the product keeps
/// (its fp32 result is cast back: a new q of the same size, which the q row counts).
inline void temperature_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (!temperature_tuned(m)) return;
    t.add("attention temperature (q x scales)", "the per-position scales, fp32",
          "q's gradient is scaled by them", per_position, Count(z.seq), dtype::fp32);
}

/// q, k and v as the attention products keep them. With fewer key/value heads than query heads,
/// eager attention repeats k and v to every head (a copy); selective recomputation's checkpoint
/// keeps the un-repeated k and v instead.
/// The op-level policy's q, k and v projection outputs: a row where the attention saves that very
/// storage (no rotary, no repeat, and the fused kernel's input or, at micro-batch 1, a view matmul
/// keeps), else an output of its own; eager attention's matmul copies a transposed operand when b
/// > 1.
inline void qkv_rows(TableBuilder& t, const Architecture& m, const Sizes& z, Attention attention) {
    const bool rotary = m.position == Position::rotary;
    // q and k are no longer the projections' outputs (the temperature makes a new q; k stays
    // counted as changed).
    const bool changed = rotary || m.qk_norm != QkNorm::none || temperature_tuned(m);
    const bool repeated = attention == Attention::eager && m.key_value_heads() < m.heads;
    const bool qkv_bias = m.bias != Bias::none;
    const bool saved[3] = {t.linear_saved(qkv_bias), t.linear_saved(qkv_bias),
                           t.linear_saved(qkv_bias)};
    const bool viewed = attention == Attention::flash || z.tokens == Count(z.seq);
    const bool shared[3] = {!changed && viewed, !changed && !repeated && viewed,
                            !repeated && viewed};
    const char* names[3] = {"q projection", "k projection", "v projection"};
    for (int i = 0; i < 3; ++i)
        t.policy_output(saved[i] && !shared[i], names[i], "its output",
                        i == 0 ? shape::sbq : shape::sbkv, i == 0 ? z.sbq : z.sbkv, z.d);
    t.add("Q K^T", rotary ? "q after rotary" : "q",
          "the gradient w.r.t. k is q x the scores' gradient", shape::sbq, z.sbq, z.d, Keep::always,
          1, RowFacts{}.saved_by_policy(saved[0] && shared[0]));
    for (int i : {1, 2}) {
        const bool key = i == 1;
        const std::string what =
            std::string(key ? "k" : "v") + (rotary && key ? " after rotary" : "");
        const std::string op = key ? "Q K^T" : "attention over V";
        const std::string why =
            key ? "the gradient w.r.t. q is the scores' gradient x k"
                : "the gradient w.r.t. the weights is the output's gradient x v";
        if (repeated) {
            t.add(op, what + ", repeated to every query head", why, shape::sbq, z.sbq, z.d,
                  Keep::not_selective);
            t.add("selective checkpoint", what + " (k heads), an input of the core attention",
                  "the checkpoint reruns the core attention from it", shape::sbkv, z.sbkv, z.d,
                  Keep::only_selective);
        } else {
            t.add(op, what, why, shape::sbkv, z.sbkv, z.d, Keep::always, 1,
                  RowFacts{}.saved_by_policy(saved[i] && shared[i]));
        }
    }
}

/// q_norm and k_norm, before rotary: an RMSNorm of each head's projection output (Qwen3's, Gemma
/// 3's), or of the whole projection output, one 1/rms per token (OLMo 2's). Llama 4's L2 norm comes
/// after rotary, weightless: x.float() (a copy), x * rsqrt(mean(x^2) + eps), cast back; its fp32
/// copy and the 1/rms per head and token are kept.
inline void qk_norm_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const bool fp32 = m.rmsnorm_fp32_scale;
    if (m.qk_norm == QkNorm::l2) {
        rmsnorm_rows(t, "q L2 norm", shape::sbq, z.sbq, shape::asb, z.tokens * m.heads,
                     "query head and token", z.d, false, std::nullopt, false);
        rmsnorm_rows(t, "k L2 norm", shape::sbkv, z.sbkv, shape::ksb,
                     z.tokens * m.key_value_heads(), "key head and token", z.d, false, std::nullopt,
                     false);
    } else if (m.qk_norm == QkNorm::per_head) {
        rmsnorm_rows(t, "q_norm", shape::sbq, z.sbq, shape::asb, z.tokens * m.heads,
                     "query head and token", z.d, fp32);
        rmsnorm_rows(t, "k_norm", shape::sbkv, z.sbkv, shape::ksb, z.tokens * m.key_value_heads(),
                     "key head and token", z.d, fp32);
    } else if (m.qk_norm == QkNorm::whole) {
        rmsnorm_rows(t, "q_norm (whole width)", shape::sbq, z.sbq, shape::sb, z.tokens, "token",
                     z.d, fp32);
        rmsnorm_rows(t, "k_norm (whole width)", shape::sbkv, z.sbkv, shape::sb, z.tokens, "token",
                     z.d, fp32);
    }
}

/// The cos and sin a layer's own rotary embedding makes (rotary_embeddings' per-layer rows): of
/// (1, s, head_dim) whatever the batch (position_ids is (1, s)), in v's dtype, the compute dtype; q
/// * cos and rotate_half(q) * sin save them, and k's products the same two. Outside selective
/// recomputation's checkpoint, so only full recomputation drops them.
inline void rotary_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.position != Position::rotary || !rotary_embedding(m.rotary_embedding).per_layer_tables)
        return;
    t.add("rotary embedding (this layer's)", "cos and sin for the sequence's positions",
          "q and k were multiplied by them", shape::sd, Count(z.seq) * m.rotary_dim(), z.d,
          Keep::always, 2);
}

/// Latent attention's shapes (r_q, r_kv: the latents; d_n, d_r, d_v: the nope, rotary and v widths
/// per head). Megatron-LM's down projections are whole on every tensor-parallel rank, and so are
/// the latents they make (gathered across the sequence under sequence parallelism).
namespace latent_shape {
inline constexpr Shape sbrq{"sb(r_q)", ActivationSplit::replicated};    ///< the query latent
inline constexpr Shape sbrkv{"sb(r_kv)", ActivationSplit::replicated};  ///< the key/value latent
inline constexpr Shape sbrkvr{"sb(r_kv+d_r)",
                              ActivationSplit::replicated};  ///< the latent beside k's rotary part
inline constexpr Shape sb{"sb", ActivationSplit::replicated};  ///< a value per token of a latent
inline constexpr Shape sbqk{"sb(a(d_n+d_r))", ActivationSplit::tensor};  ///< q or k at every head
inline constexpr Shape sbkvb{"sb(a(d_n+d_v))",
                             ActivationSplit::tensor};  ///< kv_b_proj's output: k's nope part and v
inline constexpr Shape sbv{"sb(a d_v)", ActivationSplit::tensor};  ///< v, or the attention's output
}  // namespace latent_shape

/// Latent attention as transformers' DeepseekV3Attention (and V2's) runs it:
/// q_b_proj(q_a_layernorm( q_a_proj(x))) or q_proj(x); kv_a_proj_with_mqa(x) split into the latent
/// and k's rotary part; kv_b_proj( kv_a_layernorm(latent)) split into k's nope part and v; rotary
/// on q's and k's rope parts (q * cos saves cos alone: a shared table); q and k concatenated from
/// their parts, k's rope part expanded to every head. The kernel saves q, k and v: eager matmul
/// keeps a view of v, and so kv_b_proj's whole output, unless b > 1 makes it copy v;
/// flash_attention_2 pads v to q's width with F.pad (a new tensor) when d_v != d_n + d_r.
/// Megatron-LM's mla_up_proj recomputation drops the up projections' outputs (q, k, v: the rows
/// that say so) and keeps their inputs.
inline void latent_attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                                  Attention attention) {
    namespace ls = latent_shape;
    const LatentAttention& a = m.mla;
    const bool biased = m.bias == Bias::attention, q_latent = a.q_lora_rank > 0,
               eager = attention == Attention::eager;
    const Count latent_q = z.tokens * a.q_lora_rank, latent_kv = z.tokens * a.kv_lora_rank;
    const Count latent_and_rope = z.tokens * (a.kv_lora_rank + a.qk_rope_head_dim);
    const Count kv_b_out = z.tokens * m.heads * (a.qk_nope_head_dim + a.v_head_dim);
    const std::string dropped = "; Megatron's mla_up_proj recomputation drops it";
    // The op-level policy counts the mms in forward order: q_a_proj or q_proj, q_b_proj,
    // kv_a_proj_with_mqa, kv_b_proj. Its outputs count as extra even where a norm keeps that very
    // storage (fp32): leaning high.
    const std::string first =
        q_latent ? "q_a_proj and kv_a_proj_with_mqa" : "q_proj and kv_a_proj_with_mqa";
    const LinearSet first_readers = bit(q_latent ? Linear::q_a : Linear::q) | bit(Linear::kv_a);
    projection_input_row(t, z, first, "their input", z.sbh, shape::sbh, 2, {}, first_readers,
                         RowFacts{}.output_of_norm(!z.autocast && !z.narrow));
    adapter_rows(t, z, first, first_readers, z.tokens, z.sbh, shape::sbh, z.s);
    if (q_latent) {
        t.policy_output(t.linear_saved(biased), "q_a_proj", "its output", ls::sbrq, latent_q, z.d);
        rmsnorm_rows(t, "q_a_layernorm", ls::sbrq, latent_q, ls::sb, z.tokens, "token", z.d,
                     m.rmsnorm_fp32_scale);
        projection_input_row(t, z, "q_b_proj", "its input (the normalised query latent)", latent_q,
                             ls::sbrq, 1, {}, bit(Linear::q_b));
        adapter_rows(t, z, "q_b_proj", bit(Linear::q_b), z.tokens, latent_q, ls::sbrq, z.d);
    }
    t.policy_output(t.linear_saved(false), q_latent ? "q_b_proj" : "q_proj", "its output", ls::sbqk,
                    z.sbq, z.d);
    t.policy_output(t.linear_saved(biased), "kv_a_proj_with_mqa", "its output", ls::sbrkvr,
                    latent_and_rope, z.d);
    // The latent is a slice of kv_a_proj_with_mqa's output: in fp32, x.to(float32) is that view
    // itself.
    rmsnorm_rows(t, "kv_a_layernorm", ls::sbrkv, latent_kv, ls::sb, z.tokens, "token", z.d,
                 m.rmsnorm_fp32_scale,
                 SavedStorage{"kv_a_proj_with_mqa's output, which its input views (fp32)",
                              ls::sbrkvr, latent_and_rope});
    projection_input_row(t, z, "kv_b_proj", "its input (the normalised key/value latent)",
                         latent_kv, ls::sbrkv, 1, {}, bit(Linear::kv_b));
    adapter_rows(t, z, "kv_b_proj", bit(Linear::kv_b), z.tokens, latent_kv, ls::sbrkv, z.d);
    const bool kv_b_saved = t.linear_saved(false);
    rotary_rows(t, m, z);

    const bool padded = !eager && a.v_head_dim != m.head_size();
    const bool viewed =
        !eager || z.tokens == Count(z.seq);  // as qkv_rows: matmul copies a strided v when b > 1
    // Megatron-LM's mla_up_proj: the up projections and rotary rerun from the normalised latents
    // (their rows above) and k's rope part before rotary, a view that keeps kv_a_proj_with_mqa's
    // whole output (which in fp32 the latent's norm keeps already).
    t.section(Module::mla_up_proj);
    if (z.d != dtype::fp32)
        t.checkpoint_input(
            "k's rope part before rotary: kv_a_proj_with_mqa's output, which it views", ls::sbrkvr,
            latent_and_rope, z.d);
    const std::string kernel = eager ? "attention over V" : "flash attention";
    const std::string v_why = eager ? "the gradient w.r.t. the weights is the output's gradient x v"
                                    : "the kernel's backward reads v";
    if (padded) {
        t.policy_output(kv_b_saved, "kv_b_proj", "its output", ls::sbkvb, kv_b_out, z.d);
    } else {
        t.add(kernel, "kv_b_proj's output (k's nope part and v), which v views", v_why + dropped,
              ls::sbkvb, kv_b_out, z.d, viewed ? Keep::always : Keep::only_selective, 1,
              RowFacts{}.saved_by_policy(kv_b_saved));
        if (!viewed) {  // matmul's copy, inside the core attention
            const Module up = t.section(Module::attention);
            t.add(kernel, "v, copied contiguous by matmul", v_why, ls::sbv, z.sbv, z.d,
                  Keep::not_selective);
            t.section(up);
        }
    }
    const std::string qk_op = eager ? "Q K^T" : "flash attention";
    t.add(qk_op, "q: its nope part and its rotated rope part, concatenated",
          "the gradient w.r.t. k is q x the scores' gradient" + dropped, ls::sbqk, z.sbq, z.d);
    t.add(qk_op,
          "k: kv_b_proj's nope part and the rotated rope part expanded to every head, concatenated",
          "the gradient w.r.t. q is the scores' gradient x k" + dropped, ls::sbqk, z.sbq, z.d);
    if (padded)
        t.add(kernel, "v, padded to q's head width (F.pad)", v_why + dropped, ls::sbqk, z.sbq, z.d);
    t.section(Module::attention);
}

/// The output projection's output: row-parallel, so its gradient is the whole residual stream's.
inline LinearOutput output_projection(const Sizes& z) {
    return {z.sbh, "sbh", "o_proj", ActivationSplit::replicated, {}, {}};
}

/// A Mamba layer's mixer (ssm_activations.hpp) in place of attention: in_proj keeps its input, the
/// norm's output, as q/k/v do. Autocast, narrow linears and fine-tuning of its tensors are not
/// modelled.
inline void mamba_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                       std::uint64_t micro_batch) {
    if (z.autocast || z.narrow)
        throw error(
            "Mamba layers under autocast or fp8 linears are not modelled (a bf16 or fp32 recipe "
            "is)");
    if (t.tuning.any())
        throw error(
            "fine-tuning (frozen parts or LoRA) of a model with Mamba layers is not modelled");
    const LinearOutput in_out{z.tokens * (2 * m.ssm.d_inner), "sb(2d_i)", "in_proj",
                              ActivationSplit::tensor,        {},         {}};
    projection_input_row(t, z, "in_proj", "its input", z.sbh, shape::sbh, 1, in_out, 0,
                         RowFacts{}.output_of_norm().input_of_layer(!m.norms_before_branches()));
    const auto add = [&](Label op, Label tensor, Label why, const Shape& shape, Count elements,
                         std::uint64_t bytes, Keep keep = Keep::always, std::uint64_t copies = 1) {
        t.add(op, tensor, why, shape, elements, bytes, keep, copies);
    };
    const auto work = [&](bool backward, Label op, Label tensor, Label formula, Count bytes) {
        t.workspace(backward, op, tensor, formula, bytes);
    };
    mamba_mixer_rows(m, z.seq, micro_batch, z.d, false, add, work);
}

inline void attention_rows(TableBuilder& t, const Architecture& m, const Sizes& z,
                           Attention attention) {
    if (m.mla.enabled()) {
        latent_attention_rows(t, m, z, attention);
    } else {
        constexpr LinearSet qkv = bit(Linear::q) | bit(Linear::k) | bit(Linear::v);
        const bool shared =
            m.parallel_attention && m.norms_per_layer == 1 && !z.autocast && !z.narrow;
        const LinearSet mlp =
            m.is_moe() ? bit(Linear::router) : mlp_input_readers(m);  // reading it too
        const LinearOutput qkv_out{
            z.sbq + z.sbkv * 2, "sb(ad) + 2 sb(kd)", "q_proj", ActivationSplit::tensor, z.sbq, {}};
        // Without a norm before attention (OLMo 2) the projections read the layer's input itself.
        const bool itself = !z.autocast && !z.narrow;
        const bool kept = projection_input_row(
            t, z, "q/k/v projections", shared ? "their input, shared with the MLP" : "their input",
            z.sbh, shape::sbh, 3, qkv_out, shared ? qkv | mlp : qkv,
            RowFacts{}.output_of_norm(itself).input_of_layer(itself && !m.norms_before_branches()));
        after_linears(t, z, "q/k/v projections", qkv, z.tokens, z.sbh, shape::sbh, z.s, kept,
                      qkv_out);
        qk_norm_rows(t, m, z);
        rotary_rows(t, m, z);
        temperature_rows(t, m, z);
        qkv_rows(t, m, z, attention);
    }
    // Korthikanti's selective checkpoint: its rows are those Keep marks, its input q, k and v
    // above.
    t.section(Module::core_attn);
    const Shape& output =
        m.mla.enabled() ? latent_shape::sbv : shape::sbq;  // of a d_v wide per head
    if (attention == Attention::flash) {
        // A fused kernel never stores the s x s scores: it keeps its output and a log-sum-exp per
        // row and recomputes the scores block by block in backward. Both are the kernel's outputs,
        // which the op-level policy saves (the SDPA kernels are on its list).
        t.add("flash attention", "log-sum-exp per query row, fp32",
              "backward rebuilds the softmax from it", shape::asb, Count(m.heads) * z.tokens,
              dtype::fp32, Keep::not_selective, 1, RowFacts{}.saved_by_policy());
        // v padded to q's width (latent attention) makes an output as wide: the output projection
        // reads a copy of its unpadded slice, and the padded output is the kernel's alone.
        const bool padded = m.value_head_size() != m.head_size();
        if (padded) {
            t.add("flash attention", "its output, padded to q's head width",
                  "backward needs the output for the softmax "
                  "gradient",
                  latent_shape::sbqk, z.sbq, z.d, Keep::not_selective, 1,
                  RowFacts{}.saved_by_policy());
            projection_input_row(t, z, "output projection",
                                 "its input (the output's unpadded slice, copied)", z.sbv, output,
                                 1, output_projection(z), bit(Linear::o));
            adapter_rows(t, z, "output projection", bit(Linear::o), z.tokens, z.sbv, output, z.d);
        } else {
            t.add("flash attention",
                  z.narrow ? "its output" : "its output (also the output projection's input)",
                  "backward needs the output for the softmax gradient", output, z.sbv, z.d,
                  Keep::always, 1, RowFacts{}.saved_by_policy());
            if (z.narrow)  // beside the kernel's own copy
                projection_input_row(t, z, "output projection", "its input", z.sbv, output, 1,
                                     output_projection(z), bit(Linear::o));
            adapter_rows(t, z, "output projection", bit(Linear::o), z.tokens, z.sbv, output, z.d);
        }
        // FlashAttention-2's backward: dq accumulated in fp32, dq, dk, dv, and a row sum per query.
        const Count work = z.sbq * (dtype::fp32 + z.d) + Count(2 * z.d) * z.sbkv +
                           Count(m.heads) * z.tokens * dtype::fp32;
        t.workspace(true, "flash attention backward",
                    "dq (fp32 accumulator and result), dk, dv, row sums",
                    bytes_of(dtype::fp32 + z.d, "sb(ad)") + " + " + bytes_of(2 * z.d, "sb(kd)") +
                        " + 4 asb",
                    work, "o_proj");
        t.weightless();
        return;
    }
    const bool dropout = m.attention_dropout > 0;
    if (m.causal_mask_buffer == CausalMaskBuffer::per_layer) {
        // nanoGPT: masked_fill(bias[:, :, :s, :s] == 0, -inf) keeps the comparison's new s x s bool
        // tensor for backward (measured: validation/results/cpu-buffers.json); the scores stay in
        // the compute dtype, the scaled ones and the filled ones at once.
        t.add("masked_fill (registered mask)", "bias == 0 (bool), broadcast over batch and heads",
              "the gradient is zeroed where the mask was filled", shape::ss, Count(z.seq) * z.seq,
              dtype::mask, Keep::not_selective);
        t.workspace(false, "Q K^T / sqrt(d), masked_fill", "the scaled scores and the filled ones",
                    bytes_of(2 * z.d, "as^2b"), Count(2 * z.d) * z.scores);
    } else {
        // Q K^T, then / sqrt(d) and + mask, each out of place: two s x s score tensors at once,
        // before softmax makes the first saved one. The mask has the stream's dtype, which the sum
        // takes (on CPU through an upcast copy of the scores).
        const std::uint64_t scores = z.d + std::max(z.d, z.s + z.upcast);
        t.workspace(false, "Q K^T / sqrt(d) + mask",
                    z.upcast
                        ? "the scaled scores, and their upcast copy and their sum with the mask"
                        : "the scaled scores, and the scores or their sum with the mask",
                    bytes_of(scores, "as^2b"), Count(scores) * z.scores);
    }
    // Attention sinks (gpt-oss): a column of per-head logits joins the scores, the row's max is
    // taken off (max keeps its indices), the softmax runs over s + 1 columns and the sink's column
    // is dropped by a view, so the softmax's output is the storage the product with V keeps.
    const Count softmax_elements =
        z.scores + (m.attention_sinks ? Count(m.heads) * z.tokens : Count(0));
    if (m.attention_sinks)
        t.add("scores - max (sinks)", "the row maxima's indices (int64)",
              "max's gradient goes to the maximum", shape::asb, Count(m.heads) * z.tokens, 8,
              Keep::not_selective);
    const std::size_t softmax_row = t.size();
    // An fp32 sum (autocast's) softmaxes to fp32, as does CUDA autocast's softmax on any input.
    const bool softmax_fp32 = m.softmax_fp32 || z.autocast;
    if (softmax_fp32) {
        t.add("softmax",
              m.attention_sinks ? "its output over s + 1 columns, fp32" : "its output, fp32",
              "softmax's gradient is written in its output", shape::scores, softmax_elements,
              dtype::fp32, Keep::not_selective);
        if (!dropout)
            t.add("attention over V",
                  std::string("the weights, cast back to ") + dtype_name(z.compute),
                  "the gradient w.r.t. v is weights^T x the output's gradient", shape::scores,
                  z.scores, z.d, Keep::not_selective);
    } else {
        t.add("softmax",
              std::string(dropout ? "its output" : "its output (also the weights over V)") +
                  (m.attention_sinks ? ", s + 1 columns" : ""),
              "softmax's gradient is written in its output", shape::scores, softmax_elements, z.d,
              Keep::not_selective);
    }
    if (dropout) {
        // Its forward holds its input, the noise (CPU) or mask it draws and its output at once:
        // under recomputation, which keeps none of them, the core attention's largest moment
        // (measured, peak_live.py: GPT-2 with dropout, full recomputation, forward 1 peaks at
        // F.dropout's product).
        const std::uint64_t drawn = z.kernels->dropout_mask ? dtype::mask : z.d;
        t.workspace(
            false, "attention dropout",
            z.kernels->dropout_mask ? "its mask and its output" : "its noise and its output",
            bytes_of(drawn + z.d, "as^2b"), Count(drawn + z.d) * z.scores);
        dropout_row(t, z, z.compute, "attention dropout", shape::scores, z.scores,
                    Keep::not_selective);
        t.add("attention over V", "the dropped-out weights",
              "the gradient w.r.t. v is weights^T x the output's gradient", shape::scores, z.scores,
              z.d, Keep::not_selective);
    }
    // The product with V's backward, the core attention's first: the weights' gradient and v's
    // beside the attention output's gradient (its incoming one), the output projection's input and
    // all after it freed. A CPU kernel also copies two strided operands contiguous (measured:
    // torch 1.13's BmmBackward0 on CPU).
    const std::uint64_t over_v = (2 + z.kernels->bmm_backward_copies) * z.d;
    t.workspace_at(t.size(), true, "attention over V backward",
                   z.kernels->bmm_backward_copies > 0
                       ? "the weights' gradient, the output's and v's, two contiguous copies"
                       : "the weights' gradient, the output's and v's",
                   bytes_of(z.d, "as^2b") + " + " + bytes_of(over_v, "sb(a d_v)"),
                   Count(z.d) * z.scores + Count(over_v) * z.sbv, "o_proj");
    t.weightless();
    if (z.narrow)
        projection_input_row(t, z, "output projection", "its input", z.sbv, output, 1,
                             output_projection(z), bit(Linear::o));
    else
        linear_input_row(t, z, "output projection", "its input", output, z.tokens, z.sbv,
                         bit(Linear::o), output_projection(z));

    // Softmax's input lives beside its output; its backward holds the gradients of both. Upcasting
    // on the fly is CUDA's: the CPU kernel softmaxes an fp32 copy and returns an fp32 gradient.
    const std::uint64_t out = softmax_fp32 ? dtype::fp32 : z.d;
    const bool copy = softmax_fp32 && !z.kernels->softmax_upcasts_on_read && z.s != dtype::fp32;
    const std::uint64_t forward = z.s + (copy ? dtype::fp32 : 0),
                        backward = out + (copy ? dtype::fp32 : z.s);
    t.workspace_at(softmax_row + 1, false, "softmax",
                   copy ? "its input and its fp32 copy" : "its input", bytes_of(forward, "as^2b"),
                   Count(forward) * softmax_elements);
    // The product with V's backward has made v's gradient before the softmax's runs, and freed v,
    // which it alone saved; selective recomputation's checkpoint holds an unrepeated v still
    // (measured: cpu-rotary-wide512).
    if (m.key_value_heads() == m.heads) t.held_by_checkpoint(z.sbv * z.d);
    t.workspace_at(softmax_row + 1, true, "softmax backward",
                   "the gradients of its output and its input", bytes_of(backward, "as^2b"),
                   Count(backward) * softmax_elements, "o_proj");
    t.weightless();
}

/// The tensors the MLP's activation function keeps (its row in activation_functions.hpp), read from
/// `input`, the projection it follows; `input_saved`: the op-level policy saves that projection's
/// output.
inline void activation_rows(TableBuilder& t, const ActivationFunction& fn, const Shape& shape,
                            Count sbf, const std::string& prefix, const std::string& input,
                            std::uint64_t d, bool input_saved) {
    for (std::size_t i = 0; i < fn.kept_count(); ++i) {
        const ActivationTensor& kept = fn.kept[i];
        const std::string op =
            prefix + std::string(fn.label) + (kept.op.empty() ? "" : ": " + std::string(kept.op));
        const std::string tensor(kept.tensor);
        const bool is_input = kept.input;
        // The input of moe_act's checkpoint is its input.
        t.add(op, is_input ? tensor + " (" + input + ")" : tensor, std::string(kept.why), shape,
              sbf, d, Keep::always, 1,
              RowFacts{}
                  .saved_by_policy(is_input && input_saved)
                  .input_of_module(is_input && t.current_section() == Module::moe_act));
    }
}

/// The down projection's input, which nothing else keeps: in the compute dtype, or its one narrow
/// cast. `dropped`: a dropout between its output and the residual add, whose backward makes the
/// output's gradient.
inline void down_projection_row(TableBuilder& t, const Sizes& z, const std::string& prefix,
                                const std::string& what, const Shape& shape, Count sbf,
                                const LinearOutput& output, Linear down, bool dropped = false) {
    if (z.narrow)
        projection_input_row(t, z, prefix + "down projection", what, sbf, shape, 1, output,
                             bit(down));
    else
        linear_input_row(t, z, prefix + "down projection", what, shape,
                         Count(output.elements.value() / (z.sbh.value() / z.tokens.value())), sbf,
                         bit(down), output,
                         z.sbh * z.d);  // the MLP's input, which its caller holds (the stream:
                                        // its stream_beside)
    // Its backward: its input's gradient beside its own weight's, every row up to its input still
    // live. From the second micro-batch on that fresh gradient counts here, not at the weightless
    // ops around it (measured, peak_live.py: GPT-2, full recomputation, 2 micro-batches peaks at
    // this AddmmBackward0; oneDNN's scratchpad beside it is not counted). After a residual dropout
    // its output's gradient is a tensor of its own, the dropout's backward's, live beside the one
    // the residual passes on (measured, as above, with dropout).
    if (z.narrow) return;
    t.workspace_at(
        t.size(), true, prefix + "down projection backward",
        dropped ? "its input's gradient, and its output's from the residual dropout"
                : "its input's gradient",
        bytes_of(z.d, std::string(Text(shape.symbol))) +
            (dropped ? " + " + bytes_of(z.d, std::string(Text(output.symbol))) : std::string()),
        (sbf + (dropped ? output.elements : Count(0))) * z.d, output.weight, shape.split);
}

/// A dense feed-forward block over `tokens` tokens (all of them, or those routed to the experts). A
/// dropout inside it (mlp_dropout, nn.TransformerEncoderLayer's) acts on the down projection's
/// input. Returns whether the op-level policy saves the down projection's output, which the caller
/// places. `dropped`: a residual dropout follows the block (down_projection_row's).
inline bool mlp_rows(TableBuilder& t, const Architecture& m, const Sizes& z, const Shape& shape,
                     Count sbf, const std::string& prefix, Linear down_linear = Linear::down,
                     bool dropped = false) {
    const ActivationFunction& fn = activation_function(m.activation);
    const bool biased = m.bias == Bias::all;
    const std::string act = prefix + std::string(fn.label);
    const bool dropout = m.mlp_dropout > 0;
    // The down projection's output: row-parallel, the width of the stream for as many tokens.
    const bool routed = Text(shape.symbol) == Text(shape::sbkf.symbol);
    const LinearOutput down{Count(sbf.value() / m.ffn) * m.hidden,
                            routed ? "sbk(h)" : "sbh",
                            "down_proj",
                            ActivationSplit::replicated,
                            {},
                            {}};
    // The routed experts' activation, from its input (the first projections' outputs) to the down
    // projection's.
    const Module outer = t.current_section();
    if (outer == Module::moe) t.section(Module::moe_act);
    const auto end_act = [&] { t.section(outer); };
    // The dropout's backward: its incoming gradient and its input's, beside its mask or noise.
    const auto dropout_rows = [&] {
        dropout_row(t, z, z.compute, prefix + "MLP dropout", shape, sbf);
        t.workspace(true, prefix + "MLP dropout backward",
                    "its incoming gradient and its input's gradient",
                    bytes_of(2 * z.d, shape.symbol), Count(2 * z.d) * sbf, "down_proj");
        t.weightless();
    };
    if (m.mlp == Mlp::gated) {
        const bool gate_saved = t.linear_saved(biased),
                   up_saved = t.linear_saved(biased);  // act(gate(x)) * up(x)
        activation_rows(t, fn, shape, sbf, prefix, "the gate projection's output", z.d, gate_saved);
        t.add(prefix + "gate x up", std::string(fn.label) + "'s output",
              "the up branch's gradient is act(gate) x grad", shape, sbf, z.d);
        t.add(prefix + "gate x up", "the up projection's output",
              "the gate branch's gradient is up x grad", shape, sbf, z.d, Keep::always, 1,
              RowFacts{}.saved_by_policy(up_saved).input_of_module(
                  outer == Module::moe));  // with the gate's, moe_act's input
        if (!fn.up_branch.empty())
            t.add(prefix + "gate x up", std::string(fn.up_branch),
                  "the gate branch's gradient is (up branch) x grad", shape, sbf, z.d);
        // gate x up's backward: its incoming gradient and one for each factor, the down
        // projection's input already freed; the activation's own backward, after it, holds less.
        t.workspace(true, prefix + "gate x up backward",
                    "its incoming gradient and the gradients of both factors",
                    bytes_of(3 * z.d, shape.symbol), Count(3 * z.d) * sbf, "down_proj");
        t.weightless();
        if (dropout) dropout_rows();
        down_projection_row(
            t, z, prefix, dropout ? "its input (gate x up, dropped out)" : "its input (gate x up)",
            shape, sbf, down, down_linear, dropped);
        end_act();
        return t.linear_saved(biased);
    }
    activation_rows(t, fn, shape, sbf, prefix, "the up projection's output", z.d,
                    t.linear_saved(biased));
    // An output the function keeps is the down projection's input, unless a dropout comes between.
    if (fn.keeps_output && dropout)
        t.add(act, "its output", "its derivative is read from its output", shape, sbf, z.d);
    const std::size_t act_end = t.size();
    if (dropout) dropout_rows();
    down_projection_row(t, z, prefix,
                        dropout ? "its input (the dropped-out hidden)"
                                : "its input (" + std::string(fn.label) + "'s output)",
                        shape, sbf, down, down_linear, dropped);
    const std::uint64_t work = fn.backward_workspace * z.d;
    t.workspace_at(fn.keeps_output && !dropout ? t.size() : act_end, true, act + " backward",
                   fn.kernel == ActivationKernel::fused
                       ? "its incoming gradient and its input's gradient"
                       : "its incoming gradient and the last product's two gradients",
                   bytes_of(work, shape.symbol), Count(work) * sbf, "down_proj");
    t.weightless();
    end_act();
    return t.linear_saved(biased);
}

/// HF's sparse mixture-of-experts block: route, gather each expert's tokens, run it, weight,
/// scatter.
inline void moe_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const std::uint64_t k = m.active_experts();
    const Count slots =
        z.tokens * k;  // every token goes to k experts: s b k rows in all, whatever the routing
    if (m.input_jitter >
        0)  // in place on the router's input, whose row follows (architecture_layer)
        t.add("input jitter (in place)", "the noise, uniform in [1 - jitter, 1 + jitter]",
              "the input's gradient is multiplied by it", shape::sbh, z.sbh, z.s);
    t.policy_output(t.linear_saved(m.router_bias == RouterBias::trainable), "router", "its logits",
                    shape::sbE, z.tokens * m.experts, z.d);
    if (m.router == Router::sparsemixer) {
        // Twice, once per expert picked: masked_fill keeps its mask; softmax its output; gather the
        // sampled expert's index; the Heun correction (MultiplierProcessor) the gathered weight. In
        // the logits' dtype.
        t.add("sparsemixer: masked_fill",
              "the mask of logits too far below the best (bool), per pass",
              "the gradient is zeroed where it was filled", shape::sbE, z.tokens * m.experts,
              dtype::mask, Keep::always, 2);
        t.add("sparsemixer: softmax", "its output over the unmasked logits, per pass",
              "softmax's gradient is written in its output", shape::sbE, z.tokens * m.experts, z.d,
              Keep::always, 2);
        t.add("sparsemixer: gather", "the sampled expert's index (int64), per pass",
              "gather's gradient scatters by it", shape::sb, z.tokens, 8, Keep::always, 2);
        t.add("sparsemixer: Heun correction", "the gathered weight, per pass",
              "the logits' gradient is scaled by it", shape::sb, z.tokens, z.d, Keep::always, 2);
    } else {
        t.add("router softmax", "routing probabilities, fp32",
              "softmax's gradient is written in its output", shape::sbE, z.tokens * m.experts,
              dtype::fp32);
        t.add("top-k", "the chosen experts' indices (int64)", "to scatter the gradient back",
              shape::sbk, slots, 8);
    }
    if (m.renormalize_topk &&
        m.router == Router::softmax_topk) {  // without it (norm_topk_prob false) the top-k
                                             // probabilities are used as they are
        t.add("renormalise top-k", "the top-k probabilities, fp32",
              "division's gradient needs the numerator", shape::sbk, slots, dtype::fp32);
        t.add("renormalise top-k", "their sum per token, fp32",
              "division's gradient needs the denominator", shape::sb, z.tokens, dtype::fp32);
    }
    t.add("dispatch", "token and slot indices per expert (2 x int64)",
          "index and index_add need them", shape::sbk, slots, 16);
    // Gathered from the stream: under autocast fp32, and each expert's first projections cast it
    // again. Narrow linears keep only their cast of it.
    const LinearSet first = mlp_input_readers(m);
    const LinearOutput first_out = mlp_input_output(m, slots * m.ffn, shape::sbkf);
    bool gathered_kept = false;
    if (z.narrow)
        gathered_kept =
            projection_input_row(t, z, "experts: first projections", "the gathered tokens",
                                 slots * m.hidden, shape::sbkh, 1, first_out, first);
    else if ((first & ~t.tuning.frozen) != 0 ||
             ((first & t.tuning.adapted) != 0 && !t.tuning.adapter_dropout &&
              !adapter_upcast(t, z, z.s))) {
        t.add("dispatch", "the gathered tokens", "the expert's first projections need their input",
              shape::sbkh, slots * m.hidden, z.s);
        gathered_kept = true;
    }
    if (z.autocast)
        gathered_kept = projection_input_row(t, z, "experts: first projections",
                                             "the gathered tokens", slots * m.hidden, shape::sbkh,
                                             mlp_input_projections(m), {}, first) ||
                        gathered_kept;
    // Frozen, the experts' first projections keep no input but make it and their outputs as dense
    // ones do (all s b k slots at once: one expert's tokens are at most s b, leaning high), beside
    // the MLP norm's output the experts gather from (and the residual stream:
    // stream_beside).
    after_linears(t, z, "experts: first projections", first, slots, slots * m.hidden, shape::sbkh,
                  z.s, gathered_kept, first_out, z.sbh * z.d);
    if (m.stacked_experts) {
        // Each expert with tokens indexes the stacked weights with a tensor: copies, which the
        // matmuls keep; counted for every expert (with s b k slots spread over E, all are hit).
        const Count weights = Count(m.experts) * (mlp_input_projections(m) + 1) * m.hidden * m.ffn;
        t.add("experts: stacked weights indexed", "each expert's projection weights, copied",
              "the input's gradient is the output's gradient x W^T", shape::expert_weights, weights,
              z.d);
        t.add("experts: stacked weights indexed", "the hit experts' ids (int64)",
              "index's gradient scatters by them", shape::experts, m.experts, 8);
    }
    // Which experts' mms the op-level policy saves depends on how many experts the routing fills
    // and in what order: counted as if it saved every one (an upper bound; about half are).
    t.every_mm(true);
    const bool down_saved = mlp_rows(t, m, z, shape::sbkf, slots * m.ffn, "experts: ");
    t.every_mm(false);
    t.add("expert output x weight", "the expert outputs", "the routing weight's gradient",
          shape::sbkh, slots * m.hidden, z.d, Keep::always, 1,
          RowFacts{}.saved_by_policy(down_saved));
    // transformers casts the routing weights to the stream's dtype, which the weighted outputs
    // take.
    t.add("expert output x weight", std::string("the routing weights, ") + dtype_name(z.stream),
          "the expert output's gradient", shape::sbk, slots, z.s);
    t.add("combine (index_add)", "the weighted expert outputs", "index_add keeps its source",
          shape::sbkh, slots * m.hidden, z.s);
}

/// Every token through every expert (ExpertDispatch::every_token), as transformers' Llama4TextMoe
/// runs it in training: the router's top-k logits scattered into -inf and passed through an fp32
/// sigmoid; the tokens repeated E times and multiplied by their scores (the product keeps both: the
/// repeated tokens and the scores' transposed copy); one bmm with the stacked gate_up_proj (its
/// input kept, and its output, which act(gate) and the product with up read as views); act(gate)
/// and its product with up (the down bmm's input) kept; the E outputs summed, which keeps nothing.
/// Under autocast the tokens stay in the stream's dtype and bmm keeps its cast of the product.
inline void every_token_expert_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    constexpr Shape sbEh{"sbE(h)", ActivationSplit::sequence},
        sbEf{"sbE(f)", ActivationSplit::expert_tensor};
    const Count copies = z.tokens * m.experts;  // s b E token-copies
    const ActivationFunction& fn = activation_function(m.activation);
    t.policy_output(t.linear_saved(m.router_bias == RouterBias::trainable), "router", "its logits",
                    shape::sbE, z.tokens * m.experts, z.d);
    t.add("router top-k", "the chosen experts' indices (int64)",
          "topk's and scatter's gradients go by them", shape::sbk, z.tokens * m.active_experts(),
          8);
    t.add("router sigmoid", "its output over every expert, fp32",
          "sigmoid's gradient is written in its output", shape::sbE, z.tokens * m.experts,
          dtype::fp32);
    t.add("tokens x scores", "the tokens, repeated for every expert", "the scores' gradient", sbEh,
          copies * m.hidden, z.s);
    t.add("tokens x scores", "the scores, one column (transposed copy)", "the tokens' gradient",
          shape::sbE, copies, z.d);
    t.add("experts: gate_up bmm",
          z.autocast ? "its input, the weighted tokens, cast by autocast"
                     : "its input, the weighted tokens",
          "gate_up_proj's gradient = input^T x output gradient", sbEh, copies * m.hidden, z.d);
    const Module outer = t.section(Module::moe_act);
    t.add("experts: gate_up bmm", "its output, gate and up (which act and the product view)",
          std::string(fn.label) + "'s derivative is taken at gate; the product's gradient needs up",
          sbEf, copies * m.ffn * 2, z.d, Keep::always, 1, RowFacts{}.input_of_module());
    for (std::size_t i = 0; i < fn.kept_count(); ++i)  // its input is gate, a view of the row above
        if (!fn.kept[i].input)
            t.add("experts: " + std::string(fn.label) +
                      (fn.kept[i].op.empty() ? "" : ": " + std::string(fn.kept[i].op)),
                  std::string(fn.kept[i].tensor), std::string(fn.kept[i].why), sbEf, copies * m.ffn,
                  z.d);
    t.add("experts: up x act(gate)", std::string(fn.label) + "'s output",
          "up's gradient is act(gate) x grad", sbEf, copies * m.ffn, z.d);
    t.workspace(true, "experts: up x act(gate) backward",
                "its incoming gradient and the gradients of both factors",
                bytes_of(3 * z.d, std::string(Text(sbEf.symbol))), Count(3 * z.d) * copies * m.ffn,
                "down_proj");
    t.weightless();
    t.add("experts: down bmm", "its input, up x act(gate)",
          "down_proj's gradient = input^T x output gradient", sbEf, copies * m.ffn, z.d);
    t.section(outer);
}

/// Shared experts: a dense MLP over every token beside the routed ones, reading the MLP norm's
/// output (the router's input, kept already; under autocast its projections cast it again).
/// Qwen2-MoE scales its output by sigmoid(shared_expert_gate(x)), which keeps the sigmoid's output
/// and the MLP's; the sum with the routed output keeps nothing.
inline void shared_expert_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.shared_ffn == 0) return;
    // Without autocast they read the router's input, whose row (architecture_layer) counts their
    // adapters.
    if (z.autocast || z.narrow) {
        projection_input_row(t, z, "shared expert: up projections", "their input", z.sbh,
                             shape::sbh, mlp_input_projections(m), {}, mlp_input_readers(m, true));
        adapter_rows(t, z, "shared expert: up projections", mlp_input_readers(m, true), z.tokens,
                     z.sbh, shape::sbh, z.s);
    }
    const bool down_saved = mlp_rows(t, m, z, shape::sbfs, z.tokens * m.shared_ffn,
                                     "shared expert: ", Linear::shared_down);
    if (!m.shared_expert_gate) {
        t.policy_output(down_saved, "shared expert: down projection", "its output", shape::sbh,
                        z.sbh, z.d);
        return;
    }
    if (z.autocast) {
        projection_input_row(t, z.wide_linears(), "shared expert gate", "its input", z.sbh,
                             shape::sbh, 1, {}, bit(Linear::shared_expert_gate));
        adapter_rows(t, z, "shared expert gate", bit(Linear::shared_expert_gate), z.tokens, z.sbh,
                     shape::sbh, z.s);
    }
    t.policy_output(t.linear_saved(false), "shared expert gate", "its output", shape::sb, z.tokens,
                    z.d);
    t.add("shared expert gate: sigmoid", "its output (also a factor of the product)",
          "sigmoid's gradient is written in its output; the product's other factor's gradient",
          shape::sb, z.tokens, z.d);
    t.add("shared expert output x gate", "the shared expert's output", "the gate's gradient",
          shape::sbh, z.sbh, z.d, Keep::always, 1, RowFacts{}.saved_by_policy(down_saved));
}

}  // namespace detail

/// One layer's saved tensors as PyTorch keeps them for this architecture, `d`-byte activations.
/// `modules`: what selective recomputation checkpoints (select_modules); none ({0}): the table
/// unselected, every module's checkpoint rows in it. `tuning`: what fine-tuning changes
/// (finetune.hpp); by default every weight trains.
inline LayerActivations architecture_layer(const Architecture& m, std::uint64_t seq,
                                           std::uint64_t micro_batch, Precision precision,
                                           Attention attention, Platform platform = Platform::cuda,
                                           ModuleSet modules = {}, const LayerTuning& tuning = {}) {
    const detail::Sizes z(m, seq, micro_batch, precision, platform);
    const std::uint64_t d = z.d;
    LayerActivations layer;
    detail::TableBuilder t(layer.rows, &layer, tuning);
    const bool shared_norm = m.parallel_attention && m.norms_per_layer == 1;

    // Megatron-LM's layernorm module: input_layernorm and pre_mlp_layernorm. Its checkpoint keeps
    // the norm's input: a row of the norm's where that is the input itself, else a copy of its own.
    const auto layer_norm = [&](const std::string& what, bool input_kept, bool layer_input) {
        t.section(Module::layernorm);
        if (!detail::norm_rows(t, m, z, what, input_kept, layer_input))
            t.checkpoint_input("the norm's input (the residual stream)", shape::sbh, z.sbh, z.s);
    };
    // The residual stream's tensors are alive in the caller while the layer runs; rows keep them
    // only where a LayerNorm keeps its input (an RMSNorm keeps an fp32 copy, the stream itself when
    // that is fp32) or, without pre-norms, the projections read the stream itself (unless they cast
    // it).
    const bool norm_keeps_stream = m.norm == Norm::layernorm || z.s == dtype::fp32 ||
                                   (!m.norms_before_branches() && !z.autocast && !z.narrow);
    const Count unkept_stream = norm_keeps_stream ? Count(0) : z.sbh * z.s;
    t.stream_beside(unkept_stream, 0);
    if (m.norms_before_branches())
        layer_norm(shared_norm ? "layer norm" : "attention norm", false, true);
    t.section(Module::attention);
    // Autocast casts each weight as its linear runs: inside the mixer the output projection's is
    // still to come.
    t.casts_pending(m.mixer == Mixer::mamba ? "out_proj" : "o_proj");
    if (m.mixer == Mixer::mamba)
        detail::mamba_rows(t, m, z, micro_batch);
    else
        detail::attention_rows(t, m, z, attention);
    t.casts_pending({});
    t.section(Module::none);
    const bool output_biased = m.mixer == Mixer::mamba
                                   ? m.ssm.proj_bias
                                   : m.bias == Bias::attention || m.bias == Bias::all;
    t.policy_output(t.linear_saved(output_biased), "output projection", "its output", shape::sbh,
                    z.sbh, z.d);
    if (m.norms_after_branches())
        detail::norm_rows(t, m, z, "post-attention norm", false, false, true);
    if (m.hidden_dropout > 0 && !m.parallel_attention)
        detail::dropout_row(t, z, z.compute, "attention residual dropout", shape::sbh, z.sbh);

    t.mlp_half();
    // Beside the MLP: the attention half's sum, or a parallel layer's attention output, and the
    // output where the layer's code holds it.
    const Count held = m.attention_output_held && !m.parallel_attention ? z.sbh * d : Count(0);
    t.stream_beside(unkept_stream, m.parallel_attention ? z.sbh * d : unkept_stream + held);
    if (!shared_norm && m.norms_before_branches())
        layer_norm("MLP norm", m.parallel_attention, false);
    t.section(m.is_moe() ? Module::moe : Module::mlp);
    // Under autocast a shared norm's output is cast again by the MLP's projections (the router, for
    // experts); narrow linears save their own cast of it.
    // A router is no Transformer Engine module: it keeps its input in the compute dtype.
    const detail::Sizes& mlp_sizes = m.is_moe() ? z.wide_linears() : z;
    // The module's checkpoint keeps the norm's output: the row below where it is that very storage.
    bool input_is_norm_output = !mlp_sizes.autocast && !mlp_sizes.narrow;
    // Its readers: the MLP's first projections, or the router and, reading it too unless autocast
    // casts it for them, the shared experts.
    const LinearSet shared_readers =
        m.shared_ffn > 0 && !z.autocast && !z.narrow
            ? detail::mlp_input_readers(m, true) |
                  (m.shared_expert_gate ? bit(Linear::shared_expert_gate) : 0)
            : 0;
    const LinearSet readers =
        m.is_moe() ? bit(Linear::router) | shared_readers : detail::mlp_input_readers(m);
    const std::string first = m.is_moe() ? "router and experts" : "MLP up projections";
    const detail::LinearOutput first_out =
        m.is_moe() ? detail::LinearOutput{} : detail::mlp_input_output(m, z.sbf, shape::sbf);
    bool input_kept = true;  // with a shared norm, by the q/k/v projections' row
    if (!shared_norm || z.autocast || z.narrow) {
        input_kept = detail::projection_input_row(
            t, mlp_sizes, first, "their input", z.sbh, shape::sbh,
            m.is_moe() ? 1 : detail::mlp_input_projections(m), first_out, readers,
            detail::RowFacts{}
                .input_of_module(input_is_norm_output)
                .output_of_norm(input_is_norm_output));
        input_is_norm_output = input_is_norm_output && input_kept;
    }
    if (!input_is_norm_output)
        t.checkpoint_input("the norm's output", shape::sbh, z.sbh, z.s, true);
    // Beside the MLP's frozen linears: the residual stream the layer adds their output to.
    detail::after_linears(t, z, first, readers, z.tokens, z.sbh, shape::sbh, z.s, input_kept,
                          first_out);
    if (m.is_moe()) {
        if (m.expert_dispatch == ExpertDispatch::every_token)
            detail::every_token_expert_rows(t, m, z);
        else
            detail::moe_rows(t, m, z);
        t.section(
            Module::shared_experts);  // inside the MoE layer; its input, the router's, kept already
        detail::shared_expert_rows(t, m, z);
    } else {
        t.casts_pending("down_proj");
        t.policy_output(
            detail::mlp_rows(t, m, z, shape::sbf, z.sbf, "", Linear::down, m.hidden_dropout > 0),
            "MLP down projection", "its output", shape::sbh, z.sbh, z.d);
        t.casts_pending({});
    }
    t.section(Module::none);
    if (m.norms_after_branches()) detail::norm_rows(t, m, z, "post-MLP norm", false, false, true);
    if (m.hidden_dropout > 0)
        detail::dropout_row(t, z, z.compute,
                            m.parallel_attention ? "residual dropout" : "MLP residual dropout",
                            shape::sbh, z.sbh);

    // The last add: the MLP's output (compute dtype) and the sum (the stream's), beside the
    // residual stream's earlier tensors that no row keeps.
    const std::uint64_t stream =
        (m.parallel_attention ? (norm_keeps_stream ? 2 * d + z.s : 2 * d + 2 * z.s)
                              : (norm_keeps_stream ? d + z.s : d + 3 * z.s)) +
        z.upcast + (held > Count(0) ? d : 0);
    const std::string what =
        std::string(
            m.parallel_attention
                ? (norm_keeps_stream
                       ? "the attention's and the MLP's outputs, the sum"
                       : "the layer's input, the attention's and the MLP's outputs, the sum")
                : (norm_keeps_stream ? "the MLP's output and the sum"
                                     : "the layer's input, the attention half's sum, the MLP's "
                                       "output, the sum")) +
        (z.upcast ? ", the MLP's output upcast (CPU)" : "") +
        (held > Count(0) ? ", the attention's output (held)" : "");
    t.layer_end("residual add (the layer's last op)", what, detail::bytes_of(stream, "sbh"),
                Count(stream) * z.sbh);

    // QLoRA: each 4-bit linear dequantises its weight to the compute dtype while it computes,
    // forward and backward (bitsandbytes' MatMul4Bit); the largest, beside everything the layer
    // keeps.
    if (tuning.dequantized > Count(0)) {
        t.workspace(false, "4-bit linear (bitsandbytes)", "the largest weight, dequantised",
                    detail::bytes_of(d, "x its elements"), tuning.dequantized * d);
        t.workspace(true, "4-bit linear backward", "the largest weight, dequantised",
                    detail::bytes_of(d, "x its elements"), tuning.dequantized * d);
    }

    // DoRA: each adapted linear's forward makes ||W + B A|| from B A x I (an in x in identity
    // through the adapter), W as the adapter's dtype, W + scaling B A and the scaled term; the
    // largest, beside the layer.
    if (tuning.dora) {
        const std::uint64_t own = detail::adapter_bytes(t, z);
        const std::uint64_t copies = 3 + (detail::dora_weight_copied(t, z) ? 1 : 0);
        Count largest, widest;
        for (std::size_t l = 0; l < tuning.shapes.size(); ++l) {
            const AdaptedShape& w = tuning.shapes[l];
            if ((tuning.adapted & (LinearSet{1} << l)) == 0) continue;
            largest = std::max(largest, (Count(w.in) * w.in + Count(copies) * w.in * w.out +
                                         Count(w.in) * tuning.rank) *
                                            own);
            widest = std::max(widest, Count(w.out));
        }
        t.workspace(
            false, "DoRA weight norm", "I (in x in), B A, W cast, W + scaled B A, largest linear",
            detail::bytes_of(own, "x (in^2 + " + std::to_string(copies) + " in out + in r)"),
            largest);
        // Not measured (saved-tensor hooks see no temporaries): the output's gradient and those of
        // the two products' factors, s b out each in the adapter's dtype, at the widest adapted
        // linear (an expert's tokens are at most s b). Leans high.
        t.workspace(true, "DoRA backward",
                    "its output's gradient and the products' factors' gradients, widest linear",
                    detail::bytes_of(4 * own, "sb(out)"), z.tokens * widest * (4 * own));
    }

    layer.input_bytes = z.sbh * z.s;  // the checkpoint keeps the layer's input
    if (z.kernels->checkpoint_rng_state > 0)
        layer.checkpoint_tensors.push_back({"RNG state", Count(z.kernels->checkpoint_rng_state),
                                            ActivationSplit::replicated, CheckpointHeld::always});
    // A LoRA adapter beside the down projection, whose output the layer's last add takes as it is
    // (no experts' weighting, post-norm or dropout after it): reached before any saved tensor is
    // read.
    if (!m.is_moe() && !m.norms_after_branches() && m.hidden_dropout == 0 &&
        (tuning.adapted & bit(Linear::down)) != 0)
        layer.checkpoint_tensors.push_back({"the gradients made before the rerun",
                                            detail::rerun_gradients(t, z, z.sbh),
                                            ActivationSplit::replicated, CheckpointHeld::rerun});
    if (modules.bits != 0) select_modules(layer, modules);
    return layer;
}

/// What the embedding side saves from the first forward step until the last backward step.
inline std::vector<SavedTensor> input_side_saved(const Architecture& m, std::uint64_t seq,
                                                 std::uint64_t micro_batch, Precision precision,
                                                 Platform platform = Platform::cuda) {
    const detail::Sizes z(m, seq, micro_batch, precision, platform);
    const std::uint64_t d = z.d;
    std::vector<SavedTensor> rows;
    detail::TableBuilder t(rows);
    t.add("token embedding", "the token ids (int64)", "the gradient is scattered into their rows",
          shape::ids, z.tokens, 8);
    if (m.position == Position::rotary && !rotary_embedding(m.rotary_embedding).per_layer_tables) {
        t.add("rotary embedding", "cos and sin tables, shared by every layer",
              "q and k were multiplied by them", shape::sd, Count(seq) * m.rotary_dim(), d,
              Keep::always, 2);
        rows.back().every_stage = true;  // each pipeline stage builds its own
    }
    if (m.embedding_norm) detail::norm_rows(t, m, z, "embedding norm");
    if (m.hidden_dropout > 0)  // the embedding's output: the stream's dtype
        detail::dropout_row(t, z, z.stream, "embedding dropout", shape::sbh, z.sbh);
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
    if (attention == Attention::flash || buffer == CausalMaskBuffer::per_layer) return rows;
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
inline std::vector<SavedTensor> kv_cache_rows(const Architecture& m, std::uint64_t seq,
                                              std::uint64_t micro_batch, Precision precision,
                                              Attention attention, Recompute mode) {
    const detail::Sizes z(m, seq, micro_batch, precision);
    const bool repeated = attention == Attention::eager && m.key_value_heads() < m.heads;
    std::vector<SavedTensor> rows;
    if (m.mla.enabled()) {
        // Latent attention caches k and v before flash's padding: v a view of kv_b_proj's output,
        // which backward keeps only where it keeps v itself (eager at b = 1, selective's
        // checkpoint).
        detail::TableBuilder t(rows);
        const bool bare = checkpoints_layer(mode),
                   padded = attention == Attention::flash && m.value_head_size() != m.head_size();
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
    if (mode == Recompute::selective || (mode == Recompute::none && !repeated)) return rows;
    detail::TableBuilder t(rows);
    t.add("k/v cache (the model's output)", "k after rotary and v, k heads",
          "use_cache hands them back", shape::sbkv, z.sbkv, z.d, Keep::always, 2);
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
inline std::vector<SavedTensor> head_saved(const Architecture& m, std::uint64_t seq,
                                           std::uint64_t micro_batch, Precision precision,
                                           Platform platform = Platform::cuda,
                                           LossKernel loss = LossKernel::fp32,
                                           const LayerTuning& tuning = {}) {
    const detail::Sizes z(m, seq, micro_batch, precision, platform);
    std::vector<SavedTensor> rows;
    detail::TableBuilder t(rows, nullptr, tuning);
    detail::norm_rows(t, m, z, "final norm");
    // Megatron-LM's output layer is no Transformer Engine module: its input stays in the compute
    // dtype.
    detail::projection_input_row(t, z.wide_linears(), "output head", "its input", z.sbh, shape::sbh,
                                 1, {}, bit(Linear::head));
    if (loss == LossKernel::fp32_inplace)
        t.add("loss (softmax in place)", "an fp32 copy of the logits, softmaxed in place",
              "the gradient is written over it", shape::sbV, z.tokens * m.vocab, dtype::fp32);
    else if (const auto logp = loss_dtype(loss, precision))
        t.add("loss (log-softmax)", std::string("log-probabilities, ") + dtype_name(*logp),
              "log-softmax's gradient is written in its output", shape::sbV, z.tokens * m.vocab,
              bytes_per_element(*logp));
    t.add("loss (NLL)", "the target ids (int64)", "which log-probability each token's loss picked",
          shape::ids, z.tokens, 8);
    return rows;
}

inline Count saved_bytes(const std::vector<SavedTensor>& rows) {
    Count sum;
    for (const auto& r : rows) sum += r.bytes;
    return sum;
}

}  // namespace memcalc
