#pragma once
/// Fused attention kernels' measured rates, for the step time: which kernel a program's fused
/// attention runs (a framework switch) and, on the GPUs of the architecture it was measured on,
/// the share of their dense bf16 peak it reaches. A new kernel or measurement is a row here; a GPU
/// with no row for its kernel keeps its own assumption (Gpu::attention_efficiency).
#include <algorithm>
#include <array>
#include <string_view>

#include "memcalc/hardware.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

/// The fused kernel that runs the attention core: FlashAttention-2 (PyTorch's SDPA picks its
/// bundled FlashAttention-2 first on Hopper: pytorch/pytorch#142132, torchtitan keeps it there,
/// torchtitan PR #1196), cuDNN's (Transformer Engine prefers it on Hopper, NVIDIA/NeMo PR #9188)
/// or FlashAttention-3.
enum class AttentionKernel { flash_attention_2, cudnn, flash_attention_3 };

inline const char* attention_kernel_name(AttentionKernel k) {
    switch (k) {
        case AttentionKernel::flash_attention_2: return "flash-attention-2";
        case AttentionKernel::cudnn: return "cudnn";
        case AttentionKernel::flash_attention_3: return "flash-attention-3";
    }
    return "?";
}

/// The tensor layouts a fused kernel reads and writes: batch-first alone (flash-attn's [b, s, h,
/// d]; a program whose layers run sequence-first hands it contiguous copies of q, k and v and gets
/// its output back as a transposed view) or the program's own, sequence-first too (cuDNN's, through
/// Transformer Engine's sbhd layouts); and whether its output is made in q's layout (empty_like(q):
/// a program that hands it a contiguous heads-first q gets a heads-first output back, which its
/// transpose to [b, s, h, d] and reshape copy) or batch-first whatever q's.
struct AttentionKernelLayout {
    AttentionKernel kernel;
    bool batch_first_only;
    Text source;
    bool output_follows_q;
    Text output_source;
};

inline constexpr Text te_flash_layout =
    "TransformerEngine@d0067d0 attention/dot_product_attention/backends.py:928-943 (q, k, v "
    "transposed to bshd and made contiguous for flash-attn), 1347-1356 (the output viewed back "
    "to sbhd, not copied)";

inline constexpr std::array<AttentionKernelLayout, 3> attention_kernel_layouts{{
    {AttentionKernel::flash_attention_2, true, te_flash_layout, true,
     "PyTorch 2.1+'s FlashAttention-2 (flash_attn/flash_api.cpp mha_fwd: out = "
     "at::empty_like(q_padded), flash-attn 2's own the same), its backward copying that output "
     "batch-first (attention_backward.cu _flash_attention_backward: out.contiguous())"},
    {AttentionKernel::cudnn, false,
     "TransformerEngine@d0067d0 FusedAttention: the sbhd_sbhd_sbhd layouts, its output written "
     "sequence-first",
     true, "PyTorch's cuDNN SDPA (cudnn/MHA.cpp: alloc_with_matching_layout(q, o, ...))"},
    {AttentionKernel::flash_attention_3, true, te_flash_layout, false,
     "flash-attention@000090d0 hopper/flash_api.cpp mha_fwd: out = torch::empty({b, s_q, h, d_v})"},
}};

/// Whether `kernel` reads and writes batch-first tensors alone.
inline bool batch_first_only(AttentionKernel kernel) {
    for (const AttentionKernelLayout& row : attention_kernel_layouts)
        if (row.kernel == kernel) return row.batch_first_only;
    return true;  // a kernel not listed: the copies counted, leaning high
}

/// Whether `kernel` makes its output in q's layout.
inline bool output_follows_q(AttentionKernel kernel) {
    for (const AttentionKernelLayout& row : attention_kernel_layouts)
        if (row.kernel == kernel) return row.output_follows_q;
    return true;  // a kernel not listed: the copy counted, leaning high
}

/// One kernel's measured forward (causal) and backward FLOP/s on a reference GPU, as its source
/// counts FLOPs, and the GPUs of that GPU's architecture, each taken to reach the same share of its
/// own peak (an assumption).
struct AttentionKernelRate {
    AttentionKernel kernel;
    double forward_flops, backward_flops;
    double reference_peak;  ///< the reference GPU's dense bf16 FLOP/s
    std::array<Text, 5> gpus;
    Text source;

    /// The share of the peak as memcalc counts the attention's FLOPs (a backward of twice the
    /// forward's) where the kernel runs 2.5 times them (it makes the scores again).
    double efficiency() const {
        return 3 / (1 / forward_flops + 2.5 / backward_flops) / reference_peak;
    }
};

namespace detail {
inline constexpr std::array<Text, 5> hopper{"h100-sxm", "h100-pcie", "h100-hbm2e-500w", "h800",
                                            "h200"};
inline constexpr Text fa3_paper =
    "Shah et al. 2024, FlashAttention-3 (arXiv:2407.08608), figures 5 and 6: H100 80GB SXM5, "
    "BF16, head dim 128, 8K tokens; forward with a causal mask, backward without";
}  // namespace detail

inline constexpr std::array<AttentionKernelRate, 3> attention_kernel_rates{{
    {AttentionKernel::flash_attention_2, 333e12, 318e12, 989.4e12, detail::hopper,
     detail::fa3_paper},
    {AttentionKernel::cudnn, 529e12, 518e12, 989.4e12, detail::hopper, detail::fa3_paper},
    {AttentionKernel::flash_attention_3, 602e12, 559e12, 989.4e12, detail::hopper,
     detail::fa3_paper},
}};

/// The row measuring `kernel` on `gpu`'s architecture, or nullptr.
inline const AttentionKernelRate* attention_kernel_rate(const Gpu& gpu, AttentionKernel kernel) {
    for (const AttentionKernelRate& r : attention_kernel_rates)
        if (r.kernel == kernel &&
            std::find(r.gpus.begin(), r.gpus.end(), std::string_view(gpu.name)) != r.gpus.end())
            return &r;
    return nullptr;
}

/// The share of `gpu`'s bf16 peak its attention core runs at: a fused `kernel`'s measured share
/// where a row has it, else the GPU's own (eager attention's, and every unmeasured kernel's).
inline double attention_efficiency(const Gpu& gpu, bool fused, AttentionKernel kernel) {
    const AttentionKernelRate* row = fused ? attention_kernel_rate(gpu, kernel) : nullptr;
    return row ? row->efficiency() : gpu.attention_efficiency;
}

}  // namespace memcalc
