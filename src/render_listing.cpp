// The catalogues (presets, recipes, and the ones to come): one listing, rendered in every format by
// one function. A catalogue says what its rows hold; this file says how a table, JSON and CSV show
// it.
#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "gpu_file.hpp"
#include "memcalc/program_facts.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {

namespace {

std::string table_text(const Listing::Column& column, const Listing::Cell& cell) {
    if (const auto* text = std::get_if<std::string>(&cell)) return *text;
    if (const auto* n = std::get_if<std::uint64_t>(&cell)) {
        switch (column.style) {
            case Listing::Style::plain: return std::to_string(*n);
            case Listing::Style::digits: return digits(*n);
            case Listing::Style::bytes: return std::to_string(*n) + " B";
            case Listing::Style::tera: return fmt::format("{:g}", static_cast<double>(*n) / 1e12);
            case Listing::Style::giga: return fmt::format("{:g}", static_cast<double>(*n) / 1e9);
        }
    }
    if (const auto* flag = std::get_if<bool>(&cell)) return *flag ? "yes" : "no";
    if (const auto* x = std::get_if<double>(&cell)) return fmt::format("{:g}", *x);
    return column.style == Listing::Style::tera || column.style == Listing::Style::giga ? "-" : "";
}

std::string csv_text(const Listing::Cell& cell) {
    if (const auto* text = std::get_if<std::string>(&cell)) return csv_field(*text);
    if (const auto* n = std::get_if<std::uint64_t>(&cell)) return std::to_string(*n);
    if (const auto* flag = std::get_if<bool>(&cell)) return *flag ? "true" : "false";
    if (const auto* x = std::get_if<double>(&cell)) return fmt::format("{:g}", *x);
    return "";  // none
}

nlohmann::json json_value(const Listing::Cell& cell) {
    if (const auto* text = std::get_if<std::string>(&cell)) return *text;
    if (const auto* n = std::get_if<std::uint64_t>(&cell)) return *n;
    if (const auto* flag = std::get_if<bool>(&cell)) return *flag;
    if (const auto* x = std::get_if<double>(&cell)) return *x;
    return nullptr;
}

}  // namespace

std::string render_listing(const Listing& listing, Format format) {
    const auto& columns = listing.columns;
    switch (format) {
        case Format::json: {
            nlohmann::json out = nlohmann::json::array();
            for (const auto& row : listing.rows) {
                nlohmann::json entry = nlohmann::json::object();
                for (std::size_t c = 0; c < columns.size(); ++c)
                    entry[columns[c].key] = json_value(row[c]);
                out.push_back(std::move(entry));
            }
            return out.dump(2) + "\n";
        }
        case Format::csv: {
            std::string out;
            for (std::size_t i = 0; i < listing.csv.size(); ++i)
                out += (i ? "," : "") + std::string(columns[listing.csv[i]].key);
            out += "\n";
            for (const auto& row : listing.rows) {
                for (std::size_t i = 0; i < listing.csv.size(); ++i)
                    out += (i ? "," : "") + csv_text(row[listing.csv[i]]);
                out += "\n";
            }
            return out;
        }
        case Format::table: {
            std::vector<TextTable::Align> aligns;
            std::vector<std::string> head;
            for (std::size_t c : listing.table) {
                // A column is numbers when any row's cell is one (a first row may have none).
                const bool number = std::any_of(
                    listing.rows.begin(), listing.rows.end(),
                    [&](const auto& row) { return std::holds_alternative<std::uint64_t>(row[c]); });
                aligns.push_back(number ? TextTable::Align::right : TextTable::Align::left);
                head.emplace_back(columns[c].heading);
            }
            TextTable table(aligns, "");
            table.row(head);
            for (const auto& row : listing.rows) {
                std::vector<std::string> cells;
                for (std::size_t c : listing.table) cells.push_back(table_text(columns[c], row[c]));
                table.row(cells);
            }
            return table.str();
        }
    }
    return {};
}

Listing presets_listing(const std::vector<std::pair<std::string, ModelFile>>& presets) {
    Listing l;
    l.columns = {{"name", "preset"},
                 {"parameters", "parameters", Listing::Style::digits},
                 {"published_parameters", ""},
                 {"description", "description"},
                 {"source", ""}};
    l.table = {0, 1, 3};
    l.csv = {0, 1, 2, 3};
    for (const auto& [name, file] : presets) {
        Listing::Cell published;
        if (file.published_parameters) published = *file.published_parameters;
        l.rows.push_back({name, parameter_table(file.architecture).total().value(), published,
                          file.description, file.source});
    }
    return l;
}

