#pragma once
/// A layer's program (LayerActivations: its rows made, its ops run, in forward order) written as a
/// tape under one recomputation mode: the forward as the program runs it, the backward as it reads
/// it backwards, with the recomputation's rebuilds where backward reaches them.
///
/// It keeps 1.2's accounting where that differs from what torch does (validation/op_live.py shows
/// each; every one leans high or changes no figure), for the blocks' own tapes to settle, each
/// with its measurement: a checkpointed layer's forward (no grad) keeps a row until its module
/// returns (torch frees each after its last reader: nanoGPT's LoRA layer under autocast, forward
/// 6 2.9 MB above the measured, was 7.1 MB when every row lived to the layer's end,
/// cpu-third-party-lora.json); the checkpoint's input is saved at the forward's start (it exists
/// already);
/// a table with no MLP half rebuilds at the backward's start; selective recomputation keeps an RNG
/// state per module it rebuilds, where one checkpoint may hold several (5,056 B on CPU).
#include <cstdint>
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
class ProgramTape {
public:
    /// `rerun`: a checkpointed layer's forward as its backward reruns it, every row saved to the
    /// end; else as the step runs it, no grad, each module's rows gone when it returns.
    ProgramTape(const LayerActivations& layer, Recompute mode, Sink& sink, bool rerun = false)
        : layer_(layer),
          mode_(mode),
          rerun_(rerun),
          b_(sink),
          rows_(layer.rows.size()),
          first_mlp_half_row_(layer.first_mlp_half_row()) {}

    void write() {
        if (skipped()) return;  // a layer the step never runs: no events at all
        declare();
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
        for (const CheckpointTensor& t : layer_.checkpoint_tensors)
            if (t.held == CheckpointHeld::always)
                for (std::uint64_t c = 0; c < layer_.checkpoints(mode_); ++c, ++next)
                    b_.tensor(t.name, "", t.split, t.bytes, Role::state, Counted::saved);
        states_to_ = next;
        if (checkpointed())
            input_ = b_.tensor("the layer's input", "sbh", ActivationSplit::sequence,
                               layer_.input_bytes, Role::activation, Counted::saved);
    }

private:
    static constexpr TensorId none = ~TensorId{0};

    /// The program's steps; a table with none is its rows, in order.
    std::size_t steps() const { return layer_.program.empty() ? rows_ : layer_.program.size(); }
    ProgramStep step(std::size_t k) const {
        return layer_.program.empty() ? ProgramStep{StepKind::row, std::uint32_t(k)}
                                      : layer_.program[k];
    }

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
    /// A layer with no input and nothing kept: one the step skips (architecture_layer's empty
    /// table for mllama's cross-attention without images).
    bool skipped() const { return rows_ == 0 && layer_.program.empty() && layer_.input_bytes == 0; }
    bool checkpointed() const { return checkpoints_layer(mode_); }
    /// Whether selective recomputation rebuilds an MLP half apart: a row follows its marker.
    bool two_regions() const { return selective() && first_mlp_half_row_ < rows_; }
    /// A row that is the layer's input itself, which a checkpointed layer keeps as its input.
    bool is_checkpoint_input(const SavedTensor& r) const { return checkpointed() && r.layer_input; }
    std::uint8_t region_of_row(std::size_t i) const {
        return selective() && i >= first_mlp_half_row_ ? 1 : 0;
    }

    void forward() {
        if (mode_ != Recompute::none) transient_.reserve(rows_);
        b_.at(Pass::forward);
        if (input_ != none) b_.save("checkpoint", input_);
        for (TensorId t = states_from_; t < states_to_; ++t) b_.save("checkpoint", t);
        bool ended = false;
        for (std::size_t k = 0; k < steps(); ++k) {
            const ProgramStep s = step(k);
            if (s.kind == StepKind::row) forward_row(s.index);
            if (s.kind == StepKind::policy && mode_ == Recompute::op)
                b_.save(layer_.policy_outputs[s.index].tensor.op, policy_output(s.index));
            if (s.kind == StepKind::layer_end) end_layer(), ended = true;
            // After the layer's end a checkpointed layer's forward is not modelled.
            if (s.kind == StepKind::op && !layer_.work[s.index].backward &&
                !(ended && checkpointed()))
                forward_op(k);
        }
        if (!ended) end_layer();
    }

    void forward_row(std::size_t i) {
        const SavedTensor& r = layer_.rows[i];
        if (r.kept(mode_)) return b_.save(r.op, row(i));
        if (!rebuilt_by(r, mode_)) return;  // never made, or the checkpoint's input itself
        b_.alloc(r.op, row(i));
        transient_.push_back(i);
    }

    /// The op at step `k` runs with the tensors its beside steps name alive. Where the forward
    /// runs with no grad (checkpointed), a module's rows go when it returns, as its locals do.
    void forward_op(std::size_t k) {
        const Workspace& w = layer_.work[step(k).index];
        if (selective() || (checkpointed() && !rerun_)) leave_scopes(w.module);
        run_op(k);
    }

