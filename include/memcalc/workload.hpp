#pragma once
/// A workload (model, sequence, micro-batch, recomputation, recipe, activation model) reduced to
/// sums by how each tensor divides across ranks, so that any parallel layout's per-device memory
/// follows in a few operations: estimate() builds its timelines from these, and fit and plan search
/// thousands of layouts a millisecond with them.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/layers.hpp"
#include "memcalc/model.hpp"
#include "memcalc/optimizer.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/split_bytes.hpp"
#include "memcalc/tape/from_program.hpp"
#include "memcalc/tape/liveness.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// Parameter counts of one group by how they divide across tensor- and expert-parallel ranks.
struct SplitParams {
    Count replicated, tensor, per_vocab_column, expert_replicated, expert_tensor;

    void add(const ParamRow& r, std::uint64_t vocab) {
        switch (r.split) {
            case ParamSplit::replicated:
                (r.expert ? expert_replicated : replicated) += r.count;
                break;
            case ParamSplit::tensor: (r.expert ? expert_tensor : tensor) += r.count; break;
            case ParamSplit::vocab: per_vocab_column += Count(r.count.value() / vocab); break;
        }
    }
    Count on_rank(const Parallelism& p, std::uint64_t vocab) const {
        return replicated + ceil_div(tensor, p.tp) + per_vocab_column * ceil_div(vocab, p.tp) +
               experts_on_rank(p);
    }
    /// The experts' share of on_rank: their state shards over the expert-data-parallel group only.
    Count experts_on_rank(const Parallelism& p) const {
        return ceil_div(expert_replicated, p.ep) +
               ceil_div(ceil_div(expert_tensor, p.expert_tp()), p.ep);
    }
};

/// Optimiser state of one group by how it divides across tensor- and expert-parallel ranks, in
/// SplitParams' buckets. A split tensor's piece takes its share and its slack (StateCount).
struct SplitState {
    StateCount replicated, tensor, vocab, expert_replicated, expert_tensor;

    void add(const ParamRow& r, const StateCount& s) {
        StateCount& into = r.split == ParamSplit::vocab ? vocab
                           : r.split == ParamSplit::tensor
                               ? (r.expert ? expert_tensor : tensor)
                               : (r.expert ? expert_replicated : replicated);
        into = into + s;
    }
    /// One piece of `pieces` of each tensor summed in `s`.
    static StateCount piece(const StateCount& s, std::uint64_t pieces) {
        return {ceil_div(s.main, pieces), ceil_div(s.fallback, pieces),
                ceil_div(s.other, pieces) + (pieces > 1 ? s.slack : Count(0)), 0};
    }
    /// The dense tensors' share on a rank (a vocabulary row's elements by its ceil(V / tp)
    /// columns).
    StateCount on_rank(const Parallelism& p, std::uint64_t V) const {
        const StateCount columns{Count(vocab.main.value() / V) * ceil_div(V, p.tp),
                                 Count(vocab.fallback.value() / V) * ceil_div(V, p.tp), 0, 0};
        return replicated + piece(tensor, p.tp) + columns +
               piece({0, 0, vocab.other, vocab.slack}, p.tp);
    }
    /// The experts' share: expert parallelism deals whole experts out.
    StateCount experts_on_rank(const Parallelism& p) const {
        const StateCount of_rank = expert_replicated + piece(expert_tensor, p.expert_tp());
        return {ceil_div(of_rank.main, p.ep), ceil_div(of_rank.fallback, p.ep),
                ceil_div(of_rank.other, p.ep), 0};
    }
};

/// The trainable tensors' optimiser state under one recipe, by group as StateClass keeps the
/// counts.
struct OptimizerSplits {
    SplitState input, head, tied_embedding;
    std::array<SplitState, max_layer_kinds> per_layer;  ///< one layer of each kind
    StateCount total;                                   ///< the whole model's
};

/// A workspace's effect on its step (the tape's sweep: tape::RunEffect): on a rank it adds max(0,
/// added + the layer's gradients already written - covered - the layer's casts not made yet).
struct WorkspaceEffect {
    SplitBytes added, covered;
    SplitParams gradients;  ///< parameters of the layer whose gradients exist while it runs
    bool weightless =
        false;  ///< Workspace::weightless: no fresh gradient exists while it runs, held ones aside
    SplitParams
        uncast;  ///< forward: parameters of the layer whose autocast copies are not made yet
    /// A weightless backward op: parameters whose autocast copies their linears' backward has freed
    /// already.
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
/// layer's autocast copies (0 without autocast). With gradients held the step still counts the
/// layer's copies whole, so a weightless op takes off those its linears' backward freed (without,
/// each gradient written stands in for its weight's copy: the caller's).
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
                : (e.uncast.on_rank(p, V) + (fresh ? e.cast_freed.on_rank(p, V) : Count(0))) *
                      cast_bytes;
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

/// The gradient a later micro-batch's backward makes fresh of the layer's largest trainable row
/// `largest`: it and, for a linear's weight, its bias. A bias as the largest makes none, as when
/// these rows were found by name (a bias's name never was its own weight's): kept, not measured.
inline SplitParams fresh_gradient(const ParameterTable& t, const ParamRow& largest,
                                  std::uint64_t V) {
    SplitParams fresh;
    const bool counted = largest.role != ParamRole::bias;
    const Linear weight_of = largest.role == ParamRole::weight ? largest.linear : Linear::none;
    for (const auto& row : t.rows) {
        const bool its_bias = weight_of != Linear::none && row.group == Group::layer &&
                              row.kind == largest.kind && row.linear == weight_of &&
                              row.role == ParamRole::bias;
        if (row.trainable && ((counted && &row == &largest) || its_bias)) fresh.add(row, V);
    }
    return fresh;
}

/// The two largest parameter tensors of each kind (group, split, expert or not), and the first one
/// added, which the loop steps first. The for-loop optimiser's temporaries are two of the tensor
/// being stepped beside one of the tensor before it (measured), and each split gives a larger
/// tensor a share at least as large, so these few stand for every row.
struct LargestTensors {
    Count count[3][3][2][2] = {};  ///< [Group][ParamSplit][expert]: the largest, then the next
    struct First {
        Group group;
        ParamSplit split;
        Count n;
    };
    std::optional<First> first;  ///< in the table's order, the model's: the token embedding

    /// An expert row counts one expert: each is a tensor of its own. A layer's row stands for every
    /// layer of its kind, so it fills both places.
    void add(const ParamRow& r) {
        const Count n = r.expert ? Count(r.count.value() / *r.dims.begin()) : r.count;
        if (!first) first = First{r.group, r.split, n};
        Count(&top)[2] =
            count[static_cast<int>(r.group)][static_cast<int>(r.split)][r.expert ? 1 : 0];
        for (int copies = r.group == Group::layer || r.expert ? 2 : 1; copies > 0; --copies) {
            if (n > top[0])
                top[1] = top[0], top[0] = n;
            else if (n > top[1])
                top[1] = n;
        }
    }
};

/// Parameters that keep the same kind of state: the trainable ones (the recipe's dtypes, gradients,
/// master copy and optimiser state), or frozen ones in one storage (weights alone). ZeRO shards
/// each class's buffer on its own, so its padding stays exact.
struct StateClass {
    bool trainable = true;
    std::optional<Storage> storage;  ///< a frozen class's weights; none: the recipe's weight dtype
    SplitParams input, head;
    std::array<SplitParams, max_layer_kinds> per_layer;  ///< one layer of each kind
    SplitParams tied_embedding;  ///< the embedding rows of the head's group (tied models)
    Count total;                 ///< the whole model's
    Count stored;                ///< a storage's bytes of `total`, each tensor stored on its own

