#pragma once
/// How a serving engine sizes its KV cache, by its own rule: vLLM takes a share of the device's
/// memory (gpu_memory_utilization) and gives the cache what its profiling run leaves; SGLang keeps
/// a static fraction (mem_fraction_static) for the weights and the cache, and gives the cache the
/// rest of it once the weights are loaded. Each version
/// whose rule differs is a row of `engine_rules`, with where its source says so; the terms are
/// memcalc's figures for what the engine measures (its weights, the profiling forward's peak, the
/// memory outside PyTorch). validation/published/engines-rules.md has the sources in full.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memcalc/device_memory.hpp"
#include "memcalc/error.hpp"
#include "memcalc/outside.hpp"
#include "memcalc/serve.hpp"

namespace memcalc {

/// What the engine's memory measurement counts outside PyTorch.
enum class NonTorch : std::uint8_t {
    since_start,     ///< all of it: the CUDA context and NCCL's buffers among it
    since_snapshot,  ///< what grew after a snapshot taken once NCCL is up: the context not
};

/// What the engine's share is taken from before the cache: vLLM's profiling run measures its
/// activations' peak; SGLang leaves them to the rest of the device (1 - its fraction).
enum class ShareRule : std::uint8_t { profiled, static_fraction };

/// How the engine gives a speculative-decoding draft model its KV cache.
enum class DraftRule : std::uint8_t {
    proportional,  ///< V0: the blocks the model alone would have, split by the two block sizes
    shared,        ///< V1: one pool whose block holds every layer of both (a page over all)
    refused,       ///< the engine does not run a draft model, or memcalc does not model its pool
};

struct EngineRule {
    Text engine, version;  ///< "vllm", "0.10": the first version the row holds for
    Text mode;             ///< "V0" or "V1"; SGLang's: "static"
    ShareRule share;
    NonTorch non_torch;
    bool graphs_in_budget;  ///< its CUDA graphs' memory estimated and taken from the cache
    /// Without chunked prefill (V0) a profiling batch of the whole model length: the default
    /// max_num_batched_tokens is max(max_model_len, 2048); else the usage context's default.
    bool batched_tokens_model_length;
    DraftRule draft;
    Text source;
};

inline constexpr std::array<EngineRule, 5> engine_rules{{
    {"vllm", "0.6", "V0", ShareRule::profiled, NonTorch::since_start, false, true,
     DraftRule::proportional,
     "vllm/worker/worker.py determine_num_available_blocks (v0.6.4): total x utilization less "
     "peak_torch_memory less non_torch_memory; vllm#10517's log"},
    {"vllm", "0.7", "V0", ShareRule::profiled, NonTorch::since_snapshot, false, true,
     DraftRule::proportional,
     "vllm PR #10511, #11809, #12126 (utils memory_profiling): weights, activation peak and "
     "non-torch increase"},
    {"vllm", "0.10", "V1", ShareRule::profiled, NonTorch::since_snapshot, false, false,
     DraftRule::refused,
     "vllm/v1/worker/gpu_worker.py determine_available_memory at 35d5cda: requested memory "
     "(snapshot after NCCL's init x utilization) less the non-KV memory"},
    {"vllm", "0.21", "V1", ShareRule::profiled, NonTorch::since_snapshot, true, false,
     DraftRule::shared,
     "vllm PR #30515 (profile_cudagraph_memory), default since v0.21.0 as the engine logs it"},
    // The newer default fraction (PR #10975, by the GPU's size) is not modelled: give it.
    {"sglang", "0.4", "static", ShareRule::static_fraction, NonTorch::since_start, false, false,
     DraftRule::refused,
     "sglang model_runner.py profile_max_num_token: the free memory after the weights less total x "
     "(1 - mem_fraction_static), over the cell size; server_args.py __post_init__'s fraction by "
     "tp"},
}};

namespace detail {
/// "0.10" as (0, 10); a part that is no number as -1.
inline std::pair<std::uint64_t, std::uint64_t> version_parts(std::string_view v) {
    const std::size_t dot = v.find('.');
    const auto number = [](std::string_view t) {
        std::uint64_t n = 0;
        for (char c : t) {
            if (c < '0' || c > '9' || n > 100000) return std::uint64_t(-1);
            n = n * 10 + std::uint64_t(c - '0');
        }
        return t.empty() ? std::uint64_t(-1) : n;
    };
    return dot == std::string_view::npos
               ? std::pair(number(v), std::uint64_t(0))
               : std::pair(number(v.substr(0, dot)), number(v.substr(dot + 1)));
}

/// The newest of `rows` for `engine` at or below `version` (any version when empty) that `keep`
/// keeps.
template <class Rows, class Keep>
auto newest_row(const Rows& rows, std::string_view engine, std::string_view version, Keep keep) {
    const typename Rows::value_type* found = nullptr;
    for (const auto& row : rows) {
        if (row.engine != engine || !keep(row)) continue;
        if (!version.empty() && version_parts(row.version) > version_parts(version)) continue;
        found = &row;
    }
    return found;
}
}  // namespace detail

/// The newest row of `engine`, or the one for `version` ("0.8" takes the 0.7 row); none for an
/// engine or a version older than every row.
inline const EngineRule* engine_rule(std::string_view engine, std::string_view version = {}) {
    if (!version.empty() && detail::version_parts(version).first == std::uint64_t(-1))
        return nullptr;
    return detail::newest_row(engine_rules, engine, version,
                              [](const EngineRule&) { return true; });
}

/// The values an engine's option takes from a version on, as its argument parser or config
/// declares them, where memcalc models them: KV-cache dtypes, block sizes, LoRA ranks.
struct EngineChoice {
    Text engine, version, option;
    Text values;  ///< separated by spaces
    Text source;
};

inline constexpr std::array<EngineChoice, 8> engine_choices{{
    {"vllm", "0.6", "--kv-cache-dtype", "auto fp8 fp8_e4m3 fp8_e5m2",
     "vllm/engine/arg_utils.py add_cli_args (V0): --kv-cache-dtype choices"},
    {"vllm", "0.10", "--kv-cache-dtype", "auto bfloat16 fp8 fp8_e4m3 fp8_e5m2",
     "vllm/config/cache.py CacheDType (fp8_inc and fp8_ds_mla not modelled)"},
    {"sglang", "0.4", "--kv-cache-dtype", "auto fp8_e5m2 fp8_e4m3",
     "sglang/srt/server_args.py add_cli_args: --kv-cache-dtype choices"},
    {"vllm", "0.6", "--block-size", "8 16 32 64 128",
     "vllm/engine/arg_utils.py add_cli_args (V0): --block-size choices"},
    {"vllm", "0.10", "--block-size", "1 8 16 32 64 128", "vllm/config/cache.py BlockSize"},
    {"vllm", "0.21", "--block-size", "1 8 16 32 64 128 256", "vllm/config/cache.py BlockSize"},
    {"vllm", "0.6", "--max-lora-rank", "8 16 32 64 128 256",
     "vllm/config.py LoRAConfig.__post_init__ possible_max_ranks"},
    {"vllm", "0.10", "--max-lora-rank", "1 8 16 32 64 128 256 320 512",
     "vllm/config/lora.py MaxLoRARanks"},
}};

/// The values `rule`'s engine takes for `option` at its version; none where memcalc has no row.
inline const EngineChoice* engine_choice(const EngineRule& rule, std::string_view option) {
    return detail::newest_row(engine_choices, rule.engine, rule.version,
                              [&](const EngineChoice& c) { return c.option == option; });
}

/// `choice`'s values, one by one.
inline std::vector<std::string_view> engine_values(const EngineChoice& choice) {
    std::vector<std::string_view> out;
    for (std::string_view rest = choice.values; !rest.empty();) {
        const std::size_t space = std::min(rest.find(' '), rest.size());
        out.push_back(rest.substr(0, space));
        rest.remove_prefix(std::min(space + 1, rest.size()));
    }
    return out;
}

/// Whether `value` is one of `choice`'s values.
inline bool engine_takes(const EngineChoice& choice, std::string_view value) {
    const std::vector<std::string_view> values = engine_values(choice);
    return std::find(values.begin(), values.end(), value) != values.end();
}

/// The engine's settings, none meaning its default.
struct EngineSettings {
    const EngineRule* rule = engine_rule("vllm");
    /// vLLM's gpu_memory_utilization or SGLang's mem_fraction_static; none: the rule's default.
    std::optional<double> share;
    std::optional<std::uint64_t> max_model_len, max_num_seqs, max_num_batched_tokens;
};

/// One term of the budget: what it adds (the requested share) or takes from the cache.
struct BudgetTerm {
    Text name;
    Count bytes;
    bool adds;
    std::string why;
};

/// The cache as the engine sizes it, in its own terms.
struct EngineBudget {
    const EngineRule* rule = nullptr;
    double share = 0;  ///< of CUDA's total: gpu_memory_utilization or mem_fraction_static
    std::uint64_t max_model_len = 0, max_num_seqs = 0, max_num_batched_tokens = 0;
    Count cuda_total;  ///< what CUDA reports as the device's total (nvidia-smi's less the driver's)
    std::vector<BudgetTerm> terms;
    Count kv_cache_bytes;        ///< what is left, in whole blocks; 0: the engine will not start
    std::uint64_t blocks = 0;    ///< of block_size tokens over every layer
    std::uint64_t tokens = 0;    ///< blocks x block size: "GPU KV cache size: N tokens"
    double max_concurrency = 0;  ///< requests of max_model_len the cache holds at once
    Count shortfall;             ///< how far the cache's terms overdraw the share (0: none)
    /// Sliding-window or Mamba layers: the engine groups their caches by its hybrid allocator's
    /// rules, which memcalc does not follow; the figures count every layer's whole cache.
    bool approximate = false;
};

namespace detail {

/// vLLM's defaults by device (arg_utils.py get_batch_defaults, the API server's): 8,192
/// batched tokens and 1,024 sequences on a GPU of 70 GiB or more that is not an A100, else 2,048
/// and 256. V0: 256 sequences.
inline std::pair<std::uint64_t, std::uint64_t> vllm_batch_defaults(
    const EngineRule& rule, Count cuda_total, const std::optional<outside_rows::GpuFacts>& gpu) {
    const bool a100 = gpu && std::string_view(gpu->gpu).substr(0, 4) == "a100";
    const bool large = cuda_total >= Count(70ULL << 30) && !a100;
    if (rule.mode == Text("V0")) return {2048, 256};
    return large ? std::pair<std::uint64_t, std::uint64_t>{8192, 1024}
                 : std::pair<std::uint64_t, std::uint64_t>{2048, 256};
}

/// vLLM's rotary embedding keeps one cos/sin cache of max_position x rotary_dim in the model's
/// dtype, made with the weights ("Loading model weights took" counts it).
inline Count rotary_cache(const Architecture& m) {
    if (m.position != Position::rotary) return Count(0);
    return Count(m.max_positions) * m.rotary_dim() * dtype::bf16;
}

inline Count share(Count total, double fraction) {
    return Count(static_cast<std::uint64_t>(double(total.value()) * fraction));
}

/// The engine's share unless given: vLLM's 0.9; SGLang's mem_fraction_static by tensor
/// parallelism (server_args.py: 0.88, 0.87 from 2 ranks, 0.85 from 4, 0.81 from 8, 0.79 from 16).
inline double default_share(const EngineRule& rule, std::uint64_t tp) {
    if (rule.share == ShareRule::profiled) return 0.9;
    return tp >= 16 ? 0.79 : tp >= 8 ? 0.81 : tp >= 4 ? 0.85 : tp >= 2 ? 0.87 : 0.88;
}

}  // namespace detail

namespace detail {

/// A serving rank's rows (outside.hpp), by name: count x bytes, 0 where it has none.
struct ServingRows {
    std::vector<DeviceRow> rows;
    Count operator()(std::string_view name) const {
        for (const DeviceRow& r : rows)
            if (r.name == name) return Count(r.count) * r.bytes;
        return Count(0);
    }
};

/// The profiling run's peak: the forward of max_num_batched_tokens and its logits, after the
/// encoder's pass of as many of the largest images where the model takes images; with a draft,
/// vLLM's dummy run then runs the draft's forward on as many tokens (no logits: the sampler's
/// dummy run is the model's) while the model's output hidden states are kept.
inline Count profiling_peak(const EngineBudget& b, const Architecture& m, const ServeSettings& s) {
    const std::uint64_t n = b.max_num_batched_tokens;
    std::vector<TensorRun> forward = forward_temporaries(m, n, std::min(b.max_num_seqs, n), s.tp);
    if (s.images.any())  // the encoder's budget: max_num_batched_tokens, images of the largest
        forward = after_encoder(std::move(forward), encoder_pass(m, s.images, n, b.max_num_seqs));
    const Count model = total_bytes(forward);
    if (!s.draft) return model;
    std::vector<TensorRun> draft = forward_temporaries(*s.draft, n, 1, s.tp);
    draft.resize(2);  // the stream and the largest layer temporaries, not the logits
    return std::max(model, Count(n) * m.hidden * dtype::bf16 + total_bytes(draft));
}

/// The terms `rule` takes from its share: the weights, the profiling peak (vLLM), what lies
/// outside PyTorch as it measures it, and (vLLM 0.21) the graphs' estimate.
inline void add_terms(EngineBudget& b, const Architecture& m, const ServeReport& one,
                      const ServeSettings& s, const ServingRows& row) {
    const EngineRule& rule = *b.rule;
    b.terms.push_back({"weights", one.weights + rotary_cache(m), false,
                       "the weights as loaded, with the rotary embedding's cos/sin cache"});
    if (one.lora > Count(0))  // made in load_model, so measured with the weights
        b.terms.push_back({"lora_adapters", one.lora, false,
                           "the LoRA slots' stacked A and B, made with the weights"});
    if (one.draft_weights > Count(0))
        b.terms.push_back({"draft_weights", one.draft_weights + rotary_cache(*s.draft), false,
                           "the draft model's weights in bf16 and its rotary cache, loaded with "
                           "the model's"});
    if (rule.share == ShareRule::profiled)
        b.terms.push_back(
            {"activation_peak", profiling_peak(b, m, s), false,
             std::string("the profiling forward of max_num_batched_tokens tokens "
                         "and its logits") +
                 (s.images.any() ? ", after the vision encoder's pass of its images" : "") +
                 (s.draft ? ", or the draft's forward after it" : "")});
    const bool from_start = rule.non_torch == NonTorch::since_start;
    b.terms.push_back(
        {"non_torch",
         from_start ? row("cuda_context") + row("nccl_communicator") + row("nccl_nvls") : Count(0),
         false,
         from_start ? "the CUDA context and NCCL's buffers, measured from the process's start"
                    : "what grew outside PyTorch after the snapshot: NCCL and the context came "
                      "before it"});
    if (rule.graphs_in_budget)
        b.terms.push_back(
            {"cuda_graphs", row("cuda_graph_pool"), false, "the CUDA graphs' estimated pool"});
}

/// The cache in whole pages of `page` tokens (vLLM's blocks; SGLang's page of 1) from what the
/// terms leave of the share; a shortfall where they pass it.
inline void fill_cache(EngineBudget& b, const ServeReport& one, std::uint64_t page) {
    std::uint64_t requested = 0, taken = 0;
    for (const BudgetTerm& t : b.terms) (t.adds ? requested : taken) += t.bytes.value();
    if (taken >= requested) {
        b.shortfall = Count(taken - requested);
        return;
    }
    const std::uint64_t block = (one.cache_bytes_per_token() * page).value();
    b.blocks = block == 0 ? 0 : (requested - taken) / block;
    if (b.rule->draft == DraftRule::proportional && one.draft_kv_bytes_per_token > Count(0)) {
        // V0's split_num_cache_blocks_evenly: the model's blocks alone, x its share of a block
        // of both, a float product floored.
        const std::uint64_t model = (one.kv_bytes_per_token * page).value();
        b.blocks = static_cast<std::uint64_t>(double((requested - taken) / model) * double(model) /
                                              double(block));
    }
    b.tokens = b.blocks * page;
    b.kv_cache_bytes = Count(b.blocks) * block;
    b.max_concurrency = one.all_kv_cache() == Count(0)
                            ? 0
                            : double(b.kv_cache_bytes.value()) / double(one.all_kv_cache().value());
}

}  // namespace detail

/// The KV cache an engine gives `m` served as `s` on a device of `memory` bytes (nvidia-smi's
/// total) with `device`'s rows, by `e`'s rule.
inline EngineBudget engine_budget(const Architecture& m, ServeSettings s, const EngineSettings& e,
                                  Count memory, const DeviceSettings& device) {
    const double fraction = e.share.value_or(detail::default_share(*e.rule, s.tp));
    if (!(fraction > 0 && fraction <= 1))
        throw error("the engine's share of memory must be in (0, 1] (got " +
                    std::to_string(fraction) + ")");
    EngineBudget b;
    b.rule = e.rule;
    b.share = fraction;
    Parallelism p;
    p.tp = s.tp;
    const detail::ServingRows row{
        device_rows(Framework{}, p, device.gpu, {outside_rows::Job::serving, s.cuda_graphs})};
    b.cuda_total = Count(memory.value() - std::min(memory, row("driver_reserved")).value());
    b.max_model_len = e.max_model_len.value_or(m.max_positions);
    if (b.max_model_len == 0)
        throw error(
            "the model names no max_positions: give the engine's max model length "
            "(--max-model-len)");
    const auto [tokens_default, seqs_default] =
        detail::vllm_batch_defaults(*e.rule, b.cuda_total, device.gpu);
    b.max_num_seqs = e.max_num_seqs.value_or(seqs_default);
    b.max_num_batched_tokens = e.max_num_batched_tokens.value_or(
        e.rule->batched_tokens_model_length ? std::max<std::uint64_t>(b.max_model_len, 2048)
                                            : tokens_default);
    if (s.draft && e.rule->draft == DraftRule::refused)
        throw error(e.rule->share == ShareRule::profiled
                        ? "vLLM " + std::string(e.rule->version) +
                              " (the rule up to 0.21) refuses a draft model in V1 (0.10 to 0.13 "
                              "do); memcalc models V1's draft pool from --engine-version 0.21"
                        : "memcalc does not model " + std::string(e.rule->engine) +
                              "'s draft model: its draft worker keeps a pool of its own");
    if (e.rule->engine == Text("vllm") && m.any_mixer(Mixer::cross_attention))
        throw error(model_name(m) +
                    "'s cross-attention layers: vLLM served mllama on its V0 engine alone, whose "
                    "profiling run encodes images for every dummy sequence (not modelled), and "
                    "removed it in 0.10.2 (PR #24907); give --engine sglang or hf");
    // vLLM's blocks, or SGLang's pages of one token.
    const std::uint64_t page = e.rule->share == ShareRule::profiled ? s.block_size : 1;
    s.context = b.max_model_len, s.batch = 1, s.engine_pool = true, s.block_size = page;
    const ServeReport one = serve(m, s);  // the weights, and a request's cache at the model length
    b.approximate = one.windowed_layers > 0 || one.state_layers > 0;
    b.terms.push_back({"requested", detail::share(b.cuda_total, fraction), true,
                       e.rule->share == ShareRule::profiled
                           ? "CUDA's total x gpu_memory_utilization"
                           : "CUDA's total x mem_fraction_static"});
    detail::add_terms(b, m, one, s, row);
    detail::fill_cache(b, one, page);
    return b;
}

}  // namespace memcalc
