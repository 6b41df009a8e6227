#pragma once
/// The model's parameters and the trainable ones' optimiser state, summed by how each tensor
/// divides across tensor- and expert-parallel ranks (SplitParams, SplitState), by group and state
/// class. Apart from the Workload: parameter_splits builds them once per model, whatever the
/// sequence, micro-batch or recomputation, and a sweep or a plan shares them among its workloads.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memcalc/dtype.hpp"
#include "memcalc/error.hpp"
#include "memcalc/layers.hpp"
#include "memcalc/linears.hpp"
#include "memcalc/model.hpp"
#include "memcalc/optimizer.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
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

/// Keeps the two largest of the counts offered in `top`.
inline void keep_two_largest(Count (&top)[2], Count n) {
    if (n > top[0])
        top[1] = top[0], top[0] = n;
    else if (n > top[1])
        top[1] = n;
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
        for (int copies = r.group == Group::layer || r.expert ? 2 : 1; copies > 0; --copies)
            keep_two_largest(top, n);
    }
};

/// What one layer's weight-gradient pass (W) reads, in elements a token (a dense linear's) or a
/// token slot (an expert's): each trainable linear's input and its output's gradient, by whether a
/// tensor-parallel rank holds a piece of it or the whole (weight_pass_reads scales them).
struct WeightPassWidths {
    Count cut, whole, expert_cut, expert_whole;
};

/// Of a tensor-parallel linear, the side Megatron-LM splits is 1 / tp and the other whole on every
/// rank (under sequence parallelism W reads the gathered input, as its deferred weight-gradient
/// store keeps it): the input of a row-parallel one (linear_rows), the output of the others; a
/// linear the table does not split (LinearRow::tuned: Mamba's, an adapter's) is split but on the
/// model's width. Linears reading one input tensor (q, k and v; gate and up) hold it once.
inline WeightPassWidths weight_pass_widths(const ParameterTable& table, std::size_t kind) {
    WeightPassWidths widths;
    std::array<LinearSet, 2> inputs_held{};  // by whether the reader is an expert's
    for (const ParamRow& row : table.rows) {
        if (row.group != Group::layer || row.kind != kind || !row.trainable ||
            tensor_dims(row) != 2)
            continue;
        if (row.part == Part::norms || row.part == Part::final_norm) continue;
        const std::uint64_t* d = row.dims.end() - 2;  // in x out
        // An adapter's matrix is no linear of the table: split by its widths.
        const LinearRow& linear =
            linear_row(row.role == ParamRole::weight ? row.linear : Linear::none);
        const Linear input =
            linear.reads_input_of == Linear::none ? linear.linear : linear.reads_input_of;
        LinearSet& held = inputs_held[row.expert];
        for (int out = held & bit(input) ? 1 : 0; out < 2; ++out) {
            const bool cut =
                row.split == ParamSplit::tensor &&
                (linear.tuned ? linear.row_parallel == (out == 0) : d[out] != table.hidden);
            Count& into = row.expert ? (cut ? widths.expert_cut : widths.expert_whole)
                                     : (cut ? widths.cut : widths.whole);
            into += Count(d[out]);
        }
        held |= bit(input);
    }
    return widths;
}

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

/// Whether autocast casts the tensor for a matmul: the linear layers' weights and biases, the
/// head's matrix (a tied embedding's too). Embedding lookups and norms run in the weights' own
/// dtype.
inline bool autocast_casts(const ParamRow& r) {
    switch (r.part) {
        case Part::attention:
        case Part::mlp:
        case Part::router:
        case Part::head:
        case Part::adapter:
        case Part::vision: return true;  // its norms' few weights too: leans high by their size
        case Part::embedding: return r.group == Group::head;
        case Part::norms:
        case Part::final_norm: return false;
    }
    return false;
}

/// Whether autocast makes a copy of the tensor: a 4-bit weight is dequantised by its own kernel
/// instead.
inline bool autocast_copies(const ParamRow& r) { return autocast_casts(r) && !r.storage; }

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
    /// Of those, the frozen ones: autocast caches only casts of tensors that require grad.
    std::array<SplitParams, max_layer_kinds> uncached_per_layer;
    SplitParams cast_head;
    /// The output head's 4-bit weight (a quantiser that converts every linear): dequantised
    /// whenever the head computes, forward and backward; and the dtype it dequantises to first.
    SplitParams dequantized_head;
    std::optional<DType> head_quantized_from;
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
    /// One layer of each kind's weight-gradient pass, a token's worth.
    std::array<WeightPassWidths, max_layer_kinds> weight_pass;
    ParameterTable
        table;  ///< the rows themselves: a workspace names the first whose gradient exists
    LayerPattern pattern;  ///< which kind each layer is

    const StateClass& trainable() const { return classes.front(); }

    /// The copies a weight is computed with: autocast's casts; a 4-bit weight is dequantised by its
    /// own kernel instead (a layer's in its workspace, the head's here).
    void add_copies(const ParamRow& row, std::uint64_t V) {
        if (autocast_copies(row)) {
            (row.group == Group::layer ? cast_per_layer[row.kind] : cast_head).add(row, V);
            if (row.group == Group::layer && !row.trainable)
                uncached_per_layer[row.kind].add(row, V);
        }
        if (row.group == Group::head && row.storage && row.storage->dtype == DType::nf4) {
            dequantized_head.add(row, V);
            head_quantized_from = row.storage->quantized_from;
        }
    }

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
        splits.add_copies(row, V);
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
    for (std::size_t k = 0; k < params.kinds; ++k) {
        if (largest[k] != nullptr)
            splits.fresh_gradient[k] = fresh_gradient(params, *largest[k], V);
        splits.weight_pass[k] = weight_pass_widths(params, k);
    }
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

}  // namespace memcalc
