#pragma once
/// Every valid way to train a model on a cluster: data, tensor, pipeline, context and expert
/// degrees, ZeRO stage and offload, sequence parallelism, micro-batch and recomputation; which fit
/// in device memory, and what each wastes and how long its step takes (step_time.hpp). Each layout
/// costs a few operations on a Workload (workload.hpp, layout_peak.hpp).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/attention_kernels.hpp"
#include "memcalc/device_memory.hpp"
#include "memcalc/loading.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/hardware.hpp"
#include "memcalc/step_time.hpp"
#include "memcalc/layout_peak.hpp"
#include "memcalc/stage_facts.hpp"
#include "memcalc/stage_inputs.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/workload.hpp"

namespace memcalc {

/// The most pipeline stages a search measures unless asked for more: a minute or so of the slowest
/// models' layouts, and several times the largest search of the README's (about 3 million).
inline constexpr std::uint64_t default_search_limit = 20'000'000;
/// A search limit that refuses none: the program's default, its time limit bounding the search.
inline constexpr std::uint64_t no_search_limit = std::numeric_limits<std::uint64_t>::max();

/// A search past its limit (PlanRequest::search_limit), refused before it starts.
class search_limit_error : public error {
public:
    using error::error;
};

struct PlanRequest {
    /// What every layout shares: the sequence, the recipe, the activation model and the framework.
    /// Its micro-batch, recomputation and parallel layout are what the plan searches: not read.
    Settings base;
    std::uint64_t gpus = 1;
    Count capacity;  ///< usable bytes per device
    /// Weigh each layout on its device figure (device_memory.hpp): its peak with the rows beside
    /// the model's tensors at their high ends, and the best ones also through the allocator's
    /// simulation. None: on the allocated peak alone.
    std::optional<DeviceSettings> device;
    std::uint64_t global_batch = 1;  ///< sequences per step
    std::uint64_t max_tp = 0;        ///< largest tensor-parallel degree to try; 0 means no limit
    /// Uneven pipeline stages for every pipelined layout they fit (0: even, or balanced when pp
    /// does not divide the layers; see stage_split).
    std::uint64_t first_stage_layers = 0, last_stage_layers = 0;
    std::vector<Recompute> modes;  ///< recomputation modes to try; empty means all three
    std::vector<std::uint64_t> micro_batches;  ///< micro-batches to try; empty means every divisor
    /// Micro-batches per step to try (empty: every count), or only as many as pipeline stages
    /// (per_stage: torchtitan's default, which splits a replica's batch in pp, none without pp).
    std::vector<std::uint64_t> microbatch_counts;
    bool microbatches_per_stage = false;
    /// Degrees and ZeRO stages to try, each list pinning its own (empty: every valid one).
    std::vector<std::uint64_t> dp, tp, pp, cp, ep;
    /// Virtual stages per pipeline rank (interleaved 1F1B) to try; empty: 1 and every valid
    /// interleaving.
    std::vector<std::uint64_t> vpp;
    /// Pipeline schedules to try; empty: 1F1B and interleaved 1F1B, which every pipeline framework
    /// runs (the zero-bubble ones need their own runtimes, and their bubbles are their papers'
    /// ideal figures).
    std::vector<Schedule> schedules;
    std::vector<unsigned> zero;
    /// Offload alternatives to try; empty: each ZeRO-Offload mode the ZeRO stage allows (optimizer:
    /// 1-3, parameters: 3), none with activation offload, which is tried only where listed (alone,
    /// or as optimizer+activations...). The program passes {none} unless asked: it checks host
    /// memory only where host_capacity is given, and times the CPU optimiser at an assumed
    /// bandwidth.
    std::vector<OffloadMode> offload;
    /// Given: sequence parallelism wherever tp > 1 (true) or nowhere (false); Megatron-LM turns
    /// it off at tp 1.
    std::optional<bool> sequence_parallel;
    /// Partial recomputation pinned: full recomputation of the first N layers of each stage's
    /// chunks (Parallelism::recompute_layers), the only mode tried. None: where full fits and none
    /// does not, the fewest N that fits is searched as a layout of its own beside full.
    std::optional<std::uint64_t> recompute_layers;
    /// Whether that search runs where none is pinned: off for a program that checkpoints every
    /// layer, which has no fewer to choose (Megatron-LM before its block method, torchtitan).
    bool partial_recompute = true;
    /// The GPU whose speeds time each step; none (or one lacking a figure): no times, and the
    /// ranking by waste alone.
    std::optional<Gpu> gpu;
    /// Host memory each device may fill with what it offloads (its node's, shared among its GPUs);
    /// none: not checked, so an offloading layout fits on its device memory alone.
    std::optional<Count> host_capacity;
    /// The most pipeline stages the search may measure (SearchSize), checked before it starts.
    std::uint64_t search_limit = default_search_limit;
    /// Seconds the search may run: past them it ends with the best layouts found so far
    /// (PlanSummary::complete false). None: no limit.
    std::optional<double> time_limit;
};

/// Whether a search list allows `value`: an empty one allows all.
template <class T, class U>
bool allowed(const std::vector<T>& list, U value) {
    return list.empty() || std::find(list.begin(), list.end(), static_cast<T>(value)) != list.end();
}

/// Whether a layout of pp stages may run `count` micro-batches a step (PlanRequest's counts).
inline bool count_allowed(const PlanRequest& request, std::uint64_t pp, std::uint64_t count) {
    return allowed(request.microbatch_counts, count) &&
           (!request.microbatches_per_stage || count == pp);
}

struct PlanRow {
    Parallelism parallel;
    std::uint64_t micro_batch = 1;
    Recompute recompute = Recompute::none;
    LayoutPeak peak;
    Count host;  ///< host memory of the device that offloads the most (layout_host); 0 without
                 ///< offload
    bool fits = false;  ///< in device memory, and in host memory where the request gives it
    Count beside;       ///< the device rows' high ends (PlanRequest::device): weighed with the peak
    /// The device figure's high end, for the layouts the allocator's simulation checked.
    std::optional<Count> device;
    double recompute_fraction = 0;  ///< extra FLOPs of recomputation / the step's FLOPs
    double bubble = 0;         ///< pipeline bubble, of the step (1F1B: (P - 1) / (vpp x M + P - 1))
    double communication = 0;  ///< bytes each device sends per step, to host memory too (estimate)
    std::optional<StepTime> time;  ///< the step's estimated time, when the GPU's figures give one
    /// Its time, waste and communication rank it below the best a search keeps (RankCutoff):
    /// its peak was not weighed, so `fits` says nothing.
    bool ranked_out = false;
    double waste() const { return recompute_fraction + bubble; }
};

/// The ranking: shortest estimated step (a layout without a time after those with one), then least
/// wasted compute (recomputation plus pipeline bubble), then least communication per device, then
/// lowest peak.
using PlanKey = std::tuple<double, double, double, std::uint64_t>;
inline PlanKey plan_key(const PlanRow& r) {
    return {r.time ? r.time->seconds() : std::numeric_limits<double>::infinity(), r.waste(),
            r.communication, r.peak.bytes().value()};
}

inline bool plan_order(const PlanRow& a, const PlanRow& b) { return plan_key(a) < plan_key(b); }

/// What a search that keeps only its best fitting layouts (top_layouts) knows as it goes: the worst
/// key among those it keeps, once it keeps as many as it wants (none before; a layout ranked below
/// it cannot enter, so its peak is not weighed); and that a layout that cannot fit is dropped, so
/// one whose state alone overfills the device needs no peak either. Reads as the optional key.
struct RankCutoff {
    std::optional<PlanKey> worst;
    bool fitting_only = false;

