#pragma once
/// How one training step is spread over devices: data parallelism with ZeRO/FSDP sharding, tensor
/// (and sequence), pipeline, context and expert parallelism, and the micro-batches of a step.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/error.hpp"
#include "memcalc/layers.hpp"
#include "memcalc/model.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/schedule.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// What ZeRO-Offload keeps in host memory instead of on the device.
enum class Offload {
    none,
    optimizer,   ///< the fp32 master copy and the optimiser state (the optimiser step runs on the
                 ///< CPU)
    parameters,  ///< that, and the weights' shards too (ZeRO-3 only): layers are gathered from the
                 ///< host
};

inline const char* offload_name(Offload o) {
    return o == Offload::none ? "none" : o == Offload::optimizer ? "optimizer" : "parameters";
}

/// One offload alternative: a ZeRO-Offload mode, and whether each layer's activations go to host
/// memory too (activation offload, orthogonal to it). Named as --offload spells it:
/// "optimizer+activations".
struct OffloadMode {
    Offload state = Offload::none;
    bool activations = false;

    OffloadMode(Offload s = Offload::none, bool a = false)
        : state(s), activations(a) {}  // implicit: a mode alone
    bool operator==(const OffloadMode& o) const {
        return state == o.state && activations == o.activations;
    }
    const char* name() const {
        if (!activations) return offload_name(state);
        return state == Offload::none        ? "activations"
               : state == Offload::optimizer ? "optimizer+activations"
                                             : "parameters+activations";
    }
};

struct Parallelism {
    std::uint64_t dp = 1;  ///< data-parallel replicas
    std::uint64_t tp = 1;  ///< tensor-parallel ranks (Megatron-style column/row splits)
    std::uint64_t pp = 1;  ///< pipeline stages
    std::uint64_t cp = 1;  ///< context-parallel ranks: the sequence split across them
    std::uint64_t ep = 1;  ///< expert-parallel ranks (within the data-parallel group)
    /// Expert tensor-parallel ranks (Megatron-LM's expert_tensor_parallel_size): the routed
    /// experts' weights and hidden width split over them instead of tp; 0 means tp.
    std::uint64_t etp = 0;
    std::uint64_t vpp = 1;  ///< virtual stages per pipeline rank (interleaved 1F1B when > 1)
    /// The pipeline schedule; 1F1B with vpp > 1 means interleaved (pipeline_schedule), as --vpp
    /// alone always has.
    Schedule schedule = Schedule::one_f_one_b;
    bool sequence_parallel =
        false;          ///< with tp > 1: norms, dropout and the linear layers' inputs split too
    unsigned zero = 0;  ///< ZeRO stage: 1 shards optimiser state, 2 also gradients, 3 also weights
    std::uint64_t shard_group =
        0;  ///< ranks that share one copy of the sharded state; 0 means all dp ranks
    std::uint64_t microbatches = 0;  ///< micro-batches per step (gradient accumulation); 0 means pp
    std::uint64_t gathered_layers =
        2;  ///< ZeRO-3: layers whose full weights are gathered at once (prefetch)
    Offload offload = Offload::none;
    /// Activation offload: what each layer keeps for backward (its saved tensors, or its checkpoint
    /// under full recomputation) goes to host memory after its forward and comes back for its
    /// backward; the device keeps only the layers in transit (stage_inputs and step_at say which).
    bool offload_activations = false;
    /// Layers of the first and the last pipeline stage when they differ from the rest
    /// (Megatron-LM's decoder-first/last-pipeline-num-layers); 0: an even share. The other stages
    /// split the rest evenly.
    std::uint64_t first_stage_layers = 0, last_stage_layers = 0;
    /// Partial recomputation (Megatron-LM's --recompute-method block --recompute-num-layers N):
    /// with recompute full, only the first N layers of each stage's chunk are recomputed; none: all
    /// of them.
    std::optional<std::uint64_t> recompute_layers;