    bool holds(const ParamRow& r) const { return r.trainable == trainable && r.storage == storage; }
    /// Bytes of `n` of its weights: in a storage, the whole model's tensor by tensor, and a part of
    /// them its share of those (rounded up), never less than the part stored as one.
    Count weight_bytes(Count n, const Recipe& recipe) const {
        if (!storage) return n * recipe.weight_bytes();
        if (n == total) return stored;
        const long double share = static_cast<long double>(stored.value()) *
                                  static_cast<long double>(n.value()) /
                                  static_cast<long double>(total.value());
        return std::max(storage->bytes(n), Count(static_cast<std::uint64_t>(std::ceil(share))));
    }
    /// Adds `row`: its elements, and with a storage each of its tensors (an expert's each) as
    /// stored.
    void add(const ParamRow& row, Count in_model) {
        total += in_model;
        if (!storage) return;
        const std::uint64_t per_tensor = row.count.value() / (row.expert ? *row.dims.begin() : 1);
        stored += storage->tensor_bytes(Count(per_tensor)) * (in_model.value() / per_tensor);
    }
};

/// What a workload takes from the parameter table, whatever the sequence, micro-batch or
/// recomputation: a sweep or a plan builds it once per model.
struct ParameterSplits {
    /// classes[0] is the trainable one (empty when everything is frozen); then one per frozen
    /// storage.
    std::vector<StateClass> classes;
    /// Into held gradients a weight's fresh gradient is new until autograd adds it in; which one is
    /// alive at a workspace's peak is not always the op's own (measured), so the layer's largest
    /// (by kind).
    std::array<SplitParams, max_layer_kinds> fresh_gradient;
    LargestTensors largest;  ///< of the trainable tensors: the for-loop optimiser steps those
    /// optimizer_splits of an optimiser that keeps whole slots of every tensor (Adam, SGD, Lion),
    /// which is the same whatever their number or dtype: made once per model, not once per
    /// workload.
    OptimizerSplits every_tensor_state;
    /// The tensors autocast casts to the compute dtype (autocast_casts): one layer of each kind's,
    /// the head's.
    std::array<SplitParams, max_layer_kinds> cast_per_layer;
    SplitParams cast_head;
    /// One layer of each kind's linear weights, biases and router aside: narrow (fp8) linears keep
    /// casts of them.
    std::array<SplitParams, max_layer_kinds> linear_weights;
    LargestTensors
        largest_outside_matrices;  ///< of those but the layers' matrices: Muon's AdamW steps them
    /// Of the trainable layers' matrices, one tensor each: the largest Newton-Schulz work's
    /// dimensions, and the elements of the two largest (Muon orthogonalises one beside the previous
    /// one's update).
    std::uint64_t matrix_rows = 0, matrix_cols = 0;
    Count matrix_elements[2];
    ParameterTable
        table;  ///< the rows themselves: a workspace names the first whose gradient exists
    LayerPattern pattern;  ///< which kind each layer is

    const StateClass& trainable() const { return classes.front(); }

    void add_matrix(const ParamRow& r) {
        const std::uint64_t* d = r.dims.end() - 2;
        if (newton_schulz_bytes(d[0], d[1]) > newton_schulz_bytes(matrix_rows, matrix_cols))
            matrix_rows = d[0], matrix_cols = d[1];
        const Count n = tensor_elements(r);
        for (int copies = 2; copies > 0; --copies) {  // a layer's stands for every layer's
            if (n > matrix_elements[0])
                matrix_elements[1] = matrix_elements[0], matrix_elements[0] = n;
            else if (n > matrix_elements[1])
                matrix_elements[1] = n;
        }
    }
};

/// Whether autocast casts the tensor for a matmul: the linear layers' weights and biases, the
/// head's matrix (a tied embedding's too). Embedding lookups and norms run in the weights' own
/// dtype.
inline bool autocast_casts(const ParamRow& r) {
    switch (r.part) {
        case Part::attention:
        case Part::mlp:
        case Part::router:
        case Part::head:
        case Part::adapter: return true;
        case Part::embedding: return r.group == Group::head;
        case Part::norms:
        case Part::final_norm: return false;
    }
    return false;
}

/// Whether autocast makes a copy of the tensor: a 4-bit weight is dequantised by its own kernel
/// instead.
inline bool autocast_copies(const ParamRow& r) { return autocast_casts(r) && !r.storage; }

/// Whether the tensor is the weight of one of a layer's Transformer Engine linear layers: a matrix
/// of the attention or the MLP (experts too). Megatron-LM's router is a plain torch layer.
inline bool te_linear_weight(const ParamRow& r) {
    return layer_matrix(r) && (r.part == Part::attention || r.part == Part::mlp);
}

/// The trainable tensors' optimiser state under optimiser `o` with state dtype `state`, by group,
/// added to `splits` (which a model's splits fill in place: a kilobyte returned is a kilobyte
/// copied).
inline void add_optimizer_state(OptimizerSplits& splits, const ParameterTable& table,
                                const Optimizer& o, DType state) {
    for (const auto& row : table.rows) {
        if (!row.trainable) continue;
        const StateCount s = tensor_state(o, state, row);
        splits.total =
            splits.total + Count(row.group == Group::layer ? table.kind_layers[row.kind] : 1) * s;
        switch (row.group) {
            case Group::input: splits.input.add(row, s); break;
            case Group::layer: splits.per_layer[row.kind].add(row, s); break;
            case Group::head:
                splits.head.add(row, s);
                if (row.part == Part::embedding) splits.tied_embedding.add(row, s);
                break;
        }
    }
}

/// The trainable tensors' optimiser state under optimiser `o` with state dtype `state`, by group.
inline OptimizerSplits optimizer_splits(const ParameterTable& table, const Optimizer& o,
                                        DType state) {
    OptimizerSplits splits;
    add_optimizer_state(splits, table, o, state);
    return splits;
}

/// `table` by value: a caller done with its table moves it in, and no copy is made.
inline std::shared_ptr<const ParameterSplits> parameter_splits(ParameterTable table,
                                                               std::uint64_t V) {
    auto made = std::make_shared<ParameterSplits>();
    ParameterSplits& splits = *made;
    splits.table = std::move(table);
    const ParameterTable& params = splits.table;
    if (!params.runs.empty())
        splits.pattern = LayerPattern(params.runs, params.kinds);  // else one kind
    splits.classes.emplace_back();                           // the trainable class, always first
    std::array<const ParamRow*, max_layer_kinds> largest{};  // of each kind's layer
    for (const auto& row : params.rows) {
        if (row.trainable && row.storage)
            throw error("tensor " + std::string(row.tensor) +
                        " is trainable: only a frozen tensor has a storage of its own");
        auto c = std::find_if(splits.classes.begin(), splits.classes.end(),
                              [&](const StateClass& k) { return k.holds(row); });
        if (c == splits.classes.end()) {
            StateClass frozen;
            frozen.trainable = false, frozen.storage = row.storage;
            c = splits.classes.insert(splits.classes.end(), frozen);
        }
        c->add(row, params.in_model(row));
        if (row.trainable) {
            splits.largest.add(row);
            if (!layer_matrix(row))
                splits.largest_outside_matrices.add(row);
            else
                splits.add_matrix(row);
        }
        // A 4-bit weight is dequantised by its own kernel, not cast by autocast (the layer's
        // workspace).
        if (autocast_copies(row))
            (row.group == Group::layer ? splits.cast_per_layer[row.kind] : splits.cast_head)
                .add(row, V);
        if (te_linear_weight(row)) splits.linear_weights[row.kind].add(row, V);
        switch (row.group) {
            case Group::input: c->input.add(row, V); break;
            case Group::layer: {
                c->per_layer[row.kind].add(row, V);
                const ParamRow*& most = largest[row.kind];
                if (row.trainable && (most == nullptr || row.count > most->count)) most = &row;
                break;
            }
            case Group::head:
                c->head.add(row, V);
                if (row.part == Part::embedding) c->tied_embedding.add(row, V);
                break;
        }
    }
    for (std::size_t k = 0; k < params.kinds; ++k)
        if (largest[k] != nullptr)
            splits.fresh_gradient[k] = fresh_gradient(params, *largest[k], V);
    add_optimizer_state(splits.every_tensor_state, params, adam, DType::fp32);
    return made;
}

/// The trainable tensors' optimiser state under `recipe`, by group. An optimiser that keeps whole
/// slots of every tensor shares the model's own (every_tensor_state): a kilobyte not copied per
/// workload.
inline std::shared_ptr<const OptimizerSplits> optimizer_splits(
    const std::shared_ptr<const ParameterSplits>& splits, const Recipe& recipe) {
    if (recipe.optimizer.uniform_bytes(recipe.state)) return {splits, &splits->every_tensor_state};
    return std::make_shared<const OptimizerSplits>(
        optimizer_splits(splits->table, recipe.optimizer, recipe.state));
}

/// The whole model's state, unsharded: each class's.
inline TrainingState model_state(const ParameterSplits& splits, const Recipe& recipe) {
    TrainingState total;
    const StateCount state =
        recipe.optimizer.uniform_bytes(recipe.state)
            ? splits.every_tensor_state.total
            : optimizer_splits(splits.table, recipe.optimizer, recipe.state).total;
    const Count optimizer = state_bytes(recipe.optimizer, recipe.state, state);
    for (const StateClass& c : splits.classes) {
        TrainingState s;
        if (c.trainable)
            s = training_state(c.total, recipe, optimizer);
        else
            s.weights = c.weight_bytes(c.total, recipe);
        total = total + s;
    }
    return total;
}

/// One kind of layer's share of a workload, one layer of one micro-batch.
struct LayerWork {
    SplitBytes kept, rebuilt;  ///< under the recomputation
    /// Selective recomputation rebuilds the MLP half apart from the attention half (`rebuilt`): a
    /// backward step holds the larger.
    SplitBytes rebuilt_mlp_half;
    std::vector<WorkspaceEffect> forward_work, backward_work;  ///< its workspaces
    SplitBytes
        rerun_gradients;  ///< its checkpoint's CheckpointHeld::rerun tensors, where it has one
    bool keeps_input =
        false;  ///< it keeps its input tensor itself (a LayerNorm's saved input, a checkpoint)
};

struct Workload {
    Architecture model;
    Recipe recipe;
    std::uint64_t seq = 0, micro_batch = 1;
    std::vector<LayerWork> layers;  ///< by kind of layer
    SplitBytes input_side, head;    ///< what the embedding side and the head save
    SplitBytes
        stage_side;  ///< what every pipeline stage builds for its layers (SavedTensor::every_stage)
    SplitBytes forward_buffers;  ///< built by the forward pass for all its layers (the causal mask)
    Recompute recompute = Recompute::none;
    /// The architecture model: tensors live as autograd orders them (the head's backward frees the
    /// logits' gradient; the embedding's backward writes a whole table's gradient after layer 1's).
    bool autograd_order = false;
    Framework framework;  ///< how the framework runs the step: its optimiser step, gradients, loss
                          ///< and logits
    std::shared_ptr<const ParameterSplits>
        parameters;  ///< the model's, shared by all its workloads
    std::shared_ptr<const OptimizerSplits>
        optimizer_state;  ///< the trainable tensors' under the recipe
    SplitBytes
        kv_cache;  ///< per layer: the k and v the model's output keeps beyond what backward saves
    SplitBytes kv_cache_whole;  ///< per layer: all of it, once the layer's backward has freed what
                                ///< it saved
    /// Under full recomputation, each kind's layer under none as well: partial recomputation
    /// (Parallelism::recompute_layers) runs the layers past the first N of each chunk so.
    std::vector<LayerWork> not_recomputed;
    SplitBytes kv_cache_not_recomputed;  ///< kv_cache under none
    /// By kind, one layer of one micro-batch: what a deferred weight-gradient pass reads
    /// (weight_pass_reads).
    std::vector<SplitBytes> weight_pass_reads;
};

/// What the weight-gradient pass (W) of one layer of kind `kind` reads, one micro-batch of `tokens`
/// tokens: each trainable linear's input and its output's gradient, in the compute dtype (`bytes`).
/// Zero-bubble schedules hold them from the input-gradient pass until W. Of a tensor-parallel
/// linear, the side Megatron-LM splits is 1 / tp and the other whole on every rank (under sequence
/// parallelism W reads the gathered input, as its deferred weight-gradient store keeps it): the
/// input of a row-parallel one (linear_rows), the output of the others; a linear the table does not
/// split (LinearRow::tuned: Mamba's, an adapter's) is split but on the model's width. Experts read
/// their tokens' k slots.
inline SplitBytes weight_pass_reads(const Architecture& m, const ParameterTable& table,
                                    std::size_t kind, std::uint64_t tokens, std::uint64_t bytes) {
    SplitBytes reads;
    const std::uint64_t slots = tokens * m.kind_view(kind).active_experts();
    for (const ParamRow& row : table.rows) {
        if (row.group != Group::layer || row.kind != kind || !row.trainable ||
            tensor_dims(row) != 2)
            continue;
        if (row.part == Part::norms || row.part == Part::final_norm) continue;
        const std::uint64_t* d = row.dims.end() - 2;  // in x out
        // An adapter's matrix is no linear of the table: split by its widths.
        const LinearRow& linear =
            linear_row(row.role == ParamRole::weight ? row.linear : Linear::none);
        const ActivationSplit split =
            row.expert ? ActivationSplit::expert_tensor : ActivationSplit::tensor;
        for (int out = 0; out < 2; ++out) {
            const bool cut =
                row.split == ParamSplit::tensor &&
                (linear.tuned ? linear.row_parallel == (out == 0) : d[out] != m.hidden);
            reads.add(cut ? split : ActivationSplit::replicated,
                      Count(row.expert ? slots : tokens) * d[out] * bytes);
        }
    }
    return reads;
}

namespace detail {

/// What a workspace of `layer` is to its step besides its bytes: the gradients and casts that exist
/// while it runs (from linear `written`'s gradient on; from linear `uncast`'s cast on, not made).
inline WorkspaceEffect workspace_facts(const Workspace& work, Linear written, Linear uncast,
                                       const ParameterTable& params, std::uint64_t V,
                                       std::size_t kind) {
    WorkspaceEffect e;
    e.gradients = gradients_from(params, written, V, false, kind);
    e.weightless = work.weightless();
    e.uncast = tensors_from(params, uncast, V, false, kind, autocast_copies);
    if (work.weightless())
        e.cast_freed = tensors_from(params, written, V, false, kind, autocast_copies);
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
    for (const tape::RunEffect& run : live.runs) {  // in the tape's order
        const Workspace& work = layer.work[run.source];
        WorkspaceEffect e =
            detail::workspace_facts(work, written[run.source], uncast[run.source], params, V, kind);
        e.added = run.added, e.covered = run.covered, e.source = run.source;
        (work.backward ? lw.backward_work : lw.forward_work).push_back(e);
    }
    for (const SavedTensor& row : layer.rows)
        if (row.kept(mode) && row.layer_input) lw.keeps_input = true;
    if (checkpoints_layer(mode)) {
        lw.keeps_input = true;
        for (const CheckpointTensor& t : layer.checkpoint_tensors)
            if (t.held == CheckpointHeld::rerun) lw.rerun_gradients.add(t);
    }
    return lw;
}

/// The saved-tensor tables of one workload, whole (not split across ranks). The formula model has
/// only the layer's; the architecture model also the embedding side's, the head's, the forward
/// pass's buffers and the layer's workspaces.
struct ActivationTables {
    LayerActivations layer;  ///< one layer of the first kind (every layer, with one kind)
    std::vector<LayerActivations> other_kinds;  ///< one layer of each further kind
    std::vector<SavedTensor> input_side, head, forward_buffers;