    void run_op(std::size_t k) {
        const std::uint32_t index = step(k).index;
        const Workspace& w = layer_.work[index];
        beside_.clear();
        for (std::size_t j = layer_.first_beside_of(k); j < k; ++j) {
            const Beside& held = layer_.beside[step(j).index];
            if (!held.alive(mode_) || held.bytes.value() == 0) continue;
            beside_.push_back(b_.tensor(
                held.name, held.holder == Holder::caller ? "sbh" : "", held.split, held.bytes,
                held.holder == Holder::caller ? Role::stream : Role::activation));
            b_.alloc(held.holder == Holder::caller ? Text("caller") : w.op, beside_.back());
        }
        b_.work(w.op, b_.tensor(w.tensor, w.formula, w.split, w.bytes, Role::workspace), index);
        for (TensorId t : beside_) b_.free(w.op, t);
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

    /// The layer's modules have returned: what a recomputation does not keep is gone.
    void end_layer() {
        for (std::size_t i : transient_) b_.free("layer end", row(i));
        transient_.clear();
    }

    void backward() {
        b_.at(Pass::backward);
        if (mode_ == Recompute::op)  // popped by the recomputation, never saved for backward
            for (std::size_t i = 0; i < layer_.policy_outputs.size(); ++i)
                b_.free("recomputation", policy_output(i));
        const std::uint8_t first = two_regions() ? 1 : 0;  // backward reaches the MLP half first
        if (checkpointed())
            rerun();
        else
            rebuild_region(first);
        walk_backward(first);
        end_backward();
    }

    /// A checkpointed layer's backward begins: the gradients made before the forward reruns are
    /// alive while it rebuilds the rows.
    void rerun() {
        beside_.clear();
        for (const CheckpointTensor& t : layer_.checkpoint_tensors)
            if (t.held == CheckpointHeld::rerun) {
                beside_.push_back(b_.tensor(t.name, "", t.split, t.bytes, Role::activation));
                b_.alloc("checkpoint rerun", beside_.back());
            }
        rebuild_region(0);
        for (TensorId t : beside_) b_.free("checkpoint rerun", t);
    }

    /// The program backwards: each op's backward, each row freed once its backward has run.
    void walk_backward(std::uint8_t region) {
        for (std::size_t k = steps(); k-- > 0;) {
            const ProgramStep s = step(k);
            if (s.kind == StepKind::op && layer_.work[s.index].backward) {
                b_.at(Pass::backward, region);
                run_op(k);
            }
            if (s.kind != StepKind::row) continue;
            free_row(s.index);
            // The MLP half's first row's backward has run: the attention half's turn. (An op
            // between the marker and that row counts with the attention half, as 1.2 did.)
            if (two_regions() && s.index == first_mlp_half_row_) rebuild_region(region = 0);
        }
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
    bool rerun_;
    Builder<Sink> b_;
    std::size_t rows_;
    std::size_t first_mlp_half_row_;
    std::vector<std::size_t> transient_;        ///< forward: rows made and not kept, still live
    std::vector<TensorId> beside_;              ///< the running op's beside tensors
    TensorId states_from_ = 0, states_to_ = 0;  ///< the checkpoints' RNG states
    TensorId input_ = none;
    bool input_freed_ = false;
};

}  // namespace detail

/// `layer`'s program as a tape under `mode` (select_modules already applied for selective).
inline Tape from_program(const LayerActivations& layer, Recompute mode) {
    Recorder r;
    r.tape.tensors.reserve(layer.rows.size() + 2 * layer.work.size() + 4);
    r.tape.events.reserve(3 * layer.rows.size() + 5 * layer.work.size() + 8);
    detail::ProgramTape<Recorder>(layer, mode, r).write();
    return std::move(r.tape);
}

/// The sweep of from_program(layer, mode), with no tape kept (`rerun`: ProgramTape's). Flattened:
/// the events inline into the sums (every estimate sweeps each kind of layer).
[[gnu::flatten]] inline Liveness sweep_program(const LayerActivations& layer, Recompute mode,
                                               bool rerun = false) {
    // With no op to measure, the sums are the declared tensors' alone: the events change nothing,
    // and no tensor's state is kept for them.
    if (layer.work.empty()) {
        Sweeper s(Sweeper::totals_only);
        detail::ProgramTape<Sweeper>(layer, mode, s, rerun).declare();
        return s.finish();
    }
    Sweeper s(layer.rows.size() + layer.policy_outputs.size() + 2 * layer.work.size() + 4,
              layer.work.size());
    detail::ProgramTape<Sweeper>(layer, mode, s, rerun).write();
    return s.finish();
}

/// What each of `layer`'s workspaces adds to its step under `mode` and the bytes its step counts
/// that are not live meanwhile, by its index in `layer.work` (zero for one the mode does not run):
/// the sweep's, for tables that show them. `layer` is one rank's share already.
inline std::vector<WorkspaceSum> workspace_sums(const LayerActivations& layer, Recompute mode) {
    std::vector<WorkspaceSum> out(layer.work.size());
    for (const RunEffect& run : sweep_program(layer, mode).runs)
        out[run.source] = {run.added.total(), run.covered.total()};
    return out;
}

}  // namespace memcalc::tape
