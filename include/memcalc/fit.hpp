#pragma once
/// The largest sequence length or micro-batch whose step fits in a device's memory. The peak never
/// falls as either grows, so the answer is found by doubling, then bisection.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memcalc/device_memory.hpp"
#include "memcalc/loading.hpp"
#include "memcalc/estimate.hpp"

namespace memcalc {

enum class FitDimension { seq, micro_batch };

/// One evaluated size: its peak, or why it cannot run at all (a byte count past 64 bits, a sequence
/// past a learned position table).
struct FitProbe {
    std::uint64_t size = 0;
    bool runs = false;
    Count peak;  ///< allocated: the model's tensors
    /// The device figure's high end (device_memory.hpp), where the search weighs it.
    std::optional<Count> device;
    std::string step;         ///< the peak's step ("backward 32")
    std::uint64_t stage = 0;  ///< and its pipeline stage
    std::string reason;       ///< why it does not run

    /// What the verdict weighs: the device figure where there is one, else the peak.
    Count weighed() const { return device ? *device : peak; }
};

struct FitResult {
    std::optional<FitProbe>
        largest;  ///< the largest size that fits; none when even the smallest does not
    std::optional<FitProbe>
        first_over;  ///< the next size up, which does not; none when the search limit fits
};

namespace detail {
inline FitProbe probe(const Architecture& m, Settings settings, FitDimension dimension,
                      std::uint64_t size, std::uint64_t global_batch,
                      const std::optional<DeviceSettings>& device) {
    (dimension == FitDimension::seq ? settings.seq : settings.micro_batch) = size;
    // The peak alone, in closed form; the device figure replays the timelines.
    const bool weighed = device.has_value() && settings.framework.platform == Platform::cuda;
    // A fixed global batch: the micro-batch decides how many micro-batches a step takes.
    if (global_batch != 0 && dimension == FitDimension::micro_batch)
        settings.parallel.microbatches = global_batch / (size * settings.parallel.dp);
    FitProbe p;
    p.size = size;
    try {
        const Report r = estimate(m, settings);
        p.runs = true;
        p.peak = r.peak_step().bytes.total();
        p.step = r.peak_step().name();
        p.stage = r.busiest().stage;
        if (weighed) p.device = weighed_device(r, *device);
    } catch (const error& e) {
        p.reason = e.what();
    }
    return p;
}
}  // namespace detail

/// The largest micro-batch of a step of `global_batch` sequences (one that divides the global batch
/// per replica) whose peak is at most `capacity`. Not a bisection: fewer, larger micro-batches can
/// lower the peak (from one micro-batch a step, no gradient is held), so every divisor is tried.
inline FitResult fit_micro_batch_of(const Architecture& m, const Settings& settings,
                                    std::uint64_t global_batch, Count capacity,
                                    const std::optional<DeviceSettings>& device = std::nullopt) {
    const std::vector<std::uint64_t> sizes = divisors(global_batch / settings.parallel.dp);
    FitResult result;
    std::optional<std::size_t> best;
    std::vector<FitProbe> probes;
    for (std::uint64_t b : sizes) {
        probes.push_back(
            detail::probe(m, settings, FitDimension::micro_batch, b, global_batch, device));
        if (probes.back().runs && probes.back().weighed() <= capacity) best = probes.size() - 1;
    }
    if (best) result.largest = probes[*best];
    const std::size_t next = best ? *best + 1 : 0;
    if (next < probes.size()) result.first_over = probes[next];
    return result;
}

/// Searches multiples of `granule` up to `limit` for the largest size whose peak (with `device`,
/// its device figure's high end) is at most `capacity` bytes; everything else comes from
/// `settings`. The device figure grows with the size but for the allocator's rounding, so the
/// bisection's answer fits and the next size up does not, as for the peak.
inline FitResult fit(const Architecture& m, const Settings& settings, FitDimension dimension,
                     Count capacity, std::uint64_t granule, std::uint64_t limit,
                     const std::optional<DeviceSettings>& device = std::nullopt) {
    const auto fits = [&](const FitProbe& p) { return p.runs && p.weighed() <= capacity; };
    const auto at = [&](std::uint64_t multiple) {
        return detail::probe(m, settings, dimension, multiple * granule, 0, device);
    };
    const std::uint64_t top = limit / granule;  // the largest multiple allowed
    FitResult result;
    if (top == 0) return result;
    FitProbe low = at(1);
    if (!fits(low)) {
        result.first_over = low;
        return result;
    }
    // Double until a size does not fit (or the limit does), then bisect between the two.
    std::uint64_t good = 1, bad = 0;
    while (bad == 0) {
        const std::uint64_t next = good > top / 2 ? top : good * 2;
        if (next == good) break;  // the limit fits
        FitProbe p = at(next);
        if (fits(p)) {
            good = next, low = p;
        } else {
            bad = next, result.first_over = p;
        }
    }
    while (bad != 0 && bad - good > 1) {
        const std::uint64_t middle = good + (bad - good) / 2;
        FitProbe p = at(middle);
        if (fits(p)) {
            good = middle, low = p;
        } else {
            bad = middle, result.first_over = p;
        }
    }
    result.largest = low;  // and first_over, when set, is the probe at bad = good + 1
    return result;
}

}  // namespace memcalc
