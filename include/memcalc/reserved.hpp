#pragma once
/// What PyTorch's caching allocator reserves for a rank's training step: its timeline as
/// allocations and frees (allocation_sequence.hpp) run through the allocator's simulator
/// (allocator.hpp), for the first step and the one after it.
#include <cstdint>
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
    Step at{Phase::forward, 0, {}, 1};  ///< the step that first reached `bytes`
    std::uint64_t iteration = 1;        ///< 1: the first training step, 2: the one after it
    std::size_t segments = 0;           ///< the allocator's segments then
    bool out_of_memory = false;         ///< the simulated allocator found no room under capacity
};

namespace detail {

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
        for (std::uint64_t i = 0; i < copies; ++i) out.push_back(row.count.value());
    }
    return out;
}

/// One layer's kept tensors under `mode`: its rows (each copy a tensor), or the layer's input
/// where a checkpoint keeps nothing else.
inline PieceShape saved_pieces(const LayerActivations& layer, Recompute mode) {
    PieceShape out;
    for (const SavedTensor& r : layer.rows) {
        if (!r.kept(mode) || r.copies == 0) continue;
        for (std::uint64_t i = 0; i < r.copies; ++i) out.push_back(r.bytes.value() / r.copies);
    }
    if (out.empty()) out.push_back(layer.input_bytes.value());
    return out;
}

}  // namespace detail

/// The tensor sizes `rank`'s categories are cut into.
inline StepPieces step_pieces(const Report& r, const RankReport& rank) {
    return {detail::parameter_pieces(r.parameters, rank, false),
            detail::parameter_pieces(r.parameters, rank, true),
            detail::saved_pieces(r.layer, r.settings.recompute)};
}

namespace detail {

/// `events` after `before` (allocations made ahead of the step: the libraries' workspaces).
inline std::vector<AllocatorEvent> after(const std::vector<AllocatorEvent>& before,
                                         const std::vector<AllocatorEvent>& events) {
    std::vector<AllocatorEvent> out(before);
    out.insert(out.end(), events.begin(), events.end());
    return out;
}

}  // namespace detail

/// `rank`'s reserved peak under `config` (its timeline must have been built), with `before`
/// allocated ahead of the first step (`before_high`: the same at the band's high end).
inline ReservedPeak reserved_peak(const Report& r, const RankReport& rank,
                                  const AllocatorConfig& config,
                                  const std::vector<AllocatorEvent>& before = {},
                                  const std::vector<AllocatorEvent>& before_high = {}) {
    if (rank.timeline.empty()) throw error("internal: reserved_peak needs the rank's timeline");
    const StepPieces pieces = step_pieces(r, rank);
    const std::uint64_t microbatches = r.settings.parallel.steps_per_batch();
    const AllocationSequence seq =
        allocation_sequence(rank.timeline, pieces, microbatches, StepOrder::frees_first);
    const std::vector<AllocatorEvent> events = detail::after(before, seq.events);
    const AllocatorResult result = simulate_allocator(events, config);
    ReservedPeak out;
    out.bytes = result.stats.peak_reserved_bytes;
    out.allocated_bytes = result.stats.peak_allocated_bytes;
    out.out_of_memory = result.out_of_memory;
    out.segments = result.segments_at_peak_reserved.size();
    const std::size_t half = seq.steps.size() / 2;
    if (!seq.events.empty()) {
        const std::size_t event = result.peak_reserved_event;
        const std::size_t step =
            event < before.size() ? 0 : seq.step_of_event[event - before.size()];
        out.at = seq.steps[step];
        out.iteration = step < half ? 1 : 2;
    }
    // The first step's reserved: the same events up to the second step's first.
    std::size_t first_end = 0;
    while (first_end < seq.events.size() && seq.step_of_event[first_end] < half) ++first_end;
    const std::vector<AllocatorEvent> first(seq.events.begin(), seq.events.begin() + first_end);
    out.first_step_bytes =
        simulate_allocator(detail::after(before, first), config).stats.peak_reserved_bytes;
    const AllocationSequence high =
        allocation_sequence(rank.timeline, pieces, microbatches, StepOrder::allocations_first);
    const std::uint64_t high_reserved =
        simulate_allocator(detail::after(before_high.empty() ? before : before_high, high.events),
                           config)
            .stats.peak_reserved_bytes;
    out.high_bytes = std::max(out.bytes.value(), high_reserved);
    return out;
}

}  // namespace memcalc
