#pragma once
/// What PyTorch's caching allocator reserves for a rank's training step: its timeline as
/// allocations and frees (allocation_sequence.hpp) run through the allocator's simulator
/// (allocator.hpp), for the first step and the one after it.
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

#include "memcalc/allocation_sequence.hpp"
#include "memcalc/allocator.hpp"
#include "memcalc/estimate.hpp"

namespace memcalc {

/// The allocator's figures for one rank.
struct ReservedPeak {
    Count bytes;             ///< max_memory_reserved after two steps, in the timeline's order
    Count first_step_bytes;  ///< the same after the first step
    Count high_bytes;        ///< the band's high end: each step's tensors made before the last's go
    Count allocated_bytes;   ///< max_memory_allocated: the timeline's peak, each tensor rounded
    /// Once the weights are loaded, before the first step: what torch.cuda.memory_allocated() and
    /// memory_reserved() say then (each weight its own tensor, rounded and packed into segments).
    Count loaded_allocated_bytes, loaded_bytes;
    Step at{Phase::forward, 0, {}, 1};  ///< the step that first reached `bytes`
    std::uint64_t iteration = 1;        ///< 1: the first training step, 2: the one after it
    std::size_t segments = 0;           ///< the allocator's segments then
    bool out_of_memory = false;         ///< the simulated allocator found no room under capacity
    /// Whether the allocator ran: not past most_simulated_steps or a peak of 2^56 bytes, where
    /// every figure is the peak.
    bool simulated = true;
};

/// The most tensors one category's shape is cut into, and the most steps simulated: past them a
/// model is far beyond any real one (a fuzzer's), and the allocator's figure is not simulated.
inline constexpr std::size_t most_pieces = 4096;
inline constexpr std::size_t most_simulated_steps = 8192;

namespace detail {

/// `copies` tensors of `size`, as at most `most` pieces of the same total (a shape is relative).
inline void add_pieces(PieceShape& out, std::uint64_t size, std::uint64_t copies,
                       std::size_t most) {
    const std::uint64_t n = std::min<std::uint64_t>(copies, most);
    if (n == 0) return;
    const double each = double(size) * double(copies) / double(n);
    const std::uint64_t piece = each >= 1.8e19 ? std::uint64_t(1) << 63 : std::uint64_t(each);
    out.insert(out.end(), n, piece);
}

/// `shape` with neighbours merged until it has at most `most` pieces.
inline PieceShape bounded(PieceShape shape, std::size_t most) {
    if (shape.size() <= most) return shape;
    const std::size_t group = (shape.size() + most - 1) / most;
    PieceShape out;
    for (std::size_t i = 0; i < shape.size(); i += group) {
        double sum = 0;
        for (std::size_t j = i; j < std::min(shape.size(), i + group); ++j) sum += double(shape[j]);
        out.push_back(sum >= 1.8e19 ? std::uint64_t(1) << 63 : std::uint64_t(sum));
    }
    return out;
}

/// Every parameter tensor of `rank`: the stage's layers' rows (in proportion to its share of each
/// kind), the embedding's and the head's where it holds them.
inline PieceShape parameter_pieces(const ParameterTable& t, const RankReport& rank,
                                   bool layers_only) {
    PieceShape out;
    const std::uint64_t stage_layers = rank.layer_ids.size();
    for (const ParamRow& row : t.rows) {
        if (!row.trainable && layers_only) continue;
        std::uint64_t copies = 1;
        if (row.group == Group::layer) {
            copies = layers_only
                         ? 1
                         : std::max<std::uint64_t>(1, t.kind_layers[row.kind] * stage_layers /
                                                          std::max<std::uint64_t>(t.layers, 1));
        } else if (layers_only || (row.group == Group::input && !rank.holds_embedding) ||
                   (row.group == Group::head && !rank.holds_head)) {
            continue;
        }
        add_pieces(out, row.count.value(), copies, most_pieces);
    }
    return bounded(std::move(out), most_pieces);
}

/// One layer's kept tensors under `mode`: its rows (each copy a tensor), or the layer's input
/// where a checkpoint keeps nothing else.
inline PieceShape saved_pieces(const LayerActivations& layer, Recompute mode) {
    PieceShape out;
    for (const SavedTensor& r : layer.rows) {
        if (!r.kept(mode) || r.copies == 0) continue;
        add_pieces(out, r.bytes.value() / r.copies, r.copies, most_pieces);
    }
    if (out.empty()) out.push_back(layer.input_bytes.value());
    return bounded(std::move(out), most_pieces);
}

}  // namespace detail

/// The tensor sizes `rank`'s categories are cut into.
inline StepPieces step_pieces(const Report& r, const RankReport& rank) {
    return {detail::parameter_pieces(*r.parameters, rank, false),
            detail::parameter_pieces(*r.parameters, rank, true),
            detail::saved_pieces(r.layer, r.settings.recompute)};
}

/// The allocator's counters once `rank`'s weights are loaded (ReservedPeak::loaded_bytes).
inline std::pair<Count, Count> loaded(const StepPieces& pieces, const RankReport& rank,
                                      const AllocatorConfig& config) {
    Breakdown weights;
    weights.weights = rank.timeline().front().bytes.weights;
    const AllocationSequence seq =
        allocation_sequence({Step{Phase::forward, 0, weights, 1}}, pieces, 1);
    const AllocatorStats stats = simulate_allocator(seq.events, config).stats;
    return {stats.allocated_bytes, stats.reserved_bytes};
}

namespace detail {

/// One pass of the allocator over `before` and then `seq`: its counters, the step of its reserved
/// peak (before's count as the first), the segments then, and the peak at the first training
/// step's end (seq's first half of steps).
struct Replay {
    AllocatorStats stats;
    std::size_t peak_step = 0;
    std::size_t segments_at_peak = 0;
    std::uint64_t first_step_reserved = 0;
    bool out_of_memory = false;
};

/// The events of `steps` in `order` go straight to the simulator as they are made, none kept.
inline Replay replay(const std::vector<AllocatorEvent>& before, const std::vector<Step>& steps,
                     const StepPieces& pieces, StepOrder order, const AllocatorConfig& config) {
    Replay out;
    CachingAllocatorSimulator sim(config);
    const std::size_t half = steps.size() / 2;
    std::uint64_t peak = 0;
    const auto apply = [&](const AllocatorEvent& e, std::size_t step) {
        if (out.out_of_memory) return;  // the device is full: nothing after it is replayed
        if (step >= half && out.first_step_reserved == 0)
            out.first_step_reserved = sim.stats().peak_reserved_bytes;
        if (e.kind == AllocatorEventKind::free)
            sim.free(e.id);
        else
            out.out_of_memory = !sim.alloc(e.id, e.bytes, e.stream);
        if (sim.stats().reserved_bytes > peak) {
            peak = sim.stats().reserved_bytes;
            out.peak_step = step, out.segments_at_peak = sim.stats().segments;
        }
    };
    for (const AllocatorEvent& e : before) apply(e, 0);
    for_each_allocation_event(steps, pieces, order, apply);
    out.stats = sim.stats();
    if (out.first_step_reserved == 0) out.first_step_reserved = out.stats.peak_reserved_bytes;
    return out;
}

}  // namespace detail

/// A timeline too long to replay: every figure the allocated peak, marked unsimulated.
inline ReservedPeak unsimulated(const RankReport& rank) {
    ReservedPeak out;
    const Count peak = rank.peak_step().bytes.total();
    out.bytes = out.first_step_bytes = out.high_bytes = out.allocated_bytes = peak;
    out.loaded_allocated_bytes = out.loaded_bytes = rank.timeline().front().bytes.weights;
    out.at = rank.peak_step();
    out.simulated = false;
    return out;
}

/// `rank`'s reserved peak under `config`, with `before`
/// allocated ahead of the first step (`before_high`: the same at the band's high end).
inline ReservedPeak reserved_peak(const Report& r, const RankReport& rank,
                                  const AllocatorConfig& config,
                                  const std::vector<AllocatorEvent>& before = {},
                                  const std::vector<AllocatorEvent>& before_high = {}) {
    if (rank.timeline().empty()) throw error("internal: reserved_peak needs the rank's timeline");
    if (rank.timeline().size() > most_simulated_steps ||
        rank.peak_step().bytes.total() > Count(allocator_rules::kLargestRequest))
        return unsimulated(rank);
    const StepPieces pieces = step_pieces(r, rank);
    const std::uint64_t microbatches = r.settings.parallel.steps_per_batch();
    const std::vector<Step> steps = replayed_training_steps(rank.timeline(), microbatches,
                                                            r.settings.framework.optimizer_state);
    const detail::Replay run =
        detail::replay(before, steps, pieces, StepOrder::frees_first, config);
    ReservedPeak out;
    out.bytes = run.stats.peak_reserved_bytes;
    out.allocated_bytes = run.stats.peak_allocated_bytes;
    out.first_step_bytes = run.first_step_reserved;
    out.segments = run.segments_at_peak;
    out.out_of_memory = run.out_of_memory;
    out.at = steps[run.peak_step];
    out.iteration = run.peak_step < steps.size() / 2 ? 1 : 2;
    const Count high_reserved = detail::replay(before_high.empty() ? before : before_high, steps,
                                               pieces, StepOrder::allocations_first, config)
                                    .stats.peak_reserved_bytes;
    out.high_bytes = std::max(out.bytes, high_reserved);
    std::tie(out.loaded_allocated_bytes, out.loaded_bytes) = loaded(pieces, rank, config);
    return out;
}

}  // namespace memcalc
