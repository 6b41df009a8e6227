#pragma once
/// Training recipes: bytes per parameter for weights, gradients, master copy and optimiser state.
/// New recipes are rows of this table, not special cases in code.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "memcalc/error.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

struct Recipe {
    std::string_view name;
    std::string_view description;
    std::uint64_t weight_bytes;      ///< the weights the forward pass reads
    std::uint64_t gradient_bytes;    ///< one gradient per parameter
    std::uint64_t master_bytes;      ///< fp32 master copy kept by mixed precision; 0 when the weights are fp32
    std::uint64_t optimizer_bytes;   ///< optimiser state (Adam: m and v)
    std::uint64_t activation_bytes;  ///< the compute dtype: activations, logits, activation gradients
    std::string_view optimizer_state;
    /// What the optimiser step computes per parameter beside its state: Adam's sqrt(v), fp32. SGD's
    /// momentum update runs in place.
    std::uint64_t step_temporary_bytes;

    std::uint64_t bytes_per_parameter() const { return weight_bytes + gradient_bytes + master_bytes + optimizer_bytes; }
    /// ZeRO's K (Rajbhandari et al. 2020, 3.1): optimiser-state bytes per parameter, master copy included.
    std::uint64_t zero_k() const { return master_bytes + optimizer_bytes; }
};

inline constexpr std::array<Recipe, 5> recipes{{
    {"mixed-adam", "mixed-precision Adam: bf16 weights and gradients, fp32 master copy and moments (ZeRO 3.1)",
     dtype::bf16, dtype::bf16, dtype::fp32, 2 * dtype::fp32, dtype::bf16, "Adam m, v (fp32)", dtype::fp32},
    {"fp32-adam", "plain fp32 Adam: fp32 weights, gradients, moments and activations",
     dtype::fp32, dtype::fp32, 0, 2 * dtype::fp32, dtype::fp32, "Adam m, v (fp32)", dtype::fp32},
    {"mixed-adam-fp32-grads", "mixed-precision Adam with fp32 gradient accumulation, as Megatron-LM keeps them",
     dtype::bf16, dtype::fp32, dtype::fp32, 2 * dtype::fp32, dtype::bf16, "Adam m, v (fp32)", dtype::fp32},
    {"mixed-sgd", "mixed-precision SGD with momentum: bf16 weights and gradients, fp32 master copy and momentum",
     dtype::bf16, dtype::bf16, dtype::fp32, dtype::fp32, dtype::bf16, "momentum (fp32)", 0},
    {"fp32-sgd", "plain fp32 SGD with momentum",
     dtype::fp32, dtype::fp32, 0, dtype::fp32, dtype::fp32, "momentum (fp32)", 0},
}};

inline constexpr std::string_view default_recipe = "mixed-adam";

/// How the optimiser step runs, which decides its temporaries (the recipe's step_temporary_bytes).
enum class OptimizerImpl {
    fused,     ///< one kernel over all tensors, nothing allocated: Megatron-LM, DeepSpeed, torch's fused=True
    foreach,   ///< torch.optim's default on CUDA: sqrt(v) of every parameter at once
    for_loop,  ///< one tensor at a time (foreach=False): sqrt(v) and its quotient of the largest tensor
};

inline const char* optimizer_impl_name(OptimizerImpl o) {
    switch (o) {
        case OptimizerImpl::fused: return "fused";
        case OptimizerImpl::foreach: return "foreach";
        case OptimizerImpl::for_loop: return "for-loop";
    }
    return "?";
}

/// When the gradients exist. Lazy: PyTorch after zero_grad(set_to_none=True), each made by the
/// backward step that writes it (the chapter's model); from the second micro-batch on every one is
/// held, accumulated into. Persistent: one contiguous buffer for the whole run, live at every step
/// (Megatron-LM's main_grad, fp32 with --recipe mixed-adam-fp32-grads; DeepSpeed's).
enum class GradBuffer { lazy, persistent };

inline const char* grad_buffer_name(GradBuffer g) { return g == GradBuffer::lazy ? "lazy" : "persistent"; }

/// Returns nullptr for an unknown name, so callers can suggest the nearest one.
inline const Recipe* find_recipe(std::string_view name) {
    for (const auto& r : recipes)
        if (r.name == name) return &r;
    return nullptr;
}

/// Weights, gradients, master copy and optimiser state of P parameters under a recipe.
struct TrainingState {
    Count weights, gradients, master_weights, optimizer_state;
    Count total() const { return weights + gradients + master_weights + optimizer_state; }
    friend TrainingState operator+(const TrainingState& x, const TrainingState& y) {
        return {x.weights + y.weights, x.gradients + y.gradients, x.master_weights + y.master_weights,
                x.optimizer_state + y.optimizer_state};
    }
};

inline TrainingState training_state(Count parameters, const Recipe& r) {
    return {parameters * r.weight_bytes, parameters * r.gradient_bytes, parameters * r.master_bytes,
            parameters * r.optimizer_bytes};
}

}  // namespace memcalc
