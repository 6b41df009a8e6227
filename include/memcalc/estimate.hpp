#pragma once
/// One call: (model, run settings) -> a report of plain data, which the program renders.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/model.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"
#include "memcalc/workload.hpp"

namespace memcalc {

struct Settings {
    std::uint64_t seq = 0;          ///< s, tokens per sequence
    std::uint64_t micro_batch = 1;  ///< b, sequences per micro-batch on one device
    Recompute recompute = Recompute::none;
    std::string recipe{default_recipe};
    ActivationModel activations = ActivationModel::korthikanti;
    Attention attention = Attention::eager;
    Platform platform = Platform::cuda;  ///< the architecture model's kernels
    Parallelism parallel;           ///< every degree 1: one device
    OptimizerImpl optimizer = OptimizerImpl::fused;  ///< decides the optimiser step's temporaries
    GradBuffer grad_buffer = GradBuffer::lazy;       ///< when the gradients exist
    /// Build every rank's timeline; without them each rank's peak comes from the closed form
    /// (peak_step), which costs a few operations and no memory per layer: sweeps and fit.
    bool timelines = true;
};

/// One kind of device: every rank of one pipeline stage holds the same (tensor, data, context and
/// expert parallel ranks are alike).
struct RankReport {
    std::uint64_t stage = 0;                 ///< pipeline stage, 0 first
    std::vector<std::uint64_t> layer_ids;    ///< its layers, in forward order
    bool holds_embedding = false, holds_head = false;
    std::uint64_t in_flight = 1;             ///< micro-batches (interleaved: model chunks) whose activations it holds
    Count parameters;                        ///< on this rank: after tensor, expert and pipeline splits
    TrainingState state;                     ///< on the device, after ZeRO sharding and offload
    Count host;                              ///< what offload keeps in host memory for this rank
    std::vector<Step> timeline;              ///< empty unless Settings::timelines
    std::size_t peak = 0;                    ///< the peak's index in timeline (when it is built)
    Step peak_at{Phase::forward, 0, {}, 1};  ///< the peak step, the earliest largest

    const Step& peak_step() const { return peak_at; }
};

struct Report {
    Architecture model;
    Settings settings;
    Recipe recipe;
    ParameterTable parameters;
    Count parameter_count;
    TrainingState state;                  ///< the whole model's, unsharded
    LayerActivations layer;               ///< one layer's saved tensors on one rank, this s and b
    std::vector<SavedTensor> input_side;  ///< what the embedding side saves (architecture model only)
    std::vector<SavedTensor> head;        ///< what the head and the loss save (architecture model only)
    std::vector<SavedTensor> forward_buffers;  ///< built for all layers by the forward pass (architecture model)
    Count activations;                    ///< all L layers of one micro-batch, no recomputation
    Count kept_activations;               ///< the same, under the chosen recomputation
    ComputeCost compute;
    std::vector<RankReport> ranks;        ///< one per pipeline stage
    std::size_t most_loaded = 0;          ///< the rank with the highest peak (the earliest stage on a tie)

