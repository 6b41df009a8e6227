// memcalc (no subcommand): one estimate, or a sweep over comma lists.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "model_folder.hpp"
#include "ordered_parallel.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"

namespace memcalc::cli {

namespace {

/// --plot draws one file type, and a sweep along one axis.
void check_plot(const ReportOptions& q, std::size_t seqs, std::size_t batches, std::size_t layouts,
                std::size_t attentions) {
    if (q.plot.empty()) return;
    const std::string suffix = ".svg";
    if (q.plot.size() <= suffix.size() ||
        q.plot.compare(q.plot.size() - suffix.size(), suffix.size(), suffix) != 0)
        throw usage_error(
            fmt::format("--plot writes SVG: give a name ending in .svg (got '{}')", q.plot));
    std::vector<std::string> varied;
    if (seqs > 1 && batches > 1) varied.push_back("both --seq and --micro-batch");
    if (layouts > 1) varied.push_back("the layout");
    if (attentions > 1) varied.push_back("--attention");
    if (!varied.empty())
        throw usage_error(
            fmt::format("--plot draws a sweep over --seq or --micro-batch alone, one "
                        "line per recomputation mode; this one varies {}",
                        fmt::join(varied, " and ")));
}

/// `text` with every line but the first indented by `spaces`: a JSON value dumped alone, placed
/// inside an array as nlohmann would have dumped the array.
std::string indented(const std::string& text, std::size_t spaces) {
    std::string out(spaces, ' ');
    for (char c : text) {
        out += c;
        if (c == '\n') out.append(spaces, ' ');
    }
    return out;
}

/// An estimate's lists and settings, parsed and checked before any configuration is made.
struct EstimateRun {
    std::vector<std::uint64_t> batches, seqs;
    std::vector<Recompute> modes;
    std::vector<Attention> attentions;
    Settings settings;  ///< the rest is set per configuration
    ModelFile model;
    Format format = Format::table;
    View view;
    bool sweep = false;
};

/// The lists, the settings and the model, checked in the order the errors are reported.
EstimateRun lists_and_model(const EstimateOptions& q) {
    check_run_options(q);
    EstimateRun run;
    run.batches = parse_sizes("--micro-batch", q.step.micro_batch);
    run.modes = parse_modes(q.step.recompute);
    run.settings = settings_from(q, q.output.format);
    run.attentions = attentions_from(q.activation, run.settings);
    if (!q.step.seq.empty()) run.seqs = parse_sizes("--seq", q.step.seq);  // empty: max_positions
    ListLengths lists = {{"--seq", run.seqs.size()},
                         {"--micro-batch", run.batches.size()},
                         {"--attention", run.attentions.size()},
                         {"--recompute", run.modes.size()}};
    for (const auto& layout_list : layout_list_lengths(q.parallel)) lists.push_back(layout_list);
    check_sweep_size(q.report.sweep_limit, lists);  // before a layout is made or a row spooled

    run.model = load_model(q.model, q.framework);
    const Architecture& arch = run.model.architecture;
    model_default_activations(q, arch, run.settings, q.output.format);
    if (!q.report.compare.empty() && !arch.layer_kinds.empty())
        throw usage_error(
            fmt::format("--compare needs layers all alike: Megatron-LM's and "
                        "DeepSpeed's formulas take one layer shape, and {} has {} "
                        "kinds of layer",
                        arch.name, arch.layer_kinds.size()));
    if (run.seqs.empty()) {
        if (arch.max_positions == 0)
            throw usage_error(fmt::format(
                "--seq is required: {} gives no max_positions to default to", arch.name));
        run.seqs.push_back(arch.max_positions);
    }
    return run;
}

/// EstimateRun: also whether it is a sweep, the format and the view.
EstimateRun estimate_run(const EstimateOptions& q) {
    EstimateRun run = lists_and_model(q);
    const std::vector<Parallelism> parsed = parse_layouts(q.parallel, q.step, run.batches.front());
    const std::size_t layouts = parsed.size();
    for (const Parallelism& p : parsed)
        if (p.zero > 0 && p.dp * p.cp == 1 && q.output.format == "table") {
            pending_notes().push_back(fmt::format(
                "--zero {} over one data-parallel rank shards nothing{}", p.zero,
                p.zero == 3 ? " (the layers' gathered weights are still counted)" : ""));
            break;
        }
    check_plot(q.report, run.seqs.size(), run.batches.size(), layouts, run.attentions.size());
    const std::size_t configurations =
        run.seqs.size() * run.batches.size() * layouts * run.attentions.size() * run.modes.size();
    run.sweep = configurations > 1;
    const ReportOptions& r = q.report;
    if (run.sweep && (r.per_layer || r.timeline || r.ops))
        throw usage_error(fmt::format("{} shows one configuration; this asks for {} (a sweep)",
                                      r.per_layer ? "--per-layer"
                                      : r.ops     ? "--ops"
                                                  : "--timeline",
                                      configurations));
    run.format = parse_format(q.output.format);
    run.view = View{unit_of(q.output),
                    r.timeline,
                    r.compare,
                    parse_count("--gpus-per-node", q.parallel.gpus_per_node, 8),
                    std::nullopt,
                    std::nullopt,
                    Count(0),
                    DeviceSettings{},
                    true};
    if (const auto device = usable_memory(r.device))
        run.view.device_memory = device->rule.memory, run.view.reserve = device->rule.reserve;
    run.view.device = device_settings(r.device);
    // A sweep replays each configuration through the allocator only where a verdict needs it.
    run.view.device_figures = !run.sweep || run.view.device_memory.has_value();
    if (!q.parallel.host_memory.empty())
        run.view.host_memory = parse_size("--host-memory", q.parallel.host_memory);
    run.view.loading = parse_loading(q.parallel.loading);
    return run;
}

/// What the table says of a stage split memcalc assumed (Report::stage_split_assumed).
std::string stage_split_note(const Report& r) {
    const Parallelism& p = r.settings.parallel;
    const std::uint64_t pieces = split_pieces(p), layers = r.model.layers;
    const char* what = schedule_row(p).mirrored ? "model chunks" : "pipeline stages";
    return fmt::format(
        "\nNote on the pipeline: {} {} do not divide the {} layers; memcalc assumed {} + {} x {} + "
        "{} (the first and last take fewer). Megatron-LM refuses such a layout unless "
        "--decoder-first-pipeline-num-layers and --decoder-last-pipeline-num-layers are given: "
        "give --first-stage-layers and --last-stage-layers to set your own.\n",
        pieces, what, layers, p.first_stage_layers, pieces - 2, piece_layers(p, layers, 1),
        p.last_stage_layers);
}

/// One configuration's report, in the format asked for, with a plot of its timeline if asked.
void run_single(const EstimateOptions& q, EstimateRun& run, Spool& out,
                std::vector<PendingFile>& files) {
    Settings& settings = run.settings;
    settings.seq = run.seqs.front(), settings.micro_batch = run.batches.front();
    settings.recompute = run.modes.front();
    settings.framework.attention = run.attentions.front();
    settings.parallel = parse_layouts(q.parallel, q.step, run.batches.front()).front();
    const ReportOptions& o = q.report;
    settings.ops = o.ops;
    const Report r = estimate(run.model.architecture, settings);
    const View& view = run.view;
    const ModelFile& model = run.model;
    if (!o.plot.empty())
        files.push_back({"--plot", o.plot, timeline_svg(r, view.device_memory, view.unit)});
    switch (run.format) {
        case Format::json: {
            nlohmann::json j = o.per_layer ? per_layer_json(r) : report_json(r, view);
            if (o.ops) add_ops_json(o.per_layer ? j : j["activations"], r);
            if (model.checkpoint && !o.per_layer)
                j["checkpoint"] = checkpoint_json(*model.checkpoint);
            if (!model.notes.empty()) j["model_notes"] = model.notes;
            out.append(j.dump(2) + "\n");
            break;
        }
        case Format::csv:
            out.append(o.ops         ? ops_csv(r)
                       : o.per_layer ? per_layer_csv(r)
                                     : csv_header() + csv_row(r, view));
            break;
        case Format::table:
            out.append(o.per_layer ? per_layer_table(r, view) : report_table(r, view));
            if (model.checkpoint && !o.per_layer) out.append(checkpoint_table(*model.checkpoint));
            if (o.ops) out.append(ops_table(r, view));
            for (const std::string& note : model.notes)
                out.append(fmt::format("\nNote on {}: {}.\n", model.architecture.name, note));
            if (r.stage_split_assumed) out.append(stage_split_note(r));
            break;
    }
}

/// One piece of a CSV sweep: a sequence length and a run of its micro-batches (indices into
/// EstimateRun::batches, end not included).
struct SweepPiece {
    std::size_t index = 0;  ///< its place in the sweep: the first opens a JSON array
    std::uint64_t seq = 0;
    std::size_t first = 0, end = 0;
};

/// A piece's CSV rows or JSON objects and what a plot needs of them.
struct PieceRows {
    bool opens = false;  ///< the sweep's first piece: its first JSON object opens the array
    std::string text;
    std::vector<SweepPoint> points;
    std::size_t rows = 0;
};

/// A sweep as it is rendered, a configuration at a time.
struct SweepOutput {
    SweepOutput(const EstimateRun& r, const Estimator& e, bool plot, Spool& o)
        : run(r), estimator(e), plotted(plot), out(o) {}

