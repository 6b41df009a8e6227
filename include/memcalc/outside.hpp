#pragma once
/// Memory a training process holds on its GPU beyond the model's tensors, as rows: the libraries'
/// workspaces the caching allocator hands out (PyTorch's cuBLAS and cuBLASLt workspaces) and what
/// lies outside the allocator (the CUDA context with its loaded kernels, NCCL's buffers). Each
/// row is chosen by the GPU's CUDA major version, the PyTorch version and the layout, and says
/// where its figure comes from (validation/published/outside.json has each source in full); an
/// uncertain one has a low and a high end.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "memcalc/estimate.hpp"
#include "memcalc/text.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

struct DeviceRow {
    Text name;            ///< "cuda_context", "cublas_workspace", "nccl_communicator"
    bool in_allocator;    ///< handed out by the caching allocator: part of the reserved figure
    std::uint64_t count;  ///< how many a rank holds: one per thread, per communicator, per peer
    Count bytes, low_bytes, high_bytes;  ///< each one's
    Text why;                            ///< what it is, and what it is counted per
    Text source;                         ///< where the figure comes from
};

namespace outside_rows {

inline constexpr std::uint64_t MiB = 1ULL << 20;

/// A GPU's CUDA compute capability's major version (sm_80 is 8; 0 for ROCm devices), and how many
/// GPUs its node joins by NVSwitch, which NCCL's NVLink SHARP (NVLS) needs: the 8 of an HGX board
/// (DGX and HGX A100, H100, H200, B200), 0 where there is none.
struct GpuFacts {
    Text gpu;
    std::uint32_t major;
    std::uint32_t nvswitch_gpus;
};
inline constexpr std::array<GpuFacts, 25> gpu_facts{{{"a100-40gb", 8, 8},
                                                     {"a100-80gb", 8, 8},
                                                     {"a800-80gb", 8, 8},
                                                     {"a10", 8, 0},
                                                     {"rtx-3090", 8, 0},
                                                     {"rtx-a6000", 8, 0},
                                                     {"l40s", 8, 0},
                                                     {"l40", 8, 0},
                                                     {"l4", 8, 0},
                                                     {"rtx-4090", 8, 0},
                                                     {"h100-sxm", 9, 8},
                                                     {"h100-pcie", 9, 0},
                                                     {"h800", 9, 8},
                                                     {"h200", 9, 8},
                                                     {"h20", 9, 8},
                                                     {"b200", 10, 8},
                                                     {"b300", 10, 8},
                                                     {"rtx-5090", 12, 0},
                                                     {"v100-16gb", 7, 0},
                                                     {"v100-32gb", 7, 0},
                                                     {"t4", 7, 0},
                                                     {"mi300x", 0, 0},
                                                     {"mi250x", 0, 0},
                                                     {"mi325x", 0, 0},
                                                     {"h100-hbm2e-500w", 9, 8}}};

/// What a row is counted per on a rank.
enum class Per : std::uint8_t {
    process,           ///< one
    matmul_thread,     ///< each thread running matmuls: the forward's and autograd's backward's
    collective_group,  ///< each process group of more than one rank that runs collectives
    p2p_peer,          ///< each peer a rank sends to directly (pipeline, ring, all-to-all)
    nvls_group,        ///< each group of more than two ranks, two or more on the rank's node
    graph_capture,     ///< one where the engine captures CUDA graphs
};

/// What the rank runs: a training step, or an inference engine serving requests.
enum class Job : std::uint8_t { training, serving };

/// The job as the rows count it.
struct JobFacts {
    Job job = Job::training;
    bool captures_graphs = false;  ///< an engine that captures CUDA graphs (vLLM's, SGLang's)
};

struct RowSpec {
    Text name;
    bool in_allocator;
    std::uint32_t first_major, last_major;  ///< the GPUs it applies to
    std::optional<TorchVersion> torch;      ///< the PyTorch version it applies to; none: any
    Per per;
    Count bytes, low_bytes, high_bytes;
    Text why, source;
    /// The GEMM library whose row it is; none: every program's.
    std::optional<GemmLibrary> gemm;
    std::optional<Job> job;  ///< the job whose row it is; none: every job's
    /// Its size is CUBLAS_WORKSPACE_CONFIG's where the program sets it
    /// (Framework::cublas_workspace).
    bool sized_by_config = false;
};

inline constexpr Count cublas_default = 4096 * 1024 * 2 + 16 * 1024 * 8;  // ":4096:2:16:8"
inline constexpr Text pool = "pytorch@26a39059 aten/src/ATen/cuda/CublasHandlePool.cpp";

inline constexpr Text te_gemm =
    "TransformerEngine@d0067d0 transformer_engine/pytorch/cpp_extensions/gemm.py:37-67 "
    "(get_cublas_workspace_size_bytes, torch.empty; one a device)";

inline constexpr std::array<RowSpec, 16> specs{{
    {"cuda_context", false, 0, 8, std::nullopt, Per::process, Count(400 * MiB), Count(266 * MiB),
     Count(600 * MiB), "the CUDA context and its lazily loaded kernels",
     "pytorch#86509, #109888, #107667; InvokeAI#9413; unsloth-zoo#1053 (sm80-89, lazy loading)",
     std::nullopt, std::nullopt},
    {"cuda_context", false, 9, 9, std::nullopt, Per::process, Count(600 * MiB), Count(514 * MiB),
     Count(1024 * MiB), "the CUDA context and its lazily loaded kernels",
     "two H100 out-of-memory messages (599, 601 MiB beside the allocator); vLLM, "
     "compressed-tensors#587",
     std::nullopt, std::nullopt},
    {"cuda_context", false, 10, 99, std::nullopt, Per::process, Count(712 * MiB), Count(600 * MiB),
     Count(1024 * MiB), "the CUDA context and its lazily loaded kernels",
     "one B200 out-of-memory message (712 MiB); the band is the H100's", std::nullopt,
     std::nullopt},
    {"cublas_workspace", true, 0, 8, std::nullopt, Per::matmul_thread, cublas_default,
     cublas_default, cublas_default, "cuBLAS's workspace, one per (handle, stream)", pool,
     std::nullopt, std::nullopt, true},
    {"cublas_workspace", true, 9, 9, std::nullopt, Per::matmul_thread, Count(32 * MiB),
     Count(32 * MiB), Count(32 * MiB), "cuBLAS's workspace, one per (handle, stream)", pool,
     std::nullopt, std::nullopt, true},
    {"cublas_workspace", true, 10, 99, std::nullopt, Per::matmul_thread, Count(32 * MiB),
     cublas_default, Count(32 * MiB), "cuBLAS's workspace, one per (handle, stream)",
     "newer CublasHandlePool.cpp: 32 MiB for majors 9-12; 26a39059: the default", std::nullopt,
     std::nullopt, true},
    {"cublaslt_workspace", true, 0, 99, std::nullopt, Per::matmul_thread, Count(1 * MiB), Count(0),
     Count(2 * MiB), "cuBLASLt's workspace, one per (handle, stream)", pool, std::nullopt,
     std::nullopt},
    {"nccl_communicator", false, 0, 99, std::nullopt, Per::collective_group, Count(512 * MiB),
     Count(192 * MiB), Count(1152 * MiB),
     "an NCCL communicator's buffers: channels x peers x 12 MiB",
     "nccl@5067397 src/init.cc, src/transport/p2p.cc; nccl#1685, #864, #1450", std::nullopt,
     std::nullopt},
    {"nccl_p2p", false, 0, 99, std::nullopt, Per::p2p_peer, Count(384 * MiB), Count(48 * MiB),
     Count(512 * MiB), "NCCL's point-to-point buffers to one peer: 32 channels x 12 MiB",
     "nccl@5067397 src/transport/p2p.cc; nccl#1685 (all-to-all on 8 H100s: +3.28 GB)", std::nullopt,
     std::nullopt},
    // Transformer Engine 2.10 and later: 32 MiB + 1 KiB on Hopper and later (2.0-2.9: 32 MiB), 4
    // MiB before; three with userbuffers' overlap, four for grouped GEMMs (the high end).
    {"te_cublas_workspace", true, 9, 99, std::nullopt, Per::process, Count(32 * MiB + 1024),
     Count(32 * MiB), Count(3 * (32 * MiB + 1024)), "Transformer Engine's cuBLAS workspace",
     te_gemm, GemmLibrary::transformer_engine, std::nullopt},
    {"te_cublas_workspace", true, 0, 8, std::nullopt, Per::process, Count(4 * MiB), Count(4 * MiB),
     Count(12 * MiB), "Transformer Engine's cuBLAS workspace", te_gemm,
     GemmLibrary::transformer_engine, std::nullopt},
    // torch 2.2's wheels pin NCCL 2.19: NVLS buffers of 4 MiB + 2 MiB per channel, peer and side.
    {"nccl_nvls", false, 9, 99, TorchVersion::v2_2, Per::nvls_group, Count(1536 * MiB), Count(0),
     Count(2304 * MiB), "NCCL's NVLink SHARP buffers (none with NCCL_NVLS_ENABLE=0)",
     "nccl@d97a32fa src/transport/nvls.cc; vllm#9699 (8 x H200: 2,415,919,104 B)", std::nullopt,
     std::nullopt},
    // torch 1.13's NCCL (2.14) has no NVLS; before Hopper there is none.
    {"nccl_nvls", false, 0, 0, TorchVersion::v1_13, Per::nvls_group, Count(0), Count(0), Count(0),
     "", "", std::nullopt, std::nullopt},
    // The driver keeps part of the memory nvidia-smi's total counts from every process
    // (nvidia-smi -q lists it as Reserved): what CUDA reports as its total is the rest.
    {"driver_reserved", false, 0, 8, std::nullopt, Per::process, Count(430 * MiB), Count(317 * MiB),
     Count(870 * MiB), "what the driver keeps of the memory (nvidia-smi's total less CUDA's)",
     "vLLM's printed CUDA totals: RTX 3090 23.58 GiB of 24,576 MiB (vllm#10517); out-of-memory "
     "messages: 23.67 GiB of a 24 GB card, 79.15 GiB of an 80 GB one",
     std::nullopt, std::nullopt},
    {"driver_reserved", false, 9, 99, std::nullopt, Per::process, Count(437 * MiB),
     Count(437 * MiB), Count(870 * MiB),
     "what the driver keeps of the memory (nvidia-smi's total less CUDA's)",
     "vLLM's printed CUDA total: H100 80GB 79.22 GiB of 81,559 MiB (vllm PR #12126); the high end "
     "is the largest seen before Hopper",
     std::nullopt, std::nullopt},
    // An engine's captured graphs keep their activations in a private pool of the allocator (the
    // out-of-memory message counts them); how much depends on the engine, its capture sizes and its
    // all-reduce buffers: the published figures are the band.
    {"cuda_graph_pool", true, 0, 99, std::nullopt, Per::graph_capture, Count(368 * MiB),
     Count(92 * MiB), Count(2458 * MiB),
     "the captured CUDA graphs' private pool (none with --enforce-eager)",
     "vLLM 0.27.1's estimate 0.36 GiB (gpustack/runner#251); 0.09 GiB measured (club-3090#1087, "
     "tp 2); 2.4 GiB a GPU (vllm#7553, 4 x RTX 4090, tp 4)",
     std::nullopt, Job::serving},
}};

}  // namespace outside_rows

