#pragma once
/// A layout's most loaded device and its peak step (layout_peak), and the most host memory one
/// fills (layout_host), weighing only the stages that can hold the most and building no timeline.
/// Apart as what fit and plan call per layout, above a stage's facts and inputs.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "memcalc/layers.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/stage_facts.hpp"
#include "memcalc/stage_inputs.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/units.hpp"
#include "memcalc/workload.hpp"

namespace memcalc {

/// The most loaded device of a layout and its peak step, without building any timeline. With even
/// stages the first holds at least what every middle one holds (the embedding, the most
/// micro-batches in flight), so only the first and the last can be the most loaded; with uneven
/// ones, the second too.
struct LayoutPeak {
    std::uint64_t stage = 0;
    Step step;
    Count bytes() const { return step.bytes.total(); }
};

/// Whether a stage after the first holds for each micro-batch what the first does not: a received
/// input its first layer does not keep, its own shared tables (stage_inputs).
inline bool later_stages_hold_more(const Workload& w) {
    if (w.stage_side.any()) return true;
    for (std::size_t k = 0; k < w.layers.size(); ++k)
        if (!w.layers[k].keeps_input ||
            (k < w.not_recomputed.size() && !w.not_recomputed[k].keeps_input))
            return true;
    return false;
}

/// What every step of a stage holds whatever it runs: its weights, master copy and optimiser
/// state (step_at). A floor under layout_peak, which weighs the first stage's steps among others.
inline Count persistent_state(const StageFacts& f) {
    return f.state.weights + f.state.master_weights + f.state.optimizer_state;
}

/// The stages besides the first that may be the most loaded, each handed to `consider` in order.
template <class Consider>
void other_candidate_stages(const Workload& w, const Parallelism& p, Consider consider) {
    if (!w.parameters->pattern
             .uniform()) {  // stages of different kinds of layer: any may hold the most
        for (std::uint64_t stage = 1; stage < p.pp; ++stage) consider(stage);
        return;
    }
    // The second holds the most of the middle ones (the most in flight), more than the first where
    // that is smaller or holds less per micro-batch.
    if (p.pp > 2 && (p.uneven_stages() || later_stages_hold_more(w))) consider(1);
    if (p.pp > 1) consider(p.pp - 1);
}

/// The most host memory a device of the layout fills (offload), each stage's facts from
/// `facts(stage)`: the stages layout_peak weighs hold the most there too (the most micro-batches in
/// flight, the embedding, the head, the most layers).
template <class Facts>
Count layout_host(const Workload& w, const Parallelism& p, Facts&& facts) {
    Count most = facts(0).host;
    other_candidate_stages(w, p,
                           [&](std::uint64_t stage) { most = std::max(most, facts(stage).host); });
    return most;
}

/// layout_peak with the first stage's facts already made (plan makes them for its traffic too)
/// and the others' from `facts(stage)`.
template <class Facts>
LayoutPeak layout_peak(const Workload& w, const Parallelism& p, const StageFacts& first,
                       Facts&& facts) {
    LayoutPeak best{0, peak_step(stage_inputs(w, p, first))};
    other_candidate_stages(w, p, [&](std::uint64_t stage) {
        const Step s = peak_step(stage_inputs(w, p, facts(stage)));
        if (s.bytes.total() > best.bytes()) best = {stage, s};
    });
    return best;
}

inline LayoutPeak layout_peak(const Workload& w, const Parallelism& p, const StageFacts& first) {
    return layout_peak(w, p, first, [&](std::uint64_t stage) { return stage_facts(w, p, stage); });
}

inline LayoutPeak layout_peak(const Workload& w, const Parallelism& p) {
    return layout_peak(w, p, stage_facts(w, p, 0));
}

/// Every step layout_peak weighs, with its stage, in the order it weighs them: their
/// earliest_largest is its peak (a later stage's replaces an earlier's only when larger).
inline std::vector<LayoutPeak> layout_peak_candidates(const Workload& w, const Parallelism& p) {
    std::vector<LayoutPeak> out;
    const auto add = [&](std::uint64_t stage) {
        each_peak_candidate(stage_inputs(w, p, stage_facts(w, p, stage)), [&](const Step& s) {
            out.push_back({stage, s});
        });
    };
    add(0);
    other_candidate_stages(w, p, add);
    return out;
}

/// The first of `candidates` (layout_peak_candidates) that none after it exceeds: layout_peak's.
inline LayoutPeak earliest_largest(const std::vector<LayoutPeak>& candidates) {
    LayoutPeak best = candidates.front();
    for (const LayoutPeak& c : candidates)
        if (c.bytes() > best.bytes()) best = c;
    return best;
}

}  // namespace memcalc
