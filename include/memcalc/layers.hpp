#pragma once
/// Which kind each layer is, and what a pipeline stage's layers are: the counts by kind that the
/// timeline's linear steps and the closed-form peak need, without allocating per layout.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "memcalc/model.hpp"

namespace memcalc {

/// Layers of each kind.
using KindCounts = std::array<std::uint64_t, max_layer_kinds>;

/// A model's layer pattern, prepared: how many layers of each kind lie among the first n, and the
/// run around a layer, each in O(log runs).
class LayerPattern {
public:
    LayerPattern() = default;
    explicit LayerPattern(const Architecture& m) : LayerPattern(m.runs(), m.kind_count()) {}
    LayerPattern(std::vector<LayerRun> runs, std::size_t kinds)
        : kinds_(kinds), runs_(std::move(runs)) {
        KindCounts before{};
        std::uint64_t end = 0;
        for (const auto& run : runs_) {
            before_.push_back(before);
            before[run.kind] += run.count;
            end += run.count;
            ends_.push_back(end);
        }
    }

    std::size_t kinds() const { return kinds_; }
    /// Every layer of kind 0 (the fast path: counts are positions).
    bool uniform() const { return runs_.empty() || (runs_.size() == 1 && runs_[0].kind == 0); }

    /// Layers of each kind among layers 1..n (1-based, n at most the model's layers).
    KindCounts prefix(std::uint64_t n) const {
        KindCounts c{};
        if (uniform()) {
            c[0] = n;
            return c;
        }
        const std::size_t r = run_holding(n);
        if (r == runs_.size()) return before_.empty() ? c : total();
        c = before_[r];
        c[runs_[r].kind] += n - (ends_[r] - runs_[r].count);
        return c;
    }
    /// The kind of layer `layer` (1-based).
    std::size_t kind_of(std::uint64_t layer) const {
        if (uniform()) return 0;
        const std::size_t r = run_holding(layer);
        return r == runs_.size() ? runs_.back().kind : runs_[r].kind;
    }
    /// The first and last layer (1-based) of the run holding layer `layer`.
    std::pair<std::uint64_t, std::uint64_t> run_around(std::uint64_t layer) const {
        const std::size_t r = std::min(run_holding(layer), runs_.size() - 1);
        return {ends_[r] - runs_[r].count + 1, ends_[r]};
    }

private:
    KindCounts total() const {
        KindCounts c = before_.back();
        c[runs_.back().kind] += runs_.back().count;
        return c;
    }
    /// The run holding layer `layer` (1-based): the first whose end reaches it.
    std::size_t run_holding(std::uint64_t layer) const {
        std::size_t lo = 0, hi = ends_.size();
        while (lo < hi) {
            const std::size_t mid = (lo + hi) / 2;
            if (ends_[mid] < layer)
                lo = mid + 1;
            else
                hi = mid;
        }
        return lo;
    }

    std::size_t kinds_ = 1;
    std::vector<LayerRun> runs_;
    std::vector<std::uint64_t> ends_;  ///< the last layer (1-based) of each run
    std::vector<KindCounts> before_;   ///< layers of each kind before each run
};

/// Every position of a chunk runs under the recomputation (StageLayers::recomputed's default).
inline constexpr std::uint64_t every_position = ~std::uint64_t{0};

/// The layers one device runs, in forward order: `layers` of them, in one run after `first_layer`
/// (chunk 0 or chunk = layers); or in chunks of `chunk` consecutive layers, chunk c starting
/// `first_layer` layers into the model's c-th pass of `pass` layers (interleaved pipelines, each
/// pass one chunk of every rank); or, `mirrored`, in two chunks: `chunk` layers after
/// `first_layer`, then the rest after `mirror_first_layer` (ZB-V's V shape, DualPipe's two
/// directions), which may differ in length when the model's first and last chunks do (uneven
/// stages).
struct StageLayers {
    std::uint64_t layers = 0, chunk = 0, stage = 0;
    std::uint64_t first_layer = 0;         ///< layers before this device's first (in its pass)
    std::uint64_t pass = 0;                ///< interleaved: the layers of one pass (L / vpp)
    bool mirrored = false;                 ///< two chunks, the second `layers - chunk` long
    std::uint64_t mirror_first_layer = 0;  ///< layers before the second chunk's first, mirrored
    /// Partial recomputation (Megatron-LM's recompute-num-layers, block method): only the first so
    /// many positions of each chunk run under the recomputation; the rest keep every activation.
    std::uint64_t recomputed = every_position;
    const LayerPattern* pattern = nullptr;  ///< the model's; none: every layer one kind
    bool several_kinds = false;             ///< `pattern` has more than one kind
    /// Layers differ (kinds, or recomputed and not): steps are linear only within runs (set by
    /// with()).
    bool mixed = false;

