#pragma once
// The commands, a file each (command_estimate.cpp, command_fit.cpp, command_plan.cpp,
// command_serve.cpp, command_catalogues.cpp): the options each takes, composed of the groups in
// arguments.hpp, and what they share. command_table.cpp registers each command's options;
// command_line.cpp parses and dispatches.
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "arguments.hpp"
#include "model_file.hpp"
#include "output_file.hpp"
#include "render.hpp"

namespace memcalc::cli {

/// A progress line on stderr, only when stderr is a terminal and the work has run past a second.
class Progress {
public:
    /// `every`: how many items between looks at the clock.
    Progress(const char* what, std::size_t every)
        : what_(what), every_(every), terminal_(isatty(fileno(stderr)) != 0) {}
    ~Progress() {
        if (shown_) std::cerr << "\r\033[K" << std::flush;
    }
    void operator()(std::size_t done) {
        if (done % every_ == 0) at(done);
    }
    /// Looks at the clock whatever the count: for a caller that counts in large steps.
    void at(std::size_t done) {
        if (!terminal_) return;
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (seconds < 1) return;
        shown_ = true;
        std::cerr << "\r" << what_ << ": " << done << " evaluated ("
                  << static_cast<long long>(done / seconds) << "/s)" << std::flush;
    }

private:
    const char* what_;
    std::size_t every_;
    bool terminal_, shown_ = false;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

/// What every command that estimates a training step takes (estimate, fit and plan).
struct TrainingStepOptions {
    ModelOptions model;
    StepOptions step;
    RecipeOptions recipe;
    TrainingOptions training;
    ActivationOptions activation;
    OutputOptions output;
    FrameworkOptions framework;

    std::string output_file() const { return output.file; }
};

/// What the estimate's report also shows or writes.
struct ReportOptions {
    std::string compare, plot, sweep_limit;
    DeviceOptions device;  ///< drawn in plots, checked in the report
    bool timeline = false, per_layer = false, ops = false;
};

/// memcalc with no command: one estimate, or a sweep over comma lists.
struct EstimateOptions : TrainingStepOptions {
    ParallelOptions parallel;
    ReportOptions report;
};

/// memcalc fit: the longest sequence or largest micro-batch that fits.
struct FitOptions : TrainingStepOptions {
    ParallelOptions parallel;
    DeviceOptions device;
    std::string multiple_of;
    FitOptions() { step.recompute = "all"; }
};

/// memcalc plan: the layouts of a cluster that fit, ranked; or the fewest GPUs.
struct PlanOptions : TrainingStepOptions {
    ParallelOptions parallel;  ///< pinned: each given restricts the search
    DeviceOptions device;
    std::string gpus, top, max_tp, search_limit;
    std::string time_limit = "10";  ///< seconds; past them the best found so far
    PlanOptions() { step.recompute = step.micro_batch = ""; }  // not given: the search tries each
};

/// memcalc serve: the memory of serving a model.
struct ServeOptions {
    ModelOptions model;
    OutputOptions output;
    DeviceOptions device;
    std::string context, batch, tp, kv_dtype, weights = "bf16", block_size, prefill_chunk;
    bool enforce_eager = false;  ///< --enforce-eager: the engine captures no CUDA graphs
    /// --engine and its settings: the KV cache as the engine budgets it.
    std::string engine, engine_version, gpu_memory_utilization, mem_fraction_static, max_model_len,
        max_num_seqs, max_num_batched_tokens;
    std::string max_loras, max_lora_rank;  ///< vLLM's LoRA slots and their rank
    std::string kv_cache_dtype;            ///< --kv-dtype as the engine spells it
    /// A speculative-decoding draft model and the tokens it proposes (vLLM's
    /// num_speculative_tokens).
    std::string draft_preset, draft_config, num_speculative_tokens;
    std::string images, image_size;  ///< images a prompt may hold, the largest one's size

