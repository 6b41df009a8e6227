#pragma once
/// What one rank of a pipeline stage holds under a layout apart from its timeline (StageFacts): its
/// layers, its parameters and their state after tensor, expert, pipeline and ZeRO splits, what
/// offload keeps on the host, the optimiser step's temporaries. Apart from stage_inputs.hpp: plan
/// and the host-memory checks read these facts without building a timeline's inputs.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>

#include "memcalc/activations.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/layers.hpp"
#include "memcalc/model.hpp"
#include "memcalc/optimizer.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/units.hpp"
#include "memcalc/workload.hpp"

namespace memcalc {

/// Parameters on one rank of a stage, by group: after tensor, expert and pipeline splits.
struct RankParams {
    Count input, head;
    Count head_experts;  ///< the experts' part of head (multi-token prediction's layer)
    std::array<Count, max_layer_kinds> per_layer{};          ///< one layer of each kind
    std::array<Count, max_layer_kinds> per_layer_experts{};  ///< the experts' part of per_layer

    /// With `n` layers of each of `kinds` kinds.
    Count total(const KindCounts& n, std::size_t kinds) const {
        return input + layers(n, kinds, per_layer) + head;
    }
    Count experts(const KindCounts& n, std::size_t kinds) const {
        return layers(n, kinds, per_layer_experts) + head_experts;
    }
    static Count layers(const KindCounts& n, std::size_t kinds,
                        const std::array<Count, max_layer_kinds>& each) {
        Count sum;
        for (std::size_t k = 0; k < kinds; ++k) sum += Count(n[k]) * each[k];
        return sum;
    }
};

/// `embeds_on_last`: multi-token prediction embeds the next tokens on the last stage, which keeps
/// its own copy of the input side (Megatron-LM's GPTModel: pre_process or mtp_process).
inline RankParams rank_params(const StateClass& groups, const Parallelism& p, std::uint64_t V,
                              std::size_t kinds, bool first, bool last,
                              bool embeds_on_last = false) {
    RankParams r;
    for (std::size_t k = 0; k < kinds; ++k) {
        r.per_layer[k] = groups.per_layer[k].on_rank(p, V);
        r.per_layer_experts[k] = groups.per_layer[k].experts_on_rank(p);
    }
    if (first) r.input = groups.input.on_rank(p, V);
    if (last) r.head = groups.head.on_rank(p, V), r.head_experts = groups.head.experts_on_rank(p);
    // A tied embedding is also the head's matrix: across stages the first keeps its own copy.
    if (first && !last) r.input += groups.tied_embedding.on_rank(p, V);
    if (last && !first && embeds_on_last) r.head += groups.input.on_rank(p, V);
    return r;
}

/// The layers pipeline stage `stage` runs, with the model's pattern of kinds.
inline StageLayers stage_layers(const Workload& w, const Parallelism& p, std::uint64_t stage) {
    StageLayers s = rank_layers(p, w.model.layers, stage);
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
    Count input_weight_bytes, head_weight_bytes;  ///< the same of the input side and the head
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
    if (last) dense = dense + o.head.on_rank(p, V), experts = experts + o.head.experts_on_rank(p);
    if (first && !last)
        dense = dense + o.tied_embedding.on_rank(p, V);  // the first stage's own copy (rank_params)
    if (last && !first && w.model.mtp_layers > 0)
        dense = dense + o.input.on_rank(p, V);  // multi-token prediction's copy (rank_params)
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
    const CausalMaskBufferRow& mask = causal_mask_buffer(m.causal_mask_buffer);
    if (mask.registered && f.attention != Attention::flash)  // a bool buffer: a byte an element
        bytes += Count(m.max_positions) * m.max_positions *
                 (mask.cast ? bytes_per_element(r.weights) : 1);
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
                                                          Count(f.layers.largest_chunk()) * most);
}

