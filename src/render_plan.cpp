// memcalc plan: the layouts that fit, ranked by estimated step time, then by what they waste.
#include <fmt/format.h>

#include <algorithm>

#include "memcalc/version.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

std::size_t fitting(const PlanView& v) { return v.result.fitting; }

/// The layouts whose fit was never weighed: their time, waste and communication ranked them below
/// the best kept before their peak was needed.
std::string ranked_out_text(const PlanView& v) {
    if (v.result.ranked_out == 0) return "";
    return fmt::format(
        " of the {} whose fit was checked ({} ranked below the best by their step, "
        "waste and communication alone)",
        v.result.evaluated - v.result.ranked_out, v.result.ranked_out);
}

std::size_t shown(const PlanView& v) { return v.result.top.size(); }

/// Bytes sent per device, a floating-point estimate that can pass what 64 bits count.
std::string communication_text(double bytes, Unit unit) {
    if (bytes < 1.8e19) return amount(Count(static_cast<std::uint64_t>(bytes)), unit);
    return fmt::format("{:.3g} B", bytes);
}

/// "2.41 s", or "-" without a time.
std::string seconds_text(const std::optional<StepTime>& t) {
    return t ? fmt::format("{:.3g} s", t->seconds()) : "-";
}

std::string tokens_text(const PlanView& v, const PlanRow& r) {
    const auto tokens = tokens_per_second_per_gpu(v.request, r);
    return tokens ? fmt::format("{:.0f}", *tokens) : "-";
}

/// A JSON number, or null.
nlohmann::json number_or_null(const std::optional<double>& x) {
    return x ? nlohmann::json(*x) : nlohmann::json(nullptr);
}

/// How the rows are ranked, and with what the times are made, in a line or two.
std::string ranking_text(const PlanView& v) {
    const auto& gpu = v.request.gpu;
    if (!gpu)
        return "Ranked by wasted compute (recomputation + pipeline bubble), then communication per "
               "device, then peak\n"
               "(no step times: --device-memory gives no GPU speeds; --gpu does).\n";
    if (gpu->peak_bf16_flops == 0)
        return fmt::format(
            "Ranked by wasted compute, then communication per device, then peak: {} has no bf16 "
            "peak to time steps with.\n",
            gpu->name);
    return fmt::format(
        "Ranked by estimated step time at {} ({:g} TFLOP/s bf16: matrix products at {:.2g} of it, "
        "attention at {:.2g}; see --help),\nthen wasted compute, then communication per device, "
        "then peak.\n",
        gpu->name, static_cast<double>(gpu->peak_bf16_flops) / 1e12, gpu->gemm_efficiency,
        attention_efficiency(*gpu, v.request.base.framework));
}

/// Whether the search tried layouts that offload, whose host memory the table then shows.
bool offload_searched(const PlanView& v) {
    return std::any_of(v.request.offload.begin(), v.request.offload.end(),
                       [](OffloadMode o) { return o.state != Offload::none || o.activations; });
}

/// Whether the host memory offload needs was checked, in a line, where the search tried offload.
std::string host_text(const PlanView& v, Unit unit) {
    if (!offload_searched(v)) return "";
    if (v.request.host_capacity)
        return fmt::format(
            "A layout that offloads fits only if its host memory does too: at most {} a device "
            "(--host-memory).\n",
            amount(*v.request.host_capacity, unit));
    return "Host memory was not checked: a layout that offloads fits on its device memory alone "
           "(give --host-memory).\n";
}

/// The recomputation, with partial recomputation's layers per stage (per chunk where a rank holds
/// several).
std::string recompute_text(const PlanRow& r) {
    const auto& n = r.parallel.recompute_layers;
    return n ? fmt::format("{} ({}/{})", recompute_name(r.recompute), *n,
                           chunks_per_rank(r.parallel) > 1 ? "chunk" : "stage")
             : std::string(recompute_name(r.recompute));
}

}  // namespace

