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
    /// The memory as the driver reports it (nvidia-smi's total, exact to the MiB). The CUDA
    /// context and the driver's own reserve take some of it: rows of outside.hpp.
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
    /// Bytes per second of the GPU's own memory, from its datasheet: the rate of memory-bound work
    /// (element-wise ops; matrix products whose weights take longer to read than to multiply); 0:
    /// unknown, that work not timed.
    std::uint64_t memory_bandwidth = 0;
    /// The step time's kernel and network facts (step_time.hpp): assumptions, the same for every
    /// GPU here, that a GPU file may replace with its own measurements.
    /// Large bf16 matrix products' share of the dense peak: cuBLAS and CUTLASS reach 70-80% on
    /// H100 at 8192^3 (NVIDIA's CUTLASS benchmarks), less at the shapes training runs; 0.7.
    double gemm_efficiency = 0.7;
    /// A fused attention kernel's share of the peak, forward and backward: FlashAttention-2 reaches
    /// 35% on H100 and 50-73% (forward) on A100 (the FlashAttention-3 and -2 papers); 0.4.
    double attention_efficiency = 0.4;
    /// Seconds each collective, ring step or send pays before its bytes flow, within a node and
    /// across nodes: NCCL's small-message times are tens of microseconds; 10 and 20, assumed.
    double intra_node_latency = 10e-6, inter_node_latency = 20e-6;
    /// The share of the GPU's compute a collective's kernel holds while it runs beside compute,
    /// which that compute then lacks: NCCL's all-gather launched 24 blocks on an H100's 132 SMs
    /// (NVIDIA developer forums, "Compute-communication overlap causes severe GEMM performance
    /// degradation because of tail effect", 2025); 24/132, leaning fast (that GEMM lost more).
    double collective_sm_share = 24.0 / 132;
    /// Seconds the host takes to dispatch one kernel of eager PyTorch (Python, the dispatcher, the
    /// launch): a step is at least its launches times this (launches.hpp). Fitted on the H200
    /// replication's GPT-2 runs (torch 2.11; validation/gpu/step_times.py --fit), its 1B LLaMA
    /// runs held out; a property of the host and the framework more than the GPU.
    double launch_seconds = 18.4e-6;
};

namespace detail {
inline constexpr std::uint64_t mib = 1ULL << 20;
inline constexpr std::uint64_t giga =
    1'000'000'000ULL;  // FLOP/s and bytes/s are decimal, as datasheets give them
}  // namespace detail

