// memcalc rl: a post-training job's roles, rollout engine and phases on one device.
#include <fmt/format.h>

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"
#include "suggest.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

template <class Row, std::size_t N>
const Row& named_row(const std::array<Row, N>& rows, const char* option, const std::string& text) {
    if (const Row* row = rl_row(rows, text)) return *row;
    std::vector<std::string> names;
    for (const Row& r : rows) names.emplace_back(r.name);
    throw usage_error(fmt::format("{} must be one of {} (got '{}'){}", option,
                                  fmt::join(names, ", "), text, did_you_mean(text, names)));
}

ReferenceMode reference_named(const std::string& text) {
    constexpr std::array<std::pair<const char*, ReferenceMode>, 4> modes{
        {{"none", ReferenceMode::none},
         {"resident", ReferenceMode::resident},
         {"offloaded", ReferenceMode::offloaded},
         {"precomputed", ReferenceMode::precomputed}}};
    for (const auto& [name, mode] : modes)
        if (text == name) return mode;
    throw usage_error(fmt::format(
        "--reference must be none, resident, offloaded or precomputed (got '{}')", text));
}

/// A role's model: a preset's name, else a config.json (or its folder) or a model file.
std::optional<Architecture> role_model(const char* option, const std::string& text) {
    if (text.empty()) return std::nullopt;
    ModelOptions m;
    const std::vector<std::string> presets = preset_names();
    if (std::find(presets.begin(), presets.end(), text) != presets.end())
        m.preset = text;
    else if (!std::filesystem::exists(text))
        throw usage_error(fmt::format(
            "{} '{}' is neither a preset ('memcalc presets') nor a file or folder", option, text));
    else if (std::filesystem::is_directory(text) ||
             std::filesystem::path(text).filename() == "config.json")
        m.config = text;
    else
        m.model_file = text;
    return load_model(m).architecture;
}

/// The trainer's defaults, for each option not given.
void fill_defaults(RlOptions& q, const RlTrainer& t, const RlAlgorithm& a) {
    const auto fill = [](std::string& value, const std::string& fallback) {
        if (value.empty()) value = fallback;
    };
    fill(q.recipe.recipe, std::string(t.recipe));
    fill(q.step.recompute, t.checkpointing ? "full" : "none");
    fill(q.step.micro_batch, std::to_string(t.micro_batch));
    fill(q.prompt_len, std::to_string(t.prompt_len));
    fill(q.completion_len, std::to_string(t.completion_len));
    fill(q.num_generations, std::to_string(a.num_generations));
    fill(q.rollout, t.rollout == Rollout::hf     ? "hf"
                    : t.rollout == Rollout::vllm ? "vllm"
                                                 : "sglang");
    fill(q.placement, t.colocated ? "colocated" : "separate");
    fill(q.role_placement, t.roles_colocated ? "colocated" : "separate");
    fill(q.sleep, t.sleeps ? "on" : "off");
    fill(q.frozen_dtype, dtype_name(t.frozen_dtype));
}

bool placement(const char* option, const std::string& text) {
    if (text == "colocated" || text == "separate") return text == "colocated";
    throw usage_error(fmt::format("{} must be colocated or separate (got '{}')", option, text));
}

bool on_off(const char* option, const std::string& text) {
    if (text == "on" || text == "off") return text == "on";
    throw usage_error(fmt::format("{} must be on or off (got '{}')", option, text));
}

/// The rollout engine's settings: hf, or an engine's rule and share.
void rollout_settings(const RlOptions& q, const RlTrainer& t, RlSettings& s) {
    if (q.rollout == "hf") {
        s.rollout = Rollout::hf;
        if (!q.gpu_memory_utilization.empty() || !q.engine_version.empty())
            throw usage_error(
                fmt::format("{} needs --engine vllm or sglang",
                            q.gpu_memory_utilization.empty()
                                ? "--engine-version " + q.engine_version
                                : "--gpu-memory-utilization " + q.gpu_memory_utilization));
        return;
    }
    ServeOptions engine;
    engine.engine = q.rollout;
    engine.engine_version = q.engine_version;
    (q.rollout == "sglang" ? engine.mem_fraction_static : engine.gpu_memory_utilization) =
        q.gpu_memory_utilization.empty() ? fmt::format("{}", t.share) : q.gpu_memory_utilization;
    s.engine = *engine_settings(engine);
    s.rollout = q.rollout == "sglang" ? Rollout::sglang : Rollout::vllm;
    s.engine_tp = parse_count("--engine-tp", q.engine_tp, 1);
}

