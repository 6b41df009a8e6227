#pragma once
/// A training step's time on a GPU, estimated, not simulated: the step's FLOPs at an assumed share
/// of the GPU's peak, the pipeline's idle time, every byte a device sends at the bandwidth of the
/// group it sends to, what offload moves to and from host memory at the host link's, and the host's
/// optimiser step at an assumed host memory bandwidth, none of it overlapped with compute.
#include <cstdint>
#include <limits>
#include <optional>

#include "memcalc/hardware.hpp"
#include "memcalc/parallel.hpp"

namespace memcalc {

/// The share of the peak bf16 FLOP/s a training step's matrix products reach (model-FLOPs
/// utilisation): large dense runs report 0.38-0.43 (Llama 3 405B on H100: 38-43%), so 0.4.
inline constexpr double assumed_model_flops_utilization = 0.4;

/// The host memory bandwidth, per GPU, at which a CPU optimiser step (DeepSpeed's CPUAdam under
/// ZeRO-Offload) reads and writes its state. DeepSpeed PR #7474 measured a whole step of 2.38 s for
/// Qwen2.5-3B on 2 A100s (ZeRO-Offload, 128 host cores bound to the ranks), in which each rank's
/// CPUAdam moves about 46 GB (30 bytes for each of 1.5 B parameters): at least 19 GB/s. 20 GB/s,
/// leaning slow.
inline constexpr double assumed_host_optimizer_bandwidth = 20e9;

/// Bytes one device sends in a step, by the group it sends to.
struct Traffic {
    double data_parallel = 0;     ///< gradient all-reduce (ZeRO-3: also its weight gathers)
    double tensor_parallel = 0;   ///< the layers' all-reduces
    double pipeline = 0;          ///< activations and their gradients between stages
    double context_parallel = 0;  ///< the key/value ring
    double offload = 0;           ///< to and from host memory (ZeRO-Offload), over the host link
    /// Not sent: what the host's optimiser step reads and writes in host memory (ZeRO-Offload's
    /// CPUAdam).
    double host_optimizer = 0;
    double total() const {
        return data_parallel + tensor_parallel + pipeline + context_parallel + offload;
    }
};

/// Seconds of one step, by cause.
struct StepTime {
    double compute = 0;  ///< the step's FLOPs / (devices x peak bf16 x assumed utilisation)
    double bubble = 0;  ///< the schedule's idle time (bubble_share of the compute; 1F1B: (pp - 1) /
                        ///< micro-batches)
    double communication = 0;  ///< every group's bytes at its bandwidth, not overlapped
    double offload = 0;        ///< the host transfers at the host link's bandwidth, not overlapped
    double host_optimizer =
        0;  ///< the host's optimiser step at assumed_host_optimizer_bandwidth, not overlapped
    double seconds() const { return compute + bubble + communication + offload + host_optimizer; }
};

/// Bytes per second within a group of `size` ranks `stride` apart: inside a node when the group's
/// span fits in one (Megatron-LM's rank order: tp, then cp, then dp, then pp), else across nodes.
/// None when the GPU lacks the figure; infinite for a group of one, which sends nothing.
inline std::optional<double> group_bandwidth(const Gpu& gpu, std::uint64_t stride,
                                             std::uint64_t size) {
    if (size <= 1) return std::numeric_limits<double>::infinity();
    if (gpu.gpus_per_node == 0) return std::nullopt;
    const std::uint64_t bandwidth =
        stride * size <= gpu.gpus_per_node ? gpu.intra_node_bandwidth : gpu.inter_node_bandwidth;
    if (bandwidth == 0) return std::nullopt;
    return static_cast<double>(bandwidth);
}

/// The time of a step of `flops` (every device's, recomputation included) on `p.devices()` GPUs, or
/// none when the GPU lacks a figure the layout needs (its bf16 peak, a bandwidth, its node size,
/// its host link where offload moves bytes). `forward_share`: the forward's part of the FLOPs,
/// which sets the schedule's F, B and W (its weight-gradient pass as many FLOPs as the forward).
inline std::optional<StepTime> step_time(const Gpu& gpu, const Parallelism& p, double flops,
                                         const Traffic& bytes, double forward_share = 1.0 / 3) {
    if (gpu.peak_bf16_flops == 0) return std::nullopt;
    StepTime t;
    const double devices = static_cast<double>(p.devices());
    t.compute = flops / (devices * static_cast<double>(gpu.peak_bf16_flops) *
                         assumed_model_flops_utilization);
    t.bubble = t.compute * bubble_share(p, forward_share);
    const auto tp = group_bandwidth(gpu, 1, p.tp), cp = group_bandwidth(gpu, p.tp, p.cp),
               dp = group_bandwidth(gpu, p.tp * p.cp, p.dp),
               pp = group_bandwidth(gpu, p.tp * p.cp * p.dp, p.pp);
    if (!tp || !cp || !dp || !pp) return std::nullopt;
    t.communication = bytes.tensor_parallel / *tp + bytes.context_parallel / *cp +
                      bytes.data_parallel / *dp + bytes.pipeline / *pp;
    if (bytes.offload > 0) {
        if (gpu.host_bandwidth == 0) return std::nullopt;
        t.offload = bytes.offload / static_cast<double>(gpu.host_bandwidth);
    }
    t.host_optimizer = bytes.host_optimizer / assumed_host_optimizer_bandwidth;
    return t;
}

}  // namespace memcalc