    /// One layer of kind `kind`.
    const LayerActivations& of_kind(std::size_t kind) const {
        return kind == 0 ? layer : other_kinds[kind - 1];
    }
};

/// `precision`: the recipe's compute dtype, which the activations are stored in, and its stream's
/// (Recipe::precision); `f`: the framework's kernels (its attention, platform and loss).
/// `modules`: what selective recomputation checkpoints (select_modules).
/// `tunings`: what fine-tuning changes in each kind of layer (layer_tuning); empty: every weight
/// trains.
inline ActivationTables activation_tables(const Architecture& m, std::uint64_t s, std::uint64_t b,
                                          Precision precision, ActivationModel model,
                                          const Framework& f = {}, ModuleSet modules = {},
                                          const std::vector<LayerTuning>& tunings = {}) {
    const Attention attention = f.attention;
    const Platform platform = f.platform;
    const auto tuning = [&](std::size_t kind) {
        return tunings.empty() ? LayerTuning{} : tunings[kind];
    };
    const auto layer = [&](const Architecture& view, std::size_t kind) {
        if (model == ActivationModel::korthikanti)
            return view.mixer == Mixer::mamba
                       ? korthikanti_mamba_layer(view, s, b, bytes_per_element(precision.compute))
                       : korthikanti_layer(view, s, b, bytes_per_element(precision.compute));
        if (f.moe == MoeKernel::grouped_gemm && view.expert_dispatch != ExpertDispatch::routed) {
            Architecture routed =
                view;  // the framework's grouped GEMM in place of the model's code
            routed.expert_dispatch = ExpertDispatch::routed;
            return architecture_layer(routed, s, b, precision, attention, platform, modules,
                                      tuning(kind));
        }
        return architecture_layer(view, s, b, precision, attention, platform, modules,
                                  tuning(kind));
    };
    ActivationTables t;
    if (m.layer_kinds.empty())
        t.layer = layer(m, 0);  // the model itself, not a copy
    else
        t.layer = layer(m.kind_view(0), 0);
    for (std::size_t k = 1; k < m.kind_count(); ++k)
        t.other_kinds.push_back(layer(m.kind_view(k), k));
    if (model == ActivationModel::architecture) {
        t.input_side = input_side_saved(m, s, b, precision, platform);
        t.head = head_saved(m, s, b, precision, platform, f.loss, tuning(0));
        t.forward_buffers =
            forward_buffers(s, b, precision, attention, m.causal_mask_buffer, m.distinct_windows());
    }
    return t;
}

/// `t`: the whole model's tables (not split across ranks).
inline Workload make_workload(const Architecture& m, const Recipe& recipe, std::uint64_t seq,
                              std::uint64_t micro_batch, Recompute mode,
                              std::shared_ptr<const ParameterSplits> params,
                              const ActivationTables& t, const Framework& framework = {}) {
    Workload w{m,    recipe,          seq,       micro_batch,       {}, {}, {}, {}, {},
               mode, !t.head.empty(), framework, std::move(params), {}, {}, {}, {}, {},
               {}};
    const auto cache = [&](Recompute under, SplitBytes& into) {
        if (framework.kv_cache == KvCache::kept)
            for (const auto& row :
                 kv_cache_rows(m, seq, micro_batch, recipe.precision(), framework.attention, under))
                into.add(row);
    };
    cache(mode, w.kv_cache);
    cache(Recompute::full, w.kv_cache_whole);  // a checkpointed layer saves none of it
    w.optimizer_state = optimizer_splits(w.parameters, recipe);
    const std::uint64_t V = m.vocab;
    for (const auto& row : t.forward_buffers) w.forward_buffers.add(row);
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        w.layers.push_back(layer_work(t.of_kind(k), mode, w.parameters->table, V, k));
        w.weight_pass_reads.push_back(weight_pass_reads(
            m, w.parameters->table, k, seq * micro_batch, recipe.activation_bytes()));
    }
    if (mode == Recompute::full) {
        cache(Recompute::none, w.kv_cache_not_recomputed);
        for (std::size_t k = 0; k < m.kind_count(); ++k)
            w.not_recomputed.push_back(
                layer_work(t.of_kind(k), Recompute::none, w.parameters->table, V, k));
    }
    for (const auto& row : t.input_side) (row.every_stage ? w.stage_side : w.input_side).add(row);
    for (const auto& row : t.head) w.head.add(row);
    return w;
}

/// Parameters on one rank of a stage, by group: after tensor, expert and pipeline splits.
struct RankParams {
    Count input, head;
    std::array<Count, max_layer_kinds> per_layer{};          ///< one layer of each kind
    std::array<Count, max_layer_kinds> per_layer_experts{};  ///< the experts' part of per_layer

