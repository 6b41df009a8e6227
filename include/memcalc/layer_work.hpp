#pragma once
/// One kind of layer's share of a workload (LayerWork): what its op tape keeps and rebuilds under
/// a recomputation, and what each of its workspaces adds to its step on a rank, with the gradients
/// and autocast copies that exist while it runs. Apart because it alone runs a layer's tape
/// (tape/): the rest of a workload sums what it found.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/linears.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/split_bytes.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/tape/from_program.hpp"
#include "memcalc/tape/liveness.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// A workspace's effect on its step (the tape's sweep: tape::RunEffect): on a rank it adds max(0,
/// added + the layer's gradients already written - covered - the layer's casts not made yet or
/// freed already).
struct WorkspaceEffect {
    SplitBytes added, covered;
    SplitParams gradients;  ///< parameters of the layer whose gradients exist while it runs
    bool weightless =
        false;  ///< Workspace::weightless: no fresh gradient exists while it runs, held ones aside
    SplitParams
        uncast;  ///< forward: parameters whose autocast copies are not made yet (not the op's own)
    /// Backward: parameters whose autocast copies their linears' backward has freed already (the
    /// linear the op writes keeps its own until it returns). Trained or frozen alike.
    SplitParams cast_freed;
    std::uint32_t source = 0;  ///< its Workspace's index in the layer's table

    /// `written`: bytes of the layer's gradients that exist while it runs; `unmade`: bytes the step
    /// counts that do not exist yet while it runs.
    Count on_rank(const Parallelism& p, std::uint64_t V, Count written, Count unmade = 0) const {
        const Count a = added.on_rank(p, V) + written, c = covered.on_rank(p, V) + unmade;
        return a > c ? Count(a.value() - c.value()) : Count(0);
    }
};

/// The most any of `effects` adds on a rank. `gradient_bytes`: per parameter, 0 where a ZeRO-2/3
/// bucket already holds the layer's gradient. `fresh`: when gradients are already held (a later
/// micro-batch, a persistent buffer), the only new one, whatever the op but a weightless one (else
/// each effect's own gradients written). `cast_bytes`: per parameter, what the step counts of the
/// layer's autocast copies (0 without autocast): the step counts them whole, so a forward op takes
/// off those not made yet and a backward op those its linears' backward freed.
inline Count largest_on_rank(const std::vector<WorkspaceEffect>& effects, const Parallelism& p,
                             std::uint64_t V, Count gradient_bytes,
                             const SplitParams* fresh = nullptr, Count cast_bytes = 0) {
    Count most;
    const SplitParams none;
    for (const auto& e : effects) {
        const SplitParams& written = fresh ? (e.weightless ? none : *fresh) : e.gradients;
        const Count unmade =
            cast_bytes.value() == 0
                ? Count(0)
                : (e.uncast.on_rank(p, V) + e.cast_freed.on_rank(p, V)) * cast_bytes;
        most = std::max(most, e.on_rank(p, V, written.on_rank(p, V) * gradient_bytes, unmade));
    }
    return most;
}

/// The layer's parameters from linear `first`'s weight on: it and every later tensor of the layer
/// in forward order, each bias with its weight, those `keep` accepts. `only_first`: `first`'s
/// weight and bias alone. None: no tensor.
template <class Keep>
SplitParams tensors_from(const ParameterTable& t, Linear first, std::uint64_t V, bool only_first,
                         std::size_t kind, Keep keep) {
    SplitParams ready;
    LinearSet earlier = 0;  // linears whose weight comes before `first`'s: their biases stay out
    bool reached = false;
    for (const auto& row : t.rows) {
        if (row.group != Group::layer || row.kind != kind) continue;
        const LinearSet own = row.of_linear(row.linear) ? bit(row.linear) : 0;
        reached = reached ||
                  (first != Linear::none && row.linear == first && row.role == ParamRole::weight);
        if (!reached || (earlier & own) != 0) {
            earlier |= own;
            continue;
        }
        if (only_first && own != bit(first)) continue;
        if (keep(row)) ready.add(row, V);
    }
    return ready;
}

/// The layer's parameters whose gradients exist once the backward pass reaches `first`
/// (tensors_from): a frozen tensor gets no gradient.
inline SplitParams gradients_from(const ParameterTable& t, Linear first, std::uint64_t V,
                                  bool only_first = false, std::size_t kind = 0) {
    return tensors_from(t, first, V, only_first, kind,
                        [](const ParamRow& r) { return r.trainable; });
}

/// The kernels one layer launches for one micro-batch: its matrix products (one a linear forward;
/// backward its input's gradient and a trained weight's) and its other ops, and the forward
/// kernels its recomputation runs again. An expert linear counts once an expert where the model's
/// loop runs them (LayerActivations::looped_experts), else once (a grouped GEMM).
struct LayerLaunches {
    Launches matmuls, other;
    double rerun_matmuls = 0, rerun_other = 0;
    double trained_tensors = 0;  ///< its tensors the optimiser steps, each its own kernels
};

