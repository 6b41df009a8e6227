#pragma once
/// Devices: what a GPU offers the training step. A new one is a row here (or a JSON file of the keys
/// `memcalc gpus --format json` prints).
#include <array>
#include <string_view>

#include "memcalc/text.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

struct Gpu {
    Text name, description;
    Text source;  ///< where the memory figure comes from
    /// The memory as the driver reports it (nvidia-smi's total, exact to the MiB). PyTorch's CUDA
    /// context and the driver's own reserve take some of it: memcalc's --reserve stands for those.
    Count memory;
};

namespace detail {
inline constexpr std::uint64_t mib = 1ULL << 20;
}  // namespace detail

inline const std::array<Gpu, 10> gpus{{
    {"a100-40gb", "NVIDIA A100 40GB", "nvidia-smi's total, as tabulated by Modal (modal.com, \"Why does an H100 80GB offer 85.52 GB\")",
     Count(40960 * detail::mib)},
    {"a100-80gb", "NVIDIA A100 80GB", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(81920 * detail::mib)},
    {"h100-sxm", "NVIDIA H100 80GB HBM3 (SXM)", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(81559 * detail::mib)},
    {"h200", "NVIDIA H200 141GB", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(143771 * detail::mib)},
    {"b200", "NVIDIA B200", "nvidia-smi output in NVIDIA/TensorRT-LLM issue #10278 (183359MiB)", Count(183359 * detail::mib)},
    {"l40s", "NVIDIA L40S 48GB", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(46068 * detail::mib)},
    {"l4", "NVIDIA L4 24GB", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(23034 * detail::mib)},
    {"a10", "NVIDIA A10 24GB", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(23028 * detail::mib)},
    {"t4", "NVIDIA T4 16GB", "nvidia-smi's total, as tabulated by Modal (ibid.)", Count(15360 * detail::mib)},
    {"rtx-4090", "NVIDIA GeForce RTX 4090 24GB", "nvidia-smi output in RLinf/RLinf issue #255 (24564MiB)",
     Count(24564 * detail::mib)},
}};

/// The built-in GPU of that name, or nullptr.
inline const Gpu* find_gpu(std::string_view name) {
    for (const auto& g : gpus)
        if (g.name == name) return &g;
    return nullptr;
}

}  // namespace memcalc
