// memcalc plan: the layouts that fit, ranked by what they waste.
#include <fmt/format.h>

#include <algorithm>

#include "memcalc/version.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

std::size_t fitting(const PlanView& v) { return v.result.fitting; }

std::size_t shown(const PlanView& v) { return v.result.top.size(); }

/// Bytes sent per device, a floating-point estimate that can pass what 64 bits count.
std::string communication_text(double bytes, Unit unit) {
    if (bytes < 1.8e19) return amount(Count(static_cast<std::uint64_t>(bytes)), unit);
    return fmt::format("{:.3g} B", bytes);
}

}  // namespace

std::string plan_table(const PlanView& v, Unit unit) {
    TextTable table({Align::right, Align::left, Align::right, Align::right, Align::left, Align::right, Align::left,
                     Align::right, Align::right, Align::right});
    table.row({"rank", "layout", "micro-batch", "micro-batches", "recompute", "peak", "peak at", "recompute",
               "bubble", "comm/device"});
    for (std::size_t i = 0; i < shown(v); ++i) {
        const PlanRow& r = v.result.top[i];
        table.row({std::to_string(i + 1), layout_text(r.parallel), std::to_string(r.micro_batch),
                   std::to_string(r.parallel.steps_per_batch()), recompute_name(r.recompute), amount(r.peak.bytes(), unit),
                   r.peak.step.name() + (r.parallel.pp > 1 ? fmt::format(" (stage {})", r.peak.stage) : ""),
                   fmt::format("{:.1f}%", 100 * r.recompute_fraction), fmt::format("{:.1f}%", 100 * r.bubble),
                   communication_text(r.communication, unit)});
    }
    std::string out = fmt::format(
        "memcalc plan: {} on {} devices of {} ({} usable), seq {}, {} sequences per step\n"
        "{} layouts evaluated in {:.3f} s; {} fit. Ranked by wasted compute (recomputation + pipeline bubble),\n"
        "then communication per device, then peak.\n",
        v.model, v.request.gpus, amount(v.memory, unit), amount(v.request.capacity, unit), v.request.base.seq,
        v.request.global_batch, v.result.evaluated, v.seconds, fitting(v));
    if (v.result.evaluated == 0)
        return out + fmt::format(
                         "No layout of {} devices is valid: each way to write {} as dp x tp x pp x cp needs a degree the "
                         "model or the run cannot take\n(tp must divide the heads, the key/value heads and the MLP "
                         "width; pp the layers, or leave the first and last stages an even split of the rest;\ncp, "
                         "times tp with sequence parallelism, the sequence; dp the global batch). Try a device count "
                         "with other factors.\n",
                         v.request.gpus, v.request.gpus);
    if (fitting(v) == 0) return out + "No layout fits: try more devices, more memory or a shorter sequence.\n";
    return out + table.str();
}

nlohmann::json plan_json(const PlanView& v) {
    using nlohmann::json;
    json layouts = json::array();
    for (std::size_t i = 0; i < shown(v); ++i) {
        const PlanRow& r = v.result.top[i];
        const Parallelism& p = r.parallel;
        layouts.push_back({{"rank", i + 1},
                           {"dp", p.dp},
                           {"tp", p.tp},
                           {"pp", p.pp},
                           {"cp", p.cp},
                           {"ep", p.ep},
                           {"etp", p.expert_tp()},
                           {"zero", p.zero},
                           {"sequence_parallel", p.sequence_parallel},
                           {"micro_batch", r.micro_batch},
                           {"microbatches", p.steps_per_batch()},
                           {"recompute", recompute_name(r.recompute)},
                           {"first_stage_layers", p.first_stage_layers},
                           {"last_stage_layers", p.last_stage_layers},
                           {"peak",
                            {{"bytes", r.peak.bytes().value()},
                             {"step", r.peak.step.name()},
                             {"stage", r.peak.stage},
                             {"microbatch", r.peak.step.microbatch}}},
                           {"recompute_fraction", r.recompute_fraction},
                           {"bubble", r.bubble},
                           {"communication_bytes", r.communication}});
    }
    return {{"memcalc", memcalc::version},
            {"schema", memcalc::json_schema},
            {"command", "plan"},
            {"model", v.model},
            {"gpus", v.request.gpus},
            {"seq", v.request.base.seq},
            {"global_batch", v.request.global_batch},
            {"device_memory_bytes", v.memory.value()},
            {"reserve_bytes", v.reserve.value()},
            {"capacity_bytes", v.request.capacity.value()},
            {"evaluated", v.result.evaluated},
            {"seconds", v.seconds},
            {"fitting", fitting(v)},
            {"ranking", "waste (recompute_fraction + bubble), then communication_bytes, then peak bytes"},
            {"layouts", layouts}};
}

std::string plan_csv(const PlanView& v) {
    std::string out = "rank,dp,tp,pp,cp,ep,zero,sequence_parallel,micro_batch,microbatches,recompute,peak_bytes,peak_step,"
                      "peak_stage,recompute_fraction,bubble,communication_bytes,peak_microbatch,first_stage_layers,"
                      "last_stage_layers\n";
    for (std::size_t i = 0; i < shown(v); ++i) {
        const PlanRow& r = v.result.top[i];
        const Parallelism& p = r.parallel;
        out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.0f},{},{},{}\n", i + 1, p.dp, p.tp,
                           p.pp, p.cp,
                           p.ep, p.zero, p.sequence_parallel, r.micro_batch, p.steps_per_batch(), recompute_name(r.recompute),
                           r.peak.bytes().value(), r.peak.step.name(), r.peak.stage, r.recompute_fraction, r.bubble,
                           r.communication, r.peak.step.microbatch, p.first_stage_layers, p.last_stage_layers);
    }
    return out;
}

}  // namespace memcalc::cli
