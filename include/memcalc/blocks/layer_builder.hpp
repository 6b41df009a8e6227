#pragma once
/// How a block writes a layer's program: its rows (RowFacts), ops and the tensors beside them.
#include <cstdint>
#include <string>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/finetune.hpp"

namespace memcalc::detail {

/// What a row is to the recomputations besides its Keep, given when it is made (SavedTensor's
/// fields of the same names).
struct RowFacts {
    bool layer_input = false;   ///< the layer's input itself, the same storage
    bool policy_saved = false;  ///< the output of an op the op-level policy saves
    bool norm_output = false;   ///< a norm's output, which recomputing the norm discards
    bool graph_held = false;    ///< held by the graph past its layer's backward (SavedTensor's)
    ModuleRole role = ModuleRole::inside;

    RowFacts input_of_layer(bool is = true) const { return with(&RowFacts::layer_input, is); }
    RowFacts saved_by_policy(bool is = true) const { return with(&RowFacts::policy_saved, is); }
    RowFacts output_of_norm(bool is = true) const { return with(&RowFacts::norm_output, is); }
    RowFacts held_by_graph(bool is = true) const { return with(&RowFacts::graph_held, is); }
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

    /// While quiet, nothing is saved: the ops run on tensors that need no gradient (the first
    /// layer's, its input not needing one, before its first adapter), so autograd records none.
    void quiet(bool on) { quiet_ = on; }
    bool quiet() const { return quiet_; }
    /// Whether the tensor the next adapter reads needs a gradient (a dropout keeps its mask only
    /// then); an adapter's output does, so everything after it.
    bool input_grad() const { return input_grad_; }
    void input_grad(bool needs) { input_grad_ = needs; }

    /// Whether torchtitan's op-level policy saves the output of the layer's next linear, in forward
    /// order: a bias-free one runs as aten.mm (a biased one as addmm, not on the save list), and
    /// the policy saves every mm but every second, counting per checkpointed call (its forward and
    /// its recomputation count alike). While `every_mm` is set each mm counts as saved: an upper
    /// bound, whose FLOPs it spares none of (leaning slow). `outputs` elements of `inputs` wide.
    bool linear_saved(bool biased, Count outputs, std::uint64_t inputs) {
        if (biased) return false;
        ++mm_count_;
        const bool saved = mm_count_ % 2 == 1;
        if (saved && !every_mm_) spare(2.0 * static_cast<double>(outputs.value()) * inputs);
        return every_mm_ || saved;
    }
    /// Forward FLOPs the op-level policy's saved outputs spare its recomputation.
    void spare(double flops) {
        if (layer_) layer_->policy_spared_flops += flops;
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
        if (!saved || !layer_ || quiet_) return;
        auto& outputs = layer_->policy_outputs;
        place(rows_.size(), Order::policy, StepKind::policy, outputs.size());
        outputs.push_back({{op, tensor, "the op-level policy saves it; the recomputation reuses it",
                            shape.symbol, 1, bytes_per_element, Keep::always, elements,
                            elements * bytes_per_element, shape.split}});
        outputs.back().tensor.policy_saved = true;
    }

