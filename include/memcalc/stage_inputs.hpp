#pragma once
/// A pipeline stage's timeline inputs on one rank (stage_inputs), filled in pieces from the
/// workload and the stage's facts: its state, each layer's holdings and workspaces, the other
/// micro-batches in flight, the loss, the input side. Named for its entry point: timeline.hpp
/// defines TimelineInputs and turns them into steps, whatever filled them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>

#include "memcalc/activations.hpp"
#include "memcalc/bitsandbytes.hpp"
#include "memcalc/blocks/ends.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/layer_work.hpp"
#include "memcalc/layers.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/stage_facts.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"
#include "memcalc/workload.hpp"

namespace memcalc {

// stage_inputs' pieces, in the order it calls them: each fills its part of a stage's inputs.

/// ZeRO-3 gathers the input side's and the head's weights whole (RootGather): what that adds to
/// the shard this rank keeps (nothing kept where the parameters are offloaded).
inline void set_root_gathered(TimelineInputs& in, const Workload& w, const Parallelism& p,
                              const StageFacts& f) {
    if (p.zero < 3) return;
    const auto beyond_shard = [&](Count bytes) {
        const Count own =
            p.offload == Offload::parameters ? Count(0) : ceil_div(bytes, p.dense_shards());
        return Count(bytes.value() - own.value());
    };
    in.input_gathered = beyond_shard(f.input_weight_bytes);
    in.head_gathered = beyond_shard(f.head_weight_bytes);
    in.root_kept = w.framework.root_gather == RootGather::kept;
}

/// What a stage holds whatever its steps: its layers, its state, the k/v cache, narrow linears'
/// weight casts.
inline void set_stage_state(TimelineInputs& in, const Workload& w, const Parallelism& p,
                            const StageFacts& f) {
    const std::uint64_t V = w.model.vocab;
    static_cast<StageLayers&>(in) = f.layers;
    in.loss = holds_head(p, f.stage);
    in.microbatches = p.steps_per_batch();
    in.persistent_gradients = w.framework.grad_buffer == GradBuffer::persistent;
    in.stepped_gradients = w.framework.grad_buffer == GradBuffer::stepped;
    in.logits_held = w.framework.logits == LogitsLife::held;
    in.kv_cache = w.kv_cache.on_rank(p, V);
    in.kv_cache_whole = w.kv_cache_whole.on_rank(p, V);
    in.graph_held = w.graph_held.on_rank(p, V);
    in.head_graph_held = in.loss ? w.head_graph_held.on_rank(p, V) : Count(0);
    // Per layer: the larger of the two recomputations' caches, leaning high where they differ.
    if (in.partial()) in.kv_cache = std::max(in.kv_cache, w.kv_cache_not_recomputed.on_rank(p, V));
    in.weights = f.state.weights;
    set_root_gathered(in, w, p, f);
    in.master_weights = f.state.master_weights;
    in.optimizer_state = f.state.optimizer_state;
    in.weight_copies_recast = w.recipe.autocast && checkpoints_layer(w.recompute);
    if (const auto& narrow = w.recipe.linears) {
        // Transformer Engine's casts of the stage's weights (this rank's tensor- and
        // expert-parallel share, not ZeRO's: it casts whole weights), module buffers kept for the
        // run.
        // A layer's linear weights as one run of elements: their block scales rounded up once.
        for (std::size_t k = 0; k < w.layers.size(); ++k)
            in.persistent_weight_copies +=
                Count(f.kind_layers[k]) * narrow->weight_casts *
                narrow->storage.bytes(w.parameters->linear_weights[k].on_rank(p, V));
    }
}

/// A layer of kind `k`'s weights as ZeRO-3 gathers them: FSDP2's float8 all-gather gathers its
/// linears' in float8 (LinearCasts::gathered_weight_bytes).
inline Count gathered_layer_bytes(const Workload& w, const Parallelism& p, const StageFacts& f,
                                  std::size_t k) {
    const LinearCasts* casts = w.recipe.casts;
    if (casts == nullptr || casts->gathered_weight_bytes == 0) return f.layer_weight_bytes[k];
    const Count linear = w.parameters->linear_weights[k].on_rank(p, w.model.vocab);
    return Count(f.layer_weight_bytes[k].value() -
                 (linear * (w.recipe.weight_bytes() - casts->gathered_weight_bytes)).value());
}

/// The most one layer holds, over the kinds a stage runs.
struct LayerMaxima {
    Count kept;         ///< its kept activations, with the weights' casts it keeps
    Count kept_whole;   ///< the same of a layer that keeps every activation (partial recomputation)
    Count activations;  ///< its kept activations alone (either variant)
    Count copies;       ///< its weights' casts alone (either variant)
    Count weights;      ///< its weights, as ZeRO-3 gathers them
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
        if (w.recipe.autocast) {
            in.layer[k].weight_copies = w.parameters->cast_per_layer[k].on_rank(p, V) * d;
            in.layer[k].uncached_copies = w.parameters->uncached_per_layer[k].on_rank(p, V) * d;
        }
        if (defers_weight_gradients(p, f.stage))
            in.layer[k].weight_reads = w.weight_pass_reads[k].on_rank(p, V);
        if (in.partial()) {
            in.not_recomputed[k].weight_reads = in.layer[k].weight_reads;
            in.not_recomputed[k].kept = w.not_recomputed[k].kept.on_rank(p, V);
            in.not_recomputed[k].weight_copies = in.layer[k].weight_copies;
            in.not_recomputed[k].uncached_copies = in.layer[k].uncached_copies;
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
        most.weights = std::max(most.weights, gathered_layer_bytes(w, p, f, k));
    }
    // The model's first layers, their input needing no gradient, keep less than their kind's
    // others.
    in.leading_spare.clear();
    if (holds_embedding(p, f.stage) && !in.partial())
        for (const SplitBytes& kept : w.leading_kept) {
            const Count own = kept.on_rank(p, V);
            in.leading_spare.push_back(
                own < in.layer[0].kept ? Count(in.layer[0].kept.value() - own.value()) : Count(0));
        }
    while (!in.leading_spare.empty() && in.leading_spare.back() == Count(0))
        in.leading_spare.pop_back();
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
    std::uint64_t stage;