DType frozen_dtype_named(const std::string& text) {
    for (DType d : {DType::fp32, DType::bf16, DType::fp16})
        if (text == dtype_name(d)) return d;
    throw usage_error(fmt::format("--frozen-dtype must be fp32, bf16 or fp16 (got '{}')", text));
}

/// The job's settings from the options, the trainer's defaults filling the rest.
RlSettings rl_settings(RlOptions& q) {
    if (q.algorithm.empty())
        throw usage_error("rl needs --algorithm: grpo, rloo, ppo, dpo, kto or orpo");
    const RlAlgorithm& a = named_row(rl_algorithms, "--algorithm", q.algorithm);
    const RlTrainer& t = named_row(rl_trainers, "--trainer", q.trainer);
    if (!q.step.seq.empty())
        throw usage_error(fmt::format(
            "--seq {}: rl's sequences are --prompt-len plus --completion-len", q.step.seq));
    fill_defaults(q, t, a);
    check_run_options(q);
    RlSettings s;
    s.algorithm = &a;
    s.prompt_len = parse_count("--prompt-len", q.prompt_len, 0);
    s.completion_len = parse_count("--completion-len", q.completion_len, 0);
    s.num_generations = parse_count("--num-generations", q.num_generations, 0);
    s.micro_batch = parse_count("--micro-batch", q.step.micro_batch, 0);
    s.prompts = parse_count("--prompts", q.prompts,
                            std::max<std::uint64_t>(1, s.micro_batch / s.num_generations));
    s.reference = q.reference.empty() ? (a.reference ? t.reference : ReferenceMode::none)
                                      : reference_named(q.reference);
    s.reward_model = a.reward_model || !q.reward_model.empty();
    s.frozen_dtype = frozen_dtype_named(q.frozen_dtype);
    s.colocated = placement("--engine-placement", q.placement);
    s.roles_colocated = placement("--role-placement", q.role_placement);
    s.sleeps = on_off("--engine-sleep", q.sleep);
    rollout_settings(q, t, s);
    return s;
}

/// The job, its device and, asked for, its fit.
struct RlRun {
    RlReport report;
    RlSettings settings;
    std::string trainer;
    DeviceSettings device_settings;
    std::optional<UsableMemory> device;
    std::optional<Count> device_high;  ///< with a device
    std::optional<RlFit> fit;
    std::string fit_option;
};

std::string phase_at(const RlPhase& p) { return p.at.empty() ? "" : " (" + p.at + ")"; }

std::string roles_table(const RlReport& r, Unit unit) {
    TextTable table(
        {Align::left, Align::left, Align::right, Align::left, Align::right, Align::left});
    table.row({"role", "model", "parameters", "trained", "kept", "where"});
    for (const RlRole& role : r.roles)
        table.row({std::string(role.role), role.model, digits(role.parameters),
                   role.trained ? "yes" : "no", amount(role.resident, unit), role.where});
    return table.str();
}

std::string phases_table(const RlReport& r, Unit unit) {
    std::string out;
    for (std::size_t i = 0; i < r.phases.size(); ++i) {
        const RlPhase& p = r.phases[i];
        out += fmt::format("\n{} {}: {}{}{}\n", i + 1, p.name, amount(p.peak(), unit), phase_at(p),
                           i == r.peak_phase ? "  <- the job's peak" : "");
        TextTable table({Align::left, Align::right, Align::right});
        for (const RlTerm& t : p.terms)
            table.row({"  " + t.name, digits(t.bytes), amount(t.bytes, unit)});
        out += table.str();
    }
    return out;
}

