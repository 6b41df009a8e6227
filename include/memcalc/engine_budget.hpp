#pragma once
/// How a serving engine sizes its KV cache, by its own rule: vLLM takes a share of the device's
/// memory (gpu_memory_utilization) and gives the cache what its profiling run leaves. Each version
/// whose rule differs is a row of `engine_rules`, with where its source says so; the terms are
/// memcalc's figures for what the engine measures (its weights, the profiling forward's peak, the
/// memory outside PyTorch). validation/published/engines-rules.md has the sources in full.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
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

struct EngineRule {
    Text engine, version;  ///< "vllm", "0.10": the first version the row holds for
    Text mode;             ///< "V0" or "V1"
    NonTorch non_torch;
    bool graphs_in_budget;  ///< its CUDA graphs' memory estimated and taken from the cache
    /// Without chunked prefill (V0) a profiling batch of the whole model length: the default
    /// max_num_batched_tokens is max(max_model_len, 2048); else the usage context's default.
    bool batched_tokens_model_length;
    Text source;
};

inline constexpr std::array<EngineRule, 4> engine_rules{{
    {"vllm", "0.6", "V0", NonTorch::since_start, false, true,
     "vllm/worker/worker.py determine_num_available_blocks (v0.6.4): total x utilization less "
     "peak_torch_memory less non_torch_memory; vllm#10517's log"},
    {"vllm", "0.7", "V0", NonTorch::since_snapshot, false, true,
     "vllm PR #10511, #11809, #12126 (utils memory_profiling): weights, activation peak and "
     "non-torch increase"},
    {"vllm", "0.10", "V1", NonTorch::since_snapshot, false, false,
     "vllm/v1/worker/gpu_worker.py determine_available_memory at 35d5cda: requested memory "
     "(snapshot after NCCL's init x utilization) less the non-KV memory"},
    {"vllm", "0.21", "V1", NonTorch::since_snapshot, true, false,
     "vllm PR #30515 (profile_cudagraph_memory), default since v0.21.0 as the engine logs it"},
}};

/// The newest row of `engine`, or the one for `version` ("0.8" takes the 0.7 row); none for an
/// engine or a version older than every row.
inline const EngineRule* engine_rule(std::string_view engine, std::string_view version = {}) {
    const auto parts = [](std::string_view v) {
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
    };
    const EngineRule* found = nullptr;
    for (const EngineRule& row : engine_rules) {
        if (row.engine != engine) continue;
        if (!version.empty() && parts(row.version) > parts(version)) continue;
        found = &row;
    }
    if (!version.empty() && parts(version).first == std::uint64_t(-1)) return nullptr;
    return found;
}

/// The engine's settings, none meaning its default.
struct EngineSettings {
    const EngineRule* rule = &engine_rules.back();
    double gpu_memory_utilization = 0.9;
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

}  // namespace detail

/// The KV cache an engine gives `m` served as `s` on a device of `memory` bytes (nvidia-smi's
/// total) with `gpu`'s rows, by `e`'s rule.
inline EngineBudget engine_budget(const Architecture& m, ServeSettings s, const EngineSettings& e,
                                  Count memory, const DeviceSettings& device) {
    if (!(e.gpu_memory_utilization > 0 && e.gpu_memory_utilization <= 1))
        throw error("gpu memory utilization must be in (0, 1] (got " +
                    std::to_string(e.gpu_memory_utilization) + ")");
    EngineBudget b;
    b.rule = e.rule;
    Parallelism p;
    p.tp = s.tp;
    std::vector<DeviceRow> rows =
        device_rows(Framework{}, p, device.gpu, {outside_rows::Job::serving, s.cuda_graphs});
    const auto row = [&](std::string_view name) {
        for (const DeviceRow& r : rows)
            if (r.name == name) return Count(r.count) * r.bytes;
        return Count(0);
    };
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
    // The terms, each what the engine measures.
    s.context = b.max_model_len, s.batch = 1;
    const ServeReport one = serve(m, s);  // the weights, and a request's cache at the model length
    b.approximate = one.windowed_layers > 0 || one.state_layers > 0;
    const Count requested = detail::share(b.cuda_total, e.gpu_memory_utilization);
    const Count weights = one.weights + detail::rotary_cache(m);
    const Count peak = detail::total_bytes(detail::forward_temporaries(
        m, b.max_num_batched_tokens, std::min(b.max_num_seqs, b.max_num_batched_tokens), s.tp));
    b.terms.push_back({"requested", requested, true, "CUDA's total x gpu_memory_utilization"});
    b.terms.push_back({"weights", weights, false,
                       "the weights as loaded, with the rotary embedding's cos/sin cache"});
    b.terms.push_back({"activation_peak", peak, false,
                       "the profiling forward of max_num_batched_tokens tokens and its logits"});
    const Count non_torch = e.rule->non_torch == NonTorch::since_start
                                ? row("cuda_context") + row("nccl_communicator") + row("nccl_nvls")
                                : Count(0);
    b.terms.push_back({"non_torch", non_torch, false,
                       e.rule->non_torch == NonTorch::since_start
                           ? "the CUDA context and NCCL's buffers, measured from the process's "
                             "start"
                           : "what grew outside PyTorch after the snapshot: NCCL and the context "
                             "came before it"});
    if (e.rule->graphs_in_budget)
        b.terms.push_back(
            {"cuda_graphs", row("cuda_graph_pool"), false, "the CUDA graphs' estimated pool"});
    std::uint64_t taken = 0;
    for (const BudgetTerm& t : b.terms) taken += t.adds ? 0 : t.bytes.value();
    if (taken >= requested.value()) {
        b.shortfall = Count(taken - requested.value());
        return b;
    }
    const Count left(requested.value() - taken);
    const std::uint64_t block = (one.kv_bytes_per_token * s.block_size).value();
    b.blocks = block == 0 ? 0 : left.value() / block;
    b.tokens = b.blocks * s.block_size;
    b.kv_cache_bytes = Count(b.blocks) * block;
    b.max_concurrency = one.kv_cache == Count(0)
                            ? 0
                            : double(b.kv_cache_bytes.value()) / double(one.kv_cache.value());
    return b;
}

}  // namespace memcalc
