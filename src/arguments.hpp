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

/// What the user asked for, before the model is known.
struct Request {
    std::string preset, model_file, config, seq, micro_batch = "1", recompute = "none", recipe{default_recipe}, recipe_file;
    std::string recompute_modules;  ///< empty: Megatron-LM's default, core_attn
    std::string recompute_layers;   ///< empty: every layer of the recomputation
    std::string units = "gb", format = "table", activations;  ///< empty: korthikanti, or architecture to fine-tune
    // Fine-tuning: which parameters train (finetune.hpp).
    std::string train = "full", frozen, lora_rank, lora_targets, lora_dropout, lora_dtype, lora_variant;
    // The framework: a profile, and its values the flags override (empty: the profile's).
    std::string profile{default_profile}, profile_file, attention;
    std::map<std::string, std::string> framework;  ///< by framework_switches key: "loss" -> "bf16"
    bool timeline = false, per_layer = false, ops = false;
    // Parallelism, as typed; empty means the default.
    std::string dp, tp, pp, cp, ep, etp, vpp, zero, shard_group, microbatches, global_batch, offload = "none";
    std::string first_stage_layers, last_stage_layers;
    std::string schedule;  ///< --schedule: the pipeline schedule (plan: a comma list, or all)
    std::string compare, gpus_per_node;
    std::string device_memory, reserve = "2GiB", multiple_of;  // fit and plan
    std::string host_memory;                                    // --host-memory: each device's share of its node's
    std::string gpu, gpu_file;                                  // a device by name or file, for its memory
    std::string gpus, top, max_tp, search_limit;                // plan
    std::string plot;                                           // --plot FILE.svg
    std::string sweep_limit;                                    // --sweep-limit N configurations
    std::string context, batch, kv_dtype = "bf16", weights = "bf16", block_size, prefill_chunk;  // serve
    std::string output;                                         // --output FILE instead of stdout
    bool sp = false;
};

/// One positive integer option ("--tp 8"); `fallback` when it was not given.

/// "1024,2048": the items of a comma list, spaces ignored; an empty item is an error.
std::vector<std::string> split_list(const std::string& option, const std::string& text);
/// A comma list of positive integers that fit in 64 bits.
std::vector<std::uint64_t> parse_sizes(const std::string& option, const std::string& text);
/// One positive integer option ("--tp 8"); `fallback` when it was not given.
std::uint64_t parse_count(const std::string& option, const std::string& text, std::uint64_t fallback);
std::vector<Recompute> parse_modes(const std::string& text);
/// --recompute-modules: Megatron-LM's module names, a comma list (empty: core_attn alone).
ModuleSet parse_recompute_modules(const Request& q);
/// --recompute-layers N (0 and up), which needs --recompute full (`searched`: a plan's list that has full).
std::optional<std::uint64_t> parse_recompute_layers(const Request& q, bool searched = false);
/// --train, --frozen and the --lora-* options.
FineTuning parse_fine_tuning(const Request& q);
std::vector<Attention> parse_attention(const std::string& text);
/// A framework switch's value as typed ("--loss bf16"), or an error naming it and the choices.
template <class E, std::size_t N>
E parse_switch(const Switch<E, N>& row, const std::string& text) {
    if (const E* v = row.find(text)) return *v;
    std::vector<std::string> names;
    for (E v : row.values) names.emplace_back(row.name(v));
    throw usage_error(row.option() + " must be " + row.choice_list() + " (got '" + text + "')" + did_you_mean(text, names));
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
std::vector<Parallelism> parse_layouts(const Request& q, std::uint64_t micro_batch);

/// The most configurations a sweep makes unless --sweep-limit says otherwise: a few seconds of CSV.
inline constexpr std::uint64_t default_sweep_limit = 1'000'000;
/// Refuses a sweep whose lists (--seq, -b, --dp, --tp, --pp, --zero, --attention, --recompute, each
/// `lists` gives with its length) make more configurations than --sweep-limit, before any is made.
using ListLengths = std::vector<std::pair<std::string, std::size_t>>;  ///< option, items
void check_sweep_size(const Request& q, const ListLengths& lists);
/// The lengths of the layout lists parse_layouts combines: --dp, --tp, --pp and --zero.
ListLengths layout_list_lengths(const Request& q);

}  // namespace memcalc::cli
