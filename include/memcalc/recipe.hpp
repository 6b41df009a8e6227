#pragma once
/// Training recipes: the dtypes of weights, gradients, master copy and activations, and an
/// optimiser with its state slots. New recipes and optimisers are rows of these tables, not special
/// cases in code.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "memcalc/dtype.hpp"
#include "memcalc/error.hpp"
#include "memcalc/linear_casts.hpp"
#include "memcalc/optimizer.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// The dtypes a layer's tensors take: the compute dtype, and the residual stream's, which differs
/// under torch.autocast (the weights' dtype there; each matmul saves a cast copy of its input).
struct Precision {
    DType compute;
    DType stream;
    bool autocast = false;
    /// How the linear layers save their inputs, where narrower than `compute` (NarrowLinears).
    std::optional<Storage> linear_inputs;
    /// The casts the linear layers make in each pass, where they keep their inputs as they came
    /// (torchao's float8 and MXFP8); none: plain linears.
    const LinearCasts* linear_casts = nullptr;

    Precision(DType one) : compute(one), stream(one) {}  // one dtype throughout: no autocast
    Precision(DType compute_dtype, DType stream_dtype, bool under_autocast,
              std::optional<Storage> linear_input_dtype = std::nullopt,
              const LinearCasts* casts = nullptr)
        : compute(compute_dtype),
          stream(stream_dtype),
          autocast(under_autocast),
          linear_inputs(linear_input_dtype),
          linear_casts(casts) {}
};

/// Linear layers computed in a narrower format than the activations, as Transformer Engine runs
/// them (transformer_engine/pytorch/module/linear.py): each casts its input once and saves that
/// cast for the weight gradient, and keeps two casts of its weight as module buffers for the whole
/// run: fp8's and its transpose (Hopper's fp8 GEMMs take no transposed operand), or NVFP4's
/// rowwise and columnwise copies, each with its block scales.
struct NarrowLinears {
    Storage storage;  ///< a saved input's, and each weight cast's
    std::uint32_t weight_casts;
    std::string_view source = "";  ///< the files what they keep is read from
};

/// A training recipe: the dtypes of the weights, gradients, master copy and activations, and its
/// optimiser; every byte count follows from them.
struct Recipe {
    std::string_view name;
    DType weights;    ///< the weights the forward pass reads
    DType gradients;  ///< one gradient per parameter
    std::optional<DType>
        master;         ///< the fp32 copy mixed precision keeps; none when the weights are it
    DType activations;  ///< the compute dtype: activations, logits, activation gradients
    Optimizer optimizer;
    DType state;  ///< the optimiser's slots and its step's temporaries
    std::string_view description;
    /// The forward runs under torch.autocast: the weights (fp32) stay the residual stream's dtype,
    /// each matmul casts its inputs and its weights to `activations` (architecture_activations.hpp
    /// counts it).
    bool autocast = false;
    /// The layers' linear layers run in a narrower dtype (fp8): their saved inputs and weight
    /// casts.
    std::optional<NarrowLinears> linears = std::nullopt;
    /// The layers' linear layers keep their inputs in the compute dtype and cast them, and their
    /// weights and output gradients, in each pass (torchao): those casts as each pass's
    /// temporaries.
    const LinearCasts* casts = nullptr;

    /// The dtype of the residual stream and the norms: the weights' under autocast, else the
    /// activations'.
    DType stream() const { return autocast ? weights : activations; }
    /// The layers' linear layers multiply in a narrow format (fp8, NVFP4), at its rate.
    bool narrow_matmuls() const { return linears.has_value() || casts != nullptr; }
    Precision precision() const {
        return {activations, stream(), autocast,
                linears ? std::optional<Storage>(linears->storage) : std::nullopt, casts};
    }
    std::uint64_t weight_bytes() const { return bytes_per_element(weights); }
    std::uint64_t gradient_bytes() const { return bytes_per_element(gradients); }
    std::uint64_t master_bytes() const { return master ? bytes_per_element(*master) : 0; }
    /// Optimiser-state bytes per parameter, when every tensor keeps the same (not 8-bit, factored
    /// or Muon's).
    std::optional<std::uint64_t> optimizer_bytes() const { return optimizer.uniform_bytes(state); }
    std::uint64_t activation_bytes() const { return bytes_per_element(activations); }
    std::uint64_t step_temporary_bytes() const {
        return optimizer.step != StepWork::none ? bytes_per_element(state) : 0;
    }
    /// "Adam m, v (fp32)", "Adam m, v (int8, an fp32 scale per 256)"
    std::string optimizer_state() const {
        const auto& q = optimizer.slot_storage;  // 8-bit slots say their storage
        return std::string(optimizer.slots) + " (" +
               (q ? std::string(dtype_name(q->dtype)) + ", an " + dtype_name(q->scale) +
                        " scale per " + std::to_string(q->block)
                  : std::string(dtype_name(state))) +
               ")";
    }
    /// When the optimiser state is whole bytes per parameter.
    std::optional<std::uint64_t> bytes_per_parameter() const {
        if (!optimizer_bytes()) return std::nullopt;
        return weight_bytes() + gradient_bytes() + master_bytes() + *optimizer_bytes();
    }
    /// ZeRO's K (Rajbhandari et al. 2020, 3.1): optimiser-state bytes per parameter, master copy
    /// included.
    std::optional<std::uint64_t> zero_k() const {
        if (!optimizer_bytes()) return std::nullopt;
        return master_bytes() + *optimizer_bytes();
    }
};