/// Each state class's parameters on this stage's rank, summed, and the state they keep.
inline void add_parameters(StageFacts& f, const Workload& w, const Parallelism& p) {
    const std::uint64_t V = w.model.vocab;
    const std::size_t kinds = w.layers.size();
    const bool first = holds_embedding(p, f.stage), last = holds_head(p, f.stage);
    for (const StateClass& c : w.parameters->classes) {
        const RankParams r = rank_params(c, p, V, kinds, first, last, w.model.mtp_layers > 0);
        const Count total = r.total(f.kind_layers, kinds),
                    experts = r.experts(f.kind_layers, kinds);
        const Count dense = Count(total.value() - experts.value());
        if (c.trainable) f.trainable = r, f.trainable_dense = dense, f.trainable_experts = experts;
        f.all.input += r.input, f.all.head += r.head;
        f.input_weight_bytes += c.weight_bytes(r.input, w.recipe);
        f.head_weight_bytes += c.weight_bytes(r.head, w.recipe);
        for (std::size_t k = 0; k < kinds; ++k) {
            f.all.per_layer[k] += r.per_layer[k],
                f.all.per_layer_experts[k] += r.per_layer_experts[k];
            f.layer_weight_bytes[k] += c.weight_bytes(r.per_layer[k], w.recipe);
        }
        f.parameters += total, f.expert_parameters += experts;
        f.state = f.state + class_state(c, dense, experts, w.recipe, p);
    }
}

/// What a stage's rank holds whatever its micro-batches: its layers, parameters and state (every
/// fact but those add_microbatches adds). The same for every micro-batch size and recomputation
/// mode of one model and recipe: a search makes it once a layout (StageFactsCache).
inline StageFacts stage_holdings(const Workload& w, const Parallelism& p, std::uint64_t stage) {
    StageFacts f;
    f.stage = stage;
    f.layers = stage_layers(w, p, stage);
    f.kind_layers = f.layers.counts(f.layers.layers);
    add_parameters(f, w, p);
    f.state.optimizer_state = rank_optimizer_state(w, p, stage, f.kind_layers);
    if (p.offload != Offload::none) offload_state(f, p);
    // The program's own buffers stay on the device, counted with the weights.
    f.state.weights +=
        registered_buffer_bytes(w.model, w.recipe, w.framework, w.seq) * Count(f.layers.layers);
    return f;
}

/// To `f` (stage_holdings's), what the micro-batches add: how many are in flight, and the
/// activations offload sends to the host.
inline void add_microbatches(StageFacts& f, const Workload& w, const Parallelism& p) {
    f.in_flight = in_flight(p, f.stage);
    f.later_in_flight = p.steps_per_batch() > 1 ? in_flight(p, f.stage, true) : 1;
    if (p.offload_activations) offload_activations(f, w, p);
}

/// Flattened, as stage_inputs is.
[[gnu::flatten]] inline StageFacts stage_facts(const Workload& w, const Parallelism& p,
                                               std::uint64_t stage) {
    StageFacts f = stage_holdings(w, p, stage);
    add_microbatches(f, w, p);
    return f;
}

/// stage_facts made once for each layout and stage, for one model and recipe (one search): its
/// micro-batch sizes and recomputation modes change only what add_microbatches adds. It keeps one
/// shape's (the layout's degrees, ZeRO stage and offload): a search makes each shape's rows in
/// turn.
class StageFactsCache {
public:
    /// The facts, valid until the next call for the same stage of the same layout, or another
    /// shape.
    const StageFacts& operator()(const Workload& w, const Parallelism& p, std::uint64_t stage) {
        Held& held = find(held_, p, stage, [&] {
            StageFacts f = stage_holdings(w, p, stage);
            return Held{f, f.host};
        });
        held.facts.host = held.host, held.facts.offloaded_activations = 0;
        add_microbatches(held.facts, w, p);
        return held.facts;
    }

