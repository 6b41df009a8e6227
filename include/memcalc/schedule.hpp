#pragma once
/// Pipeline schedules, one row each: how many model chunks a rank holds and where they sit, how
/// many micro-batches' activations it keeps in flight, the idle time (bubble) the schedule leaves,
/// and the paper each figure comes from. Plain numbers in, plain numbers out: parallel.hpp applies
/// them.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "memcalc/error.hpp"

namespace memcalc {

enum class Schedule {
    one_f_one_b,  ///< 1F1B (PipeDream-Flush, Narayanan et al. 2021): one chunk per rank
    interleaved,  ///< interleaved 1F1B (Megatron-LM): vpp chunks per rank, chunk c the (c pp +
                  ///< stage)-th
    zb_h1,  ///< ZB-H1 (Qi et al. 2024): 1F1B with the weight-gradient pass (W) deferred into the
            ///< bubble
    zb_v,   ///< ZB-V (Qi et al. 2024): two chunks per rank in a V, rank k holding chunks k and 2 pp
            ///< - 1 - k
    dualpipe,  ///< DualPipe (DeepSeek-V3): micro-batches from both ends, rank k holding stages k
               ///< and pp - 1 - k
};

/// One model chunk's times on a rank, in any unit: its forward, its full backward (input and weight
/// gradients, recomputation included) and the weight-gradient part of that backward.
struct ChunkTimes {
    double forward = 0, backward = 0, weight = 0;
};

/// Where a schedule's deferred weight-gradient passes (W) peak: of `in_flight` micro-batches
/// (chunks) holding activations or W's reads, at most `deferred` hold the reads; `throughout`:
/// as many are past their B at every point (otherwise more may hold activations elsewhere).
struct Deferral {
    std::uint64_t in_flight, deferred;
    bool throughout = false;
};

struct ScheduleRow {
    Schedule schedule;
    const char* name;   ///< as --schedule spells it
    const char* title;  ///< as a report names it
    /// Model chunks on each rank; 0: vpp of them (the interleaved schedule).
    std::uint64_t chunks;
    /// Copies of each chunk across the pipeline: DualPipe runs the model in both directions, so
    /// every stage's weights (and their gradients and optimiser state) sit on two ranks.
    std::uint64_t parameter_copies;
    /// Whether a rank's second chunk mirrors its first: of N chunks, rank k holds the k-th and the
    /// (N - 1 - k)-th (ZB-V's V shape; DualPipe's two directions). Otherwise chunk c is the (c pp +
    /// k)-th.
    bool mirrored;
    /// Whether the weight-gradient pass (W) of a micro-batch runs apart from, and after, its
    /// input-gradient pass (B): until it does, the micro-batch holds what W reads
    /// (Workload::weight_pass_reads).
    bool defers_weight_gradients;
    /// Chunks whose activations stage `stage` of `P` holds at its peak, with `M` micro-batches and
    /// `V` chunks per rank; `later`: at a later micro-batch's backward than the first.
    std::uint64_t (*in_flight)(std::uint64_t P, std::uint64_t stage, std::uint64_t M,
                               std::uint64_t V, bool later);
    /// The bubble of `P` ranks, in the times of one chunk.
    double (*bubble)(std::uint64_t P, ChunkTimes t);
    const char* bubble_formula;  ///< in the source's letters
    const char* source;
    /// Whether the schedule runs one chunk's expert all-to-alls under another's computation
    /// (DualPipe's forward and backward chunk pairs): no all-to-all on its critical path.
    bool overlaps_all_to_all = false;
    /// A schedule deferring W: its phase of most deferred passes on stage `stage` of `P`, of its
    /// peak's `in_flight`. None: any in flight may hold either, leaning high.
    Deferral (*deferral)(std::uint64_t P, std::uint64_t stage, std::uint64_t in_flight) = nullptr;
};

/// The rows, in enum order. A micro-batch's activations count as live from its forward until its
/// last backward pass on the rank, the deferred W included: what the papers' activation columns
/// count. Where W is deferred, what it reads (the linears' inputs and outputs' gradients) may
/// outweigh them, as under recomputation: each micro-batch in flight counts the larger
/// (stage_inputs), leaning high.
inline constexpr std::array<ScheduleRow, 5> schedule_rows{{
    {Schedule::one_f_one_b, "1f1b", "1F1B", 1, 1, false, false,
     // Narayanan et al. 2021: stage k runs P - k forwards before its first backward.
     [](std::uint64_t P, std::uint64_t k, std::uint64_t M, std::uint64_t, bool later) {
         return std::min(P - k, M - (later ? 1 : 0));
     },
     [](std::uint64_t P, ChunkTimes t) {
         return static_cast<double>(P - 1) * (t.forward + t.backward);
     },
     "(P-1)(F+B)", "Narayanan et al. 2021 (PipeDream-Flush); DeepSeek-V3 report, Table 2"},
    {Schedule::interleaved, "interleaved", "interleaved 1F1B", 0, 1, false, false,
     // Megatron-LM's warm-up: 2 (P - k - 1) + (V - 1) P forward chunks, plus the one in steady
     // state.
     [](std::uint64_t P, std::uint64_t k, std::uint64_t M, std::uint64_t V, bool later) {
         return std::min(2 * (P - k - 1) + (V - 1) * P + 1, (M - (later ? 1 : 0)) * V);
     },
     // (P-1)(F+B) of a chunk, 1/V of a stage: the stage's bubble divided by V.
     [](std::uint64_t P, ChunkTimes t) {
         return static_cast<double>(P - 1) * (t.forward + t.backward);
     },
     "(P-1)(F+B), F and B of one chunk (1/V of a stage)",
     "Narayanan et al. 2021, section 2.2 (Megatron-LM)"},
    {Schedule::zb_h1, "zb-h1", "ZB-H1", 1, 1, false, true,
     // Qi et al. 2024, 2.1: W is deferred so that every stage keeps as many in flight as 1F1B's
     // first.
     [](std::uint64_t P, std::uint64_t, std::uint64_t M, std::uint64_t, bool later) {
         return std::min(P, M - (later ? 1 : 0));
     },
     [](std::uint64_t P, ChunkTimes t) {
         return static_cast<double>(P - 1) * std::max(0.0, t.forward + t.backward - 2 * t.weight);
     },
     "(P-1)(F+B-2W)",
     "Qi et al. 2024 (Zero Bubble Pipeline Parallelism, ZB-H1); DeepSeek-V3 report, Table 2 "
     "(ZB1P)",
     false,
     // The authors' order (ZeroBubbleH1Pipeline; validation/pipeline_schedules.py runs it): stage k
     // defers the W of its first k backwards, then runs the oldest after each B; stage 0 none.
     [](std::uint64_t, std::uint64_t k, std::uint64_t in_flight) {
         return Deferral{in_flight, k, true};
     }},
    {Schedule::zb_v, "zb-v", "ZB-V", 2, 1, true, true,
     // Qi et al. 2024, ZB-V: the peak activation memory of 1F1B (P micro-batches of a rank's
     // layers, 2 P chunks) on every rank.
     [](std::uint64_t P, std::uint64_t, std::uint64_t M, std::uint64_t, bool) {
         return std::min(2 * P, 2 * M);
     },
     // None when F, B-W and W take the same time, as memcalc's FLOPs model has them: the paper's
     // figure.
     [](std::uint64_t, ChunkTimes) { return 0.0; }, "0 (with F = B-W = W)",
     "Qi et al. 2024 (Zero Bubble Pipeline Parallelism, section 6: ZB-V)"},
    {Schedule::dualpipe, "dualpipe", "DualPipe", 2, 2, true, true,
     // DeepSeek-V3 report, Table 2: PP + 1 stages' activations per rank (the overlapped forward and
     // backward chunk holds one more), on every rank.
     [](std::uint64_t P, std::uint64_t, std::uint64_t M, std::uint64_t, bool) {
         return std::min(P + 1, M);
     },
     // F&B, the overlapped forward and backward chunks, counted as F + B: overlap hides
     // communication, not compute.
     [](std::uint64_t P, ChunkTimes t) {
         const double overlapped = t.forward + t.backward;
         return static_cast<double>(P / 2 - 1) *
                std::max(0.0, overlapped + t.backward - 3 * t.weight);
     },
     "(P/2-1)(F&B+B-3W), F&B = F+B", "DeepSeek-V3 technical report, section 3.2.1 and Table 2",
     true,
     // deepseek-ai/DualPipe's dualpipe.py (bb214e8), rank k of half rank h = min(k, P - 1 - k):
     // step 3's zero-bubble B runs its W next, before the peak (step 4's P + 1); W waits only in
     // steps 6 and 7, where of the P / 2 + h + 1 chunks left h + 1 defer it.
     [](std::uint64_t P, std::uint64_t k, std::uint64_t in_flight) {
         const std::uint64_t h = std::min(k, P - 1 - k);
         return Deferral{std::min(P / 2 + h + 1, in_flight), h + 1};
     }},
}};

inline const ScheduleRow& schedule_row(Schedule s) {
    return schedule_rows[static_cast<std::size_t>(s)];
}

inline const char* schedule_name(Schedule s) { return schedule_row(s).name; }

/// The schedule --schedule names, or an error naming the value.
inline Schedule parse_schedule(const std::string& name) {
    std::string known;
    for (const ScheduleRow& row : schedule_rows) {
        if (name == row.name) return row.schedule;
        known += std::string(known.empty() ? "" : ", ") + row.name;
    }
    throw error("schedule must be one of " + known + " (got '" + name + "')");
}

/// The chunk times of a rank that spends `seconds` per chunk, a share `forward_share` of it in the
/// forward. The weight-gradient pass repeats the forward's matrix products with the other operand
/// (as many FLOPs), the input-gradient pass the rest of the backward.
inline ChunkTimes chunk_times(double seconds, double forward_share) {
    const double forward = seconds * forward_share;
    return {forward, seconds - forward, forward};
}

}  // namespace memcalc