namespace {

/// The best layouts, a row each.
std::string layouts_table(const PlanView& v, Unit unit) {
    const bool host = offload_searched(v);
    TextTable table({Align::right, Align::left, Align::right, Align::right, Align::left,
                     Align::right, Align::right, Align::left, Align::right, Align::right,
                     Align::right, Align::right, Align::right, Align::right});
    table.row({"rank", "layout", "micro-batch", "micro-batches", "recompute", "peak", "device",
               "peak at", "recompute", "bubble", "comm/device", "step", "tokens/s/GPU",
               host ? "host" : ""});
    for (std::size_t i = 0; i < shown(v); ++i) {
        const PlanRow& r = v.result.top[i];
        table.row({std::to_string(i + 1), layout_text(r.parallel), std::to_string(r.micro_batch),
                   std::to_string(r.parallel.steps_per_batch()), recompute_text(r),
                   amount(r.peak.bytes(), unit), r.device ? amount(*r.device, unit) : "-",
                   r.peak.step.name() +
                       (r.parallel.pp > 1 ? fmt::format(" (stage {})", r.peak.stage) : ""),
                   fmt::format("{:.1f}%", 100 * r.recompute_fraction),
                   fmt::format("{:.1f}%", 100 * r.bubble),
                   communication_text(r.communication, unit), seconds_text(r.time),
                   tokens_text(v, r), host ? amount(r.host, unit) : ""});
    }
    return table.str();
}

/// The layouts ranked above a shown one that the allocator's simulation refused.
std::string refused_text(const PlanView& v, Unit unit) {
    if (v.result.refused.empty()) return "";
    const std::size_t listed = std::min<std::size_t>(3, v.result.refused.size());
    std::string out = fmt::format(
        "Refused: {} layout(s) ranked above these whose peak and device rows fit, but not the "
        "device\nfigure with the allocator's reserved bytes (high end); the best {}:\n",
        v.result.refused.size(), listed);
    for (std::size_t i = 0; i < listed; ++i) {
        const PlanRow& r = v.result.refused[i];
        out +=
            fmt::format("  {}, micro-batch {}, recompute {}: device {}\n", layout_text(r.parallel),
                        r.micro_batch, recompute_text(r), amount(*r.device, unit));
    }
    return out;
}

/// A search the time limit ended: how much of it was evaluated.
std::string stopped_text(const PlanView& v) {
    if (v.result.complete) return "";
    return fmt::format(
        "Stopped at the time limit ({:g} s) with {} of the search's {} layouts evaluated "
        "({:.2f}%):\nthe best found so far; --time-limit gives it longer.\n",
        *v.request.time_limit, digits(Count(v.result.evaluated)), digits(Count(v.result.layouts)),
        100 * v.result.coverage());
}

}  // namespace

