#pragma once
/// Memory a training process holds on its GPU beyond the model's tensors, as rows: the libraries'
/// workspaces the caching allocator hands out (PyTorch's cuBLAS workspace) and what lies outside
/// the allocator (the CUDA context with its loaded kernels, NCCL's communicators). Each row is
/// chosen by the GPU's CUDA major version, the PyTorch version and the layout, and says where its
/// figure comes from; an uncertain one has a low and a high end.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "memcalc/estimate.hpp"
#include "memcalc/text.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

struct DeviceRow {
    Text name;            ///< "cuda_context", "cublas_workspace", "nccl_dp"
    bool in_allocator;    ///< handed out by the caching allocator: part of the reserved figure
    std::uint64_t count;  ///< how many: one per stream, per communicator
    Count bytes, low_bytes, high_bytes;  ///< each one's
    Text why;                            ///< what it is
    Text source;                         ///< where the figure comes from
};

namespace outside_rows {

inline constexpr std::uint64_t MiB = 1ULL << 20;

/// A GPU's CUDA compute capability's major version (sm_80 is 8); 0 for ROCm devices.
struct CudaMajor {
    Text gpu;
    std::uint32_t major;
};
inline constexpr std::array<CudaMajor, 24> cuda_majors{{
    {"a100-40gb", 8}, {"a100-80gb", 8}, {"a800-80gb", 8}, {"a10", 8},       {"rtx-3090", 8},
    {"rtx-a6000", 8}, {"l40s", 8},      {"l40", 8},       {"l4", 8},        {"rtx-4090", 8},
    {"h100-sxm", 9},  {"h100-pcie", 9}, {"h800", 9},      {"h200", 9},      {"h20", 9},
    {"b200", 10},     {"b300", 10},     {"rtx-5090", 12}, {"v100-16gb", 7}, {"v100-32gb", 7},
    {"t4", 7},        {"mi300x", 0},    {"mi250x", 0},    {"mi325x", 0},
}};

/// The CUDA context and the kernels loaded into it, by major version (lazy module loading, the
/// default since CUDA 11.7 and PyTorch 2's wheels): what nvidia-smi shows beside an idle
/// process's reserved memory once a training step has run.
struct ContextRow {
    std::uint32_t first_major, last_major;
    Count bytes, low_bytes, high_bytes;
    Text source;
};
inline constexpr std::array<ContextRow, 3> contexts{{
    {0, 8, Count(500 * MiB), Count(300 * MiB), Count(600 * MiB),
     "users' nvidia-smi figures for an A100 process after its first step (see "
     "validation/published/outside.md)"},
    {9, 9, Count(550 * MiB), Count(450 * MiB), Count(800 * MiB),
     "users' nvidia-smi figures for an H100 process (see validation/published/outside.md)"},
    {10, 99, Count(700 * MiB), Count(500 * MiB), Count(1024 * MiB),
     "few published figures for Blackwell: the H100's, leaning high"},
}};

/// PyTorch's cuBLAS workspace: CUBLAS_WORKSPACE_CONFIG's default, one per (handle, stream) that
/// runs a matmul, from the caching allocator (CublasHandlePool.cpp's getChosenWorkspaceSize).
inline Count cublas_workspace(std::uint32_t major) {
    if (major >= 9) return Count(32 * MiB);         // ":4096:8" on Hopper and later
    return Count(4096 * 1024 * 2 + 16 * 1024 * 8);  // ":4096:2:16:8"
}

/// One NCCL communicator's buffers: NCCL_BUFFSIZE (4 MiB) for each channel and peer and
/// protocol, with NVLink SHARP's on Hopper and later where the group spans NVLink.
struct NcclRow {
    Count bytes, low_bytes, high_bytes;
    Text source;
};
inline constexpr NcclRow nccl{Count(512 * MiB), Count(256 * MiB), Count(1024 * MiB),
                              "users' per-communicator figures (see "
                              "validation/published/outside.md)"};

}  // namespace outside_rows

/// `gpu`'s CUDA major version; 0 where it is not known (a GPU of one's own, a ROCm device).
inline std::uint32_t cuda_major_of(std::string_view gpu) {
    for (const auto& row : outside_rows::cuda_majors)
        if (gpu == row.gpu) return row.major;
    return 0;
}

namespace detail {

/// The communicators a rank joins: one per group of more than one rank that runs collectives,
/// and a pipeline stage's two point-to-point ones (PyTorch makes a communicator per pair).
inline std::vector<std::pair<Text, std::uint64_t>> communicators(const Parallelism& p) {
    std::vector<std::pair<Text, std::uint64_t>> out;
    if (p.dp * p.cp > 1) out.push_back({"nccl_dp", 1});
    if (p.tp > 1) out.push_back({"nccl_tp", 1});
    if (p.cp > 1) out.push_back({"nccl_cp", 1});
    if (p.ep > 1) out.push_back({"nccl_ep", 1});
    if (p.pp > 1) out.push_back({"nccl_pp", 2});
    return out;
}

inline const outside_rows::ContextRow& context_row(std::uint32_t major) {
    for (const auto& row : outside_rows::contexts)
        if (major >= row.first_major && major <= row.last_major) return row;
    return outside_rows::contexts.back();
}

}  // namespace detail

/// The rows of one rank of `settings`' layout on a GPU of CUDA major `major` (0: unknown, where
/// each row takes its highest figure). None on the CPU platform, whose allocator is not CUDA's.
inline std::vector<DeviceRow> device_rows(const Settings& settings, std::uint32_t major,
                                          const RankReport&) {
    std::vector<DeviceRow> out;
    if (settings.framework.platform != Platform::cuda) return out;
    const bool known = major != 0;
    const Count cublas = outside_rows::cublas_workspace(known ? major : 99);
    out.push_back({"cublas_workspace", true, 1, cublas, cublas, cublas,
                   "cuBLAS's workspace for the compute stream's matmuls",
                   "pytorch aten/src/ATen/cuda/CublasHandlePool.cpp: getChosenWorkspaceSize"});
    const outside_rows::ContextRow& context =
        known ? detail::context_row(major) : outside_rows::contexts.back();
    out.push_back({"cuda_context", false, 1, context.bytes, context.low_bytes, context.high_bytes,
                   "the CUDA context and the kernels it loads", context.source});
    for (const auto& [name, count] : detail::communicators(settings.parallel)) {
        const outside_rows::NcclRow& n = outside_rows::nccl;
        out.push_back({name, false, count, n.bytes, n.low_bytes, n.high_bytes,
                       "an NCCL communicator's buffers", n.source});
    }
    return out;
}

}  // namespace memcalc
