#pragma once
/// The compute side of the trade: matrix-multiply FLOPs of one training step and what
/// recomputation adds. Floating point, because a large run's FLOPs exceed 2^64.
#include <cstdint>

#include "memcalc/activations.hpp"
#include "memcalc/model.hpp"

namespace memcalc {

struct ComputeCost {
    double layer_forward = 0;      ///< one layer's forward pass
    double attention_core = 0;     ///< of which Q K^T and attention over V
    double head_forward = 0;       ///< the output head's logits
    double step = 0;               ///< forward + backward (twice the forward), no recomputation
    double recompute = 0;          ///< what the chosen recomputation adds
    double recompute_fraction() const { return step > 0 ? recompute / step : 0; }
};

/// Counts 2 m n k per (m x k) . (k x n) product; element-wise ops are left out.
inline ComputeCost compute_cost(const Architecture& m, std::uint64_t seq, std::uint64_t micro_batch, Recompute mode) {
    const double T = static_cast<double>(seq) * static_cast<double>(micro_batch);  // tokens
    const double h = static_cast<double>(m.hidden), f = static_cast<double>(m.ffn);
    const double q = static_cast<double>(m.heads * m.head_size());
    const double kv = static_cast<double>(m.key_value_heads() * m.head_size());
    const double mlp_matrices = m.mlp == Mlp::gated ? 3 : 2;

    ComputeCost c;
    c.attention_core = 2 * 2 * T * static_cast<double>(seq) * q;  // Q K^T and (weights . V), every head
    const double projections = 2 * T * h * (q + 2 * kv) + 2 * T * q * h;
    const double mlp = 2 * T * h * f * mlp_matrices * static_cast<double>(m.active_experts()) +
                       (m.is_moe() ? 2 * T * h * static_cast<double>(m.experts) : 0);
    c.layer_forward = projections + c.attention_core + mlp;
    c.head_forward = 2 * T * h * static_cast<double>(m.vocab);
    const double forward = static_cast<double>(m.layers) * c.layer_forward + c.head_forward;
    c.step = 3 * forward;
    // Selective re-runs the core attention (as Megatron-LM's checkpointed core attention does);
    // full re-runs each layer's whole forward pass.
    const double per_layer = mode == Recompute::full ? c.layer_forward
                             : mode == Recompute::selective ? c.attention_core : 0;
    c.recompute = static_cast<double>(m.layers) * per_layer;
    return c;
}

}  // namespace memcalc
