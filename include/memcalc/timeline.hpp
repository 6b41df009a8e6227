#pragma once
/// The steps of one training step (forward 1..L, loss, backward L..1, optimizer), what is live at
/// each, and the peak.
#include <algorithm>
#include <array>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "memcalc/layers.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// Live bytes at one step, by category.
struct Breakdown {
    Count weights, master_weights, optimizer_state, gradients;
    Count gathered_weights;  ///< full weights made for the layers being computed: ZeRO-3's gathers
                             ///< (QLoRA dequantises in the layer's workspace)
    Count kept_activations;  ///< saved by the forward pass, waiting for their backward step (and a
                             ///< kept k/v cache)
    Count rebuilt_activations;  ///< recomputed for the backward step running now
    Count logits;               ///< logits, the loss's fp32 softmax and the logits gradient
    Count activation_gradient;  ///< the gradient flowing down through the layers
    Count workspace;  ///< temporaries of the op running now, and the forward pass's causal mask
    /// Autocast's casts of the weights to the compute dtype: each layer's from its forward step
    /// until its backward step ends (autograd saved them), the head's in the loss step (measured:
    /// gone by backward L's peak).
    Count weight_copies;

    Count total() const {
        return weights + master_weights + optimizer_state + gradients + gathered_weights +
               kept_activations + rebuilt_activations + logits + activation_gradient + workspace +
               weight_copies;
    }
    /// `op(a's, b's)` in every category, modulo 2^64 (a linear run's difference, and its later
    /// steps).
    template <class Op>
    static Breakdown modulo(const Breakdown& a, const Breakdown& b, Op op) {
        const auto f = [&](Count Breakdown::*c) {
            return Count(op((a.*c).value(), (b.*c).value()));
        };
        return {f(&Breakdown::weights),
                f(&Breakdown::master_weights),
                f(&Breakdown::optimizer_state),
                f(&Breakdown::gradients),
                f(&Breakdown::gathered_weights),
                f(&Breakdown::kept_activations),
                f(&Breakdown::rebuilt_activations),
                f(&Breakdown::logits),
                f(&Breakdown::activation_gradient),
                f(&Breakdown::workspace),
                f(&Breakdown::weight_copies)};
    }
    /// `f(mine, theirs)` for every category, in order: for code that treats them alike.
    template <class F>
    void each(const Breakdown& other, F f) {
        f(weights, other.weights), f(master_weights, other.master_weights),
            f(optimizer_state, other.optimizer_state);
        f(gradients, other.gradients), f(gathered_weights, other.gathered_weights);
        f(kept_activations, other.kept_activations),
            f(rebuilt_activations, other.rebuilt_activations);
        f(logits, other.logits), f(activation_gradient, other.activation_gradient),
            f(workspace, other.workspace);
        f(weight_copies, other.weight_copies);
    }
};

/// Breakdown's categories, in its order: for code that treats them alike.
inline constexpr std::array<Count Breakdown::*, 11> breakdown_categories{
    &Breakdown::weights,
    &Breakdown::master_weights,
    &Breakdown::optimizer_state,
    &Breakdown::gradients,
    &Breakdown::gathered_weights,
    &Breakdown::kept_activations,
    &Breakdown::rebuilt_activations,
    &Breakdown::logits,
    &Breakdown::activation_gradient,
    &Breakdown::workspace,
    &Breakdown::weight_copies};

enum class Phase { forward, loss, backward, optimizer };

struct Step {
    Phase phase;
    std::uint64_t
        layer;  ///< the layer's global number (1..L) for forward and backward steps, 0 otherwise
    Breakdown bytes;
    /// The micro-batch it belongs to: 1, or 2, which stands for every later one (each holds the
    /// gradients the earlier ones accumulated; in a pipeline, 2 holds the most in flight of them).
    std::uint64_t microbatch = 1;

    std::string name() const {
        std::string out;
        append_name(out);
        return out;
    }
    /// name(), appended to `out`: a sweep writes a row per configuration without a string of its
    /// own.
    void append_name(std::string& out) const {
        char digits[24];
        const auto number = [&](std::uint64_t n) {
            out.append(digits, std::to_chars(digits, digits + 24, n).ptr);
        };
        switch (phase) {
            case Phase::forward: out += "forward ", number(layer); break;
            case Phase::loss: out += "loss"; break;
            case Phase::backward: out += "backward ", number(layer); break;
            case Phase::optimizer: out += "optimizer"; return;
        }
        if (microbatch > 1) out += " of micro-batch ", number(microbatch);
    }
};

