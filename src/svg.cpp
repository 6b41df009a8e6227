// Pictures as plain SVG, written by memcalc itself: the step timeline as stacked areas, and a
// sweep's peak against the swept size.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "render.hpp"

namespace memcalc::cli {
namespace {

constexpr double width = 960, height = 520, left = 80, right = 220, top = 50, bottom = 70;
constexpr double plot_w = width - left - right, plot_h = height - top - bottom;

const char* colour(const std::string& key) {
    static const std::map<std::string, const char*> colours = {{"weights", "#4e79a7"},
                                                               {"master_weights", "#a0cbe8"},
                                                               {"optimizer_state", "#f28e2b"},
                                                               {"gradients", "#ffbe7d"},
                                                               {"gathered_weights", "#8cd17d"},
                                                               {"kept_activations", "#59a14f"},
                                                               {"rebuilt_activations", "#e15759"},
                                                               {"logits", "#b07aa1"},
                                                               {"activation_gradient", "#9d7660"},
                                                               {"workspace", "#ff9da7"},
                                                               {"weight_copies", "#b6992d"},
                                                               {"none", "#e15759"},
                                                               {"selective", "#4e79a7"},
                                                               {"full", "#59a14f"},
                                                               {"op", "#76b7b2"}};
    const auto it = colours.find(key);
    return it == colours.end() ? "#79706e" : it->second;
}

std::string escape(const std::string& text) {
    std::string out;
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}

/// A round tick step for an axis up to `top_value`.
double tick_step(double top_value) {
    const double raw = top_value / 5, magnitude = std::pow(10.0, std::floor(std::log10(raw)));
    for (double f : {1.0, 2.0, 2.5, 5.0, 10.0})
        if (f * magnitude >= raw) return f * magnitude;
    return 10 * magnitude;
}

struct Axes {
    double y_max;  ///< in display units
    Scale scale;
    double x(double fraction) const { return left + fraction * plot_w; }
    double y(double value) const { return top + plot_h * (1 - value / y_max); }
};

std::string header(const std::string& title) {
    return fmt::format(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{0}\" height=\"{1}\" viewBox=\"0 0 {0} "
        "{1}\" "
        "font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"{0}\" height=\"{1}\" fill=\"white\"/>\n"
        "<text x=\"{2}\" y=\"28\" font-size=\"16\" font-weight=\"bold\">{3}</text>\n",
        width, height, left, escape(title));
}

std::string y_axis(const Axes& a) {
    std::string out;
    const double step = tick_step(a.y_max);
    for (double v = 0; v <= a.y_max + 1e-9; v += step)
        out += fmt::format(
            "<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
            "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
            left, left + plot_w, a.y(v), left - 8, a.y(v) + 4, v);
    out += fmt::format(
        "<text x=\"20\" y=\"{:.1f}\" transform=\"rotate(-90 20 {:.1f})\" "
        "text-anchor=\"middle\">{}</text>\n",
        top + plot_h / 2, top + plot_h / 2, a.scale.name);
    return out;
}

std::string device_line(const Axes& a, std::optional<Count> device, Unit unit) {
    if (!device) return "";
    const double v = static_cast<double>(device->value()) / a.scale.divisor;
    return fmt::format(
        "<g class=\"device-memory\"><line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" "
        "stroke=\"black\" "
        "stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/><text x=\"{1}\" y=\"{3:.1f}\" "
        "text-anchor=\"end\">device memory "
        "{4}</text></g>\n",
        left, left + plot_w, a.y(v), a.y(v) - 5, escape(amount(*device, unit)));
}

/// Each phase named under its span of steps, with a tick where it begins (`sx`: a step's x).
template <class X>
std::string phase_ticks(const std::vector<Step>& steps, X sx) {
    std::string out;
    for (std::size_t i = 0; i < steps.size();) {
        std::size_t j = i;
        while (j + 1 < steps.size() && steps[j + 1].phase == steps[i].phase) ++j;
        const std::string label =
            j == i ? steps[i].name() : fmt::format("{} to {}", steps[i].name(), steps[j].name());
        out += fmt::format(
            "<line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" stroke=\"#999\"/>"
            "<text x=\"{3:.1f}\" y=\"{4:.1f}\" text-anchor=\"middle\" "
            "font-size=\"11\">{5}</text>\n",
            sx(i), top + plot_h, top + plot_h + 6, (sx(i) + sx(j)) / 2,
            top + plot_h + 18 + (j == i ? 14 : 0), escape(label));
        i = j + 1;
    }
    return out;
}

}  // namespace

std::string timeline_svg(const Report& r, std::optional<Count> device, Unit unit) {
    const std::vector<Step>& steps = r.timeline();
    const Count peak = r.peak_step().bytes.total();
    const Count highest = device && *device > peak ? *device : peak;
    const Scale scale = scale_for(highest, unit);
    const Axes a{static_cast<double>(highest.value()) / scale.divisor * 1.08, scale};
    const double n = static_cast<double>(steps.size());
    const auto sx = [&](std::size_t i) { return a.x((static_cast<double>(i) + 0.5) / n); };

    std::string out = header(fmt::format(
        "{}: memory over one training step (seq {}, micro-batch {}, recompute {})", r.model.name,
        r.settings.seq, r.settings.micro_batch, recompute_name(r.settings.recompute)));
    out += y_axis(a);
    // Stacked areas, bottom to top in the categories' order.
    std::vector<double> base(steps.size(), 0);
    std::string legend;
    double legend_y = top;
    for (const auto& c : categories) {
        std::vector<double> value(steps.size());
        bool any = false;
        for (std::size_t i = 0; i < steps.size(); ++i) {
            value[i] = static_cast<double>((steps[i].bytes.*c.member).value()) / scale.divisor;
            any = any || value[i] > 0;
        }
        if (!any) continue;
        std::string d = fmt::format("M{:.1f},{:.1f}", sx(0), a.y(base[0] + value[0]));
        for (std::size_t i = 1; i < steps.size(); ++i)
            d += fmt::format(" L{:.1f},{:.1f}", sx(i), a.y(base[i] + value[i]));
        for (std::size_t i = steps.size(); i-- > 0;)
            d += fmt::format(" L{:.1f},{:.1f}", sx(i), a.y(base[i]));
        out += fmt::format(
            "<path class=\"series\" data-series=\"{}\" d=\"{} Z\" fill=\"{}\" stroke=\"none\"/>\n",
            c.key, d, colour(c.key));
        for (std::size_t i = 0; i < steps.size(); ++i) base[i] += value[i];
        legend += fmt::format(
            "<rect x=\"{0}\" y=\"{1:.1f}\" width=\"12\" height=\"12\" fill=\"{2}\"/>"
            "<text x=\"{3}\" y=\"{4:.1f}\">{5}</text>\n",
            left + plot_w + 16, legend_y, colour(c.key), left + plot_w + 34, legend_y + 10,
            c.label);
        legend_y += 20;
    }
    out += legend;
    out += phase_ticks(steps, sx);
    out += fmt::format(
        "<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">step of the training step</text>\n",
        left + plot_w / 2, top + plot_h + 58);
    // The peak.
    const std::size_t p = r.peak();
    out += fmt::format(
        "<g class=\"peak\"><line x1=\"{0:.1f}\" x2=\"{0:.1f}\" y1=\"{1}\" y2=\"{2}\" "
        "stroke=\"black\"/>"
        "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\" font-weight=\"bold\">peak {4} at "
        "{5}</text></g>\n",
        sx(p), top + plot_h, top + 8, top, escape(amount(peak, unit)), escape(steps[p].name()));
    out += device_line(a, device, unit);
    return out + "</svg>\n";
}

std::string sweep_svg(const std::string& name, const std::vector<SweepPoint>& runs, bool by_seq,
                      std::optional<Count> device, Unit unit) {
    Count highest = device ? *device : Count(0);
    std::uint64_t x_max = 1;
    for (const auto& r : runs) {
        highest = std::max(highest, r.peak);
        x_max = std::max(x_max, by_seq ? r.seq : r.micro_batch);
    }
    const Scale scale = scale_for(highest, unit);
    const Axes a{static_cast<double>(highest.value()) / scale.divisor * 1.08, scale};
    const auto sx = [&](std::uint64_t v) {
        return a.x(static_cast<double>(v) / static_cast<double>(x_max));
    };
    std::string out = header(fmt::format("{}: peak memory against {}", name,
                                         by_seq ? "sequence length" : "micro-batch"));
    out += y_axis(a);
    std::map<std::string, std::vector<const SweepPoint*>> lines;  // one per recomputation mode
    for (const auto& r : runs) lines[recompute_name(r.recompute)].push_back(&r);
    double legend_y = top;
    for (const char* mode : {"none", "selective", "full", "op"}) {
        auto it = lines.find(mode);
        if (it == lines.end()) continue;
        std::string points;
        std::string marks;
        for (const SweepPoint* r : it->second) {
            const std::uint64_t v = by_seq ? r->seq : r->micro_batch;
            const double y = a.y(static_cast<double>(r->peak.value()) / scale.divisor);
            points += fmt::format("{:.1f},{:.1f} ", sx(v), y);
            marks += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3\" fill=\"{}\"/>", sx(v),
                                 y, colour(mode));
        }
        out += fmt::format(
            "<g class=\"series\" data-series=\"{0}\"><polyline points=\"{1}\" fill=\"none\" "
            "stroke=\"{2}\" "
            "stroke-width=\"2\"/>{3}</g>\n",
            mode, points, colour(mode), marks);
        out += fmt::format(
            "<rect x=\"{0}\" y=\"{1:.1f}\" width=\"12\" height=\"12\" fill=\"{2}\"/>"
            "<text x=\"{3}\" y=\"{4:.1f}\">recompute {5}</text>\n",
            left + plot_w + 16, legend_y, colour(mode), left + plot_w + 34, legend_y + 10, mode);
        legend_y += 20;
    }
    const double step = tick_step(static_cast<double>(x_max));
    for (double v = 0; v <= static_cast<double>(x_max) + 1e-9; v += step)
        out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{:g}</text>\n",
                           a.x(v / static_cast<double>(x_max)), top + plot_h + 18, v);
    out += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" text-anchor=\"middle\">{}</text>\n",
                       left + plot_w / 2, top + plot_h + 45,
                       by_seq ? "sequence length" : "micro-batch");
    out += device_line(a, device, unit);
    return out + "</svg>\n";
}

}  // namespace memcalc::cli
