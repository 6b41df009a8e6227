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

/// An optimiser as a row: the state slots it keeps per parameter and whether its step computes a
/// per-parameter temporary. Their dtype is the recipe's (`Recipe::state`): torch.optim keeps state in
/// the parameters' dtype, a mixed-precision optimiser in fp32 beside its master copy.
struct Optimizer {
    std::string_view name;
    std::string_view slots;   ///< as a report names them: "Adam m, v"
    std::uint64_t slot_count;
    /// Adam's step computes sqrt(v), then its quotient, per parameter; Lion its interpolation, then the
    /// sign of it (lion-pytorch, timm); SGD's momentum updates in place.
    bool step_temporary;
};

inline constexpr Optimizer adam{"adam", "Adam m, v", 2, true};
inline constexpr Optimizer sgd_momentum{"sgd-momentum", "momentum", 1, false};
/// Lion (Chen et al. 2023): one momentum; the update is the sign of an interpolation of it and the gradient.
inline constexpr Optimizer lion{"lion", "Lion momentum", 1, true};

inline constexpr std::array<Optimizer, 3> optimizers{{adam, sgd_momentum, lion}};

/// Returns nullptr for an unknown name, so callers can suggest the nearest one.
inline const Optimizer* find_optimizer(std::string_view name) {
    for (const auto& o : optimizers)
        if (o.name == name) return &o;
    return nullptr;
}

/// The dtypes a layer's tensors take: the compute dtype, and the residual stream's, which differs
/// under torch.autocast (the weights' dtype there; each matmul saves a cast copy of its input).
struct Precision {
    DType compute;
    DType stream;
    bool autocast = false;

    Precision(DType one) : compute(one), stream(one) {}  // one dtype throughout: no autocast
    Precision(DType compute_dtype, DType stream_dtype, bool under_autocast)
        : compute(compute_dtype), stream(stream_dtype), autocast(under_autocast) {}
};

/// A training recipe: the dtypes of the weights, gradients, master copy and activations, and its
/// optimiser; every byte count follows from them.
struct Recipe {
    std::string_view name;
    DType weights;                ///< the weights the forward pass reads
    DType gradients;              ///< one gradient per parameter
    std::optional<DType> master;  ///< the fp32 copy mixed precision keeps; none when the weights are it
    DType activations;            ///< the compute dtype: activations, logits, activation gradients
    Optimizer optimizer;
    DType state;                  ///< the optimiser's slots and its step's temporaries
    std::string_view description;
    /// The forward runs under torch.autocast: the weights (fp32) stay the residual stream's dtype, each
    /// matmul casts its inputs and its weights to `activations` (autocast_layer_rows tells the rest).
    bool autocast = false;

    /// The dtype of the residual stream and the norms: the weights' under autocast, else the activations'.
    DType stream() const { return autocast ? weights : activations; }
    Precision precision() const { return {activations, stream(), autocast}; }
    std::uint64_t weight_bytes() const { return bytes_per_element(weights); }
    std::uint64_t gradient_bytes() const { return bytes_per_element(gradients); }
    std::uint64_t master_bytes() const { return master ? bytes_per_element(*master) : 0; }
    std::uint64_t optimizer_bytes() const { return optimizer.slot_count * bytes_per_element(state); }
    std::uint64_t activation_bytes() const { return bytes_per_element(activations); }
    std::uint64_t step_temporary_bytes() const { return optimizer.step_temporary ? bytes_per_element(state) : 0; }
    /// "Adam m, v (fp32)"
    std::string optimizer_state() const { return std::string(optimizer.slots) + " (" + dtype_name(state) + ")"; }
    std::uint64_t bytes_per_parameter() const {
        return weight_bytes() + gradient_bytes() + master_bytes() + optimizer_bytes();
    }
    /// ZeRO's K (Rajbhandari et al. 2020, 3.1): optimiser-state bytes per parameter, master copy included.
    std::uint64_t zero_k() const { return master_bytes() + optimizer_bytes(); }
};

namespace recipe_table {  // short names for the table's cells
inline constexpr DType bf16 = DType::bf16, fp32 = DType::fp32;
inline constexpr std::optional<DType> none = std::nullopt;
}  // namespace recipe_table

inline constexpr std::array<Recipe, 8> recipes = [] {
    using namespace recipe_table;
    return std::array<Recipe, 8>{{
        // clang-format off
        // name                  weights grads master activations optimizer    state
        {"mixed-adam",            bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "mixed-precision Adam: bf16 weights and gradients, fp32 master copy and moments (ZeRO 3.1)"},
        {"fp32-adam",             fp32,  fp32, none,  fp32,  adam,         fp32,
         "plain fp32 Adam: fp32 weights, gradients, moments and activations"},
        {"mixed-adam-fp32-grads", bf16,  fp32, fp32,  bf16,  adam,         fp32,
         "mixed-precision Adam with fp32 gradient accumulation, as Megatron-LM keeps them"},
        {"mixed-sgd",             bf16,  bf16, fp32,  bf16,  sgd_momentum, fp32,
         "mixed-precision SGD with momentum: bf16 weights and gradients, fp32 master copy and momentum"},
        {"fp32-sgd",              fp32,  fp32, none,  fp32,  sgd_momentum, fp32,
         "plain fp32 SGD with momentum"},
        {"bf16-adam",             bf16,  bf16, none,  bf16,  adam,         bf16,
         "model.to(torch.bfloat16) with torch.optim.AdamW: all bf16, the moments and the step's temporaries too; no master copy"},
        {"lion",                  bf16,  bf16, fp32,  bf16,  lion,         fp32,
         "mixed-precision Lion: bf16 weights and gradients, an fp32 master copy and Lion's one momentum"},
        {"amp-adam",              fp32,  fp32, none,  bf16,  adam,         fp32,
         "an fp32 model under torch.autocast(bfloat16) with torch.optim.AdamW (nanoGPT, Trainer(bf16=True)): "
         "fp32 weights, gradients and moments; matmuls in bf16 on cast copies of their inputs and weights", true},
        // clang-format on
    }};
}();

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