/// One kind of layer's figures on one device.
struct LayerInputs {
    Count kept;              ///< one layer's kept activations under the chosen recomputation
    Count rebuilt;           ///< what one layer's backward step rebuilds
    Count gathered_weights;  ///< ZeRO-3's gathered weights, during its forward and backward steps
    Count
        gradients;  ///< one layer's (its shard, under ZeRO-2/3): ready once its backward step ends
    Count
        gradient_bucket;  ///< ZeRO-2/3: a layer's full gradient, held until it is reduce-scattered
    Count forward_work;   ///< the most its forward workspaces add to its step
    Count backward_work;  ///< the most its backward workspaces add to its step
    Count backward_work_held;  ///< the same when the gradients they write are already held
    /// Full recomputation: what its forward, rerun inside the backward step, holds beyond the rows
    /// that step rebuilds (a frozen base keeps few rows, and its linears' inputs and outputs pass
    /// them), with the gradients the step made before the rerun began.
    Count recompute_forward_work;
    Count weight_copies;    ///< autocast's cast of one layer's matmul weights (and biases)
    Count uncached_copies;  ///< of those, the frozen weights': autocast caches none of them
    /// A schedule deferring W: what W reads of one layer, held from the end of its backward step
    /// until W.
    Count weight_reads;
};

/// What one device's timeline needs to know, already in bytes. Its layers (StageLayers) may be of
/// several kinds, each with its own LayerInputs.
struct TimelineInputs : StageLayers {
    bool loss = true;  ///< it computes the loss (the last pipeline stage)
    std::uint64_t microbatches =
        1;  ///< in the step: from the second on, the first's gradients are held
    /// A gradient buffer allocated for the whole run (Megatron-LM's, DeepSpeed's): every gradient
    /// is live at every step, from the first forward step on.
    bool persistent_gradients = false;
    /// The optimizer runs in backward (GradBuffer::stepped): each gradient is stepped and freed
    /// once whole, so the optimizer step has nothing left to step.
    bool stepped_gradients = false;
    /// The loop keeps the logits through backward (nanoGPT); else they go once the loss is made
    /// (Trainer).
    bool logits_held = true;
    Count weights, master_weights, optimizer_state;  ///< persistent through the whole step
    /// ZeRO-3: the input side's and the head's weights beyond this rank's shard, gathered while
    /// they compute, or from forward 1 to the end of backward where `root_kept` (FSDP1's root).
    Count input_gathered, head_gathered;
    bool root_kept = false;
    std::array<LayerInputs, max_layer_kinds> layer;  ///< by kind of layer
    /// Partial recomputation: the same of a layer past the first `recomputed` of its chunk, which
    /// keeps every activation (recompute none).
    std::array<LayerInputs, max_layer_kinds> not_recomputed;
    Count
        other_microbatches;  ///< kept activations of the other micro-batches a pipeline stage holds
    Count later_other_microbatches;  ///< the same at a later micro-batch (1F1B: one fewer left to
                                     ///< start)
    /// Several chunks a rank: other_microbatches counts the running micro-batch's chunks as its
    /// own, but in steady state, at its chunk c, its later chunks are not in flight (not begun, or
    /// through backward) and other micro-batches' chunks are in their place (measured: interleaved,
    /// validation/pipeline_schedules.py). One other chunk's bytes, and how many such places at most
    /// (at chunk 0; each later chunk one fewer).
    Count spare_chunk;
    std::uint64_t spare_chunks = 0, later_spare_chunks = 0;
    Count
        head_gradients;  ///< final norm and output head: ready after the first backward step starts
    Count buffered_gradients;  ///< into held gradients: a tied table's from the head until the
                               ///< embedding's backward
    /// The same with no gradient held yet, where the gradients are sharded (ZeRO-2/3) or offloaded:
    /// the table's gradient is whole until the embedding's backward hands it over.
    Count buffered_first_gradients;
    Count input_gradients;  ///< embeddings (untied): ready after the last backward step
    /// What each of the model's first layers keeps less than its kind's others (its input needing
    /// no gradient: position 1 under adapters, up to the first prompt's layer under LLaMA-Adapter),
    /// on the device that runs them as positions 1, 2, ...; from its forward to its backward.
    std::vector<Count> leading_spare;