    explicit operator bool() const { return worst.has_value(); }
    const PlanKey& operator*() const { return *worst; }
};

/// Whether `row`, its peak not yet weighed, ranks below `worst` whatever its peak turns out to be:
/// its time, waste or communication (the key's fields before the peak) already put it there.
inline bool ranks_below(const PlanRow& row, const PlanKey& worst) {
    PlanKey key = plan_key(row);
    std::get<3>(key) = 0;  // the lowest peak: below `worst` only on the fields before it
    return key > worst;
}

/// What ZeRO-Offload and activation offload move over the host link (traffic's), and the host
/// optimiser step's reads and writes.
inline void add_offload_traffic(Traffic& bytes, const Workload& w, const Parallelism& p,
                                const StageFacts& f) {
    const double M = static_cast<double>(p.steps_per_batch());
    if (p.offload != Offload::none) {
        const double shard = static_cast<double>(
            StageFacts::shard(p, f.trainable_dense, f.trainable_experts).value());
        bytes.offload = shard * static_cast<double>(w.recipe.gradient_bytes());
        bytes.offload += p.offload == Offload::parameters
                             ? 2 * M * static_cast<double>(f.host_weights.value())
                             : shard * static_cast<double>(w.recipe.weight_bytes());
        // The host's step reads and writes its master copy and state, reads the fp32 gradient shard
        // and writes the weights the device fetches.
        bytes.host_optimizer = 2 * static_cast<double>(f.host_optimizer_state.value()) +
                               shard * static_cast<double>(dtype::fp32 + w.recipe.weight_bytes());
    }
    if (p.offload_activations) {
        Count most = f.offloaded_activations;  // stages differ only when uneven or of different
                                               // kinds of layer
        if (p.uneven_stages() || !w.parameters->pattern.uniform())
            for (std::uint64_t stage = 1; stage < p.pp; ++stage)
                most = std::max(most, stage_facts(w, p, stage).offloaded_activations);
        bytes.offload += 2 * M * static_cast<double>(most.value());
    }
}

/// What the device's optimiser step reads and writes on one rank (none where the host steps):
/// fused, each stepped weight of its shard (the master copy where the recipe keeps one), its
/// gradient and its state read, the weight and the state written; unfused (foreach, one tensor at a
/// time), the optimiser's unfused_passes over the shard in the state dtype. Then a master copy is
/// cast back to the weights' dtype.
inline double device_optimizer_bytes(const Workload& w, const Parallelism& p, const StageFacts& f) {
    if (p.offload != Offload::none) return 0;
    const Recipe& r = w.recipe;
    const auto d = [](std::uint64_t n) { return static_cast<double>(n); };
    const double shard = d(StageFacts::shard(p, f.trainable_dense, f.trainable_experts).value());
    const double cast_back = r.master ? d(r.weight_bytes()) : 0;
    const Optimizer& o = r.optimizer;
    if (o.own_impl.value_or(w.framework.optimizer) != OptimizerImpl::fused && o.unfused_passes > 0)
        return shard * (d(o.unfused_passes * bytes_per_element(r.state)) + cast_back);
    const double stepped = d(r.master ? r.master_bytes() : r.weight_bytes());
    return 2 * d(f.state.optimizer_state.value()) +
           shard * (2 * stepped + d(r.gradient_bytes()) + cast_back);
}

/// Muon's Newton-Schulz FLOPs on one rank: its stage's layer matrices, each whole (tensor-parallel
/// ranks each orthogonalise the gathered matrix), shared out over the ranks that hold the same
/// ones (as KellerJordan/Muon's ranks take every world-size-th matrix): the dense over dp x cp,
/// each expert over its expert-data-parallel group. None where the host steps.
inline double newton_schulz_on_rank(const Workload& w, const Parallelism& p, const StageFacts& f) {
    if (w.recipe.optimizer.step != StepWork::newton_schulz || p.offload != Offload::none) return 0;
    const double replicas = static_cast<double>(p.dp * p.cp);
    const double expert_ranks = replicas * static_cast<double>(p.tp) /
                                static_cast<double>(p.expert_tp());  // ep x its group
    double flops = 0;
    for (const ParamRow& r : w.parameters->table.rows) {
        if (!r.trainable || !layer_matrix(r)) continue;
        const std::uint64_t* d = r.dims.end() - 2;
        const double share = r.expert ? static_cast<double>(*r.dims.begin()) / expert_ranks
                                      : 1 / replicas;  // an expert row: each expert a matrix
        flops +=
            static_cast<double>(f.kind_layers[r.kind]) * newton_schulz_flops(d[0], d[1]) * share;
    }
    return flops;
}

/// Token-slots a layer of kind `kind` sends to its experts per token: its top k (0: a dense kind).
inline double routed_slots_per_token(const Architecture& m, std::size_t kind) {
    const LayerKind* k = kind < m.layer_kinds.size() ? &m.layer_kinds[kind] : nullptr;
    const std::uint64_t experts = k && k->experts ? *k->experts : m.experts;
    if (experts == 0) return 0;
    const std::uint64_t top =
        k && k->experts_per_token ? *k->experts_per_token : m.experts_per_token;
    return static_cast<double>(top == 0 ? 1 : top);
}

namespace detail {
inline double ring_share(double n) { return n <= 1 ? 0.0 : (n - 1) / n; }
}  // namespace detail

/// traffic's bytes of stage 0's layers (`layers_on_stage`, `kinds` of each kind): all but the
/// data-parallel reduction and offload, which need the stage's parameters (StageFacts).
inline Traffic layer_traffic(const Workload& w, const Parallelism& p, std::uint64_t layers_on_stage,
                             const KindCounts& kinds) {
    const double M = static_cast<double>(p.steps_per_batch());
    const double d = static_cast<double>(w.recipe.activation_bytes());
    const double tokens = static_cast<double>(w.seq * w.micro_batch) / static_cast<double>(p.cp);
    const double stream =
        tokens * static_cast<double>(w.model.hidden) * d;  // one layer's output, one micro-batch
    const auto ring = detail::ring_share;
    Traffic bytes;
    const double layers = static_cast<double>(layers_on_stage);
    bytes.tensor_parallel = 4 * 2 * ring(static_cast<double>(p.tp)) * stream * layers * M;
    if (p.tp > 1) bytes.tensor_parallel_messages = 4 * layers * M;
    // Collective matmuls split the all-gathers and reduce-scatters sequence parallelism runs.
    if (w.framework.tp_overlap == TpOverlap::matmul && p.sequence_parallel)
        bytes.tensor_parallel_pieces = static_cast<double>(p.tp),
        bytes.projection_share = w.projection_share;
    // Several chunks a micro-batch (interleaved, ZB-V) send it across every rank boundary once per
    // chunk.
    if (p.pp > 1) {
        const double sends = 2 * M * static_cast<double>(chunks_per_microbatch(p));
        bytes.pipeline = stream / (p.sequence_parallel ? static_cast<double>(p.tp) : 1) * sends;
        bytes.pipeline_messages = sends;
    }
    const double kv = tokens *
                      static_cast<double>(w.model.key_value_heads() * w.model.head_size()) * d /
                      static_cast<double>(p.tp);
    bytes.context_parallel =
        2 * 2 * ring(static_cast<double>(p.cp)) * static_cast<double>(p.cp) * kv * layers * M;
    if (p.cp > 1)  // each ring step a send, forward and backward
        bytes.context_parallel_messages = 2 * static_cast<double>(p.cp - 1) * layers * M;
    if (p.ep > 1)
        for (std::size_t k = 0; k < w.model.kind_count(); ++k) {
            const double moe = static_cast<double>(kinds[k]) * M;
            const double slots = tokens * routed_slots_per_token(w.model, k);
            bytes.expert_parallel += 4 * ring(static_cast<double>(p.ep)) * slots *
                                     static_cast<double>(w.model.hidden) * d * moe;
            if (slots > 0) bytes.expert_parallel_messages += 4 * moe;
        }
    return bytes;
}

/// A stage's data-parallel bytes, by ring collectives over dp x cp (context-parallel ranks hold the
/// same weights, as Megatron-LM's and torchtitan's groups have them), as the memory model runs
/// them: without ZeRO, the gradients' all-reduce once a step; ZeRO-1, their reduce-scatter once
/// a step (Megatron-LM's distributed optimizer) and the updated weights' gather; ZeRO-2, a
/// reduce-scatter each micro-batch (each layer's bucket) and that gather; ZeRO-3, each layer's
/// weights gathered for every forward and backward, its gradients reduce-scattered every backward.
inline DataParallelBytes data_parallel_bytes(const Workload& w, const Parallelism& p,
                                             const StageFacts& f) {
    const double ring = detail::ring_share(static_cast<double>(p.dp * p.cp));
    const double params = static_cast<double>(f.parameters.value()) * ring;
    const double reduce = params * static_cast<double>(w.recipe.gradient_bytes()),
                 gather = params * static_cast<double>(w.recipe.weight_bytes()),
                 M = static_cast<double>(p.steps_per_batch());
    DataParallelBytes b;
    b.pieces = static_cast<double>(std::max<std::uint64_t>(1, f.layers.layers));
    if (p.zero == 0) b.last_backward = 2 * reduce;
    if (p.zero == 1) b.last_backward = reduce;
    if (p.zero == 2) b.every_backward = M * reduce;
    if (p.zero == 1 || p.zero == 2) b.first_forward = gather;
    if (p.zero >= 3) {
        // Without a prefetched layer (gathered_layers 1) each gather waits for its layer.
        const bool prefetched = p.gathered_layers >= 2;
        (prefetched ? b.every_forward : b.exposed) += M * gather;
        (prefetched ? b.every_backward : b.exposed) += M * gather;
        b.every_backward += M * reduce;
    }
    if (w.framework.dp_overlap != DpOverlap::none) return b;
    DataParallelBytes unhidden;  // every byte beside no compute
    unhidden.exposed = b.total();
    return unhidden;
}

/// Bytes one device sends in a step, by ring collectives: data-parallel (data_parallel_bytes),
/// tensor-parallel all-reduces (4 a layer a micro-batch),
/// pipeline sends between stages, context-parallel key/value rings, expert all-to-alls (dispatch
/// and combine, forward and backward: 4 a MoE layer a micro-batch); and what ZeRO-Offload moves
/// over the host link: optimizer offload, the device's gradient shard down and the updated weight
/// shard back each step; parameter offload, the gradient shard down and the weight shard up for
/// each micro-batch's forward and its backward (the update stays on the host, where the weights
/// live); activation offload, each micro-batch's kept activations down after each layer's forward
/// and up for its backward, from the stage that offloads the most (leaning slow). Beside them, not
/// sent: what the host's optimiser step reads and writes in host memory.
inline Traffic traffic(const Workload& w, const Parallelism& p, const StageFacts& f) {
    Traffic bytes = layer_traffic(w, p, f.layers.layers, f.kind_layers);
    // Full recomputation reruns a layer's forward, and with it the forward's two collectives.
    if (w.recompute == Recompute::full && f.layers.layers > 0) {
        const KindCounts rerun = f.layers.recomputed_counts(f.layers.layers);
        const double more = 2.0 / 4 * std::accumulate(rerun.begin(), rerun.end(), 0.0) /
                            static_cast<double>(f.layers.layers);
        bytes.tensor_parallel *= 1 + more, bytes.tensor_parallel_messages *= 1 + more;
    }
    bytes.data_parallel = data_parallel_bytes(w, p, f);
    add_offload_traffic(bytes, w, p, f);
    bytes.device_optimizer = device_optimizer_bytes(w, p, f);
    return bytes;
}

inline double communication_bytes(const Workload& w, const Parallelism& p, const StageFacts& f) {
    return traffic(w, p, f).total();
}

/// Layers of `m` whose mixer is attention (not Mamba's).
inline double attention_layers(const Architecture& m) {
    double n = 0;
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        const LayerKind* kind = k < m.layer_kinds.size() ? &m.layer_kinds[k] : nullptr;
        const Mixer mixer = kind && kind->mixer ? *kind->mixer : m.mixer;
        if (attends(mixer)) n += static_cast<double>(m.layers_of_kind(k));
    }
    return n;
}

