#pragma once
/// The steps of one training step (forward 1..L, loss, backward L..1, optimizer), what is live at
/// each, and the peak.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memcalc/units.hpp"

namespace memcalc {

/// Live bytes at one step, by category.
struct Breakdown {
    Count weights, master_weights, optimizer_state, gradients;
    Count gathered_weights;     ///< ZeRO-3: full weights gathered for the layers being computed
    Count kept_activations;     ///< saved by the forward pass, waiting for their backward step
    Count rebuilt_activations;  ///< recomputed for the backward step running now
    Count logits;               ///< logits, the loss's fp32 softmax and the logits gradient
    Count activation_gradient;  ///< the gradient flowing down through the layers

    Count total() const {
        return weights + master_weights + optimizer_state + gradients + gathered_weights + kept_activations +
               rebuilt_activations + logits + activation_gradient;
    }
};

enum class Phase { forward, loss, backward, optimizer };

struct Step {
    Phase phase;
    std::uint64_t layer;  ///< the layer's global number (1..L) for forward and backward steps, 0 otherwise
    Breakdown bytes;

    std::string name() const {
        switch (phase) {
            case Phase::forward: return "forward " + std::to_string(layer);
            case Phase::loss: return "loss";
            case Phase::backward: return "backward " + std::to_string(layer);
            case Phase::optimizer: return "optimizer";
        }
        return "?";
    }
};

/// What one device's timeline needs to know, already in bytes.
struct TimelineInputs {
    std::vector<std::uint64_t> layers;  ///< the layers this device runs, in forward order (global numbers)
    bool loss = true;                   ///< it computes the loss (the last pipeline stage)
    Count weights, master_weights, optimizer_state;  ///< persistent through the whole step
    Count layer_kept;             ///< one layer's kept activations under the chosen recomputation
    Count layer_rebuilt;          ///< what one layer's backward step rebuilds
    Count other_microbatches;     ///< kept activations of the other micro-batches a pipeline stage holds
    Count gathered_weights;       ///< ZeRO-3: gathered full weights, during forward and backward steps
    Count head_gradients;         ///< final norm and output head: ready after the first backward step starts
    Count layer_gradients;        ///< one layer's (its shard, under ZeRO-2/3): ready once its backward step ends
    Count layer_gradient_bucket;  ///< ZeRO-2/3: a layer's full gradient, held until it is reduce-scattered
    Count input_gradients;        ///< embeddings (untied): ready after the last backward step
    Count input_side_kept;        ///< saved by the embedding side: from the first forward step to the last backward
    Count logits;                 ///< held from the loss step to the end of the step
    Count loss_buffers;           ///< the loss step alone (the loss's fp32 softmax, what the head saves)
    Count logits_gradient;        ///< from the loss step until the top layer's backward step ends
    Count activation_gradient;    ///< the incoming gradient of each backward step
};

inline std::vector<Step> timeline(const TimelineInputs& in) {
    const std::size_t L = in.layers.size();
    Breakdown persistent;
    persistent.weights = in.weights;
    persistent.master_weights = in.master_weights;
    persistent.optimizer_state = in.optimizer_state;
    const auto kept = [&](std::size_t layers) {
        return in.input_side_kept + in.other_microbatches + Count(layers) * in.layer_kept;
    };

    std::vector<Step> steps;
    steps.reserve(2 * L + 2);
    for (std::size_t i = 1; i <= L; ++i) {
        Breakdown b = persistent;
        b.kept_activations = kept(i);
        b.gathered_weights = in.gathered_weights;
        steps.push_back({Phase::forward, in.layers[i - 1], b});
    }
    if (in.loss) {
        Breakdown b = persistent;
        b.kept_activations = kept(L);
        b.logits = in.logits + in.loss_buffers + in.logits_gradient;
        steps.push_back({Phase::loss, 0, b});
    }
    for (std::size_t i = L; i >= 1; --i) {
        Breakdown b = persistent;
        b.kept_activations = kept(i);
        b.rebuilt_activations = in.layer_rebuilt;
        b.gathered_weights = in.gathered_weights;
        b.activation_gradient = in.activation_gradient;
        if (in.loss) b.logits = i == L ? in.logits + in.logits_gradient : in.logits;
        b.gradients = in.head_gradients + Count(L - i) * in.layer_gradients + in.layer_gradient_bucket;
        steps.push_back({Phase::backward, in.layers[i - 1], b});
    }
    {
        Breakdown b = persistent;
        if (in.loss) b.logits = in.logits;
        b.gradients = in.head_gradients + Count(L) * in.layer_gradients + in.input_gradients;
        steps.push_back({Phase::optimizer, 0, b});
    }
    return steps;
}

/// Index of the step with the most live bytes; the earliest one when several tie.
inline std::size_t peak_index(const std::vector<Step>& steps) {
    std::size_t best = 0;
    for (std::size_t i = 1; i < steps.size(); ++i)
        if (steps[i].bytes.total() > steps[best].bytes.total()) best = i;
    return best;
}

}  // namespace memcalc