std::string plan_table(const PlanView& v, Unit unit) {
    if (v.fewest_step && v.request.gpus == 0)
        return fmt::format(
            "memcalc plan: {}: no layout fits on up to {} devices of {} ({} usable), seq {}, {} "
            "sequences per step\n({} layouts evaluated in {:.3f} s). Try more memory, a shorter "
            "sequence or fewer pinned options.\n",
            v.model, digits(Count(fewest_gpus_limit)), amount(v.memory, unit),
            amount(v.request.capacity, unit), v.request.base.seq, v.request.global_batch,
            v.result.evaluated, v.seconds);
    std::string out = fmt::format(
        "memcalc plan: {} on {} devices of {} ({} usable), seq {}, {} sequences per step\n",
        v.model, v.request.gpus, amount(v.memory, unit), amount(v.request.capacity, unit),
        v.request.base.seq, v.request.global_batch);
    if (v.fewest_step)
        out +=
            *v.fewest_step > 1
                ? fmt::format("The fewest devices, in whole nodes of {}, on which a layout fits.\n",
                              *v.fewest_step)
                : "The fewest devices, any count, on which a layout fits.\n";
    out += fmt::format("{} layouts evaluated in {:.3f} s; {} fit{}. {}", v.result.evaluated,
                       v.seconds, fitting(v), ranked_out_text(v), ranking_text(v)) +
           host_text(v, unit) + stopped_text(v);
    if (v.result.evaluated == 0)
        return out + fmt::format(
                         "No layout of {} devices is valid: each way to write {} as dp x tp x pp "
                         "x cp needs a degree the model or the run cannot take\n(tp must divide "
                         "the heads, the key/value heads and the MLP width; pp the layers, or "
                         "leave the first and last stages fewer than the others' even share;\ncp, "
                         "times tp with sequence parallelism, the sequence; dp the global batch). "
                         "Try a device count with other factors.\n",
                         v.request.gpus, v.request.gpus);
    if (fitting(v) == 0 && !v.result.complete)
        return out + "None of those evaluated fits: give the search more time.\n";
    if (fitting(v) == 0)
        return out + (offload_searched(v) && v.request.host_capacity
                          ? "No layout fits: try more devices, more device or host memory, or a "
                            "shorter sequence.\n"
                          : "No layout fits: try more devices, more memory or a shorter "
                            "sequence.\n");
    if (shown(v) == 0)
        return out + fmt::format(
                         "No layout fits on the device: of the best {} whose peak and device rows "
                         "fit, the allocator's\nreserved bytes take each over (the best: {}, "
                         "device {}). Try more devices or memory.\n",
                         v.result.refused.size(), layout_text(v.result.refused.front().parallel),
                         amount(*v.result.refused.front().device, unit));
    return out + layouts_table(v, unit) + refused_text(v, unit);
}

namespace {

/// The rates the step times assume (step_time.hpp), null without a GPU.
nlohmann::json step_time_facts(const std::optional<Gpu>& gpu, const Framework& f) {
    if (!gpu) return nullptr;
    return {{"gemm_efficiency", gpu->gemm_efficiency},
            {"attention_efficiency", attention_efficiency(*gpu, f)},
            {"memory_bytes_per_second", gpu->memory_bandwidth},
            {"intra_node_latency_seconds", gpu->intra_node_latency},
            {"inter_node_latency_seconds", gpu->inter_node_latency},
            {"collective_sm_share", gpu->collective_sm_share},
            {"launch_seconds", gpu->launch_seconds}};
}

/// One ranked layout of a plan, `rank` its place.
nlohmann::json layout_json(const PlanView& v, const PlanRow& r, std::size_t rank) {
    using nlohmann::json;
    const Parallelism& p = r.parallel;
    const auto timed = [&](auto seconds) {
        return number_or_null(r.time ? std::optional<double>(seconds(*r.time)) : std::nullopt);
    };
    return {{"rank", rank},
            {"dp", p.dp},
            {"tp", p.tp},
            {"pp", p.pp},
            {"vpp", p.vpp},
            {"cp", p.cp},
            {"ep", p.ep},
            {"etp", p.expert_tp()},
            {"zero", p.zero},
            {"offload", p.offload_mode().name()},
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
              {"microbatch", r.peak.step.microbatch},
              {"beside_bytes", r.beside.value()},
              {"device_bytes", r.device ? json(r.device->value()) : json(nullptr)}}},
            {"recompute_fraction", r.recompute_fraction},
            {"bubble", r.bubble},
            {"communication_bytes", r.communication},
            {"step_seconds", timed([](const auto& t) { return t.seconds(); })},
            {"compute_seconds", timed([](const auto& t) { return t.compute; })},
            {"bubble_seconds", timed([](const auto& t) { return t.bubble; })},
            {"communication_seconds", timed([](const auto& t) { return t.communication; })},
            {"offload_seconds", timed([](const auto& t) { return t.offload; })},
            {"host_optimizer_seconds", timed([](const auto& t) { return t.host_optimizer; })},
            {"optimizer_seconds", timed([](const auto& t) { return t.optimizer; })},
            {"dispatch_seconds", timed([](const auto& t) { return t.dispatch; })},
            {"tokens_per_second_per_gpu", number_or_null(tokens_per_second_per_gpu(v.request, r))},
            {"gpus", p.devices()},
            {"schedule", schedule_name(p.pipeline_schedule())},
            {"recompute_layers", p.recompute_layers ? json(*p.recompute_layers) : json(nullptr)},
            {"host_bytes", r.host.value()}};
}

}  // namespace

