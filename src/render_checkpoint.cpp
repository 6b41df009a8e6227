// The checkpoint check of a model folder (--config DIR), as a table and as JSON.
#include <fmt/format.h>

#include "model_folder.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using nlohmann::json;
using Align = TextTable::Align;

/// "-1,234" and "1,234": a signed byte count with its digits grouped.
std::string signed_digits(std::int64_t n) {
    const std::uint64_t magnitude =
        n < 0 ? 0 - static_cast<std::uint64_t>(n) : static_cast<std::uint64_t>(n);
    return (n < 0 ? "-" : "") + digits(magnitude);
}

std::string known(const std::optional<std::int64_t>& n) {
    return n ? signed_digits(*n) : "unknown";
}

json signed_or_null(const std::optional<std::int64_t>& n) { return n ? json(*n) : json(nullptr); }
json unsigned_or_null(const std::optional<std::uint64_t>& n) {
    return n ? json(*n) : json(nullptr);
}

}  // namespace

std::string checkpoint_table(const CheckpointCheck& c) {
    std::string out = fmt::format("\nCheckpoint ({}, {} tensors) against memcalc's count:\n",
                                  c.source, c.tensors);
    TextTable t({Align::left, Align::right, Align::right});
    t.row({"", "tensors", "bytes"});
    t.row({"checkpoint", std::to_string(c.tensors), c.bytes ? digits(*c.bytes) : "unknown"});
    t.row({fmt::format("memcalc: {} parameters x {} B ({})", digits(c.parameters),
                       c.bytes_per_element, c.dtype),
           "", digits(c.expected_bytes)});
    t.row({"difference", "", known(c.difference)});
    for (const auto& p : c.parts)
        if (p.tensors > 0)
            t.row({fmt::format("  {} (e.g. {})", p.label, p.first), std::to_string(p.tensors),
                   known(p.bytes)});
    if (c.left_to_unknown) {
        std::uint64_t tensors = 0;
        for (const auto& p : c.parts) tensors += p.bytes ? 0 : p.tensors;
        t.row({"left to the parts of unknown size", std::to_string(tensors),
               signed_digits(*c.left_to_unknown)});
    }
    t.row({"unexplained", "", known(c.unexplained)});
    out += t.str();
    if (c.index_total_size && c.bytes && *c.index_total_size != *c.bytes)
        out += fmt::format("  The index's total_size, {}, differs from the headers' sum.\n",
                           digits(*c.index_total_size));
    if (!c.from_headers) {
        out +=
            "  From the index alone: bytes memcalc cannot derive without the shards' headers show "
            "as unknown.\n";
        return out;
    }
    TextTable d({Align::left, Align::right, Align::right, Align::right});
    d.row({"dtype", "tensors", "elements", "bytes"});
    for (const auto& tally : c.dtypes)
        d.row({tally.dtype, std::to_string(tally.tensors), digits(tally.elements),
               digits(tally.bytes)});
    out += d.str();
    out += fmt::format("  Tensors memcalc has rows for: {} elements, memcalc counts {}.\n",
                       digits(*c.modelled_elements), digits(c.parameters));
    if (c.layer_differences.empty()) {
        out +=
            "  Every layer and the tensors outside the layers hold the elements memcalc's rows "
            "give them.\n";
        return out;
    }
    TextTable l({Align::left, Align::right, Align::right});
    l.row({"differs", "checkpoint", "memcalc"});
    for (const auto& diff : c.layer_differences)
        l.row({diff.layer ? fmt::format("layer {}", *diff.layer) : "outside the layers",
               digits(diff.checkpoint), digits(diff.memcalc)});
    return out + l.str();
}

json checkpoint_json(const CheckpointCheck& c) {
    json parts = json::object();
    for (const auto& p : c.parts)
        parts[p.key] = {{"tensors", p.tensors},
                        {"bytes", signed_or_null(p.bytes)},
                        {"parameters_memcalc_counts", p.modelled},
                        {"first", p.tensors ? json(p.first) : json(nullptr)}};
    json dtypes = json::array();
    for (const auto& d : c.dtypes)
        dtypes.push_back({{"dtype", d.dtype},
                          {"tensors", d.tensors},
                          {"elements", d.elements},
                          {"bytes", d.bytes}});
    json layers = json::array();
    for (const auto& diff : c.layer_differences)
        layers.push_back({{"layer", unsigned_or_null(diff.layer)},
                          {"checkpoint", diff.checkpoint},
                          {"memcalc", diff.memcalc}});
    return {{"source", c.source},
            {"from_headers", c.from_headers},
            {"tensors", c.tensors},
            {"bytes", unsigned_or_null(c.bytes)},
            {"index_total_size", unsigned_or_null(c.index_total_size)},
            {"dtype", c.dtype},
            {"bytes_per_element", c.bytes_per_element},
            {"parameters", c.parameters},
            {"expected_bytes", c.expected_bytes},
            {"difference", signed_or_null(c.difference)},
            {"parts", parts},
            {"unexplained", signed_or_null(c.unexplained)},
            {"left_to_unknown", signed_or_null(c.left_to_unknown)},
            {"modelled_elements", unsigned_or_null(c.modelled_elements)},
            {"dtypes", c.from_headers ? dtypes : json(nullptr)},
            {"layer_differences", c.from_headers ? layers : json(nullptr)}};
}

}  // namespace memcalc::cli
