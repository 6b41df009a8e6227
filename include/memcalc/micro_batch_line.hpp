#pragma once
/// A sweep's summaries along the micro-batch, read off lines. Where nothing rounds with the
/// micro-batch (no degree divides its tokens, no loss chunk, no busier expert, no images), every
/// tensor's bytes are affine in it, and each step's total is the largest of a few affine sums
/// (the moment of the step, the op whose temporaries are largest): a convex figure, affine between
/// the kinks where the largest changes, and its categories those of the largest, affine there too.
/// Summaries made whole at every `probe_spacing`-th micro-batch (probes) draw the lines: a
/// segment runs across probes as long as each lies on the line through the segment's ends, every
/// category of every step the peak is chosen from (each_peak_candidate) and the activations'
/// totals; a convex figure that meets its chord inside an interval is the chord on all of it, so a
/// segment has no kink. A micro-batch no segment covers (around a kink) is made whole. A row off a
/// line is a dozen multiply-adds and the peak's earliest largest. Tests compare rows off lines with
/// the whole summaries on every preset and on generated shapes.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <optional>
#include <vector>

#include "memcalc/estimate.hpp"
#include "memcalc/timeline.hpp"

namespace memcalc {

/// Whether nothing in `s` rounds with the micro-batch under `modes`: every degree that divides a
/// micro-batch's tokens or their experts 1, the loss over the whole logits, each expert its share,
/// no images, every layer recomputed alike and not by the per-op policy (whose FLOPs count saved
/// outputs).
inline bool micro_batch_affine(const Architecture& m, const Settings& s,
                               const std::vector<Recompute>& modes) {
    const Parallelism& p = s.parallel;
    const bool whole = p.tp == 1 && p.cp == 1 && p.ep == 1 && p.etp <= 1;
    const LossKernel loss = s.framework.loss;
    const bool unchunked = !chunked_loss(loss) && loss != LossKernel::fused_linear;
    const bool alike =
        !p.recompute_layers && std::find(modes.begin(), modes.end(), Recompute::op) == modes.end();
    return whole && unchunked && alike && m.expert_imbalance == 1.0 && !s.images.any();
}

namespace detail {

/// A figure affine in the micro-batch: its value at the line's first micro-batch and its change
/// per sequence, modulo 2^64 (it may fall). Exact wherever the true value fits, as it does
/// between two probes that fit.
struct AffineCount {
    std::uint64_t at = 0, per = 0;
    std::uint64_t operator()(std::uint64_t k) const { return at + per * k; }

    /// Through (0, a) and (k, b), k > 0; none where the change per sequence is not whole.
    static std::optional<AffineCount> through(Count a, Count b, std::uint64_t k) {
        const bool rises = b.value() >= a.value();
        const std::uint64_t change = rises ? b.value() - a.value() : a.value() - b.value();
        if (change % k != 0) return std::nullopt;
        return AffineCount{a.value(), rises ? change / k : 0 - change / k};
    }
};

/// A candidate step of the peak along the line.
struct CandidateLine {
    std::uint64_t stage = 0;
    Step step;  ///< at the line's first micro-batch: its phase, layer and micro-batch
    std::array<AffineCount, breakdown_categories.size()> bytes;  ///< in breakdown_categories' order
    AffineCount total;
};

inline bool same_place(const LayoutPeak& a, const LayoutPeak& b) {
    return a.stage == b.stage && a.step.phase == b.step.phase && a.step.layer == b.step.layer &&
           a.step.microbatch == b.step.microbatch;
}

}  // namespace detail

/// Summaries of one configuration at each of a sweep's micro-batches, under each of its modes.
class MicroBatchLines {
public:
    /// Probes every this many distinct micro-batches apart, and the last.
    static constexpr std::size_t probe_spacing = 16;

