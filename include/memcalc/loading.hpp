#pragma once
/// Loading: what materialising the model and wrapping it for the step holds before the first
/// step, on the device and on each node's host. A row per loading method, with its source
/// (validation/published/loading.md has them in full); where none says, the row leans high.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>

#include "memcalc/device_memory.hpp"
#include "memcalc/estimate.hpp"

namespace memcalc {

/// What a rank's device holds at its loading peak.
enum class DeviceLoad : std::uint8_t {
    rank_weights,       ///< its weights unsharded: a model moved whole before any sharding
    shards_and_unit,    ///< its shards and one wrapped unit (a layer) unsharded
    shards_and_tensor,  ///< its shards and one full parameter, broadcast one at a time
    two_rank_weights,   ///< its weights unsharded twice: a full state dict loaded into them
};

/// What a node's host memory holds at the peak, in copies of the whole model.
enum class HostLoad : std::uint8_t {
    none,            ///< loaded shard by shard straight to the device: one checkpoint shard at most
    model_per_node,  ///< rank 0 of the node reads the model, the others build on the meta device
    model_per_rank,  ///< every rank reads the whole model
    two_per_rank,    ///< every rank builds a randomly initialised model and reads the state dict
};

struct LoadingMethod {
    Text name, description;
    DeviceLoad device;
    HostLoad host;
    Text source;
};

inline constexpr std::array<LoadingMethod, 6> loading_methods{{
    {"to-device", "from_pretrained straight onto the device, shard by shard (device_map)",
     DeviceLoad::rank_weights, HostLoad::none,
     "transformers PR #16621 (low_cpu_mem_usage), #36963 (meta init by default)"},
    {"host-then-move", "from_pretrained on the host with low_cpu_mem_usage=False, then .to(device)",
     DeviceLoad::rank_weights, HostLoad::two_per_rank,
     "transformers docs, Large model loading: a random model and the state dict"},
    {"fsdp1", "every rank reads the model; FSDP(device_id=...) moves and shards a unit at a time",
     DeviceLoad::shards_and_unit, HostLoad::model_per_rank,
     "Hugging Face blog (FSDP with Llama 2 70B); llama-cookbook#77; transformers#25107"},
    {"fsdp1-rank0",
     "rank 0 reads the model, the others build on meta; sync_module_states broadcasts a unit "
     "at a time (accelerate's fsdp_cpu_ram_efficient_loading)",
     DeviceLoad::shards_and_unit, HostLoad::model_per_node,
     "accelerate docs/source/usage_guides/fsdp.md:94, utils/dataclasses.py:1956-1968"},
    {"fsdp2-on-device", "fully_shard of a model already on the device, a full state dict loaded",
     DeviceLoad::two_rank_weights, HostLoad::model_per_rank,
     "accelerate utils/fsdp_utils.py:725-728 (the spike it warns of)"},
    {"fsdp2-meta",
     "meta init, fully_shard, the full state dict broadcast from rank 0 a parameter at a time",
     DeviceLoad::shards_and_tensor, HostLoad::model_per_node,
     "accelerate utils/fsdp_utils.py:467-551 (fsdp2_load_full_state_dict)"},
}};

/// The row named `name`; nullptr for an unknown one.
inline const LoadingMethod* loading_method(std::string_view name) {
    for (const LoadingMethod& m : loading_methods)
        if (m.name == name) return &m;
    return nullptr;
}

/// What a layout loads by unless told: sharded weights (ZeRO-3, FSDP) are wrapped a unit at a
/// time from every rank's copy (the plainest script's); the others load straight to the device.
inline const LoadingMethod& default_loading(const Parallelism& p) {
    return *loading_method(p.zero >= 3 && p.dp > 1 ? "fsdp1" : "to-device");
}

/// The loading peak of one rank.
struct LoadingPeak {
    const LoadingMethod* method = nullptr;
    Count device_bytes;         ///< the rank's device at the loading peak
    Count host_bytes_per_node;  ///< a node's host memory at the peak
    bool above_step = false;    ///< the device's loading peak passes the step's allocated peak
};

namespace detail {
/// The rank's largest layer and largest parameter, unsharded, in elements on the rank.
inline std::pair<Count, Count> largest_unit_and_tensor(const Report& r) {
    const ParameterTable& t = *r.parameters;
    const std::uint64_t tp = r.settings.parallel.tp;
    Count unit, tensor;
    for (std::size_t k = 0; k < t.kinds; ++k) unit = std::max(unit, t.per_layer(k));
    for (const ParamRow& row : t.rows) tensor = std::max(tensor, row.count);
    return {ceil_div(unit, tp), tensor};  // a parameter is broadcast whole before it is split
}
}  // namespace detail

/// `rank`'s loading peak under `method`, with `ranks_per_node` ranks sharing a host.
inline LoadingPeak loading_peak(const Report& r, const RankReport& rank,
                                const LoadingMethod& method, std::uint64_t ranks_per_node) {
    LoadingPeak out;
    out.method = &method;
    const std::uint64_t bytes = r.settings.recipe.weight_bytes();
    const Count whole = rank.parameters * bytes;  // the rank's weights, unsharded
    const Count shards = rank.state.weights;      // as the step keeps them
    const auto [unit, tensor] = detail::largest_unit_and_tensor(r);
    switch (method.device) {
        case DeviceLoad::rank_weights: out.device_bytes = whole; break;
        case DeviceLoad::shards_and_unit: out.device_bytes = shards + unit * bytes; break;
        case DeviceLoad::shards_and_tensor: out.device_bytes = shards + tensor * bytes; break;
        case DeviceLoad::two_rank_weights: out.device_bytes = whole * 2; break;
    }
    const Count model = r.parameter_count * bytes;
    const std::uint64_t ranks = std::max<std::uint64_t>(ranks_per_node, 1);
    switch (method.host) {
        case HostLoad::none: break;
        case HostLoad::model_per_node: out.host_bytes_per_node = model; break;
        case HostLoad::model_per_rank: out.host_bytes_per_node = model * ranks; break;
        case HostLoad::two_per_rank: out.host_bytes_per_node = model * (2 * ranks); break;
    }
    out.above_step = out.device_bytes > rank.peak_step().bytes.total();
    return out;
}

/// The rank whose device peaks highest while loading.
inline LoadingPeak fullest_loading(const Report& r, const LoadingMethod& method,
                                   std::uint64_t ranks_per_node) {
    LoadingPeak most;
    for (const RankReport& rank : r.ranks) {
        const LoadingPeak here = loading_peak(r, rank, method, ranks_per_node);
        if (!most.method || here.device_bytes > most.device_bytes) most = here;
    }
    return most;
}

/// The loading peak with what the step's device figure `d` holds beside its tensors (the rows
/// and the allocator's fragmentation, leaning high) next to it; none: the peak alone.
struct LoadingOnDevice {
    LoadingPeak peak;
    Count device_high;
};
inline LoadingOnDevice loading_on_device(const Report& r, const LoadingMethod& method,
                                         std::uint64_t ranks_per_node, const DeviceFigures* d) {
    LoadingOnDevice out;
    // A host holds no more ranks than the layout has.
    out.peak = fullest_loading(r, method, std::min(ranks_per_node, r.settings.parallel.devices()));
    const Count beside(d ? d->high_bytes.value() - std::min(d->high_bytes, d->allocated).value()
                         : 0);
    out.device_high = out.peak.device_bytes + beside;
    return out;
}

/// What fit and plan weigh: the fullest device's figure (its high end), or where `s` names a
/// loading method and its peak on the device is higher, that.
inline Count weighed_device(const Report& r, const DeviceSettings& s) {
    const DeviceFigures d = device_figures(r, s).front();
    if (!s.loading) return d.high_bytes;
    return std::max(d.high_bytes,
                    loading_on_device(r, *s.loading, s.ranks_per_node, &d).device_high);
}

}  // namespace memcalc
