#pragma once
/// What other tools would answer for the same configuration, so users can check memcalc against
/// the figures they see today: Megatron-LM's theoretical memory formula
/// (megatron/training/theoretical_memory_usage.py) and DeepSpeed's ZeRO-2/ZeRO-3 model-state
/// estimators (estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs).
/// Both work in floating point, as those tools do.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "memcalc/estimate.hpp"

namespace memcalc {

struct MegatronEstimate {
    double parameters_on_most_loaded_shard = 0;
    double bytes_per_parameter = 0;        ///< 18, or 6 + 12 / dp with the distributed optimiser
    double weight_and_optimizer = 0;       ///< bytes
    double activations = 0;                ///< bytes, the first pipeline stage
    bool sequence_parallel_formula = false;  ///< Megatron uses its SP + selective formula, else the other one
    std::uint64_t padded_vocab = 0;
    double total() const { return weight_and_optimizer + activations; }
};

/// Megatron-LM's formula for this model and layout. Its "distributed optimizer" is memcalc's ZeRO-1;
/// its vocabulary is padded to a multiple of 128 x tp.
inline MegatronEstimate megatron_estimate(const Report& r) {
    const Architecture& m = r.model;
    const Parallelism& p = r.settings.parallel;
    const double h = static_cast<double>(m.hidden), L = static_cast<double>(m.layers);
    const double f = static_cast<double>(m.ffn), s = static_cast<double>(r.settings.seq);
    const double b = static_cast<double>(r.settings.micro_batch);
    const double t = static_cast<double>(p.tp), P = static_cast<double>(p.pp);
    MegatronEstimate e;
    const std::uint64_t multiple = 128 * p.tp;
    e.padded_vocab = (m.vocab + multiple - 1) / multiple * multiple;
    const double V = static_cast<double>(e.padded_vocab);

    // Weights and optimiser: parameters of the most loaded shard (a stage's layers and one embedding).
    const double norm = m.norm == Norm::rmsnorm ? 1 : 2;
    const double gated = m.mlp == Mlp::gated ? 1.5 : 1;
    const double experts = m.is_moe() ? static_cast<double>(m.experts) : 1;
    const double query_ratio = static_cast<double>(m.heads * m.head_size()) / h;
    const double groups = static_cast<double>(m.key_value_heads()) / static_cast<double>(m.heads);
    const double attention = 2 * h * h * ((1 + groups) * query_ratio);
    const double layer = 2 * h * (f * experts * gated + norm) + attention;
    const double block = layer * L + norm * h;  // and the final norm
    const double embedding = h * V;
    e.parameters_on_most_loaded_shard = (block / P + embedding) / t;
    if (!m.tied_embeddings && p.pp == 1) e.parameters_on_most_loaded_shard += embedding / t;
    e.bytes_per_parameter = p.zero >= 1 ? 6 + 12 / static_cast<double>(p.dp) : 18;
    e.weight_and_optimizer = e.parameters_on_most_loaded_shard * e.bytes_per_parameter;

    // Activations of the first stage, by Korthikanti et al.'s Table 2.
    e.sequence_parallel_formula = p.sequence_parallel && r.settings.recompute == Recompute::selective;
    const double sbh = s * b * h;
    double a = e.sequence_parallel_formula ? sbh * (18 + 4 * f / h) : sbh * (10 + 24 / t);
    a *= L;
    a += 8 * s * b * P + sbh * P;  // embedding inputs and dropout, pp micro-batches in flight
    const double M = static_cast<double>(p.steps_per_batch());
    if (p.vpp > 1)
        a *= 1 + (P - 1) / (P * static_cast<double>(p.vpp));
    else if (p.pp > 1)
        a *= std::min(1.0, M / P);
    if (e.sequence_parallel_formula) {
        if (p.pp == 1) a += sbh * 4 * (1 + V / h);  // the output layer's input and the loss
        a /= t;
    } else {
        if (p.pp == 1) a += (s * b * V / t + sbh) * 2;
        a *= 1.05;  // Megatron's 5% for optimiser and miscellaneous temporaries
    }
    e.activations = a;
    return e;
}

struct DeepSpeedEstimate {
    unsigned stage = 2;
    double gpu = 0;  ///< bytes per GPU for parameters, gradients and optimiser state
    double cpu = 0;  ///< bytes per node of host memory
    std::uint64_t largest_layer = 0;  ///< ZeRO-3: the parameters of the largest module
};

/// DeepSpeed's model-state estimator for the configuration's stage (2 below stage 3, else 3), with
/// its defaults: 1.5 x buffer on host memory, zero_init for stage 3.
inline DeepSpeedEstimate deepspeed_estimate(const Report& r, std::uint64_t gpus_per_node) {
    const Parallelism& p = r.settings.parallel;
    const double total = static_cast<double>(r.parameter_count.value());
    const std::uint64_t gpus = p.devices();
    const double per_node = static_cast<double>(std::min(gpus_per_node, gpus));
    const double nodes = std::ceil(static_cast<double>(gpus) / per_node);
    const double buffer = 1.5;
    DeepSpeedEstimate e;
    e.stage = p.zero >= 3 ? 3 : 2;
    const bool offload = p.offload != Offload::none;
    if (e.stage == 2) {
        e.gpu = offload ? 2 * total : 4 * total + std::floor(16 * total / static_cast<double>(gpus));
        e.cpu = offload ? total * std::max(4 * static_cast<double>(gpus), 16.0) * buffer : total * 4 * per_node * buffer;
        return e;
    }
    // The largest module: a weight and its bias together (an expert's matrix alone).
    std::map<std::string, std::uint64_t> modules;
    for (const auto& row : r.parameters.rows) {
        const std::string name = row.tensor.substr(0, row.tensor.find('.'));
        modules[name + (row.group == Group::layer ? "" : "@top")] +=
            row.expert ? row.count.value() / r.model.experts : row.count.value();
    }
    for (const auto& [name, count] : modules) e.largest_layer = std::max(e.largest_layer, count);
    const double largest = 4 * static_cast<double>(e.largest_layer);
    if (p.offload == Offload::parameters) {
        e.gpu = largest;
        e.cpu = total * 18 / nodes * buffer;
    } else if (offload) {
        e.gpu = largest + std::floor(2 * total / static_cast<double>(gpus));
        e.cpu = total * 16 / nodes * buffer;
    } else {
        e.gpu = largest + std::floor(18 * total / static_cast<double>(gpus));
        e.cpu = static_cast<double>(e.largest_layer) * 4 * per_node * buffer;
    }
    return e;
}

}  // namespace memcalc
