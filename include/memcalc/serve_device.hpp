#pragma once
/// What a serving rank's device shows: the report's tensors replayed through the caching
/// allocator in the order an engine makes them (the libraries' workspaces and the CUDA graphs'
/// pool, every weight, each layer's KV cache, then a prefill's temporaries, freed after it), and
/// the rows outside the allocator (the CUDA context, NCCL under tensor parallelism).
#include <cstdint>
#include <vector>

#include "memcalc/allocator.hpp"
#include "memcalc/device_memory.hpp"
#include "memcalc/outside.hpp"
#include "memcalc/serve.hpp"

namespace memcalc {

/// A serving rank's three figures and their band.
struct ServeDevice {
    Count allocated;              ///< the report's peak: the model's tensors
    Count reserved;               ///< the allocator's peak, the rows inside it at their figures
    Count reserved_high;          ///< the same with the rows inside it at their high ends
    Count loaded_bytes;           ///< reserved once the weights are loaded, before the cache
    std::size_t segments = 0;     ///< the allocator's segments at its peak
    std::vector<DeviceRow> rows;  ///< inside the allocator first, then outside it
    Count bytes, low_bytes, high_bytes;  ///< reserved plus what lies outside: nvidia-smi's figure
    bool simulated = true;  ///< false past 2^56 bytes or most_pieces tensors: reserved = allocated
};

namespace detail {

/// The allocator's reserved peak over `r`'s tensors after `before`, and its reserved bytes once
/// the weights are in; {peak, loaded, segments}.
struct ServeReplay {
    Count peak, loaded;
    std::size_t segments = 0;
    bool out_of_memory = false;  ///< past the simulator's address space: not a figure
};

inline ServeReplay replay_serving(const ServeReport& r, const std::vector<AllocatorEvent>& before,
                                  const AllocatorConfig& config) {
    CachingAllocatorSimulator sim(config);
    ServeReplay out;
    std::uint64_t id = 0;
    const auto note_peak = [&] {
        if (sim.stats().reserved_bytes > out.peak.value())
            out.peak = Count(sim.stats().reserved_bytes), out.segments = sim.stats().segments;
    };
    const auto make = [&](const std::vector<TensorRun>& runs) {
        for (const TensorRun& run : runs)
            for (std::uint64_t i = 0; i < run.count && !out.out_of_memory; ++i)
                out.out_of_memory = !sim.alloc(++id, run.bytes.value());
        note_peak();
    };
    for (const AllocatorEvent& e : before) out.out_of_memory |= !sim.alloc(++id, e.bytes, e.stream);
    make(r.weight_tensors);
    out.loaded = Count(sim.stats().reserved_bytes);
    make(r.cache_tensors);
    const std::uint64_t first_temporary = id + 1;
    make(r.prefill_tensors);
    if (!out.out_of_memory)
        for (std::uint64_t t = first_temporary; t <= id; ++t) sim.free(t);
    return out;
}

/// Whether `r`'s tensors are few and small enough to replay.
inline bool replayable(const ServeReport& r) {
    std::uint64_t tensors = 0;
    for (const auto* runs : {&r.weight_tensors, &r.cache_tensors, &r.prefill_tensors})
        for (const TensorRun& run : *runs) tensors += run.count;
    return tensors <= most_simulated_steps * 8 &&
           r.peak() <= Count(allocator_rules::kLargestRequest);
}

}  // namespace detail

/// The device figures of serving as `r` reports under `s` (its ranks, whether graphs are captured)
/// on `device`.
inline ServeDevice serve_device(const ServeReport& r, const ServeSettings& s,
                                const DeviceSettings& device) {
    ServeDevice out;
    out.allocated = r.peak();
    Parallelism p;
    p.tp = s.tp;
    out.rows = device_rows(Framework{}, p, device.gpu, {outside_rows::Job::serving, s.cuda_graphs});
    const auto replay = [&](Count DeviceRow::*which) {
        return detail::replay_serving(r, detail::workspace_events(out.rows, which),
                                      device.allocator);
    };
    const detail::ServeReplay main =
        detail::replayable(r) ? replay(&DeviceRow::bytes) : detail::ServeReplay{{}, {}, 0, true};
    const detail::ServeReplay high = main.out_of_memory ? main : replay(&DeviceRow::high_bytes);
    if (main.out_of_memory || high.out_of_memory) {  // every figure the tensors and the rows
        out.simulated = false;
        out.reserved = out.allocated + rows_inside(out.rows, &DeviceRow::bytes);
        out.reserved_high = out.allocated + rows_inside(out.rows, &DeviceRow::high_bytes);
        out.loaded_bytes = r.weights + r.lora;
    } else {
        out.reserved = main.peak, out.loaded_bytes = main.loaded, out.segments = main.segments;
        out.reserved_high = std::max(out.reserved, high.peak);
    }
    out.bytes = out.reserved + rows_outside(out.rows, &DeviceRow::bytes);
    out.low_bytes = out.reserved + rows_outside(out.rows, &DeviceRow::low_bytes);
    out.high_bytes = out.reserved_high + rows_outside(out.rows, &DeviceRow::high_bytes);
    return out;
}

/// serve_fit weighing the device figure's high end: what fits on a device of `capacity` bytes.
inline ServeFit serve_fit_on_device(const Architecture& m, const ServeSettings& s, Count capacity,
                                    const DeviceSettings& device) {
    return serve_fit(m, s, capacity, [&](const ServeReport& r, const ServeSettings& at) {
        return serve_device(r, at, device).high_bytes;
    });
}

}  // namespace memcalc
