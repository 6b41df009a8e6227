#pragma once
/// A device's training step as the caching allocator sees it: an ordered list of allocations and
/// frees (allocator.hpp's events), made from the timeline's steps. Each step's moment holds
/// exactly the bytes the timeline counts there; each category of them is made of tensors the
/// sizes the model's tables give (every parameter, one layer's parameters, one layer's saved
/// tensors), so the allocator rounds, splits and reuses blocks of the sizes the program has.
#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "memcalc/allocator.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/timeline.hpp"

namespace memcalc {

/// The relative sizes of the tensors one growth of a category is made of; empty: one tensor.
using PieceShape = std::vector<std::uint64_t>;

/// The shapes a rank's categories are cut into.
struct StepPieces {
    PieceShape model_parameters;  ///< every parameter tensor the rank holds
    PieceShape layer_parameters;  ///< one layer's parameter tensors
    PieceShape layer_saved;       ///< one layer's saved tensors
};

/// The streams the allocator keeps apart: a block freed on one is never reused by another's
/// requests (CUDACachingAllocator.cpp's pools key blocks by stream).
inline constexpr std::uint32_t compute_stream = 0;
/// Sharded data parallelism's all-gathers allocate their output on their own stream: FSDP1's
/// unshard stream, FSDP2's all-gather copy-in stream, DeepSpeed ZeRO-3's allgather stream.
inline constexpr std::uint32_t gather_stream = 1;

/// How one category of Breakdown comes and goes. A transient one (an op's temporaries, what a
/// backward step rebuilds or gathers) is freed whole when its step ends and made again by the
/// next; the others grow and shrink by the difference, the newest tensors freed first.
struct CategoryRule {
    Count Breakdown::*bytes;
    const PieceShape StepPieces::*shape;  ///< nullptr: one tensor per growth
    bool transient;
    std::uint32_t stream;  ///< the stream its tensors are allocated on
};

inline constexpr std::array<CategoryRule, 11> category_rules{{
    {&Breakdown::weights, &StepPieces::model_parameters, false, compute_stream},
    {&Breakdown::master_weights, &StepPieces::model_parameters, false, compute_stream},
    {&Breakdown::optimizer_state, &StepPieces::model_parameters, false, compute_stream},
    {&Breakdown::gradients, &StepPieces::layer_parameters, false, compute_stream},
    {&Breakdown::gathered_weights, &StepPieces::layer_parameters, true, gather_stream},
    {&Breakdown::kept_activations, &StepPieces::layer_saved, false, compute_stream},
    {&Breakdown::rebuilt_activations, &StepPieces::layer_saved, true, compute_stream},
    {&Breakdown::logits, nullptr, false, compute_stream},
    {&Breakdown::activation_gradient, nullptr, false, compute_stream},
    {&Breakdown::workspace, nullptr, true, compute_stream},
    {&Breakdown::weight_copies, &StepPieces::layer_parameters, false, compute_stream},
}};

/// Between two steps' moments, which comes first. The timeline fixes what is live at each moment,
/// not the order one step's tensors go and the next one's come: frees first is the order its
/// moments assume; allocations first is the high end of a band (what the allocator reserves if
/// the next step's tensors are made before the last step's are freed). Temporaries are always
/// freed first: their op has ended.
enum class StepOrder { frees_first, allocations_first };

/// The events, and the step each leads to.
struct AllocationSequence {
    std::vector<AllocatorEvent> events;
    std::vector<std::size_t> step_of_event;  ///< for each event, the index of its step in `steps`
    std::vector<Step> steps;                 ///< the steps replayed, in order
};

namespace detail {

/// `bytes` cut in the proportions of `shape` (exactly: the last piece takes what rounding left).
inline std::vector<std::uint64_t> cut(std::uint64_t bytes, const PieceShape* shape) {
    std::uint64_t whole = 0;
    if (shape)
        for (std::uint64_t w : *shape) whole += w;
    if (!shape || whole == 0 || shape->size() == 1) return {bytes};
    std::vector<std::uint64_t> out;
    out.reserve(shape->size());
    std::uint64_t given = 0;
    for (std::size_t i = 0; i + 1 < shape->size(); ++i) {
        // Sizes need not be exact (the last takes the rest): a double's share cannot overflow.
        const auto share = std::uint64_t(double(bytes) * double((*shape)[i]) / double(whole));
        const std::uint64_t part = std::min(share, bytes - given);
        out.push_back(part), given += part;
    }
    out.push_back(bytes - given);
    return out;
}

/// The live tensors of each category, newest last, and the events that change them, each handed
/// to `sink(event, step)` with the index of the step whose moment it leads to.
template <class Sink>
class SequenceWriter {
public:
    SequenceWriter(const StepPieces& pieces, Sink& sink) : pieces_(pieces), sink_(sink) {}

