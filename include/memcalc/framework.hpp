#pragma once
/// How the training framework runs a step, where frameworks differ: the kernels the architecture
/// activation model follows, the attention kernel, how the optimiser step runs and when the
/// gradients exist. One value in Settings; a profile (Megatron-LM, DeepSpeed, FSDP, ...) is a row of them.
#include "memcalc/activations.hpp"

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

}  // namespace memcalc
