// `--ops`: each kind of layer's op tape (Report::ops) as a table, JSON and CSV.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {

namespace {

/// The name of kind `k` when the model has several kinds of layer, else empty.
std::string kind_name(const Report& r, std::size_t k) {
    return r.ops.size() > 1 ? r.model.layer_kinds[k].name : std::string();
}

nlohmann::json ops_json(const std::vector<tape::OpRow>& rows) {
    nlohmann::json out = nlohmann::json::array();
    for (const tape::OpRow& e : rows)
        out.push_back({{"phase", tape::pass_name(e.pass)},
                       {"op", e.op},
                       {"event", tape::event_name(e.event)},
                       {"tensor", e.tensor},
                       {"bytes", e.bytes.value()},
                       {"live", e.live.value()}});
    return out;
}

}  // namespace

void add_ops_json(nlohmann::json& activations, const Report& r) {
    if (r.ops.empty()) return;
    activations["ops"] = ops_json(r.ops.front());
    if (r.ops.size() < 2 || !activations.contains("layer_kinds")) return;
    for (std::size_t k = 0; k < r.ops.size(); ++k)
        activations["layer_kinds"][k]["ops"] = ops_json(r.ops[k]);
}

std::string ops_table(const Report& r, const View&) {
    std::string out;
    for (std::size_t k = 0; k < r.ops.size(); ++k) {
        const std::string kind = kind_name(r, k);
        if (r.ops[k].empty()) {  // a layer the step skips (mllama's cross-attention, no images)
            out += fmt::format("\nOp tape of one{} layer: no events, the layer skipped\n",
                               kind.empty() ? "" : " " + kind);
            continue;
        }
        out += fmt::format(
            "\nOp tape of one{} layer under {} recomputation, on one rank: each event in program "
            "order,\n"
            "the bytes of its tensor and the layer's live bytes after it (forward from its input "
            "on;\n"
            "a run is the op running with its temporaries).\n",
            kind.empty() ? "" : " " + kind, recompute_name(r.settings.recompute));
        constexpr auto L = TextTable::Align::left, R = TextTable::Align::right;
        TextTable table({L, L, L, L, R, R});
        table.row({"pass", "op", "event", "tensor", "bytes", "live"});
        for (const tape::OpRow& e : r.ops[k])
            table.row({tape::pass_name(e.pass), std::string(e.op), tape::event_name(e.event),
                       std::string(e.tensor), digits(e.bytes), digits(e.live)});
        out += table.str();
    }
    return out;
}

std::string ops_csv(const Report& r) {
    const bool mixed = r.ops.size() > 1;
    std::string out = std::string(mixed ? "kind," : "") + "phase,op,event,tensor,bytes,live\n";
    for (std::size_t k = 0; k < r.ops.size(); ++k)
        for (const tape::OpRow& e : r.ops[k])
            out += (mixed ? csv_field(kind_name(r, k)) + "," : std::string()) +
                   fmt::format("{},{},{},{},{},{}\n", tape::pass_name(e.pass), csv_field(e.op),
                               tape::event_name(e.event), csv_field(e.tensor), e.bytes.value(),
                               e.live.value());
    return out;
}

}  // namespace memcalc::cli