    /// With `n` layers of each of `kinds` kinds.
    Count total(const KindCounts& n, std::size_t kinds) const {
        return input + layers(n, kinds, per_layer) + head;
    }
    Count experts(const KindCounts& n, std::size_t kinds) const {
        return layers(n, kinds, per_layer_experts);
    }
    static Count layers(const KindCounts& n, std::size_t kinds,
                        const std::array<Count, max_layer_kinds>& each) {
        Count sum;
        for (std::size_t k = 0; k < kinds; ++k) sum += Count(n[k]) * each[k];
        return sum;
    }
};

inline RankParams rank_params(const StateClass& groups, const Parallelism& p, std::uint64_t V,
                              std::size_t kinds, bool first, bool last) {
    RankParams r;
    for (std::size_t k = 0; k < kinds; ++k) {
        r.per_layer[k] = groups.per_layer[k].on_rank(p, V);
        r.per_layer_experts[k] = groups.per_layer[k].experts_on_rank(p);
    }
    if (first) r.input = groups.input.on_rank(p, V);
    if (last) r.head = groups.head.on_rank(p, V);
    // A tied embedding is also the head's matrix: across stages the first keeps its own copy.
    if (first && !last) r.input += groups.tied_embedding.on_rank(p, V);
    return r;
}

/// The layers pipeline stage `stage` runs, with the model's pattern of kinds.
inline StageLayers stage_layers(const Workload& w, const Parallelism& p, std::uint64_t stage) {
    const std::uint64_t L = w.model.layers;
    StageLayers s;
    const bool one_chunk = chunks_per_rank(p) == 1;
    s.chunk = one_chunk ? stage_layer_count(p, L, stage) : L / model_chunks(p);
    s.layers = s.chunk * chunks_per_rank(p);
    s.first_layer = one_chunk ? stage_first_layer(p, L, stage) : 0;
    if (schedule_row(p).mirrored) s.mirrored_chunks = model_chunks(p);
    s.pp = p.pp;
    s.stage = stage;
    s.with(w.parameters->pattern);
    if (p.recompute_layers) s.recomputing(*p.recompute_layers);
    return s;
}

/// The model's layers of each kind whose forward reruns in backward under partial recomputation
/// (Parallelism::recompute_layers): the first N of each stage's chunks. A micro-batch runs through
/// one copy of each chunk where the schedule keeps two (DualPipe): the ranks' sum, over the copies.
inline KindCounts recomputed_layers(const Workload& w, const Parallelism& p) {
    KindCounts sum{};
    for (std::uint64_t stage = 0; stage < p.pp; ++stage) {
        const StageLayers s = stage_layers(w, p, stage);
        const KindCounts c = s.recomputed_counts(s.layers);
        for (std::size_t k = 0; k < max_layer_kinds; ++k) sum[k] += c[k];
    }
    for (std::uint64_t& n : sum) n /= schedule_row(p).parameter_copies;
    return sum;
}

/// What one rank of pipeline stage `stage` holds apart from its timeline.
struct StageFacts {
    std::uint64_t stage = 0, in_flight = 1;
    std::uint64_t later_in_flight =
        1;               ///< at a later micro-batch's backward (in_flight(p, stage, true))
    StageLayers layers;  ///< its layers, and how many of each kind (kind_layers)
    KindCounts kind_layers{};
    RankParams all;        ///< parameters by group on this rank, every class
    RankParams trainable;  ///< the same of the trainable parameters: those with gradients
    Count trainable_dense,
        trainable_experts;  ///< all of them on this rank, outside and inside experts
    /// One layer's weights of each kind on this rank, each class in its storage; and those in a
    /// storage of their own, in the recipe's weight dtype.
    std::array<Count, max_layer_kinds> layer_weight_bytes{};
    Count parameters;            ///< on this rank: after tensor, expert and pipeline splits
    Count expert_parameters;     ///< the experts' part of them
    TrainingState state;         ///< on the device, after ZeRO sharding and offload
    Count host;                  ///< what offload keeps in host memory
    Count host_optimizer_state;  ///< the master copy and optimiser state of it, which the host's
                                 ///< step updates
    Count host_weights;  ///< the weights' part of it (parameter offload): fetched for each use
    /// Activation offload: one micro-batch's kept activations of this rank's layers, which go to
    /// the host after each layer's forward and come back for its backward (host counts every
    /// micro-batch in flight).
    Count offloaded_activations;

    /// This rank's ZeRO shard of `dense` and `experts` parameters, each over its own group.
    static Count shard(const Parallelism& p, Count dense, Count experts) {
        return ceil_div(dense, p.dense_shards()) + ceil_div(experts, p.expert_shards());
    }
};

/// Micro-batches (several chunks per rank: model chunks) a stage holds activations of beside the
/// one running.
inline std::uint64_t other_in_flight(const Parallelism& p, std::uint64_t in_flight) {
    const std::uint64_t chunks = chunks_per_rank(p);
    if (chunks == 1) return in_flight > 1 ? in_flight - 1 : 0;
    return in_flight > chunks ? in_flight - chunks : 0;
}

/// What those hold: 1F1B keeps whole micro-batches (`stage`: one micro-batch's on the stage),
/// schedules of several chunks per rank model chunks (`chunk`: one's, its layers of whichever kinds
/// each counted as the stage's largest, leaning high where kinds differ).
inline Count other_microbatches_kept(const Parallelism& p, std::uint64_t in_flight, Count stage,
                                     Count chunk) {
    const std::uint64_t others = other_in_flight(p, in_flight);
    return Count(others) * (chunks_per_rank(p) == 1 ? stage : chunk);
}

/// One class's state on a rank: the recipe's for trainable parameters; a frozen class's weights
/// alone, which ZeRO-3 shards as it shards every weight.
inline TrainingState class_state(const StateClass& c, Count dense, Count experts, const Recipe& r,
                                 const Parallelism& p) {
    if (c.trainable)
        return sharded_state(dense, r, p.zero, p.dense_shards()) +
               sharded_state(experts, r, p.zero, p.expert_shards());
    const auto held = [&](Count n, std::uint64_t shards) {
        return p.zero >= 3 ? ceil_div(n, shards) : n;
    };
    TrainingState s;
    s.weights = c.weight_bytes(held(dense, p.dense_shards()), r) +
                c.weight_bytes(held(experts, p.expert_shards()), r);
    return s;
}

/// The trainable tensors' optimiser state on one rank: their pieces after tensor, expert and
/// pipeline splits, then its ZeRO shard, the dense tensors' and the experts' each over its own
/// group.
inline Count rank_optimizer_state(const Workload& w, const Parallelism& p, std::uint64_t stage,
                                  const KindCounts& layers) {
    const OptimizerSplits& o = *w.optimizer_state;
    const std::uint64_t V = w.model.vocab;
    const bool first = holds_embedding(p, stage), last = holds_head(p, stage);
    StateCount dense, experts;
    if (first) dense = dense + o.input.on_rank(p, V);
    if (last) dense = dense + o.head.on_rank(p, V);
    if (first && !last)
        dense = dense + o.tied_embedding.on_rank(p, V);  // the first stage's own copy (rank_params)
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        if (layers[k] == 0) continue;
        dense = dense + Count(layers[k]) * o.per_layer[k].on_rank(p, V);
        experts = experts + Count(layers[k]) * o.per_layer[k].experts_on_rank(p);
    }
    const bool zero = p.zero >= 1;
    const Optimizer& opt = w.recipe.optimizer;
    return state_bytes(opt, w.recipe.state, dense, zero, zero ? p.dense_shards() : 1) +
           state_bytes(opt, w.recipe.state, experts, zero, zero ? p.expert_shards() : 1);
}