/// A pipeline's ranks as their compute sees them: each distinct set of layers (by kind) a rank
/// runs, whether it holds the head, and how many ranks run it. It depends on the pipeline alone
/// (stage_mix_key), so a search makes it once for many layouts.
struct StageMix {
    struct Ranks {
        KindCounts layers{};
        bool head = false;
        std::uint64_t count = 0;
    };
    std::vector<Ranks> ranks;
    std::uint64_t first_layers = 0;  ///< stage 0's, every chunk (whose traffic plan weighs)
    KindCounts first_kinds{};        ///< of each kind
    /// The longest model chunk of any stage (largest_chunk's), which the mix's key fixes: read for
    /// every micro-batch and mode of a layout, made once.
    std::uint64_t largest_chunk = 0;
};

inline StageMix stage_mix(std::uint64_t layers_in_model, const LayerPattern& pattern,
                          const Parallelism& p) {
    StageMix mix;
    for (std::uint64_t stage = 0; stage < p.pp; ++stage) {
        StageLayers layers = rank_layers(p, layers_in_model, stage);
        layers.with(pattern);
        const StageMix::Ranks r{layers.counts(layers.layers), holds_head(p, stage), 1};
        if (stage == 0) mix.first_layers = layers.layers, mix.first_kinds = r.layers;
        mix.largest_chunk = std::max(mix.largest_chunk, layers.largest_chunk());
        const auto same = std::find_if(mix.ranks.begin(), mix.ranks.end(), [&](const auto& x) {
            return x.layers == r.layers && x.head == r.head;
        });
        if (same == mix.ranks.end())
            mix.ranks.push_back(r);
        else
            ++same->count;
    }
    return mix;
}

/// What stage_mix reads of a layout: its pipeline's stages, split, chunks and schedule.
using StageMixKey = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, int>;
inline StageMixKey stage_mix_key(const Parallelism& p) {
    return {p.pp, p.vpp, p.first_stage_layers, p.last_stage_layers, static_cast<int>(p.schedule)};
}

/// The busiest pipeline rank's compute over the mean rank's, under `cost` (one micro-batch's
/// FLOPs): each rank's layers weighed by their kind's forward (recomputation in the model's mix),
/// and the head's logits on the rank that holds it.
inline double slowest_stage_share(const StageMix& mix, const Architecture& m,
                                  const ComputeCost& cost) {
    const double forwards = cost.step / 3 - cost.head_forward;  // every layer's, once
    if (mix.ranks.size() < 2 || forwards <= 0) return 1;        // every rank alike
    const double passes = 3 + cost.recompute / forwards;  // a layer's forward and backward, rerun
    double most = 0, total = 0, ranks = 0;
    for (const StageMix::Ranks& r : mix.ranks) {
        double work = r.head ? 3 * cost.head_forward : 0;
        for (std::size_t k = 0; k < m.kind_count(); ++k)
            work += static_cast<double>(r.layers[k]) * cost.kind_forward[k] * passes;
        const double count = static_cast<double>(r.count);
        most = std::max(most, work), total += work * count, ranks += count;
    }
    return most * ranks / total;
}

inline double slowest_stage_share(const Workload& w, const Parallelism& p,
                                  const ComputeCost& cost) {
    return slowest_stage_share(stage_mix(w.model.layers, w.parameters->pattern, p), w.model, cost);
}

/// What one device of layout `p` (its stages running `mix`) computes in a step of `cost` (one
/// micro-batch's FLOPs): the step's FLOPs and the attention's part of them (the recomputation taken
/// to rerun the same mix), at the busiest stage's pace. No bytes: device_work adds those.
inline DeviceWork device_flops(const Workload& w, const StageMix& mix, const ComputeCost& cost,
                               const PlanRequest& request, double forward_share) {
    const double microbatches = static_cast<double>(request.global_batch / w.micro_batch);
    DeviceWork work;
    work.flops = (cost.step + cost.recompute) * microbatches;
    work.attention_flops =
        cost.step > 0 ? work.flops * 3 * cost.attention_core * attention_layers(w.model) / cost.step
                      : 0;
    // A fused kernel skips a causal mask's masked half; eager attention computes every score.
    work.attention_computed = w.framework.attention == Attention::flash ? 0.5 : 1;
    if (request.gpu) work.attention_efficiency = attention_efficiency(*request.gpu, w.framework);
    // An fp8 recipe's linears: all but the attention core and the head (Transformer Engine's
    // output layer and torchtitan's are plain linears).
    if (w.recipe.narrow_matmuls())
        work.narrow_flops =
            std::max(0.0, work.flops - work.attention_flops - 3 * cost.head_forward * microbatches);
    work.forward_share = forward_share;
    work.slowest_stage_share = slowest_stage_share(mix, w.model, cost);
    return work;
}

/// Bytes one layer of kind `k` of an fp8 recipe's casts move on a device of layout `p` in a step:
/// its linears' inputs and outputs' gradients (weight_pass_reads' operands) each micro-batch, and
/// its weights: torchao casts them each micro-batch, as its programs say (LinearCasts); Transformer
/// Engine reads each operand in the compute dtype and writes its narrow cast and that cast's
/// transpose (fp8_cast_transpose_fused), its weights once a step (cached across micro-batches).
inline double narrow_cast_bytes(const Workload& w, const Parallelism& p, std::size_t k) {
    const Recipe& r = w.recipe;
    if (!r.narrow_matmuls()) return 0;
    const std::uint64_t compute = r.activation_bytes();
    const Count operands(w.weight_pass_reads[k].on_rank(p, w.model.vocab).value() / compute);
    const Count weights = w.parameters->linear_weights[k].on_rank(p, w.model.vocab);
    const double M = static_cast<double>(p.steps_per_batch());
    const auto d = [](Count n) { return static_cast<double>(n.value()); };
    if (r.casts) {
        const bool compiled = w.model.compile != Compile::none;
        return M * (d(operands) * r.casts->operand_traffic(compute, compiled) +
                    d(weights) * r.casts->weight_traffic(compute, compiled));
    }
    const Storage& narrow = r.linears->storage;
    const auto cast = [&](Count n, std::uint64_t source) {
        return d(n) * static_cast<double>(source) + 2 * d(narrow.bytes(n));
    };
    return M * cast(operands, compute) + cast(weights, r.weight_bytes());
}

/// Bytes a block's element-wise work moves for one micro-batch: the passes over what it keeps and
/// its eager kernels' temporaries.
inline double elementwise_bytes(Count kept, Count temporaries) {
    return elementwise_passes * static_cast<double>(kept.value()) +
           static_cast<double>(temporaries.value());
}