/// `gpu`'s facts; none where it is not known (a GPU of one's own).
inline std::optional<outside_rows::GpuFacts> gpu_facts_of(std::string_view gpu) {
    for (const auto& row : outside_rows::gpu_facts)
        if (gpu == row.gpu) return row;
    return std::nullopt;
}

namespace detail {

/// Of each process group a rank of `p` runs collectives in (the gradients' dp x cp, tp, cp, ep),
/// its size and how many of its GPUs share the rank's node of `node` GPUs (0: one node holds
/// them all), ranks in the order tp, cp, dp, pp (Megatron-LM's; experts within dp).
inline std::array<std::pair<std::uint64_t, std::uint64_t>, 4> collective_groups(
    const Parallelism& p, std::uint64_t node) {
    const auto local = [&](std::uint64_t size, std::uint64_t stride) {
        if (node == 0) return size;
        return stride >= node ? std::uint64_t(1) : std::min(size, (node + stride - 1) / stride);
    };
    return {{{p.dp * p.cp, local(p.dp * p.cp, p.tp)},
             {p.tp, local(p.tp, 1)},
             {p.cp, local(p.cp, p.tp)},
             {p.ep, local(p.ep, p.tp * p.cp)}}};
}

/// How many of a row's things a rank of `p` holds (`nvswitch`: its node has one, of `node` GPUs; 0:
/// every group on the node). NCCL makes NVLS buffers for a communicator only where its GPUs on the
/// node pass a threshold (ncclNvlsInit returns when ncclTopoGetGpuCount is 2 or less in the 2.19 of
/// the row's torch, below 2 in later ones; ncclTopoGetSystem puts only the ranks of the rank's own
/// host in that topology: nccl src/transport/nvls.cc, src/graph/topo.cc): a data-parallel group of
/// one rank a node has none. A group of more than two with two on the node is counted (leaning high
/// over the versions).
inline std::uint64_t per_rank(outside_rows::Per per, const Parallelism& p, bool nvswitch,
                              std::uint64_t node, const outside_rows::JobFacts& job) {
    using outside_rows::Per;
    std::uint64_t collective = 0, nvls = 0;
    for (const auto& [size, on_node] : collective_groups(p, node))
        collective += size > 1, nvls += size > 2 && on_node >= 2;
    switch (per) {
        case Per::process: return 1;
        // Training runs matmuls on two threads, the forward's and autograd's; an engine on one.
        case Per::matmul_thread: return job.job == outside_rows::Job::training ? 2 : 1;
        case Per::collective_group: return collective;
        case Per::p2p_peer: return (p.pp > 1 ? 2 : 0) + (p.cp > 1 ? 2 : 0) + (p.ep - 1);
        case Per::nvls_group: return nvswitch ? nvls : 0;
        case Per::graph_capture: return job.captures_graphs ? 1 : 0;
    }
    return 0;
}

/// Whether specs[i] is the row for CUDA major `major`, framework `f` and `job`. Unknown major (0):
/// of each name, the row with the highest figures (the first of equals).
inline bool applies(std::size_t i, std::uint32_t major, const Framework& f, outside_rows::Job job) {
    const auto& specs = outside_rows::specs;
    const auto fits_program = [&](const outside_rows::RowSpec& s) {
        return (!s.torch || *s.torch == f.torch) && (!s.gemm || *s.gemm == f.gemm) &&
               (!s.job || *s.job == job);
    };
    if (!fits_program(specs[i])) return false;
    if (major != 0) return major >= specs[i].first_major && major <= specs[i].last_major;
    const auto rank = [](const outside_rows::RowSpec& s) {
        return std::pair(s.high_bytes.value(), s.bytes.value());
    };
    for (std::size_t j = 0; j < specs.size(); ++j) {
        if (j == i || specs[j].name != specs[i].name || !fits_program(specs[j])) continue;
        if (rank(specs[j]) > rank(specs[i]) || (rank(specs[j]) == rank(specs[i]) && j < i))
            return false;
    }
    return true;
}

}  // namespace detail

