// What the subcommands share: checking their options and loading the model.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "commands.hpp"
#include "gpu_file.hpp"
#include "model_folder.hpp"
#include "printable.hpp"
#include "profile_file.hpp"
#include "recipe_file.hpp"
#include "suggest.hpp"

namespace memcalc::cli {

void check_run_options(const TrainingStepOptions& options) {
    const ModelOptions& m = options.model;
    if (m.preset.empty() + m.model_file.empty() + m.config.empty() != 2)
        throw usage_error(
            "give one model: --preset NAME (see 'memcalc presets'), --model-file PATH or --config "
            "PATH");
    const RecipeOptions& q = options.recipe;
    if (find_recipe(q.recipe) == nullptr) {
        std::vector<std::string> names;
        for (const auto& r : recipes) names.emplace_back(r.name);
        throw usage_error(fmt::format("unknown --recipe '{}'{}; 'memcalc recipes' lists them",
                                      q.recipe, did_you_mean(q.recipe, names)));
    }
    const FrameworkOptions& f = options.framework;
    if (f.profile_file.empty() && find_profile(f.profile) == nullptr) {
        std::vector<std::string> names;
        for (const auto& p : framework_profiles) names.emplace_back(p.name);
        throw usage_error(fmt::format("unknown --profile '{}'{}; 'memcalc profiles' lists them",
                                      f.profile, did_you_mean(f.profile, names)));
    }
}

FrameworkProfile chosen_profile(const FrameworkOptions& q) {
    // check_run_options has named a wrong built-in one already
    return q.profile_file.empty() ? *find_profile(q.profile) : load_profile_file(q.profile_file);
}

std::vector<std::string>& pending_notes() {
    static std::vector<std::string> notes;
    return notes;
}

ModelFile load_model(const ModelOptions& q, const FrameworkOptions& framework) {
    ModelOptions with_profile = q;
    for (const auto& [key, value] : chosen_profile(framework).program)
        with_profile.program.emplace(std::string(key), std::string(value));  // an option holds
    return load_model(with_profile);
}

namespace {
/// --expert-imbalance F: a number from 1 on, for a mixture-of-experts model.
double parse_imbalance(const std::string& text, const Architecture& m) {
    char* end = nullptr;
    const double f = std::strtod(text.c_str(), &end);
    if (text.empty() || end != text.c_str() + text.size() || !(f >= 1.0 && f <= 1e6))
        throw usage_error("--expert-imbalance must be a number from 1 to 1e6 (got '" +
                          printable(text) + "')");
    if (!m.is_moe() && f != 1.0)
        throw usage_error("--expert-imbalance " + text + ": " + m.name +
                          " has no mixture-of-experts layer");
    return f;
}
}  // namespace

ModelFile load_model(const ModelOptions& q) {
    ModelFile m = !q.preset.empty()                         ? load_preset(q.preset)
                  : !q.model_file.empty()                   ? load_model_file(q.model_file)
                  : std::filesystem::is_directory(q.config) ? load_model_folder(q.config)
                                                            : load_hf_config(q.config);
    m.architecture.name = printable(m.architecture.name);
    for_each_program_fact([&](const auto& row) {
        const auto given = q.program.find(std::string(row.key));
        if (given != q.program.end()) m.architecture.*row.member = parse_switch(row, given->second);
    });
    if (!q.expert_imbalance.empty())
        m.architecture.expert_imbalance = parse_imbalance(q.expert_imbalance, m.architecture);
    if (!q.mtp_layers.empty())  // 0 turns a model file's modules off
        m.architecture.mtp_layers =
            q.mtp_layers == "0" ? 0 : parse_count("--mtp-layers", q.mtp_layers, 0);
    if (!q.program.empty() || !q.expert_imbalance.empty() || !q.mtp_layers.empty())
        validate(m.architecture);  // a buffer needs max_positions
    return m;
}

ActivationModel activation_model(const TrainingStepOptions& q) {
    const std::string& activations = q.activation.activations;
    // Fine-tuning freezes weights, which Korthikanti's formula cannot: it takes the architecture
    // model.
    if (activations.empty())
        return q.training.train == "full" && q.training.frozen.empty()
                   ? ActivationModel::korthikanti
                   : ActivationModel::architecture;
    return activations == "architecture" ? ActivationModel::architecture
                                         : ActivationModel::korthikanti;
}

namespace {

/// The profile --profile or --profile-file names, each framework flag given overriding its value.
FrameworkProfile framework_from(const FrameworkOptions& q, Framework& f) {
    const FrameworkProfile profile = chosen_profile(q);
    f = profile.framework;
    for_each_switch([&](const auto& row) {
        const auto given = q.framework.find(std::string(row.key));
        if (given != q.framework.end()) f.*row.member = parse_switch(row, given->second);
    });
    if (!q.loss_chunks.empty()) {
        if (!chunks_by_count(f.loss))
            throw usage_error("--loss-chunks " + q.loss_chunks +
                              ": only --loss chunked or chunked-compiled splits the loss so");
        f.loss_chunks = parse_count("--loss-chunks", q.loss_chunks, f.loss_chunks);
    }
    if (!q.loss_chunk_tokens.empty()) {
        if (!chunked_loss(f.loss))
            throw usage_error(
                "--loss-chunk-tokens " + q.loss_chunk_tokens +
                ": only --loss chunked, chunked-bf16 or chunked-compiled splits the loss");
        if (!q.loss_chunks.empty())
            throw usage_error("--loss-chunk-tokens " + q.loss_chunk_tokens +
                              ": give it or --loss-chunks, not both");
        f.loss_chunk_tokens = parse_count("--loss-chunk-tokens", q.loss_chunk_tokens, 1);
    }
    if (!q.cublas_workspace_config.empty())
        f.cublas_workspace =
            parse_cublas_workspace_config("--cublas-workspace-config", q.cublas_workspace_config);
    return profile;
}

}  // namespace

namespace {

/// What needs the architecture model: the setting (as the user would name it) and why
/// Korthikanti's formula cannot describe it; empty where nothing does.
struct ArchitectureNeed {
    std::string setting, why;
};

ArchitectureNeed architecture_need(const TrainingStepOptions& q, const Settings& settings,
                                   const FrameworkProfile& profile) {
    const Framework& f = settings.framework;
    const std::string from_profile = fmt::format("--profile {}", profile.name);
    if (!settings.tuning.is_full())
        return {fmt::format("--train {}", training_name(settings.tuning.mode)),
                "Korthikanti's formula has every weight trained"};
    if (settings.images.any())
        return {"--images " + q.step.images, "the tower's tensors are its blocks' rows"};
    if (f.platform == Platform::cpu)
        return {q.framework.framework.count("platform") ? "--platform cpu"
                                                        : from_profile + " (--platform cpu)",
                "Korthikanti's formula has no kernels to choose"};
    const RecipeOptions& recipe = q.recipe;
    if (settings.recipe.autocast || settings.recipe.linears || settings.recipe.casts)
        return {
            recipe.recipe_file.empty() ? "--recipe " + recipe.recipe
                                       : "--recipe-file " + recipe.recipe_file,
            settings.recipe.casts
                ? std::string("its linear layers' casts are each linear's temporaries, which "
                              "Korthikanti's formula does not list")
                : fmt::format("{} several dtypes, which Korthikanti's formula cannot tell apart",
                              settings.recipe.autocast
                                  ? "autocast gives a layer's tensors"
                                  : "its narrow linear layers give a layer's tensors")};
    if (chunked_loss(f.loss) || f.loss == LossKernel::fused_linear)
        return {q.framework.framework.count("loss")
                    ? "--loss " + std::string(loss_kernel_name(f.loss))
                    : from_profile,
                "Korthikanti's formula has the whole logits and their fp32 copy at once"};
    const std::vector<Attention> asked = q.activation.attention.empty()
                                             ? std::vector<Attention>{f.attention}
                                             : parse_attention(q.activation.attention);
    if (std::find(asked.begin(), asked.end(), Attention::flash) != asked.end())
        return {q.activation.attention.empty() ? from_profile + " (--attention flash)"
                                               : "--attention flash",
                "Korthikanti's formula describes eager attention"};
    return {};
}

/// Says once on stderr, in table output, which setting chose the architecture model.
void tell_chosen(const ArchitectureNeed& need, const std::string& format) {
    if (need.setting.empty() || format != "table") return;
    pending_notes().push_back(
        fmt::format("{} takes the architecture model (--activations architecture): {}",
                    need.setting, need.why));
}

}  // namespace

Settings settings_from(const TrainingStepOptions& q, const std::string& format) {
    Settings settings;
    const RecipeOptions& recipe = q.recipe;
    // check_run_options has named a wrong built-in one already
    settings.recipe = recipe.recipe_file.empty() ? builtin_recipe(recipe.recipe)
                                                 : load_recipe_file(recipe.recipe_file);
    settings.activations = activation_model(q);
    settings.recompute_modules = parse_recompute_modules(q.step);
    settings.tuning = parse_fine_tuning(q.training);
    settings.images = parse_images(q.step.images, q.step.image_size);
    const FrameworkProfile profile = framework_from(q.framework, settings.framework);
    if (settings.recipe.casts != nullptr && format == "table")  // what its casts are read from
        pending_notes().push_back(fmt::format("{}: {} casts as read from {} (not measured)",
                                              settings.recipe.name, settings.recipe.casts->name,
                                              settings.recipe.casts->source));
    if (settings.activations == ActivationModel::architecture) return settings;
    const ArchitectureNeed need = architecture_need(q, settings, profile);
    if (need.setting.empty()) return settings;
    if (!q.activation.activations.empty())  // --activations korthikanti, said
        throw usage_error(
            fmt::format("{} needs --activations architecture: {}", need.setting, need.why));
    settings.activations = ActivationModel::architecture;
    tell_chosen(need, format);
    return settings;
}

void model_default_activations(const TrainingStepOptions& q, const Architecture& m,
                               Settings& settings, const std::string& format) {
    if (!q.activation.activations.empty() || settings.activations == ActivationModel::architecture)
        return;
    // Dense layers of one mixer: the formula's GPT layer, or its Mamba variant.
    // A Mamba-2 layer has no formula of its own.
    const bool hybrid = (m.any_mixer(Mixer::attention) && m.any_mixer(Mixer::mamba)) ||
                        m.any_mixer(Mixer::mamba2) || m.any_mixer(Mixer::attention_mamba2) ||
                        m.any_mixer(Mixer::gated_deltanet) || m.any_mixer(Mixer::none) ||
                        m.any_mixer(Mixer::cross_attention) ||
                        !m.every_kind([](const Architecture& v) { return v.has_mlp; });
    const bool latent = !m.every_kind([](const Architecture& v) { return !v.mla.enabled(); });
    if (!m.any_moe() && !latent && !hybrid && m.mtp_layers == 0) return;
    settings.activations = ActivationModel::architecture;
    tell_chosen(
        {m.name + (m.any_moe()                            ? " (mixture of experts)"
                   : latent                               ? " (latent attention)"
                   : m.any_mixer(Mixer::attention_mamba2) ? " (attention and Mamba-2 side by side)"
                   : m.any_mixer(Mixer::mamba2)           ? " (Mamba-2 layers)"
                   : m.any_mixer(Mixer::gated_deltanet)   ? " (Gated DeltaNet layers)"
                   : m.any_mixer(Mixer::cross_attention)  ? " (cross-attention layers)"
                   : hybrid                               ? " (attention and Mamba layers)"
                                                          : " (multi-token prediction)"),
         "Korthikanti's formula describes a dense GPT layer"},
        format);
}

std::optional<DeviceMemory> device_memory(const DeviceOptions& q) {
    if (!q.device_memory.empty())
        return DeviceMemory{parse_size("--device-memory", q.device_memory),
                            "--device-memory " + q.device_memory, std::nullopt};
    if (!q.gpu_file.empty()) {
        const Gpu g = load_gpu_file(q.gpu_file);
        return DeviceMemory{g.memory, fmt::format("--gpu-file {} ({})", q.gpu_file, g.name), g};
    }
    if (q.gpu.empty()) return std::nullopt;
    const Gpu* g = find_gpu(q.gpu);
    if (g == nullptr) {
        std::vector<std::string> names;
        for (const auto& each : gpus) names.emplace_back(each.name);
        throw usage_error(fmt::format("unknown --gpu '{}'{}; 'memcalc gpus' lists them", q.gpu,
                                      did_you_mean(q.gpu, names)));
    }
    return DeviceMemory{g->memory, "--gpu " + q.gpu, *g};
}

std::optional<UsableMemory> usable_memory(const DeviceOptions& q) {
    const std::optional<DeviceMemory> device = device_memory(q);
    if (!device && !q.reserve.empty())  // not given, the default: a device's
        throw usage_error(
            fmt::format("--reserve {} needs --device-memory, --gpu or --gpu-file: it "
                        "is kept out of a device's memory",
                        q.reserve));
    if (!device) return std::nullopt;
    const std::string reserve = q.reserve.empty() ? std::string(default_reserve) : q.reserve;
    const Count bytes = parse_size("--reserve", reserve);
    if (bytes >= device->bytes)
        throw usage_error(
            fmt::format("--reserve {} leaves nothing of {}", reserve, device->given_by));
    return UsableMemory{*device, {device->bytes, bytes}};
}

const LoadingMethod* parse_loading(const std::string& text) {
    if (text.empty()) return nullptr;
    if (const LoadingMethod* m = loading_method(text)) return m;
    std::string names;
    for (const LoadingMethod& m : loading_methods)
        names += (names.empty() ? "" : ", ") + std::string(m.name);
    throw usage_error(fmt::format("--loading must be one of {} (got '{}')", names, text));
}

DeviceSettings device_settings(const DeviceOptions& q) {
    DeviceSettings out;
    if (q.allocator == "expandable")
        out.allocator.mode = AllocatorMode::expandable;
    else if (q.allocator != "caching")
        throw usage_error(
            fmt::format("--allocator must be caching or expandable (got '{}')", q.allocator));
    if (!q.max_split_size.empty()) {
        const Count bytes = parse_size("--max-split-size", q.max_split_size);
        // CUDACachingAllocator refuses a max_split_size_mb of 20 or less: a large segment's size.
        if (bytes.value() <= allocator_rules::kLargeBuffer)
            throw usage_error(fmt::format(
                "--max-split-size must be more than 20MiB, as PyTorch requires (got '{}')",
                q.max_split_size));
        out.allocator.max_split_size = bytes.value();
    }
    // A GPU file named as a listed GPU (its row of 'memcalc gpus --format json') has its facts.
    if (!q.gpu.empty()) out.gpu = gpu_facts_of(q.gpu);
    if (!q.gpu_file.empty()) out.gpu = gpu_facts_of(load_gpu_file(q.gpu_file).name);
    return out;
}

std::vector<Attention> attentions_from(const ActivationOptions& q, const Settings& settings) {
    // settings_from has taken the architecture model for a fused kernel, or refused it
    if (q.attention.empty()) return {settings.framework.attention};
    return parse_attention(q.attention);
}

Attention single_attention(const ActivationOptions& q, const Settings& settings,
                           const char* command) {
    const auto attentions = attentions_from(q, settings);
    if (attentions.size() != 1) throw usage_error(fmt::format("{} takes one --attention", command));
    return attentions.front();
}

}  // namespace memcalc::cli