    const RankReport& busiest() const { return ranks[most_loaded]; }
    const std::vector<Step>& timeline() const { return busiest().timeline; }
    std::size_t peak() const { return busiest().peak; }
    const Step& peak_step() const { return busiest().peak_step(); }
};

namespace detail {

/// One pipeline stage's device: its parameters, sharded state and timeline.
inline RankReport rank_report(const Workload& w, const Parallelism& p, std::uint64_t stage, bool timelines) {
    const StageFacts f = stage_facts(w, p, stage);
    RankReport rank;
    rank.stage = stage;
    rank.layer_ids = stage_layers(p, w.model.layers, stage);
    rank.holds_embedding = stage == 0;
    rank.holds_head = stage + 1 == p.pp;
    rank.in_flight = f.in_flight;
    rank.parameters = f.parameters;
    rank.state = f.state;
    rank.host = f.host;
    const TimelineInputs in = stage_inputs(w, p, f);
    if (timelines) {
        rank.timeline = timeline(in);
        rank.peak = peak_index(rank.timeline);
        rank.peak_at = rank.timeline[rank.peak];
    } else {
        rank.peak_at = peak_step(in);
    }
    return rank;
}

}  // namespace detail

/// `parameters`: the model's parameter_table, when the caller has it already (a sweep builds it once).
inline Report estimate(const Architecture& model, const Settings& settings, const ParameterTable* parameters = nullptr) {
    validate(model);
    detail::require_positive("seq", settings.seq);
    detail::require_positive("micro_batch", settings.micro_batch);
    if (model.position == Position::learned && settings.seq > model.max_positions)
        throw error("seq " + std::to_string(settings.seq) + " exceeds the " + std::to_string(model.max_positions) +
                    " learned positions of " + (model.name.empty() ? "the model" : model.name));
    const Recipe* recipe = find_recipe(settings.recipe);
    if (recipe == nullptr) throw error("unknown recipe '" + settings.recipe + "'");
    validate(settings.parallel, model, settings.seq);

    Report r{model, settings, *recipe, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 0};
    try {
        r.parameters = parameters != nullptr ? *parameters : parameter_table(model);
        r.parameter_count = r.parameters.total();
        r.state = training_state(r.parameter_count, *recipe);
    } catch (const overflow_error&) {
        throw error("the parameter count of " + (model.name.empty() ? std::string("the model") : model.name) +
                    " overflows 64 bits (hidden " + std::to_string(model.hidden) + ", layers " +
                    std::to_string(model.layers) + ", ffn " + std::to_string(model.ffn) + ", vocab " +
                    std::to_string(model.vocab) + ")");
    }

    const std::uint64_t s = settings.seq, b = settings.micro_batch, d = recipe->activation_bytes;
    const bool formula = settings.activations == ActivationModel::korthikanti;
    if (formula && settings.attention == Attention::flash)
        throw error("flash attention needs the architecture activation model: Korthikanti's formula describes eager "
                    "attention");
    const Parallelism& p = settings.parallel;
    try {
        ActivationTables t = activation_tables(model, s, b, d, settings.activations, settings.attention,
                                               settings.platform);
        r.layer = std::move(t.layer);
        r.input_side = std::move(t.input_side);
        r.head = std::move(t.head);
        r.forward_buffers = std::move(t.forward_buffers);
        const Workload w = make_workload(model, *recipe, s, b, settings.recompute, r.parameters, r.layer,
                                         r.input_side, r.head, r.forward_buffers, settings.optimizer,
                                         settings.grad_buffer);
        // The tables the report shows are one rank's share of every tensor.
        split_rows(r.layer.rows, p, model.vocab);
        split_rows(r.layer.work, p, model.vocab);
        r.layer.input_bytes = rank_stream(r.layer.input_bytes, p);
        split_rows(r.input_side, p, model.vocab);
        split_rows(r.head, p, model.vocab);
        split_rows(r.forward_buffers, p, model.vocab);
        r.activations = Count(model.layers) * r.layer.total();
        r.kept_activations = Count(model.layers) * r.layer.kept(settings.recompute);

        for (std::uint64_t stage = 0; stage < p.pp; ++stage) r.ranks.push_back(detail::rank_report(w, p, stage, settings.timelines));
        for (std::size_t i = 1; i < r.ranks.size(); ++i)
            if (r.ranks[i].peak_step().bytes.total() > r.busiest().peak_step().bytes.total()) r.most_loaded = i;
    } catch (const overflow_error&) {
        throw error("seq " + std::to_string(s) + " with micro-batch " + std::to_string(b) +
                    " needs more bytes than 64 bits can count");
    }
    r.compute = compute_cost(model, s, b, settings.recompute);
    return r;
}

}  // namespace memcalc