/// Kernels one rank's optimiser step launches (launches.hpp): its trainable tensors' (its stage's
/// layers', the ends' its share) one at a time, a foreach op's over them all in multi-tensor
/// launches, or a fused kernel's; then the master copy's cast back, one op more. None where the
/// host steps.
inline double optimizer_launches(const Workload& w, const Parallelism& p, const StageFacts& f) {
    if (p.offload != Offload::none) return 0;
    double tensors = w.end_launches.trained_tensors / static_cast<double>(p.pp);
    for (std::size_t k = 0; k < w.model.kind_count(); ++k)
        tensors += w.layers[k].launches.trained_tensors * static_cast<double>(f.kind_layers[k]);
    const Optimizer& o = w.recipe.optimizer;
    const double ops = static_cast<double>(o.loop_launches) + (w.recipe.master ? 1 : 0);
    if (o.own_impl == OptimizerImpl::fused) return tensors * ops;  // its kernel, tensor by tensor
    const OptimizerImpl impl = o.own_impl.value_or(w.framework.optimizer);
    if (impl == OptimizerImpl::for_loop) return tensors * ops;
    const double elements =
        static_cast<double>(StageFacts::shard(p, f.trainable_dense, f.trainable_experts).value());
    return (impl == OptimizerImpl::fused ? 1 : ops) * multi_tensor_launches(tensors, elements);
}

/// Kernels one device of layout `p` launches in a step of M micro-batches: its stage's layers'
/// (each kind's LayerLaunches, recomputation's reruns among them: under partial recomputation the
/// recomputed layers' alone), the mean stage's share of the ends', and its optimiser step's.
inline void add_launches(DeviceWork& work, const Workload& w, const Parallelism& p,
                         const StageFacts& f) {
    const double M = static_cast<double>(p.steps_per_batch());
    const auto add = [&](const LayerLaunches& l, double layers) {
        work.matmul_launches += (l.matmuls.total() + l.rerun_matmuls) * layers * M;
        work.other_launches += (l.other.total() + l.rerun_other) * layers * M;
    };
    const bool partial = p.recompute_layers && !w.not_recomputed.empty();
    const KindCounts rerun = partial ? f.layers.recomputed_counts(f.layers.layers) : f.kind_layers;
    for (std::size_t k = 0; k < w.model.kind_count(); ++k) {
        add(w.layers[k].launches, static_cast<double>(rerun[k]));
        if (partial)
            add(w.not_recomputed[k].launches, static_cast<double>(f.kind_layers[k] - rerun[k]));
    }
    add(w.end_launches, 1 / static_cast<double>(p.pp));
    work.optimizer_launches = optimizer_launches(w, p, f);
}

/// What one device of layout `p` computes in a step of `cost` (one micro-batch's FLOPs) per
/// micro-batch: the step's FLOPs and the attention's part of them (the recomputation taken to rerun
/// the same mix), the weights its matrix products read (each layer's: forward, input gradient,
/// weight gradient, a recomputed forward) and the bytes its element-wise work moves (stage 0's,
/// an fp8 recipe's casts among them).
inline DeviceWork device_work(const Workload& w, const Parallelism& p, const StageFacts& f,
                              const StageMix& mix, const ComputeCost& cost,
                              const PlanRequest& request, double forward_share) {
    const double M = static_cast<double>(p.steps_per_batch());
    DeviceWork work = device_flops(w, mix, cost, request, forward_share);
    const double passes = (3 + cost.recompute_fraction() * 3) * M;
    for (std::size_t k = 0; k < w.model.kind_count(); ++k) {
        const double layers = static_cast<double>(f.kind_layers[k]);
        work.weight_reads += static_cast<double>(f.layer_weight_bytes[k].value()) * layers * passes;
        const LayerWork& layer = w.layers[k];
        const Count kept =
            layer.kept.on_rank(p, w.model.vocab) + layer.rebuilt.on_rank(p, w.model.vocab);
        work.elementwise_bytes +=
            elementwise_bytes(kept, layer.eager_traffic.on_rank(p, w.model.vocab)) * layers * M +
            narrow_cast_bytes(w, p, k) * layers;
    }
    work.optimizer_flops = newton_schulz_on_rank(w, p, f);
    add_launches(work, w, p, f);
    // The head's and the loss's, on one stage of pp: the mean stage's share.
    work.elementwise_bytes += elementwise_bytes(w.head.on_rank(p, w.model.vocab),
                                                w.head_traffic.on_rank(p, w.model.vocab)) *
                              M / static_cast<double>(p.pp);
    return work;
}

/// A row's traffic and time, then (unless they rank it below `cutoff`) its peak and fit, under
/// `w` and `cost` (one micro-batch's FLOPs) on row.parallel, whose stages run `mix`.
inline void measure(PlanRow& row, const Workload& w, const StageMix& mix, const ComputeCost& cost,
                    const PlanRequest& request, StageFactsCache& facts,
                    const RankCutoff& cutoff = {}) {
    const Parallelism& p = row.parallel;
    if (!recompute_modelled(row.recompute, p) || !gradients_modelled(request.base.framework, p))
        return;  // no peak to trust: it does not fit
    row.recompute_fraction = cost.recompute_fraction();
    // The forward's share of a chunk's time: recomputation lengthens its backward.
    const double forward_share = cost.step / 3 / (cost.step + cost.recompute);
    const double idle = bubble_share(p, forward_share);
    row.bubble = idle / (1 + idle);
    if (cutoff && request.gpu) {
        const auto floor =
            step_time_floor(*request.gpu, p, device_flops(w, mix, cost, request, forward_share),
                            layer_traffic(w, p, mix.first_layers, mix.first_kinds), idle);
        if (floor && *floor > std::get<0>(*cutoff)) {
            row.ranked_out = true;  // its FLOPs and layers' messages take longer than the kept
            return;
        }
    }
    try {
        const StageFacts& first = facts(w, p, 0);
        const Traffic bytes = traffic(w, p, first);
        row.communication = bytes.total();
        if (request.gpu)
            row.time =
                step_time(*request.gpu, p,
                          device_work(w, p, first, mix, cost, request, forward_share), bytes);
        if (cutoff && ranks_below(row, *cutoff)) {
            row.ranked_out = true;
            return;
        }
        if (request.device)
            row.beside = device_rows_high(request.base.framework, p, request.device->gpu);
        if (cutoff.fitting_only && persistent_state(first) + row.beside > request.capacity)
            return;  // it cannot fit: the search drops it unweighed (most layouts it weighs)
        const auto stage = [&](std::uint64_t s) -> const StageFacts& { return facts(w, p, s); };
        row.peak = layout_peak(w, p, first, stage);
        row.host = p.offloads() ? layout_host(w, p, stage) : Count(0);
        row.fits = row.peak.bytes() + row.beside <= request.capacity &&
                   (!request.host_capacity || row.host <= *request.host_capacity);
    } catch (const overflow_error&) {
        row.fits = false;  // its bytes do not fit in 64 bits, let alone a device
        row.communication = 0, row.time.reset();  // nor are they sent: ranked with no time
    }
}

/// One micro-batch's FLOPs under partial recomputation (row.parallel.recompute_layers): only the
/// layers it recomputes rerun their forward.
inline ComputeCost partial_cost(const Architecture& m, const Workload& w, const Parallelism& p,
                                const PlanRequest& request, StageFactsCache& facts) {
    const KindCounts& recomputed = facts.recomputed(w, p);
    return compute_cost(m, w.seq, w.micro_batch, Recompute::full, request.base.recompute_modules,
                        &recomputed);
}