/// The buffers one layer's modules register beside its weights, in the weights' dtype (nn.Module.to
/// casts floating buffers with the parameters), whole on every rank: nanoGPT's causal mask,
/// max_positions^2 per layer, which its flash path never registers; a per-layer rotary embedding's
/// inv_freq (head_dim / 2), and with its caches cos and sin of max_positions x head_dim. A sequence
/// longer than the caches has transformers rebuild them at its length in the compute dtype.
inline Count registered_buffer_bytes(const Architecture& m, const Recipe& r, const Framework& f,
                                     std::uint64_t seq) {
    Count bytes = 0;
    if (m.causal_mask_buffer == CausalMaskBuffer::per_layer && f.attention != Attention::flash)
        bytes += Count(m.max_positions) * m.max_positions * bytes_per_element(r.weights);
    const RotaryEmbeddingRow& rotary = rotary_embedding(m.rotary_embedding);
    if (m.position != Position::rotary || !rotary.per_layer_tables) return bytes;
    const std::uint64_t d = m.rotary_dim();
    bytes += Count(d / 2) * bytes_per_element(r.weights);
    if (rotary.cached) {
        const bool grown = seq > m.max_positions;
        bytes += Count(2) * (grown ? seq : m.max_positions) * d *
                 bytes_per_element(grown ? r.precision().compute : r.weights);
    }
    return bytes;
}

/// ZeRO-Offload (DeepSpeed): the CPU steps the fp32 master copy and the optimiser state from host
/// memory, reading an fp32 copy of this rank's gradient shard there. With partitioned gradients
/// (ZeRO-2/3) each reduced shard goes to the host as backward makes it, and the device keeps only
/// the bucket in flight; ZeRO-1 keeps its gradients on the device until the step. Offloaded
/// parameters go to the host too.
inline void offload_state(StageFacts& f, const Parallelism& p) {
    f.host_optimizer_state = f.state.master_weights + f.state.optimizer_state;
    f.host = f.host_optimizer_state +
             StageFacts::shard(p, f.trainable_dense, f.trainable_experts) * dtype::fp32;
    f.state.master_weights = f.state.optimizer_state = 0;
    if (p.zero >= 2) f.state.gradients = 0;
    if (p.offload == Offload::parameters) {
        f.host += f.state.weights;
        f.host_weights = f.state.weights;
        f.state.weights = 0;
    }
}

/// Activation offload: the host holds what the device would have kept of every layer: each
/// micro-batch in flight's.
inline void offload_activations(StageFacts& f, const Workload& w, const Parallelism& p) {
    const std::uint64_t V = w.model.vocab;
    Count most;  // of one layer, over the kinds this stage runs
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        if (f.kind_layers[k] == 0) continue;
        // Partial recomputation: each layer counted as one that keeps everything (leaning high on
        // the host).
        const Count layer =
            p.recompute_layers && k < w.not_recomputed.size()
                ? std::max(w.layers[k].kept.on_rank(p, V), w.not_recomputed[k].kept.on_rank(p, V))
                : w.layers[k].kept.on_rank(p, V);
        f.offloaded_activations += Count(f.kind_layers[k]) * layer;
        most = std::max(most, layer);
    }
    f.host +=
        f.offloaded_activations + other_microbatches_kept(p, f.in_flight, f.offloaded_activations,
                                                          Count(f.layers.chunk) * most);
}

/// Each state class's parameters on this stage's rank, summed, and the state they keep.
inline void add_parameters(StageFacts& f, const Workload& w, const Parallelism& p) {
    const std::uint64_t V = w.model.vocab;
    const std::size_t kinds = w.layers.size();
    const bool first = holds_embedding(p, f.stage), last = holds_head(p, f.stage);
    for (const StateClass& c : w.parameters->classes) {
        const RankParams r = rank_params(c, p, V, kinds, first, last);
        const Count total = r.total(f.kind_layers, kinds),
                    experts = r.experts(f.kind_layers, kinds);
        const Count dense = Count(total.value() - experts.value());
        if (c.trainable) f.trainable = r, f.trainable_dense = dense, f.trainable_experts = experts;
        f.all.input += r.input, f.all.head += r.head;
        for (std::size_t k = 0; k < kinds; ++k) {
            f.all.per_layer[k] += r.per_layer[k],
                f.all.per_layer_experts[k] += r.per_layer_experts[k];
            f.layer_weight_bytes[k] += c.weight_bytes(r.per_layer[k], w.recipe);
        }
        f.parameters += total, f.expert_parameters += experts;
        f.state = f.state + class_state(c, dense, experts, w.recipe, p);
    }
}

/// Flattened, as stage_inputs is.
[[gnu::flatten]] inline StageFacts stage_facts(const Workload& w, const Parallelism& p,
                                               std::uint64_t stage) {
    StageFacts f;
    f.stage = stage;
    f.in_flight = in_flight(p, stage);
    if (p.steps_per_batch() > 1) f.later_in_flight = in_flight(p, stage, true);
    f.layers = stage_layers(w, p, stage);
    f.kind_layers = f.layers.counts(f.layers.layers);
    add_parameters(f, w, p);
    f.state.optimizer_state = rank_optimizer_state(w, p, stage, f.kind_layers);
    if (p.offload != Offload::none) offload_state(f, p);
    if (p.offload_activations) offload_activations(f, w, p);
    // The program's own buffers stay on the device, counted with the weights.
    f.state.weights +=
        registered_buffer_bytes(w.model, w.recipe, w.framework, w.seq) * Count(f.layers.layers);
    return f;
}

/// The tensors a one-at-a-time optimiser loop steps on this rank, by its share of each: the one
/// stepped first, the largest that may follow it, and the two largest but the first.
struct LoopTensors {
    Count head_of_loop;  ///< the first tensor stepped (the token embedding), if this rank holds it
    Count after_lead;    ///< the largest that may come right after it
    Count others[2];     ///< the two largest but the first, of every group held
};

inline LoopTensors loop_tensors(const Workload& w, const Parallelism& p, const StageFacts& f,
                                bool muon) {
    const bool first = holds_embedding(p, f.stage), last = holds_head(p, f.stage);
    const std::uint64_t V = w.model.vocab;
    const LargestTensors& most =
        muon ? w.parameters->largest_outside_matrices : w.parameters->largest;
    const auto held = [&](Group group) {
        return !(group == Group::input && !first) && !(group == Group::head && !last) &&
               !(group == Group::layer && f.layers.layers == 0);
    };
    const auto share = [&](Count n, ParamSplit split) {  // this rank's part of a tensor of n
        if (split == ParamSplit::tensor) return ceil_div(n, p.tp);
        if (split == ParamSplit::vocab) return Count(n.value() / V) * ceil_div(V, p.tp);
        return n;
    };
    // The tensor stepped first has none before it: the token embedding, whose share is left out of
    // the others' once. The one after it is the input side's next or the first layer's first
    // tensor.
    const LargestTensors::First* lead = muon || !most.first ? nullptr : &*most.first;
    LoopTensors l;
    l.head_of_loop = lead && held(lead->group) ? share(lead->n, lead->split) : Count(0);
    bool lead_left_out = l.head_of_loop == Count(0);
    for (Group group : {Group::input, Group::layer, Group::head}) {
        if (!held(group)) continue;
        for (ParamSplit split : {ParamSplit::replicated, ParamSplit::tensor, ParamSplit::vocab})
            for (int expert = 0; expert < 2; ++expert)
                for (Count n :
                     most.count[static_cast<int>(group)][static_cast<int>(split)][expert]) {
                    if (n == 0) continue;
                    n = share(n, split);
                    if (!lead_left_out && lead->group == group && n == l.head_of_loop) {
                        lead_left_out = true;
                        continue;
                    }
                    if (group != Group::head) l.after_lead = std::max(l.after_lead, n);
                    if (n > l.others[0])
                        l.others[1] = l.others[0], l.others[0] = n;
                    else if (n > l.others[1])
                        l.others[1] = n;
                }
    }
    return l;
}