    const EstimateRun& run;
    const Estimator& estimator;
    bool plotted;
    Spool& out;
    std::vector<SweepPoint> points;  ///< what a plot needs of each configuration
    std::optional<SweepTable> table;
    std::size_t done = 0;
    Progress progress{"sweep", 64};

    /// The CSV rows' writers, one by mode: each remembers the digits of its last row's numbers,
    /// most of which its next repeats.
    std::vector<CsvRowWriter> csv_writers() const {
        std::vector<CsvRowWriter> writers(run.modes.size());
        if (run.view.device_memory)
            for (CsvRowWriter& w : writers)
                w.device = DeviceFit{*run.view.device_memory, run.view.reserve};
        return writers;
    }

    /// A configuration's device figure (high end), for the verdict of a sweep with a device:
    /// its timelines replayed through the allocator.
    std::optional<Count> device_high(const Settings& settings) const {
        const Report r = estimator.estimate(settings);
        const std::optional<DeviceFigures> d = fullest_device(r, run.view);
        return d ? std::optional<Count>(d->high_bytes) : std::nullopt;
    }

    /// Every mode's CSV row of one configuration (`settings` but its recomputation), off `line`
    /// where it covers the micro-batch, by `writers` into `into`.
    void csv_rows(const Settings& settings, MicroBatchLines* line,
                  std::vector<CsvRowWriter>& writers, PieceRows& into) const {
        const auto row = [&](Summary& r, std::size_t mode) {
            if (plotted)
                into.points.push_back({r.settings.seq, r.settings.micro_batch, r.settings.recompute,
                                       r.peak.bytes.total()});
            CsvRowWriter& writer = writers[mode];
            if (writer.device) r.device = device_high(r.settings);
            writer.append(into.text, run.model.architecture.name, r);
            ++into.rows;
        };
        if (line && line->covers(settings.micro_batch)) {
            for (std::size_t m = 0; m < run.modes.size(); ++m)
                row(line->at(settings.micro_batch, m), m);
            return;
        }
        // The closed form: no table kept, no timeline built.
        std::vector<Summary> rows = estimator.summaries(settings, run.modes);
        for (std::size_t m = 0; m < rows.size(); ++m) row(rows[m], m);
    }