/// The fewest layers per chunk whose full recomputation fits, where all of them (`full`, fitting)
/// do, as a row of its own (ranked out below `cutoff` as any row); none when it takes every layer.
/// The peak falls as N grows: a binary search.
inline std::optional<PlanRow> fewest_recomputed(const Architecture& m, const Workload& w,
                                                const StageMix& mix, const PlanRow& full,
                                                const PlanRequest& request, StageFactsCache& cache,
                                                const RankCutoff& cutoff = {}) {
    PlanRow row = full;
    const Parallelism& p = row.parallel;
    const std::uint64_t most = mix.largest_chunk;
    if (most < 2) return std::nullopt;
    // A stage's facts (its state, its layers) do not depend on N: made once, each try rebuilds its
    // inputs.
    std::vector<StageFacts> facts{cache(w, p, 0)};
    other_candidate_stages(w, p, [&](std::uint64_t stage) { facts.push_back(cache(w, p, stage)); });
    const auto fits = [&](std::uint64_t n) {
        try {
            for (StageFacts& f : facts) {
                f.layers.recomputing(n);
                if (peak_step(stage_inputs(w, p, f)).bytes.total() + full.beside > request.capacity)
                    return false;
            }
            return true;
        } catch (const overflow_error&) {
            return false;  // past 64 bits: no device holds it
        }
    };
    if (!fits(most - 1)) return std::nullopt;  // most often it takes every layer: one try says so
    std::uint64_t lo = 1, hi = most - 1;       // hi fits
    while (lo < hi) {
        const std::uint64_t mid = lo + (hi - lo) / 2;
        if (fits(mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    row.parallel.recompute_layers = hi;
    row.time.reset();
    measure(row, w, mix, partial_cost(m, w, row.parallel, request, cache), request, cache, cutoff);
    return row;
}

namespace detail {

/// What every search checks before it enumerates: the request's counts against the model, limits.
inline void validate_plan_request(const Architecture& m, const PlanRequest& request) {
    validate(m);
    const std::uint64_t s = request.base.seq, G = request.global_batch;
    require_positive("seq", s);
    require_positive("global_batch", G);
    require_positive("gpus", request.gpus);
    if (request.gpus > max_devices)
        throw error("gpus (" + std::to_string(request.gpus) + ") exceeds the " +
                    std::to_string(max_devices) + " devices memcalc plans for");
    if (G > (1ULL << 40))
        throw error("global_batch (" + std::to_string(G) + ") exceeds 2^40 sequences per step");
    if (m.position == Position::learned && s > m.learned_positions())
        throw error("seq " + std::to_string(s) + " exceeds the " +
                    std::to_string(m.learned_positions()) + " learned positions of " + m.name);
    validate_tuning(request.base.tuning, request.base.activations, request.base.recipe);
    // Asked-for stage counts no pipeline can take are a mistake to name, not layouts to drop.
    const std::uint64_t first = request.first_stage_layers, last = request.last_stage_layers;
    if (first != 0 || last != 0) validate_stage_layer_counts(first, last, m.layers);
}

using PipelineRuns = std::vector<std::pair<Schedule, std::uint64_t>>;

/// The vpp values above 1 that interleave `pp` stages split as given: every divisor of an even
/// stage's layers; of uneven ones, where the ends are a layer short of the others (the embedding
/// and the loss counted as layers: end_counts_a_layer).
inline std::vector<std::uint64_t> interleavings(std::uint64_t layers, std::uint64_t pp,
                                                std::pair<std::uint64_t, std::uint64_t> split) {
    Parallelism p;
    p.pp = pp, p.first_stage_layers = split.first, p.last_stage_layers = split.second;
    std::vector<std::uint64_t> out;
    for (std::uint64_t v : divisors(piece_layers(p, layers, pp > 1 ? 1 : 0))) {
        p.vpp = v;
        if (v > 1 &&
            (!p.uneven_stages() || (end_counts_a_layer(p, layers, 0) == (split.first != 0) &&
                                    end_counts_a_layer(p, layers, pp - 1) == (split.second != 0))))
            out.push_back(v);
    }
    return out;
}

/// The schedules a layout can run, each with its vpp. Interleaved 1F1B as Megatron-LM runs it: even
/// stages, each rank's layers in vpp equal chunks (one of `vpps`, the stages' interleavings), and
/// micro-batches a multiple of pp. The others where validate_schedule allows them.
inline PipelineRuns pipeline_runs(const Architecture& m, const PlanRequest& request,
                                  std::uint64_t pp, std::pair<std::uint64_t, std::uint64_t> split,
                                  std::uint64_t M, const std::vector<std::uint64_t>& vpps) {
    static const std::vector<Schedule> every_framework{Schedule::one_f_one_b,
                                                       Schedule::interleaved};
    const std::vector<Schedule>& schedules =
        request.schedules.empty() ? every_framework : request.schedules;
    PipelineRuns runs;
    if (allowed(schedules, Schedule::one_f_one_b)) runs.emplace_back(Schedule::one_f_one_b, 1);
    const bool even = split.first == 0 && split.second == 0;
    if (pp == 1) return runs;
    if (allowed(schedules, Schedule::interleaved) && M % pp == 0)
        for (std::uint64_t v : vpps) runs.emplace_back(Schedule::interleaved, v);
    for (Schedule s : {Schedule::zb_h1, Schedule::zb_v, Schedule::dualpipe}) {
        if (!allowed(schedules, s)) continue;
        Parallelism p;
        p.pp = pp, p.microbatches = M, p.schedule = s;
        std::tie(p.first_stage_layers, p.last_stage_layers) = split;
        // An uneven split cuts a mirrored schedule's model chunks (DualPipe's pp of them, as
        // DeepSeek-V3's 61 layers ran on 16 stages); ZB-H1's stages are 1F1B's.
        try {
            if (!even) validate_uneven_stages(p, m.layers);
            validate_schedule(p, m.layers);
        } catch (const error&) {
            continue;
        }
        runs.emplace_back(s, 1);
    }
    return runs;
}

/// The same, the stages' interleavings made here.
inline PipelineRuns pipeline_runs(const Architecture& m, const PlanRequest& request,
                                  std::uint64_t pp, std::pair<std::uint64_t, std::uint64_t> split,
                                  std::uint64_t M) {
    const auto vpps = pp > 1 ? interleavings(m.layers, pp, split) : std::vector<std::uint64_t>{};
    return pipeline_runs(m, request, pp, split, M, vpps);
}

/// `p` running `run`: its vpp, and the schedule it keeps (interleaved is 1F1B with vpp > 1).
inline Parallelism running(Parallelism p, std::pair<Schedule, std::uint64_t> run) {
    p.vpp = run.second;
    p.schedule = run.first == Schedule::interleaved ? Schedule::one_f_one_b : run.first;
    return p;
}

/// The recomputation modes a search may try, in order (mode_tried says which it does).
inline constexpr std::array<Recompute, 4> searched_modes{Recompute::none, Recompute::selective,
                                                         Recompute::full, Recompute::op};

/// Whether a layout tries recomputation `mode`: where the request allows it, and a pinned count of
/// recomputed layers only with full recomputation and where the layout's chunks have that many.
inline bool mode_tried(const Architecture& m, const PlanRequest& request, const Parallelism& p,
                       Recompute mode) {
    if (!allowed(request.modes, mode)) return false;
    if (mode == Recompute::op && request.modes.empty()) return false;  // another program's
    const auto& pinned = request.recompute_layers;
    return !pinned || (mode == Recompute::full && *pinned <= largest_chunk(p, m.layers));
}

/// The divisors of `n` among `factors`, the divisors of a multiple of n: a filter, not a search.
inline std::vector<std::uint64_t> divisors_among(const std::vector<std::uint64_t>& factors,
                                                 std::uint64_t n) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t d : factors) {
        if (d > n) break;  // factors ascend
        if (n % d == 0) out.push_back(d);
    }
    return out;
}

/// The ZeRO stages and offloads a layout of dp replicas tries, each handed to visit(zero, offload).
template <class Visit>
void for_each_state(const PlanRequest& request, std::uint64_t dp, Visit&& visit) {
    // A recipe that gathers its weights in float8 (FSDP2's) runs under ZeRO-3 alone.
    const LinearCasts* casts = request.base.recipe.casts;
    const unsigned least = casts != nullptr && casts->gathered_weight_bytes != 0 ? 3 : 0;
    for (unsigned zero = least; zero <= 3; ++zero)
        for (Offload offload : {Offload::none, Offload::optimizer, Offload::parameters})
            for (bool activations : {false, true}) {
                // dp 1: nothing to shard, so a pinned stage says nothing of it (its stage 0 stays)
                const bool pinned_away = !allowed(request.zero, zero) && !(dp == 1 && zero == 0);
                if ((zero > 0 && dp == 1) || pinned_away) continue;
                // validate()'s rule: optimizer offload needs a ZeRO stage, parameter offload
                // ZeRO-3.
                if ((offload == Offload::optimizer && zero == 0) ||
                    (offload == Offload::parameters && zero != 3))
                    continue;
                const OffloadMode alternative{offload,
                                              activations};  // activations: only where listed
                const auto& listed = request.offload;
                if (activations
                        ? std::find(listed.begin(), listed.end(), alternative) == listed.end()
                        : !allowed(listed, alternative))
                    continue;
                visit(zero, alternative);
            }
}

/// Every layout's degrees (dp, tp, pp, cp, ep, etp, sequence parallelism) and stage split, handed
/// to `visit` (the Parallelism, the split) in a fixed order; the rest of the layout is not set.
template <class Visit>
void for_each_degrees(const Architecture& m, const PlanRequest& request, Visit&& visit) {
    const std::uint64_t s = request.base.seq, G = request.global_batch;
    const std::vector<std::uint64_t> factors = divisors(request.gpus);
    const bool moe = m.any_moe();
    // A degree divides every width it splits where it divides their greatest common divisor: one
    // division a degree, not one a width of each kind of layer.
    std::uint64_t split_widths = std::gcd(m.heads, m.key_value_heads()), experts = 0;
    m.every_kind([&](const Architecture& v) {
        split_widths = std::gcd(split_widths, std::gcd(v.ffn, v.shared_ffn));
        if (state_space(v.mixer)) split_widths = std::gcd(split_widths, v.ssm.d_inner);
        if (v.is_moe()) experts = std::gcd(experts, v.experts);
        return true;
    });
    for (std::uint64_t tp : factors) {
        const bool too_wide = request.max_tp != 0 && tp > request.max_tp;
        if (split_widths % tp != 0 || too_wide || !allowed(request.tp, tp)) continue;
        for (std::uint64_t pp : divisors_among(factors, request.gpus / tp)) {
            if (!allowed(request.pp, pp)) continue;
            const auto split =
                stage_split(m.layers, pp, request.first_stage_layers, request.last_stage_layers);
            if (!split) continue;
            for (std::uint64_t cp : divisors_among(factors, request.gpus / (tp * pp))) {
                const std::uint64_t dp = request.gpus / (tp * pp * cp);
                if (!allowed(request.cp, cp) || !allowed(request.dp, dp) || G % dp != 0) continue;
                using Degrees = std::vector<std::uint64_t>;
                const Degrees eps = moe ? divisors_among(factors, dp) : Degrees{1};
                for (std::uint64_t ep : eps) {
                    // ep divides every mixture-of-experts kind's experts
                    if (!allowed(request.ep, ep) || experts % ep != 0) continue;
                    // Expert tensor parallelism: tp (Megatron's default), or none (etp 1), which
                    // frees the experts of tp's communication.
                    const Degrees etps = moe && tp > 1 ? Degrees{tp, 1} : Degrees{tp};
                    for (std::uint64_t etp : etps)
                        for (bool sp : {false, true}) {
                            const auto& pinned = request.sequence_parallel;
                            if ((sp && tp == 1) || (pinned && tp > 1 && *pinned != sp)) continue;
                            if (s % (cp * (sp ? tp : 1)) != 0) continue;
                            Parallelism p;
                            p.dp = dp, p.tp = tp, p.pp = pp, p.cp = cp, p.ep = ep;
                            p.etp = etp == tp ? 0 : etp;
                            p.sequence_parallel = sp;
                            std::tie(p.first_stage_layers, p.last_stage_layers) = *split;
                            visit(p, *split);
                        }
                }
            }
        }
    }
}

/// Every layout's shape: its degrees, stage split, ZeRO stage and offload, handed to `visit` (the
/// Parallelism, the split) in a fixed order; its micro-batch, schedule and recomputation unset.
template <class Visit>
void for_each_shape(const Architecture& m, const PlanRequest& request, Visit&& visit) {
    for_each_degrees(m, request, [&](Parallelism p, std::pair<std::uint64_t, std::uint64_t> split) {
        for_each_state(request, p.dp, [&](unsigned zero, OffloadMode offload) {
            p.zero = zero, p.offload = offload.state, p.offload_activations = offload.activations;
            visit(p, split);
        });
    });
}

/// Workloads depend on the micro-batch and the recomputation alone: each is built once. One whose
/// byte counts pass 64 bits is remembered as such: every layout with it is too big to run. Their
/// stage facts are made once a layout (StageFactsCache).
class WorkloadCache {
public:
    using Cached = std::optional<std::pair<Workload, ComputeCost>>;

    WorkloadCache(const Architecture& m, const PlanRequest& request)
        : m_(m),
          request_(request),
          params_(trained_parameters(m, request.base.tuning)),
          tunings_(layer_tunings(m, params_->table, request.base.tuning)) {}

    const Cached& operator()(std::uint64_t b, Recompute mode) {
        auto it = workloads_.find({b, mode});
        if (it != workloads_.end()) return it->second;
        const Settings& base = request_.base;
        const std::uint64_t s = base.seq;
        Cached built;
        try {
            const ActivationTables t =
                activation_tables(m_, s, b, base.recipe.precision(), base.activations,
                                  base.framework, base.recompute_modules, tunings_);
            const KindFlops spared = policy_spared_flops(t, m_.kind_count());
            built = std::make_pair(
                make_workload(m_, base.recipe, s, b, mode, params_, t, base.framework),
                compute_cost(m_, s, b, mode, base.recompute_modules, nullptr, &spared));
            count_launches(built->first, t);
        } catch (const overflow_error&) {}
        return workloads_.emplace(std::make_pair(b, mode), std::move(built)).first->second;
    }
    const LayerPattern& pattern() const { return params_->pattern; }
    /// The search's stage facts: every workload of it holds the same parameters and state.
    StageFactsCache& facts() { return facts_; }

private:
    const Architecture& m_;
    const PlanRequest& request_;
    std::shared_ptr<const ParameterSplits> params_;
    std::vector<LayerTuning> tunings_;
    std::map<std::pair<std::uint64_t, Recompute>, Cached> workloads_;
    StageFactsCache facts_;
};

/// Each pipeline's StageMix, made once.
class StageMixes {
public:
    StageMixes(const Architecture& m, const LayerPattern& pattern) : m_(m), pattern_(pattern) {}
    const StageMix& operator()(const Parallelism& p) {
        const auto [it, made] = mixes_.try_emplace(stage_mix_key(p));
        if (made) it->second = stage_mix(m_.layers, pattern_, p);
        return it->second;
    }

private:
    const Architecture& m_;
    const LayerPattern& pattern_;
    std::map<StageMixKey, StageMix> mixes_;
};

/// One row: layout q at micro-batch b under `mode`, measured where its workload fits in 64 bits
/// (its peak only where it does not rank below `cutoff`).
inline PlanRow measured_row(const Architecture& m, const PlanRequest& request,
                            WorkloadCache& workload, const StageMix& mix, const Parallelism& q,
                            std::uint64_t b, Recompute mode, const RankCutoff& cutoff = {}) {
    PlanRow row;
    row.parallel = q;
    row.parallel.recompute_layers = request.recompute_layers;
    row.micro_batch = b;
    row.recompute = mode;
    if (const WorkloadCache::Cached& cached = workload(b, mode)) {
        const auto& [w, cost] = *cached;
        const bool pinned = request.recompute_layers.has_value();
        measure(row, w, mix,
                pinned ? partial_cost(m, w, row.parallel, request, workload.facts()) : cost,
                request, workload.facts(), cutoff);
    } else {
        const double idle = bubble_share(q, 1.0 / 3);
        row.bubble = idle / (1 + idle);
    }
    return row;
}

/// A key no partial row of layout q at micro-batch b (fewest_recomputed's, N >= 1) ranks above:
/// the step of one layer a chunk recomputed, its data-parallel reduction left out (each other term
/// only grows with N: more FLOPs, a longer backward, which no schedule's bubble shrinks with; the
/// reduction alone may hide under that backward), then its waste (which grows with N too) and its
/// communication (which does not change), then no peak. None without a workload.
inline std::optional<PlanKey> partial_floor(const Architecture& m, const PlanRequest& request,
                                            WorkloadCache& workload, const StageMix& mix,
                                            const Parallelism& q, std::uint64_t b) {
    const WorkloadCache::Cached& full = workload(b, Recompute::full);
    if (!full) return std::nullopt;
    const Workload& w = full->first;
    Parallelism p = q;
    p.recompute_layers = 1;
    const ComputeCost cost = partial_cost(m, w, p, request, workload.facts());
    const double forward_share = cost.step / 3 / (cost.step + cost.recompute);
    const double idle = bubble_share(p, forward_share);
    try {
        const StageFacts& first = workload.facts()(w, p, 0);
        Traffic bytes = traffic(w, p, first);
        const double communication = bytes.total();
        bytes.data_parallel = {};
        double seconds = std::numeric_limits<double>::infinity();
        if (request.gpu) {
            const DeviceWork work = device_work(w, p, first, mix, cost, request, forward_share);
            if (const auto t = step_time(*request.gpu, p, work, bytes))
                seconds = t->seconds() * (1 - 1e-9);  // low by a billionth: rounding never lifts it
        }
        return PlanKey{seconds, cost.recompute_fraction() + idle / (1 + idle), communication, 0};
    } catch (const overflow_error&) {
        return std::nullopt;
    }
}

/// Layout q at micro-batch b under each recomputation mode tried, handed to `visit`; after full
/// recomputation, where it fits and none does not, the fewest layers of it that fit. Rows ranked
/// below `cutoff` keep no peak, but for none's and full's where their fit decides that search and
/// a partial row could still rank (partial_floor).
template <class Visit>
void visit_modes(const Architecture& m, const PlanRequest& request, WorkloadCache& workload,
                 const StageMix& mix, const Parallelism& q, std::uint64_t b,
                 const RankCutoff& cutoff, Visit&& visit) {
    const bool partial_searched = request.partial_recompute && !request.recompute_layers &&
                                  mix.largest_chunk >= 2 &&
                                  mode_tried(m, request, q, Recompute::full);
    std::optional<std::optional<PlanKey>> floor;  // made when first asked for
    const auto partial_may_rank = [&] {
        if (!floor) floor = partial_floor(m, request, workload, mix, q, b);
        return !*floor || !(**floor > *cutoff);
    };
    bool none_fits = false;  // then a partial row needs no search
    for (Recompute mode : searched_modes) {
        if (!mode_tried(m, request, q, mode)) continue;
        PlanRow row = measured_row(m, request, workload, mix, q, b, mode, cutoff);
        const bool decides = partial_searched &&
                             (mode == Recompute::none || (mode == Recompute::full && !none_fits));
        if (row.ranked_out && decides && partial_may_rank())
            row = measured_row(m, request, workload, mix, q, b, mode);  // its fit is needed
        none_fits = none_fits || (mode == Recompute::none && row.fits);
        visit(row);
        if (mode != Recompute::full || !partial_searched || none_fits || !row.fits) continue;
        const Workload& w = workload(b, mode)->first;  // it fits: it has a workload
        if (const auto fewest =
                fewest_recomputed(m, w, mix, row, request, workload.facts(), cutoff))
            visit(*fewest);
    }
}

}  // namespace detail

/// Every valid layout of `request.gpus` devices, with its peak and costs, handed to `visit` as it
/// is made, in a fixed order (the order ties are ranked in). With a `cutoff` (a search keeping its
/// best: top_layouts), a row ranked below it is handed over ranked out, without its peak.
template <class Visit>
void for_each_layout(const Architecture& m, const PlanRequest& request, Visit&& visit,
                     const RankCutoff& cutoff = {}) {
    detail::validate_plan_request(m, request);
    const std::uint64_t G = request.global_batch;
    detail::WorkloadCache workload(m, request);
    detail::StageMixes mixes(m, workload.pattern());
    using Split = std::pair<std::uint64_t, std::uint64_t>;
    // A replica's micro-batch sizes divide its share of G: G's divisors, filtered, in order.
    const std::vector<std::uint64_t> batch_divisors = divisors(G);
    detail::for_each_shape(m, request, [&](Parallelism p, Split split) {
        const auto vpps = p.pp > 1 ? detail::interleavings(m.layers, p.pp, split)
                                   : std::vector<std::uint64_t>{};  // the same for every b
        for (std::uint64_t b : batch_divisors) {
            if ((G / p.dp) % b != 0 || !allowed(request.micro_batches, b)) continue;
            p.microbatches = G / (p.dp * b);
            if (!count_allowed(request, p.pp, p.microbatches)) continue;
            for (const auto& run :
                 detail::pipeline_runs(m, request, p.pp, split, p.microbatches, vpps)) {
                if (!allowed(request.vpp, run.second)) continue;
                const Parallelism q = detail::running(p, run);
                detail::visit_modes(m, request, workload, mixes(q), q, b, cutoff, visit);
            }
        }
    });
}

/// How much a search evaluates: its layouts (for_each_layout's rows, besides the partial
/// recomputation rows, at most one a fully recomputing layout), and the pipeline stages whose peaks
/// they measure (layout_peak: every stage where the kinds of layer differ, else at most three).
struct SearchSize {
    std::uint64_t layouts = 0, stages = 0;
};

namespace detail {
inline constexpr std::uint64_t most_counted = std::numeric_limits<std::uint64_t>::max();
inline std::uint64_t saturating_add(std::uint64_t a, std::uint64_t b) {
    return a > most_counted - b ? most_counted : a + b;
}
inline std::uint64_t saturating_mul(std::uint64_t a, std::uint64_t b) {
    return b != 0 && a > most_counted / b ? most_counted : a * b;
}
}  // namespace detail

/// Counts a search before it runs, on any number of devices, without measuring a layout: a shape's
/// rows depend on its dp, pp and stage split alone, and are counted once for each.
class SearchCounter {
public:
    SearchCounter(const Architecture& m, const PlanRequest& request)
        : m_(m),
          request_(request),
          uniform_(LayerPattern(m).uniform()),
          counts_(divisors(request.global_batch)) {}

    /// The search plan_top makes on `gpus` devices (checked as it checks them).
    SearchSize size(std::uint64_t gpus) {
        request_.gpus = gpus;
        detail::validate_plan_request(m_, request_);
        SearchSize total;
        detail::for_each_degrees(m_, request_, [&](const Parallelism& p, Split split) {
            using detail::saturating_add, detail::saturating_mul;
            const std::uint64_t rows = saturating_mul(shape_rows(p.dp, p.pp, split), states(p.dp));
            const std::uint64_t stages = uniform_ ? std::min<std::uint64_t>(p.pp, 3) : p.pp;
            total.layouts = saturating_add(total.layouts, rows);
            total.stages = saturating_add(total.stages, saturating_mul(rows, stages));
        });
        return total;
    }

private:
    using Split = std::pair<std::uint64_t, std::uint64_t>;
    static constexpr std::uint64_t unknown = std::numeric_limits<std::uint64_t>::max();

    /// A shape's rows: each micro-batch count (counts_[i], a divisor of a replica's share of the
    /// global batch) whose micro-batch is tried, times its schedules and modes.
    std::uint64_t shape_rows(std::uint64_t dp, std::uint64_t pp, Split split) {
        const ShapeKey key{dp, Key{pp, split.first, split.second}};
        // Each ZeRO stage and offload of a layout asks again: one comparison, not a search.
        if (last_ != shape_rows_.end() && last_->first == key) return last_->second;
        const auto [it, made] = shape_rows_.try_emplace(key, 0);
        last_ = it;
        if (!made) return it->second;
        const std::uint64_t share = request_.global_batch / dp;
        const Key stages{pp, split.first, split.second};
        std::vector<std::uint64_t>& rows_at =
            rows_by_count_.try_emplace(stages, counts_.size(), unknown).first->second;
        for (std::size_t i : share_divisors(dp)) {
            if (!allowed(request_.micro_batches, share / counts_[i]) ||
                !count_allowed(request_, pp, counts_[i]))
                continue;
            if (rows_at[i] == unknown) rows_at[i] = count_rows(pp, split, counts_[i]);
            it->second += rows_at[i];
        }
        return it->second;
    }

    /// The ZeRO stages and offloads of dp replicas: one set for dp 1 (nothing to shard), one else.
    std::uint64_t states(std::uint64_t dp) {
        std::uint64_t& known = states_[dp > 1];
        if (known == unknown) {
            known = 0;
            detail::for_each_state(request_, dp, [&](unsigned, OffloadMode) { ++known; });
        }
        return known;
    }

    /// Indices in counts_ of the divisors of the share of the global batch of each of dp replicas.
    const std::vector<std::size_t>& share_divisors(std::uint64_t dp) {
        const auto [it, made] = share_divisors_.try_emplace(dp);
        if (made)
            for (std::size_t i = 0; i < counts_.size(); ++i)
                if ((request_.global_batch / dp) % counts_[i] == 0) it->second.push_back(i);
        return it->second;
    }

    /// Rows of one micro-batch count M on pp stages split as given: its schedules, each mode tried.
    std::uint64_t count_rows(std::uint64_t pp, Split split, std::uint64_t M) const {
        Parallelism p;
        p.pp = pp, p.microbatches = M;
        std::tie(p.first_stage_layers, p.last_stage_layers) = split;
        std::uint64_t rows = 0;
        for (const auto& run : detail::pipeline_runs(m_, request_, pp, split, M)) {
            if (!allowed(request_.vpp, run.second)) continue;
            const Parallelism q = detail::running(p, run);
            for (Recompute mode : detail::searched_modes)
                rows += detail::mode_tried(m_, request_, q, mode);
        }
        return rows;
    }

    const Architecture& m_;
    PlanRequest request_;
    bool uniform_;
    std::vector<std::uint64_t> counts_;  ///< the global batch's divisors: the micro-batch counts
    using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>;  ///< pp, first, last
    using ShapeKey = std::pair<std::uint64_t, Key>;                       ///< dp, then as above
    std::map<ShapeKey, std::uint64_t> shape_rows_;
    std::map<ShapeKey, std::uint64_t>::iterator last_ = shape_rows_.end();  ///< the last asked for
    std::map<Key, std::vector<std::uint64_t>> rows_by_count_;               ///< rows at counts_[i]
    std::map<std::uint64_t, std::vector<std::size_t>> share_divisors_;
    std::array<std::uint64_t, 2> states_{unknown, unknown};  ///< for dp 1, and for more
};

namespace detail {
inline std::string search_on(std::uint64_t gpus) {
    return "a plan on " + std::to_string(gpus) + " devices";
}

/// Refuses a search past the request's limit, naming it (`what`), its size and the limit.
inline void check_search(const SearchSize& size, const PlanRequest& request,
                         const std::string& what) {
    if (size.stages <= request.search_limit) return;
    throw search_limit_error(what + " would evaluate " + std::to_string(size.layouts) +
                             " layouts, measuring " + std::to_string(size.stages) +
                             " pipeline stages, past the search limit of " +
                             std::to_string(request.search_limit));
}

/// The search on request.gpus devices, refused past its limit.
inline void check_search(const Architecture& m, const PlanRequest& request) {
    check_search(SearchCounter(m, request).size(request.gpus), request, search_on(request.gpus));
}
}  // namespace detail

/// Every valid layout, ranked by plan_order, fitting ones first; `each` sees the count as rows are
/// made.
inline std::vector<PlanRow> plan(const Architecture& m, const PlanRequest& request,
                                 const std::function<void(std::size_t)>& each = nullptr) {
    detail::check_search(m, request);
    std::vector<PlanRow> rows;
    rows.reserve(4096);  // a few thousand layouts is typical: skip the small regrowths
    for_each_layout(m, request, [&](const PlanRow& row) {
        rows.push_back(row);
        if (each) each(rows.size());
    });
    // Sort the keys, computed once, not the rows: a row is a few hundred bytes and its peak a sum.
    struct Ranked {
        bool fits;
        PlanKey key;
        std::size_t row;
    };
    std::vector<Ranked> ranked;
    ranked.reserve(rows.size());
    for (std::size_t i = 0; i < rows.size(); ++i)
        ranked.push_back({rows[i].fits, plan_key(rows[i]), i});
    std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
        return a.fits != b.fits ? a.fits : a.key < b.key;
    });
    std::vector<PlanRow> sorted;
    sorted.reserve(rows.size());
    for (const Ranked& r : ranked) sorted.push_back(rows[r.row]);
    return sorted;
}