/// One tensor at a time: the row's copies of the tensor stepped, while the loop's variable still
/// holds the previous tensor's update (measured with torch.optim.AdamW on CPU). Muon's AdamW steps
/// the tensors outside the layers' matrices in its own groups' order (its example's: the head, then
/// the embedding; measured, validation/optimizer_state.py), not the model's: none stands first
/// alone.
inline Count for_loop_step_work(const Workload& w, const Parallelism& p, const StageFacts& f) {
    const Optimizer& o = w.recipe.optimizer;
    const std::uint64_t t = w.recipe.step_temporary_bytes();
    const bool muon = o.step == StepWork::newton_schulz;
    const LoopTensors l = loop_tensors(w, p, f, muon);
    // Which tensor comes before another depends on the program's parameter groups (transformers'
    // Trainer steps the norms and biases apart, so its head follows the last layer's matrix), so
    // the next largest stands for it, leaning high.
    Count work =
        std::max({l.head_of_loop * o.copies, l.after_lead * o.copies + l.head_of_loop * o.previous,
                  l.others[0] * o.copies + l.others[1] * o.previous}) *
        t;
    // transformers' Adafactor steps fp32 copies of a narrower weight and its gradient.
    const DType stepped = w.recipe.master.value_or(w.recipe.weights);
    if (o.upcast && bytes_per_element(stepped) < dtype::fp32)
        work += std::max(l.head_of_loop, l.others[0]) * (2 * dtype::fp32);
    if (muon && f.layers.layers > 0) {
        // Newton-Schulz on the largest matrix whole, beside the previous matrix's bf16 update; a
        // split one is gathered first (Moonlight's distributed Muon, Megatron-LM's duplicated
        // mode).
        const ParameterSplits& s = *w.parameters;
        Count ns =
            newton_schulz_bytes(s.matrix_rows, s.matrix_cols) + s.matrix_elements[1] * dtype::bf16;
        if (p.tp > 1 || p.zero >= 1) ns += Count(s.matrix_rows) * s.matrix_cols * t;
        work = std::max(work, ns);
    }
    return work;
}

/// The optimiser step's temporaries on one rank: none when it is fused or runs on the host. The
/// optimiser's own code decides where it has one (bitsandbytes' kernel, a Python loop), else the
/// framework's switch.
inline Count optimizer_step_work(const Workload& w, const Parallelism& p, const StageFacts& f) {
    const Optimizer& o = w.recipe.optimizer;
    const std::uint64_t t = w.recipe.step_temporary_bytes();
    const OptimizerImpl impl = o.own_impl.value_or(w.framework.optimizer);
    if (t == 0 || impl == OptimizerImpl::fused || p.offload != Offload::none) return 0;
    switch (impl) {
        case OptimizerImpl::fused: return 0;
        case OptimizerImpl::foreach: {  // every parameter whose state this rank holds, at once
            const Count dense = f.trainable_dense, experts = f.trainable_experts;
            return (p.zero >= 1 ? StageFacts::shard(p, dense, experts) : dense + experts) * t;
        }
        case OptimizerImpl::for_loop: return for_loop_step_work(w, p, f);
    }
    return 0;
}

// stage_inputs' pieces, in the order it calls them: each fills its part of a stage's inputs.

/// What a stage holds whatever its steps: its layers, its state, the k/v cache, narrow linears'
/// weight casts.
inline void set_stage_state(TimelineInputs& in, const Workload& w, const Parallelism& p,
                            const StageFacts& f) {
    const std::uint64_t V = w.model.vocab;
    static_cast<StageLayers&>(in) = f.layers;
    in.loss = holds_head(p, f.stage);
    in.microbatches = p.steps_per_batch();
    in.persistent_gradients = w.framework.grad_buffer == GradBuffer::persistent;
    in.logits_held = w.framework.logits == LogitsLife::held;
    in.kv_cache = w.kv_cache.on_rank(p, V);
    in.kv_cache_whole = w.kv_cache_whole.on_rank(p, V);
    // Per layer: the larger of the two recomputations' caches, leaning high where they differ.
    if (in.partial()) in.kv_cache = std::max(in.kv_cache, w.kv_cache_not_recomputed.on_rank(p, V));
    in.weights = f.state.weights;
    in.master_weights = f.state.master_weights;
    in.optimizer_state = f.state.optimizer_state;
    in.weight_copies_recast = w.recipe.autocast && checkpoints_layer(w.recompute);
    if (const auto& narrow = w.recipe.linears) {
        // Transformer Engine's casts of the stage's weights (this rank's tensor- and
        // expert-parallel share, not ZeRO's: it casts whole weights), module buffers kept for the
        // run.
        const std::uint64_t bytes =
            std::uint64_t(narrow->weight_casts) * bytes_per_element(narrow->dtype);
        for (std::size_t k = 0; k < w.layers.size(); ++k)
            in.persistent_weight_copies +=
                Count(f.kind_layers[k]) * w.parameters->linear_weights[k].on_rank(p, V) * bytes;
    }
}

/// The most one layer holds, over the kinds a stage runs.
struct LayerMaxima {
    Count kept;         ///< its kept activations, with the weights' casts it keeps
    Count kept_whole;   ///< the same of a layer that keeps every activation (partial recomputation)
    Count activations;  ///< its kept activations alone (either variant)
    Count copies;       ///< its weights' casts alone (either variant)
    Count weights;      ///< its weights
};

/// Each kind's kept and rebuilt activations, its weights' casts and what a deferred W reads of it;
/// and the most of them one layer holds.
inline LayerMaxima set_layer_holdings(TimelineInputs& in, const Workload& w, const Parallelism& p,
                                      const StageFacts& f) {
    const std::uint64_t V = w.model.vocab, d = w.recipe.activation_bytes();
    LayerMaxima most;
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        in.layer[k].kept = w.layers[k].kept.on_rank(p, V);
        in.layer[k].rebuilt =
            std::max(w.layers[k].rebuilt.on_rank(p, V), w.layers[k].rebuilt_mlp_half.on_rank(p, V));
        // Autocast casts the layer's whole weights (ZeRO-3's gathered ones too): this rank's
        // tensor-parallel share.
        if (w.recipe.autocast)
            in.layer[k].weight_copies = w.parameters->cast_per_layer[k].on_rank(p, V) * d;
        if (schedule_row(p).defers_weight_gradients)
            in.layer[k].weight_reads = w.weight_pass_reads[k].on_rank(p, V);
        if (in.partial()) {
            in.not_recomputed[k].weight_reads = in.layer[k].weight_reads;
            in.not_recomputed[k].kept = w.not_recomputed[k].kept.on_rank(p, V);
            in.not_recomputed[k].weight_copies = in.layer[k].weight_copies;
        }
        if (f.kind_layers[k] == 0) continue;
        const Count copies = in.weight_copies_recast ? Count(0) : in.layer[k].weight_copies;
        most.kept = std::max(most.kept, in.layer[k].kept + copies);
        most.kept_whole = std::max(most.kept_whole,
                                   in.not_recomputed[k].kept + in.not_recomputed[k].weight_copies);
        // Offloaded, the largest layer's activations and casts apart (partial recomputation: of
        // either variant).
        most.activations =
            std::max({most.activations, in.layer[k].kept, in.not_recomputed[k].kept});
        most.copies = std::max({most.copies, copies, in.not_recomputed[k].weight_copies});
        most.weights = std::max(most.weights, f.layer_weight_bytes[k]);
    }
    return most;
}

/// Each micro-batch (chunk) in flight handed its causal mask to every checkpoint, which keeps it
/// until the last rebuild (measured: validation/results/cpu-pipeline-schedules.json, 1F1B under
/// full recomputation).
inline Count checkpoints_mask(const TimelineInputs& in, const Workload& w, const Parallelism& p) {
    return w.recompute != Recompute::none && in.recomputed > 0
               ? w.forward_buffers.on_rank(p, w.model.vocab)
               : Count(0);
}

/// The residual stream of one micro-batch, in its dtype (fp32 under autocast): also its gradient's
/// size.
inline Count stream_bytes(const Workload& w, const Parallelism& p) {
    return rank_stream(
        Count(w.seq) * w.micro_batch * w.model.hidden * bytes_per_element(w.recipe.stream()), p);
}

/// What the other micro-batches (chunks) in flight on a pipeline stage hold, by how many are.
struct OthersInFlight {
    const Parallelism& p;
    bool offloaded;                    ///< activation offload: their activations wait on the host
    Count stage_kept, chunk_kept;      ///< each one's kept activations and casts
    Count stage_copies, chunk_copies;  ///< offloaded: their casts alone
    Count activations;                 ///< offloaded: one layer's activations
    Count stage_reads, chunk_reads;    ///< a schedule that defers W: what W reads
    Count mask;                        ///< the causal mask its checkpoints keep

    Count operator()(std::uint64_t in_flight) const {
        const Count awaiting_w = other_microbatches_kept(p, in_flight, stage_reads, chunk_reads);
        const Count others = Count(other_in_flight(p, in_flight));
        if (!offloaded)
            return std::max(other_microbatches_kept(p, in_flight, stage_kept, chunk_kept),
                            awaiting_w) +
                   others * mask;
        // Offloaded, their activations wait on the host but for one layer each, the last of its
        // run, which Megatron-LM (cpu_offloading_num_layers below the layers) and torchtitan leave
        // on the device, and whose copy the next backward need not wait for. The casts stay on the
        // device (leaning high).
        return std::max(other_microbatches_kept(p, in_flight, stage_copies, chunk_copies) +
                            others * activations,
                        awaiting_w) +
               others * mask;
    }
};