    /// Every mode's whole report of one configuration (`settings` but its recomputation) to
    /// `use`, its plot point into `into` where the sweep is plotted.
    template <class Use>
    void each_report(Settings settings, std::vector<SweepPoint>& into, Use use) const {
        for (auto mode : run.modes) {
            settings.recompute = mode;
            const Report r = estimator.estimate(settings);
            if (plotted)
                into.push_back(
                    {settings.seq, settings.micro_batch, mode, r.peak_step().bytes.total()});
            use(r);
        }
    }

    /// Every mode's JSON object of one configuration, into `into`: the sweep's first opens the
    /// array. JSON prints the timelines.
    void json_rows(const Settings& settings, PieceRows& into) const {
        each_report(settings, into.points, [&](const Report& r) {
            into.text += (into.opens && into.rows == 0 ? "[\n" : ",\n") +
                         indented(report_json(r, run.view).dump(2), 2);
            ++into.rows;
        });
    }

    /// Every mode of one configuration, as a table's rows.
    void add(const Settings& settings) {
        each_report(settings, points, [&](const Report& r) {
            table->add(r);
            progress(++done);
        });
    }
};

/// `settings` at sequence length `s`, micro-batch `b`, `layout` and `attention`, under the
/// first recomputation mode.
void configure(Settings& settings, const EstimateRun& run, std::uint64_t s, std::uint64_t b,
               const Parallelism& layout, Attention attention) {
    settings.seq = s, settings.micro_batch = b;
    settings.recompute = run.modes.front();
    settings.framework.attention = attention;
    settings.parallel = layout;
}

/// A CSV sweep's pieces in its order: each sequence length's micro-batches, at most 512 a piece,
/// so that however long the sweep a piece's rows stay few; made as asked for, none kept.
struct SweepPieces {
    static constexpr std::size_t most = 512;
    const EstimateRun& run;