    Count operator()(std::uint64_t in_flight) const {
        const Count others = Count(other_in_flight(p, in_flight));
        // Offloaded, their activations wait on the host but for one layer each, the last of its
        // run, which Megatron-LM (cpu_offloading_num_layers below the layers) and torchtitan leave
        // on the device, and whose copy the next backward need not wait for. The casts stay on the
        // device (leaning high).
        const Count each =
            offloaded ? one(stage_copies, chunk_copies) + activations : one(stage_kept, chunk_kept);
        const ScheduleRow& row = schedule_row(p);
        const Count reads = one(stage_reads, chunk_reads);
        if (!row.deferral)  // any in flight may wait for W: each the larger, leaning high
            return others * std::max(each, reads) + others * mask;
        // Where W waits by the schedule's order, those past their B hold its reads alone.
        const Deferral d = row.deferral(p.pp, stage, in_flight);
        const std::uint64_t then = other_in_flight(p, d.in_flight);
        const std::uint64_t deferred = std::min(d.deferred, then);
        const Count waiting = Count(then - deferred) * each + Count(deferred) * reads;
        return (d.throughout ? waiting : std::max(others * each, waiting)) + others * mask;
    }

    /// One other micro-batch's (chunk's) share of a stage's `stage` or a chunk's `chunk` bytes.
    Count one(Count stage, Count chunk) const { return chunks_per_rank(p) == 1 ? stage : chunk; }
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
    // Chunks of unequal length (a mirrored rank's model ends): each counted as the longest.
    const std::uint64_t chunk = in.largest_chunk();
    const std::uint64_t chunk_recomputed = std::min(in.recomputed, chunk);
    const Count chunk_kept =
        Count(chunk_recomputed) * most.kept + Count(chunk - chunk_recomputed) * most.kept_whole;
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
            Count(chunk) * most.copies,
            most.activations,
            stage_reads,
            Count(chunk) * most_reads,
            mask,
            f.stage};
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

/// The gradients one wrapped unit (a layer; the input side and the head together) keeps on this
/// rank, of `trained` parameters among `all` (each with its experts' part): the trained ones'; or
/// under flat units (FSDP1's flat parameter) all of them once any trains. Unsharded where the
/// micro-batches before the last hold them so (GradSync::last_microbatch); `bucket`: the whole
/// gradient, until a reduce-scatter after every micro-batch shards it (ZeRO-2/3).
struct UnitGradients {
    Count kept, bucket;
};
inline UnitGradients unit_gradients(const Workload& w, const Parallelism& p, Count trained,
                                    Count trained_experts, Count all, Count all_experts) {
    if (w.framework.grad_units == GradUnits::flat && trained > Count(0))
        trained = all, trained_experts = all_experts;
    const Count g = w.recipe.gradient_bytes();
    const bool unsharded = p.zero >= 2 && w.framework.grad_sync == GradSync::last_microbatch &&
                           p.steps_per_batch() > 1;  // not with an offload: refused
    if (unsharded) return {trained * g, Count(0)};
    const Count dense = Count(trained.value() - trained_experts.value());
    return {kept_gradients(p, dense, trained_experts) * g, p.zero >= 2 ? trained * g : Count(0)};
}

/// The optimizer in backward (GradBuffer::stepped): no gradient is held past the moment it is
/// whole and stepped, but a tied table's, whose two uses autograd sums first (from the head's
/// backward to the embedding's). A layer's backward step has one fresh gradient at a time (its
/// largest tensor's), then that tensor's step beside it.
inline void step_in_backward(TimelineInputs& in, const Workload& w, const Parallelism& p,
                             const StageFacts& f) {
    const std::uint64_t V = w.model.vocab;
    const Count g = w.recipe.gradient_bytes(), t = stepped_temporary_bytes(w);
    const bool both_ends = holds_embedding(p, f.stage) && holds_head(p, f.stage);
    in.head_gradients = both_ends && w.model.tied_embeddings
                            ? w.parameters->trainable().tied_embedding.on_rank(p, V) * g
                            : Count(0);
    in.input_gradients = 0;
    const auto step_layer = [&](LayerInputs& layer, std::size_t k) {
        const Count fresh = w.parameters->fresh_gradient[k].on_rank(p, V);
        layer.gradients = 0, layer.gradient_bucket = 0;
        layer.backward_work = std::max(layer.backward_work_held, fresh * (g + t));
    };
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        step_layer(in.layer[k], k);
        if (in.partial()) step_layer(in.not_recomputed[k], k);
    }
}

