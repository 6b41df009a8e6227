#pragma once
/// A workload (model, sequence, micro-batch, recomputation, recipe, activation model) reduced to
/// sums by how each tensor divides across ranks, and its building: made once per run, so that any
/// layout's per-device memory follows in a few operations (stage_facts.hpp, stage_inputs.hpp,
/// layout_peak.hpp) and fit and plan search thousands of layouts a millisecond.
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/finetune.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/layer_work.hpp"
#include "memcalc/linears.hpp"
#include "memcalc/model.hpp"
#include "memcalc/optimizer.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/split_bytes.hpp"
#include "memcalc/blocks/mamba.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

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
    SplitBytes graph_held;  ///< per layer: what the graph holds past its backward (SavedTensor's)
    SplitBytes head_graph_held;  ///< the same of the head's rows, once the head's backward has run
    /// Under full recomputation, each kind's layer under none as well: partial recomputation
    /// (Parallelism::recompute_layers) runs the layers past the first N of each chunk so.
    std::vector<LayerWork> not_recomputed;
    /// What the model's first layers keep where their input needs no gradient (ActivationTables::
    /// leading_layers), without recomputation; none: as their kind's other layers.
    std::vector<SplitBytes> leading_kept;
    SplitBytes kv_cache_not_recomputed;  ///< kv_cache under none
    /// By kind, one layer of one micro-batch: what a deferred weight-gradient pass reads
    /// (weight_pass_reads).
    std::vector<SplitBytes> weight_pass_reads;
    SplitBytes forward_locals;  ///< held by the first stage's forward until it returns
    /// The head program's backward ops (the final norm's) against the head's rows (the
    /// architecture model).
    std::vector<WorkspaceEffect> head_work;
    SplitBytes head_traffic;     ///< the head program's unfused temporaries (the loss's passes)
    LayerLaunches end_launches;  ///< the embedding's, the head's and the loss's kernels
                                 ///< (count_launches)
    /// Under TpOverlap::matmul, the layers' linear FLOPs the attention projections take
    /// (projection_share): the products half the tensor-parallel collectives run beside.
    double projection_share = 0.5;
};

/// The ends' kernels for one micro-batch: the embedding's lookup, the head program's (its final
/// norm), the loss kernel's and the head's product (a tied head's too), a chunked loss's a chunk
/// at a time.
inline LayerLaunches end_launches(const LayerActivations& head, const ParameterTable& params,
                                  const Framework& f, std::uint64_t seq) {
    LayerLaunches out;
    for (const Launches& l : head.launches) out.other += l;
    out.other += launches_of(LaunchOp::embedding);
    const bool chunked = chunked_loss(f.loss) || f.loss == LossKernel::fused_linear;
    const std::uint64_t by_tokens =
        f.loss_chunk_tokens > 0 ? (seq + f.loss_chunk_tokens - 1) / f.loss_chunk_tokens : 0;
    const double chunks = !chunked ? 1 : static_cast<double>(by_tokens ? by_tokens : f.loss_chunks);
    out.other += loss_passes[static_cast<std::size_t>(f.loss)].launches * chunks;
    // The head's weight, or (tied) the token embedding's, the table's first row.
    bool trained = !params.rows.empty() && params.rows.front().trainable;
    for (const ParamRow& r : params.rows) {
        if (r.role == ParamRole::weight && r.linear == Linear::head) trained = r.trainable;
        if (r.group != Group::layer && r.trainable) out.trained_tensors += 1;
    }
    out.matmuls += matmul_launches(trained) * chunks;
    return out;
}

/// What the weight-gradient pass (W) of one layer of kind `kind` reads, one micro-batch of `tokens`
/// tokens in the compute dtype (`bytes`): its widths (weight_pass_widths) a token, its experts'
/// a slot of their tokens' k. Zero-bubble schedules hold them from the input-gradient pass until W.
inline SplitBytes weight_pass_reads(const Architecture& m, const WeightPassWidths& widths,
                                    std::size_t kind, std::uint64_t tokens, std::uint64_t bytes) {
    SplitBytes reads;
    const Count token_bytes = Count(tokens) * bytes;
    reads.add(ActivationSplit::tensor, widths.cut * token_bytes);
    reads.add(ActivationSplit::replicated, widths.whole * token_bytes);
    if ((widths.expert_cut + widths.expert_whole).value() > 0) {
        const Count slot_bytes = Count(m.kind_view(kind).dispatched_slots(tokens)) * bytes;
        reads.add(ActivationSplit::expert_tensor, widths.expert_cut * slot_bytes);
        reads.add(ActivationSplit::replicated, widths.expert_whole * slot_bytes);
    }
    return reads;
}

/// The saved-tensor tables of one workload, whole (not split across ranks). The formula model has
/// only the layer's; the architecture model also the embedding side's, the head's, the forward
/// pass's buffers and the layer's workspaces.
struct ActivationTables {
    LayerActivations layer;  ///< one layer of the first kind (every layer, with one kind)
    std::vector<LayerActivations> other_kinds;  ///< one layer of each further kind
    std::vector<SavedTensor> input_side, forward_buffers;
    LayerActivations head;  ///< the final norm, the head and the loss (head_program)
    /// The model's first layers where their input needs no gradient (adapters on a frozen base):
    /// what each keeps, less than its kind's other layers (LayerTuning::input_grad).
    std::vector<LayerActivations> leading_layers;