Listing recipes_listing() {
    using S = Listing::Style;
    Listing l;
    l.columns = {
        {"name", "recipe"},
        {"description", "description"},
        {"weight_bytes", "weights"},
        {"gradient_bytes", "grads"},
        {"master_bytes", "master"},
        {"optimizer_bytes", "optimizer"},
        {"activation_bytes", "activations", S::bytes},
        {"bytes_per_parameter", "total", S::bytes},
        // The recipe itself, as a --recipe-file gives it (JSON only).
        {"weights", ""},
        {"gradients", ""},
        {"master", ""},
        {"activations", ""},
        {"optimizer", ""},
        {"state", ""},
        // Where the optimiser's state is not whole bytes per parameter (the two byte columns
        // empty).
        {"optimizer_rule", "optimizer state per tensor"},
        {"autocast", ""},
        // Narrow (fp8, NVFP4) linear layers: as a --recipe-file's "linears" names them.
        {"linears", ""},
        // Linear layers that cast in each pass (torchao's): as a --recipe-file's "linear_casts";
        // where what either kind keeps is read from (torchao's functions, TE's files).
        {"linear_casts", ""},
        {"linear_casts_source", ""}};
    l.table = {0, 2, 3, 4, 5, 7, 6, 14, 1};
    l.csv = {0, 2, 3, 4, 5, 6, 7, 14};
    const auto number = [](std::optional<std::uint64_t> n) {
        return n ? Listing::Cell(*n) : Listing::Cell();
    };
    for (const auto& r : recipes) {
        Listing::Cell master, rule;
        if (r.master) master = std::string(dtype_name(*r.master));
        if (!r.optimizer.rule.empty()) rule = std::string(r.optimizer.rule);
        Listing::Cell linears;
        if (r.linears) linears = narrow_linear_key(*r.linears);
        Listing::Cell casts, source;
        if (r.casts != nullptr) casts = std::string(r.casts->key);
        if (!linears_source(r).empty()) source = std::string(linears_source(r));
        l.rows.push_back({std::string(r.name), std::string(r.description), r.weight_bytes(),
                          r.gradient_bytes(), r.master_bytes(), number(r.optimizer_bytes()),
                          r.activation_bytes(), number(r.bytes_per_parameter()),
                          std::string(dtype_name(r.weights)), std::string(dtype_name(r.gradients)),
                          master, std::string(dtype_name(r.activations)),
                          std::string(r.optimizer.name), std::string(dtype_name(r.state)), rule,
                          r.autocast, linears, casts, source});
    }
    return l;
}

Listing gpus_listing() {
    using S = Listing::Style;
    Listing l;
    l.columns = {{"name", "gpu"},
                 {"memory_bytes", "memory (bytes)", S::digits},
                 {"memory_gib", "GiB"},
                 {"peak_bf16_flops", "bf16 TFLOP/s", S::tera},
                 {"peak_fp8_flops", "fp8 TFLOP/s", S::tera},
                 {"intra_node_bytes_per_second", "in node GB/s", S::giga},
                 {"inter_node_bytes_per_second", "network GB/s", S::giga},
                 {"gpus_per_node", "per node"},
                 {"host_bytes_per_second", "host GB/s", S::giga},
                 {"description", "description"},
                 {"source", "source"},
                 {"performance_source", "FLOP/s source"},
                 {"network_source", "network source"},
                 {"memory_bytes_per_second", "memory GB/s", S::giga},
                 {"gemm_efficiency", ""},
                 {"attention_efficiency", ""},
                 {"intra_node_latency_seconds", ""},
                 {"inter_node_latency_seconds", ""},
                 {"collective_sm_share", ""},
                 {"launch_seconds", ""}};
    l.table = {0, 1, 2, 3, 4, 5, 6, 7, 8, 13, 9};
    l.csv = {0, 1, 9, 3, 4, 5, 6, 7, 8, 13};  // the first three as before: new columns after them
    const auto known = [](std::uint64_t n) -> Listing::Cell {  // 0 is "unknown": JSON null
        if (n == 0) return {};
        return n;
    };
    for (const auto& g : gpus)
        l.rows.push_back({std::string(g.name),
                          g.memory.value(),
                          gib_text(g.memory),
                          known(g.peak_bf16_flops),
                          known(g.peak_fp8_flops),
                          known(g.intra_node_bandwidth),
                          known(g.inter_node_bandwidth),
                          known(g.gpus_per_node),
                          known(g.host_bandwidth),
                          std::string(g.description),
                          std::string(g.source),
                          std::string(g.performance_source),
                          std::string(g.network_source),
                          known(g.memory_bandwidth),
                          g.gemm_efficiency,
                          g.attention_efficiency,
                          g.intra_node_latency,
                          g.inter_node_latency,
                          g.collective_sm_share,
                          g.launch_seconds});
    return l;
}