    std::uint64_t devices() const { return dp * tp * pp * cp; }
    /// Data-parallel ranks that share one copy of the sharded state (the hybrid shard group).
    std::uint64_t sharding() const { return zero == 0 ? 1 : (shard_group == 0 ? dp : shard_group); }
    /// Ranks ZeRO shards a dense parameter's state over: the shard group times the context-parallel
    /// ranks, which hold the same weights (Megatron-LM's distributed optimizer and FSDP shard over
    /// dp x cp).
    std::uint64_t dense_shards() const { return sharding() * (zero == 0 ? 1 : cp); }
    /// The same for an expert's: only the ranks that hold the same experts (the
    /// expert-data-parallel group, dp x cp / ep) share its state; with ep = dp x cp each expert's
    /// state stays whole. With etp below tp the tp / etp ranks that hold one expert piece join that
    /// group (Megatron-LM's expert_data_parallel_size = world / (etp x ep x pp)).
    std::uint64_t expert_shards() const {
        return std::gcd(dense_shards() * (tp / expert_tp()),
                        zero == 0 ? 1 : dp * cp * tp / (expert_tp() * ep));
    }
    std::uint64_t expert_tp() const { return etp == 0 ? tp : etp; }
    std::uint64_t steps_per_batch() const { return microbatches == 0 ? pp : microbatches; }
    bool uneven_stages() const { return first_stage_layers != 0 || last_stage_layers != 0; }
    bool any() const { return devices() > 1 || zero > 0 || vpp > 1 || offloads(); }
    OffloadMode offload_mode() const { return {offload, offload_activations}; }
    /// Whether anything goes to host memory.
    bool offloads() const { return offload != Offload::none || offload_activations; }
    Schedule pipeline_schedule() const {
        return schedule == Schedule::one_f_one_b && vpp > 1 ? Schedule::interleaved : schedule;
    }
};

/// The largest cluster memcalc plans for: far beyond any built, small enough that its layouts can
/// be enumerated in a moment.
inline constexpr std::uint64_t max_devices = 1ULL << 24;

/// The most micro-batches in one step: as many as the largest global batch has sequences.
inline constexpr std::uint64_t max_microbatches = 1ULL << 40;

/// The divisors of n, ascending.
inline std::vector<std::uint64_t> divisors(std::uint64_t n) {
    std::vector<std::uint64_t> out;
    for (std::uint64_t d = 1; d <= n / d; ++d)  // d * d could pass 64 bits
        if (n % d == 0) {
            out.push_back(d);
            if (d != n / d) out.push_back(n / d);
        }
    std::sort(out.begin(), out.end());
    return out;
}

/// Ceiling division, for flat buffers padded to a multiple of their shard count. Most degrees are 1
/// (one device, no context or expert parallelism), so that case skips the division, which costs
/// tens of cycles where a compare costs one.
inline Count ceil_div(Count n, std::uint64_t by) {
    return by == 1 ? n : Count(n.value() / by + (n.value() % by != 0));
}

namespace detail {
inline void require_divides(const char* what, std::uint64_t d, const char* of, std::uint64_t n) {
    if (d == 0 || n % d != 0)
        throw error(std::string(what) + " (" + std::to_string(d) + ") must divide " + of + " (" +
                    std::to_string(n) + ")");
}
}  // namespace detail

inline const ScheduleRow& schedule_row(const Parallelism& p) {
    return schedule_row(p.pipeline_schedule());
}

/// Whether stage `stage`'s ranks run any weight-gradient pass (W) apart from its B (ZB-H1's stage
/// 0 runs whole backwards).
inline bool defers_weight_gradients(const Parallelism& p, std::uint64_t stage) {
    const ScheduleRow& row = schedule_row(p);
    return row.defers_weight_gradients && (!row.deferral || row.deferral(p.pp, stage, 1).deferred);
}

/// Model chunks each pipeline rank holds: 1, vpp (interleaved), or 2 (ZB-V, DualPipe).
inline std::uint64_t chunks_per_rank(const Parallelism& p) {
    const std::uint64_t chunks = schedule_row(p).chunks;
    return chunks == 0 ? p.vpp : chunks;
}

/// The distinct chunks the model is cut into (DualPipe's ranks hold each twice).
inline std::uint64_t model_chunks(const Parallelism& p) {
    return p.pp * chunks_per_rank(p) / schedule_row(p).parameter_copies;
}

/// Chunks of one micro-batch a rank runs: each chunk it holds, but once per direction under
/// DualPipe.
inline std::uint64_t chunks_per_microbatch(const Parallelism& p) {
    return chunks_per_rank(p) / schedule_row(p).parameter_copies;
}

