// memcalc (no subcommand): one estimate, or a sweep over comma lists.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "model_folder.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"

namespace memcalc::cli {

/// --plot draws one file type, and a sweep along one axis.
namespace {

void check_plot(const Request& q, std::size_t seqs, std::size_t batches, std::size_t layouts, std::size_t attentions) {
    if (q.plot.empty()) return;
    const std::string suffix = ".svg";
    if (q.plot.size() <= suffix.size() || q.plot.compare(q.plot.size() - suffix.size(), suffix.size(), suffix) != 0)
        throw usage_error(fmt::format("--plot writes SVG: give a name ending in .svg (got '{}')", q.plot));
    std::vector<std::string> varied;
    if (seqs > 1 && batches > 1) varied.push_back("both --seq and --micro-batch");
    if (layouts > 1) varied.push_back("the layout");
    if (attentions > 1) varied.push_back("--attention");
    if (!varied.empty())
        throw usage_error(fmt::format("--plot draws a sweep over --seq or --micro-batch alone, one line per "
                                      "recomputation mode; this one varies {}",
                                      fmt::join(varied, " and ")));
}

/// `text` with every line but the first indented by `spaces`: a JSON value dumped alone, placed inside
/// an array as nlohmann would have dumped the array.
std::string indented(const std::string& text, std::size_t spaces) {
    std::string out(spaces, ' ');
    for (char c : text) {
        out += c;
        if (c == '\n') out.append(spaces, ' ');
    }
    return out;
}

}  // namespace

/// `out`: what goes to stdout or --output; `files`: a plot asked for, written only once the whole run
/// has succeeded. A sweep is rendered a configuration at a time and keeps no report: its memory does
/// not grow with its length (a table keeps each row's text, to align the columns).
void run_estimate(const Request& q, Spool& out, std::vector<PendingFile>& files) {
    check_run_options(q);
    const std::vector<std::uint64_t> batches = parse_sizes("--micro-batch", q.micro_batch);
    const std::vector<Recompute> modes = parse_modes(q.recompute);
    Settings settings = settings_from(q);  // the rest is set per configuration
    const std::vector<Attention> attentions = attentions_from(q, settings);
    std::vector<std::uint64_t> seqs;  // empty: the model's max_positions
    if (!q.seq.empty()) seqs = parse_sizes("--seq", q.seq);
    ListLengths lists = {{"--seq", seqs.size()}, {"--micro-batch", batches.size()},
                         {"--attention", attentions.size()}, {"--recompute", modes.size()}};
    for (const auto& layout_list : layout_list_lengths(q)) lists.push_back(layout_list);
    check_sweep_size(q, lists);  // before a layout is made or a row spooled

    const ModelFile model = load_model(q);
    const Architecture& arch = model.architecture;
    if (!q.compare.empty() && !arch.layer_kinds.empty())
        throw usage_error(fmt::format("--compare needs layers all alike: Megatron-LM's and DeepSpeed's formulas take one "
                                      "layer shape, and {} has {} kinds of layer",
                                      arch.name, arch.layer_kinds.size()));
    if (seqs.empty()) {
        if (arch.max_positions == 0)
            throw usage_error(fmt::format("--seq is required: {} gives no max_positions to default to", arch.name));
        seqs.push_back(arch.max_positions);
    }

    const std::size_t layouts = parse_layouts(q, batches.front()).size();
    check_plot(q, seqs.size(), batches.size(), layouts, attentions.size());
    const std::size_t configurations = seqs.size() * batches.size() * layouts * attentions.size() * modes.size();
    const bool sweep = configurations > 1;
    if (sweep && (q.per_layer || q.timeline || q.ops))
        throw usage_error(fmt::format("{} shows one configuration; this asks for {} (a sweep)",
                                      q.per_layer ? "--per-layer" : q.ops ? "--ops" : "--timeline",
                                      configurations));
    const Format format = parse_format(q.format);
    View view{unit_of(q), q.timeline, q.compare,
              parse_count("--gpus-per-node", q.gpus_per_node, 8), std::nullopt, std::nullopt};
    if (const auto device = device_memory(q)) view.device_memory = device->bytes;
    if (!q.host_memory.empty()) view.host_memory = parse_size("--host-memory", q.host_memory);

    if (!sweep) {
        settings.seq = seqs.front(), settings.micro_batch = batches.front(), settings.recompute = modes.front();
        settings.framework.attention = attentions.front();
        settings.parallel = parse_layouts(q, batches.front()).front();
        settings.ops = q.ops;
        const Report r = estimate(arch, settings);
        if (!q.plot.empty()) files.push_back({"--plot", q.plot, timeline_svg(r, view.device_memory, view.unit)});
        switch (format) {
            case Format::json: {
                nlohmann::json j = q.per_layer ? per_layer_json(r) : report_json(r, view);
                if (q.ops) add_ops_json(q.per_layer ? j : j["activations"], r);
                if (model.checkpoint && !q.per_layer) j["checkpoint"] = checkpoint_json(*model.checkpoint);
                if (!model.notes.empty()) j["model_notes"] = model.notes;
                out.append(j.dump(2) + "\n");
                break;
            }
            case Format::csv:
                out.append(q.ops         ? ops_csv(r)
                           : q.per_layer ? per_layer_csv(r)
                                         : csv_header() + csv_row(r));
                break;
            case Format::table:
                out.append(q.per_layer ? per_layer_table(r, view) : report_table(r, view));
                if (model.checkpoint && !q.per_layer) out.append(checkpoint_table(*model.checkpoint));
                if (q.ops) out.append(ops_table(r, view));
                for (const std::string& note : model.notes) out.append(fmt::format("\nNote on {}: {}.\n", arch.name, note));
                break;
        }
        return;
    }

    const Estimator estimator(arch);  // the parameter table and its splits, once for the whole sweep
    std::vector<SweepPoint> points;  // what a plot needs of each configuration
    std::optional<SweepTable> table;
    if (format == Format::table) table.emplace(view);
    if (format == Format::csv) out.append(csv_header());
    std::size_t done = 0;
    std::string row;  // one CSV row's buffer, reused
    CsvRowWriter csv_rows;
    Progress progress("sweep", 64);
    std::vector<std::vector<Parallelism>> layouts_of;  // per micro-batch (--global-batch sets the count)
    for (auto b : batches) layouts_of.push_back(parse_layouts(q, b));
    for (auto s : seqs)
        for (std::size_t bi = 0; bi < batches.size(); ++bi)
            for (const auto& layout : layouts_of[bi])
                for (auto attention : attentions) {
                    const std::uint64_t b = batches[bi];
                    settings.seq = s, settings.micro_batch = b, settings.recompute = modes.front();
                    settings.framework.attention = attention;
                    settings.parallel = layout;
                    if (format == Format::csv) {  // the closed form: no table kept, no timeline built
                        for (const Summary& r : estimator.summaries(settings, modes)) {
                            if (!q.plot.empty()) points.push_back({s, b, r.settings.recompute, r.peak.bytes.total()});
                            row.clear();
                            csv_rows.append(row, arch.name, r);
                            out.append(row);
                            progress(++done);
                        }
                        continue;
                    }
                    settings.timelines = format == Format::json;  // only JSON prints them
                    for (auto mode : modes) {
                        settings.recompute = mode;
                        const Report r = estimator.estimate(settings);
                        if (!q.plot.empty()) points.push_back({s, b, mode, r.peak_step().bytes.total()});
                        if (format == Format::json)
                            out.append((done == 0 ? "[\n" : ",\n") + indented(report_json(r, view).dump(2), 2));
                        else
                            table->add(r);
                        progress(++done);
                    }
                }
    if (format == Format::json) out.append("\n]\n");
    if (table) out.append(table->str());
    if (table && model.checkpoint) out.append(checkpoint_table(*model.checkpoint));
    // A sweep plots the peak against the sequence (or, when only it varies, the micro-batch).
    if (!q.plot.empty())
        files.push_back({"--plot", q.plot,
                         sweep_svg(arch.name, points, seqs.size() > 1 || batches.size() == 1, view.device_memory, view.unit)});
}

}  // namespace memcalc::cli