    /// The leading positions (leading_spare's), each a step of its own.
    std::uint64_t leading() const { return leading_spare.size(); }
    /// The first positions whose forward steps are steps of their own: the leading ones, and the
    /// first where ZeRO-3 gathers the embedding for it alone (RootGather::per_use).
    std::uint64_t forward_singles() const {
        const bool first = input_gathered > Count(0) && !root_kept;
        return std::max<std::uint64_t>(leading(), first ? 1 : 0);
    }
    /// What positions first..last keep less than their kind's others.
    Count leading_spare_in(std::uint64_t first, std::uint64_t last) const {
        Count sum;
        for (std::uint64_t p = std::max<std::uint64_t>(first, 1); p <= last && p <= leading(); ++p)
            sum += leading_spare[p - 1];
        return sum;
    }
    Count input_side_kept;  ///< saved by the embedding side: from the first forward step to the
                            ///< last backward
    Count later_input_side_kept;  ///< the same at a later micro-batch
    Count logits;  ///< from the head's forward; held to the end of the step when logits_held
    /// Per layer: the k and v the model's output keeps beyond what backward saves (--kv-cache
    /// kept), from the layer's forward step for as long as the output lives (the logits' life).
    Count kv_cache;
    Count graph_held;  ///< per layer: its rows the graph holds past its backward (SavedTensor's)
    Count head_graph_held;  ///< the same of the head's, on the stage holding it
    Count kv_cache_whole;   ///< per layer: all of the k/v cache, which a layer's finished backward
                            ///< leaves
    Count loss_buffers;     ///< the loss step alone (the loss's fp32 softmax, what the head saves)
    Count logits_gradient;  ///< from the loss step until the top layer's backward step ends
    Count activation_gradient;  ///< the incoming gradient of each backward step
    Count forward_buffers;    ///< built by the forward pass for all layers, dropped after the loss
                              ///< (causal mask)
    Count recompute_buffers;  ///< the part of them recomputation keeps through the backward steps
    Count loss_work;  ///< the loss step's temporaries, with what the forward pass still holds
    /// The same at a later micro-batch, where the previous micro-batch's logits are still held: a
    /// loop that keeps its logits to the end of its micro-batch drops them when the next forward
    /// returns.
    Count later_loss_work;
    /// The part of loss_work (later_loss_work) the loss's forward holds, before its backward runs:
    /// all of it where the two are not told apart (the formula model).
    Count loss_forward_work, later_loss_forward_work;
    Count optimizer_work;  ///< the optimiser step's temporaries
    Count
        input_backward_work;  ///< what the embedding's backward adds to backward 1 over its layer's
    Count input_backward_work_held;  ///< the same when the gradients it writes are already held
    Count head_weight_copy;          ///< autocast's cast of the output head's matrix: the loss step
    /// The final norm's backward, the loss step's last op after the head's (the head program's
    /// largest backward workspace beyond the head's rows it has freed); none in the formula model.
    std::optional<Count> final_norm_work;
    Count persistent_weight_copies;  ///< narrow (fp8) linears' weight casts, module buffers: every
                                     ///< step
    /// Full recomputation under autocast: no layer saves its weights' casts, but autocast's cache
    /// holds every layer's until its region ends, before the loss's backward (loss step); each
    /// backward step casts its layer's again.
    bool weight_copies_recast = false;
    /// Activation offload: each layer's kept activations are on the device only around its steps
    /// (see kept_on_device); the other layers' wait in host memory.
    bool kept_offloaded = false;

    /// The positions whose kept activations are on the device at a step (loss: position L): every
    /// one up to it; offloaded, the layer computing and the one in transit (Transformer Engine's
    /// double buffer): in forward the one before, whose copy to the host may still be in flight; in
    /// backward the one before, being fetched back. The one after is freed when its backward step
    /// ends, as without offload.
    std::pair<std::uint64_t, std::uint64_t> kept_on_device(std::uint64_t position) const {
        if (!kept_offloaded) return {1, position};
        return {position > 1 ? position - 1 : 1, position};
    }

