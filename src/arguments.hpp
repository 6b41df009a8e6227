#pragma once
// The command line's values, as typed, and their parsing into the core's settings. Every error
// names the option and the value.
#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "memcalc/memcalc.hpp"
#include "render.hpp"
#include "suggest.hpp"

namespace memcalc::cli {

/// A bad argument: exit status 2, like CLI11's own parse errors.
struct usage_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

/// The command line's options, as typed, in groups a command composes (commands.hpp): each group
/// is registered by option_groups.hpp and parsed into the core's settings by the functions below.
/// Values stay strings until then, so every error names the option and the value as given; an
/// empty string is an option not given.

/// Which model: one of a preset, a model file and a config.json (or its folder).
struct ModelOptions {
    std::string preset, model_file, config;
    std::map<std::string, std::string> program;  ///< program facts given, by key (program_facts)
    std::string expert_imbalance;                ///< --expert-imbalance F
    std::string mtp_layers;                      ///< --mtp-layers N
};

/// The sequence, the micro-batch and the recomputation of a training step.
struct StepOptions {
    std::string seq, micro_batch = "1", recompute = "none";
    std::string recompute_modules;   ///< empty: Megatron-LM's default, core_attn
    std::string recompute_layers;    ///< empty: every layer of the recomputation
    std::string images, image_size;  ///< --images N, --image-size WIDTHxHEIGHT
};

/// The recipe: bytes per parameter, built in or from a file.
struct RecipeOptions {
    std::string recipe{default_recipe}, recipe_file;
};

/// Fine-tuning: which parameters train (finetune.hpp).
struct TrainingOptions {
    std::string train = "full", frozen, lora_rank, lora_targets, lora_dropout, lora_dtype,
                lora_variant, quantizer, double_quant, bitsandbytes_version, prompt_tokens,
                prompt_start;
};

/// The activation model and the attention kernels.
struct ActivationOptions {
    std::string activations;  ///< empty: korthikanti, or architecture to fine-tune
    std::string attention;    ///< empty: the profile's
};

/// How and where the result is written.
struct OutputOptions {
    std::string units = "gb", format = "table";
    std::string file;  ///< --output FILE instead of stdout
};

/// The framework: a profile, and its values the flags override (empty: the profile's).
struct FrameworkOptions {
    std::string profile{default_profile}, profile_file;
    std::map<std::string, std::string> framework;  ///< by framework_switches key: "loss" -> "bf16"
    std::string loss_chunks;                       ///< --loss-chunks, with --loss chunked
    std::string loss_chunk_tokens;  ///< --loss-chunk-tokens, with --loss chunked or chunked-bf16
    std::string cublas_workspace_config;  ///< --cublas-workspace-config, as the variable is set
};

/// How the step is spread over devices; empty means the default (plan: every one, searched).
struct ParallelOptions {
    std::string dp, tp, pp, cp, ep, etp, vpp, zero, shard_group, microbatches, global_batch;
    std::string offload = "none";
    std::string first_stage_layers, last_stage_layers;
    std::string schedule;       ///< --schedule: the pipeline schedule (plan: a comma list, or all)
    std::string loading;        ///< --loading: how the model is loaded (loading.hpp's rows)
    std::string host_memory;    ///< --host-memory: each device's share of its node's
    std::string gpus_per_node;  ///< for --compare deepspeed
    bool sp = false;
    bool no_sp = false;  ///< plan's --no-sp: only layouts without sequence parallelism
};

/// The device: its memory given, or a GPU's by name or file; and what the model may not use of it.
/// The margin kept out of a device's memory by default: none, as the context, workspaces,
/// communicators, CUDA graphs and fragmentation are modelled (device_memory.hpp, serve_device.hpp).
inline constexpr const char* default_reserve = "0B";
struct DeviceOptions {
    std::string device_memory, gpu, gpu_file;
    std::string reserve;                ///< empty: the command's default, where a device is given
    std::string allocator = "caching";  ///< --allocator: caching or expandable
    std::string max_split_size;         ///< --max-split-size; empty: no limit
};

/// "1024,2048": the items of a comma list, spaces ignored; an empty item is an error.
std::vector<std::string> split_list(const std::string& option, const std::string& text);
/// A comma list of positive integers that fit in 64 bits.
std::vector<std::uint64_t> parse_sizes(const std::string& option, const std::string& text);
/// One positive integer option ("--tp 8"); `fallback` when it was not given.
std::uint64_t parse_count(const std::string& option, const std::string& text,
                          std::uint64_t fallback);
std::vector<Recompute> parse_modes(const std::string& text);
/// CUBLAS_WORKSPACE_CONFIG's bytes (":4096:8"); a usage error naming `text` where it is not pairs.
std::uint64_t parse_cublas_workspace_config(const std::string& option, const std::string& text);
/// --images N and --image-size WIDTHxHEIGHT: the size needs images (a tower of one size needs no
/// size: the estimate says where one is missing).
ImageInput parse_images(const std::string& images, const std::string& size);
/// --recompute-modules: Megatron-LM's module names, a comma list (empty: core_attn alone).
ModuleSet parse_recompute_modules(const StepOptions& q);
/// --recompute-layers N (0 and up) or all (none returned: every layer), which needs --recompute
/// full (`searched`: a plan's list that has full).
std::optional<std::uint64_t> parse_recompute_layers(const StepOptions& q, bool searched = false);
/// --train, --frozen and the --lora-* options.
FineTuning parse_fine_tuning(const TrainingOptions& q);
std::vector<Attention> parse_attention(const std::string& text);
/// A switch's value as typed ("--loss bf16"), or an error naming it and the choices.
template <class E, std::size_t N, class Owner>
E parse_switch(const Switch<E, N, Owner>& row, const std::string& text) {
    if (const E* v = row.find(text)) return *v;
    std::vector<std::string> names;
    for (E v : row.values) names.emplace_back(row.name(v));
    const std::string or_release =
        row.read ? ", or a release from " + std::string(row.name(row.values[0])) + " on" : "";
    throw usage_error(row.option() + " must be " + row.choice_list() + or_release + " (got '" +
                      text + "')" + did_you_mean(text, names));
}
std::vector<unsigned> parse_zero(const std::string& text);
/// --offload as plan takes it: a comma list of none, optimizer, parameters and activations, each a
/// ZeRO-Offload mode, activations, or both joined by '+' (optimizer+activations).
std::vector<OffloadMode> parse_offloads(const std::string& text);
/// --schedule: a comma list of schedule names (schedule.hpp's rows), or "all" of them.
std::vector<Schedule> parse_schedules(const std::string& text);
Format parse_format(const std::string& text);
/// A memory size: "80GB", "80 GB", "2GiB", "1.5TB", "512MiB" or plain bytes.
Count parse_size(const std::string& option, const std::string& text);
/// Every combination of the --dp, --tp, --pp and --zero lists; micro-batches follow --global-batch.
/// `step` gives --recompute-layers and the --recompute it needs.
std::vector<Parallelism> parse_layouts(const ParallelOptions& q, const StepOptions& step,
                                       std::uint64_t micro_batch);

/// The most configurations a sweep makes unless --sweep-limit says otherwise: a few seconds of CSV.
inline constexpr std::uint64_t default_sweep_limit = 1'000'000;
/// Refuses a sweep whose lists (--seq, -b, --dp, --tp, --pp, --zero, --attention, --recompute, each
/// `lists` gives with its length) make more configurations than `sweep_limit` (--sweep-limit, as
/// typed), before any is made.
using ListLengths = std::vector<std::pair<std::string, std::size_t>>;  ///< option, items
void check_sweep_size(const std::string& sweep_limit, const ListLengths& lists);
/// The lengths of the layout lists parse_layouts combines: --dp, --tp, --pp and --zero.
ListLengths layout_list_lengths(const ParallelOptions& q);

}  // namespace memcalc::cli