    /// Lines through `e`'s summaries under `s` (its micro-batch aside) and each of `modes`, probed
    /// among `batches`; none where the settings round with the micro-batch, there are too few to
    /// share the probes' cost, or a probe's summary fails (made whole, each row's error is its
    /// own, in its turn).
    MicroBatchLines(const Estimator& e, const Settings& s, const std::vector<Recompute>& modes,
                    const std::vector<std::uint64_t>& batches)
        : estimator_(e), modes_(modes) {
        std::vector<std::uint64_t> sorted = batches;
        std::sort(sorted.begin(), sorted.end());
        sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
        if (sorted.size() < 2 * probe_spacing || !micro_batch_affine(e.model(), s, modes)) return;
        std::vector<std::uint64_t> probes;
        for (std::size_t i = 0; i < sorted.size(); i += probe_spacing) probes.push_back(sorted[i]);
        if (probes.back() != sorted.back()) probes.push_back(sorted.back());
        try {
            draw(s, probes);
        } catch (const error&) {
            segments_.clear();
        }
    }

    /// Whether micro-batch `b` lies on a segment: at() gives its summaries.
    bool covers(std::uint64_t b) const { return segment_of(b) < segments_.size(); }
    /// Whether any micro-batch does.
    bool drawn() const { return !segments_.empty(); }

    /// The summary under modes[mode] at micro-batch `b`, written over the last one asked of that
    /// mode on its segment (covers(b) only).
    Summary& at(std::uint64_t b, std::size_t mode) {
        Segment& segment = segments_[segment_of(b)];
        Line& line = segment.lines[mode];
        Summary& r = line.summary;
        const std::uint64_t k = b - segment.first;
        std::size_t best = 0;
        std::uint64_t most = line.candidates[0].total(k);
        for (std::size_t i = 1; i < line.candidates.size(); ++i) {
            const std::uint64_t total = line.candidates[i].total(k);
            if (total > most) best = i, most = total;
        }
        const detail::CandidateLine& peak = line.candidates[best];
        r.peak = peak.step;
        for (std::size_t c = 0; c < breakdown_categories.size(); ++c)
            r.peak.bytes.*breakdown_categories[c] = Count(peak.bytes[c](k));
        r.peak_stage = peak.stage;
        r.activations = Count(line.activations(k));
        r.kept_activations = Count(line.kept(k));
        r.settings.micro_batch = b;
        const Settings& with = r.settings;
        r.compute = compute_cost(estimator_.model(), with.seq, b, with.recompute,
                                 with.recompute_modules, nullptr, nullptr);
        return r;
    }

private:
    struct Line {
        Summary summary;  ///< at the segment's first micro-batch; rewritten by at()
        std::vector<detail::CandidateLine> candidates;
        detail::AffineCount activations, kept;
    };
    struct Segment {
        std::uint64_t first = 0, last = 0;
        std::vector<Line> lines;  ///< by mode
    };
    /// A probe: its micro-batch, its summary under each mode and the steps each peak was chosen
    /// from.
    struct Probe {
        std::uint64_t micro_batch = 0;
        std::vector<Summary> rows;
        std::vector<std::vector<LayoutPeak>> steps;
    };

    /// The index of the segment holding `b`; segments_.size() where none does.
    std::size_t segment_of(std::uint64_t b) const {
        const auto after =
            std::upper_bound(segments_.begin(), segments_.end(), b,
                             [](std::uint64_t x, const Segment& s) { return x < s.first; });
        if (after == segments_.begin() || std::prev(after)->last < b) return segments_.size();
        return static_cast<std::size_t>(std::prev(after) - segments_.begin());
    }

