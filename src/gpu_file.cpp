#include "gpu_file.hpp"

#include <fmt/format.h>

#include "json_reader.hpp"
#include "memcalc/plan.hpp"
#include "model_file.hpp"

namespace memcalc::cli {

std::string gib_text(Count memory) {
    return fmt::format("{:.2f}", static_cast<double>(memory.value()) / (1ULL << 30));
}

/// The step time's assumed rates, where the file gives its own: efficiencies in (0, 1], latencies
/// of 0 to 1 s.
void read_step_time_facts(const JsonReader& in, Gpu& g) {
    const auto read = [&](const char* key, double& value, double low, bool open, const char* rule) {
        value = in.number_or(key, value);
        if (value < low || (open && value == low) || value > 1)
            in.fail(fmt::format("{} must be {} (got {})", key, rule, value));
    };
    read("gemm_efficiency", g.gemm_efficiency, 0, true, "in (0, 1]");
    read("attention_efficiency", g.attention_efficiency, 0, true, "in (0, 1]");
    read("intra_node_latency_seconds", g.intra_node_latency, 0, false, "0 to 1 s");
    read("inter_node_latency_seconds", g.inter_node_latency, 0, false, "0 to 1 s");
    read("collective_sm_share", g.collective_sm_share, 0, false, "in [0, 1]");
    read("launch_seconds", g.launch_seconds, 0, false, "0 to 1 s");
}

Gpu parse_gpu_json(std::string_view text, const std::string& origin) {
    const nlohmann::json document = parse_json(text, origin);
    // memory_gib, which the listing shows beside the bytes, is accepted and checked against them.
    expect_object(document, origin, "a GPU",
                  {"name",
                   "description",
                   "source",
                   "memory_bytes",
                   "memory_gib",
                   "peak_bf16_flops",
                   "peak_fp8_flops",
                   "intra_node_bytes_per_second",
                   "inter_node_bytes_per_second",
                   "gpus_per_node",
                   "host_bytes_per_second",
                   "performance_source",
                   "network_source",
                   "memory_bytes_per_second",
                   "gemm_efficiency",
                   "attention_efficiency",
                   "intra_node_latency_seconds",
                   "inter_node_latency_seconds",
                   "collective_sm_share",
                   "launch_seconds"});
    const JsonReader in(document, origin);
    if (!in.has("name")) in.fail("missing key 'name'");
    Gpu g;
    g.name = intern(in.shown_text_or("name", ""));
    g.description = intern(in.shown_text_or("description", ""));
    g.source = intern(in.shown_text_or("source", ""));
    g.memory = Count(in.positive("memory_bytes"));
    if (g.name.empty()) in.fail("name must not be empty");
    // The speeds are optional: absent or null, the planner has no step time for this GPU.
    g.peak_bf16_flops = in.positive_or("peak_bf16_flops", 0);
    g.peak_fp8_flops = in.positive_or("peak_fp8_flops", 0);
    g.intra_node_bandwidth = in.positive_or("intra_node_bytes_per_second", 0);
    g.inter_node_bandwidth = in.positive_or("inter_node_bytes_per_second", 0);
    g.gpus_per_node = in.positive_or("gpus_per_node", 0);
    // plan steps its search for the fewest GPUs by nodes: a node past its reach would try none.
    if (g.gpus_per_node > fewest_gpus_limit)
        in.fail(
            fmt::format("gpus_per_node must be at most {}, the most GPUs plan searches "
                        "(got {})",
                        fewest_gpus_limit, g.gpus_per_node));
    g.host_bandwidth = in.positive_or("host_bytes_per_second", 0);
    g.memory_bandwidth = in.positive_or("memory_bytes_per_second", 0);
    read_step_time_facts(in, g);
    g.performance_source = intern(in.shown_text_or("performance_source", ""));
    g.network_source = intern(in.shown_text_or("network_source", ""));
    const std::string gib = gib_text(g.memory);
    if (in.has("memory_gib") && in.text_or("memory_gib", "") != gib)
        in.fail("memory_gib is " + document.at("memory_gib").dump() +
                ", but memory_bytes makes it \"" + gib + "\"");
    return g;
}

Gpu load_gpu_file(const std::string& path) {
    return parse_gpu_json(read_text_file(path, "GPU file"), path);
}

}  // namespace memcalc::cli
