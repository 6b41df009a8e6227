#pragma once
/// Devices: what a GPU offers the training step. A new one is a row here (or a JSON file of the
/// keys `memcalc gpus --format json` prints).
#include <array>
#include <cstdint>
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
    /// Peak dense tensor-core FLOP/s (not the 2:4-sparse figure datasheets lead with); 0: none or
    /// unknown.
    std::uint64_t peak_bf16_flops = 0, peak_fp8_flops = 0;
    /// Bytes per second one GPU sends in one direction: to the GPUs of its node (NVLink, xGMI, or
    /// PCIe where it has neither), and out of the node (its share of the node's NICs); 0: unknown.
    std::uint64_t intra_node_bandwidth = 0, inter_node_bandwidth = 0;
    std::uint64_t gpus_per_node = 0;  ///< in the vendor's reference server; 0: unknown
    /// Bytes per second between the GPU and host memory, one direction (its PCIe link: Gen4 x16 is
    /// 32 GB/s each way, Gen5 x16 64), which offload crosses; 0: unknown.
    std::uint64_t host_bandwidth = 0;
    Text performance_source;  ///< where the FLOP/s come from
    Text
        network_source;  ///< where the bandwidths (the host link's too) and the node size come from
};

namespace detail {
inline constexpr std::uint64_t mib = 1ULL << 20;
inline constexpr std::uint64_t giga =
    1'000'000'000ULL;  // FLOP/s and bytes/s are decimal, as datasheets give them
}  // namespace detail