    /// `n` layers of each kind, times what one of that kind holds (`member`; `of`: which variant).
    Count per_kind(const KindCounts& n, Count LayerInputs::*member,
                   const std::array<LayerInputs, max_layer_kinds>* of = nullptr) const {
        const auto& each = of ? *of : layer;
        Count sum;
        for (std::size_t k = 0; k < kinds(); ++k) sum += Count(n[k]) * (each[k].*member);
        return sum;
    }
    /// The figures of the layer at `position` (1-based): its kind's, recomputed or not.
    const LayerInputs& at(std::uint64_t position) const {
        if (uniform()) return layer[0];
        return (recomputed_at(position) ? layer : not_recomputed)[kind_at(position)];
    }
    /// `member` summed over positions first..last (1-based, inclusive; none when first > last). A
    /// template, so each step inlines its one multiplication when every layer is one kind.
    template <Count LayerInputs::*member>
    Count over(std::uint64_t first, std::uint64_t last) const {
        if (first > last) return 0;
        if (uniform()) return Count(last - first + 1) * (layer[0].*member);
        return over_kinds(first, last, member);
    }
    Count over_kinds(std::uint64_t first, std::uint64_t last, Count LayerInputs::*member) const {
        if (closed_counts()) return over_one_kind(first, last, member);
        if (!partial()) return per_kind(between(first, last, false), member);
        return per_kind(between(first, last, true), member) +
               over_not_recomputed(first, last, member);
    }
    /// over_kinds where every layer is one kind in chunks of one width: counted in closed form.
    Count over_one_kind(std::uint64_t first, std::uint64_t last, Count LayerInputs::*member) const {
        const std::uint64_t n = last - first + 1;
        if (!partial()) return Count(n) * (layer[0].*member);
        const std::uint64_t recomputed_ones =
            count_within(last, recomputed) - count_within(first - 1, recomputed);
        return Count(recomputed_ones) * (layer[0].*member) +
               Count(n - recomputed_ones) * (not_recomputed[0].*member);
    }
    /// `member` summed over the positions first..last that keep every activation (none but under
    /// partial recomputation).
    Count over_not_recomputed(std::uint64_t first, std::uint64_t last,
                              Count LayerInputs::*member) const {
        if (!partial() || first > last) return 0;
        KindCounts n = between(first, last, false);
        const KindCounts recomputed_ones = between(first, last, true);
        for (std::size_t k = 0; k < kinds(); ++k) n[k] -= recomputed_ones[k];
        return per_kind(n, member, &not_recomputed);
    }
    /// The weights' casts that layers first..last still hold in the forward, once each has run.
    /// Recast (full recomputation under autocast): only autocast's cache holds a recomputed
    /// layer's, and it caches only the casts of tensors that require grad; a frozen weight's is
    /// gone once its op has run (measured: LoRA on nanoGPT's c_attn,
    /// validation/results/cpu-third-party-lora.json).
    Count casts_held(std::uint64_t first, std::uint64_t last) const {
        const Count all = over<&LayerInputs::weight_copies>(first, last);
        if (!weight_copies_recast) return all;
        const std::uint64_t gone =
            over<&LayerInputs::uncached_copies>(first, last).value() -
            over_not_recomputed(first, last, &LayerInputs::uncached_copies).value();
        return Count(all.value() - gone);
    }
    /// Layers of each kind among positions first..last (1-based, inclusive), only the recomputed
    /// ones when `recomputed_only`.
    KindCounts between(std::uint64_t first, std::uint64_t last, bool recomputed_only) const {
        KindCounts n = recomputed_only ? recomputed_counts(last) : counts(last);
        const KindCounts before =
            recomputed_only ? recomputed_counts(first - 1) : counts(first - 1);
        for (std::size_t k = 0; k < kinds(); ++k) n[k] -= before[k];
        return n;
    }
    /// Every gradient this device holds once its backward pass is done.
    Count all_gradients() const {
        return head_gradients + over<&LayerInputs::gradients>(1, layers) + input_gradients;
    }
    /// Whether micro-batch `microbatch` starts with every gradient present.
    bool gradients_held(std::uint64_t microbatch) const {
        return persistent_gradients || microbatch > 1;
    }
};

