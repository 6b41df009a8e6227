#pragma once
/// What the device shows for a training step: the bytes the caching allocator reserves (its
/// tensors, and the libraries' workspaces it hands out), and beside it what the CUDA context and
/// the communicators hold. Each such thing is a sourced row (outside.hpp) chosen by the GPU, the
/// PyTorch version and the layout; where a figure is uncertain it has a low and a high end, and
/// the device figure's band is their sums.
#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "memcalc/outside.hpp"
#include "memcalc/reserved.hpp"

namespace memcalc {

struct LoadingMethod;  // loading.hpp

/// What a device's figures depend on beyond the estimate.
struct DeviceSettings {
    AllocatorConfig allocator;
    /// The GPU's facts (outside.hpp's gpu_facts_of); none: unknown, every row leans high.
    std::optional<outside_rows::GpuFacts> gpu;
    /// How the model is loaded, where fit and plan weigh loading too (loading.hpp); none: not.
    const LoadingMethod* loading = nullptr;
    std::uint64_t ranks_per_node = 8;  ///< sharing a host while loading
};

/// The rows outside (or inside) the allocator together, at `which` of their figures.
inline Count rows_outside(const std::vector<DeviceRow>& rows, Count DeviceRow::*which,
                          bool inside = false) {
    Count sum;
    for (const DeviceRow& r : rows)
        if (r.in_allocator == inside) sum += Count(r.count) * (r.*which);
    return sum;
}
inline Count rows_inside(const std::vector<DeviceRow>& rows, Count DeviceRow::*which) {
    return rows_outside(rows, which, true);
}

/// One rank's three figures and their band.
struct DeviceFigures {
    std::uint64_t stage = 0;      ///< the rank's pipeline stage
    Count allocated;              ///< the estimate's peak: the model's tensors
    ReservedPeak reserved;        ///< the allocator's, the libraries' workspaces among its tensors
    std::vector<DeviceRow> rows;  ///< inside the allocator first, then outside it
    Count bytes, low_bytes, high_bytes;  ///< reserved and what lies outside: nvidia-smi's

    /// The rows outside the allocator together, at `which` of their figures.
    Count outside_bytes(Count DeviceRow::*which = &DeviceRow::bytes) const {
        return rows_outside(rows, which);
    }
};

namespace detail {

/// The libraries' workspaces, made before forward 1's first matmul and never freed, as events
/// with ids no step uses.
inline std::vector<AllocatorEvent> workspace_events(const std::vector<DeviceRow>& rows,
                                                    Count DeviceRow::*which) {
    std::vector<AllocatorEvent> out;
    std::uint64_t id = std::uint64_t{1} << 62;
    for (const DeviceRow& r : rows)
        if (r.in_allocator)
            for (std::uint64_t i = 0; i < r.count; ++i)
                out.push_back(alloc_event(id++, (r.*which).value()));
    return out;
}

inline DeviceFigures rank_figures(const Report& r, const RankReport& rank,
                                  const DeviceSettings& s) {
    DeviceFigures out;
    out.stage = rank.stage;
    out.allocated = rank.peak_step().bytes.total();
    out.rows = device_rows(r.settings, s.gpu);
    out.reserved =
        reserved_peak(r, rank, s.allocator, workspace_events(out.rows, &DeviceRow::bytes),
                      workspace_events(out.rows, &DeviceRow::high_bytes));
    out.bytes = out.reserved.bytes + out.outside_bytes();
    out.low_bytes = out.reserved.bytes + out.outside_bytes(&DeviceRow::low_bytes);
    out.high_bytes = out.reserved.high_bytes + out.outside_bytes(&DeviceRow::high_bytes);
    return out;
}

}  // namespace detail

/// The device figures of every rank of `r` (its timelines built), the fullest device's first.
inline std::vector<DeviceFigures> device_figures(const Report& r, const DeviceSettings& s) {
    std::vector<DeviceFigures> out;
    for (const RankReport& rank : r.ranks) out.push_back(detail::rank_figures(r, rank, s));
    std::stable_sort(out.begin(), out.end(), [](const DeviceFigures& a, const DeviceFigures& b) {
        return a.high_bytes > b.high_bytes;
    });
    return out;
}

}  // namespace memcalc