// Memory bandwidths are each vendor's datasheet figure (H100 SXM: 3.35 TB/s; MI250X: one GCD's half
// of 3.2768 TB/s). Bandwidths are one direction's: NVIDIA's "900 GB/s NVLink" is both directions
// together, 450 each way; a 400 Gb/s NIC sends 50 GB/s. FLOP/s are dense: half of the datasheets'
// "with sparsity" figures.
inline const std::array<Gpu, 25> gpus{{
    {"a100-40gb", "NVIDIA A100 40GB",
     "nvidia-smi's total, as tabulated by Modal (modal.com, \"Why does an H100 80GB offer 85.52 "
     "GB\")",
     Count(40960 * detail::mib), 312'000 * detail::giga, 0, 300 * detail::giga, 25 * detail::giga,
     8, 32 * detail::giga, "NVIDIA A100 datasheet (SXM): BF16 312 TFLOPS dense; no FP8",
     "NVIDIA A100 datasheet: NVLink 600 GB/s both ways; DGX A100 datasheet: 8 GPUs, 8 x 200 Gb/s "
     "HDR InfiniBand; host link: PCIe Gen4 64 GB/s both ways (A100 datasheet)",
     1555 * detail::giga},
    {"a100-80gb", "NVIDIA A100 80GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(81920 * detail::mib), 312'000 * detail::giga, 0, 300 * detail::giga, 25 * detail::giga,
     8, 32 * detail::giga, "NVIDIA A100 datasheet (SXM): BF16 312 TFLOPS dense; no FP8",
     "NVIDIA A100 datasheet: NVLink 600 GB/s both ways; DGX A100 datasheet: 8 GPUs, 8 x 200 Gb/s "
     "HDR InfiniBand; host link: PCIe Gen4 64 GB/s both ways (A100 datasheet)",
     2039 * detail::giga},
    {"h100-sxm", "NVIDIA H100 80GB HBM3 (SXM)", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(81559 * detail::mib), 989'400 * detail::giga, 1'978'900 * detail::giga,
     450 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "NVIDIA H100 Tensor Core GPU Architecture whitepaper (SXM5): BF16 989.4, FP8 1978.9 TFLOPS "
     "dense",
     "NVIDIA H100 datasheet: NVLink 900 GB/s both ways; DGX H100: 8 GPUs, 8 x 400 Gb/s ConnectX-7; "
     "host link: PCIe Gen5 128 GB/s both ways (H100 datasheet)",
     3350 * detail::giga},
    {"h100-pcie", "NVIDIA H100 PCIe 80GB",
     "nvidia-smi output on H100 PCIe machines (e.g. SkyPilot logs: 81559MiB)",
     Count(81559 * detail::mib), 756'500 * detail::giga, 1'513'000 * detail::giga,
     64 * detail::giga, 0, 8, 64 * detail::giga,
     "NVIDIA H100 datasheet (PCIe): BF16 1,513 and FP8 3,026 TFLOPS with sparsity, half of each "
     "dense",
     "NVIDIA H100 datasheet: PCIe Gen5 128 GB/s both ways (its NVLink bridge joins pairs only); 8 "
     "a node: a common server, not a standard; NIC: none standard; host link: PCIe Gen5 128 GB/s "
     "both ways (H100 datasheet)",
     2000 * detail::giga},
    // Meta's Grand Teton H100s, on which torchtitan publishes its benchmarks: not a catalogue part.
    {"h100-hbm2e-500w", "NVIDIA H100 96GB HBM2e at 500 W (Meta's Grand Teton; torchtitan's runs)",
     "assumed the H100 NVL's 95830MiB (nvidia-smi on H100 NVL machines): torchtitan's pages give "
     "96GB and 94GB, no nvidia-smi output seen",
     Count(95830 * detail::mib), 912'450 * detail::giga, 1'824'700 * detail::giga,
     450 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "assumed midway between the H100 NVL's (BF16 835.5, FP8 1,670.5 TFLOPS dense) and the SXM's: "
     "torchtitan's async-TP post says its peak lies between the two and is not known; memory "
     "2.4 TB/s (torchtitan docs/performance.md)",
     "torchtitan docs/performance.md: 8 GPUs a host fully connected with NVLink (taken as the "
     "SXM's 900 GB/s both ways), 400 Gb/s RDMA per GPU; host link: PCIe Gen5 128 GB/s both ways "
     "(assumed, as the SXM's)",
     2400 * detail::giga},
    {"h800", "NVIDIA H800 80GB HBM3 (SXM)",
     "assumed the H100 SXM's 81559MiB: the same 80 GB HBM3 part (no nvidia-smi output seen)",
     Count(81559 * detail::mib), 989'400 * detail::giga, 1'978'900 * detail::giga,
     200 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "the H100 SXM's (the same silicon, export-limited in NVLink only)",
     "NVLink 400 GB/s both ways (NVIDIA's H800 SXM spec); DeepSeek-V3 report: 8 GPUs a node, 400 "
     "Gb/s InfiniBand per GPU; host link: PCIe Gen5 128 GB/s both ways (H800 SXM spec)",
     3350 * detail::giga},
    {"h200", "NVIDIA H200 141GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(143771 * detail::mib), 989'400 * detail::giga, 1'978'900 * detail::giga,
     450 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "the H100 SXM's (the same GPU with more memory; H200 datasheet: BF16 1,979, FP8 3,958 TFLOPS "
     "with sparsity)",
     "NVIDIA H200 datasheet: NVLink 900 GB/s both ways; DGX H200: 8 GPUs, 8 x 400 Gb/s ConnectX-7; "
     "host link: PCIe Gen5 128 GB/s both ways (H200 datasheet)",
     4800 * detail::giga},
    {"b200", "NVIDIA B200", "nvidia-smi output in NVIDIA/TensorRT-LLM issue #10278 (183359MiB)",
     Count(183359 * detail::mib), 2'250'000 * detail::giga, 4'500'000 * detail::giga,
     900 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "NVIDIA HGX B200 specifications (1,000 W): BF16 4.5, FP8 9 PFLOPS with sparsity, half of each "
     "dense",
     "NVIDIA DGX B200 datasheet: 8 GPUs, NVLink 1.8 TB/s both ways per GPU, 8 x 400 Gb/s "
     "ConnectX-7; host link: PCIe Gen5 x16, 128 GB/s both ways (DGX B200 hosts it on Gen5 Xeon "
     "Platinum 8570 CPUs)",
     8000 * detail::giga},
    {"mi300x", "AMD Instinct MI300X 192GB",
     "rocm-smi's VRAM Total Memory on bare-metal MI300X (206141652992 B)",
     Count(196592 * detail::mib), 1'307'400 * detail::giga, 2'614'900 * detail::giga,
     448 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "AMD Instinct MI300X datasheet: peak BF16 1,307.4, FP8 2,614.9 TFLOPS dense (twice that with "
     "sparsity)",
     "AMD Instinct MI300X platform datasheet: 8 GPUs, 7 Infinity Fabric links of 128 GB/s both "
     "ways each; "
     "400 Gb/s NIC per GPU; host link: PCIe Gen5 x16, 128 GB/s both ways (MI300X datasheet)",
     5300 * detail::giga},
    {"l40s", "NVIDIA L40S 48GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(46068 * detail::mib), 362'050 * detail::giga, 733'000 * detail::giga, 32 * detail::giga,
     0, 8, 32 * detail::giga, "NVIDIA L40S datasheet: BF16 362.05, FP8 733 TFLOPS dense",
     "NVIDIA L40S datasheet: PCIe Gen4 x16 64 GB/s both ways, no NVLink; 8 a node: a common "
     "server, not a standard; NIC: none standard; host link: PCIe Gen4 x16 (the same link)",
     864 * detail::giga},
    {"l4", "NVIDIA L4 24GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(23034 * detail::mib), 121'000 * detail::giga, 242'500 * detail::giga, 32 * detail::giga,
     0, 8, 32 * detail::giga,
     "NVIDIA L4 datasheet: BF16 242, FP8 485 TFLOPS with sparsity, half of each dense",
     "NVIDIA L4 datasheet: PCIe Gen4 x16 64 GB/s both ways; 8 a node: a common server, not a "
     "standard; NIC: none standard; host link: PCIe Gen4 x16 (the same link)",
     300 * detail::giga},
    {"a10", "NVIDIA A10 24GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(23028 * detail::mib), 125'000 * detail::giga, 0, 32 * detail::giga, 0, 8,
     32 * detail::giga, "NVIDIA A10 datasheet: BF16 125 TFLOPS dense; no FP8",
     "NVIDIA A10 datasheet: PCIe Gen4 64 GB/s both ways; 8 a node: a common server, not a "
     "standard; NIC: none standard; host link: PCIe Gen4 (the same link)",
     600 * detail::giga},
    {"t4", "NVIDIA T4 16GB", "nvidia-smi's total, as tabulated by Modal (ibid.)",
     Count(15360 * detail::mib), 0, 0, 16 * detail::giga, 0, 8, 16 * detail::giga,
     "NVIDIA T4 datasheet: no BF16 or FP8 (FP16 65 TFLOPS)",
     "NVIDIA T4 datasheet: PCIe Gen3 x16 32 GB/s both ways; 8 a node: a common server, not a "
     "standard; NIC: none standard; host link: PCIe Gen3 x16 (the same link)",
     320 * detail::giga},
    {"rtx-4090", "NVIDIA GeForce RTX 4090 24GB",
     "nvidia-smi output in RLinf/RLinf issue #255 (24564MiB)", Count(24564 * detail::mib),
     165'200 * detail::giga, 330'300 * detail::giga, 32 * detail::giga, 0, 8, 32 * detail::giga,
     "NVIDIA Ada Lovelace architecture whitepaper: BF16 165.2, FP8 330.3 TFLOPS dense with FP32 "
     "accumulate",
     "PCIe Gen4 x16 32 GB/s each way, no NVLink; 8 a node is an assumption (workstations hold "
     "fewer); NIC: none; host link: PCIe Gen4 x16 (the same link)",
     1008 * detail::giga},
    {"rtx-3090", "NVIDIA GeForce RTX 3090 24GB",
     "nvidia-smi output in noonghunna/club-3090 issue #390 (24576MiB)", Count(24576 * detail::mib),
     71'000 * detail::giga, 0, 32 * detail::giga, 0, 8, 32 * detail::giga,
     "NVIDIA Ampere GA102 GPU architecture whitepaper, as recalled (not read here): BF16 71 TFLOPS "
     "dense with FP32 accumulate "
     "(142 with sparsity); no FP8",
     "PCIe Gen4 x16 32 GB/s each way (its NVLink bridge joins pairs only); 8 a node is an "
     "assumption (workstations hold fewer); NIC: none; host link: PCIe Gen4 x16 (the same link)",
     936 * detail::giga},
    {"rtx-a6000", "NVIDIA RTX A6000 48GB",
     "nvidia-smi outputs of RTX A6000 machines in public repositories' notes (49140MiB; no issue "
     "thread found)",
     Count(49140 * detail::mib), 154'850 * detail::giga, 0, 32 * detail::giga, 0, 8,
     32 * detail::giga,
     "NVIDIA RTX A6000 datasheet, as recalled (not read here): tensor 309.7 TFLOPS with sparsity, "
     "half of it dense; no FP8",
     "NVIDIA RTX A6000 datasheet: PCIe Gen4 x16 (its NVLink bridge, 112.5 GB/s both ways, joins "
     "pairs only); 8 a node: a common server, not a standard; NIC: none standard; host link: PCIe "
     "Gen4 x16 (the same link)",
     768 * detail::giga},
    {"l40", "NVIDIA L40 48GB",
     "assumed the L40S's 46068MiB: the same 48 GB GDDR6 AD102 board (no nvidia-smi output seen)",
     Count(46068 * detail::mib), 181'050 * detail::giga, 362'000 * detail::giga, 32 * detail::giga,
     0, 8, 32 * detail::giga,
     "NVIDIA L40 datasheet: BF16 181.05, FP8 362 TFLOPS dense (362.1 and 724 with sparsity)",
     "NVIDIA L40 datasheet: PCIe Gen4 x16 64 GB/s both ways, no NVLink; 8 a node: a common "
     "server, not a standard; NIC: none standard; host link: PCIe Gen4 x16 (the same link)",
     864 * detail::giga},
    {"h20", "NVIDIA H20 96GB HBM3",
     "nvidia-smi of an 8 x H20 server in ArthurChiao's GPU server notes (97871MiB); GH200 96GB "
     "reports the same total",
     Count(97871 * detail::mib), 148'000 * detail::giga, 296'000 * detail::giga, 450 * detail::giga,
     0, 8, 64 * detail::giga,
     "NVIDIA H20 specifications: FP16/BF16 148, FP8 296 TFLOPS dense (a measured BF16 GEMM "
     "reaches 142: zzc0721/torch-performance-test-data issue #77)",
     "NVIDIA H20 specifications: NVLink 900 GB/s both ways (nvidia-smi topo: NV18); HGX H20: 8 "
     "GPUs; NIC: none standard (each vendor fits its own); host link: PCIe Gen5 128 GB/s both "
     "ways",
     4000 * detail::giga},
    {"a800-80gb", "NVIDIA A800 80GB (SXM)",
     "nvidia-smi output in dexmal/dexbotic issue #41 (A800-SXM4-80GB: 81920MiB; the A800 80GB "
     "PCIe's in vllm-project/vllm issue #41519 is the same)",
     Count(81920 * detail::mib), 312'000 * detail::giga, 0, 200 * detail::giga, 25 * detail::giga,
     8, 32 * detail::giga,
     "the A100 SXM's (the same GA100, export-limited in NVLink only): BF16 312 TFLOPS dense; no "
     "FP8",
     "NVIDIA A800 SXM: NVLink 400 GB/s both ways; 8 GPUs and 8 x 200 Gb/s HDR InfiniBand assumed "
     "as DGX A100's; host link: PCIe Gen4 64 GB/s both ways (as A100)",
     2039 * detail::giga},
    {"v100-16gb", "NVIDIA Tesla V100 SXM2 16GB",
     "nvidia-smi output in 1CatAI/1Cat-vLLM issue #85 (Tesla V100-SXM2-16GB, driver 570: "
     "16384MiB; older drivers print less)",
     Count(16384 * detail::mib), 0, 0, 150 * detail::giga, 6'250'000'000ULL, 8, 16 * detail::giga,
     "NVIDIA V100 datasheet: no BF16 or FP8 (FP16 tensor 125 TFLOPS, SXM2)",
     "NVIDIA V100 datasheet, as recalled (not read here): NVLink 300 GB/s both ways; DGX-1: 8 "
     "GPUs, 4 x 100 Gb/s EDR "
     "InfiniBand; host link: PCIe Gen3 x16 32 GB/s both ways",
     900 * detail::giga},
    {"v100-32gb", "NVIDIA Tesla V100 SXM2 32GB",
     "nvidia-smi outputs of Tesla V100-SXM2-32GB machines in public repositories' notes (32768MiB, "
     "current drivers; no issue thread found)",
     Count(32768 * detail::mib), 0, 0, 150 * detail::giga, 6'250'000'000ULL, 8, 16 * detail::giga,
     "NVIDIA V100 datasheet: no BF16 or FP8 (FP16 tensor 125 TFLOPS, SXM2)",
     "NVIDIA V100 datasheet, as recalled (not read here): NVLink 300 GB/s both ways; DGX-1: 8 "
     "GPUs, 4 x 100 Gb/s EDR "
     "InfiniBand; host link: PCIe Gen3 x16 32 GB/s both ways",
     900 * detail::giga},
    {"mi250x", "AMD Instinct MI250X, one GCD of two (64GB): a PyTorch device",
     "assumed 64 GiB less 16 MiB, as the MI300X's rocm-smi total is 192 GiB less 16 MiB (no "
     "rocm-smi output of one seen)",
     Count(65520 * detail::mib), 191'500 * detail::giga, 0, 50 * detail::giga, 12'500'000'000ULL, 8,
     16 * detail::giga,
     "AMD Instinct MI250X datasheet, as recalled (not read here): peak BF16 383 TFLOPS a module "
     "(no sparsity), half of it a "
     "GCD; no FP8",
     "Frontier's node (OLCF): 4 MI250X, 8 GCDs; Infinity Fabric 200 GB/s each way to its twin "
     "GCD, 50 GB/s a link to the others (the slowest taken); 4 x 200 Gb/s Slingshot a node; host "
     "link: PCIe Gen4 x16 a module, shared by its two GCDs (MI250X datasheet)",
     1638 * detail::giga},
    {"mi325x", "AMD Instinct MI325X 256GB",
     "assumed 256 GiB less 16 MiB, as the MI300X's rocm-smi total is 192 GiB less 16 MiB (no "
     "rocm-smi output of one seen)",
     Count(262128 * detail::mib), 1'307'400 * detail::giga, 2'614'900 * detail::giga,
     448 * detail::giga, 50 * detail::giga, 8, 64 * detail::giga,
     "AMD Instinct MI325X datasheet, as recalled (not read here): peak BF16 1,307.4, FP8 2,614.9 "
     "TFLOPS dense (the MI300X's)",
     "AMD Instinct MI325X platform: 8 GPUs, 7 Infinity Fabric links of 128 GB/s both ways each; "
     "400 Gb/s NIC per GPU; host link: PCIe Gen5 x16, 128 GB/s both ways (MI325X datasheet)",
     6000 * detail::giga},
    {"b300", "NVIDIA B300 (SXM6 AC)",
     "nvidia-smi's total for 8 x B300 SXM6 AC in a public repository's TensorRT-LLM notes "
     "(275040MiB; no issue thread found)",
     Count(275040 * detail::mib), 2'250'000 * detail::giga, 4'500'000 * detail::giga,
     900 * detail::giga, 100 * detail::giga, 8, 64 * detail::giga,
     "NVIDIA HGX B300 specifications: BF16 36, FP8 72 PFLOPS with sparsity for 8 GPUs, a "
     "sixteenth of each dense (as NVIDIA/cosmos-framework PR #114 reads it)",
     "NVIDIA DGX B300, as recalled (not read here): 8 GPUs, NVLink 1.8 TB/s both ways per GPU, 8 x "
     "800 Gb/s ConnectX-8; host "
     "link: PCIe Gen5 x16, 128 GB/s both ways (its Xeon 6 hosts are Gen5)",
     8000 * detail::giga},
    {"rtx-5090", "NVIDIA GeForce RTX 5090 32GB",
     "nvidia-smi output in noonghunna/club-3090 issue #617 (32607MiB; #741 the same)",
     Count(32607 * detail::mib), 209'600 * detail::giga, 419'200 * detail::giga, 64 * detail::giga,
     0, 8, 64 * detail::giga,
     "NVIDIA RTX 5090 specifications: FP16 838.4, FP8 1,676.8 TFLOPS with sparsity and FP16 "
     "accumulate; a quarter of each: dense with FP32 accumulate, as the RTX 4090's",
     "PCIe Gen5 x16 64 GB/s each way, no NVLink; 8 a node is an assumption (workstations hold "
     "fewer); NIC: none; host link: PCIe Gen5 x16 (the same link)",
     1792 * detail::giga},
}};

/// The built-in GPU of that name, or nullptr.
inline const Gpu* find_gpu(std::string_view name) {
    for (const auto& g : gpus)
        if (g.name == name) return &g;
    return nullptr;
}

}  // namespace memcalc