/// The best `k` fitting layouts, ranked as plan() ranks them, and how many were evaluated and fit:
/// memory that does not grow with the number of layouts.
struct PlanSummary {
    std::vector<PlanRow> top;
    /// `fitting`: those whose peak and rows fit, less those the allocator's check refused.
    /// `ranked_out`: those whose time, waste and communication alone ranked them below the best
    /// kept, so their peak was not weighed (whether they fit is not known; none is among the best).
    std::size_t evaluated = 0, fitting = 0, ranked_out = 0;
    /// Layouts ranked among the best whose allocated peak and device rows fit but whose device
    /// figure (the allocator's reserved bytes) does not: refused, with their figure.
    std::vector<PlanRow> refused;
    std::uint64_t layouts = 0;  ///< what the whole search evaluates (SearchSize::layouts)
    bool complete = true;       ///< false: it stopped at PlanRequest::time_limit
    /// The fraction of the search's layouts evaluated: 1 when complete.
    double coverage() const {
        if (complete || layouts == 0) return 1;
        return std::min(1.0, static_cast<double>(evaluated) / static_cast<double>(layouts));
    }
};

namespace detail {
/// Thrown by a search's visitor past its deadline: the loops end, the best so far stay.
struct SearchStopped {};

/// When a search must end: PlanRequest::time_limit from its start; looked at every 64 layouts.
class Deadline {
public:
    explicit Deadline(std::optional<double> seconds) {
        if (seconds)
            end_ = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(std::max(0.0, *seconds)));
    }
    void check(std::size_t evaluated) const {
        if (end_ && evaluated % 64 == 0 && std::chrono::steady_clock::now() >= *end_)
            throw SearchStopped{};
    }

private:
    std::optional<std::chrono::steady_clock::time_point> end_;
};

