// memcalc fit: the largest size that fits, per recomputation mode.
#include <fmt/format.h>

#include "memcalc/version.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

const char* searched(const FitRequest& f) {
    return f.dimension == FitDimension::seq ? "seq" : "micro_batch";
}

}  // namespace

std::string fit_table(const FitRequest& f, Unit unit) {
    const bool seq = f.dimension == FitDimension::seq;
    TextTable table({Align::left, Align::right, Align::right, Align::right, Align::right,
                     Align::left, Align::right, Align::right});
    table.row({"recompute", seq ? "longest seq" : "largest micro-batch", "peak", "device",
               "headroom", "peak step", "next size", "its device"});
    for (std::size_t i = 0; i < f.modes.size(); ++i) {
        const FitResult& r = f.results[i];
        std::vector<std::string> row = {recompute_name(f.modes[i])};
        if (r.largest) {
            const FitProbe& p = *r.largest;
            row.insert(
                row.end(),
                {digits(p.size), amount(p.peak, unit), p.device ? amount(*p.device, unit) : "-",
                 amount(Count(f.capacity.value() - p.weighed().value()), unit),
                 p.step + (f.settings.parallel.pp > 1 ? fmt::format(" (stage {})", p.stage) : "")});
        } else {
            row.insert(row.end(), {"none fits", "", "", "", ""});
        }
        if (r.first_over) {
            row.push_back(digits(r.first_over->size));
            row.push_back(r.first_over->runs ? amount(r.first_over->weighed(), unit)
                                             : "cannot run");
        } else {
            row.insert(row.end(), {"(search limit)", ""});
        }
        table.row(row);
    }
    const std::string room =
        f.reserve == Count(0)
            ? amount(f.memory, unit)
            : fmt::format("{} ({} usable after a {} reserve)", amount(f.memory, unit),
                          amount(f.capacity, unit), amount(f.reserve, unit));
    std::string out =
        fmt::format("memcalc fit: {} in {}, {} {}: the {} whose device figure (high end) fits\n",
                    f.model.name, room, seq ? "micro-batch" : "seq", digits(f.fixed),
                    seq ? "longest sequence" : "largest micro-batch");
    if (f.device && f.device->loading)
        out += fmt::format("and whose loading ({}) fits beside the same rows\n",
                           f.device->loading->name);
    if (f.granule > 1) out += fmt::format("searching multiples of {}\n", f.granule);
    out += table.str();
    for (std::size_t i = 0; i < f.modes.size(); ++i)
        if (f.results[i].first_over && !f.results[i].first_over->runs)
            out += fmt::format("  {}: {} {} cannot run: {}\n", recompute_name(f.modes[i]),
                               seq ? "seq" : "micro-batch", f.results[i].first_over->size,
                               f.results[i].first_over->reason);
    return out;
}

nlohmann::json fit_json(const FitRequest& f) {
    using nlohmann::json;
    const auto probe = [](const FitProbe& p) {
        json j = {{"size", p.size}, {"runs", p.runs}};
        if (p.runs)
            j["peak"] = {{"bytes", p.peak.value()},
                         {"step", p.step},
                         {"stage", p.stage},
                         {"device_bytes", p.device ? json(p.device->value()) : json(nullptr)}};
        else
            j["reason"] = p.reason;
        return j;
    };
    json results = json::array();
    for (std::size_t i = 0; i < f.modes.size(); ++i) {
        const FitResult& r = f.results[i];
        json entry = {
            {"recompute", recompute_name(f.modes[i])},
            {"fits", r.largest.has_value()},
            {"largest", r.largest ? json(r.largest->size) : json(nullptr)},
            {"peak", r.largest ? probe(*r.largest)["peak"] : json(nullptr)},
            {"headroom_bytes",
             r.largest ? json(f.capacity.value() - r.largest->weighed().value()) : json(nullptr)},
            {"first_over", r.first_over ? probe(*r.first_over) : json(nullptr)}};
        results.push_back(entry);
    }
    return {{"memcalc", memcalc::version},
            {"schema", memcalc::json_schema},
            {"command", "fit"},
            {"model", f.model.name},
            {"search", searched(f)},
            {f.dimension == FitDimension::seq ? "micro_batch" : "seq", f.fixed},
            {"multiple_of", f.granule},
            {"device_memory_bytes", f.memory.value()},
            {"reserve_bytes", f.reserve.value()},
            {"capacity_bytes", f.capacity.value()},
            {"recipe", f.settings.recipe.name},
            {"activations", activation_model_name(f.settings.activations)},
            {"attention", attention_name(f.settings.framework.attention)},
            {"grad_buffer", grad_buffer_name(f.settings.framework.grad_buffer)},
            {"microbatches", f.settings.parallel.steps_per_batch()},
            {"training", training_name(f.settings.tuning.mode)},
            {"results", results}};
}

std::string fit_csv(const FitRequest& f) {
    // training, then the device figures: appended, so the columns before keep their places
    std::string out =
        "model,search,recompute,largest,peak_bytes,peak_step,peak_stage,headroom_bytes,next_size,"
        "next_peak_bytes,training,device_bytes,next_device_bytes\n";
    const auto device = [](const FitProbe* p) {
        return p && p->runs && p->device ? std::to_string(p->device->value()) : "";
    };
    for (std::size_t i = 0; i < f.modes.size(); ++i) {
        const FitResult& r = f.results[i];
        const FitProbe* l = r.largest ? &*r.largest : nullptr;
        const FitProbe* n = r.first_over ? &*r.first_over : nullptr;
        out += fmt::format(
            "{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(f.model.name), searched(f),
            recompute_name(f.modes[i]), l ? std::to_string(l->size) : "",
            l ? std::to_string(l->peak.value()) : "", l ? l->step : "",
            l ? std::to_string(l->stage) : "",
            l ? std::to_string(f.capacity.value() - l->weighed().value()) : "",
            n ? std::to_string(n->size) : "", n && n->runs ? std::to_string(n->peak.value()) : "",
            training_name(f.settings.tuning.mode), device(l), device(n));
    }
    return out;
}

}  // namespace memcalc::cli