/// Whether stage `stage`'s ranks hold the model's first chunk (the embedding) or its last (the
/// head): under a mirrored placement the first rank holds both ends (ZB-V), or the first and last
/// ranks do (DualPipe).
inline bool holds_embedding(const Parallelism& p, std::uint64_t stage) {
    return stage == 0 || (schedule_row(p).mirrored && stage + 1 == model_chunks(p));
}
inline bool holds_head(const Parallelism& p, std::uint64_t stage) {
    return schedule_row(p).mirrored ? stage == 0 || stage + 1 == model_chunks(p)
                                    : stage + 1 == p.pp;
}

/// Micro-batches (with several chunks per rank: model chunks) whose activations pipeline stage
/// `stage` holds at the backward step of its first micro-batch, as the schedule's row gives them
/// (1F1B: min(P - k, M)). `later`: at the backward of micro-batch 2 (the most any later one holds).
inline std::uint64_t in_flight(const Parallelism& p, std::uint64_t stage, bool later = false) {
    return schedule_row(p).in_flight(p.pp, stage, p.steps_per_batch(), p.vpp, later);
}

/// The schedule's bubble as a share of a rank's compute (its chunks of all M micro-batches), with
/// `forward_share` of each chunk's time in its forward.
inline double bubble_share(const Parallelism& p, double forward_share = 1.0 / 3) {
    if (p.pp == 1) return 0;
    const double chunks = static_cast<double>(p.steps_per_batch() * chunks_per_microbatch(p));
    return schedule_row(p).bubble(p.pp, chunk_times(1, forward_share)) / chunks;
}

/// The schedule's own rules (Throws naming the value): its chunk count per rank, even chunks unless
/// the first and last are given their own, and what its paper's runtime needs.
inline void validate_schedule(const Parallelism& p, std::uint64_t layers) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    const ScheduleRow& row = schedule_row(p);
    const std::string name = std::string("schedule ") + row.name;
    if (p.schedule == Schedule::one_f_one_b) return;  // vpp's rules are validate()'s
    if (p.pp == 1) throw error(name + " needs pp > 1");
    if (row.chunks == 0 && p.vpp == 1) throw error(name + " needs vpp > 1 (got vpp 1)");
    if (row.chunks != 0 && p.vpp != 1)
        throw error(name + " runs " + n(row.chunks) + (row.chunks == 1 ? " chunk" : " chunks") +
                    " per rank: vpp must be 1 (got vpp " + n(p.vpp) + ")");
    const std::uint64_t M = p.steps_per_batch();
    if (p.schedule == Schedule::dualpipe && p.pp % 2 != 0)
        throw error(name + " needs an even pp (got pp " + n(p.pp) + ")");
    // DualPipe's runtime asserts an even count of at least 2 pp; ZB-V's zero bubble is a steady
    // state that needs as many.
    if ((p.schedule == Schedule::dualpipe || p.schedule == Schedule::zb_v) &&
        (M < 2 * p.pp || (p.schedule == Schedule::dualpipe && M % 2 != 0)))
        throw error(name + " needs " +
                    (p.schedule == Schedule::dualpipe ? "an even number of " : "") +
                    "micro-batches of at least 2 x pp = " + n(2 * p.pp) + " (got microbatches " +
                    n(M) + ")");
    if (row.chunks == 2 && !p.uneven_stages() && layers % model_chunks(p) != 0)
        throw error(name + " cuts the model into " + n(model_chunks(p)) + " chunks (" +
                    (row.parameter_copies == 2 ? "pp" : "2 x pp") +
                    "), which must divide layers (" + n(layers) + ")");
}

/// The pieces first_stage_layers and last_stage_layers cut the layers into, the first and the
/// last being the model's: the pipeline's stages (interleaved, each rank's layers in vpp equal
/// chunks, as Megatron-LM's uneven stages are), or under a mirrored schedule its model chunks
/// (DualPipe's pp stages, ZB-V's 2 pp chunks; a rank holds two, the k-th and the mirrored one).
inline std::uint64_t split_pieces(const Parallelism& p) {
    return schedule_row(p).mirrored ? model_chunks(p) : p.pp;
}