namespace recipe_table {  // short names for the table's cells
inline constexpr DType bf16 = DType::bf16, fp32 = DType::fp32;
inline constexpr std::optional<DType> none = std::nullopt;
/// Transformer Engine's fp8 on Hopper: E4M3 forward tensors, a weight cast and its transpose.
inline constexpr NarrowLinears te_fp8{
    {DType::fp8_e4m3},
    2,
    "Transformer Engine 1.x transformer_engine/pytorch/module/linear.py, _Linear; "
    "fp8_cast_transpose_fused"};
/// Transformer Engine's NVFP4 on Blackwell (2.8 and later, NVFP4BlockScaling): E2M1 values two a
/// byte, an E4M3 scale per 16 along the last dimension, an fp32 amax a tensor; a weight's rowwise
/// and columnwise copies.
inline constexpr NarrowLinears te_nvfp4{
    {DType::fp4_e2m1, 16, DType::fp8_e4m3, 0, DType::fp32, 4},
    2,
    "Transformer Engine 2.20.0.dev0 (d0067d0d) transformer_engine/pytorch/module/linear.py, "
    "_Linear; tensor/nvfp4_tensor.py, NVFP4Quantizer.get_scale_shape"};
inline constexpr std::nullopt_t no_narrow = std::nullopt;
inline constexpr const LinearCasts* tensorwise = &linear_cast_rows[0];
inline constexpr const LinearCasts* rowwise = &linear_cast_rows[1];
inline constexpr const LinearCasts* mxfp8 = &linear_cast_rows[2];
inline constexpr const LinearCasts* gathered = &linear_cast_rows[3];
}  // namespace recipe_table

inline constexpr std::array<Recipe, 13> plain_recipes = [] {
    using namespace recipe_table;
    return std::array<Recipe, 13>{{
        // clang-format off
        // name                  weights grads master activations optimizer    state
        {"mixed-adam",            bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "mixed-precision Adam: bf16 weights and gradients, fp32 master copy and moments (ZeRO "
         "3.1)"},
        {"fp32-adam",             fp32,  fp32, none,  fp32,  adam,         fp32,
         "plain fp32 Adam: fp32 weights, gradients, moments and activations"},
        {"mixed-adam-fp32-grads", bf16,  fp32, fp32,  bf16,  adam,         fp32,
         "mixed-precision Adam with fp32 gradient accumulation, as Megatron-LM keeps them"},
        {"mixed-sgd",             bf16,  bf16, fp32,  bf16,  sgd_momentum, fp32,
         "mixed-precision SGD with momentum: bf16 weights and gradients, fp32 master copy and "
         "momentum"},
        {"fp32-sgd",              fp32,  fp32, none,  fp32,  sgd_momentum, fp32,
         "plain fp32 SGD with momentum"},
        {"bf16-adam",             bf16,  bf16, none,  bf16,  adam,         bf16,
         "model.to(torch.bfloat16) with torch.optim.AdamW: all bf16, the moments and the step's "
         "temporaries too; no master copy"},
        {"lion",                  bf16,  bf16, fp32,  bf16,  lion,         fp32,
         "mixed-precision Lion: bf16 weights and gradients, an fp32 master copy and Lion's one "
         "momentum"},
        {"adam-8bit",             bf16,  bf16, fp32,  bf16,  adam_8bit,    fp32,
         "bitsandbytes AdamW8bit (>= 0.44) beside a mixed-precision master: bf16 weights and "
         "gradients, fp32 master; "
         "m, v in 8 bits with an fp32 scale per 256 elements, fp32 below 4096 elements; one fused "
         "kernel, no temporaries"},
        {"adafactor",             bf16,  bf16, fp32,  bf16,  adafactor,    fp32,
         "transformers Adafactor (beta1=None) beside a mixed-precision master: bf16 weights and "
         "gradients, fp32 master; "
         "fp32 row and column second moments of each matrix, a whole one of each vector"},
        {"muon",                  bf16,  bf16, fp32,  bf16,  muon,         fp32,
         "Keller Jordan's Muon with aux AdamW, mixed precision: bf16 weights and gradients, fp32 "
         "master; fp32 momentum "
         "for the layers' matrices, fp32 m, v for embedding, head, norms and biases; bf16 "
         "Newton-Schulz"},
        {"amp-adam",              fp32,  fp32, none,  bf16,  adam,         fp32,
         "an fp32 model under torch.autocast(bfloat16) with torch.optim.AdamW (nanoGPT, "
         "Trainer(bf16=True)): "
         "fp32 weights, gradients and moments; matmuls in bf16 on cast copies of their inputs and "
         "weights", true},
        {"fp8",                   bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "Transformer Engine fp8 (1.x, Hopper) beside mixed-precision Adam: the layers' linear "
         "layers save their "
         "inputs in fp8 (one cast per input) and keep an fp8 cast of each weight and of its "
         "transpose, 2 B per "
         "weight element, for the run; attention, norms, the head and the loss stay "
         "bf16", false, te_fp8},
        {"nvfp4",                 bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "Transformer Engine NVFP4 (2.8+, Blackwell) beside mixed-precision Adam: the layers' "
         "linear layers save their inputs' columnwise NVFP4 copy (fp4 values two a byte, an fp8 "
         "scale per 16: 0.5625 B an element) and keep a weight's rowwise and columnwise copies, "
         "1.125 B per weight element, for the run; attention, norms, the head and the loss stay "
         "bf16", false, te_nvfp4},
        // clang-format on
    }};
}();

