// memcalc's command line: parses arguments, loads the model, runs the core, prints one rendering.
// Every error is caught here once and printed as one line on stderr. src/main.cpp only calls it, so
// a fuzz target can run the whole program in process (fuzz/fuzz_command_line.cpp).
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <functional>
#include <iostream>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "command_line.hpp"
#include "memcalc/compare.hpp"
#include "memcalc/memcalc.hpp"
#include "model_file.hpp"
#include "output_file.hpp"
#include "render.hpp"
#include "suggest.hpp"

namespace {

using namespace memcalc;
using namespace memcalc::cli;

constexpr int exit_input_error = 1;
constexpr int exit_usage_error = 2;

/// A progress line on stderr, only when stderr is a terminal and the work has run past a second.
class Progress {
public:
    /// `every`: how many items between looks at the clock.
    Progress(const char* what, std::size_t every) : what_(what), every_(every), terminal_(isatty(fileno(stderr)) != 0) {}
    ~Progress() {
        if (shown_) std::cerr << "\r\033[K" << std::flush;
    }
    void operator()(std::size_t done) {
        if (!terminal_ || done % every_ != 0) return;
        const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (seconds < 1) return;
        shown_ = true;
        std::cerr << "\r" << what_ << ": " << done << " evaluated (" << static_cast<long long>(done / seconds) << "/s)"
                  << std::flush;
    }

private:
    const char* what_;
    std::size_t every_;
    bool terminal_, shown_ = false;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// Checks the options every estimating command shares, before any model is read.
void check_run_options(const Request& q) {
    if (q.preset.empty() + q.model_file.empty() + q.config.empty() != 2)
        throw usage_error("give one model: --preset NAME (see 'memcalc presets'), --model-file PATH or --config PATH");
    if (find_recipe(q.recipe) == nullptr) {
        std::vector<std::string> names;
        for (const auto& r : recipes) names.emplace_back(r.name);
        throw usage_error(fmt::format("unknown --recipe '{}'{}; 'memcalc recipes' lists them", q.recipe,
                                      did_you_mean(q.recipe, names)));
    }
    const std::vector<Attention> attentions = parse_attention(q.attention);
    if (q.activations == "korthikanti" &&
        std::find(attentions.begin(), attentions.end(), Attention::flash) != attentions.end())
        throw usage_error("--attention flash needs --activations architecture: Korthikanti's formula describes eager "
                          "attention");
}

/// `text` with its control characters written as \xNN, so a model's name can reach a terminal, a CSV
/// row or an SVG without escape sequences, forged lines or ill-formed XML.
std::string printable(const std::string& text) {
    std::string out;
    for (unsigned char c : text)
        out += c < 0x20 || c == 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, static_cast<char>(c));
    return out;
}

ModelFile load_model(const Request& q) {
    ModelFile m = !q.preset.empty()       ? load_preset(q.preset)
                  : !q.model_file.empty() ? load_model_file(q.model_file)
                                          : load_hf_config(q.config);
    m.architecture.name = printable(m.architecture.name);
    return m;
}

/// --plot draws one file type, and a sweep along one axis.
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

ActivationModel activation_model(const Request& q) {
    return q.activations == "architecture" ? ActivationModel::architecture : ActivationModel::korthikanti;
}

/// The options fit and plan share with an estimate, one value each, into Settings or a PlanRequest.
template <class Run>
void read_run_options(const Request& q, const char* command, Run& into) {
    into.recipe = q.recipe;
    into.activations = activation_model(q);
    const auto attentions = parse_attention(q.attention);
    if (attentions.size() != 1) throw usage_error(fmt::format("{} takes one --attention", command));
    into.attention = attentions.front();
    into.platform = parse_platform(q);
    into.optimizer = parse_optimizer_impl(q.optimizer_impl);
    into.grad_buffer = parse_grad_buffer(q.grad_buffer);
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

/// `out`: what goes to stdout or --output; `files`: a plot asked for, written only once the whole run
/// has succeeded. A sweep is rendered a configuration at a time and keeps no report: its memory does
/// not grow with its length (a table keeps each row's text, to align the columns).
void run_estimate(const Request& q, Spool& out, std::vector<PendingFile>& files) {
    check_run_options(q);
    const std::vector<std::uint64_t> batches = parse_sizes("--micro-batch", q.micro_batch);
    const std::vector<Recompute> modes = parse_modes(q.recompute);
    const std::vector<Attention> attentions = parse_attention(q.attention);
    std::vector<std::uint64_t> seqs;  // empty: the model's max_positions
    if (!q.seq.empty()) seqs = parse_sizes("--seq", q.seq);

    const ModelFile model = load_model(q);
    const Architecture& arch = model.architecture;
    if (seqs.empty()) {
        if (arch.max_positions == 0)
            throw usage_error(fmt::format("--seq is required: {} gives no max_positions to default to", arch.name));
        seqs.push_back(arch.max_positions);
    }

    const std::size_t layouts = parse_layouts(q, batches.front()).size();
    check_plot(q, seqs.size(), batches.size(), layouts, attentions.size());
    const std::size_t configurations = seqs.size() * batches.size() * layouts * attentions.size() * modes.size();
    const bool sweep = configurations > 1;
    if (sweep && (q.per_layer || q.timeline))
        throw usage_error(fmt::format("{} shows one configuration; this asks for {} (a sweep)",
                                      q.per_layer ? "--per-layer" : "--timeline", configurations));
    const ActivationModel activations = activation_model(q);
    const Platform platform = parse_platform(q);
    const OptimizerImpl optimizer = parse_optimizer_impl(q.optimizer_impl);
    const GradBuffer grad_buffer = parse_grad_buffer(q.grad_buffer);
    const Format format = parse_format(q.format);
    View view{q.units == "gib" ? Unit::gib : Unit::gb, q.timeline, q.compare,
              parse_count("--gpus-per-node", q.gpus_per_node, 8), std::nullopt};
    if (!q.device_memory.empty()) view.device_memory = parse_size("--device-memory", q.device_memory);

    if (!sweep) {
        const Report r = estimate(arch, {seqs.front(), batches.front(), modes.front(), q.recipe, activations,
                                         attentions.front(), platform, parse_layouts(q, batches.front()).front(),
                                         optimizer, grad_buffer});
        if (!q.plot.empty()) files.push_back({"--plot", q.plot, timeline_svg(r, view.device_memory, view.unit)});
        switch (format) {
            case Format::json: out.append((q.per_layer ? per_layer_json(r) : report_json(r, view)).dump(2) + "\n"); break;
            case Format::csv: out.append(q.per_layer ? per_layer_csv(r) : csv_header() + csv_row(r)); break;
            case Format::table: out.append(q.per_layer ? per_layer_table(r, view) : report_table(r, view)); break;
        }
        return;
    }

    std::optional<ParameterTable> parameters;  // the same for every configuration
    try {
        parameters = parameter_table(arch);
    } catch (const overflow_error&) {  // each estimate then says so, naming the model's sizes
    }
    std::vector<SweepPoint> points;  // what a plot needs of each configuration
    std::optional<SweepTable> table;
    if (format == Format::table) table.emplace(view);
    if (format == Format::csv) out.append(csv_header());
    std::size_t done = 0;
    Progress progress("sweep", 64);
    for (auto s : seqs)
        for (auto b : batches)
            for (const auto& layout : parse_layouts(q, b))
                for (auto attention : attentions)
                    for (auto mode : modes) {
                        Settings settings{s, b, mode, q.recipe, activations, attention, platform, layout, optimizer,
                                          grad_buffer};
                        settings.timelines = format == Format::json;  // only JSON prints them
                        const Report r = estimate(arch, settings, parameters ? &*parameters : nullptr);
                        if (!q.plot.empty()) points.push_back({s, b, mode, r.peak_step().bytes.total()});
                        switch (format) {
                            case Format::json:
                                out.append((done == 0 ? "[\n" : ",\n") + indented(report_json(r, view).dump(2), 2));
                                break;
                            case Format::csv: out.append(csv_row(r)); break;
                            case Format::table: table->add(r); break;
                        }
                        progress(++done);
                    }
    if (format == Format::json) out.append("\n]\n");
    if (table) out.append(table->str());
    // A sweep plots the peak against the sequence (or, when only it varies, the micro-batch).
    if (!q.plot.empty())
        files.push_back({"--plot", q.plot,
                         sweep_svg(arch.name, points, seqs.size() > 1 || batches.size() == 1, view.device_memory, view.unit)});
}

std::string run_fit(const Request& q) {
    check_run_options(q);
    if (q.device_memory.empty()) throw usage_error("fit needs --device-memory, e.g. --device-memory 80GB");
    const Count memory = parse_size("--device-memory", q.device_memory);
    const Count reserve = parse_size("--reserve", q.reserve);
    if (reserve >= memory)
        throw usage_error(fmt::format("--reserve {} leaves nothing of --device-memory {}", q.reserve, q.device_memory));
    // With --seq fixed, the micro-batch is searched; otherwise the sequence, at --micro-batch (1).
    FitRequest fit;
    fit.dimension = q.seq.empty() ? FitDimension::seq : FitDimension::micro_batch;
    fit.fixed = fit.dimension == FitDimension::seq ? parse_count("--micro-batch", q.micro_batch, 1)
                                                  : parse_count("--seq", q.seq, 0);
    fit.memory = memory, fit.reserve = reserve;
    fit.capacity = Count(memory.value() - reserve.value());
    fit.modes = parse_modes(q.recompute);

    const ModelFile model = load_model(q);
    fit.model = model.architecture;
    Settings settings;
    (fit.dimension == FitDimension::seq ? settings.micro_batch : settings.seq) = fit.fixed;
    read_run_options(q, "fit", settings);
    const auto layouts = parse_layouts(q, fit.dimension == FitDimension::micro_batch ? 1 : fit.fixed);
    if (layouts.size() != 1) throw usage_error("fit takes one layout: no comma lists for --dp, --tp, --pp or --zero");
    settings.parallel = layouts.front();
    // Sizes the layout can split evenly: the sequence over context (and sequence-parallel) ranks.
    const Parallelism& p = settings.parallel;
    fit.granule = parse_count("--multiple-of", q.multiple_of, 1);
    if (fit.dimension == FitDimension::seq) {
        const std::uint64_t split = p.cp * (p.sequence_parallel ? p.tp : 1);  // both at most 2^24
        const std::uint64_t common = std::gcd(fit.granule, split);
        if (fit.granule / common > std::numeric_limits<std::uint64_t>::max() / split)
            throw usage_error(fmt::format("--multiple-of {} with cp x tp = {}: their least common multiple exceeds 2^64",
                                          fit.granule, split));
        fit.granule = fit.granule / common * split;
    }
    // A layout that cannot run at any size is a mistake in the request, not an answer.
    validate(fit.model);
    validate(p, fit.model, fit.dimension == FitDimension::seq ? fit.granule : fit.fixed);
    const std::uint64_t limit = fit.dimension == FitDimension::seq && fit.model.position == Position::learned
                                    ? fit.model.learned_positions()
                                    : (1ULL << 40);
    const std::uint64_t global = parse_count("--global-batch", q.global_batch, 0);
    if (global > max_microbatches)
        throw usage_error(fmt::format("--global-batch {} exceeds 2^40 sequences per step", global));
    if (global != 0 && fit.dimension == FitDimension::micro_batch && fit.granule != 1)
        throw usage_error("fit takes --multiple-of or --global-batch when it searches the micro-batch, not both");
    for (auto mode : fit.modes) {
        settings.recompute = mode;
        fit.results.push_back(global != 0 && fit.dimension == FitDimension::micro_batch
                                  ? fit_micro_batch_of(fit.model, settings, global, fit.capacity)
                                  : memcalc::fit(fit.model, settings, fit.dimension, fit.capacity, fit.granule, limit));
    }
    fit.settings = settings;
    switch (parse_format(q.format)) {
        case Format::json: return fit_json(fit).dump(2) + "\n";
        case Format::csv: return fit_csv(fit);
        case Format::table: return fit_table(fit, q.units == "gib" ? Unit::gib : Unit::gb);
    }
    return {};
}

std::string run_plan(const Request& q) {
    check_run_options(q);
    if (q.device_memory.empty()) throw usage_error("plan needs --device-memory, e.g. --device-memory 80GB");
    if (q.gpus.empty()) throw usage_error("plan needs --gpus, the number of devices");
    if (q.seq.empty()) throw usage_error("plan needs --seq");
    if (q.global_batch.empty()) throw usage_error("plan needs --global-batch, the sequences per step");
    PlanView view;
    view.memory = parse_size("--device-memory", q.device_memory);
    view.reserve = parse_size("--reserve", q.reserve);
    if (view.reserve >= view.memory)
        throw usage_error(fmt::format("--reserve {} leaves nothing of --device-memory {}", q.reserve, q.device_memory));
    PlanRequest& r = view.request;
    r.gpus = parse_count("--gpus", q.gpus, 1);
    r.capacity = Count(view.memory.value() - view.reserve.value());
    r.seq = parse_count("--seq", q.seq, 0);
    r.global_batch = parse_count("--global-batch", q.global_batch, 0);
    read_run_options(q, "plan", r);
    r.first_stage_layers = parse_count("--first-stage-layers", q.first_stage_layers, 0);
    r.last_stage_layers = parse_count("--last-stage-layers", q.last_stage_layers, 0);
    r.max_tp = parse_count("--max-tp", q.max_tp, 0);
    // Given, they restrict the search; not given, it tries them all.
    if (!q.recompute.empty()) r.modes = parse_modes(q.recompute);
    if (!q.micro_batch.empty()) r.micro_batches = parse_sizes("--micro-batch", q.micro_batch);
    view.top = parse_count("--top", q.top, 10);
    const ModelFile model = load_model(q);
    view.model = model.architecture.name;
    const auto start = std::chrono::steady_clock::now();
    {
        Progress progress("plan", 4096);
        view.result = plan_top(model.architecture, r, view.top, std::ref(progress));
    }
    view.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    switch (parse_format(q.format)) {
        case Format::json: return plan_json(view).dump(2) + "\n";
        case Format::csv: return plan_csv(view);
        case Format::table: return plan_table(view, q.units == "gib" ? Unit::gib : Unit::gb);
    }
    return {};
}

std::string run_presets(const std::string& format) {
    std::vector<std::pair<std::string, ModelFile>> presets;
    for (const auto& name : preset_names()) presets.emplace_back(name, load_preset(name));
    switch (parse_format(format)) {
        case Format::json: return presets_json(presets).dump(2) + "\n";
        case Format::csv: return presets_csv(presets);
        case Format::table: return presets_table(presets);
    }
    return {};
}

std::string run_recipes(const std::string& format) {
    switch (parse_format(format)) {
        case Format::json: return recipes_json().dump(2) + "\n";
        case Format::csv: return recipes_csv();
        case Format::table: return recipes_table();
    }
    return {};
}

const char* const examples = R"(Examples:
  memcalc --preset llama-7b --seq 4096 --recompute selective
  memcalc --preset llama-7b --seq 4096 --recompute full --timeline
  memcalc --preset llama-7b --seq 4096 --format json
  memcalc --preset llama-2-70b --seq 1024,2048,4096 --recompute all --format csv
  memcalc --model-file my-model.json --seq 2048 --micro-batch 4 --units gib
  memcalc --config Llama-2-7b-hf/config.json --seq 4096 --recompute full
  memcalc --preset llama-3-8b --seq 8192 --activations architecture --attention flash --per-layer
  memcalc --preset llama-2-70b --seq 4096 --tp 8 --sp --pp 4 --dp 2 --zero 1 --global-batch 128 --recompute selective
  memcalc --preset llama-7b --seq 4096 --recompute selective --microbatches 4 --grad-buffer persistent
  memcalc --preset llama-3.1-405b --seq 8192 --tp 8 --pp 16 --dp 8 --zero 1 --first-stage-layers 7 --last-stage-layers 7
  memcalc presets
  memcalc recipes

Exit status: 0 on success, 1 for a bad model (preset, model file, sizes that overflow),
2 for a bad command line. Errors are one line on stderr; nothing is printed on stdout then.)";

/// The model and the run: what every command that estimates takes.
void add_model_options(CLI::App& app, Request& q) {
    const std::vector<std::string> formats = {"table", "json", "csv"};
    auto* preset = app.add_option("--preset", q.preset, "A built-in model: see 'memcalc presets'")
        ->type_name("NAME");
    auto* model_file =
        app.add_option("--model-file", q.model_file, "A model described in JSON (keys as in presets/*.json)")->excludes(preset)
        ->type_name("PATH");
    app.add_option("--config", q.config,
                   "A HuggingFace config.json (model_type llama, mistral, mixtral, qwen2, gemma, gemma2, phi3,\n"
                   "gpt2, opt, falcon, bloom, gpt_neox or phi)")
        ->excludes(preset)
        ->excludes(model_file)
        ->type_name("PATH");
    app.add_option("--seq", q.seq, "Sequence length s, or a comma list to sweep (default: the model's max_positions)")
        ->type_name("S[,S...]");
    app.add_option("-b,--micro-batch", q.micro_batch, "Sequences per step per device b, or a comma list (default: 1)")
        ->type_name("B[,B...]");
    app.add_option("--recompute", q.recompute,
                   "Activation recomputation: none, selective, full, a comma list, or all (default: none)")
        ->type_name("MODE[,MODE...]");
    app.add_option("--recipe", q.recipe, "Bytes per parameter: see 'memcalc recipes' (default: mixed-adam)")
        ->type_name("NAME");
    app.add_option("--activations", q.activations,
                   "Per-layer activations: korthikanti (the chapter's formula, default) or architecture\n"
                   "(the tensors PyTorch keeps for this architecture, op by op)")
        ->check(CLI::IsMember({"korthikanti", "architecture"}));
    app.add_option("--attention", q.attention,
                   "eager (default: the s x s scores are stored), flash (a fused kernel keeps a log-sum-exp\n"
                   "per row instead; needs --activations architecture), or a comma list")
        ->type_name("KIND[,KIND...]");
    app.add_option("--units", q.units, "gb (10^9 bytes, the default) or gib (2^30)")
        ->check(CLI::IsMember({"gb", "gib"}, CLI::ignore_case))
        ->transform(CLI::detail::to_lower);
    app.add_option("--format", q.format, "table (default), json or csv")->check(CLI::IsMember(formats));
    app.add_option("--output", q.output,
                   "Write the result to this file instead of stdout, atomically: a failed run leaves no file")
        ->type_name("FILE");
}

/// How the step is spread over devices.
/// The framework's side of the model: its kernels and its optimiser step.
void add_framework_options(CLI::App& app, Request& q) {
    app.add_option("--platform", q.platform,
                   "Whose PyTorch kernels the architecture model follows: cuda (default) or cpu, which\n"
                   "keeps LayerNorm statistics in bf16 and softmaxes an fp32 copy (how validation/gpu/\n"
                   "measures the model without a GPU)")
        ->type_name("NAME");
    app.add_option("--optimizer-impl", q.optimizer_impl,
                   "How the optimizer step runs, which decides its temporaries: fused (default: Megatron-LM,\n"
                   "DeepSpeed, torch fused=True; none), foreach (torch.optim's default on CUDA: sqrt(v) of\n"
                   "every parameter at once, 4 B each) or for-loop (one tensor at a time: 8 B x the largest)")
        ->type_name("NAME");
    app.add_option("--grad-buffer", q.grad_buffer,
                   "When gradients exist: lazy (default: PyTorch with zero_grad(set_to_none=True); each\n"
                   "appears as backward makes it, and from the second micro-batch on all are held) or\n"
                   "persistent (Megatron-LM's and DeepSpeed's contiguous buffer, live at every step;\n"
                   "Megatron's is fp32 main_grad: pair it with --recipe mixed-adam-fp32-grads)")
        ->type_name("KIND");
}

/// Options a subcommand takes one value of, where the estimate takes a comma list: said so in --help.
void single_valued(CLI::App& app, std::initializer_list<const char*> names) {
    for (const char* name : names) {
        CLI::Option* option = app.get_option(name);
        option->type_name(option->get_type_name().substr(0, option->get_type_name().find('[')));
        std::string text = option->get_description();
        for (const char* list : {", or a comma list to sweep", ", or a comma list", " or a comma list"}) {
            const auto at = text.find(list);
            if (at != std::string::npos) text.erase(at, std::string(list).size());
        }
        option->description(text + " (one value)");
    }
}

/// Uneven pipeline stages, for estimate, fit and plan.
void add_stage_options(CLI::App& app, Request& q, const char* group) {
    app.add_option("--first-stage-layers", q.first_stage_layers,
                   "Layers of the first pipeline stage, when it differs (Megatron-LM's\n"
                   "decoder-first-pipeline-num-layers); the other stages split the rest evenly")
        ->group(group)
        ->type_name("N");
    app.add_option("--last-stage-layers", q.last_stage_layers,
                   "Layers of the last pipeline stage, when it differs (decoder-last-pipeline-num-layers)")
        ->group(group)
        ->type_name("N");
}

void add_parallel_options(CLI::App& app, Request& q) {
    const char* parallel_group = "Parallelism (per-device memory)";
    app.add_option("--dp", q.dp, "Data-parallel replicas (default 1); --dp, --tp, --pp and --zero take comma lists")
        ->group(parallel_group)
        ->type_name("N[,N...]");
    app.add_option("--zero", q.zero,
                   "ZeRO stage: 0 none, 1 optimiser state, 2 + gradients, 3 + weights (FSDP full sharding)")
        ->group(parallel_group)
        ->type_name("STAGE[,STAGE...]");
    app.add_option("--shard-group", q.shard_group, "Hybrid sharding: shard within groups of this many dp ranks")
        ->group(parallel_group)
        ->type_name("M");
    app.add_option("--tp", q.tp, "Tensor-parallel ranks (Megatron-LM column/row splits)")->group(parallel_group)
        ->type_name("N[,N...]");
    app.add_flag("--sp", q.sp, "Sequence parallelism with --tp: norms, dropout and linear inputs split too")
        ->group(parallel_group);
    app.add_option("--pp", q.pp, "Pipeline stages (1F1B schedule)")->group(parallel_group)
        ->type_name("N[,N...]");
    app.add_option("--vpp", q.vpp, "Virtual stages per pipeline rank (interleaved 1F1B)")->group(parallel_group)
        ->type_name("V");
    add_stage_options(app, q, parallel_group);
    app.add_option("--cp", q.cp, "Context-parallel ranks: the sequence split across them")->group(parallel_group)
        ->type_name("N");
    app.add_option("--ep", q.ep, "Expert-parallel ranks for mixture-of-experts models (divides --dp)")
        ->group(parallel_group)
        ->type_name("N");
    app.add_option("--microbatches", q.microbatches,
                   "Micro-batches per step (gradient accumulation; default: --pp, which fills the pipeline);\n"
                   "from the second on, the gradients of the first are held (see --grad-buffer)")
        ->group(parallel_group)
        ->type_name("M");
    app.add_option("--global-batch", q.global_batch, "Sequences per step: sets --microbatches = G / (micro-batch x dp)")
        ->group(parallel_group)
        ->type_name("G");
    app.add_option("--offload", q.offload,
                   "ZeRO-Offload, as DeepSpeed runs it: none (default), optimizer (needs --zero 1-3: the master\n"
                   "copy, the optimiser state and an fp32 copy of the gradient shard in host memory, where the\n"
                   "CPU steps them; with --zero 2 or 3 the device keeps only the gradient bucket in flight), or\n"
                   "parameters (that and the weights; needs --zero 3)")
        ->check(CLI::IsMember({"none", "optimizer", "parameters"}))
        ->group(parallel_group);
    app.add_option("--gpus-per-node", q.gpus_per_node, "GPUs per node, for --compare deepspeed (default 8)")
        ->group(parallel_group)
        ->type_name("N");
}

}  // namespace

