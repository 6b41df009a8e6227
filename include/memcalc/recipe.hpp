#pragma once
/// Training recipes: the dtypes of weights, gradients, master copy and activations, and an optimiser
/// with its state slots. New recipes and optimisers are rows of these tables, not special cases in code.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "memcalc/error.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// One slot of optimiser state per parameter: Adam's m and v, SGD's momentum.
struct StateSlot {
    std::string_view what;
    DType dtype;
};

/// An optimiser as a row: its state slots and the temporary its step computes per parameter.
struct Optimizer {
    std::string_view name;
    std::string_view state;  ///< the slots as a report names them: "Adam m, v (fp32)"
    std::array<StateSlot, 2> slots;
    std::size_t slot_count;
    /// What the step computes per parameter beside its state (Adam's sqrt(v), fp32); none when it
    /// updates in place (SGD's momentum).
    std::optional<DType> step_temporary;

    std::uint64_t state_bytes() const {
        std::uint64_t sum = 0;
        for (std::size_t i = 0; i < slot_count; ++i) sum += bytes_per_element(slots[i].dtype);
        return sum;
    }
};

inline constexpr Optimizer adam{"adam", "Adam m, v (fp32)", {{{"m", DType::fp32}, {"v", DType::fp32}}}, 2, DType::fp32};
inline constexpr Optimizer sgd_momentum{"sgd-momentum", "momentum (fp32)", {{{"momentum", DType::fp32}, {}}}, 1,
                                        std::nullopt};

inline constexpr std::array<Optimizer, 2> optimizers{{adam, sgd_momentum}};

/// Returns nullptr for an unknown name, so callers can suggest the nearest one.
inline const Optimizer* find_optimizer(std::string_view name) {
    for (const auto& o : optimizers)
        if (o.name == name) return &o;
    return nullptr;
}

/// A training recipe: the dtypes of the weights, gradients, master copy and activations, and its
/// optimiser; every byte count follows from them.
struct Recipe {
    std::string_view name;
    std::string_view description;
    DType weights;                ///< the weights the forward pass reads
    DType gradients;              ///< one gradient per parameter
    std::optional<DType> master;  ///< the fp32 copy mixed precision keeps; none when the weights are it
    DType activations;            ///< the compute dtype: activations, logits, activation gradients
    Optimizer optimizer;

    std::uint64_t weight_bytes() const { return bytes_per_element(weights); }
    std::uint64_t gradient_bytes() const { return bytes_per_element(gradients); }
    std::uint64_t master_bytes() const { return master ? bytes_per_element(*master) : 0; }
    std::uint64_t optimizer_bytes() const { return optimizer.state_bytes(); }
    std::uint64_t activation_bytes() const { return bytes_per_element(activations); }
    std::uint64_t step_temporary_bytes() const {
        return optimizer.step_temporary ? bytes_per_element(*optimizer.step_temporary) : 0;
    }
    std::string_view optimizer_state() const { return optimizer.state; }
    std::uint64_t bytes_per_parameter() const {
        return weight_bytes() + gradient_bytes() + master_bytes() + optimizer_bytes();
    }
    /// ZeRO's K (Rajbhandari et al. 2020, 3.1): optimiser-state bytes per parameter, master copy included.
    std::uint64_t zero_k() const { return master_bytes() + optimizer_bytes(); }
};

inline constexpr std::array<Recipe, 5> recipes{{
    {"mixed-adam", "mixed-precision Adam: bf16 weights and gradients, fp32 master copy and moments (ZeRO 3.1)",
     DType::bf16, DType::bf16, DType::fp32, DType::bf16, adam},
    {"fp32-adam", "plain fp32 Adam: fp32 weights, gradients, moments and activations",
     DType::fp32, DType::fp32, std::nullopt, DType::fp32, adam},
    {"mixed-adam-fp32-grads", "mixed-precision Adam with fp32 gradient accumulation, as Megatron-LM keeps them",
     DType::bf16, DType::fp32, DType::fp32, DType::bf16, adam},
    {"mixed-sgd", "mixed-precision SGD with momentum: bf16 weights and gradients, fp32 master copy and momentum",
     DType::bf16, DType::bf16, DType::fp32, DType::bf16, sgd_momentum},
    {"fp32-sgd", "plain fp32 SGD with momentum",
     DType::fp32, DType::fp32, std::nullopt, DType::fp32, sgd_momentum},
}};

inline constexpr std::string_view default_recipe = "mixed-adam";

/// Returns nullptr for an unknown name, so callers can suggest the nearest one.
inline const Recipe* find_recipe(std::string_view name) {
    for (const auto& r : recipes)
        if (r.name == name) return &r;
    return nullptr;
}

/// The built-in recipe of that name; an error naming it when there is none.
inline const Recipe& builtin_recipe(std::string_view name) {
    const Recipe* r = find_recipe(name);
    if (r == nullptr) throw error("unknown recipe '" + std::string(name) + "'");
    return *r;
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
    return {parameters * r.weight_bytes(), parameters * r.gradient_bytes(), parameters * r.master_bytes(),
            parameters * r.optimizer_bytes()};
}

}  // namespace memcalc