/// Layers of piece `piece` (split_pieces). Validated layouts only: see validate_uneven_stages.
inline std::uint64_t piece_layers(const Parallelism& p, std::uint64_t layers, std::uint64_t piece) {
    const std::uint64_t n = split_pieces(p);
    if (!p.uneven_stages()) return layers / n;
    if (piece == 0 && p.first_stage_layers != 0) return p.first_stage_layers;
    if (piece + 1 == n && p.last_stage_layers != 0) return p.last_stage_layers;
    const std::uint64_t fixed = (p.first_stage_layers != 0) + (p.last_stage_layers != 0);
    return (layers - p.first_stage_layers - p.last_stage_layers) / (n - fixed);
}

/// How many layers come before piece `piece`'s first.
inline std::uint64_t piece_first_layer(const Parallelism& p, std::uint64_t layers,
                                       std::uint64_t piece) {
    if (piece == 0) return 0;
    return piece_layers(p, layers, 0) + (piece - 1) * piece_layers(p, layers, 1);
}

/// Interleaved: whether end stage `stage` holds one layer fewer than the others, whose chunks are
/// even: the embedding (or the loss) counted as a layer of its first (last) chunk, Megatron-LM's
/// --account-for-embedding-in-pipeline-split (--account-for-loss-in-pipeline-split), as Llama 3
/// 405B ran its 126 layers on 16 stages (7 + 14 x 8 + 7).
inline bool end_counts_a_layer(const Parallelism& p, std::uint64_t layers, std::uint64_t stage) {
    const std::uint64_t V = chunks_per_rank(p), middle = piece_layers(p, layers, 1);
    const bool end = (stage == 0 && p.first_stage_layers != 0) ||
                     (stage + 1 == p.pp && p.last_stage_layers != 0);
    return V > 1 && p.pp > 2 && end && middle % V == 0 &&
           piece_layers(p, layers, stage) + 1 == middle;
}

/// The layers pipeline stage `stage`'s ranks run, in forward order, by the schedule's placement:
/// one piece; vpp chunks of its piece, chunk c in the model's c-th pass through the ranks; or the
/// piece `stage` and its mirror. Validated layouts only.
inline StageLayers rank_layers(const Parallelism& p, std::uint64_t layers, std::uint64_t stage) {
    StageLayers s;
    s.stage = stage;
    s.layers = piece_layers(p, layers, stage);
    s.first_layer = piece_first_layer(p, layers, stage);
    s.chunk = s.layers;
    if (schedule_row(p).mirrored) {
        const std::uint64_t mirror = model_chunks(p) - 1 - stage;
        s.mirrored = true;
        s.mirror_first_layer = piece_first_layer(p, layers, mirror);
        s.layers += piece_layers(p, layers, mirror);
    } else if (const std::uint64_t V = chunks_per_rank(p); V > 1) {
        // An end stage a layer short runs its chunks as long as the others' (leaning high), the
        // embedding counted in the first; the passes count it and the loss too.
        const bool first_counts = end_counts_a_layer(p, layers, 0),
                   last_counts = end_counts_a_layer(p, layers, p.pp - 1);
        const std::uint64_t slots = layers + first_counts + last_counts;
        s.chunk = (s.layers + V - 1) / V;
        s.first_layer = (s.first_layer + (stage > 0 && first_counts)) / V, s.pass = slots / V;
    }
    return s;
}

/// Layers of pipeline stage `stage`'s ranks, all their chunks. Validated layouts only.
inline std::uint64_t stage_layer_count(const Parallelism& p, std::uint64_t layers,
                                       std::uint64_t stage) {
    return rank_layers(p, layers, stage).layers;
}

namespace detail {
inline std::string stage_layers_text(std::uint64_t first, std::uint64_t last) {
    return "first_stage_layers (" + std::to_string(first) + ") + last_stage_layers (" +
           std::to_string(last) + ")";
}
}  // namespace detail

/// What any pipeline needs of the first and last stages' layer counts: at most the model's, both.
/// Each is compared alone first, so a sum past 64 bits never wraps to a small one.
inline void validate_stage_layer_counts(std::uint64_t first, std::uint64_t last,
                                        std::uint64_t layers) {
    if (first > layers || last > layers || first + last > layers)
        throw error(detail::stage_layers_text(first, last) + " exceeds layers (" +
                    std::to_string(layers) + ")");
}

