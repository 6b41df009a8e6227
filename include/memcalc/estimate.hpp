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
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

struct Settings {
    std::uint64_t seq = 0;          ///< s, tokens per sequence
    std::uint64_t micro_batch = 1;  ///< b, sequences per step on one device
    Recompute recompute = Recompute::none;
    std::string recipe{default_recipe};
    ActivationModel activations = ActivationModel::korthikanti;
    Attention attention = Attention::eager;
};

struct Report {
    Architecture model;
    Settings settings;
    Recipe recipe;
    ParameterTable parameters;
    Count parameter_count;
    TrainingState state;
    LayerActivations layer;       ///< one layer's saved tensors at this s and b
    std::vector<SavedTensor> input_side;  ///< what the embedding side saves (architecture model only)
    std::vector<SavedTensor> head;        ///< what the head and the loss save (architecture model only)
    Count activations;            ///< all layers, no recomputation
    Count kept_activations;       ///< all layers, under the chosen recomputation
    ComputeCost compute;
    std::vector<Step> timeline;
    std::size_t peak = 0;         ///< index into timeline

    const Step& peak_step() const { return timeline[peak]; }
};

inline Report estimate(const Architecture& model, const Settings& settings) {
    validate(model);
    detail::require_positive("seq", settings.seq);
    detail::require_positive("micro_batch", settings.micro_batch);
    if (model.position == Position::learned && settings.seq > model.max_positions)
        throw error("seq " + std::to_string(settings.seq) + " exceeds the " + std::to_string(model.max_positions) +
                    " learned positions of " + (model.name.empty() ? "the model" : model.name));
    const Recipe* recipe = find_recipe(settings.recipe);
    if (recipe == nullptr) throw error("unknown recipe '" + settings.recipe + "'");

    Report r{model, settings, *recipe, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 0};
    try {
        r.parameters = parameter_table(model);
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
    try {
        r.layer = formula ? korthikanti_layer(model, s, b, d) : architecture_layer(model, s, b, d, settings.attention);
        if (!formula) {
            r.input_side = input_side_saved(model, s, b, d);
            r.head = head_saved(model, s, b, d);
        }
        r.activations = Count(model.layers) * r.layer.total();
        r.kept_activations = Count(model.layers) * r.layer.kept(settings.recompute);

        const Count sbV = Count(s) * b * model.vocab;
        const Count g = recipe->gradient_bytes;
        TimelineInputs in;
        in.layers = model.layers;
        in.weights = r.state.weights;
        in.master_weights = r.state.master_weights;
        in.optimizer_state = r.state.optimizer_state;
        in.layer_kept = r.layer.kept(settings.recompute);
        in.layer_rebuilt = r.layer.rebuilt(settings.recompute);
        in.head_gradients = r.parameters.group(Group::head) * g;
        in.layer_gradients = r.parameters.per_layer() * g;
        in.input_gradients = r.parameters.group(Group::input) * g;
        in.input_side_kept = saved_bytes(r.input_side);
        in.logits = sbV * d;
        // The loss reads an fp32 copy of the logits (the formula's "fp32 softmax"); the architecture
        // model adds what the head and the loss save for backward.
        in.loss_buffers = sbV * dtype::fp32 + saved_bytes(r.head);
        in.logits_gradient = sbV * d;
        in.activation_gradient = Count(s) * b * model.hidden * d;
        r.timeline = timeline(in);
        r.peak = peak_index(r.timeline);
    } catch (const overflow_error&) {
        throw error("seq " + std::to_string(s) + " with micro-batch " + std::to_string(b) +
                    " needs more bytes than 64 bits can count");
    }
    r.compute = compute_cost(model, s, b, settings.recompute);
    return r;
}

}  // namespace memcalc
