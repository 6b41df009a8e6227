// memcalc fit: the longest sequence or largest micro-batch that fits.
#include <fmt/format.h>

#include <limits>
#include <numeric>
#include <string>

#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"

namespace memcalc::cli {

namespace {

/// What fit searches, at what size, and in how much memory: checked before the model is read.
FitRequest fit_request(const FitOptions& q) {
    check_run_options(q);
    const std::optional<UsableMemory> device = usable_memory(q.device);
    if (!device)
        throw usage_error(
            "fit needs --device-memory or --gpu, e.g. --device-memory 80GB or --gpu h100-sxm");
    // With --seq fixed, the micro-batch is searched; otherwise the sequence, at --micro-batch (1).
    FitRequest fit;
    fit.dimension = q.step.seq.empty() ? FitDimension::seq : FitDimension::micro_batch;
    fit.fixed = fit.dimension == FitDimension::seq
                    ? parse_count("--micro-batch", q.step.micro_batch, 1)
                    : parse_count("--seq", q.step.seq, 0);
    fit.memory = device->rule.memory, fit.reserve = device->rule.reserve;
    fit.capacity = device->rule.usable();
    fit.device = device_settings(q.device);
    fit.device->loading = parse_loading(q.parallel.loading);
    fit.device->ranks_per_node = parse_count("--gpus-per-node", q.parallel.gpus_per_node, 8);
    fit.modes = parse_modes(q.step.recompute);
    return fit;
}

/// The sizes the layout can split evenly: the sequence over context (and sequence-parallel)
/// ranks, in multiples of --multiple-of.
std::uint64_t granule_of(const FitOptions& q, const FitRequest& fit, const Parallelism& p) {
    std::uint64_t granule = parse_count("--multiple-of", q.multiple_of, 1);
    if (fit.dimension != FitDimension::seq) return granule;
    const std::uint64_t split = p.cp * (p.sequence_parallel ? p.tp : 1);  // both at most 2^24
    const std::uint64_t common = std::gcd(granule, split);
    if (granule / common > std::numeric_limits<std::uint64_t>::max() / split)
        throw usage_error(fmt::format(
            "--multiple-of {} with cp x tp = {}: their least common multiple exceeds 2^64", granule,
            split));
    return granule / common * split;
}

}  // namespace

std::string run_fit(const FitOptions& q) {
    FitRequest fit = fit_request(q);
    const ModelFile model = load_model(q.model, q.framework);
    fit.model = model.architecture;
    Settings settings = settings_from(q, q.output.format);
    model_default_activations(q, model.architecture, settings, q.output.format);
    settings.framework.attention = single_attention(q.activation, settings, "fit");
    (fit.dimension == FitDimension::seq ? settings.micro_batch : settings.seq) = fit.fixed;
    const auto layouts = parse_layouts(q.parallel, q.step,
                                       fit.dimension == FitDimension::micro_batch ? 1 : fit.fixed);
    if (layouts.size() != 1)
        throw usage_error("fit takes one layout: no comma lists for --dp, --tp, --pp or --zero");
    settings.parallel = layouts.front();
    const Parallelism& p = settings.parallel;
    fit.granule = granule_of(q, fit, p);
    // A layout that cannot run at any size is a mistake in the request, not an answer.
    validate(fit.model);
    validate(p, fit.model, fit.dimension == FitDimension::seq ? fit.granule : fit.fixed);
    const std::uint64_t limit =
        fit.dimension == FitDimension::seq && fit.model.position == Position::learned
            ? fit.model.learned_positions()
            : (1ULL << 40);
    const std::uint64_t global = parse_count("--global-batch", q.parallel.global_batch, 0);
    if (global > max_microbatches)
        throw usage_error(fmt::format("--global-batch {} exceeds 2^40 sequences per step", global));
    const bool per_global = global != 0 && fit.dimension == FitDimension::micro_batch;
    if (per_global && fit.granule != 1)
        throw usage_error(
            "fit takes --multiple-of or --global-batch when it searches the micro-batch, not both");
    for (auto mode : fit.modes) {
        settings.recompute = mode;
        fit.results.push_back(
            per_global ? fit_micro_batch_of(fit.model, settings, global, fit.capacity, fit.device)
                       : memcalc::fit(fit.model, settings, fit.dimension, fit.capacity, fit.granule,
                                      limit, fit.device));
    }
    fit.settings = settings;
    return in_format(
        q.output.format, [&] { return fit_json(fit); }, [&] { return fit_csv(fit); },
        [&] { return fit_table(fit, unit_of(q.output)); });
}

}  // namespace memcalc::cli