    /// Whole summaries at each probe; segments greedily from the first: through a probe and the
    /// one after next, the one between on the line, then on while the next lies on it too.
    void draw(Settings s, const std::vector<std::uint64_t>& probes) {
        std::vector<Probe> at(probes.size());
        for (std::size_t i = 0; i < probes.size(); ++i) {
            s.micro_batch = at[i].micro_batch = probes[i];
            at[i].rows = estimator_.summaries(s, modes_, &at[i].steps);
        }
        for (std::size_t i = 0; i + 2 < at.size();) {
            Segment segment{at[i].micro_batch, at[i + 2].micro_batch, {}};
            if (!fit(segment, at[i], at[i + 2]) || !on_lines(segment, at[i + 1])) {
                ++i;  // a kink between probe i and i + 2: the micro-batches from i made whole
                continue;
            }
            std::size_t j = i + 2;
            for (; j + 1 < at.size() && on_lines(segment, at[j + 1]); ++j)
                segment.last = at[j + 1].micro_batch;
            segments_.push_back(std::move(segment));
            i = j;
        }
    }

    /// The segment's lines, by mode, through probes `a` and `b`.
    bool fit(Segment& segment, const Probe& a, const Probe& b) const {
        for (std::size_t m = 0; m < modes_.size(); ++m) {
            Line line{a.rows[m], {}, {}, {}};
            if (!fit(line, a.rows[m], b.rows[m], a.steps[m], b.steps[m],
                     b.micro_batch - a.micro_batch))
                return false;
            segment.lines.push_back(std::move(line));
        }
        return true;
    }

    /// Whether probe `p` lies on every line of `segment`.
    bool on_lines(const Segment& segment, const Probe& p) const {
        for (std::size_t m = 0; m < modes_.size(); ++m)
            if (!on_line(segment.lines[m], p.rows[m], p.steps[m], p.micro_batch - segment.first))
                return false;
        return true;
    }

    /// `line`'s figures through the first probe's (`a`) and the last's (`b`), `span` apart.
    static bool fit(Line& line, const Summary& a, const Summary& b,
                    const std::vector<LayoutPeak>& from, const std::vector<LayoutPeak>& to,
                    std::uint64_t span) {
        const auto activations = detail::AffineCount::through(a.activations, b.activations, span);
        const auto kept =
            detail::AffineCount::through(a.kept_activations, b.kept_activations, span);
        if (!activations || !kept || from.size() != to.size() || !same_whole(a, b)) return false;
        line.activations = *activations, line.kept = *kept;
        for (std::size_t i = 0; i < from.size(); ++i) {
            if (!detail::same_place(from[i], to[i])) return false;
            detail::CandidateLine c{from[i].stage, from[i].step, {}, {}};
            for (std::size_t k = 0; k < breakdown_categories.size(); ++k) {
                const auto category =
                    detail::AffineCount::through(from[i].step.bytes.*breakdown_categories[k],
                                                 to[i].step.bytes.*breakdown_categories[k], span);
                if (!category) return false;
                c.bytes[k] = *category;
                c.total.at += category->at, c.total.per += category->per;
            }
            line.candidates.push_back(c);
        }
        return true;
    }

    /// Whether a probe `k` past the first lies on `line`: its candidates the same steps, each
    /// category and the activations' totals on their lines.
    static bool on_line(const Line& line, const Summary& r, const std::vector<LayoutPeak>& steps,
                        std::uint64_t k) {
        if (steps.size() != line.candidates.size() || !same_whole(line.summary, r) ||
            line.activations(k) != r.activations.value() ||
            line.kept(k) != r.kept_activations.value())
            return false;
        for (std::size_t i = 0; i < steps.size(); ++i) {
            const detail::CandidateLine& c = line.candidates[i];
            if (!detail::same_place({c.stage, c.step}, steps[i])) return false;
            for (std::size_t j = 0; j < breakdown_categories.size(); ++j)
                if (c.bytes[j](k) != (steps[i].step.bytes.*breakdown_categories[j]).value())
                    return false;
        }
        return true;
    }

    /// What does not change with the micro-batch, unchanged.
    static bool same_whole(const Summary& a, const Summary& b) {
        return a.parameters == b.parameters && a.state.total() == b.state.total();
    }

    const Estimator& estimator_;
    std::vector<Recompute> modes_;
    std::vector<Segment> segments_;  ///< in order of their micro-batches, apart
};

}  // namespace memcalc