/// Interleaved: each stage's layers run as vpp equal chunks (Megatron-LM's uneven stages), an end
/// stage's first or last chunk a layer short where it counts the embedding or the loss.
inline void validate_interleaved_pieces(const Parallelism& p, std::uint64_t layers) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    const std::uint64_t V = chunks_per_rank(p);
    if (V == 1 || schedule_row(p).mirrored) return;
    for (std::uint64_t stage : {std::uint64_t{0}, std::uint64_t{1}, p.pp - 1}) {
        const std::uint64_t count = piece_layers(p, layers, stage);
        if (count % V == 0 || end_counts_a_layer(p, layers, stage)) continue;
        const bool first = stage == 0 && p.first_stage_layers != 0,
                   last = stage + 1 == p.pp && p.last_stage_layers != 0;
        throw error(std::string(first  ? "first_stage_layers"
                                : last ? "last_stage_layers"
                                       : "the other stages' layers") +
                    " (" + n(count) + ") must be a multiple of vpp (" + n(V) +
                    "): each stage's layers run as vpp equal chunks");
    }
}

/// The first and last pieces' counts (split_pieces) against the layers: the others split the
/// rest evenly, at least one layer each.
inline void validate_uneven_stages(const Parallelism& p, std::uint64_t layers) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    if (p.pp < 2)
        throw error("first_stage_layers and last_stage_layers need pp > 1 (got pp " + n(p.pp) +
                    ")");
    validate_stage_layer_counts(p.first_stage_layers, p.last_stage_layers, layers);
    const std::uint64_t pieces = split_pieces(p);
    const std::uint64_t given = p.first_stage_layers + p.last_stage_layers;  // at most layers
    const std::uint64_t fixed = (p.first_stage_layers != 0) + (p.last_stage_layers != 0);
    const std::uint64_t others = pieces - fixed;
    const std::string what = detail::stage_layers_text(p.first_stage_layers, p.last_stage_layers);
    const std::string kind = schedule_row(p).mirrored ? " model chunks" : " pipeline stages";
    if (others == 0 && given != layers)
        throw error(what + " must equal layers (" + n(layers) + ")");
    if (others > 0 && layers - given < others)
        throw error(what + " leaves " + n(layers - given) + " of " + n(layers) +
                    " layers for the other " + n(others) + kind + ": at least one each");
    if (others > 0 && (layers - given) % others != 0)
        throw error("the other " + n(others) + kind + " cannot split the remaining " +
                    n(layers - given) + " layers evenly (" + what + " of " + n(layers) + ")");
    validate_interleaved_pieces(p, layers);
}

/// The first and last stages' layer counts for `pp` stages (pieces) of `layers` (0: an even
/// share), or none when no split fits: plan's split and the estimate's. Asked-for counts apply
/// wherever they fit; otherwise stages are even when pp divides the layers, else the first and the
/// last take fewer than the others, as Llama 3 405B's 126 layers ran on 16 stages (7 + 14 x 8 + 7);
/// DeepSeek-V3's 61 take 2 + 14 x 4 + 3. Megatron-LM refuses layers that pp does not divide
/// unless both ends are given: this default is memcalc's assumption, and the estimate says so.
inline std::optional<std::pair<std::uint64_t, std::uint64_t>> stage_split(std::uint64_t layers,
                                                                          std::uint64_t pp,
                                                                          std::uint64_t first,
                                                                          std::uint64_t last) {
    if (pp == 1) return std::make_pair(std::uint64_t{0}, std::uint64_t{0});
    if (first != 0 || last != 0) {
        Parallelism p;
        p.pp = pp, p.first_stage_layers = first, p.last_stage_layers = last;
        try {
            validate_uneven_stages(p, layers);
        } catch (const error&) {
            return std::nullopt;
        }
        return std::make_pair(first, last);
    }
    if (layers % pp == 0) return std::make_pair(std::uint64_t{0}, std::uint64_t{0});
    const std::uint64_t middle = (layers + pp - 1) / pp;  // the other stages' share, rounded up
    if (pp < 3 || (pp - 2) * middle >= layers) return std::nullopt;
    const std::uint64_t ends = layers - (pp - 2) * middle;
    // An odd remainder gives the last stage the extra layer: under 1F1B the first holds pp
    // micro-batches.
    const std::uint64_t first_share = ends / 2, last_share = ends - first_share;
    if (first_share == 0 || last_share > middle) return std::nullopt;  // 0 would mean an even share
    return std::make_pair(first_share, last_share);
}