// step_at's pieces: the planner calls it millions of times a second, so each is inline.
namespace detail {

/// The whole model's k/v cache, held with the output: beyond what backward saves until a layer's
/// backward has run, then all of it (measured: cpu-buffers.json), once `finished` layers' have.
inline Count held_kv_cache(const TimelineInputs& in, std::uint64_t finished) {
    return in.logits_held
               ? Count(in.layers - finished) * in.kv_cache + Count(finished) * in.kv_cache_whole
               : Count(0);
}

/// What autograd's graph holds of the layers whose backward has run (`finished` of them), beside
/// what they keep; after backward, all of them while the loop holds the step's output (`after`:
/// the optimizer step, a later micro-batch's forward and loss). Measured on CPU with
/// bitsandbytes' MatMul4Bit: validation/results/cpu-third-party-litgpt-qlora.json.
inline Count held_by_graph(const TimelineInputs& in, std::uint64_t finished, bool after) {
    if (after)
        return in.logits_held ? Count(in.layers) * in.graph_held + in.head_graph_held : Count(0);
    return Count(finished) * in.graph_held + in.head_graph_held;
}

/// The kept activations at a step past the device's first `done` layers: the other micro-batches'
/// and the input side's, the device's own layers' on the device, and at a layer step of chunk c,
/// the chunks after it held by other micro-batches instead (spare_chunk).
inline Count kept_at_step(const TimelineInputs& in, Phase phase, std::uint64_t done, bool later) {
    const auto [first_kept, last_kept] = in.kept_on_device(done);
    const std::uint64_t spare = later ? in.later_spare_chunks : in.spare_chunks;
    const std::uint64_t chunk_index = done == 0 ? 0 : in.chunk_of(done - 1);
    const std::uint64_t spares =
        (phase == Phase::forward || phase == Phase::backward) && spare > chunk_index
            ? spare - chunk_index
            : 0;
    const Count layers = in.over<&LayerInputs::kept>(first_kept, last_kept);
    return (later ? in.later_input_side_kept + in.later_other_microbatches
                  : in.input_side_kept + in.other_microbatches) +
           Count(layers.value() - in.leading_spare_in(first_kept, last_kept).value()) +
           Count(spares) * in.spare_chunk;
}

/// The loss step's workspace and the layers' and the head's autocast casts. Under full
/// recomputation nothing saves the layers' casts: autocast's cache holds them until its region
/// exits, after the loss's forward and before its backward (called outside autocast; measured:
/// validation/results/cpu-third-party.json), so the step is the larger of its forward (the casts
/// beside the forward's part of the workspace) and its backward (the workspace, no casts). The
/// step ends with the final norm's backward (final_norm_moment).
inline void loss_work_and_casts(const TimelineInputs& in, Breakdown& b, bool later, bool held) {
    const Count copies = in.over<&LayerInputs::weight_copies>(1, in.layers);
    const Count work = later ? in.later_loss_work : in.loss_work;
    const Count forward = later ? in.later_loss_forward_work : in.loss_forward_work;
    const Count saved_copies = in.weight_copies_recast ? Count(0) : copies;
    b.weight_copies += saved_copies;
    b.workspace = work;
    Count cast = in.head_weight_copy;
    const Count cached = in.casts_held(1, in.layers);
    if (in.weight_copies_recast && forward + cached > work) {  // the forward's moment
        cast += cached;
        b.workspace = forward;
    }
    // The final norm's backward: the loss's workspace and the head's cast are gone, the head's
    // gradient written (added into held ones at once: AccumulateGrad runs first), as backward L
    // counts them.
    const Count gradient =
        held ? in.buffered_gradients : in.head_gradients + in.buffered_first_gradients;
    if (in.final_norm_work && *in.final_norm_work + gradient > b.workspace + cast) {
        b.workspace = *in.final_norm_work;
        b.gradients += gradient;
    } else {
        b.weight_copies += cast;
    }
}

/// ZeRO-3's gathered input side and head at a step (RootGather): the embedding's in forward 1 and
/// backward 1, the head's at the loss and backward L; both throughout where the root is kept.
inline Count root_gathered(const TimelineInputs& in, Phase phase, std::uint64_t position) {
    if (in.root_kept && phase != Phase::optimizer) return in.input_gathered + in.head_gathered;
    const bool ends = phase == Phase::forward || phase == Phase::backward;
    const bool head = phase == Phase::loss || (phase == Phase::backward && position == in.layers);
    return (ends && position == 1 ? in.input_gathered : Count(0)) +
           (head ? in.head_gathered : Count(0));
}

/// Backward step `position`'s bytes beyond the state step_at has set in `b`. `held`: the
/// gradients are held from the step's start (`held_gradients`); `kept`: kept_at_step's.
inline void backward_step(const TimelineInputs& in, Breakdown& b, std::uint64_t position, bool held,
                          Count held_gradients, Count kept, Count held_logits) {
    const std::uint64_t L = in.layers;
    const LayerInputs& here = in.at(position);
    // The layers after this one have passed their B: what their deferred W reads waits (measured:
    // validation/results/cpu-pipeline-schedules.json, ZB-H1). This layer's own too, as its linears
    // pass theirs before its peak (leaning high by those after it, and the inputs also rebuilt);
    // and its backward frees the k and v it saved at one op or another, the cache keeps them.
    b.kept_activations = kept + held_kv_cache(in, L - position + 1) +
                         held_by_graph(in, L - position, false) +
                         in.over<&LayerInputs::weight_reads>(position, L);
    b.rebuilt_activations = here.rebuilt;
    b.gathered_weights = here.gathered_weights + root_gathered(in, Phase::backward, position);
    // Recast: a recomputed layer casts its own again; one that keeps its activations saved its
    // casts.
    b.weight_copies += in.weight_copies_recast
                           ? (in.recomputed_at(position) ? here.weight_copies : Count(0)) +
                                 in.over_not_recomputed(1, position, &LayerInputs::weight_copies)
                           : in.over<&LayerInputs::weight_copies>(1, position);
    b.activation_gradient = in.activation_gradient;
    b.workspace =
        std::max(held ? here.backward_work_held : here.backward_work, here.recompute_forward_work) +
        in.recompute_buffers;
    if (position == 1)
        b.workspace =
            std::max(b.workspace, held ? in.input_backward_work_held : in.input_backward_work);
    b.logits = position == L ? held_logits + in.logits_gradient : held_logits;
    // The layers after this one have finished their backward steps.
    b.gradients = (held ? held_gradients + in.buffered_gradients
                        : in.head_gradients + in.over<&LayerInputs::gradients>(position + 1, L) +
                              in.buffered_first_gradients) +
                  here.gradient_bucket;
}

}  // namespace detail