    /// recomputed_layers(w, p), made once a layout: it depends on its stages alone.
    const KindCounts& recomputed(const Workload& w, const Parallelism& p) {
        return find(recomputed_, p, 0, [&] { return recomputed_layers(w, p); });
    }

private:
    struct Held {
        StageFacts facts;
        Count host;  ///< stage_holdings's, before activation offload adds to it
    };
    /// What the shape leaves open (the stage, the schedule, its chunks, partial recomputation)...
    using Key = std::array<std::uint64_t, 4>;
    /// ...and the shape: every other field but the micro-batches and activation offload.
    using Shape = std::array<std::uint64_t, 13>;
    static Shape shape_of(const Parallelism& p) {
        return {p.dp,
                p.tp,
                p.pp,
                p.cp,
                p.ep,
                p.etp,
                p.sequence_parallel,
                p.zero,
                p.shard_group,
                p.gathered_layers,
                static_cast<std::uint64_t>(p.offload),
                p.first_stage_layers,
                p.last_stage_layers};
    }
    template <class T, class Make>
    T& find(std::deque<std::pair<Key, T>>& made, const Parallelism& p, std::uint64_t stage,
            Make make) {
        const Shape shape = shape_of(p);
        if (!same(shape, shape_)) held_.clear(), recomputed_.clear(), shape_ = shape;
        const Key key{stage, static_cast<std::uint64_t>(p.schedule), p.vpp,
                      p.recompute_layers ? *p.recompute_layers + 1 : 0};
        for (auto& [k, value] : made)
            if (same(k, key)) return value;
        return made.emplace_back(key, make()).second;
    }
    /// Field by field: std::array's == calls memcmp, which a search's millions of calls feel.
    template <std::size_t N>
    static bool same(const std::array<std::uint64_t, N>& a, const std::array<std::uint64_t, N>& b) {
        for (std::size_t i = 0; i < N; ++i)
            if (a[i] != b[i]) return false;
        return true;
    }
    Shape shape_{};
    std::deque<std::pair<Key, Held>> held_;  // a deque: references to one survive another's
    std::deque<std::pair<Key, KindCounts>> recomputed_;
};

/// The tensors a one-at-a-time optimiser loop steps on this rank, by its share of each: the one
/// stepped first, the largest that may follow it, and the two largest but the first.
struct LoopTensors {
    Count head_of_loop;  ///< the first tensor stepped (the token embedding), if this rank holds it
    Count after_lead;    ///< the largest that may come right after it
    Count others[2];     ///< the two largest but the first, of every group held
    Count heads[2];      ///< of those, the head group's two largest (the head, the final norm)
    Count rest[2];       ///< and the two largest of the other groups
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
                    keep_two_largest(l.others, n);
                    keep_two_largest(group == Group::head ? l.heads : l.rest, n);
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
    // the next largest stands for it, leaning high; in one group in the model's order the head
    // follows the final norm (Architecture::params_in_model_order).
    const auto pair = [&](const Count(&two)[2]) { return two[0] * o.copies + two[1] * o.previous; };
    const Count largest_pair =
        w.model.params_in_model_order ? std::max(pair(l.rest), pair(l.heads)) : pair(l.others);
    Count work = std::max({l.head_of_loop * o.copies,
                           l.after_lead * o.copies + l.head_of_loop * o.previous, largest_pair}) *
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

/// The optimizer in backward (GradBuffer::stepped) steps each tensor alone, as its gradient is
/// whole: the temporaries per element of that tensor (foreach over one tensor: sqrt(v); a
/// for-loop's copies of it; none fused), with an upcast optimizer's fp32 copies.
inline std::uint64_t stepped_temporary_bytes(const Workload& w) {
    const Optimizer& o = w.recipe.optimizer;
    const std::uint64_t t = w.recipe.step_temporary_bytes();
    const DType stepped = w.recipe.master.value_or(w.recipe.weights);
    const std::uint64_t upcast =
        o.upcast && bytes_per_element(stepped) < dtype::fp32 ? 2 * dtype::fp32 : 0;
    switch (o.own_impl.value_or(w.framework.optimizer)) {
        case OptimizerImpl::fused: return upcast;
        case OptimizerImpl::foreach: return t + upcast;
        case OptimizerImpl::for_loop: return t * o.copies + upcast;
    }
    return 0;
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

}  // namespace memcalc