    /// One layer of kind `kind`.
    const LayerActivations& of_kind(std::size_t kind) const {
        return kind == 0 ? layer : other_kinds[kind - 1];
    }
};

/// The forward FLOPs the op-level policy spares each kind's recomputation (compute_cost's spared).
inline KindFlops policy_spared_flops(const ActivationTables& t, std::size_t kinds) {
    KindFlops spared{};
    for (std::size_t k = 0; k < kinds; ++k) spared[k] = t.of_kind(k).policy_spared_flops;
    return spared;
}

/// `precision`: the recipe's compute dtype, which the activations are stored in, and its stream's
/// (Recipe::precision); `f`: the framework's kernels (its attention, platform and loss).
/// `modules`: what selective recomputation checkpoints (select_modules).
/// `tunings`: what fine-tuning changes in each kind of layer (layer_tuning); empty: every weight
/// trains.
/// Whose kernels the framework's tables follow: its platform's, its PyTorch's, whether its experts
/// run in the model's loop, and its fused attention kernel.
inline Runtime runtime_of(const Framework& f) {
    return {f.platform, f.torch, f.moe == MoeKernel::model_code, f.attention_kernel};
}

/// The model's first layers where their input needs no gradient (LayerTuning::embedding_frozen):
/// the first alone under adapters on every layer; under a prompt from layer S (LLaMA-Adapter), the
/// S before it, which keep nothing (or, where the norms train, LLaMA-Adapter v2, the first keeps
/// its norms' alone and the others what a layer without the prompt keeps), and its own. One kind
/// of dense layer (else each layer as its kind's: leaning high).
inline std::vector<LayerActivations> leading_layer_tables(const Architecture& m, std::uint64_t s,
                                                          std::uint64_t b, Precision precision,
                                                          const Framework& f, ModuleSet modules,
                                                          LayerTuning tuning) {
    std::vector<LayerActivations> tables;
    if (!m.layer_kinds.empty() || m.any_moe() || !tuning.embedding_frozen) return tables;
    tuning.input_grad = false;
    const auto table = [&](const LayerTuning& t) {
        return architecture_layer(m, s, b, precision, f.attention, runtime_of(f), modules, t);
    };
    LayerTuning before = tuning;
    before.prompt_tokens = 0;
    const std::uint64_t unprompted = tuning.prompt_tokens > 0 ? tuning.prompt_start : 0;
    // A layer's output needs a gradient once something in it trains.
    const bool trains = !tuning.frozen_norms || tuning.adapted != 0 || tuning.scaled != 0;
    for (std::uint64_t p = 0; p < std::min<std::uint64_t>(unprompted, m.layers); ++p) {
        tables.push_back(table(before));
        before.input_grad = before.input_grad || trains;
    }
    tuning.input_grad = before.input_grad;
    if (unprompted < m.layers) tables.push_back(table(tuning));
    return tables;
}

inline ActivationTables activation_tables(const Architecture& m, std::uint64_t s, std::uint64_t b,
                                          Precision precision, ActivationModel model,
                                          const Framework& f = {}, ModuleSet modules = {},
                                          const std::vector<LayerTuning>& tunings = {}) {
    const Attention attention = f.attention;
    const Runtime runtime = runtime_of(f);
    const auto tuning = [&](std::size_t kind) {
        return tunings.empty() ? LayerTuning{} : tunings[kind];
    };
    const auto layer = [&](const Architecture& view, std::size_t kind) {
        if (model == ActivationModel::korthikanti &&
            (has_mamba2(view.mixer) || view.mixer == Mixer::gated_deltanet))
            throw error(std::string("Korthikanti's formula has no ") +
                        (has_mamba2(view.mixer) ? "Mamba-2" : "Gated DeltaNet") +
                        " layer: use the architecture activation model");
        if (model == ActivationModel::korthikanti && view.mixer == Mixer::cross_attention)
            throw error(
                "Korthikanti's formula has no cross-attention layer: use the architecture "
                "activation model");
        if (model == ActivationModel::korthikanti && (view.mixer == Mixer::none || !view.has_mlp))
            throw error(
                "Korthikanti's formula has no layer of one block (a mixer or an MLP alone): use "
                "the architecture activation model");
        if (model == ActivationModel::korthikanti)
            return view.mixer == Mixer::mamba
                       ? korthikanti_mamba_layer(view, s, b, bytes_per_element(precision.compute))
                       : korthikanti_layer(view, s, b, bytes_per_element(precision.compute));
        if (f.moe == MoeKernel::grouped_gemm &&
            view.expert_dispatch == ExpertDispatch::every_token) {
            Architecture routed =
                view;  // the framework's grouped GEMM in place of the model's code
            routed.expert_dispatch = ExpertDispatch::routed;
            return architecture_layer(routed, s, b, precision, attention, runtime, modules,
                                      tuning(kind));
        }
        return architecture_layer(view, s, b, precision, attention, runtime, modules, tuning(kind));
    };
    ActivationTables t;
    if (m.layer_kinds.empty())
        t.layer = layer(m, 0);  // the model itself, not a copy
    else
        t.layer = layer(m.kind_view(0), 0);
    for (std::size_t k = 1; k < m.kind_count(); ++k)
        t.other_kinds.push_back(layer(m.kind_view(k), k));
    if (model == ActivationModel::architecture)
        t.leading_layers = leading_layer_tables(m, s, b, precision, f, modules, tuning(0));
    if (model == ActivationModel::architecture) {
        t.input_side = input_side_saved(m, s, b, precision, runtime);
        t.head = head_program(m, s, b, precision, runtime, f.loss, tuning(0));
        const std::size_t last = m.last_kind();
        add_mtp_rows(t.head, m, t.of_kind(last), s, b, precision, runtime, f.loss, tuning(last));
        t.forward_buffers =
            forward_buffers(s, b, precision, attention, m.causal_mask_buffer, m.distinct_windows());
        const auto locals = forward_locals(m, s, b, precision);
        t.forward_buffers.insert(t.forward_buffers.end(), locals.begin(), locals.end());
    }
    return t;
}