/// One step of the timeline: `position` counts the device's layers, 1-based, for forward and
/// backward steps (so backward L is the first backward step); `microbatch` is 1 or 2 (every later
/// one).
inline Step step_at(const TimelineInputs& in, Phase phase, std::uint64_t position,
                    std::uint64_t microbatch = 1) {
    const std::uint64_t L = in.layers;
    const bool later = microbatch > 1, held = in.gradients_held(microbatch);
    Breakdown b;
    b.weights = in.weights;
    b.master_weights = in.master_weights;
    b.optimizer_state = in.optimizer_state;
    b.weight_copies = in.persistent_weight_copies;
    // Held gradients are live throughout; a ZeRO-2/3 bucket also while a backward step fills it.
    const Count held_gradients = held ? in.all_gradients() : Count(0);
    b.gradients = held_gradients;
    const std::uint64_t done = phase == Phase::loss ? L : position;  // the layers up to this step's
    const Count kept = detail::kept_at_step(in, phase, done, later);
    const Count held_logits = in.loss && in.logits_held ? in.logits : Count(0);
    // A later micro-batch's forward still has the last one's k/v cache.
    const Count cache =
        Count(done) * in.kv_cache +
        (later ? detail::held_kv_cache(in, L) + detail::held_by_graph(in, L, true) : Count(0));
    switch (phase) {
        case Phase::forward: {
            const LayerInputs& here = in.at(position);
            b.kept_activations = kept + cache;
            b.gathered_weights =
                here.gathered_weights + detail::root_gathered(in, Phase::forward, position);
            b.weight_copies += in.casts_held(1, position - 1) + here.weight_copies;
            b.workspace = in.forward_buffers + here.forward_work;
            if (later) b.logits = held_logits;  // the previous micro-batch's
            return {phase, in.layer_id(position - 1), b, microbatch};
        }
        case Phase::loss:
            b.kept_activations = kept + cache;
            b.gathered_weights = detail::root_gathered(in, Phase::loss, L);
            b.logits = in.logits + in.loss_buffers + in.logits_gradient;
            detail::loss_work_and_casts(in, b, later, held);
            return {phase, 0, b, microbatch};
        case Phase::backward:
            detail::backward_step(in, b, position, held, held_gradients, kept, held_logits);
            return {phase, in.layer_id(position - 1), b, microbatch};
        case Phase::optimizer:
            b.kept_activations = detail::held_kv_cache(in, L) + detail::held_by_graph(in, L, true);
            b.logits = held_logits;
            b.workspace = in.stepped_gradients ? Count(0) : in.optimizer_work;
            b.gradients = in.stepped_gradients ? Count(0) : in.all_gradients();
            return {phase, 0, b, in.microbatches};
    }
    return {phase, 0, b, microbatch};
}

/// The micro-batches a timeline shows: the first, and with several a later one (2) for all the
/// rest.
inline std::uint64_t shown_microbatches(const TimelineInputs& in) {
    return in.microbatches > 1 ? 2 : 1;
}

namespace detail {

/// The earliest largest step of a timeline as it is made (peak_index's answer, without a second
/// pass).
struct PeakSoFar {
    std::size_t index = 0;
    Count bytes;

