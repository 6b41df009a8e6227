#pragma once
/// The MLP's activation functions as rows: each with the code it runs (one fused kernel, or a chain
/// of Python ops that autograd records op by op) and what autograd keeps of it for backward, in
/// tensors of the MLP's hidden width (s b f elements of the compute dtype). Measured with
/// torch 1.13 on CPU in bf16 by validation/activation_functions.py (saved_tensors_hooks, each
/// storage once; the profiler's allocations for the workspace), which `--compare` checks against
/// this table.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "memcalc/error.hpp"
#include "memcalc/kernels.hpp"
#include "memcalc/launches.hpp"
#include "memcalc/model.hpp"

namespace memcalc {

enum class ActivationKernel { fused, ops };

inline const char* kernel_name(ActivationKernel k) {
    return k == ActivationKernel::fused ? "fused" : "ops";
}

/// One s b f tensor an activation keeps for backward, other than its output. `op`: the op of the
/// chain that keeps it; empty for the fused kernel itself.
struct ActivationTensor {
    std::string_view op;
    std::string_view tensor;
    std::string_view why;
    bool input = false;  ///< the function's input itself (the projection's output it reads)
};

/// What a compiled layer's min-cut partition does with an activation function on one PyTorch row.
struct CompiledActivation {
    std::uint8_t keeps = 0xff;  ///< which of its kept tensors it still keeps (bit i for kept[i])
    /// It makes the function's output again where that is the down projection's input or the GLU
    /// product's factor.
    bool recomputes_output = false;
};

struct ActivationFunction {
    Activation id;
    std::string_view name;   ///< the model file's spelling
    std::string_view label;  ///< the per-layer table's op name
    ActivationKernel kernel;
    std::string_view
        code;  ///< what the modeling code runs on x, the up (or gate) projection's output
    std::array<ActivationTensor, 7> kept;  ///< the tensors autograd keeps, the first `kept_count()`
    bool keeps_output;  ///< ReLU's derivative is read from its output, which it keeps
    /// Its backward's temporaries, in s b f tensors: the incoming gradient and the gradients it
    /// makes, while everything it keeps is live. A fused kernel makes its input's gradient; a chain
    /// ending in a product of two tensors makes one for each factor first.
    std::uint64_t backward_workspace;
    std::string_view source;
    /// In a gated MLP, what the up branch becomes before the product, when not the up projection's
    /// output itself: the product keeps it, one more s b f tensor (gpt-oss's up.clamp(-7, 7) + 1).
    std::string_view up_branch = {};
    /// Inside a compiled layer (Architecture::compile), by PyTorch row (TorchVersion: 1.13's,
    /// 2.2's): what the min-cut partition does with it. Measured with
    /// validation/compile_partitioner.py (1.13: the partitioner through aot_module; 2.6:
    /// torch.compile with inductor) for the rows that say so; the others keep all, leaning high.
    std::array<CompiledActivation, 2> compiled = {};
    /// Kernels it launches, forward and backward (launches.hpp): a fused kernel one each way; a
    /// chain one an op, counted on CPU (validation/kernel_launches.py --ops).
    Launches launches = {1, 1};