    StageLayers& with(const LayerPattern& p) {
        pattern = &p, several_kinds = !p.uniform();
        mixed = several_kinds || partial();
        return *this;
    }
    /// Only the first `n` positions of each chunk recomputed (every_position: all).
    StageLayers& recomputing(std::uint64_t n) {
        recomputed = n;
        mixed = several_kinds || partial();
        return *this;
    }
    bool one_chunk() const { return chunk == 0 || chunk == layers; }
    std::uint64_t chunk_width() const { return one_chunk() ? layers : chunk; }
    /// Whether every chunk is `chunk_width()` long (a mirrored device's two may differ).
    bool equal_chunks() const { return !mirrored || one_chunk() || layers == 2 * chunk; }
    /// The chunk that holds 0-based position `i`, where it starts and how long it is.
    std::uint64_t chunk_of(std::uint64_t i) const {
        if (one_chunk()) return 0;
        return mirrored ? (i < chunk ? 0 : 1) : i / chunk;
    }
    std::uint64_t chunk_start(std::uint64_t c) const { return c * chunk_width(); }
    std::uint64_t chunk_size(std::uint64_t c) const {
        return mirrored && c == 1 ? layers - chunk : chunk_width();
    }
    /// The longest chunk: what one model chunk of another micro-batch in flight holds at most.
    std::uint64_t largest_chunk() const {
        return mirrored && !one_chunk() ? std::max(chunk, layers - chunk) : chunk_width();
    }
    /// Some positions recomputed and some not.
    bool partial() const { return recomputed < largest_chunk(); }
    bool uniform() const { return !mixed; }
    std::size_t kinds() const { return several_kinds ? pattern->kinds() : 1; }

    /// The global number (1..L) of the i-th layer this device runs (0-based, forward order).
    std::uint64_t layer_id(std::uint64_t i) const {
        if (one_chunk()) return first_layer + i + 1;
        if (mirrored) return i < chunk ? first_layer + i + 1 : mirror_first_layer + i - chunk + 1;
        return i / chunk * pass + first_layer + i % chunk + 1;
    }
    /// The kind of the layer at `position` (1-based, forward order).
    std::size_t kind_at(std::uint64_t position) const {
        return several_kinds ? pattern->kind_of(layer_id(position - 1)) : 0;
    }
    /// Whether the layer at `position` runs under the recomputation (else it keeps every
    /// activation).
    bool recomputed_at(std::uint64_t position) const {
        return offset_in_chunk(position - 1) < recomputed;
    }
    /// Layers of each kind among the first `positions` this device runs.
    KindCounts counts(std::uint64_t positions) const {
        return counts_within(positions, every_position);
    }
    /// Those of them that run under the recomputation.
    KindCounts recomputed_counts(std::uint64_t positions) const {
        return counts_within(positions, recomputed);
    }
    /// The last position of the run of one kind (and one recomputation) that holds `position`
    /// (1-based): up to it, steps are linear in the position.
    std::uint64_t run_end(std::uint64_t position) const {
        if (uniform()) return layers;
        const std::uint64_t c = chunk_of(position - 1), offset = position - 1 - chunk_start(c);
        const std::uint64_t width = chunk_size(c);
        std::uint64_t end = position - offset + width - 1;  // the chunk's last
        if (offset < recomputed && recomputed < width) end = position - offset + recomputed - 1;
        if (!several_kinds) return end;
        const std::uint64_t global = layer_id(position - 1);
        return std::min(end, position + (pattern->run_around(global).second - global));
    }
    /// The first position of that run.
    std::uint64_t run_start(std::uint64_t position) const {
        if (uniform()) return 1;
        const std::uint64_t offset = offset_in_chunk(position - 1);
        std::uint64_t start = position - offset;  // the chunk's first
        if (offset >= recomputed) start += recomputed;
        if (!several_kinds) return start;
        // The run may have begun before this device's first layer: the chunk's start bounds it.
        const std::uint64_t global = layer_id(position - 1);
        return position - std::min(global - pattern->run_around(global).first, position - start);
    }

    /// One kind in chunks of one width: counts_within is count_within's closed form.
    bool closed_counts() const { return !several_kinds && equal_chunks(); }
    /// The first `positions`' layers counted by counts_within, for closed_counts(): whole chunks,
    /// then the part of the last (the planner's peak search runs it millions of times a second).
    std::uint64_t count_within(std::uint64_t positions, std::uint64_t limit) const {
        const std::uint64_t width = chunk_width();
        if (width == 0) return 0;
        if (positions <= width) return std::min(positions, limit);  // no division
        return positions / width * std::min(limit, width) + std::min(positions % width, limit);
    }

private:
    std::uint64_t offset_in_chunk(std::uint64_t i) const { return i - chunk_start(chunk_of(i)); }

    /// Layers of each kind among the first `positions`, counting only the first `limit` of each
    /// chunk.
    KindCounts counts_within(std::uint64_t positions, std::uint64_t limit) const {
        KindCounts c{};
        if (closed_counts()) {
            c[0] = count_within(positions, limit);
            return c;
        }
        const auto add_range = [&](std::uint64_t first,
                                   std::uint64_t last) {  // global, 1-based, inclusive
            const KindCounts upto = pattern->prefix(last), before = pattern->prefix(first - 1);
            for (std::size_t k = 0; k < kinds(); ++k) c[k] += upto[k] - before[k];
        };
        for (std::uint64_t done = 0; done < positions;) {
            const std::uint64_t offset = offset_in_chunk(done),
                                take =
                                    std::min(chunk_size(chunk_of(done)) - offset, positions - done);
            const std::uint64_t counted = offset >= limit ? 0 : std::min(take, limit - offset);
            if (counted > 0 && several_kinds)
                add_range(layer_id(done), layer_id(done) + counted - 1);
            else
                c[0] += counted;
            done += take;
        }
        return c;
    }
};

}  // namespace memcalc