std::string engine_lines(const RlRun& run, Unit unit) {
    const RlReport& r = run.report;
    const RlSettings& s = run.settings;
    if (!s.algorithm->generates) return "";
    std::string out = fmt::format(
        "\nRollouts: {} sequence{} at once ({} prompt{} x {}), their "
        "KV cache at full length {}\n",
        digits(Count(r.rollouts)), r.rollouts == 1 ? "" : "s", digits(Count(s.prompts)),
        s.prompts == 1 ? "" : "s", digits(Count(s.num_generations)), amount(r.kv_needed, unit));
    if (!r.engine) return out;
    const EngineBudget& b = *r.engine;
    out += fmt::format(
        "  {} {} colocated: share {} of CUDA's {} = {}{}; its KV cache {} ({} tokens){}\n",
        b.rule->engine, b.rule->version, b.share, amount(b.cuda_total, unit),
        amount(r.engine_bytes, unit), s.sleeps ? ", asleep between generations" : "",
        amount(b.kv_cache_bytes, unit), digits(Count(b.tokens)),
        r.kv_needed > b.kv_cache_bytes ? ": the rollouts do not fit at once, it preempts" : "");
    if (!r.engine_starts)
        out += "  the engine does not start: its share is not free beside the roles' weights\n";
    return out;
}

std::string verdict_lines(const RlRun& run, Unit unit) {
    if (!run.device) return "";
    const Count capacity = run.device->rule.usable(), high = *run.device_high;
    std::string out = fmt::format(
        "\n{}: {}\n", run.device->device.given_by,
        high <= capacity
            ? fmt::format("fits: the device's {} (high end) leaves {}", amount(high, unit),
                          amount(Count(capacity.value() - high.value()), unit))
            : fmt::format("does not fit: the device's {} (high end) is {} over {}",
                          amount(high, unit), amount(Count(high.value() - capacity.value()), unit),
                          amount(capacity, unit)));
    if (run.fit)
        out += run.fit->largest == 0
                   ? fmt::format("  largest {}: none fits\n", run.fit_option)
                   : fmt::format("  largest {}: {}{}\n", run.fit_option,
                                 digits(Count(run.fit->largest)),
                                 run.fit->bounded ? "" : " (the search's ceiling)");
    return out;
}

std::string rl_table(const RlRun& run, const std::string& model, Unit unit) {
    const RlReport& r = run.report;
    const RlSettings& s = run.settings;
    std::string out = fmt::format(
        "memcalc rl: {} as {} lays it out, policy {}; prompt {} + completion {} tokens, "
        "micro-batch {}{}\n\n",
        s.algorithm->name, run.trainer, model, digits(Count(s.prompt_len)),
        digits(Count(s.completion_len)), digits(Count(s.micro_batch)),
        s.algorithm->sequences_per_example > 1 ? " (chosen and rejected: twice the sequences)"
                                               : "");
    out += roles_table(r, unit) + engine_lines(run, unit) + phases_table(r, unit);
    const RlPhase& peak = r.phases[r.peak_phase];
    out += fmt::format("\nPeak: {} in {}{} ({} B)\n", amount(r.peak(), unit), peak.name,
                       phase_at(peak), digits(r.peak()));
    return out + verdict_lines(run, unit);
}

nlohmann::json rl_json(const RlRun& run) {
    const RlReport& r = run.report;
    const RlSettings& s = run.settings;
    nlohmann::json roles = nlohmann::json::array(), phases = nlohmann::json::array();
    for (const RlRole& role : r.roles)
        roles.push_back({{"role", role.role},
                         {"model", role.model},
                         {"parameters", role.parameters.value()},
                         {"trained", role.trained},
                         {"kept_bytes", role.resident.value()},
                         {"where", role.where}});
    for (const RlPhase& p : r.phases) {
        nlohmann::json terms = nlohmann::json::array();
        for (const RlTerm& t : p.terms)
            terms.push_back({{"name", t.name}, {"bytes", t.bytes.value()}});
        phases.push_back(
            {{"name", p.name}, {"peak", p.peak().value()}, {"at", p.at}, {"terms", terms}});
    }
    nlohmann::json j = {
        {"memcalc", memcalc::version},
        {"schema", memcalc::json_schema},
        {"command", "rl"},
        {"algorithm", s.algorithm->name},
        {"trainer", run.trainer},
        {"settings",
         {{"prompt_len", s.prompt_len},
          {"completion_len", s.completion_len},
          {"num_generations", s.num_generations},
          {"prompts", s.prompts},
          {"micro_batch", s.micro_batch},
          {"rollouts", r.rollouts}}},
        {"roles", roles},
        {"phases", phases},
        {"peak", {{"bytes", r.peak().value()}, {"phase", r.phases[r.peak_phase].name}}}};
    if (r.engine)
        j["engine"] = {{"name", r.engine->rule->engine},
                       {"version", r.engine->rule->version},
                       {"share", r.engine->share},
                       {"bytes", r.engine_bytes.value()},
                       {"kv_cache_bytes", r.engine->kv_cache_bytes.value()},
                       {"kv_cache_tokens", r.engine->tokens},
                       {"kv_needed_bytes", r.kv_needed.value()},
                       {"starts", r.engine_starts},
                       {"sleeps", s.sleeps}};
    if (run.device)
        j["device"] = {{"name", run.device->device.given_by},
                       {"capacity_bytes", run.device->rule.usable().value()},
                       {"device_high_bytes", run.device_high->value()},
                       {"fits", *run.device_high <= run.device->rule.usable()}};
    if (run.fit)
        j["fit"] = {{"dimension", run.fit_option},
                    {"largest", run.fit->largest},
                    {"bounded", run.fit->bounded}};
    return j;
}