    std::string output_file() const { return output.file; }
};

/// memcalc rl: a post-training job's roles, rollout engine and phases on one device.
struct RlOptions : TrainingStepOptions {
    ParallelOptions parallel;
    DeviceOptions device;
    std::string algorithm, trainer = "trl";
    std::string reference, reference_model, reward_model, critic_model, frozen_dtype;
    std::string num_generations, prompt_len, completion_len, prompts;
    /// The rollouts: hf or an engine, where it runs, its version, share, sleep and tp.
    std::string rollout, placement, role_placement, engine_version, gpu_memory_utilization, sleep,
        engine_tp;
    std::string fit;  ///< --fit: num-generations or completion-len
    RlOptions() { recipe.recipe = step.recompute = step.micro_batch = ""; }  // the trainer's
};

/// A catalogue (memcalc presets, recipes, ...): only --format.
struct CatalogueOptions {
    std::string format = "table";
    std::string output_file() const { return {}; }
};

/// Checks the options every estimating command shares, before any model is read.
void check_run_options(const TrainingStepOptions& q);

/// The model a command names (preset, model file or config.json), its name made printable.
ModelFile load_model(const ModelOptions& q);
/// The model, with the program facts the framework profile's own code has (an option holds).
ModelFile load_model(const ModelOptions& q, const FrameworkOptions& framework);
/// What a command that succeeds says on stderr after its output (each once); an error drops them.
std::vector<std::string>& pending_notes();
/// The built-in profile --profile names, or the file --profile-file reads.
FrameworkProfile chosen_profile(const FrameworkOptions& q);

ActivationModel activation_model(const TrainingStepOptions& q);

/// The settings every estimating command reads the same way: the recipe, the activation model and
/// the framework (the profile's values, each flag given overriding one).
/// Fit and plan take one --attention; the estimate sweeps a list and sets it per configuration.
/// The settings; a setting the formula cannot describe takes the architecture model unless
/// --activations says otherwise (said on stderr in `format` table).
Settings settings_from(const TrainingStepOptions& q, const std::string& format = "json");
/// A model whose layers the formula does not describe (experts, latent attention, hybrids) takes
/// the architecture model unless --activations says.
void model_default_activations(const TrainingStepOptions& q, const Architecture& m,
                               Settings& settings, const std::string& format = "json");
/// A device's memory and the option that gave it ("--gpu h100-sxm"), for messages.
struct DeviceMemory {
    Count bytes;
    std::string given_by;
    std::optional<Gpu> gpu;  ///< the GPU named, with its speeds; none for --device-memory
};
/// --device-memory, or the memory of --gpu or --gpu-file; none when no option gives one.
std::optional<DeviceMemory> device_memory(const DeviceOptions& q);
/// A device and the rule its verdicts follow (DeviceFit).
struct UsableMemory {
    DeviceMemory device;
    DeviceFit rule;
};
/// The device and its margin (--reserve, none by default); none without a device; a reserve
/// given without one, or one that leaves nothing, is an error.
std::optional<UsableMemory> usable_memory(const DeviceOptions& q);
/// The allocator's settings (--allocator, --max-split-size) and the GPU's CUDA major version.
DeviceSettings device_settings(const DeviceOptions& q);
/// --loading's row; nullptr where not given (an unknown one is an error naming the rows).
const LoadingMethod* parse_loading(const std::string& text);

/// The attention kernels to estimate: --attention's list, or the profile's one.
std::vector<Attention> attentions_from(const ActivationOptions& q, const Settings& settings);
Attention single_attention(const ActivationOptions& q, const Settings& settings,
                           const char* command);

/// One rendering in the format asked for (--format): only that format's renderer runs.
template <class Json, class Csv, class Table>
std::string in_format(const std::string& format, Json&& json, Csv&& csv, Table&& table) {
    switch (parse_format(format)) {
        case Format::json: return json().dump(2) + "\n";
        case Format::csv: return csv();
        case Format::table: return table();
    }
    return {};
}

inline Unit unit_of(const OutputOptions& q) { return q.units == "gib" ? Unit::gib : Unit::gb; }

/// The estimate (and its sweeps): `out` is what goes to stdout or --output, `files` a plot asked
/// for.
void run_estimate(const EstimateOptions& q, Spool& out, std::vector<PendingFile>& files);
std::string run_fit(const FitOptions& q);
std::string run_plan(const PlanOptions& q);
std::string run_serve(const ServeOptions& q);
/// serve's --engine and its options as the engine's settings; none without --engine.
std::optional<EngineSettings> engine_settings(const ServeOptions& q);
std::string run_rl(const RlOptions& q);
std::string run_presets(const std::string& format);
std::string run_recipes(const std::string& format);
std::string run_profiles(const std::string& format);
std::string run_gpus(const std::string& format);
std::string run_activation_functions(const std::string& format);
std::string run_program_facts(const std::string& format);
std::string run_optimizers(const std::string& format);

}  // namespace memcalc::cli
