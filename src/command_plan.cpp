// memcalc plan: every layout of a cluster that fits, ranked; or the fewest GPUs on which one fits.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <tuple>

#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"

namespace memcalc::cli {

namespace {

/// The memory each device offers: --device-memory or --gpu, less --reserve.
void device_of(const PlanOptions& q, PlanView& view) {
    const std::optional<UsableMemory> usable = usable_memory(q.device);
    if (!usable)
        throw usage_error(
            "plan needs --device-memory or --gpu, e.g. --device-memory 80GB or --gpu h100-sxm");
    const DeviceMemory* device = &usable->device;
    if (q.step.seq.empty()) throw usage_error("plan needs --seq");
    if (q.parallel.global_batch.empty())
        throw usage_error("plan needs --global-batch, the sequences per step");
    view.memory = device->bytes;
    view.reserve = usable->rule.reserve;
    PlanRequest& r = view.request;
    r.gpus = parse_count("--gpus", q.gpus, 1);
    r.gpu = device->gpu;
    r.capacity = usable->rule.usable();
    r.device = device_settings(q.device);
    r.device->loading = parse_loading(q.parallel.loading);
    if (!q.parallel.host_memory.empty())
        r.host_capacity = parse_size("--host-memory", q.parallel.host_memory);
}

/// The degrees, stages, schedules and offloads given: they restrict the search; not given, it
/// tries them all.
void pinned_of(const ParallelOptions& q, PlanRequest& r) {
    for (auto [option, text, list] :
         {std::tuple{"--dp", &q.dp, &r.dp}, std::tuple{"--tp", &q.tp, &r.tp},
          std::tuple{"--pp", &q.pp, &r.pp}, std::tuple{"--cp", &q.cp, &r.cp},
          std::tuple{"--ep", &q.ep, &r.ep}, std::tuple{"--vpp", &q.vpp, &r.vpp}})
        if (!text->empty()) *list = parse_sizes(option, *text);
    if (!q.zero.empty()) r.zero = parse_zero(q.zero);
    if (!q.schedule.empty()) r.schedules = parse_schedules(q.schedule);
    if (!q.offload.empty()) r.offload = parse_offloads(q.offload);
    // An offload no pinned ZeRO stage allows is a mistake to name, not a search that finds nothing.
    if (!r.offload.empty() && !r.zero.empty()) {
        const auto any_stage = [&](auto ok) {
            return std::any_of(r.zero.begin(), r.zero.end(), ok);
        };
        const bool possible = std::any_of(r.offload.begin(), r.offload.end(), [&](OffloadMode o) {
            return o.state == Offload::none ||
                   (o.state == Offload::optimizer &&
                    any_stage([](unsigned z) { return z >= 1; })) ||
                   any_stage([](unsigned z) { return z == 3; });
        });
        const bool optimizer = std::any_of(r.offload.begin(), r.offload.end(), [](OffloadMode o) {
            return o.state == Offload::optimizer;
        });
        if (!possible)
            throw usage_error(fmt::format("--offload {} needs {} (got --zero {})", q.offload,
                                          optimizer ? "a ZeRO stage, --zero 1, 2 or 3" : "--zero 3",
                                          q.zero));
    }
    if (q.sp || q.no_sp) r.sequence_parallel = q.sp;
}

/// --time-limit's seconds: none for 0 (no limit).
std::optional<double> parse_time_limit(const std::string& text) {
    char* end = nullptr;
    const double seconds = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !(seconds >= 0) || seconds > 1e9)
        throw usage_error(
            fmt::format("--time-limit must be seconds, 0 for no limit (got '{}')", text));
    return seconds == 0 ? std::nullopt : std::optional<double>(seconds);
}

/// The whole search's request, checked before the model is read.
PlanView plan_view(const PlanOptions& q) {
    check_run_options(q);
    PlanView view;
    device_of(q, view);
    PlanRequest& r = view.request;
    r.base = settings_from(q, q.output.format);
    if (r.base.images.any())  // its search builds each layout's tables itself
        throw usage_error("plan does not take --images yet: give them to an estimate or to fit");
    r.base.seq = parse_count("--seq", q.step.seq, 0);
    r.base.framework.attention = single_attention(q.activation, r.base, "plan");
    const ParallelOptions& p = q.parallel;
    r.global_batch = parse_count("--global-batch", p.global_batch, 0);
    r.first_stage_layers = parse_count("--first-stage-layers", p.first_stage_layers, 0);
    r.last_stage_layers = parse_count("--last-stage-layers", p.last_stage_layers, 0);
    r.max_tp = parse_count("--max-tp", q.max_tp, 0);
    // The time limit bounds a search; a search limit given also refuses one before it starts.
    r.search_limit = parse_count("--search-limit", q.search_limit, no_search_limit);
    r.time_limit = parse_time_limit(q.time_limit);
    // Given, they restrict the search; not given, it tries them all.
    if (!q.step.recompute.empty()) r.modes = parse_modes(q.step.recompute);
    r.recompute_layers = parse_recompute_layers(q.step, true);
    r.partial_recompute = q.step.recompute_layers.empty();  // all, or N, pins it
    if (!q.step.micro_batch.empty())
        r.micro_batches = parse_sizes("--micro-batch", q.step.micro_batch);
    const std::string& counts = q.parallel.microbatches;
    r.microbatches_per_stage = counts == "pp";
    if (!counts.empty() && !r.microbatches_per_stage) {
        if (counts.find_first_not_of("0123456789,") != std::string::npos)
            throw usage_error(fmt::format(
                "--microbatches must be a comma list of counts, or pp (got '{}')", counts));
        r.microbatch_counts = parse_sizes("--microbatches", counts);
    }
    pinned_of(p, r);  // so do degrees and ZeRO stages
    view.top = parse_count("--top", q.top, 10);
    return view;
}

}  // namespace

std::string run_plan(const PlanOptions& q) {
    PlanView view = plan_view(q);
    PlanRequest& r = view.request;
    const ModelFile model = load_model(q.model, q.framework);
    model_default_activations(q, model.architecture, r.base, q.output.format);
    view.model = model.architecture.name;
    const auto start = std::chrono::steady_clock::now();
    try {
        Progress progress("plan", 4096);
        if (q.gpus.empty()) {
            // The fewest GPUs: whole nodes of a GPU whose node size is known, else any count.
            view.fewest_step = r.gpu && r.gpu->gpus_per_node > 0 ? r.gpu->gpus_per_node : 1;
            view.result =
                plan_fewest(model.architecture, r, *view.fewest_step, view.top, std::ref(progress));
        } else {
            view.result = plan_top(model.architecture, r, view.top, std::ref(progress));
        }
    } catch (const search_limit_error& e) {
        const char* gpus = q.gpus.empty() ? "--gpus, " : "";
        throw usage_error(
            fmt::format("{}: narrow it ({}--tp, --pp, --dp, --micro-batch, "
                        "--recompute) or raise --search-limit",
                        e.what(), gpus));
    }
    view.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return in_format(
        q.output.format, [&] { return plan_json(view); }, [&] { return plan_csv(view); },
        [&] { return plan_table(view, unit_of(q.output)); });
}

}  // namespace memcalc::cli