// Bandwidths are one direction's: NVIDIA's "900 GB/s NVLink" is both directions together, 450 each
// way; a 400 Gb/s NIC sends 50 GB/s. FLOP/s are dense: half of the datasheets' "with sparsity"
// figures.
inline const std::array<Gpu, 13> gpus{{
    {"a100-40gb", "NVIDIA A100 40GB",
     "nvidia-smi's total, as tabulated by Modal (modal.com, \"Why does an H100 80GB offer 85.52 "
     "GB\")",
     Count(40960 * detail::mib), 312'000 * detail::giga, 0, 300 * detail::giga, 25 * detail::giga,
     8, 32 * detail::giga, "NVIDIA A100 datasheet (SXM): BF16 312 TFLOPS dense; no FP8",
     "NVIDIA A100 datasheet: NVLink 600 GB/s both ways; DGX A100 datasheet: 8 GPUs, 8 x 200 Gb/s "
     "HDR InfiniBand; host link: PCIe Gen4 64 GB/s both ways (A100 datasheet)"},
    {"a100-80gb", "NVIDIA A100 80GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(81920 * detail::mib), 312'000 * detail::giga, 0, 300 * detail::giga, 25 * detail::giga,
     8, 32 * detail::giga, "NVIDIA A100 datasheet (SXM): BF16 312 TFLOPS dense; no FP8",
     "NVIDIA A100 datasheet: NVLink 600 GB/s both ways; DGX A100 datasheet: 8 GPUs, 8 x 200 Gb/s "
     "HDR InfiniBand; host link: PCIe Gen4 64 GB/s both ways (A100 datasheet)"},
    {"h100-sxm", "NVIDIA H100 80GB HBM3 (SXM)", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(81559 * detail::mib), 989'400 * detail::giga, 1'978'900 * detail::giga,
     450 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5): BF16 989.4, FP8 1978.9 TFLOPS "
     "dense",
     "NVIDIA H100 datasheet: NVLink 900 GB/s both ways; DGX H100: 8 GPUs, 8 x 400 Gb/s ConnectX-7; "
     "host link: PCIe Gen5 128 GB/s both ways (H100 datasheet)"},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB",
     "nvidia-smi output on H100 PCIe machines (e.g. SkyPilot logs: 81559MiB)",
     Count(81559 * detail::mib), 756'500 * detail::giga, 1'513'000 * detail::giga,
     64 * detail::giga, 0, 8, 64 * detail::giga,
     "NVIDIA H100 datasheet (PCIe): BF16 1,513 and FP8 3,026 TFLOPS with sparsity, half of each "
     "dense",
     "NVIDIA H100 datasheet: PCIe Gen5 128 GB/s both ways (its NVLink bridge joins pairs only); 8 "
     "a node: a common server, not a standard; NIC: none standard; host link: PCIe Gen5 128 GB/s "
     "both ways (H100 datasheet)"},
    {"h800", "NVIDIA H800 80GB HBM3 (SXM)",
     "assumed the H100 SXM's 81559MiB: the same 80 GB HBM3 part (no nvidia-smi output seen)",
     Count(81559 * detail::mib), 989'400 * detail::giga, 1'978'900 * detail::giga,
     200 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "the H100 SXM's (the same silicon, export-limited in NVLink only)",
     "NVLink 400 GB/s both ways (NVIDIA's H800 SXM spec); DeepSeek-V3 report: 8 GPUs a node, 400 "
     "Gb/s InfiniBand per GPU; host link: PCIe Gen5 128 GB/s both ways (H800 SXM spec)"},
    {"h200", "NVIDIA H200 141GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(143771 * detail::mib), 989'400 * detail::giga, 1'978'900 * detail::giga,
     450 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "the H100 SXM's (the same GPU with more memory; H200 datasheet: BF16 1,979, FP8 3,958 TFLOPS "
     "with sparsity)",
     "NVIDIA H200 datasheet: NVLink 900 GB/s both ways; DGX H200: 8 GPUs, 8 x 400 Gb/s ConnectX-7; "
     "host link: PCIe Gen5 128 GB/s both ways (H200 datasheet)"},
    {"b200", "NVIDIA B200", "nvidia-smi output in NVIDIA/TensorRT-LLM issue #10278 (183359MiB)",
     Count(183359 * detail::mib), 2'250'000 * detail::giga, 4'500'000 * detail::giga,
     900 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "NVIDIA HGX B200 specifications (1,000 W): BF16 4.5, FP8 9 PFLOPS with sparsity, half of each "
     "dense",
     "NVIDIA DGX B200 datasheet: 8 GPUs, NVLink 1.8 TB/s both ways per GPU, 8 x 400 Gb/s "
     "ConnectX-7; host link: PCIe Gen5 x16, 128 GB/s both ways (DGX B200 hosts it on Gen5 Xeon "
     "Platinum 8570 CPUs)"},
    {"mi300x", "AMD Instinct MI300X 192GB",
     "rocm-smi's VRAM Total Memory on bare-metal MI300X (206141652992 B)",
     Count(196592 * detail::mib), 1'307'400 * detail::giga, 2'614'900 * detail::giga,
     448 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "AMD Instinct MI300X datasheet: peak BF16 1,307.4, FP8 2,614.9 TFLOPS dense (twice that with "
     "sparsity)",
     "AMD Instinct MI300X platform datasheet: 8 GPUs, 7 Infinity Fabric links of 128 GB/s both "
     "ways each; "
     "400 Gb/s NIC per GPU; host link: PCIe Gen5 x16, 128 GB/s both ways (MI300X datasheet)"},
    {"l40s", "NVIDIA L40S 48GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(46068 * detail::mib), 362'050 * detail::giga, 733'000 * detail::giga, 32 * detail::giga,
     0, 8, 32 * detail::giga, "NVIDIA L40S datasheet: BF16 362.05, FP8 733 TFLOPS dense",
     "NVIDIA L40S datasheet: PCIe Gen4 x16 64 GB/s both ways, no NVLink; 8 a node: a common "
     "server, not a standard; NIC: none standard; host link: PCIe Gen4 x16 (the same link)"},
    {"l4", "NVIDIA L4 24GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(23034 * detail::mib), 121'000 * detail::giga, 242'500 * detail::giga, 32 * detail::giga,
     0, 8, 32 * detail::giga,
     "NVIDIA L4 datasheet: BF16 242, FP8 485 TFLOPS with sparsity, half of each dense",
     "NVIDIA L4 datasheet: PCIe Gen4 x16 64 GB/s both ways; 8 a node: a common server, not a "
     "standard; NIC: none standard; host link: PCIe Gen4 x16 (the same link)"},
    {"a10", "NVIDIA A10 24GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(23028 * detail::mib), 125'000 * detail::giga, 0, 32 * detail::giga, 0, 8,
     32 * detail::giga, "NVIDIA A10 datasheet: BF16 125 TFLOPS dense; no FP8",
     "NVIDIA A10 datasheet: PCIe Gen4 64 GB/s both ways; 8 a node: a common server, not a "
     "standard; NIC: none standard; host link: PCIe Gen4 (the same link)"},
    {"t4", "NVIDIA T4 16GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(15360 * detail::mib), 0, 0, 16 * detail::giga, 0, 8, 16 * detail::giga,
     "NVIDIA T4 datasheet: no BF16 or FP8 (FP16 65 TFLOPS)",
     "NVIDIA T4 datasheet: PCIe Gen3 x16 32 GB/s both ways; 8 a node: a common server, not a "
     "standard; NIC: none standard; host link: PCIe Gen3 x16 (the same link)"},
    {"rtx-4090", "NVIDIA GeForce RTX 4090 24GB",
     "nvidia-smi output in RLinf/RLinf issue #255 (24564MiB)", Count(24564 * detail::mib),
     165'200 * detail::giga, 330'300 * detail::giga, 32 * detail::giga, 0, 8, 32 * detail::giga,
     "NVIDIA Ada Lovelace architecture whitepaper: BF16 165.2, FP8 330.3 TFLOPS dense with FP32 "
     "accumulate",
     "PCIe Gen4 x16 32 GB/s each way, no NVLink; 8 a node is an assumption (workstations hold "
     "fewer); NIC: none; host link: PCIe Gen4 x16 (the same link)"},
}};

/// The built-in GPU of that name, or nullptr.
inline const Gpu* find_gpu(std::string_view name) {
    for (const auto& g : gpus)
        if (g.name == name) return &g;
    return nullptr;
}

}  // namespace memcalc