/// Layer `kind`'s launches under `mode`: its blocks' (by module), its linears' and its trained
/// biases' (from `params`). Full recomputation reruns every forward kernel; selective the modules
/// whose rows it drops (their matrix products where a module of the MLP is one); and the
/// checkpoint's hooks for each tensor rebuilt.
inline LayerLaunches layer_launches(const LayerActivations& layer, Recompute mode,
                                    const ParameterTable& params, std::size_t kind) {
    LayerLaunches out;
    const bool whole = checkpoints_layer(mode);
    std::array<bool, module_count> rerun{};  // the modules selective recomputation reruns
    for (const SavedTensor& row : layer.rows) {
        if (!row.kept(Recompute::none) || (whole ? row.layer_input : row.kept(mode))) continue;
        out.rerun_other += checkpoint_hook_calls;  // a tensor the recomputation rebuilds
        // A row of no module: the core attention's (Korthikanti's layer).
        rerun[static_cast<std::size_t>(row.module == Module::none ? Module::core_attn
                                                                  : row.module)] = !whole;
    }
    for (std::size_t m = 0; m < module_count; ++m) {
        out.other += layer.launches[m];
        if (whole || rerun[m]) out.rerun_other += layer.launches[m].forward;
    }
    const bool mlp_rerun = rerun[static_cast<std::size_t>(Module::mlp)] ||
                           rerun[static_cast<std::size_t>(Module::moe)];
    for (const ParamRow& r : params.rows) {
        if (r.group != Group::layer || r.kind != kind) continue;
        if (r.trainable) out.trained_tensors += 1;
        if (r.linear == Linear::none) continue;
        if (r.role == ParamRole::bias && r.trainable)
            out.other += launches_of(LaunchOp::bias_gradient);
        if (r.role == ParamRole::bias || r.role == ParamRole::magnitude ||
            r.role == ParamRole::scale)
            continue;
        const double times = r.expert ? layer.looped_experts : 1;  // a loop's experts, each
        out.matmuls += matmul_launches(r.trainable) * times;
        if (whole || (mlp_rerun && r.part == Part::mlp)) out.rerun_matmuls += times;
    }
    return out;
}

/// One kind of layer's share of a workload, one layer of one micro-batch.
struct LayerWork {
    SplitBytes kept, rebuilt;  ///< under the recomputation
    /// Selective recomputation rebuilds the MLP half apart from the attention half (`rebuilt`): a
    /// backward step holds the larger.
    SplitBytes rebuilt_mlp_half;
    std::vector<WorkspaceEffect> forward_work, backward_work;  ///< its workspaces
    /// A checkpointed layer's forward ops as its backward reruns them, every row kept to the end
    /// (forward_work: as the forward step runs them, with no grad).
    std::vector<WorkspaceEffect> rerun_work;
    SplitBytes held_by_rerun;  ///< its checkpoint's CheckpointHeld::rerun tensors, where it has one
    SplitBytes eager_traffic;  ///< its unfused ops' temporaries, written and read (EagerTraffic)
    bool keeps_input =
        false;  ///< it keeps its input tensor itself (a LayerNorm's saved input, a checkpoint)
    LayerLaunches launches;  ///< the kernels it launches (count_launches: the step time's alone)
};

namespace detail {

/// What a workspace of `layer` is to its step besides its bytes: the gradients and casts that exist
/// while it runs (from linear `written`'s gradient on; from linear `uncast`'s cast on, not made).
inline WorkspaceEffect workspace_facts(const Workspace& work, Linear written, Linear uncast,
                                       const ParameterTable& params, std::uint64_t V,
                                       std::size_t kind) {
    WorkspaceEffect e;
    e.gradients = gradients_from(params, written, V, false, kind);
    e.weightless = work.weightless();
    // A linear's own cast exists while its op runs; autograd frees it when its backward returns
    // (measured: the allocation replay of LoRA on nanoGPT, cpu-third-party-lora.json).
    const auto not_its_own = [&](const ParamRow& r) {
        return autocast_copies(r) && r.linear != work.linear;
    };
    if (work.backward)
        e.cast_freed = tensors_from(params, written, V, false, kind, not_its_own);
    else
        e.uncast = tensors_from(params, uncast, V, false, kind, not_its_own);
    return e;
}

}  // namespace detail

/// One kind of layer's share of a workload under `mode`: its tape's sweep (kept, rebuilt, what each
/// op adds to its step) and what its ops' gradients and casts are.
inline LayerWork layer_work(const LayerActivations& layer, Recompute mode,
                            const ParameterTable& params, std::uint64_t V, std::size_t kind) {
    const tape::Liveness live = tape::sweep_program(layer, mode);
    LayerWork lw;
    lw.kept = live.kept, lw.rebuilt = live.rebuilt[0], lw.rebuilt_mlp_half = live.rebuilt[1];
    const std::vector<Linear> uncast = layer.uncast_by_op(), written = layer.gradients_by_op();
    const auto effect = [&](const tape::RunEffect& run) {
        WorkspaceEffect e = detail::workspace_facts(layer.work[run.source], written[run.source],
                                                    uncast[run.source], params, V, kind);
        e.added = run.added, e.covered = run.covered, e.source = run.source;
        return e;
    };
    for (const tape::RunEffect& run : live.runs)  // in the tape's order
        (layer.work[run.source].backward ? lw.backward_work : lw.forward_work)
            .push_back(effect(run));
    for (const SavedTensor& row : layer.rows)
        if (row.kept(mode) && row.layer_input) lw.keeps_input = true;
    for (const EagerTraffic& e : layer.eager_traffic)
        lw.eager_traffic.add(e.split, e.under(mode, layer.rows));
    if (checkpoints_layer(mode)) {
        lw.keeps_input = true;
        for (const CheckpointTensor& t : layer.checkpoint_tensors)
            if (t.held == CheckpointHeld::rerun) lw.held_by_rerun.add(t);
        for (const tape::RunEffect& run : tape::sweep_program(layer, mode, true).runs)
            if (!layer.work[run.source].backward) lw.rerun_work.push_back(effect(run));
    }
    return lw;
}

}  // namespace memcalc
