#pragma once
/// A layer's saved-tensor table (LayerActivations: rows, workspaces, the op-level policy's outputs)
/// written as a tape under one recomputation mode: the first step of moving every block onto tapes.
/// Its sweep gives what activations.hpp's rules give (kept, rebuilt, workspace_effect), which
/// tests/test_tape.cpp proves over the test grid; the blocks' own tapes replace it.
///
/// It keeps 1.2's accounting where that differs from what torch does (validation/op_live.py shows
/// each; every one leans high or changes no figure), for the blocks' own tapes to settle, each
/// with its measurement: a checkpointed layer's forward keeps every row it makes to the layer's
/// end (torch frees each after its last reader: llama-tiny's forward under full, 300,480 B against
/// 209,856 measured); the checkpoint's input is saved at the forward's start (it exists already);
/// a table with no MLP half rebuilds at the backward's start; selective recomputation keeps an RNG
/// state per module it rebuilds, where one checkpoint may hold several (5,056 B on CPU).
#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/tape/liveness.hpp"
#include "memcalc/tape/tape.hpp"

namespace memcalc::tape {

namespace detail {

/// Whether a rebuilt tensor of module `made_by` is live while an op of module `running` runs in
/// forward under selective recomputation: a checkpointed module frees its internals on return;
/// the core attention runs inside the attention module and reads what mla_up_proj made.
inline bool in_scope(Module running, Module made_by) {
    if (running != Module::core_attn) return made_by == running;
    return made_by == Module::attention || made_by == Module::core_attn ||
           made_by == Module::mla_up_proj;
}

template <class Sink>
class TableTape {
public:
    TableTape(const LayerActivations& layer, Recompute mode, Sink& sink)
        : layer_(layer), mode_(mode), b_(sink), rows_(layer.rows.size()) {}

    void write() {
        declare();
        order_work();
        forward();
        backward();
    }

    /// The tensors known before the step runs come first, at fixed ids: the rows (0..n-1), the
    /// policy's outputs, the checkpoints' RNG states, the checkpoint's input.
    void declare() {
        for (std::size_t i = 0; i < rows_; ++i) row_tensor(layer_.rows[i], counted_row(i));
        TensorId next = TensorId(rows_);
        if (mode_ == Recompute::op)
            for (const PolicyOutput& p : layer_.policy_outputs)
                row_tensor(p.tensor, Counted::saved), ++next;
        states_from_ = next;
        if (layer_.checkpoint_state.value() > 0)
            for (std::uint64_t c = 0; c < layer_.checkpoints(mode_); ++c, ++next)
                b_.tensor("RNG state", "", ActivationSplit::replicated, layer_.checkpoint_state,
                          Role::state, Counted::saved);
        states_to_ = next;
        if (checkpointed())
            input_ = b_.tensor("the layer's input", "sbh", ActivationSplit::sequence,
                               layer_.input_bytes, Role::activation, Counted::saved);
        if (mode_ != Recompute::none) transient_.reserve(rows_);
    }

private:
    static constexpr TensorId none = ~TensorId{0};

    TensorId row_tensor(const SavedTensor& r, Counted counted) {
        return b_.tensor(r.tensor, r.symbol, r.split, r.bytes, Role::activation, counted);
    }
    /// What row `i` is to the steps: kept, rebuilt in its region, or neither (never made, or the
    /// checkpoint's input itself).
    Counted counted_row(std::size_t i) const {
        const SavedTensor& r = layer_.rows[i];
        if (r.kept(mode_)) return Counted::saved;
        return rebuilt_by(r, mode_) ? rebuilt_in(region_of_row(i)) : Counted::none;
    }
    TensorId row(std::size_t i) const { return TensorId(i); }
    TensorId policy_output(std::size_t i) const { return TensorId(rows_ + i); }
    bool selective() const { return mode_ == Recompute::selective; }
    bool checkpointed() const { return checkpoints_layer(mode_); }
    /// A row that is the layer's input itself, which a checkpointed layer keeps as its input.
    bool is_checkpoint_input(const SavedTensor& r) const { return checkpointed() && r.layer_input; }
    std::uint8_t region_of_row(std::size_t i) const {
        return selective() && i >= layer_.mlp_half_from ? 1 : 0;
    }