/// The workspaces of one layer's steps. `written`: the layer's gradients written so far, unless a
/// bucket or the held gradients have them already; `cast_bytes`: autocast's casts, else 0.
inline void set_layer_workspaces(LayerInputs& layer, const LayerWork& work, const Workload& w,
                                 const Parallelism& p, std::size_t k, Count written,
                                 Count cast_bytes) {
    const std::uint64_t V = w.model.vocab;
    const Count g = w.recipe.gradient_bytes();
    layer.forward_work = largest_on_rank(work.forward_work, p, V, 0, nullptr, cast_bytes);
    layer.backward_work = largest_on_rank(work.backward_work, p, V, written, nullptr, cast_bytes);
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
    // The input side and the head: one unit where they are flat (FSDP1's root), else each alone.
    const bool root = w.framework.grad_units == GradUnits::flat && t.input + t.head > Count(0);
    in.head_gradients = unit_gradients(w, p, root ? t.input + t.head : t.head, t.head_experts,
                                       f.all.input + f.all.head, f.all.head_experts)
                            .kept;
    in.input_gradients = root ? Count(0) : unit_gradients(w, p, t.input, 0, 0, 0).kept;
    const std::uint64_t gathered = std::min<std::uint64_t>(p.gathered_layers, in.layers);
    for (std::size_t k = 0; k < w.layers.size(); ++k) {
        LayerInputs& layer = in.layer[k];
        // ZeRO-3 gathers each layer's full weights before its forward and its backward step: this
        // one's and the prefetched ones' (counted as the stage's largest kind).
        if (p.zero >= 3 && gathered > 0)
            layer.gathered_weights =
                gathered_layer_bytes(w, p, f, k) + Count(gathered - 1) * most_weights;
        const UnitGradients unit = unit_gradients(w, p, t.per_layer[k], t.per_layer_experts[k],
                                                  f.all.per_layer[k], f.all.per_layer_experts[k]);
        layer.gradients = unit.kept, layer.gradient_bucket = unit.bucket;
        // Under autocast the step counts the layer's casts whole; an op takes off those not made
        // yet or freed already.
        const Count cast_bytes = w.recipe.autocast ? Count(d) : Count(0);
        // The layer's gradients written so far count unless a bucket or the held gradients have
        // them already.
        const Count written = p.zero >= 2 ? Count(0) : g;
        set_layer_workspaces(layer, w.layers[k], w, p, k, written, cast_bytes);
        // The rerun forward: its largest op with the rows made before it, or all the rows, beside
        // the gradients made before the rerun (CheckpointHeld::rerun).
        if (checkpoints_layer(w.recompute)) {
            const Count rerun_work =
                largest_on_rank(w.layers[k].rerun_work, p, V, 0, nullptr, cast_bytes);
            const Count rerun =
                std::max(rerun_work, layer.rebuilt) + w.layers[k].held_by_rerun.on_rank(p, V);
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
    if (in.stepped_gradients) step_in_backward(in, w, p, f);
}

/// Liger's fused linear cross-entropy (fused_linear_cross_entropy.py): its forward zeroes the head
/// weight's gradient (the weight's dtype; the whole vocabulary, as it gathers a sharded head) and a
/// loss per token (fp32) with a mask of the counted ones, then runs the head over a chunk of
/// tokens at a time, the chunk's logits bounded by the hidden states' size: the next power of two
/// of tokens / ceil(V / h). Its backward only scales what forward kept. `tokens`: on this rank;
/// the logits and their gradient set_loss_inputs has left at none.
inline void set_fused_linear_loss_work(TimelineInputs& in, const Workload& w, Count tokens) {
    const std::uint64_t V = w.model.vocab, h = w.model.hidden;
    const Count head_gradient = Count(V) * h * bytes_per_element(w.recipe.stream());
    const Count per_chunk = ceil_div(tokens, V / h + (V % h != 0));
    Count chunk = 1;
    while (chunk < per_chunk) chunk = chunk * 2;
    const Count logits = std::min(chunk, tokens) * V * w.recipe.activation_bytes();
    in.loss_forward_work = head_gradient + logits + tokens * Count(4 + 1) + in.forward_buffers;
    in.loss_work = std::max(in.loss_forward_work, head_gradient + in.recompute_buffers);
    in.later_loss_forward_work = in.loss_forward_work;
    in.later_loss_work = in.loss_work;
}

/// A chunked loss's chunk of the logits' `sbV` elements on this rank (all of them unchunked): a
/// chunk of loss_chunk_tokens of each sequence, or one of loss_chunks equal ones.
inline Count loss_part(const Workload& w, Count sbV) {
    const Framework& f = w.framework;
    if (!chunked_loss(f.loss)) return sbV;
    if (f.loss_chunk_tokens == 0) return ceil_div(sbV, f.loss_chunks);
    const std::uint64_t tokens = std::uint64_t{w.seq} * w.micro_batch;
    const Count chunk = Count(std::min<std::uint64_t>(f.loss_chunk_tokens, w.seq)) * w.micro_batch;
    return std::min(sbV, ceil_div(sbV * chunk, tokens));
}

/// The loss step's two phases under autograd's order: its forward, `forward` beside the buffers
/// (and the logits where the loop drops them: a loop that keeps only the loss drops them when the
/// forward returns, before the loss's backward, measured), and its `backward`; the previous
/// micro-batch's logits, held, live until this forward returns, not into its backward.
inline void set_loss_phases(TimelineInputs& in, Count forward, Count backward,
                            Count previous_logits) {
    in.logits_gradient = 0;
    const Count own_logits = in.logits_held ? Count(0) : in.logits;
    if (!in.logits_held) in.logits = 0;
    in.loss_forward_work = forward + in.forward_buffers + own_logits;
    in.loss_work = std::max(in.loss_forward_work, backward);
    in.later_loss_forward_work = in.loss_forward_work + previous_logits;
    in.later_loss_work = std::max(in.later_loss_forward_work, backward);
}

/// The loss step under autograd's order: logits.float() copies them while the loss runs forward
/// (not when they are fp32 already); its backward holds the log-probabilities' gradient and the
/// logits' (in the loss's dtype), and the head's backward frees the last of them before layer L's
/// starts. Chunked, the copy and the two gradients are a chunk's. `sbV`: the logits' elements on
/// this rank; `previous_logits`: the last micro-batch's, if the loop holds them.
inline void set_autograd_loss_work(TimelineInputs& in, const Workload& w, Count sbV,
                                   std::optional<DType> loss, Count previous_logits) {
    const std::uint64_t d = w.recipe.activation_bytes();
    const std::uint64_t l = loss ? bytes_per_element(*loss) : 0;
    // In place (Megatron's): the copy is the saved softmax, and backward writes over it, making
    // only the logits' gradient in the compute dtype.
    const bool in_place = w.framework.loss == LossKernel::fp32_inplace;
    const Count part = loss_part(w, sbV);
    // logits.float() copies them, unless the model returned them in fp32 (logits_fp32).
    const DType logits = w.model.logits_fp32 ? DType::fp32 : w.recipe.activations;
    const Count copy = loss && *loss != logits && !in_place ? part * l : Count(0);
    const Count backward = (in_place ? sbV * d : part * (2 * l)) + in.recompute_buffers;
    set_loss_phases(in, copy, backward, previous_logits);
}

/// torchtune's chunked loss compiled (LossKernel::chunked_compiled): no fp32 copy in forward; the
/// compiled graphs keep their chunks, and autograd runs every chunk's loss backward before the
/// head's (they were made last), so the logits, each turning into its gradient, live into the
/// head's backward: beside a chunk's loss backward its gradient alone, no fp32 work (measured on
/// torch 2.6: validation/chunked_loss_peak.py); beside the head's, its weight's gradient, and from
/// the second chunk on the next one added to it.
inline void set_compiled_chunked_loss_work(TimelineInputs& in, const Workload& w,
                                           const Parallelism& p, Count sbV, Count previous_logits) {
    const std::uint64_t d = w.model.logits_fp32 ? dtype::fp32 : w.recipe.activation_bytes();
    const Count part = loss_part(w, sbV);
    const Count head_gradient =
        w.parameters->trainable().head.on_rank(p, w.model.vocab) * w.recipe.gradient_bytes();
    const Count loss = (sbV + part) * d;
    const Count head =
        std::max(sbV * d + head_gradient,
                 part < sbV ? Count(sbV.value() - part.value()) * d + head_gradient * 2 : Count(0));
    set_loss_phases(in, Count(0), std::max(loss, head) + in.recompute_buffers, previous_logits);
}

/// A 4-bit head (a quantiser that converts every linear) dequantises its weight for each chunk's
/// product, forward and backward. Autograd runs every chunk's loss backward first (made last), so
/// the head's backward has the logits' gradients, in the compute dtype, beside it; the
/// log-probabilities (`log_probs` of the loss step's buffers) have gone into them. Measured on
/// CPU with a stand-in of bitsandbytes' MatMul4Bit (validation/third_party/litgpt_run.py).
inline void set_dequantized_head_work(TimelineInputs& in, const Workload& w, const Parallelism& p,
                                      Count log_probs) {
    const ParameterSplits& s = *w.parameters;
    const std::uint64_t V = w.model.vocab;
    const Count head = s.dequantized_head.on_rank(p, V) *
                       dequantized_bytes(s.head_quantized_from, w.recipe.precision().compute);
    if (head == Count(0)) return;
    const Count sbV = ceil_div(Count(w.seq) * w.micro_batch, p.cp) * ceil_div(V, p.tp);
    const Count moment = sbV * w.recipe.activation_bytes() + head;
    const Count beyond = moment > log_probs ? Count(moment.value() - log_probs.value()) : Count(0);
    in.loss_work = std::max(in.loss_work, beyond);
    in.later_loss_work = std::max(in.later_loss_work, beyond);
}

/// The last stage's logits, the loss's buffers and workspaces, and the logits' gradient.
inline void set_loss_inputs(TimelineInputs& in, const Workload& w, const Parallelism& p) {
    const std::uint64_t V = w.model.vocab, d = w.recipe.activation_bytes();
    // Vocabulary-parallel logits: each tensor-parallel rank holds ceil(V / tp) columns.
    const Count sbV = ceil_div(Count(w.seq) * w.micro_batch, p.cp) * ceil_div(V, p.tp);
    const std::uint64_t returned = w.model.logits_fp32 ? std::max<std::uint64_t>(d, 4) : d;
    in.logits = w.framework.loss == LossKernel::fused_linear ? Count(0) : sbV * returned;
    // The loss's log-probabilities and gradients, in its dtype: none of the vocabulary's width for
    // a fused kernel, which writes its gradient over the logits.
    const std::optional<DType> loss =
        loss_dtype(w.framework.loss, w.recipe.precision(), w.model.logits_fp32);
    const std::uint64_t l = loss ? bytes_per_element(*loss) : 0;
    const Count previous_logits =
        in.logits_held ? in.logits : Count(0);  // the last micro-batch's, if the loop holds them
    // The formula model: the loss reads a copy of the logits in its dtype (the formula's "fp32
    // softmax"); the architecture model adds what the head and the loss save for backward.
    in.loss_buffers = sbV * l + w.head.on_rank(p, V);
    in.logits_gradient = loss ? sbV * d : Count(0);
    in.later_loss_work =
        previous_logits;  // the formula's loss step, beside the previous micro-batch's logits
    in.loss_forward_work = in.loss_work, in.later_loss_forward_work = in.later_loss_work;
    if (w.autograd_order) {
        in.loss_buffers = w.head.on_rank(p, V);
        if (w.framework.loss == LossKernel::fused_linear)
            set_fused_linear_loss_work(in, w, ceil_div(Count(w.seq) * w.micro_batch, p.cp));
        else if (w.framework.loss == LossKernel::chunked_compiled)
            set_compiled_chunked_loss_work(in, w, p, sbV, previous_logits);
        else
            set_autograd_loss_work(in, w, sbV, loss, previous_logits);
        in.final_norm_work = largest_on_rank(w.head_work, p, V, 0);
        if (in.stepped_gradients && !w.model.tied_embeddings)  // the head stepped once whole
            in.final_norm_work = std::max(
                *in.final_norm_work, w.parameters->trainable().head.on_rank(p, V) *
                                         (w.recipe.gradient_bytes() + stepped_temporary_bytes(w)));
        set_dequantized_head_work(in, w, p, sbV * l);
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
        Count fresh = (f.trainable.input + table) * g;
        if (in.stepped_gradients) {  // then each stepped beside its temporaries (the sum is the
                                     // table head_gradients holds)
            const Count t = stepped_temporary_bytes(w);
            fresh = std::max(fresh, f.trainable.input * (g + t) + Count(table.value() / 2) * t);
        }
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
    in.forward_buffers =
        w.forward_buffers.on_rank(p, w.model.vocab) +
        (holds_embedding(p, f.stage) ? w.forward_locals.on_rank(p, w.model.vocab) : Count(0));
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

}  // namespace memcalc
