#pragma once
/// One sweep over a layer's tape gives every figure the closed form needs: the bytes the layer
/// keeps from its forward step to its backward step, what its backward rebuilds (by region), and
/// what each op adds to its step while it runs. The sweep is a sink: it reads the events as a
/// block writes them and keeps only sums, so the estimate builds no tape (its speed depends on it).
#include <array>
#include <cstdint>
#include <vector>

#include "memcalc/split_bytes.hpp"
#include "memcalc/tape/tape.hpp"

namespace memcalc::tape {

inline constexpr std::size_t max_regions = 2;

/// An op's moment against its step. A step counts the layer's kept bytes (and in backward the
/// rebuilt ones); while the op runs, `added` is what is live that the step does not count, and
/// `covered` what the step counts that is not live. The step grows by max(0, added - covered) on
/// a rank (layer_work.hpp's WorkspaceEffect).
struct RunEffect {
    Pass pass;
    std::uint32_t source;  ///< the run event's source (its Workspace)
    SplitBytes added, covered;
};

struct Liveness {
    SplitBytes kept;                              ///< saved by the forward pass
    std::array<SplitBytes, max_regions> rebuilt;  ///< made again in backward, by region
    std::vector<RunEffect> runs;                  ///< every run event, in tape order
};

/// The sink that sweeps: the live bytes of each Counted class, and each run's effect.
class Sweeper {
public:
    explicit Sweeper(std::size_t tensors = 0, std::size_t runs = 0) {
        tensors_.reserve(tensors);
        out_.runs.reserve(runs);
    }

    /// A sweep of declarations alone, no event to follow: the sums, no tensor's state (every
    /// estimate sweeps a table with no ops so, and allocates nothing for it).
    struct TotalsOnly {};
    static constexpr TotalsOnly totals_only{};
    explicit Sweeper(TotalsOnly) : events_(false) {}

    TensorId tensor(const Tensor& t) {
        // A run's covered bytes are the class's whole less its live part: the whole must be known.
        if (t.counted != Counted::none && !out_.runs.empty())
            throw error("internal: a kept or rebuilt tensor declared after an op ran");
        all_[of(t.counted)].add(t.split, t.bytes);
        ++count_[of(t.counted)];
        if (!events_) return TensorId(declared_++);
        tensors_.push_back({t.bytes, t.split, t.counted, false});
        return TensorId(tensors_.size() - 1);
    }

    void event(const Event& e) {
        if (!events_) throw error("internal: an event in a sweep of declarations alone");
        if (e.kind == EventKind::run) return out_.runs.push_back(effect_at(e));
        State& t = tensors_[e.tensor];
        const bool on = e.kind != EventKind::free;
        if (t.live == on) return;
        t.live = on;
        if (on)
            live_[of(t.counted)].add(t.split, t.bytes);
        else
            live_[of(t.counted)].remove(t.split, t.bytes);
    }

    /// Every tensor live now, by split.
    SplitBytes live() const {
        SplitBytes sum;
        for (const SplitBytes& c : live_) sum += c;
        return sum;
    }

    Liveness finish() {
        out_.kept = all_[of(Counted::saved)];
        out_.rebuilt = {all_[of(Counted::rebuilt_0)], all_[of(Counted::rebuilt_1)]};
        return std::move(out_);
    }

private:
    struct State {
        Count bytes;
        ActivationSplit split;
        Counted counted;
        bool live;
    };
    static std::size_t of(Counted c) { return static_cast<std::size_t>(c); }
    static Counted rebuilt(int region) { return rebuilt_in(std::uint8_t(region)); }
    SplitBytes dead(Counted c) const { return all_[of(c)].minus(live_[of(c)]); }

    /// The region whose rebuilt tensors a backward op's step counts: its own; before its own
    /// rebuilds anything, the next one backward reaches (which the step's largest stands for).
    int counted_region(int region) const {
        for (int r = region; r >= 0; --r)
            if (count_[of(rebuilt(r))] > 0) return r;
        return -1;
    }

    /// What is live and not counted, and what is counted and not live.
    RunEffect effect_at(const Event& e) const {
        RunEffect out{e.pass, e.source, live_[of(Counted::none)], dead(Counted::saved)};
        const int counted = e.pass == Pass::backward ? counted_region(e.region) : -1;
        for (int r = 0; r < int(max_regions); ++r) {
            if (r == counted)
                out.covered += dead(rebuilt(r));
            else
                out.added += live_[of(rebuilt(r))];
        }
        return out;
    }

    bool events_ = true;        ///< false: declarations alone (TotalsOnly)
    std::size_t declared_ = 0;  ///< tensors declared, where no state is kept
    std::vector<State> tensors_;
    std::array<SplitBytes, 4> all_, live_;  ///< by Counted: every tensor's, the live ones'
    std::array<std::uint32_t, 4> count_{};  ///< tensors by Counted (a class of empty ones counts)
    Liveness out_;
};

/// A recorded tape's sweep: the same events into a Sweeper.
inline Liveness sweep(const Tape& tape) {
    Sweeper s(tape.tensors.size());
    for (const Tensor& t : tape.tensors) s.tensor(t);
    for (const Event& e : tape.events) s.event(e);
    return s.finish();
}

/// The live bytes after each event, by split: what `--ops` shows (the sweep's own live sums).
inline std::vector<SplitBytes> live_after_each(const Tape& tape) {
    Sweeper s(tape.tensors.size());
    for (const Tensor& t : tape.tensors) s.tensor(t);
    std::vector<SplitBytes> out;
    out.reserve(tape.events.size());
    for (const Event& e : tape.events) {
        s.event(e);
        out.push_back(s.live());
    }
    return out;
}

}  // namespace memcalc::tape