nlohmann::json plan_json(const PlanView& v) {
    using nlohmann::json;
    json layouts = json::array();
    for (std::size_t i = 0; i < shown(v); ++i)
        layouts.push_back(layout_json(v, v.result.top[i], i + 1));
    json refused = json::array();
    for (const PlanRow& r : v.result.refused) refused.push_back(layout_json(v, r, 0));
    return {
        {"memcalc", memcalc::version},
        {"schema", memcalc::json_schema},
        {"command", "plan"},
        {"model", v.model},
        {"gpus", v.request.gpus},
        {"gpus_searched", v.fewest_step
                              ? nlohmann::json(*v.fewest_step > 1 ? "whole nodes" : "any count")
                              : nlohmann::json(nullptr)},
        {"gpu", v.request.gpu ? nlohmann::json(std::string(v.request.gpu->name))
                              : nlohmann::json(nullptr)},
        {"step_time_facts", step_time_facts(v.request.gpu, v.request.base.framework)},
        {"seq", v.request.base.seq},
        {"global_batch", v.request.global_batch},
        {"device_memory_bytes", v.memory.value()},
        {"reserve_bytes", v.reserve.value()},
        {"capacity_bytes", v.request.capacity.value()},
        {"host_memory_bytes",
         v.request.host_capacity ? json(v.request.host_capacity->value()) : json(nullptr)},
        {"evaluated", v.result.evaluated},
        {"seconds", v.seconds},
        {"complete", v.result.complete},
        {"coverage", v.result.coverage()},
        {"time_limit_seconds", v.request.time_limit ? json(*v.request.time_limit) : json(nullptr)},
        {"fitting", fitting(v)},
        {"ranked_out", v.result.ranked_out},
        {"refused", refused},
        {"ranking",
         "step_seconds (null last), then waste (recompute_fraction + bubble), then "
         "communication_bytes, then peak bytes"},
        {"layouts", layouts}};
}

std::string plan_csv(const PlanView& v) {
    std::string out =
        "rank,dp,tp,pp,cp,ep,zero,sequence_parallel,micro_batch,microbatches,recompute,peak_bytes,"
        "peak_step,peak_stage,recompute_fraction,bubble,communication_bytes,peak_microbatch,"
        "first_stage_layers,last_stage_layers,step_seconds,tokens_per_second_per_gpu,gpus,vpp,"
        "offload,schedule,recompute_layers,host_bytes\n";
    for (std::size_t i = 0; i < shown(v); ++i) {
        const PlanRow& r = v.result.top[i];
        const Parallelism& p = r.parallel;
        const auto tokens = tokens_per_second_per_gpu(v.request, r);
        out += fmt::format(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.6f},{:.6f},{:.0f},{},{},{},{},{},{},{},"
            "{},{},{},{}\n",
            i + 1, p.dp, p.tp, p.pp, p.cp, p.ep, p.zero, p.sequence_parallel, r.micro_batch,
            p.steps_per_batch(), recompute_name(r.recompute), r.peak.bytes().value(),
            r.peak.step.name(), r.peak.stage, r.recompute_fraction, r.bubble, r.communication,
            r.peak.step.microbatch, p.first_stage_layers, p.last_stage_layers,
            r.time ? fmt::format("{:.6g}", r.time->seconds()) : "",
            tokens ? fmt::format("{:.1f}", *tokens) : "", p.devices(), p.vpp,
            p.offload_mode().name(), schedule_name(p.pipeline_schedule()),
            p.recompute_layers ? std::to_string(*p.recompute_layers) : "", r.host.value());
    }
    return out;
}

}  // namespace memcalc::cli