    void consider(std::size_t i, Count total) {
        if (i == 0 || total > bytes) index = i, bytes = total;
    }
};

/// Appends `s`, weighing it against the peak so far when one is kept.
inline void add_step(std::vector<Step>& steps, PeakSoFar* peak, const Step& s) {
    if (peak) peak->consider(steps.size(), s.bytes.total());
    steps.push_back(s);
}

/// Steps `from`..`to` of `phase` (positions, either direction), where every category is linear in
/// the position (what peak_step relies on too): the first two from step_at, each later one the last
/// plus their difference. Modulo 2^64 that is exact, as the run's true values lie between its ends,
/// which fit.
inline void linear_run(std::vector<Step>& steps, PeakSoFar* peak, const TimelineInputs& in,
                       Phase phase, std::uint64_t from, std::uint64_t to,
                       std::uint64_t microbatch) {
    const bool down = to < from;
    const std::uint64_t count = (down ? from - to : to - from) + 1;
    add_step(steps, peak, step_at(in, phase, from, microbatch));
    if (count == 1) return;
    const std::uint64_t second = down ? from - 1 : from + 1;
    const Step next = step_at(in, phase, second, microbatch);
    const Breakdown delta = Breakdown::modulo(next.bytes, steps.back().bytes, std::minus<>());
    const std::size_t second_index = steps.size();
    steps.push_back(next);
    // Each later step is the one before (still in cache) plus the difference: one pass over the
    // steps.
    const StageLayers layers = in;  // a copy: the steps written below cannot alias it
    const std::uint64_t one = down ? ~std::uint64_t{0} : 1;  // +1 or -1, modulo 2^64
    for (std::uint64_t k = 2, position = second + one; k < count; ++k, position += one) {
        // Made in place from a copy of the second step (its phase and micro-batch), a category at a
        // time: a Step built aside and then copied in is read back in wider pieces than it was
        // written, which stalls every step on store-to-load forwarding.
        Step& s = steps.emplace_back(next);
        s.layer = layers.layer_id(position - 1);
        s.bytes = Breakdown::modulo(steps[steps.size() - 2].bytes, delta, std::plus<>());
    }
    if (!peak) return;
    // Each step's total is linear in the position too, so past the first step the run's earliest
    // largest is its second step or its last; the totals between those two fit when they do.
    const Count second_total = steps[second_index].bytes.total(),
                last_total = steps.back().bytes.total();
    if (last_total > second_total)
        peak->consider(steps.size() - 1, last_total);
    else
        peak->consider(second_index, second_total);
}

/// A run of one kind of layer. With activation offload the transit window of its lowest position
/// holds a layer of the run before: that step alone, the others linear.
inline void layer_run(std::vector<Step>& steps, PeakSoFar* peak, const TimelineInputs& in,
                      Phase phase, std::uint64_t from, std::uint64_t to, std::uint64_t microbatch) {
    if (!in.kept_offloaded || from == to)
        return linear_run(steps, peak, in, phase, from, to, microbatch);
    if (from < to) {  // forward: the lowest comes first
        add_step(steps, peak, step_at(in, phase, from, microbatch));
        return linear_run(steps, peak, in, phase, from + 1, to, microbatch);
    }
    linear_run(steps, peak, in, phase, from, to + 1, microbatch);
    add_step(steps, peak, step_at(in, phase, to, microbatch));
}

/// The lowest position a backward run from `b` may reach while staying linear: below it (at or
/// under the leading positions) each step differs by its own spare.
inline std::uint64_t leading_floor(const TimelineInputs& in, std::uint64_t b) {
    return b > in.leading() ? in.leading() : b;
}

/// timeline(in), and its peak into `peak` when one is asked for.
inline std::vector<Step> timeline(const TimelineInputs& in, PeakSoFar* peak) {
    std::vector<Step> steps;
    const std::uint64_t shown = shown_microbatches(in), L = in.layers;
    steps.reserve(shown * (2 * L + 1) + 1);
    for (std::uint64_t mb = 1; mb <= shown; ++mb) {
        for (std::uint64_t a = 1, b; a <= L; a = b + 1) {
            // The leading positions keeping less than the rest (leading_spare): a step each.
            b = a <= in.forward_singles() ? a : in.run_end(a);
            layer_run(steps, peak, in, Phase::forward, a, b, mb);
        }
        if (in.loss) add_step(steps, peak, step_at(in, Phase::loss, 0, mb));
        if (L >= 1) add_step(steps, peak, step_at(in, Phase::backward, L, mb));
        for (std::uint64_t b = L - 1, a; L >= 3 && b >= 2; b = a - 1) {
            a = std::max<std::uint64_t>({2, in.run_start(b), leading_floor(in, b)});
            layer_run(steps, peak, in, Phase::backward, b, a, mb);
        }
        if (L >= 2) add_step(steps, peak, step_at(in, Phase::backward, 1, mb));
    }
    add_step(steps, peak, step_at(in, Phase::optimizer, 0));
    return steps;
}

}  // namespace detail

/// Every step, in order: for micro-batch 1 (and 2, standing for every later one) forward 1..L, loss
/// (last stage), backward L..1; then the optimizer. Backward L (the logits' gradient) and backward
/// 1 (the embedding's backward) differ; the steps between are linear in the position within each
/// run of one kind of layer.
inline std::vector<Step> timeline(const TimelineInputs& in) {
    return detail::timeline(in, nullptr);
}

/// A timeline and its peak_index.
struct TimelineWithPeak {
    std::vector<Step> steps;
    std::size_t peak = 0;
};

/// timeline(in) and peak_index of it in one pass: within each linear run only the ends are weighed.
inline TimelineWithPeak timeline_with_peak(const TimelineInputs& in) {
    detail::PeakSoFar peak;
    std::vector<Step> steps = detail::timeline(in, &peak);
    return {std::move(steps), peak.index};
}

