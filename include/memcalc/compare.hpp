#pragma once
/// What other tools would answer for the same configuration, so users can check memcalc against
/// the figures they see today: Megatron-LM's theoretical memory formula
/// (megatron/training/theoretical_memory_usage.py) and DeepSpeed's ZeRO-2/ZeRO-3 model-state
/// estimators (estimate_zero2_model_states_mem_needs, estimate_zero3_model_states_mem_needs), each
/// as its current code has it (megatron_follows, deepspeed_follows). Both tools compute in Python
/// floats; so does this, in the same order, and the byte figures come out as whole numbers the way
/// each tool makes them (Megatron never converts: rounded to the nearest byte; DeepSpeed: int()).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>

#include "memcalc/estimate.hpp"

namespace memcalc {

/// The upstream code each view reimplements, named in --help, the README and the JSON.
inline constexpr const char* megatron_follows = "main since PR #4687, May 2026";
inline constexpr const char* deepspeed_follows = "master since PR #5099, commit f4cb866, 2024";

/// Megatron's float bytes as whole bytes: it only ever prints them in MB, so the nearest byte.
inline std::uint64_t nearest_byte(double bytes) {
    return static_cast<std::uint64_t>(std::llround(bytes));
}

/// Python's int() of a non-negative float, as DeepSpeed converts its figures: truncation.
inline std::uint64_t python_int(double value) { return static_cast<std::uint64_t>(value); }

struct MegatronEstimate {
    // The most loaded shard's parameters, by how a rank holds them.
    double tensor_parallel_parameters = 0;  ///< attention, dense MLP and embeddings: split by tp
    double replicated_parameters = 0;       ///< norms and the MoE router: whole on every rank
    double expert_parameters = 0;    ///< routed experts: split by etp x ep (etp defaults to tp)
    double bytes_per_parameter = 0;  ///< 18, or 6 + 12 / dp with the distributed optimiser
    double expert_bytes_per_parameter = 0;   ///< the same over the expert-data-parallel group
    std::uint64_t expert_data_parallel = 0;  ///< world / (etp x ep x pp) = dp x cp / ep
    double weight_and_optimizer = 0;         ///< bytes, Megatron's float
    double activations = 0;  ///< bytes of the first pipeline stage, Megatron's float
    bool sequence_parallel_formula =
        false;  ///< Megatron uses its SP + selective formula, else the other one
    std::uint64_t padded_vocab = 0;