    std::size_t per_seq() const { return (run.batches.size() + most - 1) / most; }
    std::size_t size() const { return run.seqs.size() * per_seq(); }
    SweepPiece operator[](std::size_t i) const {
        const std::size_t first = i % per_seq() * most;
        return {i, run.seqs[i / per_seq()], first, std::min(run.batches.size(), first + most)};
    }
};

/// One piece's rows (CSV or JSON). Along the micro-batch a row comes off its configuration's lines
/// where they are drawn (micro_batch_line.hpp, `lines`): with no global batch, the layouts are
/// every micro-batch's. `expect_bytes`: room made for the text at once (the last piece's size), so
/// it is not copied as it grows.
PieceRows piece_rows(const SweepOutput& sweep, const SweepPiece& piece, bool lines,
                     const std::vector<std::vector<Parallelism>>& layouts_of,
                     std::vector<CsvRowWriter>& writers, std::size_t expect_bytes) {
    const EstimateRun& run = sweep.run;
    Settings settings = run.settings;
    const std::vector<std::uint64_t> batches(run.batches.begin() + piece.first,
                                             run.batches.begin() + piece.end);
    std::vector<MicroBatchLines> drawn;  // by layout, then attention
    if (lines)
        for (const auto& layout : layouts_of.front())
            for (auto attention : run.attentions) {
                configure(settings, run, piece.seq, batches.front(), layout, attention);
                drawn.emplace_back(sweep.estimator, settings, run.modes, batches);
            }
    PieceRows rows;
    rows.opens = piece.index == 0;
    rows.text.reserve(expect_bytes);
    for (std::size_t bi = piece.first; bi < piece.end; ++bi) {
        std::size_t line = 0;  // its index in drawn
        for (const auto& layout : layouts_of[bi])
            for (auto attention : run.attentions) {
                configure(settings, run, piece.seq, run.batches[bi], layout, attention);
                if (run.format == Format::json)
                    sweep.json_rows(settings, rows);
                else
                    sweep.csv_rows(settings, line < drawn.size() ? &drawn[line] : nullptr, writers,
                                   rows);
                ++line;
            }
    }
    return rows;
}

/// A CSV or JSON sweep: its pieces made on worker threads (worker_threads()), each thread with
/// writers of its own, and written in order, as one thread would write them.
void sweep_in_pieces(SweepOutput& sweep, const std::vector<std::vector<Parallelism>>& layouts_of,
                     bool lines) {
    const SweepPieces pieces{sweep.run};
    const unsigned threads = worker_threads();
    std::vector<std::vector<CsvRowWriter>> writers(std::max(1u, threads), sweep.csv_writers());
    std::vector<std::size_t> last_bytes(writers.size());  // each worker's last piece's text
    ordered_parallel<PieceRows>(
        pieces.size(), threads,
        [&](std::size_t i, unsigned worker) {
            const std::size_t expect = last_bytes[worker] + last_bytes[worker] / 16;
            PieceRows rows =
                piece_rows(sweep, pieces[i], lines, layouts_of, writers[worker], expect);
            last_bytes[worker] = rows.text.size();
            return rows;
        },
        [&](std::size_t, PieceRows rows) {
            sweep.out.append(rows.text);
            sweep.points.insert(sweep.points.end(), rows.points.begin(), rows.points.end());
            sweep.done += rows.rows;
            sweep.progress.at(sweep.done);
        });
}

/// Every configuration of the lists, rendered as it is made: the sweep keeps no report, so its
/// memory does not grow with its length (a table keeps each row's text, to align the columns).
void run_sweep(const EstimateOptions& q, EstimateRun& run, Spool& out,
               std::vector<PendingFile>& files) {
    const Architecture& arch = run.model.architecture;
    const Estimator estimator(arch);  // the parameter table and its splits, once for the sweep
    SweepOutput sweep(run, estimator, !q.report.plot.empty(), out);
    if (run.format == Format::table) sweep.table.emplace(run.view);
    std::vector<std::vector<Parallelism>> layouts_of;  // per micro-batch (--global-batch: count)
    for (auto b : run.batches) layouts_of.push_back(parse_layouts(q.parallel, q.step, b));
    if (run.format != Format::table) {
        if (run.format == Format::csv) out.append(csv_header());
        const bool lines =
            run.format == Format::csv && !run.view.device_memory && q.parallel.global_batch.empty();
        sweep_in_pieces(sweep, layouts_of, lines);
    } else {
        Settings& settings = run.settings;
        for (auto s : run.seqs)
            for (std::size_t bi = 0; bi < run.batches.size(); ++bi)
                for (const auto& layout : layouts_of[bi])
                    for (auto attention : run.attentions) {
                        configure(settings, run, s, run.batches[bi], layout, attention);
                        sweep.add(settings);
                    }
    }
    if (run.format == Format::json) out.append("\n]\n");
    if (sweep.table) out.append(sweep.table->str());
    if (sweep.table && run.model.checkpoint) out.append(checkpoint_table(*run.model.checkpoint));
    // A sweep plots the peak against the sequence (or, when only it varies, the micro-batch).
    if (sweep.plotted)
        files.push_back(
            {"--plot", q.report.plot,
             sweep_svg(arch.name, sweep.points, run.seqs.size() > 1 || run.batches.size() == 1,
                       run.view.device_memory, run.view.unit)});
}

}  // namespace

/// `out`: what goes to stdout or --output; `files`: a plot asked for, written only once the whole
/// run has succeeded.
void run_estimate(const EstimateOptions& q, Spool& out, std::vector<PendingFile>& files) {
    EstimateRun run = estimate_run(q);
    if (run.sweep)
        run_sweep(q, run, out, files);
    else
        run_single(q, run, out, files);
}

}  // namespace memcalc::cli