/// The layout an estimate runs: `p` itself, unless its pieces (split_pieces; interleaved, pp x vpp
/// chunks) do not divide the layers and neither end is given its own count; then stage_split's
/// ends where they make a valid layout (true: the split is assumed, and a report says so).
inline bool assume_stage_split(Parallelism& p, std::uint64_t layers) {
    if (p.pp < 2 || p.uneven_stages() || p.pp > layers || p.vpp > layers) return false;
    const std::uint64_t pieces = split_pieces(p);
    const bool interleaved = chunks_per_rank(p) > 1 && !schedule_row(p).mirrored;
    if (pieces > layers || layers % (interleaved ? pieces * p.vpp : pieces) == 0) return false;
    const auto split = stage_split(layers, pieces, 0, 0);
    if (!split || split->first == 0) return false;
    Parallelism q = p;
    std::tie(q.first_stage_layers, q.last_stage_layers) = *split;
    try {
        validate_uneven_stages(q, layers);
    } catch (const error&) {
        return false;
    }
    p = q;
    return true;
}

/// Megatron-LM's rule (parallel_state.initialize_model_parallel): etp x ep x pp divides the world
/// dp x tp x pp x cp; and each expert's hidden width splits over etp.
inline void validate_expert_tp(const Parallelism& p, const Architecture& m) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    if (!m.any_moe()) throw error("etp (" + n(p.etp) + ") needs a mixture-of-experts model");
    if (p.etp > p.tp * p.cp * p.dp || (p.tp * p.cp * p.dp) % (p.etp * p.ep) != 0)
        throw error("etp x ep (" + n(p.etp) + " x " + n(p.ep) + ") must divide tp x cp x dp (" +
                    n(p.tp) + " x " + n(p.cp) + " x " + n(p.dp) + ")");
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        const Architecture v = m.layer_kinds.empty() ? m : m.kind_view(k);
        if (v.is_moe() && (m.layer_kinds.empty() || m.layers_of_kind(k) > 0) && v.ffn % p.etp != 0)
            detail::require_divides(
                "etp", p.etp,
                m.layer_kinds.empty()
                    ? "ffn"
                    : ("ffn (layer kind '" + m.layer_kinds[k].name + "')").c_str(),
                v.ffn);
    }
}

// validate's pieces, in its order: the first degree that fails names the error.

/// Each degree on its own, and the devices they make together.
inline void validate_degrees(const Parallelism& p) {
    for (auto [name, v] : {std::pair{"dp", p.dp},
                           {"tp", p.tp},
                           {"pp", p.pp},
                           {"cp", p.cp},
                           {"ep", p.ep},
                           {"vpp", p.vpp}})
        detail::require_positive(name, v);
    std::uint64_t devices = 1;
    for (std::uint64_t degree : {p.dp, p.tp, p.pp, p.cp})
        devices = degree > max_devices || devices * degree > max_devices ? max_devices + 1
                                                                         : devices * degree;
    if (devices > max_devices)
        throw error("dp x tp x pp x cp (" + std::to_string(p.dp) + " x " + std::to_string(p.tp) +
                    " x " + std::to_string(p.pp) + " x " + std::to_string(p.cp) + ") exceeds the " +
                    std::to_string(max_devices) + " devices memcalc models");
    if (p.zero > 3) throw error("zero must be 0, 1, 2 or 3 (got " + std::to_string(p.zero) + ")");
    if (p.shard_group != 0) {
        if (p.zero == 0) throw error("shard_group needs a ZeRO stage (zero 1, 2 or 3)");
        detail::require_divides("shard_group", p.shard_group, "dp", p.dp);
    }
}