/// The settings of one of `request`'s layouts.
inline Settings row_settings(const PlanRequest& request, const PlanRow& row) {
    Settings s = request.base;
    s.parallel = row.parallel, s.micro_batch = row.micro_batch, s.recompute = row.recompute;
    return s;
}

/// The best layouts, each checked through the allocator's simulation in rank order until `k`
/// fit; those that do not are refused. Without PlanRequest::device, the first `k` as they are.
inline void check_devices(const Architecture& m, const PlanRequest& request, std::size_t k,
                          std::vector<PlanRow> ranked, PlanSummary& summary) {
    for (PlanRow& row : ranked) {
        if (summary.top.size() == k) break;
        if (request.device) {
            const Report r = estimate(m, row_settings(request, row));
            row.device = weighed_device(r, *request.device);
            if (*row.device > request.capacity) {
                summary.refused.push_back(std::move(row));
                --summary.fitting;  // counted when its peak and rows fit: it does not
                continue;
            }
        }
        summary.top.push_back(std::move(row));
    }
}

/// How many of the best a search keeps to check: more than `k` where the allocator's
/// simulation may refuse some (a layout near the limit often is; each check takes a millisecond).
inline std::size_t kept_for(const PlanRequest& request, std::size_t k) {
    return request.device ? 8 * k + 16 : k;
}