/// The steps that can be timeline(in)'s peak, without building it: within the forward steps and
/// within backward L-1..2 of a micro-batch, each run of one kind of layer is linear in the
/// position, so the earliest largest step is one of forward 1, the ends of each forward run, loss,
/// backward L, the ends of each backward run, backward 1 (of each micro-batch shown) and optimizer.
/// One kind: forward 1 and L, backward L, L-1 and 1, as the steps between are dominated by one of
/// their ends. With activation offload also the step next to each run's lowest (layer_run). These
/// candidates, each handed to `visit` in time order (forward 1 only `with_first`): peak_step is
/// their earliest largest. Not flattened: inlining step_at's whole tree at each of its dozen
/// calls, in every instantiation, cost four minutes of compiling for a few percent of its time.
template <bool with_first = true, class Visit>
inline void each_peak_candidate(const TimelineInputs& in, Visit&& visit) {
    const std::uint64_t L = in.layers;
    if constexpr (with_first) visit(step_at(in, Phase::forward, 1));
    const auto consider = [&](Phase phase, std::uint64_t position, std::uint64_t mb) {
        visit(step_at(in, phase, position, mb));
    };
    // One kind, every layer recomputed alike, nothing offloaded: runs break only where the spare
    // chunks change (TimelineInputs::spare_chunks), chunk by chunk below the spares' count S, and a
    // step's value there is linear in the chunk's index too; so chunks 0 and S - 1 stand for those,
    // and the chunks from S on are one run.
    const bool spares_only = in.mixed && !in.several_kinds && !in.partial() && !in.kept_offloaded &&
                             !in.one_chunk() && in.equal_chunks() && in.forward_singles() == 0;
    const auto next_run_end = [&](std::uint64_t a, std::uint64_t spare) {
        if (!spares_only) return in.run_end(a);
        const std::uint64_t c = (a - 1) / in.chunk;
        if (c >= spare) return L;
        return (c + 1) * in.chunk;
    };
    const auto next_run_start = [&](std::uint64_t b, std::uint64_t spare) {
        if (!spares_only) return in.run_start(b);
        const std::uint64_t c = (b - 1) / in.chunk;
        return c >= spare ? spare * in.chunk + 1 : c * in.chunk + 1;
    };
    // Where to go next: from chunk 1 straight to chunk S - 1 (forward), or back from S - 1 to 1
    // (backward).
    const auto skip_up = [&](std::uint64_t a, std::uint64_t spare) {
        return spares_only && spare >= 3 && a == in.chunk + 1 ? (spare - 1) * in.chunk + 1 : a;
    };
    const auto skip_down = [&](std::uint64_t b, std::uint64_t spare) {
        return spares_only && spare >= 3 && b == (spare - 1) * in.chunk ? in.chunk : b;
    };
    for (std::uint64_t mb = 1; mb <= shown_microbatches(in);
         ++mb) {  // in time order: a tie keeps the earliest
        const std::uint64_t spare = mb > 1 ? in.later_spare_chunks : in.spare_chunks;
        if (mb > 1) consider(Phase::forward, 1, mb);
        for (std::uint64_t a = 1, b; a <= L; a = skip_up(b + 1, spare)) {
            b = a <= in.forward_singles() ? a : next_run_end(a, spare);
            if (a > 1) consider(Phase::forward, a, mb);
            // Offloaded: the steps after a run's lowest are linear (layer_run), from its second.
            if (in.kept_offloaded && b > a + 1) consider(Phase::forward, a + 1, mb);
            if (b > a) consider(Phase::forward, b, mb);
        }
        if (in.loss) consider(Phase::loss, 0, mb);
        consider(Phase::backward, L, mb);
        for (std::uint64_t b = L - 1, a; L >= 3 && b >= 2; b = skip_down(a - 1, spare)) {
            a = std::max<std::uint64_t>(
                {2, next_run_start(b, spare), detail::leading_floor(in, b)});
            consider(Phase::backward, b, mb);
            if (in.kept_offloaded && b > a + 1) consider(Phase::backward, a + 1, mb);
            if (a < b && (!in.uniform() || in.kept_offloaded)) consider(Phase::backward, a, mb);
        }
        if (L >= 2) consider(Phase::backward, 1, mb);
    }
    consider(Phase::optimizer, 0, 1);
}

/// The peak step of timeline(in) without building it: the earliest largest of
/// each_peak_candidate's steps.
inline Step peak_step(const TimelineInputs& in) {
    Step best = step_at(in, Phase::forward, 1);
    each_peak_candidate<false>(in, [&](const Step& s) {
        if (s.bytes.total() > best.bytes.total()) best = s;
    });
    return best;
}

/// Index of the step with the most live bytes; the earliest one when several tie.
inline std::size_t peak_index(const std::vector<Step>& steps) {
    std::size_t best = 0;
    Count most = steps.empty() ? Count(0) : steps[0].bytes.total();
    for (std::size_t i = 1; i < steps.size(); ++i) {
        const Count bytes = steps[i].bytes.total();
        if (bytes > most) best = i, most = bytes;
    }
    return best;
}

}  // namespace memcalc