    /// From the live bytes now to `next`'s moment, in `order`.
    void step_to(const Breakdown& next, StepOrder order) {
        for (std::size_t c = 0; c < category_rules.size(); ++c)
            if (category_rules[c].transient) shrink(c, 0);
        const bool frees_first = order == StepOrder::frees_first;
        if (frees_first) shrink_all(next);
        for (std::size_t c = 0; c < category_rules.size(); ++c)
            grow(c, (next.*category_rules[c].bytes).value());
        if (!frees_first) shrink_all(next);
        ++step_;
    }

private:
    struct Piece {
        std::uint64_t id, bytes;
    };
    void shrink_all(const Breakdown& next) {
        for (std::size_t c = 0; c < category_rules.size(); ++c)
            shrink(c, (next.*category_rules[c].bytes).value());
    }
    /// Frees the newest tensors of category `c` until it holds `target` bytes; a tensor larger
    /// than the excess is freed and its remainder made again.
    void shrink(std::size_t c, std::uint64_t target) {
        std::vector<Piece>& live = live_[c];
        while (held_[c] > target) {
            const Piece last = live.back();
            live.pop_back();
            held_[c] -= last.bytes;
            emit(free_event(last.id));
            spare_ids_.push_back(last.id);
            if (held_[c] < target) add(c, target - held_[c]);
        }
    }
    void grow(std::size_t c, std::uint64_t target) {
        if (target <= held_[c]) return;
        const CategoryRule& rule = category_rules[c];
        for (std::uint64_t bytes :
             cut(target - held_[c], rule.shape ? &(pieces_.*rule.shape) : nullptr))
            add(c, bytes);
    }
    void add(std::size_t c, std::uint64_t bytes) {
        if (bytes == 0) return;
        std::uint64_t id = next_id_;
        if (spare_ids_.empty())
            ++next_id_;
        else
            id = spare_ids_.back(), spare_ids_.pop_back();
        live_[c].push_back({id, bytes});
        held_[c] += bytes;
        emit(alloc_event(id, bytes, category_rules[c].stream));
    }
    void emit(const AllocatorEvent& e) { sink_(e, step_); }

    const StepPieces& pieces_;
    Sink& sink_;
    std::array<std::vector<Piece>, category_rules.size()> live_;
    std::array<std::uint64_t, category_rules.size()> held_{};
    std::uint64_t next_id_ = 1;
    /// Ids of freed tensors, used again: ids stay as few as the tensors live at once, which the
    /// simulator then keeps in a vector.
    std::vector<std::uint64_t> spare_ids_;
    std::size_t step_ = 0;  ///< the step whose moment the events lead to
};

/// The steps of `iterations` training steps from `timeline`: micro-batch 2 stands for every later
/// one, so with M micro-batches it is replayed M - 1 times (at most `later_microbatches`).
inline std::vector<Step> replayed_steps(const std::vector<Step>& timeline,
                                        std::uint64_t microbatches, std::uint64_t iterations,
                                        std::uint64_t later_microbatches) {
    std::vector<Step> first, later, rest;
    for (const Step& s : timeline) {
        if (s.phase == Phase::optimizer)
            rest.push_back(s);
        else
            (s.microbatch == 1 ? first : later).push_back(s);
    }
    const std::uint64_t repeats =
        std::min(microbatches > 1 ? microbatches - 1 : 0, later.empty() ? 0 : later_microbatches);
    std::vector<Step> out;
    for (std::uint64_t i = 0; i < iterations; ++i) {
        out.insert(out.end(), first.begin(), first.end());
        for (std::uint64_t m = 0; m < repeats; ++m)
            out.insert(out.end(), later.begin(), later.end());
        out.insert(out.end(), rest.begin(), rest.end());
    }
    return out;
}

}  // namespace detail

/// The steps a rank's two training steps (the first, and the steady state after it) replay from
/// the `timeline` the estimate built. A lazy optimiser's state appears at the first optimizer step.
inline std::vector<Step> replayed_training_steps(const std::vector<Step>& timeline,
                                                 std::uint64_t microbatches,
                                                 OptimizerState state = OptimizerState::eager) {
    std::vector<Step> steps = detail::replayed_steps(timeline, microbatches, 2, 2);
    if (state == OptimizerState::lazy)
        for (Step& s : steps) {
            if (s.phase == Phase::optimizer) break;
            s.bytes.optimizer_state = Count(0);
        }
    return steps;
}

/// `steps` as allocations and frees in `order`, each handed to `sink(event, step index)` as it is
/// made: none kept (a long pipeline's two training steps make hundreds of thousands).
template <class Sink>
void for_each_allocation_event(const std::vector<Step>& steps, const StepPieces& pieces,
                               StepOrder order, Sink&& sink) {
    detail::SequenceWriter<std::remove_reference_t<Sink>> writer(pieces, sink);
    for (const Step& s : steps) writer.step_to(s.bytes, order);
}

/// Two training steps of a rank whose `timeline` the estimate built, as allocations and frees in
/// `order`, kept.
inline AllocationSequence allocation_sequence(const std::vector<Step>& timeline,
                                              const StepPieces& pieces, std::uint64_t microbatches,
                                              StepOrder order = StepOrder::frees_first) {
    AllocationSequence out;
    out.steps = replayed_training_steps(timeline, microbatches);
    for_each_allocation_event(out.steps, pieces, order,
                              [&](const AllocatorEvent& e, std::size_t step) {
                                  out.events.push_back(e);
                                  out.step_of_event.push_back(step);
                              });
    return out;
}

}  // namespace memcalc