/// Each row of a rank of layout `p` running `job` under `framework` on `gpu` (none: not known,
/// where each row takes its highest figures and an NVSwitch is assumed), as (spec, count): none on
/// the CPU platform. Allocates nothing: the planner sums them for every layout.
template <class Visit>
void for_each_device_row(const Framework& framework, const Parallelism& p,
                         const std::optional<outside_rows::GpuFacts>& gpu,
                         const outside_rows::JobFacts& job, Visit&& visit) {
    if (framework.platform != Platform::cuda) return;
    const std::uint32_t major = gpu ? gpu->major : 0;
    // An unknown GPU: an NVSwitch assumed, with every group on its node (the most NVLS buffers).
    const bool nvswitch = gpu ? gpu->nvswitch_gpus > 0 : true;
    const std::uint64_t node = gpu ? gpu->nvswitch_gpus : 0;
    for (std::size_t i = 0; i < outside_rows::specs.size(); ++i) {
        const outside_rows::RowSpec& spec = outside_rows::specs[i];
        if (!detail::applies(i, major, framework, job.job)) continue;
        const std::uint64_t count = detail::per_rank(spec.per, p, nvswitch, node, job);
        outside_rows::RowSpec row = spec;
        if (spec.sized_by_config && framework.cublas_workspace) {
            row.bytes = row.low_bytes = row.high_bytes = Count(*framework.cublas_workspace);
            row.why =
                "cuBLAS's workspace, one per (handle, stream), as CUBLAS_WORKSPACE_CONFIG "
                "sizes it";
        }
        if (count > 0 && row.high_bytes > Count(0)) visit(row, count);
    }
}