    /// The row before which a workspace runs (in backward: after whose backward).
    std::size_t position(std::uint32_t w) const {
        return std::min(layer_.work[w].absent_from, rows_);
    }
    /// 0: forward, 1: forward at the layer's end, 2: backward.
    static int group(const Workspace& w) { return w.backward ? 2 : w.layer_end ? 1 : 0; }

    /// The workspaces by group, each group ordered by position (stable: ties keep the table's
    /// order).
    void order_work() {
        work_.resize(layer_.work.size());
        std::iota(work_.begin(), work_.end(), std::uint32_t{0});
        std::stable_sort(work_.begin(), work_.end(), [&](std::uint32_t a, std::uint32_t c) {
            const int ga = group(layer_.work[a]), gc = group(layer_.work[c]);
            return ga != gc ? ga < gc : position(a) < position(c);
        });
        for (std::uint32_t w : work_) ++group_size_[group(layer_.work[w])];
    }

    void forward() {
        b_.at(Pass::forward);
        if (input_ != none) b_.save("checkpoint", input_);
        for (TensorId t = states_from_; t < states_to_; ++t) b_.save("checkpoint", t);
        const std::size_t policy = mode_ == Recompute::op ? layer_.policy_outputs.size() : 0;
        std::size_t next_work = 0, next_policy = 0;
        for (std::size_t k = 0; k <= rows_; ++k) {
            for (; next_work < group_size_[0] && position(work_[next_work]) == k; ++next_work)
                forward_work(work_[next_work]);
            for (; next_policy < policy &&
                   std::min(layer_.policy_outputs[next_policy].made_at, rows_) == k;
                 ++next_policy)
                b_.save(layer_.policy_outputs[next_policy].tensor.op, policy_output(next_policy));
            if (k < rows_) forward_row(k);
        }
        layer_end();
    }

    void forward_row(std::size_t i) {
        const SavedTensor& r = layer_.rows[i];
        if (r.kept(mode_)) return b_.save(r.op, row(i));
        if (!rebuilt_by(r, mode_)) return;  // never made, or the checkpoint's input itself
        b_.alloc(r.op, row(i));
        transient_.push_back(i);
    }

    void forward_work(std::uint32_t index) {
        const Workspace& w = layer_.work[index];
        if (selective()) leave_scopes(w.module);
        const TensorId other = stream(w.stream_other, "the residual stream (its caller's)");
        const TensorId input = checkpointed() ? none : stream(w.stream_input, "the layer's input");
        b_.work(w.op, workspace(w), index);
        if (other != none) b_.free(w.op, other);
        if (input != none) b_.free(w.op, input);
    }

    /// Frees the rebuilt tensors of checkpointed modules other than `running`'s: they returned.
    void leave_scopes(Module running) {
        std::size_t live = 0;
        for (std::size_t i : transient_) {
            const SavedTensor& r = layer_.rows[i];
            if (r.norm_output || in_scope(running, r.module))
                transient_[live++] = i;
            else
                b_.free("checkpoint return", row(i));
        }
        transient_.resize(live);
    }

    TensorId stream(Count bytes, Text name) {
        if (bytes.value() == 0) return none;
        const TensorId t = b_.tensor(name, "sbh", ActivationSplit::sequence, bytes, Role::stream);
        b_.alloc("caller", t);
        return t;
    }

    TensorId workspace(const Workspace& w) {
        return b_.tensor(w.tensor, w.formula, w.split, w.bytes, Role::workspace);
    }

    /// The layer's last op: what a recomputation does not keep is gone.
    void layer_end() {
        for (std::size_t i : transient_) b_.free("layer end", row(i));
        transient_.clear();
        if (checkpointed()) return;  // its forward is not modelled there
        for (std::size_t w = group_size_[0]; w < group_size_[0] + group_size_[1]; ++w)
            b_.work(layer_.work[work_[w]].op, workspace(layer_.work[work_[w]]), work_[w]);
    }

    void backward() {
        b_.at(Pass::backward);
        if (mode_ == Recompute::op)  // popped by the recomputation, never saved for backward
            for (std::size_t i = 0; i < layer_.policy_outputs.size(); ++i)
                b_.free("recomputation", policy_output(i));
        if (!selective() || layer_.mlp_half_from < rows_) rebuild_region(selective() ? 1 : 0);
        const std::size_t first = group_size_[0] + group_size_[1];
        std::size_t next = work_.size();  // ordered by position: walk it from the end
        for (std::size_t p = rows_ + 1; p-- > 0;) {
            if (selective() && p == std::min(layer_.mlp_half_from, rows_)) rebuild_region(0);
            for (; next > first && position(work_[next - 1]) == p; --next)
                backward_work(work_[next - 1]);
            if (p > 0) free_row(p - 1);
        }
        end_backward();
    }