/// A pipeline stage also holds the activations of the other micro-batches in flight
/// (other_microbatches_kept): whole micro-batches, or with several chunks per rank (interleaved,
/// ZB-V, DualPipe) chunks. Each micro-batch in flight holds the casts its layers saved, unless they
/// are recast in backward. Under partial recomputation a layer past the first N of its chunk keeps
/// every activation and its casts.
inline OthersInFlight others_in_flight(const TimelineInputs& in, const Workload& w,
                                       const Parallelism& p, const StageFacts& f,
                                       const LayerMaxima& most, Count mask) {
    const Count stage_copies =
        in.partial()
            ? (in.weight_copies_recast
                   ? in.over_not_recomputed(1, in.layers, &LayerInputs::weight_copies)
                   : in.over<&LayerInputs::weight_copies>(1, in.layers))
            : (in.weight_copies_recast ? Count(0)
                                       : in.per_kind(f.kind_layers, &LayerInputs::weight_copies));
    const Count stage_kept = (in.partial() ? in.over<&LayerInputs::kept>(1, in.layers)
                                           : in.per_kind(f.kind_layers, &LayerInputs::kept)) +
                             stage_copies;
    // One model chunk of several a rank: its first N layers recomputed, the rest not.
    const std::uint64_t chunk_recomputed = std::min(in.recomputed, in.chunk);
    const Count chunk_kept =
        Count(chunk_recomputed) * most.kept + Count(in.chunk - chunk_recomputed) * most.kept_whole;
    // A schedule that defers W: a micro-batch past its B holds what W reads instead, on the device;
    // each counts the larger of the two, as any may be either (leaning high where few have run B).
    Count stage_reads, most_reads;  // in.layer[k].weight_reads: none unless the schedule defers W
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        stage_reads += Count(f.kind_layers[k]) * in.layer[k].weight_reads;
        if (f.kind_layers[k] > 0) most_reads = std::max(most_reads, in.layer[k].weight_reads);
    }
    return {p,
            p.offload_activations,
            stage_kept,
            chunk_kept,
            stage_copies,
            Count(in.chunk) * most.copies,
            most.activations,
            stage_reads,
            Count(in.chunk) * most_reads,
            mask};
}

/// A chunk that does not start the model holds each micro-batch's received input until its
/// backward sends the gradient back (Megatron-LM's input_tensors), unless its first layer keeps
/// that very tensor (a LayerNorm's saved input, a checkpoint): an RMSNorm saves an fp32 copy
/// instead (measured, as above).
inline Count received_input(const TimelineInputs& in, const Workload& w, const Parallelism& p,
                            const StageFacts& f) {
    bool input_kept = true;
    for (std::size_t k = 0; k < w.layers.size(); ++k)
        if (f.kind_layers[k] > 0)
            input_kept = input_kept && w.layers[k].keeps_input &&
                         (!in.partial() || w.not_recomputed[k].keeps_input);
    const bool receives = !holds_embedding(p, f.stage) || chunks_per_rank(p) > 1;
    return receives && !input_kept ? stream_bytes(w, p) : Count(0);
}

/// What the other micro-batches in flight and the input side hold, now and at a later
/// micro-batch; with several chunks a rank, the places of the running one's later chunks.
inline void set_in_flight_holdings(TimelineInputs& in, const Workload& w, const Parallelism& p,
                                   const StageFacts& f, const LayerMaxima& most, Count mask) {
    const std::uint64_t V = w.model.vocab;
    in.kept_offloaded = p.offload_activations;
    const OthersInFlight others = others_in_flight(in, w, p, f, most, mask);
    const bool first = holds_embedding(p, f.stage);
    const Count received = received_input(in, w, p, f);
    const std::uint64_t chunks =
        chunks_per_microbatch(p);  // DualPipe's micro-batch runs one of its rank's two
    const auto input_side = [&](std::uint64_t in_flight) {
        const std::uint64_t batches_held = (in_flight + chunks - 1) / chunks;
        // Every stage builds its own shared tables (rotary cos and sin) for each chunk it runs.
        return (first ? Count(batches_held) * w.input_side.on_rank(p, V) : Count(0)) +
               Count(in_flight) * (w.stage_side.on_rank(p, V) + received);
    };
    in.other_microbatches = others(f.in_flight);
    in.input_side_kept = input_side(f.in_flight);
    in.later_other_microbatches = others(f.later_in_flight);
    in.later_input_side_kept = input_side(f.later_in_flight);
    const std::uint64_t held_chunks = chunks_per_rank(p);
    if (held_chunks > 1) {
        // One other chunk, as others counts each (the difference one more in flight makes), and the
        // places for it: the running micro-batch's later chunks, no more than are in flight beside
        // the others.
        in.spare_chunk = Count(others(held_chunks + 1).value() - others(held_chunks).value());
        const auto places = [&](std::uint64_t in_flight) {
            return std::min(held_chunks - 1,
                            in_flight - 1 - std::min(in_flight - 1, other_in_flight(p, in_flight)));
        };
        in.spare_chunks = places(f.in_flight), in.later_spare_chunks = places(f.later_in_flight);
        // Steps are then linear within each chunk only.
        if (in.spare_chunks > 0 || in.later_spare_chunks > 0) in.mixed = true;
    }
}

/// The gradients this rank keeps of `dense` and `experts` parameters: ZeRO-2/3 keep this rank's
/// shard of each (ZeRO-Offload: not even that, it goes to the host).
inline Count kept_gradients(const Parallelism& p, Count dense, Count experts) {
    const bool on_host = p.zero >= 2 && p.offload != Offload::none;
    return on_host       ? Count(0)
           : p.zero >= 2 ? StageFacts::shard(p, dense, experts)
                         : dense + experts;
}

/// The workspaces of one layer's steps. `written`: the layer's gradients written so far, unless a
/// bucket or the held gradients have them already; `cast_bytes`: autocast's casts, else 0.
inline void set_layer_workspaces(LayerInputs& layer, const LayerWork& work, const Workload& w,
                                 const Parallelism& p, std::size_t k, Count written,
                                 Count cast_bytes) {
    const std::uint64_t V = w.model.vocab;
    const Count g = w.recipe.gradient_bytes();
    layer.forward_work = largest_on_rank(work.forward_work, p, V, 0, nullptr, cast_bytes);
    layer.backward_work = largest_on_rank(work.backward_work, p, V, written);
    layer.backward_work_held = largest_on_rank(work.backward_work, p, V, p.zero >= 2 ? Count(0) : g,
                                               &w.parameters->fresh_gradient[k], cast_bytes);
}

/// Each kind's gradients, its ZeRO-3 gathered weights and its steps' workspaces (partial
/// recomputation: of either variant); the head's and the input side's gradients.
inline void set_layer_work(TimelineInputs& in, const Workload& w, const Parallelism& p,
                           const StageFacts& f, Count most_weights) {
    const std::uint64_t V = w.model.vocab, d = w.recipe.activation_bytes();
    const Count g = w.recipe.gradient_bytes();
    const RankParams& t = f.trainable;  // the parameters with gradients
    in.head_gradients = kept_gradients(p, t.head, 0) * g;
    in.input_gradients = kept_gradients(p, t.input, 0) * g;
    const std::uint64_t gathered = std::min<std::uint64_t>(p.gathered_layers, in.layers);
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        LayerInputs& layer = in.layer[k];
        // ZeRO-3 gathers each layer's full weights before its forward and its backward step: this
        // one's and the prefetched ones' (counted as the stage's largest kind).
        if (p.zero >= 3 && gathered > 0)
            layer.gathered_weights = f.layer_weight_bytes[k] + Count(gathered - 1) * most_weights;
        layer.gradients =
            kept_gradients(p, Count(t.per_layer[k].value() - t.per_layer_experts[k].value()),
                           t.per_layer_experts[k]) *
            g;
        if (p.zero >= 2) layer.gradient_bucket = t.per_layer[k] * g;  // until its reduce-scatter
        // Under autocast the step counts the layer's casts whole; a forward op runs before the
        // later ones are made.
        const Count cast_bytes = w.recipe.autocast ? Count(d) : Count(0);
        // The layer's gradients written so far count unless a bucket or the held gradients have
        // them already. Under autocast each replaces its weight's cast, which its backward freed
        // (the norms' few, leaning low).
        const Count written = p.zero >= 2 ? Count(0) : w.recipe.autocast ? Count(g.value() - d) : g;
        set_layer_workspaces(layer, w.layers[k], w, p, k, written, cast_bytes);
        // The rerun forward: its largest op with the rows made before it, or all the rows, beside
        // the gradients made before the rerun (CheckpointHeld::rerun).
        if (checkpoints_layer(w.recompute)) {
            const Count rerun = std::max(layer.forward_work, layer.rebuilt) +
                                w.layers[k].rerun_gradients.on_rank(p, V);
            if (rerun > layer.rebuilt)
                layer.recompute_forward_work = Count(rerun.value() - layer.rebuilt.value());
        }
        if (in.partial()) {  // the same layer keeping every activation: its own workspaces, nothing
                             // rebuilt
            LayerInputs& whole = in.not_recomputed[k];
            const Count kept = whole.kept;
            whole = layer;
            whole.kept = kept, whole.rebuilt = 0, whole.recompute_forward_work = 0;
            set_layer_workspaces(whole, w.not_recomputed[k], w, p, k, written, cast_bytes);
        }
    }
}

