#pragma once
/// What PyTorch's kernels keep and make where platforms (and versions) differ: a row each, chosen
/// by the framework profile's platform. An op site reads a fact, never the platform, so a new
/// device or version is a row. Each fact was measured (validation/, peak_live.py).
#include <array>
#include <charconv>
#include <cstdint>
#include <optional>
#include <string_view>

#include "memcalc/launches.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

/// Where the framework profile's PyTorch runs. Its kernels differ in what they keep and in the
/// temporaries they make: CPU LayerNorm keeps bf16 statistics, and CPU softmax cannot upcast on the
/// fly, so softmax(x, dtype=float32) first copies x to fp32. CUDA is what users train on; the CPU
/// profile lets the validation measure the same model on any machine.
enum class Platform { cuda, cpu };

inline const char* platform_name(Platform p) { return p == Platform::cuda ? "cuda" : "cpu"; }

/// PyTorch releases where what autograd keeps changes: each the first of a row of version facts
/// (kernels.hpp's torch_rows), which holds until the next.
enum class TorchVersion { v1_13, v2_2 };

struct KernelFacts {
    Platform platform;
    Text name;
    Text measured;  ///< where the row's facts come from (the CPU's: validation/)
    /// LayerNorm saves its mean and 1/std in fp32 (else in its input's dtype).
    bool norm_statistics_fp32;
    /// Dropout saves a 1-byte mask (else F.dropout's noise, in its input's dtype).
    bool dropout_mask;
    /// softmax(x, dtype=float32) of an fp16 x upcasts as it reads (ATen's CUDA kernel, read from
    /// its source, not measured); any other x is copied to fp32 first, the copy softmaxed, and the
    /// backward returns an fp32 gradient beside x's (measured for bf16 on an H200, torch 2.11:
    /// gpu-op-history.txt).
    bool softmax_upcasts_fp16_on_read;
    /// A kernel of a narrow operand and a wider one casts as it reads (else it copies the narrow
    /// one to the wider dtype first: autocast's fp32 mask or residual, an fp32 adapter's sum).
    bool casts_on_read;
    /// Copies the batched matmul's backward makes of its strided operands (the product with V's).
    std::uint64_t bmm_backward_copies;
    /// Tensors of its output's size softmax's backward makes beside its output's gradient (CUDA's:
    /// two, measured at 2,048 and 4,096 columns on an H200, torch 2.11).
    std::uint64_t softmax_backward_tensors;
    /// Autocast runs softmax in fp32 whatever its input (CUDA autocast's fp32 list); else in its
    /// input's dtype (CPU autocast, torch 1.13: validation/results/cpu-third-party.json).
    bool autocast_softmax_fp32;
    /// Bytes a checkpoint keeps to restore the generator (preserve_rng_state): the CPU generator's
    /// state tensor (torch.get_rng_state().numel(), torch 1.13); a CUDA one's is a host tensor.
    std::uint64_t checkpoint_rng_state;
    /// Kernels a dropout launches: CUDA's native_dropout one each way (read from ATen's source);
    /// CPU's F.dropout draws, scales and multiplies (counted: validation/kernel_launches.py).
    Launches dropout_launches;
    /// Kernels F.one_hot launches: zeros and scatter_; off CUDA it first checks the indices' min
    /// and max (ATen's Onehot.cpp; counted on CPU: kernel_launches.py --reference).
    Launches one_hot_launches;
};

// The CUDA row's whole step agrees with the H200 replication (validation/results/gpu.txt); its
// dropout mask, which no GPU run drew, is ATen's fused_dropout as read from its source.
// clang-format off
inline constexpr std::array<KernelFacts, 2> kernel_rows{{
    // platform      name    measured         norm mask fp16 casts bmm sm amp rng dropout one_hot
    {Platform::cuda, "cuda", "H200, torch 2.11", true, true, true, true, 0, 2, true, 0, {1, 1},
     {2, 0}},
    {Platform::cpu, "cpu", "torch 1.13 CPU", false, false, false, false, 2, 1, false, 5056, {3, 1},
     {4, 0}},
}};
// clang-format on

/// The kernels of `platform`.
inline const KernelFacts& kernels_of(Platform platform) {
    for (const KernelFacts& k : kernel_rows)
        if (k.platform == platform) return k;
    return kernel_rows.front();
}

/// What autograd keeps where PyTorch versions differ, whatever the device: a row from each release
/// where a fact changes (--torch-version; a version between rows takes the earlier row's).
struct TorchFacts {
    TorchVersion version;
    Text name;  ///< the row's first release, as --torch-version takes it
    int major, minor;
    /// mean() keeps its input for backward (RMSNorm's x^2, fp32), not just its sizes: before
    /// pytorch/pytorch#109935 (2.2). Measured: torch 1.13's MeanBackward1 saves self.
    bool mean_saves_input;
};

// clang-format off
inline constexpr std::array<TorchFacts, 2> torch_rows{{
    // version             name    major minor mean keeps x^2
    {TorchVersion::v1_13, "1.13",  1,    13,   true},
    {TorchVersion::v2_2,  "2.2",   2,    2,    false},
}};
// clang-format on

inline const TorchFacts& torch_facts(TorchVersion v) {
    for (const TorchFacts& t : torch_rows)
        if (t.version == v) return t;
    return torch_rows.back();
}

inline const char* torch_version_name(TorchVersion v) {
    return torch_facts(v).name.data();  // a literal: terminated
}

/// The row a release "MAJOR.MINOR[anything]" runs with ("2.4.1+cu121"): the newest row not after
/// it; none for text that is no version or a release before the first row.
inline std::optional<TorchVersion> torch_version_of(std::string_view text) {
    int major = 0, minor = 0;
    const char* end = text.data() + text.size();
    const auto [dot, e1] = std::from_chars(text.data(), end, major);
    if (e1 != std::errc() || dot == end || *dot != '.') return std::nullopt;
    if (std::from_chars(dot + 1, end, minor).ec != std::errc()) return std::nullopt;
    std::optional<TorchVersion> found;
    for (const TorchFacts& t : torch_rows)
        if (major > t.major || (major == t.major && minor >= t.minor)) found = t.version;
    return found;
}

}  // namespace memcalc