/// Tensor- and expert-parallel degrees against the widths and experts they split, of each kind of
/// layer.
inline void validate_tensor_split(const Parallelism& p, const Architecture& m) {
    detail::require_divides("tp", p.tp, "heads", m.heads);
    detail::require_divides("tp", p.tp, "kv_heads", m.key_value_heads());
    const auto check_kind = [&](const Architecture& v,
                                const std::string& kind) {  // kind: " (layer kind 'x')"
        if (v.ffn % p.tp != 0) detail::require_divides("tp", p.tp, ("ffn" + kind).c_str(), v.ffn);
        if (v.shared_ffn % p.tp != 0)
            detail::require_divides("tp", p.tp, ("shared_ffn" + kind).c_str(), v.shared_ffn);
        if (state_space(v.mixer) && v.ssm.d_inner % p.tp != 0)
            detail::require_divides("tp", p.tp, ("mamba_inner" + kind).c_str(), v.ssm.d_inner);
        if (p.ep > 1 && v.is_moe() && v.experts % p.ep != 0)
            detail::require_divides("ep", p.ep, ("experts" + kind).c_str(), v.experts);
    };
    if (m.layer_kinds.empty()) check_kind(m, "");
    for (std::size_t k = 0; k < m.layer_kinds.size(); ++k)
        if (m.layers_of_kind(k) > 0)
            check_kind(m.kind_view(k), " (layer kind '" + m.layer_kinds[k].name + "')");
}

/// The pipeline's stages, chunks and micro-batches against the layers.
inline void validate_stages(const Parallelism& p, const Architecture& m) {
    if (p.vpp > 1 && p.pp == 1) throw error("vpp (" + std::to_string(p.vpp) + ") needs pp > 1");
    // Bounds that keep the schedule's products (pp x vpp, M x vpp, (vpp - 1) x pp) inside 64 bits.
    if (p.pp > m.layers || p.vpp > m.layers)
        throw error("pp x vpp (" + std::to_string(p.pp) + " x " + std::to_string(p.vpp) +
                    ") must divide layers (" + std::to_string(m.layers) + ")");
    if (p.microbatches > max_microbatches)
        throw error("microbatches (" + std::to_string(p.microbatches) +
                    ") exceeds the 2^40 per step memcalc models");
    validate_schedule(p, m.layers);
    if (p.uneven_stages()) {
        validate_uneven_stages(p, m.layers);
    } else if (chunks_per_rank(p) == 1 && m.layers % p.pp != 0) {
        throw error(
            "pp (" + std::to_string(p.pp) + ") must divide layers (" + std::to_string(m.layers) +
            "), or give the first and last stages their own layer counts (first_stage_layers, "
            "last_stage_layers)");
    } else if (p.vpp > 1) {
        detail::require_divides("pp x vpp", p.pp * p.vpp, "layers", m.layers);
    }
}

/// ZeRO-3's prefetch and what goes to the host.
inline void validate_offload(const Parallelism& p) {
    if (p.gathered_layers == 0) throw error("gathered_layers must be a positive integer (got 0)");
    if (p.offload == Offload::parameters && p.zero != 3)
        throw error("offloading parameters needs ZeRO stage 3 (got zero " + std::to_string(p.zero) +
                    ")");
    if (p.offload == Offload::optimizer && p.zero == 0)
        throw error(
            "offloading the optimizer needs a ZeRO stage (ZeRO-Offload shards what it moves to the "
            "host; got zero 0)");
}

/// Throws memcalc::error naming the degree that does not fit the model or the sequence.
inline void validate(const Parallelism& p, const Architecture& m, std::uint64_t seq) {
    validate_degrees(p);
    validate_tensor_split(p, m);
    validate_stages(p, m);
    const std::uint64_t sequence_split = p.cp * (p.sequence_parallel ? p.tp : 1);
    detail::require_divides(p.sequence_parallel ? "cp x tp (sequence parallel)" : "cp",
                            sequence_split, "seq", seq);
    if (p.ep > 1) {
        if (!m.any_moe())
            throw error("ep (" + std::to_string(p.ep) + ") needs a mixture-of-experts model");
        // Experts split as the rest (etp = tp): within the data-parallel group. With an expert
        // tensor-parallel degree of its own, Megatron-LM's expert group spans tp x cp x dp / etp.
        if (p.etp == 0) detail::require_divides("ep", p.ep, "dp", p.dp);
    }
    if (p.etp != 0) validate_expert_tp(p, m);
    validate_offload(p);
}

/// The most layers one model chunk of a stage runs (a stage's, without interleaving): the most
/// recompute_layers may name. The first, the second and the last stage hold every length there is.
/// Validated layouts only.
inline std::uint64_t largest_chunk(const Parallelism& p, std::uint64_t layers) {
    std::uint64_t most = rank_layers(p, layers, 0).largest_chunk();
    if (p.pp > 1)
        most = std::max({most, rank_layers(p, layers, 1).largest_chunk(),
                         rank_layers(p, layers, p.pp - 1).largest_chunk()});
    return most;
}