/// The rows of one rank of layout `p` running `job` on `gpu`, those inside the allocator first.
inline std::vector<DeviceRow> device_rows(const Framework& framework, const Parallelism& p,
                                          const std::optional<outside_rows::GpuFacts>& gpu,
                                          const outside_rows::JobFacts& job = {}) {
    std::vector<DeviceRow> out;
    for_each_device_row(framework, p, gpu, job,
                        [&](const outside_rows::RowSpec& spec, std::uint64_t count) {
                            out.push_back({spec.name, spec.in_allocator, count, spec.bytes,
                                           spec.low_bytes, spec.high_bytes, spec.why, spec.source});
                        });
    std::stable_partition(out.begin(), out.end(),
                          [](const DeviceRow& r) { return r.in_allocator; });
    return out;
}

/// The rows of a training rank of `settings`' layout.
inline std::vector<DeviceRow> device_rows(const Settings& settings,
                                          const std::optional<outside_rows::GpuFacts>& gpu) {
    return device_rows(settings.framework, settings.parallel, gpu);
}

/// The rows' high ends together for a training rank: what a device holds beside the model's tensors
/// at most, before the allocator's rounding and fragmentation.
inline Count device_rows_high(const Framework& framework, const Parallelism& p,
                              const std::optional<outside_rows::GpuFacts>& gpu) {
    Count sum;
    for_each_device_row(framework, p, gpu, {},
                        [&](const outside_rows::RowSpec& spec, std::uint64_t count) {
                            sum += Count(count) * spec.high_bytes;
                        });
    return sum;
}

}  // namespace memcalc