    /// The layer's backward has returned: what its checkpoints held (the input, RNG states) goes.
    void end_backward() {
        b_.at(Pass::backward);
        if (input_ != none && !input_freed_) b_.free("backward end", input_);
        for (TensorId t = states_from_; t < states_to_; ++t) b_.free("backward end", t);
    }

    void rebuild_region(std::uint8_t region) {
        b_.at(Pass::backward, region);
        for (std::size_t i = 0; i < rows_; ++i)
            if (region_of_row(i) == region && rebuilt_by(layer_.rows[i], mode_))
                b_.rebuild(layer_.rows[i].op, row(i));
    }

    void backward_work(std::uint32_t index) {
        const Workspace& w = layer_.work[index];
        b_.at(Pass::backward, selective() && w.absent_from > layer_.mlp_half_from ? 1 : 0);
        TensorId extra = none;
        if (selective() && w.selective_extra.value() > 0) {
            extra = b_.tensor("a gradient the checkpoint still holds", "", ActivationSplit::tensor,
                              w.selective_extra, Role::activation);
            b_.alloc(w.op, extra);
        }
        b_.work(w.op, workspace(w), index);
        if (extra != none) b_.free(w.op, extra);
    }

    /// Row `i`'s backward has run: its storage is released (a checkpoint input's, with it).
    void free_row(std::size_t i) {
        const SavedTensor& r = layer_.rows[i];
        b_.at(Pass::backward, region_of_row(i));
        if (is_checkpoint_input(r)) {
            if (input_ != none && !input_freed_) b_.free(r.op, input_), input_freed_ = true;
            return;
        }
        if (r.kept(mode_) || rebuilt_by(r, mode_)) b_.free(r.op, row(i));
    }

    const LayerActivations& layer_;
    Recompute mode_;
    Builder<Sink> b_;
    std::size_t rows_;
    std::vector<std::uint32_t> work_;           ///< workspaces by group, then position
    std::array<std::size_t, 3> group_size_{};   ///< forward, layer end, backward
    std::vector<std::size_t> transient_;        ///< forward: rows made and not kept, still live
    TensorId states_from_ = 0, states_to_ = 0;  ///< the checkpoints' RNG states
    TensorId input_ = none;
    bool input_freed_ = false;
};

}  // namespace detail

/// `layer`'s table as a tape under `mode` (select_modules already applied for selective).
inline Tape from_table(const LayerActivations& layer, Recompute mode) {
    Recorder r;
    r.tape.tensors.reserve(layer.rows.size() + 2 * layer.work.size() + 4);
    r.tape.events.reserve(3 * layer.rows.size() + 5 * layer.work.size() + 8);
    detail::TableTape<Recorder>(layer, mode, r).write();
    return std::move(r.tape);
}

/// The sweep of from_table(layer, mode), with no tape kept. Flattened: the events inline into
/// the sums (every estimate sweeps each kind of layer).
[[gnu::flatten]] inline Liveness sweep_table(const LayerActivations& layer, Recompute mode) {
    Sweeper s(layer.rows.size() + layer.policy_outputs.size() + 2 * layer.work.size() + 4,
              layer.work.size());
    detail::TableTape<Sweeper> t(layer, mode, s);
    // With no op to measure, the sums are the declared tensors' alone: the events change nothing.
    if (layer.work.empty())
        t.declare();
    else
        t.write();
    return s.finish();
}

/// What each of `layer`'s workspaces adds to its step under `mode` and the bytes its step counts
/// that are not live meanwhile, by its index in `layer.work` (zero for one the mode does not run):
/// the sweep's, for tables that show them. `layer` is one rank's share already.
inline std::vector<WorkspaceSum> workspace_sums(const LayerActivations& layer, Recompute mode) {
    std::vector<WorkspaceSum> out(layer.work.size());
    for (const RunEffect& run : sweep_table(layer, mode).runs)
        out[run.source] = {run.added.total(), run.covered.total()};
    return out;
}

}  // namespace memcalc::tape