/// Throws naming recompute_layers where the layout or the recomputation cannot take it.
inline void validate_recompute_layers(const Parallelism& p, std::uint64_t layers, Recompute mode) {
    if (!p.recompute_layers) return;
    const std::uint64_t n = *p.recompute_layers, most = largest_chunk(p, layers);
    if (mode != Recompute::full)
        throw error("recompute_layers (" + std::to_string(n) + ") needs recompute full (got " +
                    recompute_name(mode) + ")");
    if (n > most)
        throw error("recompute_layers (" + std::to_string(n) + ") exceeds the " +
                    std::to_string(most) + " layers of " +
                    (chunks_per_rank(p) > 1 ? "a model chunk"
                     : p.pp > 1             ? "the largest pipeline stage"
                                            : "the model"));
}

/// The global indices (1..L) of the layers pipeline stage `stage` holds, in forward order.
inline std::vector<std::uint64_t> stage_layers(const Parallelism& p, std::uint64_t layers,
                                               std::uint64_t stage) {
    const StageLayers s = rank_layers(p, layers, stage);
    std::vector<std::uint64_t> ids(s.layers);
    for (std::uint64_t i = 0; i < s.layers; ++i) ids[i] = s.layer_id(i);
    return ids;
}

/// ZeRO (Rajbhandari et al. 2020, section 5 and Figure 1): stage 1 shards the master copy and the
/// optimiser state over `shards` ranks, stage 2 also the gradients, stage 3 also the weights. Flat
/// buffers are padded to a multiple of the shard count. The optimiser state only where it is whole
/// bytes per parameter (else 0: stage_facts counts it tensor by tensor).
inline TrainingState sharded_state(Count parameters, const Recipe& r, unsigned zero,
                                   std::uint64_t shards) {
    const auto part = [&](unsigned from_stage) {
        return zero >= from_stage ? ceil_div(parameters, shards) : parameters;
    };
    return {part(3) * r.weight_bytes(), part(2) * r.gradient_bytes(), part(1) * r.master_bytes(),
            part(1) * r.optimizer_bytes().value_or(0)};
}

/// One rank's share of a saved tensor: tensor parallelism splits heads, MLP columns and the
/// vocabulary; sequence parallelism also the residual stream; context parallelism every token.
inline Count rank_share(Count n, ActivationSplit split, const Parallelism& p, std::uint64_t vocab) {
    if (n.value() == 0)
        return n;  // most sums of a split kind are empty: skip the divisions (plan's hot path)
    switch (split) {
        case ActivationSplit::tensor: n = ceil_div(n, p.tp); break;
        case ActivationSplit::expert_tensor: n = ceil_div(n, p.expert_tp()); break;
        case ActivationSplit::sequence:
            if (p.sequence_parallel) n = ceil_div(n, p.tp);
            break;
        case ActivationSplit::vocab: n = Count(n.value() / vocab) * ceil_div(vocab, p.tp); break;
        case ActivationSplit::replicated: break;
    }
    return ceil_div(n, p.cp);
}

inline void split_rows(std::vector<SavedTensor>& rows, const Parallelism& p, std::uint64_t vocab) {
    for (auto& r : rows) {
        r.elements = rank_share(r.elements, r.split, p, vocab);
        r.bytes = r.elements * r.bytes_per_element;
    }
}

/// Rows of bytes and a split (workspaces, the tensors alive beside an op, an op's eager traffic):
/// each divides as the sums the timeline reads do.
template <class Row>
void split_rows(std::vector<Row>& rows, const Parallelism& p, std::uint64_t vocab) {
    for (Row& r : rows) r.bytes = rank_share(r.bytes, r.split, p, vocab);
}

inline void split_rows(std::vector<PolicyOutput>& outputs, const Parallelism& p,
                       std::uint64_t vocab) {
    for (auto& o : outputs) {
        o.tensor.elements = rank_share(o.tensor.elements, o.tensor.split, p, vocab);
        o.tensor.bytes = o.tensor.elements * o.tensor.bytes_per_element;
    }
}

/// The residual stream on one rank (a layer's input, the gradient flowing between layers).
inline Count rank_stream(Count bytes, const Parallelism& p) {
    return rank_share(bytes, ActivationSplit::sequence, p, 1);
}

}  // namespace memcalc
