#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "render.hpp"

namespace memcalc::cli {

std::vector<DeviceFigures> every_device(const Report& r, const View& view) {
    if (!view.device_figures || r.timeline().empty()) return {};
    if (r.settings.framework.platform != Platform::cuda) return {};
    return device_figures(r, view.device);
}

std::optional<DeviceFigures> fullest_device(const Report& r, const View& view) {
    std::vector<DeviceFigures> all = every_device(r, view);
    if (all.empty()) return std::nullopt;
    return std::move(all.front());
}

LoadingView loading_view(const Report& r, const View& view,
                         const std::optional<DeviceFigures>& device) {
    const LoadingMethod& method =
        view.loading ? *view.loading : default_loading(r.settings.parallel);
    const LoadingOnDevice on =
        loading_on_device(r, method, view.gpus_per_node, device ? &*device : nullptr);
    LoadingView out{on.peak, on.device_high, std::nullopt};
    if (view.device_memory)
        out.fits = DeviceFit{*view.device_memory, view.reserve}.fits(out.device_high);
    return out;
}

Count verdict_peak(const Report& r, const std::optional<DeviceFigures>& device) {
    return device ? device->high_bytes : r.peak_step().bytes.total();
}

std::string digits(Count n) {
    std::string plain = std::to_string(n.value()), out;
    for (std::size_t i = 0; i < plain.size(); ++i) {
        if (i > 0 && (plain.size() - i) % 3 == 0) out += ',';
        out += plain[i];
    }
    return out;
}

Scale scale_for(Count largest, Unit unit) {
    // Decimal prefixes for GB (the chapter's unit), binary ones for GiB. Nothing above GB: device
    // memory is sold in GB, and "1103.6 GB" compares with 80 GB at a glance where "1.1 TB" does
    // not.
    static constexpr const char* decimal[] = {"B", "kB", "MB", "GB"};
    static constexpr const char* binary[] = {"B", "KiB", "MiB", "GiB"};
    const double base = unit == Unit::gb ? 1000.0 : 1024.0;
    double divisor = 1, value = static_cast<double>(largest.value());
    int prefix = 0;
    while (value >= base && prefix < 3) value /= base, divisor *= base, ++prefix;
    return {divisor, unit == Unit::gb ? decimal[prefix] : binary[prefix]};
}

std::string scaled(Count bytes, const Scale& scale) {
    if (scale.divisor == 1) return std::to_string(bytes.value());
    return fmt::format("{:.1f}", static_cast<double>(bytes.value()) / scale.divisor);
}

std::string amount(Count bytes, Unit unit) {
    const Scale scale = scale_for(bytes, unit);
    return scaled(bytes, scale) + " " + scale.name;
}

std::string layer_formula(const LayerActivations& layer) {
    std::map<Text, std::uint64_t> per_symbol;  // bytes per unit of each symbol, e.g. sbh -> 34
    std::vector<Text> order;
    for (const auto& row : layer.rows) {
        if (!per_symbol.count(row.symbol)) order.push_back(row.symbol);
        per_symbol[row.symbol] += row.copies * row.bytes_per_element;
    }
    std::string out;
    for (const auto& symbol : order)
        out += (out.empty() ? "" : " + ") + fmt::format("{} {}", per_symbol[symbol], symbol);
    return out;
}

std::string csv_field(std::string_view text) {
    if (text.find_first_of(",\"\n") == std::string_view::npos) return std::string(text);
    std::string quoted = "\"";
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
}

}  // namespace memcalc::cli