    double parameters_on_most_loaded_shard() const {
        return tensor_parallel_parameters + replicated_parameters + expert_parameters;
    }
    std::uint64_t weight_and_optimizer_bytes() const { return nearest_byte(weight_and_optimizer); }
    std::uint64_t activation_bytes() const { return nearest_byte(activations); }
    /// The sum of the two figures as printed, so that the three always add up.
    std::uint64_t total_bytes() const { return weight_and_optimizer_bytes() + activation_bytes(); }
};

namespace detail {

/// Megatron's parameter counts of one layer (and the model's ends), before any split.
struct MegatronParameters {
    double attention = 0, dense_mlp = 0, routed_experts = 0, norms = 0, router = 0;
    double final_norm = 0, embedding = 0;
    double dense_layers = 0, moe_layers = 0;
};

inline MegatronParameters megatron_parameters(const Architecture& m, std::uint64_t padded_vocab) {
    const double h = static_cast<double>(m.hidden);
    const double heads = static_cast<double>(m.heads);
    const double query_ratio = static_cast<double>(m.head_size()) * heads / h;
    const double groups = static_cast<double>(m.key_value_heads());
    const double gated = m.mlp == Mlp::gated ? 3.0 / 2 : 1;
    const double norm = m.norm == Norm::rmsnorm ? 1 : 2;  // LayerNorm has a bias
    const double f = static_cast<double>(m.ffn), E = static_cast<double>(m.experts);
    MegatronParameters n;
    n.attention = 2 * h * h * ((1 + groups / heads) * query_ratio);
    n.dense_mlp = 2 * h * f * gated;
    n.norms = 2 * h * norm;
    n.final_norm = norm * h;
    n.embedding = h * static_cast<double>(padded_vocab);
    // memcalc's MoE models make every layer MoE (moe_layer_freq 1), no shared experts, the experts
    // as wide as ffn.
    if (m.is_moe()) {
        n.routed_experts = 2 * h * f * E * gated;
        n.router =
            h * E + (m.bias == Bias::all ? E : 0);  // add_bias_linear gives the router a bias
        n.moe_layers = static_cast<double>(m.layers);
    } else {
        n.dense_layers = static_cast<double>(m.layers);
    }
    return n;
}

/// Megatron's bytes per parameter: bf16 weights, fp32 gradients, fp32 master weights and Adam
/// moments.
inline double megatron_bytes_per_parameter(bool distributed_optimizer,
                                           std::uint64_t data_parallel) {
    return distributed_optimizer ? 6 + 12 / static_cast<double>(data_parallel) : 18;
}

/// Table 2's sequence-parallel, selective-recomputation row (compute_activation_memory).
inline double megatron_activations_with_sp(const Report& r, double V, double M) {
    const Architecture& m = r.model;
    const Parallelism& p = r.settings.parallel;
    const double s = static_cast<double>(r.settings.seq),
                 b = static_cast<double>(r.settings.micro_batch);
    const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
    const double t = static_cast<double>(p.tp), P = static_cast<double>(p.pp);
    double a = s * b * h * (18 + 4 * (f / h));
    a *= static_cast<double>(m.layers);
    a += 8 * s * b * P;  // the embedding's input, pp micro-batches in flight
    a += s * b * h * P;  // the embedding's dropout mask
    if (p.vpp > 1)
        a *= 1 + (P - 1) / (P * static_cast<double>(p.vpp));
    else if (p.pp > 1)
        a *= std::min(1.0, M / P);
    if (p.pp == 1) a += s * b * h * 4 * (1 + V / h);  // the output layer's input and the loss
    return a / t;
}

/// The estimate for any other layout (compute_activation_memory_without_sp), with its 5% allowance.
inline double megatron_activations_without_sp(const Report& r, double V, double M) {
    const Architecture& m = r.model;
    const Parallelism& p = r.settings.parallel;
    const double s = static_cast<double>(r.settings.seq),
                 b = static_cast<double>(r.settings.micro_batch);
    const double h = static_cast<double>(m.hidden);
    const double t = static_cast<double>(p.tp), P = static_cast<double>(p.pp);
    double a = s * b * h * (10 + 24 / t);
    a *= static_cast<double>(m.layers);
    a += 8 * s * b * P;
    a += s * b * h * P;
    if (p.vpp > 1)
        a *= 1 + (P - 1) / (P * static_cast<double>(p.vpp));
    else if (p.pp > 1)
        a *= std::min(1.0, M / P);
    if (p.pp == 1) {
        const double logits = s * b * V / t;
        a += (logits + s * b * h) * 2;
    }
    return a * 1.05;  // Megatron's allowance for optimiser and miscellaneous temporaries
}

}  // namespace detail

/// Megatron-LM's formula for this model and layout. Its "distributed optimizer" is memcalc's
/// ZeRO-1; its vocabulary is padded to a multiple of 128 x tp; its world is dp x tp x pp x cp, with
/// ep carved out of dp x cp, and its expert tensor parallelism etp (tp unless given, Megatron's
/// default).
inline MegatronEstimate megatron_estimate(const Report& r) {
    const Architecture& m = r.model;
    const Parallelism& p = r.settings.parallel;
    MegatronEstimate e;
    const std::uint64_t multiple = 128 * p.tp;
    e.padded_vocab = (m.vocab + multiple - 1) / multiple * multiple;
    const detail::MegatronParameters n = detail::megatron_parameters(m, e.padded_vocab);
    const double t = static_cast<double>(p.tp), P = static_cast<double>(p.pp);
    const std::uint64_t expert_tensor_parallel = p.expert_tp();

    // Weights and optimiser: the first stage holds 1/pp of the layers and the embedding.
    const double split_by_tp =
        (n.attention + n.dense_mlp) * n.dense_layers + n.attention * n.moe_layers;
    const double replicated =
        n.norms * n.dense_layers + (n.norms + n.router) * n.moe_layers + n.final_norm;
    const double experts = n.routed_experts * n.moe_layers;
    e.tensor_parallel_parameters = (split_by_tp / P + n.embedding) / t;
    e.replicated_parameters = replicated / P;
    e.expert_parameters = experts / P / static_cast<double>(expert_tensor_parallel * p.ep);
    if (!m.tied_embeddings && p.pp == 1)
        e.tensor_parallel_parameters += n.embedding / t;  // the output layer
    e.expert_data_parallel = p.devices() / (expert_tensor_parallel * p.ep * p.pp);
    e.bytes_per_parameter = detail::megatron_bytes_per_parameter(p.zero >= 1, p.dp);
    e.expert_bytes_per_parameter =
        detail::megatron_bytes_per_parameter(p.zero >= 1, e.expert_data_parallel);
    e.weight_and_optimizer =
        (e.tensor_parallel_parameters + e.replicated_parameters) * e.bytes_per_parameter +
        e.expert_parameters * e.expert_bytes_per_parameter;

    // Activations of the first stage, by Korthikanti et al.'s Table 2.
    e.sequence_parallel_formula =
        p.sequence_parallel && r.settings.recompute == Recompute::selective;
    const double V = static_cast<double>(e.padded_vocab),
                 M = static_cast<double>(p.steps_per_batch());
    e.activations = e.sequence_parallel_formula ? detail::megatron_activations_with_sp(r, V, M)
                                                : detail::megatron_activations_without_sp(r, V, M);
    return e;
}

struct DeepSpeedEstimate {
    unsigned stage = 2;
    std::uint64_t gpu = 0;  ///< bytes per GPU for parameters, gradients and optimiser state
    std::uint64_t cpu = 0;  ///< bytes per node of host memory
    std::uint64_t largest_layer = 0;  ///< ZeRO-3: the parameters of the largest module
};

namespace detail {

/// DeepSpeed's ZeRO-3 largest_layer_params: the most parameters one module holds itself (a weight
/// and its bias together; an expert's matrix alone).
inline std::uint64_t largest_module(const Report& r) {
    std::map<std::string, std::uint64_t> modules;
    for (const auto& row : r.parameters->rows) {
        const std::string name(row.tensor.substr(0, row.tensor.find('.')));
        modules[name + (row.group == Group::layer ? "" : "@top")] +=
            row.expert ? row.count.value() / r.model.experts : row.count.value();
    }
    std::uint64_t largest = 0;
    for (const auto& [name, count] : modules) largest = std::max(largest, count);
    return largest;
}

}  // namespace detail

/// DeepSpeed's model-state estimator for the configuration's stage (2 below stage 3, else 3), with
/// its defaults: 1.5 x buffer on host memory, zero_init for stage 3. Its GPUs per node are
/// min(gpus_per_node, devices); its nodes, as many as the devices fill.
inline DeepSpeedEstimate deepspeed_estimate(const Report& r, std::uint64_t gpus_per_node) {
    const Parallelism& p = r.settings.parallel;
    const double P = static_cast<double>(r.parameter_count.value());
    const std::uint64_t gpus = p.devices();
    const double N = static_cast<double>(gpus);
    const std::uint64_t per_node = std::min(gpus_per_node, gpus);
    const double G = static_cast<double>(per_node);
    const double nodes = static_cast<double>((gpus + per_node - 1) / per_node);
    const double buffer = 1.5;  // additional_buffer_factor
    DeepSpeedEstimate e;
    e.stage = p.zero >= 3 ? 3 : 2;
    const bool offload = p.offload != Offload::none;
    if (e.stage == 2) {
        // bf16 weights on every GPU; bf16 and fp32 gradients, fp32 master weights and Adam moments
        // (2 + 4 + 4 + 8 = 18 bytes) sharded over the GPUs.
        e.gpu = offload ? python_int(2 * P) : python_int(2 * P) + python_int(18 * P / N);
        e.cpu = offload ? python_int(P * std::max(4 * N, 16.0) * buffer)
                        : python_int(P * 4 * G * buffer);
        return e;
    }
    e.largest_layer = detail::largest_module(r);
    const double largest = static_cast<double>(e.largest_layer);
    const std::uint64_t largest_memory =
        4 * e.largest_layer;  // bf16 weights and gradients, gathered
    const double gpus_factor = 1 / nodes;
    if (p.offload == Offload::parameters) {
        e.gpu = largest_memory;
        e.cpu = python_int(P * 18 * gpus_factor * buffer);
    } else if (offload) {
        e.gpu = largest_memory + python_int(2 * P / N);
        e.cpu = python_int(P * 16 * gpus_factor * buffer);
    } else {
        e.gpu = largest_memory + python_int(18 * P / N);
        e.cpu = python_int(largest * 4 * G * buffer);
    }
    return e;
}

}  // namespace memcalc
