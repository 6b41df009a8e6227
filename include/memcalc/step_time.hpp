#pragma once
/// A training step's time on a GPU, estimated from what its work is made of, not simulated: matrix
/// products at the GPU's GEMM efficiency of its bf16 rate (an fp8 recipe's linears: of its fp8
/// rate, their casts element-wise work) or its memory bandwidth, where reading the weights takes
/// longer (the roofline); the attention kernel at its own; element-wise work at the memory
/// bandwidth; all at the pace of the busiest pipeline stage. Every group's messages at its
/// bandwidth and latency, hidden where the frameworks overlap them (the context-parallel ring under
/// its attention, data-parallel messages layer by layer beside the forward or backward they serve,
/// collective matmuls' pieces under the products they feed, DualPipe's all-to-alls under its other
/// chunk); the pipeline's bubble over a micro-batch's whole
/// time; offload and the host's optimiser step not overlapped. Every rate is a row of the GPU
/// (hardware.hpp), which a GPU file may override.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>

#include "memcalc/hardware.hpp"
#include "memcalc/parallel.hpp"

namespace memcalc {

/// The host memory bandwidth, per GPU, at which a CPU optimiser step (DeepSpeed's CPUAdam under
/// ZeRO-Offload) reads and writes its state. DeepSpeed PR #7474 measured a whole step of 2.38 s for
/// Qwen2.5-3B on 2 A100s (ZeRO-Offload, 128 host cores bound to the ranks), in which each rank's
/// CPUAdam moves about 46 GB (30 bytes for each of 1.5 B parameters): at least 19 GB/s. 20 GB/s,
/// leaning slow.
inline constexpr double assumed_host_optimizer_bandwidth = 20e9;

/// Bytes element-wise work moves for each byte of activations a layer keeps (norms, activation
/// functions, residual adds, rotary, dropout): written once by the forward, read once by the
/// backward, whose gradient of it is written and read once more. An assumption.
inline constexpr double elementwise_passes = 4;

/// Data-parallel bytes (over dp x cp) by the compute they run beside: every micro-batch's forward
/// (ZeRO-3's weight gathers), every micro-batch's backward (ZeRO-3's gathers and ZeRO-2/3's
/// gradient reduce-scatters), the last micro-batch's backward alone (the gradients' all-reduce, or
/// ZeRO-1's reduce-scatter, once a step) and the first micro-batch's forward (ZeRO-1/2's gather of
/// the weights the step updated); and beside none (--dp-overlap none, ZeRO-3 without prefetch).
struct DataParallelBytes {
    double every_forward = 0, every_backward = 0, last_backward = 0, first_forward = 0;
    double exposed = 0;
    /// How many messages each window's bytes go in, one after another, each beside one layer's
    /// compute (the stage's layers).
    double pieces = 1;
    double total() const {
        return every_forward + every_backward + last_backward + first_forward + exposed;
    }
};

/// Seconds of `comm` in `pieces` messages, each sent beside one of as many equal slices of
/// `window` (after the slice that makes it, or before the one that needs it), that no slice hides:
/// the first message or the last (no compute beside it), or what the messages take past the
/// compute, whichever is more (a producer and a consumer in a two-stage pipeline).
inline double exposed_beside(double comm, double window, double pieces) {
    if (comm <= 0) return 0;
    return std::max(comm / pieces, comm - window * (pieces - 1) / pieces);
}

/// Bytes one device sends in a step, by the group it sends to, and the messages they go in.
struct Traffic {
    DataParallelBytes data_parallel;  ///< gradient reduction and ZeRO's weight gathers
    double tensor_parallel = 0;       ///< the layers' all-reduces
    double pipeline = 0;              ///< activations and their gradients between stages
    double context_parallel = 0;      ///< the key/value ring
    double expert_parallel = 0;       ///< the MoE layers' token all-to-alls
    double offload = 0;  ///< to and from host memory (ZeRO-Offload), over the host link
    /// Not sent: what the host's optimiser step reads and writes in host memory (ZeRO-Offload's
    /// CPUAdam).
    double host_optimizer = 0;
    /// Not sent: what the device's optimiser step reads and writes in its own memory.
    double device_optimizer = 0;
    /// Messages each group's bytes go in, each paying the link's latency: collectives, ring steps,
    /// sends.
    double tensor_parallel_messages = 0, pipeline_messages = 0, context_parallel_messages = 0,
           expert_parallel_messages = 0;
    /// Pieces each tensor-parallel collective runs in beside the matrix product it feeds
    /// (TpOverlap::matmul: tp); 1: before or after it, exposed. Half of them feed the attention's
    /// projections, `projection_share` of the step's matrix products; half the MLP's, the rest.
    double tensor_parallel_pieces = 1, projection_share = 0.5;
    double total() const {
        return data_parallel.total() + tensor_parallel + pipeline + context_parallel +
               expert_parallel + offload;
    }
};

/// What one device computes in a step, by the kind of kernel that runs it.
struct DeviceWork {
    double flops = 0;            ///< the step's FLOPs on every device, recomputation included
    double attention_flops = 0;  ///< of which the attention core's (Q K^T, weights . V), as counted
    /// Of those, the matrix products an fp8 recipe runs in its narrow format: the layers' linears.
    double narrow_flops = 0;
    /// Of those counted, the share the kernel computes: a fused kernel skips a causal mask's masked
    /// half (0.5); eager attention computes every score (1).
    double attention_computed = 1;
    /// The attention core's share of the bf16 peak (attention_kernels.hpp); 0: the GPU's own.
    double attention_efficiency = 0;
    double weight_reads = 0;         ///< bytes of weights one device's matrix products read a step
    double elementwise_bytes = 0;    ///< bytes one device's element-wise work moves a step
    double forward_share = 1.0 / 3;  ///< of a chunk's time, its forward (the schedule's F)
    /// The busiest pipeline rank's work over the mean rank's: every micro-batch waits on it.
    double slowest_stage_share = 1;
    /// The optimiser step's own matrix products on this device (Muon's Newton-Schulz), once a
    /// step after the last backward, at the GEMM efficiency.
    double optimizer_flops = 0;
    /// Kernels this device launches a step (launches.hpp): its matrix products, its other ops
    /// (attention, element-wise), its optimiser step's. The host dispatches them one by one.
    double matmul_launches = 0, other_launches = 0, optimizer_launches = 0;
};

/// Seconds of one step, by cause.
struct StepTime {
    double compute = 0;  ///< matrix products, attention and element-wise work, every micro-batch
    double bubble = 0;   ///< the schedule's idle time (bubble_share of a micro-batch's whole time)
    /// What the messages cost: what no computation hides, every group's, and the compute those
    /// that hide take from it (their kernels hold collective_sm_share of the GPU while they run).
    double communication = 0;
    double offload = 0;  ///< the host transfers at the host link's bandwidth, not overlapped
    double host_optimizer =
        0;  ///< the host's optimiser step at assumed_host_optimizer_bandwidth, not overlapped
    /// The device's optimiser step, after the last backward: its bytes at the memory's bandwidth
    /// (none without one), its matrix products at the GEMM efficiency.
    double optimizer = 0;
    /// What the host's dispatch of each kernel adds where it takes longer than the kernels it
    /// launches (launch_bound): the matrix products', the other ops' and the optimiser's.
    double dispatch = 0;
    double seconds() const {
        return compute + bubble + communication + offload + host_optimizer + optimizer + dispatch;
    }
};

/// A link's rates: bytes per second and seconds per message.
struct Link {
    double bandwidth = std::numeric_limits<double>::infinity(), latency = 0;
    double seconds(double bytes, double messages) const {
        return bytes / bandwidth + messages * latency;
    }
};

/// The link within a group of `size` ranks `stride` apart: inside a node when the group's span fits
/// in one (Megatron-LM's rank order: tp, then cp, then dp, then pp), else across nodes. None when
/// the GPU lacks the figure; free for a group of one, which sends nothing.
inline std::optional<Link> group_link(const Gpu& gpu, std::uint64_t stride, std::uint64_t size) {
    if (size <= 1) return Link{};
    if (gpu.gpus_per_node == 0) return std::nullopt;
    const bool inside = stride * size <= gpu.gpus_per_node;
    const std::uint64_t bandwidth = inside ? gpu.intra_node_bandwidth : gpu.inter_node_bandwidth;
    if (bandwidth == 0) return std::nullopt;
    return Link{static_cast<double>(bandwidth),
                inside ? gpu.intra_node_latency : gpu.inter_node_latency};
}

/// Bytes per second within such a group (group_link's), none where a figure is missing.
inline std::optional<double> group_bandwidth(const Gpu& gpu, std::uint64_t stride,
                                             std::uint64_t size) {
    const auto link = group_link(gpu, stride, size);
    return link ? std::optional<double>(link->bandwidth) : std::nullopt;
}

/// Seconds one device computes in a step, by kind of kernel.
struct ComputeSeconds {
    double matmuls = 0;      ///< at the GEMM efficiency, or the memory's rate if reading is slower
    double attention = 0;    ///< at the attention kernel's efficiency
    double elementwise = 0;  ///< at the memory's rate (none without a memory bandwidth)
    /// The host's dispatch past the kernels it launches (launch_bound), none on a busy device.
    double dispatch = 0;
    double total() const { return matmuls + attention + elementwise + dispatch; }
};

/// Seconds the host's dispatch of `launches` kernels adds to `seconds` of them on the device: the
/// host launches one every `launch_seconds` while the device runs the one before, so each costs
/// the longer of the two; kernels of one kind taken as alike (their time shared evenly).
inline double launch_bound(double launches, double seconds, double launch_seconds) {
    return std::max(0.0, launches * launch_seconds - seconds);
}

inline ComputeSeconds compute_seconds(const Gpu& gpu, const Parallelism& p,
                                      const DeviceWork& work) {
    const double peak = static_cast<double>(gpu.peak_bf16_flops);
    // The busiest pipeline rank sets the pace: the mean device's work, scaled up to its.
    const double devices = static_cast<double>(p.devices()) / work.slowest_stage_share;
    const double memory = gpu.memory_bandwidth == 0 ? std::numeric_limits<double>::infinity()
                                                    : static_cast<double>(gpu.memory_bandwidth);
    const double gemm = (work.flops - work.attention_flops - work.narrow_flops) / devices;
    // A narrow format at the GPU's fp8 rate, where it has one (else the bf16 rate: leaning slow).
    const double narrow_peak =
        gpu.peak_fp8_flops > 0 ? static_cast<double>(gpu.peak_fp8_flops) : peak;
    ComputeSeconds s;
    s.matmuls = std::max(gemm / (peak * gpu.gemm_efficiency) +
                             work.narrow_flops / devices / (narrow_peak * gpu.gemm_efficiency),
                         work.weight_reads / memory);
    const double attention =
        work.attention_efficiency > 0 ? work.attention_efficiency : gpu.attention_efficiency;
    s.attention = work.attention_flops * work.attention_computed / devices / (peak * attention);
    s.elementwise = work.elementwise_bytes / memory;
    s.dispatch = launch_bound(work.matmul_launches, s.matmuls, gpu.launch_seconds) +
                 launch_bound(work.other_launches, s.attention + s.elementwise, gpu.launch_seconds);
    return s;
}

/// The links of a layout's groups: tp, cp, dp (with cp: the dp x cp ranks gradients reduce over),
/// pp and ep (ep's ranks expert_tp apart), none where a figure is missing.
struct GroupLinks {
    Link tp, cp, dp, pp, ep;
};

inline std::optional<GroupLinks> group_links(const Gpu& gpu, const Parallelism& p) {
    const auto tp = group_link(gpu, 1, p.tp), cp = group_link(gpu, p.tp, p.cp),
               dp = group_link(gpu, p.tp, p.dp * p.cp),
               pp = group_link(gpu, p.tp * p.cp * p.dp, p.pp),
               ep = group_link(gpu, p.expert_tp(), p.ep);
    if (!tp || !cp || !dp || !pp || !ep) return std::nullopt;
    return GroupLinks{*tp, *cp, *dp, *pp, *ep};
}

/// Seconds of messages: those nothing hides, and those that run beside compute.
struct MessageSeconds {
    double exposed = 0, hidden = 0;
};

/// The layers' messages: exposed, tensor-parallel collectives (past the matrix products they run
/// beside, where they run in pieces: half beside the attention's projections, half the MLP's),
/// pipeline sends, expert all-to-alls (unless the schedule
/// overlaps them) and the context-parallel ring past the attention it hides under; hidden, the
/// rest of the ring, of the collectives and the overlapped all-to-alls.
inline MessageSeconds layer_messages(const GroupLinks& links, const Parallelism& p,
                                     const Traffic& bytes, const ComputeSeconds& compute) {
    const double ring = links.cp.seconds(bytes.context_parallel, bytes.context_parallel_messages);
    const double all_to_all =
        links.ep.seconds(bytes.expert_parallel, bytes.expert_parallel_messages);
    const double collectives =
        links.tp.seconds(bytes.tensor_parallel, bytes.tensor_parallel_messages);
    const double pieces = bytes.tensor_parallel_pieces, attention_side = bytes.projection_share;
    const double collectives_exposed =
        pieces > 1
            ? exposed_beside(collectives / 2, compute.matmuls * attention_side, pieces) +
                  exposed_beside(collectives / 2, compute.matmuls * (1 - attention_side), pieces)
            : collectives;
    const bool overlapped = schedule_row(p).overlaps_all_to_all;
    MessageSeconds s;
    s.exposed = collectives_exposed + links.pp.seconds(bytes.pipeline, bytes.pipeline_messages) +
                (overlapped ? 0 : all_to_all) + std::max(0.0, ring - compute.attention);
    s.hidden = std::min(ring, compute.attention) + (overlapped ? all_to_all : 0) +
               (collectives - collectives_exposed);
    return s;
}

/// Seconds of data-parallel messages on `link` that no compute hides, in a step of `compute`
/// seconds over `microbatches`, `forward_share` of each in its forward: each window's
/// (DataParallelBytes) past the compute it runs beside.
inline double exposed_data_parallel(const Link& link, const DataParallelBytes& b, double compute,
                                    double forward_share, std::uint64_t microbatches) {
    const double forward = compute * forward_share, backward = compute - forward;
    const double M = static_cast<double>(microbatches);
    const auto exposed = [&](double bytes, double window) {
        return exposed_beside(link.seconds(bytes, 0), window, b.pieces);
    };
    return exposed(b.every_forward, forward) + exposed(b.every_backward, backward) +
           exposed(b.last_backward, backward / M) + exposed(b.first_forward, forward / M) +
           link.seconds(b.exposed, 0);
}

/// The least a step of `flops` (no bytes moved in memory) with the layers' messages of `bytes`
/// takes under any recomputation that adds FLOPs to it, its bubble at least `idle` of its time:
/// its compute and the messages its attention leaves exposed (which together only grow with the
/// attention), idle for that share, and the compute the hidden ones take (which grows with it). No
/// data-parallel messages, no offload. A billionth low, so that rounding never lifts it above a
/// time it equals. None where step_time has none.
inline std::optional<double> step_time_floor(const Gpu& gpu, const Parallelism& p,
                                             const DeviceWork& flops, const Traffic& bytes,
                                             double idle) {
    if (gpu.peak_bf16_flops == 0) return std::nullopt;
    const auto links = group_links(gpu, p);
    if (!links) return std::nullopt;
    const ComputeSeconds compute = compute_seconds(gpu, p, flops);
    const MessageSeconds messages = layer_messages(*links, p, bytes, compute);
    const double busy = compute.total() + messages.exposed;
    return (busy + busy * idle + messages.hidden * gpu.collective_sm_share) * (1 - 1e-9);
}

/// The time of a step of `work` on `p.devices()` GPUs, or none when the GPU lacks a figure the
/// layout needs (its bf16 peak, a bandwidth, its node size, its host link where offload moves
/// bytes). Tensor-parallel collectives (unless collective matmuls hide them) and pipeline sends
/// sit on the critical path; the
/// context-parallel ring hides under the attention it feeds; data-parallel messages beside the
/// compute they serve (exposed_data_parallel); a schedule that overlaps all-to-alls (DualPipe)
/// hides them. What hides still takes collective_sm_share of the compute it runs beside.
inline std::optional<StepTime> step_time(const Gpu& gpu, const Parallelism& p,
                                         const DeviceWork& work, const Traffic& bytes) {
    if (gpu.peak_bf16_flops == 0) return std::nullopt;
    const auto links = group_links(gpu, p);
    if (!links) return std::nullopt;
    StepTime t;
    const ComputeSeconds compute = compute_seconds(gpu, p, work);
    t.compute = compute.total() - compute.dispatch;
    t.dispatch = compute.dispatch;
    const MessageSeconds layers = layer_messages(*links, p, bytes, compute);
    t.bubble = (compute.total() + layers.exposed) * bubble_share(p, work.forward_share);
    const double data_parallel = links->dp.seconds(bytes.data_parallel.total(), 0);
    const double data_parallel_exposed = exposed_data_parallel(
        links->dp, bytes.data_parallel, compute.total(), work.forward_share, p.steps_per_batch());
    const double hidden = layers.hidden + std::max(0.0, data_parallel - data_parallel_exposed);
    t.communication = layers.exposed + data_parallel_exposed + hidden * gpu.collective_sm_share;
    if (bytes.offload > 0) {
        if (gpu.host_bandwidth == 0) return std::nullopt;
        t.offload = bytes.offload / static_cast<double>(gpu.host_bandwidth);
    }
    t.host_optimizer = bytes.host_optimizer / assumed_host_optimizer_bandwidth;
    if (gpu.memory_bandwidth > 0)
        t.optimizer = bytes.device_optimizer / static_cast<double>(gpu.memory_bandwidth);
    t.optimizer +=
        work.optimizer_flops / (static_cast<double>(gpu.peak_bf16_flops) * gpu.gemm_efficiency);
    t.dispatch += launch_bound(work.optimizer_launches, t.optimizer, gpu.launch_seconds);
    return t;
}

/// A step of `flops` of matrix products alone (no attention, no memory-bound work), `forward_share`
/// of each chunk's time in its forward: the time's shorthand where only FLOPs are known.
inline std::optional<StepTime> step_time(const Gpu& gpu, const Parallelism& p, double flops,
                                         const Traffic& bytes, double forward_share = 1.0 / 3) {
    DeviceWork work;
    work.flops = flops, work.forward_share = forward_share;
    return step_time(gpu, p, work, bytes);
}

}  // namespace memcalc