    const CompiledActivation& compiled_on(TorchVersion torch) const {
        return compiled[static_cast<std::size_t>(torch)];
    }
    bool kept_when(bool compiled_layer, TorchVersion torch, std::size_t i) const {
        return !compiled_layer || ((compiled_on(torch).keeps >> i) & 1) != 0;
    }
    std::size_t kept_count() const {
        std::size_t n = 0;
        while (n < kept.size() && !kept[n].tensor.empty()) ++n;
        return n;
    }
};

namespace detail {
inline constexpr ActivationTensor fused_input{"", "its input",
                                              "its derivative is taken at its input", true};
inline constexpr ActivationTensor tanh_output{"tanh", "its output",
                                              "tanh's gradient is written in its output"};
inline constexpr ActivationTensor half_x{"0.5 * x * (1.0 + tanh)", "0.5 * x",
                                         "the gradient w.r.t. 1.0 + tanh"};
inline constexpr ActivationTensor one_plus_tanh{"0.5 * x * (1.0 + tanh)", "1.0 + tanh",
                                                "the gradient w.r.t. 0.5 * x"};
}  // namespace detail

/// The chains are transformers' (src/transformers/activations.py), selected by a config's
/// activation_function or hidden_act through ACT2FN.
inline constexpr std::array<ActivationFunction, 9> activation_functions{{
    {Activation::silu,
     "silu",
     "SiLU",
     ActivationKernel::fused,
     "F.silu(x)",
     {{detail::fused_input}},
     false,
     2,
     "torch.nn.functional.silu; transformers' 'silu' and 'swish'",
     {},
     {{{0xff, true}, {0xff, true}}}},  // compiled: its output recomputed (llama2.c's, 1.13 and 2.6)
    {Activation::gelu,
     "gelu",
     "GELU",
     ActivationKernel::fused,
     "F.gelu(x)",
     {{detail::fused_input}},
     false,
     2,
     "torch.nn.functional.gelu (erf), nn.GELU(); transformers' 'gelu' (GELUActivation)",
     {},
     // compiled: its output recomputed on 1.13, kept on 2.6 (nanoGPT's,
     // nn.TransformerEncoderLayer's)
     {{{0xff, true}, {0xff, false}}}},
    {Activation::gelu_tanh,
     "gelu_tanh",
     "GELU (tanh)",
     ActivationKernel::fused,
     "F.gelu(x, approximate='tanh')",
     {{detail::fused_input}},
     false,
     2,
     "transformers' 'gelu_pytorch_tanh' (PytorchGELUTanh)"},
    {Activation::relu,
     "relu",
     "ReLU",
     ActivationKernel::fused,
     "F.relu(x)",
     {},
     true,
     2,
     "torch.nn.functional.relu: threshold_backward reads its output; transformers' 'relu'"},
    {Activation::gelu_new,
     "gelu_new",
     "gelu_new",
     ActivationKernel::ops,
     "0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))",
     {{{"torch.pow(x, 3.0)", "its input", "pow's gradient is 3 x^2", true},
       detail::tanh_output,
       detail::half_x,
       detail::one_plus_tanh}},
     false,
     3,
     "transformers' 'gelu_new' (NewGELUActivation): GPT-2's and Phi-2's configs",
     {},
     {{{0b0011, true}, {}}},  // compiled on 1.13: its input and tanh's output kept (GPT-2's)
     {8, 11}},
    {Activation::gelu_fast,
     "gelu_fast",
     "gelu_fast",
     ActivationKernel::ops,
     "0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))",
     {{{"0.044715 * x * x", "its input", "the gradient w.r.t. 0.044715 * x", true},
       {"0.044715 * x * x", "0.044715 * x", "the gradient w.r.t. the second x"},
       {"x * 0.7978845608 * (1.0 + ...)", "x * 0.7978845608",
        "the gradient w.r.t. 1.0 + 0.044715 * x * x"},
       {"x * 0.7978845608 * (1.0 + ...)", "1.0 + 0.044715 * x * x",
        "the gradient w.r.t. x * 0.7978845608"},
       detail::tanh_output,
       detail::half_x,
       detail::one_plus_tanh}},
     false,
     3,
     "transformers' 'gelu_fast' (FastGELUActivation)",
     {},
     {},
     {9, 12}},
    {Activation::quick_gelu,
     "quick_gelu",
     "quick_gelu",
     ActivationKernel::ops,
     "x * torch.sigmoid(1.702 * x)",
     {{{"x * sigmoid", "its input", "the gradient w.r.t. sigmoid's output", true},
       {"sigmoid", "its output (also the product's)",
        "sigmoid's gradient is written in its output; the gradient w.r.t. x"}}},
     false,
     3,
     "transformers' 'quick_gelu' (QuickGELUActivation)",
     {},
     {},
     {3, 5}},
    // gpt-oss's experts (modeling_gpt_oss.py, GptOssExperts): the gate clamped above at 7, then
    // gate * sigmoid(1.702 gate); the up branch is up.clamp(-7, 7) + 1, whose clamp keeps the up
    // projection's output (in one storage with the gate's: gate_up_proj) and the product its sum.
    {Activation::clamped_swiglu,
     "clamped_swiglu",
     "clamped SwiGLU",
     ActivationKernel::ops,
     "x.clamp(max=7.0) * torch.sigmoid(x.clamp(max=7.0) * 1.702)",
     {{{"clamp", "its input", "clamp's gradient is masked where x exceeded the limit", true},
       {"gate * sigmoid", "the clamped gate", "the gradient w.r.t. sigmoid's output"},
       {"sigmoid", "its output (also the product's)",
        "sigmoid's gradient is written in its output; the gradient w.r.t. the gate"}}},
     false,
     3,
     "transformers' GptOssExperts (alpha 1.702, limit 7): gpt-oss",
     "up.clamp(-7, 7) + 1",
     {},
     {6, 8}},
    // relu keeps its output, which square reads as its input: one storage. Backward: four s x f
    // tensors at once, measured on CPU (torch 1.13, validation/activation_functions.py).
    {Activation::relu2,
     "relu2",
     "squared ReLU",
     ActivationKernel::ops,
     "torch.square(F.relu(x))",
     {{{"relu, square", "relu's output",
        "relu's backward reads its output; square's gradient 2 x is taken at it"}}},
     false,
     4,
     "transformers' 'relu2' (ReLUSquaredActivation): Nemotron-H's MLP",
     {},
     {},
     {2, 4}},
}};

inline const ActivationFunction& activation_function(Activation a) {
    for (const auto& f : activation_functions)
        if (f.id == a) return f;
    throw error("an activation function without a row");
}

/// nullptr for an unknown name, so callers can suggest the nearest one.
inline const ActivationFunction* find_activation_function(std::string_view name) {
    for (const auto& f : activation_functions)
        if (f.name == name) return &f;
    return nullptr;
}

}  // namespace memcalc