Listing activation_functions_listing() {
    Listing l;
    l.columns = {{"name", "function"},
                 {"implementation", "implementation"},
                 {"kept_tensors", "kept (s b f)"},
                 {"keeps_output", "keeps output"},
                 {"backward_workspace_tensors", "backward (s b f)"},
                 {"code", "code"},
                 {"kept", ""},
                 {"source", ""}};
    l.table = {0, 1, 2, 3, 4, 5};
    l.csv = {0, 1, 2, 3, 4, 5};
    for (const auto& f : activation_functions) {
        std::string kept;
        for (std::size_t i = 0; i < f.kept_count(); ++i)
            kept += (i ? "; " : "") +
                    (f.kept[i].op.empty() ? "" : std::string(f.kept[i].op) + ": ") +
                    std::string(f.kept[i].tensor);
        l.rows.push_back({std::string(f.name), std::string(kernel_name(f.kernel)),
                          std::uint64_t{f.kept_count()}, std::string(f.keeps_output ? "yes" : "no"),
                          f.backward_workspace, std::string(f.code), kept, std::string(f.source)});
    }
    return l;
}

Listing program_facts_listing() {
    Listing l;
    l.columns = {{"key", "fact (model-file key)"},
                 {"option", "option"},
                 {"values", "values"},
                 {"default", "default"},
                 {"help", "what it says"}};
    l.table = {0, 2, 3, 4};
    l.csv = {0, 1, 2, 3};
    const Architecture defaults;
    for_each_program_fact([&](const auto& row) {
        std::string help(row.help);
        std::replace(help.begin(), help.end(), '\n', ' ');
        l.rows.push_back({std::string(row.key), row.option(), row.choice_list(),
                          std::string(row.name(defaults.*row.member)), help});
    });
    return l;
}

Listing optimizers_listing() {
    Listing l;
    l.columns = {{"name", "optimizer"},
                 {"state", "state"},
                 {"step", "step"},
                 {"temporaries", "step's temporaries"},
                 {"rule", "state per tensor"},
                 {"source", "source"}};
    l.table = {0, 1, 2, 3, 4};
    l.csv = {0, 1, 2, 3, 4, 5};
    for (const Optimizer& o : optimizers) {
        // Its own code decides (bitsandbytes' kernel, a Python loop), else --optimizer-impl.
        const std::string step =
            o.own_impl ? (*o.own_impl == OptimizerImpl::fused
                              ? "fused: its own kernel, whatever --optimizer-impl"
                              : std::string(optimizer_impl_name(*o.own_impl)) +
                                    ": its own Python loop, whatever --optimizer-impl")
                       : "as --optimizer-impl says (fused, foreach or for-loop)";
        const std::string work =
            o.step == StepWork::none
                ? "none"
                : fmt::format(
                      "{} of a tensor, {} of the one before (for-loop){}", o.copies, o.previous,
                      o.step == StepWork::newton_schulz ? "; Newton-Schulz on the largest matrix"
                                                        : "");
        l.rows.push_back({std::string(o.name), std::string(o.slots), step, work,
                          o.rule.empty() ? std::string("uniform: every tensor's n x slots x state")
                                         : std::string(o.rule),
                          o.source.empty() ? std::string("torch.optim") : std::string(o.source)});
    }
    return l;
}

Listing profiles_listing() {
    Listing l;
    l.columns = {{"name", "profile"}};
    for_each_switch([&](const auto& row) {
        l.columns.push_back({row.key.data(), row.heading.data()});  // literals: terminated
    });
    l.columns.push_back({"program_facts", "program facts"});
    l.columns.push_back({"description", "description"});
    l.columns.push_back({"source", "source"});
    for (std::size_t i = 0; i + 1 < l.columns.size(); ++i)
        l.table.push_back(i);  // all but the source
    for (std::size_t i = 0; i + 2 < l.columns.size(); ++i) l.csv.push_back(i);  // the settings
    for (const auto& p : framework_profiles) {
        std::vector<Listing::Cell> row{std::string(p.name)};
        for_each_switch(
            [&](const auto& s) { row.emplace_back(std::string(s.name(p.framework.*s.member))); });
        row.emplace_back(program_fact_list(p.program));
        row.emplace_back(std::string(p.description));
        row.emplace_back(std::string(p.source));
        l.rows.push_back(std::move(row));
    }
    return l;
}

}  // namespace memcalc::cli