std::string rl_csv(const RlRun& run) {
    std::string out = "algorithm,trainer,phase,peak_bytes,job_peak\n";
    for (std::size_t i = 0; i < run.report.phases.size(); ++i) {
        const RlPhase& p = run.report.phases[i];
        out += fmt::format("{},{},{},{},{}\n", run.settings.algorithm->name, run.trainer,
                           csv_field(p.name), p.peak().value(),
                           i == run.report.peak_phase ? "true" : "false");
    }
    return out;
}

/// The policy's step settings: the recipe, recomputation, kernels and layout.
Settings policy_settings(const RlOptions& q, const Architecture& policy) {
    Settings settings = settings_from(q, q.output.format);
    model_default_activations(q, policy, settings, q.output.format);
    settings.framework.attention = single_attention(q.activation, settings, "rl");
    const std::vector<Recompute> modes = parse_modes(q.step.recompute);
    if (modes.size() != 1) throw usage_error("rl takes one --recompute");
    settings.recompute = modes.front();
    const auto layouts = parse_layouts(q.parallel, q.step, 1);
    if (layouts.size() != 1)
        throw usage_error("rl takes one layout: no comma lists for --dp, --tp, --pp or --zero");
    settings.parallel = layouts.front();
    return settings;
}

std::optional<RlFitDimension> fit_dimension(const std::string& text) {
    if (text.empty()) return std::nullopt;
    if (text == "num-generations") return RlFitDimension::num_generations;
    if (text == "completion-len") return RlFitDimension::completion_len;
    throw usage_error(
        fmt::format("--fit must be num-generations or completion-len (got '{}')", text));
}

}  // namespace

std::string run_rl(const RlOptions& given) {
    RlOptions q = given;
    RlRun run;
    run.settings = rl_settings(q);
    run.trainer = q.trainer;
    run.device = usable_memory(q.device);
    run.device_settings = device_settings(q.device);
    const std::optional<RlFitDimension> fit = fit_dimension(q.fit);
    if (fit && !run.device)
        throw usage_error("--fit needs --device-memory or --gpu: it answers what fits a device");
    const ModelFile model = load_model(q.model, q.framework);
    const std::optional<Architecture> reference =
                                          role_model("--reference-model", q.reference_model),
                                      reward = role_model("--reward-model", q.reward_model),
                                      critic = role_model("--critic-model", q.critic_model);
    const RlModels models{&model.architecture, reference ? &*reference : nullptr,
                          reward ? &*reward : nullptr, critic ? &*critic : nullptr};
    run.settings.policy = policy_settings(q, model.architecture);
    const std::optional<Count> memory =
        run.device ? std::optional<Count>(run.device->rule.memory) : std::nullopt;
    run.report = rl_job(models, run.settings, memory, run.device_settings);
    const auto weigh = [&](const RlReport& r) { return rl_device_high(r, run.device_settings); };
    if (run.device) run.device_high = weigh(run.report);
    if (fit) {
        run.fit_option = q.fit;
        run.fit = rl_fit(models, run.settings, *fit, run.device->rule.usable(), memory,
                         run.device_settings, weigh);
    }
    return in_format(
        q.output.format, [&] { return rl_json(run); }, [&] { return rl_csv(run); },
        [&] { return rl_table(run, model.architecture.name, unit_of(q.output)); });
}

}  // namespace memcalc::cli