/// The block-scaled formats a recipe file's "linears" names (a whole-byte dtype's name also works).
struct NarrowLinearFormat {
    std::string_view key;
    NarrowLinears linears;
};
inline constexpr std::array<NarrowLinearFormat, 2> narrow_linear_formats{{
    {"fp8-e4m3", recipe_table::te_fp8},
    {"nvfp4", recipe_table::te_nvfp4},
}};

/// A recipe file's name for `n`: its format's key, or its dtype's name.
inline std::string narrow_linear_key(const NarrowLinears& n) {
    for (const auto& row : narrow_linear_formats)
        if (row.linears.storage == n.storage) return std::string(row.key);
    return dtype_name(n.storage.dtype);
}

/// Where what a recipe's linears keep is read from: torchao's functions, Transformer Engine's
/// files; empty for plain linears.
inline std::string_view linears_source(const Recipe& r) {
    if (r.casts != nullptr) return r.casts->source;
    return r.linears ? r.linears->source : std::string_view();
}

/// Recipes whose linears cast in each pass (linear_casts.hpp), beside mixed-precision Adam.
inline constexpr std::array<Recipe, 4> casting_recipes = [] {
    using namespace recipe_table;
    return std::array<Recipe, 4>{{
        // clang-format off
        {"float8-tensorwise",     bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "torchao float8, tensorwise (torchtitan's float8 converter), beside mixed-precision Adam: "
         "bf16 inputs kept, each linear's float8 casts its temporaries", false, no_narrow,
         tensorwise},
        {"float8-rowwise",        bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "torchao float8, rowwise, beside mixed-precision Adam: as float8-tensorwise, a scale a "
         "row, eagerly fp32 products of the scales", false, no_narrow, rowwise},
        {"mxfp8",                 bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "torchao MXFP8 (Blackwell), beside mixed-precision Adam: bf16 inputs kept, each linear's "
         "casts with an E8M0 scale per 32 its temporaries", false, no_narrow, mxfp8},
        {"float8-all-gather",     bf16,  bf16, fp32,  bf16,  adam,         fp32,
         "float8-tensorwise under --zero 3 with FSDP2's float8 all-gather: weights gathered in "
         "float8 (1 B), no weight casts", false, no_narrow, gathered},
        // clang-format on
    }};
}();

/// Every built-in recipe: the plain ones, then the casting ones.
inline constexpr std::array<Recipe, 17> recipes = [] {
    std::array<Recipe, 17> all{};
    for (std::size_t i = 0; i < plain_recipes.size(); ++i) all[i] = plain_recipes[i];
    for (std::size_t i = 0; i < casting_recipes.size(); ++i)
        all[plain_recipes.size() + i] = casting_recipes[i];
    return all;
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
        return {x.weights + y.weights, x.gradients + y.gradients,
                x.master_weights + y.master_weights, x.optimizer_state + y.optimizer_state};
    }
};

/// With the optimiser state counted per tensor (model_state), for any recipe.
inline TrainingState training_state(Count parameters, const Recipe& r, Count optimizer_state) {
    return {parameters * r.weight_bytes(), parameters * r.gradient_bytes(),
            parameters * r.master_bytes(), optimizer_state};
}

/// A recipe whose optimiser state is whole bytes per parameter (Recipe::optimizer_bytes).
inline TrainingState training_state(Count parameters, const Recipe& r) {
    return training_state(parameters, r, parameters * r.optimizer_bytes().value());
}

}  // namespace memcalc