/// `t`: the whole model's tables (not split across ranks).
inline Workload make_workload(const Architecture& m, const Recipe& recipe, std::uint64_t seq,
                              std::uint64_t micro_batch, Recompute mode,
                              std::shared_ptr<const ParameterSplits> params,
                              const ActivationTables& t, const Framework& framework = {}) {
    Workload w;
    w.model = m, w.recipe = recipe, w.seq = seq, w.micro_batch = micro_batch;
    w.recompute = mode, w.autograd_order = !t.head.rows.empty(), w.framework = framework;
    w.parameters = std::move(params);
    const auto cache = [&](Recompute under, SplitBytes& into) {
        if (framework.kv_cache == KvCache::kept)
            for (const auto& row :
                 kv_cache_rows(m, seq, micro_batch, recipe.precision(), framework.attention, under))
                into.add(row);
    };
    cache(mode, w.kv_cache);
    cache(Recompute::full, w.kv_cache_whole);  // a checkpointed layer saves none of it
    for (const auto& row : t.layer.rows)       // a checkpoint's rerun makes a graph of its own
        if (row.graph_held && row.kept(mode)) w.graph_held.add(row);
    w.optimizer_state = optimizer_splits(w.parameters, recipe);
    if (framework.tp_overlap == TpOverlap::matmul) w.projection_share = projection_share(m);
    const std::uint64_t V = m.vocab;
    for (const auto& row : t.forward_buffers)
        (row.forward_local ? w.forward_locals : w.forward_buffers).add(row);
    w.layers.reserve(m.kind_count());
    w.weight_pass_reads.reserve(m.kind_count());
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        w.layers.push_back(layer_work(t.of_kind(k), mode, w.parameters->table, V, k));
        w.weight_pass_reads.push_back(weight_pass_reads(
            m, w.parameters->weight_pass[k], k, seq * micro_batch, recipe.activation_bytes()));
    }
    // A reentrant checkpoint's rerun returns the layer's output, which its backward holds while the
    // layer's own backward runs: as large as the layer's input.
    if (mode == Recompute::full && framework.checkpoint == CheckpointImpl::reentrant)
        for (std::size_t k = 0; k < m.kind_count(); ++k)
            w.layers[k].rebuilt.add(ActivationSplit::sequence, t.of_kind(k).input_bytes);
    if (mode == Recompute::full) {
        cache(Recompute::none, w.kv_cache_not_recomputed);
        for (std::size_t k = 0; k < m.kind_count(); ++k)
            w.not_recomputed.push_back(
                layer_work(t.of_kind(k), Recompute::none, w.parameters->table, V, k));
    }
    if (mode == Recompute::none)
        for (const LayerActivations& first : t.leading_layers)
            w.leading_kept.push_back(
                layer_work(first, Recompute::none, w.parameters->table, V, 0).kept);
    for (const auto& row : t.input_side) (row.every_stage ? w.stage_side : w.input_side).add(row);
    for (const auto& row : t.head.rows) {
        w.head.add(row);
        if (row.graph_held) w.head_graph_held.add(row);
    }
    if (w.autograd_order) {
        LayerWork head = layer_work(t.head, Recompute::none, w.parameters->table, V, 0);
        w.head_work = std::move(head.backward_work);
        w.head_traffic = head.eager_traffic;
    }
    return w;
}

/// The kernels `w`'s layers (of tables `t`) and ends launch (LayerLaunches), which only the step
/// time reads: plan counts them once a workload, a single estimate never.
inline void count_launches(Workload& w, const ActivationTables& t) {
    const ParameterTable& params = w.parameters->table;
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        w.layers[k].launches = layer_launches(t.of_kind(k), w.recompute, params, k);
        if (k < w.not_recomputed.size())
            w.not_recomputed[k].launches = layer_launches(t.of_kind(k), Recompute::none, params, k);
    }
    w.end_launches = end_launches(t.head, params, w.framework, w.seq);
}

}  // namespace memcalc