/// The loss step under autograd's order: logits.float() copies them while the loss runs forward
/// (not when they are fp32 already); its backward holds the log-probabilities' gradient and the
/// logits' (in the loss's dtype), and the head's backward frees the last of them before layer L's
/// starts. `sbV`: the logits' elements on this rank; `previous_logits`: the last micro-batch's,
/// if the loop holds them.
inline void set_autograd_loss_work(TimelineInputs& in, const Workload& w, Count sbV,
                                   std::optional<DType> loss, Count previous_logits) {
    const std::uint64_t d = w.recipe.activation_bytes();
    const std::uint64_t l = loss ? bytes_per_element(*loss) : 0;
    in.logits_gradient = 0;
    // In place (Megatron's): the copy is the saved softmax, and backward writes over it, making
    // only the logits' gradient in the compute dtype.
    const bool in_place = w.framework.loss == LossKernel::fp32_inplace;
    const Count copy = loss && *loss != w.recipe.activations && !in_place ? sbV * l : Count(0);
    const Count backward = (in_place ? sbV * d : sbV * (2 * l)) + in.recompute_buffers;
    // A loop that keeps only the loss drops the logits when the forward returns, before the loss's
    // backward (measured): then they are part of the loss's forward alone.
    const Count own_logits = in.logits_held ? Count(0) : in.logits;
    if (!in.logits_held) in.logits = 0;
    in.loss_work = std::max(copy + in.forward_buffers + own_logits, backward);
    // The previous micro-batch's logits, held, live until this forward returns, not into its
    // backward.
    in.later_loss_work =
        std::max(copy + in.forward_buffers + own_logits + previous_logits, backward);
}

/// The last stage's logits, the loss's buffers and workspaces, and the logits' gradient.
inline void set_loss_inputs(TimelineInputs& in, const Workload& w, const Parallelism& p) {
    const std::uint64_t V = w.model.vocab, d = w.recipe.activation_bytes();
    // Vocabulary-parallel logits: each tensor-parallel rank holds ceil(V / tp) columns.
    const Count sbV = ceil_div(Count(w.seq) * w.micro_batch, p.cp) * ceil_div(V, p.tp);
    in.logits = sbV * d;
    // The loss's log-probabilities and gradients, in its dtype: none of the vocabulary's width for
    // a fused kernel, which writes its gradient over the logits.
    const std::optional<DType> loss = loss_dtype(w.framework.loss, w.recipe.precision());
    const std::uint64_t l = loss ? bytes_per_element(*loss) : 0;
    const Count previous_logits =
        in.logits_held ? in.logits : Count(0);  // the last micro-batch's, if the loop holds them
    // The formula model: the loss reads a copy of the logits in its dtype (the formula's "fp32
    // softmax"); the architecture model adds what the head and the loss save for backward.
    in.loss_buffers = sbV * l + w.head.on_rank(p, V);
    in.logits_gradient = loss ? sbV * d : Count(0);
    in.later_loss_work =
        previous_logits;  // the formula's loss step, beside the previous micro-batch's logits
    if (w.autograd_order) {
        in.loss_buffers = w.head.on_rank(p, V);
        set_autograd_loss_work(in, w, sbV, loss, previous_logits);
    }
}

/// The embedding's backward, and a tied table's gradient held between its two uses.
inline void set_input_backward(TimelineInputs& in, const Workload& w, const Parallelism& p,
                               const StageFacts& f) {
    const std::uint64_t V = w.model.vocab;
    const Count g = w.recipe.gradient_bytes();
    const bool first = holds_embedding(p, f.stage), last = holds_head(p, f.stage);
    const bool tied = w.model.tied_embeddings;
    if (w.autograd_order && first && in.layers > 0) {
        // Once layer 1's backward ends, the embedding's writes a gradient for its whole table (V x
        // h, whatever rows the batch used); a tied table's is then added to the head's out of
        // place, a second such table for a moment. Layer 1's activations are gone by then, its
        // gradients not. Into held gradients the table is still written whole, then added.
        const LayerInputs& layer1 = in.at(1);
        const Count table =
            tied ? w.parameters->trainable().tied_embedding.on_rank(p, V) * Count(2) : Count(0);
        const Count fresh = (f.trainable.input + table) * g;
        const Count freed = layer1.kept + layer1.rebuilt;
        const auto beyond = [&](Count written) {
            return written > freed ? Count(written.value() - freed.value()) : Count(0);
        };
        in.input_backward_work = beyond(fresh + layer1.gradients);
        in.input_backward_work_held = beyond(fresh);
    }
    // A tied table is used twice on a stage holding both ends: autograd keeps the head's gradient
    // of it until the embedding's backward adds its own, then hands the sum over. With no gradient
    // held yet that sum becomes the gradient itself (head_gradients counts it); into held ones it
    // is extra.
    if (first && last && tied) {
        in.buffered_gradients = w.parameters->trainable().tied_embedding.on_rank(p, V) * g;
        if (p.zero >= 2)
            in.buffered_first_gradients =
                in.buffered_gradients;  // only its shard is counted, or none
    }
}

/// Flattened: its pieces inline into one body, as when it was one (fit and plan call it per
/// layout).
[[gnu::flatten]] inline TimelineInputs stage_inputs(const Workload& w, const Parallelism& p,
                                                    const StageFacts& f) {
    TimelineInputs in;
    set_stage_state(in, w, p, f);
    const LayerMaxima most = set_layer_holdings(in, w, p, f);
    const Count mask = checkpoints_mask(in, w, p);
    set_in_flight_holdings(in, w, p, f, most, mask);
    set_layer_work(in, w, p, f, most.weights);
    if (w.recipe.autocast && in.loss)
        in.head_weight_copy =
            w.parameters->cast_head.on_rank(p, w.model.vocab) * w.recipe.activation_bytes();
    in.forward_buffers = w.forward_buffers.on_rank(p, w.model.vocab);
    // Checkpoints keep what the attention they rebuild reads, the causal mask, until the last
    // rebuild: each chunk's forward built its own, and a rank's running micro-batch may have
    // several in flight.
    in.recompute_buffers = Count(chunks_per_rank(p)) * mask;
    if (in.loss) set_loss_inputs(in, w, p);
    // The gradient of the residual stream, in the stream's dtype (fp32 under autocast).
    in.activation_gradient = stream_bytes(w, p);
    in.optimizer_work = optimizer_step_work(w, p, f);
    set_input_backward(in, w, p, f);
    return in;
}

/// The most loaded device of a layout and its peak step, without building any timeline. With even
/// stages the first holds at least what every middle one holds (the embedding, the most
/// micro-batches in flight), so only the first and the last can be the most loaded; with uneven
/// ones, the second too.
struct LayoutPeak {
    std::uint64_t stage = 0;
    Step step;
    Count bytes() const { return step.bytes.total(); }
};

/// Whether a stage after the first holds for each micro-batch what the first does not: a received
/// input its first layer does not keep, its own shared tables (stage_inputs).
inline bool later_stages_hold_more(const Workload& w) {
    if (w.stage_side.any()) return true;
    for (std::size_t k = 0; k < w.layers.size(); ++k)
        if (!w.layers[k].keeps_input ||
            (k < w.not_recomputed.size() && !w.not_recomputed[k].keeps_input))
            return true;
    return false;
}

/// The stages besides the first that may be the most loaded, each handed to `consider` in order.
template <class Consider>
void other_candidate_stages(const Workload& w, const Parallelism& p, Consider consider) {
    if (!w.parameters->pattern
             .uniform()) {  // stages of different kinds of layer: any may hold the most
        for (std::uint64_t stage = 1; stage < p.pp; ++stage) consider(stage);
        return;
    }
    // The second holds the most of the middle ones (the most in flight), more than the first where
    // that is smaller or holds less per micro-batch.
    if (p.pp > 2 && (p.uneven_stages() || later_stages_hold_more(w))) consider(1);
    if (p.pp > 1) consider(p.pp - 1);
}

/// The most host memory a device of the layout fills (offload): the stages layout_peak weighs hold
/// the most there too (the most micro-batches in flight, the embedding, the head, the most layers).
inline Count layout_host(const Workload& w, const Parallelism& p) {
    Count most = stage_facts(w, p, 0).host;
    other_candidate_stages(
        w, p, [&](std::uint64_t stage) { most = std::max(most, stage_facts(w, p, stage).host); });
    return most;
}

inline LayoutPeak layout_peak(const Workload& w, const Parallelism& p) {
    LayoutPeak best{0, peak_step(stage_inputs(w, p, stage_facts(w, p, 0)))};
    other_candidate_stages(w, p, [&](std::uint64_t stage) {
        const Step s = peak_step(stage_inputs(w, p, stage_facts(w, p, stage)));
        if (s.bytes.total() > best.bytes()) best = {stage, s};
    });
    return best;
}

}  // namespace memcalc
