// memcalc fit: the longest sequence or largest micro-batch that fits.
#include <fmt/format.h>

#include <limits>
#include <numeric>
#include <string>

#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"

namespace memcalc::cli {

std::string run_fit(const Request& q) {
    check_run_options(q);
    const std::optional<DeviceMemory> device = device_memory(q);
    if (!device) throw usage_error("fit needs --device-memory or --gpu, e.g. --device-memory 80GB or --gpu h100-sxm");
    const Count memory = device->bytes;
    const Count reserve = parse_size("--reserve", q.reserve);
    if (reserve >= memory) throw usage_error(fmt::format("--reserve {} leaves nothing of {}", q.reserve, device->given_by));
    // With --seq fixed, the micro-batch is searched; otherwise the sequence, at --micro-batch (1).
    FitRequest fit;
    fit.dimension = q.seq.empty() ? FitDimension::seq : FitDimension::micro_batch;
    fit.fixed = fit.dimension == FitDimension::seq ? parse_count("--micro-batch", q.micro_batch, 1)
                                                  : parse_count("--seq", q.seq, 0);
    fit.memory = memory, fit.reserve = reserve;
    fit.capacity = Count(memory.value() - reserve.value());
    fit.modes = parse_modes(q.recompute);

    const ModelFile model = load_model(q);
    fit.model = model.architecture;
    Settings settings = settings_from(q);
    settings.framework.attention = single_attention(q, settings, "fit");
    (fit.dimension == FitDimension::seq ? settings.micro_batch : settings.seq) = fit.fixed;
    const auto layouts = parse_layouts(q, fit.dimension == FitDimension::micro_batch ? 1 : fit.fixed);
    if (layouts.size() != 1) throw usage_error("fit takes one layout: no comma lists for --dp, --tp, --pp or --zero");
    settings.parallel = layouts.front();
    // Sizes the layout can split evenly: the sequence over context (and sequence-parallel) ranks.
    const Parallelism& p = settings.parallel;
    fit.granule = parse_count("--multiple-of", q.multiple_of, 1);
    if (fit.dimension == FitDimension::seq) {
        const std::uint64_t split = p.cp * (p.sequence_parallel ? p.tp : 1);  // both at most 2^24
        const std::uint64_t common = std::gcd(fit.granule, split);
        if (fit.granule / common > std::numeric_limits<std::uint64_t>::max() / split)
            throw usage_error(fmt::format("--multiple-of {} with cp x tp = {}: their least common multiple exceeds 2^64",
                                          fit.granule, split));
        fit.granule = fit.granule / common * split;
    }
    // A layout that cannot run at any size is a mistake in the request, not an answer.
    validate(fit.model);
    validate(p, fit.model, fit.dimension == FitDimension::seq ? fit.granule : fit.fixed);
    const std::uint64_t limit = fit.dimension == FitDimension::seq && fit.model.position == Position::learned
                                    ? fit.model.learned_positions()
                                    : (1ULL << 40);
    const std::uint64_t global = parse_count("--global-batch", q.global_batch, 0);
    if (global > max_microbatches)
        throw usage_error(fmt::format("--global-batch {} exceeds 2^40 sequences per step", global));
    if (global != 0 && fit.dimension == FitDimension::micro_batch && fit.granule != 1)
        throw usage_error("fit takes --multiple-of or --global-batch when it searches the micro-batch, not both");
    for (auto mode : fit.modes) {
        settings.recompute = mode;
        fit.results.push_back(global != 0 && fit.dimension == FitDimension::micro_batch
                                  ? fit_micro_batch_of(fit.model, settings, global, fit.capacity)
                                  : memcalc::fit(fit.model, settings, fit.dimension, fit.capacity, fit.granule, limit));
    }
    fit.settings = settings;
    return in_format(
        q.format, [&] { return fit_json(fit); }, [&] { return fit_csv(fit); }, [&] { return fit_table(fit, unit_of(q)); });
}

}  // namespace memcalc::cli