/// plan_top without its check: plan_fewest checks its whole search at once.
inline PlanSummary top_layouts(const Architecture& m, const PlanRequest& request, std::size_t k,
                               const std::function<void(std::size_t)>& each,
                               const Deadline& deadline) {
    using Ranked = std::pair<PlanKey, std::size_t>;  // key, then order made
    std::vector<std::pair<Ranked, PlanRow>> heap;    // a max-heap: the worst of the best k on top
    const auto worse = [](const auto& a, const auto& b) { return a.first < b.first; };
    PlanSummary summary;
    const std::size_t kept = kept_for(request, k);
    RankCutoff cutoff;  // the worst of the best kept, once there are as many as wanted
    cutoff.fitting_only = true;
    const auto visit = [&](const PlanRow& row) {
        deadline.check(summary.evaluated);
        ++summary.evaluated;
        if (each) each(summary.evaluated);
        summary.ranked_out += row.ranked_out;
        if (!row.fits) return;
        ++summary.fitting;
        const Ranked rank{plan_key(row), summary.evaluated};
        if (heap.size() < kept) {
            heap.emplace_back(rank, row);
            std::push_heap(heap.begin(), heap.end(), worse);
        } else if (kept > 0 && rank < heap.front().first) {
            std::pop_heap(heap.begin(), heap.end(), worse);
            heap.back() = {rank, row};
            std::push_heap(heap.begin(), heap.end(), worse);
        }
        if (kept > 0 && heap.size() == kept) cutoff.worst = heap.front().first.first;
    };
    try {
        for_each_layout(m, request, visit, cutoff);
    } catch (const SearchStopped&) {
        summary.complete = false;
    }
    std::sort_heap(heap.begin(), heap.end(), worse);
    std::vector<PlanRow> ranked;
    for (auto& [rank, row] : heap) ranked.push_back(std::move(row));
    check_devices(m, request, k, std::move(ranked), summary);
    return summary;
}
}  // namespace detail

inline PlanSummary plan_top(const Architecture& m, const PlanRequest& request, std::size_t k,
                            const std::function<void(std::size_t)>& each = nullptr) {
    const SearchSize size = SearchCounter(m, request).size(request.gpus);
    detail::check_search(size, request, detail::search_on(request.gpus));
    PlanSummary summary =
        detail::top_layouts(m, request, k, each, detail::Deadline(request.time_limit));
    summary.layouts = size.layouts;
    return summary;
}

/// Tokens a GPU processes a second under a row's estimated step time, or none without one.
inline std::optional<double> tokens_per_second_per_gpu(const PlanRequest& request,
                                                       const PlanRow& row) {
    if (!row.time) return std::nullopt;
    return static_cast<double>(request.global_batch) * static_cast<double>(request.base.seq) /
           (row.time->seconds() * static_cast<double>(row.parallel.devices()));
}

/// The most devices the search for the fewest tries (Llama 3 405B's cluster): it stops there,
/// having found none that fits, rather than try the many a search to max_devices would.
inline constexpr std::uint64_t fewest_gpus_limit = 1ULL << 14;

/// The fewest devices, a multiple of `step` (the GPUs of a node, or 1), on which some layout fits,
/// with that count's best `k` layouts; request.gpus is set to the count found (none: 0, with an
/// empty summary). Refused (search_limit_error) before it starts where trying every count would
/// pass the limit.
inline PlanSummary plan_fewest(const Architecture& m, PlanRequest& request, std::uint64_t step,
                               std::size_t k,
                               const std::function<void(std::size_t)>& each = nullptr) {
    detail::require_positive("step", step);
    if (step > fewest_gpus_limit)
        throw error("step (" + std::to_string(step) + ") exceeds the " +
                    std::to_string(fewest_gpus_limit) + " devices the search for the fewest tries");
    SearchCounter counter(m, request);
    SearchSize most;  // should no count fit: every count's search
    for (std::uint64_t n = step; n <= fewest_gpus_limit; n += step) {
        const SearchSize size = counter.size(n);
        most.layouts = detail::saturating_add(most.layouts, size.layouts);
        most.stages = detail::saturating_add(most.stages, size.stages);
    }
    const std::string counts = step > 1 ? ", " + std::to_string(step) + " at a time" : "";
    detail::check_search(most, request,
                         "the search for the fewest devices (up to " +
                             std::to_string(fewest_gpus_limit) + counts + ")");
    std::size_t evaluated = 0, ranked_out = 0;
    const detail::Deadline deadline(request.time_limit);
    for (std::uint64_t n = step; n <= fewest_gpus_limit; n += step) {
        request.gpus = n;
        PlanSummary summary = detail::top_layouts(
            m, request, k,
            [&](std::size_t made) {
                if (each) each(evaluated + made);
            },
            deadline);
        evaluated += summary.evaluated, ranked_out += summary.ranked_out;
        summary.evaluated = evaluated, summary.ranked_out = ranked_out;
        summary.layouts = most.layouts;
        if (!summary.top.empty()) return summary;
        if (!summary.complete) return summary;  // stopped at n devices: none found yet
    }
    request.gpus = 0;
    PlanSummary none;
    none.evaluated = evaluated, none.ranked_out = ranked_out, none.layouts = most.layouts;
    return none;
}

}  // namespace memcalc