int memcalc::cli::run_command_line(int argc, const char* const* argv) {
    CLI::App app{"memcalc: how much device memory one training step of a transformer language model takes,\n"
                 "from the architecture alone, exactly: parameters, training state, saved activations,\n"
                 "and the peak over the step's timeline.",
                 "memcalc"};
    app.set_version_flag("--version", std::string("memcalc ") + memcalc::version);
    app.footer(examples);
    app.require_subcommand(0, 1);

    Request q;
    const std::vector<std::string> formats = {"table", "json", "csv"};
    add_model_options(app, q);
    add_framework_options(app, q);
    add_parallel_options(app, q);
    app.add_option("--compare", q.compare,
                   fmt::format("Also show what another tool gives for this configuration: megatron (Megatron-LM's\n"
                               "theoretical memory formula, as on its {}) or deepspeed\n"
                               "(its ZeRO-2/3 model-state estimators, as on its {})",
                               megatron_follows, deepspeed_follows))
        ->check(CLI::IsMember({"megatron", "deepspeed"}));
    app.add_option("--plot", q.plot,
                   "Also draw an SVG: the timeline as stacked areas by category, or for a sweep the peak\n"
                   "against the swept size, one line per recomputation mode")
        ->type_name("FILE.svg");
    app.add_option("--device-memory", q.device_memory, "A device's memory (80GB, 24GiB): drawn in plots, checked in the report")
        ->type_name("SIZE");
    app.add_flag("--timeline", q.timeline, "Show every step of the timeline, not only the first and last of each phase");
    app.add_flag("--per-layer", q.per_layer, "Show only the per-layer activation table (op by op)");

    Request fit_q;
    fit_q.recompute = "all";
    auto* fit = app.add_subcommand("fit", "The longest sequence (or largest micro-batch) that fits in a device's memory");
    // Building CLI11's option tree is most of the start-up: a subcommand's options only when named.
    const auto mentions = [&](const char* name) {
        for (int i = 1; i < argc; ++i)
            if (std::string(argv[i]) == name) return true;
        return false;
    };
    if (mentions("fit")) {
        add_model_options(*fit, fit_q);
        add_framework_options(*fit, fit_q);
        add_parallel_options(*fit, fit_q);
        single_valued(*fit, {"--seq", "--micro-batch", "--attention", "--dp", "--tp", "--pp", "--zero"});
        fit->get_option("--recompute")->description("Recomputation modes to answer for, a comma list (default: all three)");
        fit->get_option("--dp")->description("Data-parallel replicas (default 1)");
        fit->add_option("--device-memory", fit_q.device_memory, "The device's memory: 80GB, 141GB, 24GiB, ... (required)")
            ->type_name("SIZE");
        fit->add_option("--reserve", fit_q.reserve,
                        "Memory the model does not see: the framework's context and fragmentation (default 2GiB)")
            ->type_name("SIZE");
        fit->add_option("--multiple-of", fit_q.multiple_of, "Search only multiples of this size (default 1)")
            ->type_name("N");
        fit->footer(R"(Searches the sequence length at --micro-batch (default 1), or, when --seq is given, the
micro-batch at that sequence; for each --recompute mode (default: all three). The peak never falls
as either grows, so the search doubles, then bisects, and reports the largest size that fits, its
peak and headroom, and the next size up, which does not. With --seq and --global-batch it tries each
micro-batch that divides the global batch per replica, with the micro-batches per step that implies
(fewer, larger ones can fit where more, smaller ones hold gradients that do not).

Examples:
  memcalc fit --preset llama-7b --device-memory 80GB --recompute selective
  memcalc fit --preset llama-3-8b --device-memory 80GB --seq 8192 --activations architecture --attention flash
  memcalc fit --preset llama-2-70b --device-memory 80GB --tp 8 --sp --dp 8 --zero 1 --multiple-of 1024)");
    }

    Request plan_q;
    plan_q.recompute = plan_q.micro_batch = "";  // not given: the search tries every one
    auto* plan = app.add_subcommand("plan", "Every layout of a cluster that fits, ranked by the compute it wastes");
    if (mentions("plan")) {
        add_model_options(*plan, plan_q);
        add_framework_options(*plan, plan_q);
        single_valued(*plan, {"--seq", "--attention"});
        plan->get_option("--recompute")->description("Recomputation modes to try, a comma list (default: all three)");
        plan->get_option("--micro-batch")->description("Micro-batches to try, a comma list (default: every one that divides\n"
                                                       "the global batch per replica)");
        plan->add_option("--gpus", plan_q.gpus, "Devices in the cluster (required)")
            ->type_name("N");
        plan->add_option("--device-memory", plan_q.device_memory, "Each device's memory: 80GB, 141GB, ... (required)")
            ->type_name("SIZE");
        plan->add_option("--global-batch", plan_q.global_batch, "Sequences per step (required)")
            ->type_name("G");
        plan->add_option("--reserve", plan_q.reserve, "Memory the model does not see (default 2GiB)")
            ->type_name("SIZE");
        plan->add_option("--top", plan_q.top, "How many layouts to show (default 10)")
            ->type_name("K");
        plan->add_option("--max-tp", plan_q.max_tp, "Largest tensor-parallel degree to try, e.g. the GPUs of a node")
            ->type_name("N");
        add_stage_options(*plan, plan_q, "Options");
        plan->footer(R"(Enumerates every valid layout: data, tensor, pipeline (1F1B), context and expert (for
mixture-of-experts models) degrees whose product is --gpus, ZeRO stage 0-3, sequence parallelism on
or off, every micro-batch that divides the global batch per replica, and each recomputation mode.
It keeps those whose most loaded device fits in --device-memory less --reserve and ranks them by
  1. wasted compute: recomputation's extra FLOPs plus the pipeline bubble (P-1)/(M+P-1), as
     fractions of the step;
  2. then the bytes each device sends per step (ring all-reduce of gradients, ZeRO-3's weight
     gathers, tensor-parallel all-reduces, pipeline sends, context-parallel key/value rings);
  3. then the peak.
Where pp does not divide the layers, the first and last stages take equally fewer than the others
(Llama 3 405B's 126 layers on 16 stages: 7, 14 x 8, 7), unless --first-stage-layers or
--last-stage-layers say otherwise. Every micro-batch after the first holds the gradients of the
step so far (see --grad-buffer). --recompute and --micro-batch, given, restrict the search. Only the
best --top layouts are kept, so memory does not grow with the cluster.

Example:
  memcalc plan --preset llama-2-70b --gpus 64 --device-memory 80GB --seq 4096 --global-batch 512)");
    }

    std::string list_format = "table";
    auto* presets = app.add_subcommand("presets", "List the built-in models with their parameter counts");
    presets->add_option("--format", list_format, "table (default), json or csv")->check(CLI::IsMember(formats));
    auto* recipes_cmd = app.add_subcommand("recipes", "List the training recipes (bytes per parameter)");
    recipes_cmd->add_option("--format", list_format, "table (default), json or csv")->check(CLI::IsMember(formats));

    try {
        app.parse(argc, argv);
    } catch (const CLI::CallForHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForAllHelp& e) {
        return app.exit(e);
    } catch (const CLI::CallForVersion& e) {
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        std::cerr << "memcalc: " << e.what() << " (see memcalc --help)\n";
        return exit_usage_error;
    }

    try {
        // An empty value ("--seq ''") is a mistake, not the option's absence.
        for (const CLI::App* command : {&app, fit, plan, presets, recipes_cmd})
            for (const CLI::Option* option : command->get_options())
                if (option->count() > 0 && option->get_type_size() != 0)
                    for (const std::string& value : option->results())
                        if (value.empty()) throw usage_error(fmt::format("{} needs a value (got '')", option->get_name()));
        // Options of the estimate given before a subcommand would be silently ignored: refuse them.
        for (const CLI::App* sub : {fit, plan, presets, recipes_cmd}) {
            if (!sub->parsed()) continue;
            for (const CLI::Option* option : app.get_options())
                if (option->count() > 0)
                    throw usage_error(fmt::format("{} comes before '{}', which does not see it: put it after the subcommand",
                                                  option->get_name(), sub->get_name()));
        }
        // The whole output is built before any of it is printed, so a failure prints nothing on stdout
        // and writes no file.
        std::vector<PendingFile> files;
        const Request& used = fit->parsed() ? fit_q : plan->parsed() ? plan_q : q;
        Spool out;
        if (presets->parsed()) out.append(run_presets(list_format));
        else if (recipes_cmd->parsed()) out.append(run_recipes(list_format));
        else if (fit->parsed()) out.append(run_fit(fit_q));
        else if (plan->parsed()) out.append(run_plan(plan_q));
        else run_estimate(q, out, files);
        if (!used.output.empty()) files.push_back({"--output", used.output, "", &out});
        for (const auto& f : files) refuse_overwriting_inputs(f, {used.model_file, used.config});
        write_files(files);
        if (!used.output.empty()) return 0;
        const bool read = out.each_chunk([](std::string_view chunk) {
            std::cout.write(chunk.data(), static_cast<std::streamsize>(chunk.size()));
        });
        std::cout.flush();
        if (!read) throw error("cannot read back the spooled output");
        if (!std::cout) {
            std::cerr << "memcalc: cannot write to standard output: " << std::strerror(errno) << "\n";
            return exit_input_error;
        }
        return 0;
    } catch (const usage_error& e) {
        std::cerr << "memcalc: " << e.what() << "\n";
        return exit_usage_error;
    } catch (const memcalc::error& e) {
        std::cerr << "memcalc: " << e.what() << "\n";
        return exit_input_error;
    } catch (const std::exception& e) {
        std::cerr << "memcalc: internal error: " << e.what() << "\n";
        return exit_input_error;
    }
}