    /// A temporary of the op running now, while the rows added so far are live: in forward
    /// beside the residual stream's tensors (stream_beside). `linear`: the linear whose op it is
    /// (in backward, whose weight's gradient it writes), none for an op with no weights
    /// (Workspace::linear); the gradients written already are the grad steps' after it.
    void workspace(bool backward, Label op, Label tensor, Label formula, Count bytes,
                   Linear linear = Linear::none) {
        workspace_at(rows_.size(), backward, op, tensor, formula, bytes, linear);
    }
    /// The same, run before row `before` is made (in backward: after its backward has run).
    void workspace_at(std::size_t before, bool backward, Label op, Label tensor, Label formula,
                      Count bytes, Linear linear = Linear::none,
                      ActivationSplit split = ActivationSplit::tensor) {
        if (!layer_) return;
        constexpr std::uint8_t all = 0xf;
        if (!backward) {  // the residual stream's tensors the caller holds
            constexpr std::uint8_t not_checkpointed =
                Beside::mode_bit(Recompute::none) | Beside::mode_bit(Recompute::selective);
            add_beside(before, {"the residual stream (its caller's)", stream_other_,
                                ActivationSplit::sequence, Holder::caller, all});
            add_beside(before, {"the layer's input", stream_input_, ActivationSplit::sequence,
                                Holder::caller, not_checkpointed});
            add_beside(before, {branch_.what, branch_.bytes, ActivationSplit::sequence,
                                Holder::caller, all});
            add_beside(before,
                       {held_.what, held_.bytes, ActivationSplit::replicated, Holder::caller, all});
        } else {
            if (checkpoint_held_.value() > 0)
                add_beside(before, {"a gradient the checkpoint still holds", checkpoint_held_,
                                    ActivationSplit::tensor, Holder::checkpoint,
                                    Beside::mode_bit(Recompute::selective)});
            add_beside(before, {branch_gradient_.what, branch_gradient_.bytes,
                                ActivationSplit::sequence, Holder::caller, all});
        }
        checkpoint_held_ = Count(0);
        push(before, {backward, op, tensor, formula, bytes, split, module_, linear});
    }
    /// The op's eager kernels pass `bytes` of temporaries to one another through memory, each
    /// written once and read once (EagerTraffic); in forward, of the op whose last row was added.
    void temporaries(bool backward, Label op, Count bytes, ActivationSplit split) {
        if (layer_ && bytes.value() > 0)
            layer_->eager_traffic.push_back(
                {backward, op, Count(2) * bytes, split,
                 rows_.empty() ? EagerTraffic::no_row : rows_.size() - 1});
    }
    /// The current module's op launches `n` x `op`'s kernels (launches.hpp), or `l`.
    void launch(LaunchOp op, double n = 1) { launch(launches_of(op) * n); }
    void launch(const Launches& l) {
        if (layer_) layer_->launches[static_cast<std::size_t>(module_)] += l;
    }
    /// The routed experts run `n` at a time in the model's loop: module `experts`' launches so
    /// far (one expert's) and the experts' linears (LayerActivations::looped_experts) `n` times.
    void loop_experts(Module experts, double n) {
        if (!layer_) return;
        layer_->launches[static_cast<std::size_t>(experts)] =
            layer_->launches[static_cast<std::size_t>(experts)] * n;
        layer_->looped_experts = n;
    }
    /// Forward workspaces added from now on run before linear `first`'s weight (and every later
    /// tensor) is cast; none: no cast is pending.
    void casts_pending(Linear first) {
        if (layer_)
            place(rows_.size(), Order::op, StepKind::casts_pending,
                  static_cast<std::size_t>(first));
    }
    /// The residual stream's tensors no row keeps, alive beside the forward workspaces added from
    /// now on: the layer's input, which a checkpointed layer keeps anyway, and in the MLP half the
    /// attention half's sum (or, in a parallel layer, the attention's output).
    void stream_beside(Count layer_input, Count other) {
        stream_input_ = layer_input;
        stream_other_ = other;
    }
    /// What the layer's code holds beside the ops of one branch of a parallel layer added from
    /// now on, in forward (Falcon-H1's norm output, and its Mamba-2 output while attention runs)
    /// and in backward (a gradient the other branch has made or will take); none after the sum.
    void branch_held(Label forward, Count forward_bytes, Label backward, Count backward_bytes) {
        branch_ = {forward, forward_bytes};
        branch_gradient_ = {backward, backward_bytes};
    }
    /// What a block's code holds beside its forward ops added from now on and no row keeps
    /// (DeepSeek-V3.2's top-k indices and mask, until the attention returns); 0 bytes: none.
    void held_beside(Label what, Count bytes) { held_ = {what, bytes}; }
    /// Under selective recomputation, a gradient alive beside the next backward op that the
    /// checkpoint still holds where elsewhere it takes its saved tensor's place.
    void held_by_checkpoint(Count bytes) { checkpoint_held_ = bytes; }
    /// Linear `l` has run (StepKind::grad): in backward its weight's gradient exists at the ops
    /// added before this, after those its block added.
    void gradient(Linear l) {
        if (layer_ && l != Linear::none)
            place(rows_.size(), Order::op, StepKind::grad, std::size_t(l));
    }
    /// The MLP half begins (StepKind::mlp_half).
    void mlp_half() {
        if (layer_) place(rows_.size(), Order::marker, StepKind::mlp_half, 0);
    }
    /// A temporary at the layer's last op, after its modules have returned (StepKind::layer_end),
    /// on the residual stream.
    void layer_end(Label op, Label tensor, Label formula, Count bytes) {
        if (!layer_) return;
        place(at_end, Order::op, StepKind::layer_end, 0);
        push(at_end, {false, op, tensor, formula, bytes, ActivationSplit::sequence, module_, {}});
    }
    std::size_t size() const { return rows_.size(); }

    /// One saved storage of `copies` x `per_copy` elements of `shape`, which says how it divides
    /// across ranks.
    void add(Label op, Label tensor, Label why, const Shape& shape, Count per_copy,
             std::uint64_t bytes_per_element, Keep keep = Keep::always, std::uint64_t copies = 1,
             const RowFacts& facts = {}) {
        if (quiet_) return;
        const Count elements = per_copy * copies;
        if (layer_) place(rows_.size(), Order::row, StepKind::row, rows_.size());
        rows_.push_back({op, tensor, why, shape.symbol, copies, bytes_per_element, keep, elements,
                         elements * bytes_per_element, shape.split, facts.layer_input,
                         facts.policy_saved, module_, facts.role, facts.norm_output});
        rows_.back().graph_held = facts.graph_held;
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
    bool quiet_ = false;
    bool input_grad_ = tuning.input_grad;
    Module module_ = Module::none;
    Count stream_input_, stream_other_;
    struct Held {
        Text what;
        Count bytes;
    };
    Held branch_, branch_gradient_;  ///< branch_held's
    Held held_;                      ///< held_beside's
};

}  // namespace memcalc::detail
