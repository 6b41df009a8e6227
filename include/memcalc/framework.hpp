#pragma once
/// How the training framework runs a step, where frameworks differ: the kernels the architecture
/// activation model follows, the attention kernel, how the optimiser step runs and when the
/// gradients exist. One value in Settings; a profile (Megatron-LM, DeepSpeed, FSDP, ...) is a row of them.
#include <array>
#include <string_view>

#include "memcalc/activations.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

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

struct Framework {
    Platform platform = Platform::cuda;              ///< the architecture model's kernels
    Attention attention = Attention::eager;          ///< eager scores, or a fused (flash) kernel
    OptimizerImpl optimizer = OptimizerImpl::fused;  ///< decides the optimiser step's temporaries
    GradBuffer grad_buffer = GradBuffer::lazy;       ///< when the gradients exist
};

/// A named framework: how training programs built on it run a step. A new one is a row here (or a
/// JSON file of the keys `memcalc profiles --format json` prints); command-line flags override its values.
struct FrameworkProfile {
    Text name, description, source;
    Framework framework;
};

inline constexpr Text default_profile = "default";

inline const std::array<FrameworkProfile, 5> framework_profiles{{
    {"default", "the chapter's model: CUDA kernels, eager attention, a fused optimiser step, gradients made by backward",
     "the chapter (Korthikanti et al. 2022's accounting)",
     {Platform::cuda, Attention::eager, OptimizerImpl::fused, GradBuffer::lazy}},
    {"pytorch", "a PyTorch 2 loop on CUDA: torch.optim's default (foreach) step, zero_grad(set_to_none=True), attention as written",
     "torch.optim docs (foreach is the default on CUDA); Optimizer.zero_grad (set_to_none=True by default since 2.0)",
     {Platform::cuda, Attention::eager, OptimizerImpl::foreach, GradBuffer::lazy}},
    {"megatron", "Megatron-LM: fused attention, a fused Adam step, the contiguous main_grad buffer (fp32 under bf16: "
                 "pair with --recipe mixed-adam-fp32-grads)",
     "Megatron-LM's DistributedDataParallel grad buffer and FusedAdam; NeMo's bf16-mixed (grad_reduce_in_fp32)",
     {Platform::cuda, Attention::flash, OptimizerImpl::fused, GradBuffer::persistent}},
    {"deepspeed", "DeepSpeed's engine: a fused Adam step, a contiguous gradient buffer; attention as the model's code writes it",
     "DeepSpeed's FusedAdam and its ZeRO stage 1/2 gradient partitions (runtime/zero/stage_1_and_2.py)",
     {Platform::cuda, Attention::eager, OptimizerImpl::fused, GradBuffer::persistent}},
    {"cpu-replication", "validation/'s CPU replication: PyTorch's CPU kernels, eager attention, a for-loop optimiser step",
     "validation/gpu/replicate.py --device cpu (its MixedAdam steps one tensor at a time)",
     {Platform::cpu, Attention::eager, OptimizerImpl::for_loop, GradBuffer::lazy}},
}};

/// The built-in profile of that name, or nullptr.
inline const FrameworkProfile* find_profile(std::string_view name) {
    for (const auto& p : framework_profiles)
        if (p.name == name) return &p;
    return nullptr;
}

}  // namespace memcalc
