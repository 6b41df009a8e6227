#include <catch2/catch.hpp>
#include <cstdint>
#include <unordered_map>
#include <string>
#include <vector>

#include "fixtures.hpp"
#include "memcalc/device_memory.hpp"
#include "memcalc/fit.hpp"
#include "memcalc/plan.hpp"

// The allocation sequence must hold, at each step's moment, exactly what the timeline counts
// there; the simulated allocator then reserves at least what it allocates.

namespace reserved_tests {

using namespace memcalc;

struct Case {
    std::string name;
    Architecture model;
    Settings settings;
};

Settings with(std::uint64_t seq, Recompute recompute) {
    Settings s;
    s.seq = seq, s.recompute = recompute;
    return s;
}

std::vector<Case> cases() {
    std::vector<Case> out{
        {"llama-7b s=4096 selective", fixtures::llama_7b(), with(4096, Recompute::selective)},
        {"llama-7b s=2048 none", fixtures::llama_7b(), with(2048, Recompute::none)},
        {"gpt2 s=1024 full", fixtures::gpt2_small(), with(1024, Recompute::full)},
        {"mixtral s=1024 selective", fixtures::mixtral(), with(1024, Recompute::selective)},
        {"dense-then-moe s=512 none", fixtures::dense_then_moe(), with(512, Recompute::none)},
    };
    Case accumulated{"gpt2 4 micro-batches", fixtures::gpt2_small(), with(512, Recompute::none)};
    accumulated.settings.parallel.microbatches = 4;
    out.push_back(accumulated);
    Case staged{"mistral pp=4 zero-1", fixtures::mistral_7b(), with(2048, Recompute::selective)};
    staged.settings.parallel.pp = 4, staged.settings.parallel.dp = 2;
    staged.settings.parallel.zero = 1, staged.settings.parallel.microbatches = 8;
    out.push_back(staged);
    Case sharded{"llama-7b zero-3 dp=8", fixtures::llama_7b(), with(4096, Recompute::full)};
    sharded.settings.parallel.dp = 8, sharded.settings.parallel.zero = 3;
    out.push_back(sharded);
    return out;
}

/// The requested bytes live after the last event leading to each step's moment.
std::vector<std::uint64_t> live_at_moments(const AllocationSequence& seq) {
    std::vector<std::uint64_t> out(seq.steps.size(), 0);
    std::unordered_map<std::uint64_t, std::uint64_t> live;
    std::uint64_t sum = 0;
    for (std::size_t i = 0; i < seq.events.size(); ++i) {
        const AllocatorEvent& e = seq.events[i];
        if (e.kind == AllocatorEventKind::alloc) {
            REQUIRE(live.emplace(e.id, e.bytes).second);
            sum += e.bytes;
        } else {
            REQUIRE(live.count(e.id) == 1);
            sum -= live[e.id];
            live.erase(e.id);
        }
        out[seq.step_of_event[i]] = sum;
    }
    return out;
}

TEST_CASE("each step's moment of the allocation sequence holds what the timeline counts",
          "[reserved]") {
    for (const Case& c : cases()) {
        SECTION(c.name) {
            const Report r = estimate(c.model, c.settings);
            for (const RankReport& rank : r.ranks) {
                const AllocationSequence seq = allocation_sequence(
                    rank.timeline(), step_pieces(r, rank), c.settings.parallel.steps_per_batch());
                const std::vector<std::uint64_t> live = live_at_moments(seq);
                REQUIRE(live.size() == seq.steps.size());
                std::uint64_t most = 0;
                for (std::size_t k = 0; k < live.size(); ++k) {
                    INFO(seq.steps[k].name());
                    CHECK(live[k] == seq.steps[k].bytes.total().value());
                    most = std::max(most, live[k]);
                }
                CHECK(most == rank.peak_step().bytes.total().value());
            }
        }
    }
}

TEST_CASE(
    "a lazy optimiser's moments appear at the first optimizer step, and take its freed blocks",
    "[reserved]") {
    for (const Case& c : cases()) {
        SECTION(c.name) {
            const Report r = estimate(c.model, c.settings);
            const RankReport& rank = r.busiest();
            const std::uint64_t m = c.settings.parallel.steps_per_batch();
            const std::vector<Step> lazy =
                replayed_training_steps(rank.timeline(), m, OptimizerState::lazy);
            const std::vector<Step> eager =
                replayed_training_steps(rank.timeline(), m, OptimizerState::eager);
            REQUIRE(lazy.size() == eager.size());
            bool stepped = false;
            for (std::size_t k = 0; k < lazy.size(); ++k) {
                INFO(lazy[k].name());
                stepped = stepped || lazy[k].phase == Phase::optimizer;
                CHECK(lazy[k].bytes.optimizer_state ==
                      (stepped ? eager[k].bytes.optimizer_state : Count(0)));
                // Nothing else moves.
                CHECK(lazy[k].bytes.total() +
                          (stepped ? Count(0) : eager[k].bytes.optimizer_state) ==
                      eager[k].bytes.total());
            }
            CHECK(stepped);
        }
    }
    // Measured on an H200 (validation/results/gpu-recipes.json): torch's AdamW, made lazily, put
    // GPT-2's moments in the first step's freed logits blocks, and the second step's logits took
    // new segments (2.94 GB reserved, where making them first would keep 2.38).
    Settings s = with(1024, Recompute::full);  // the fixture's positions; the GPU's were 4,096
    s.recipe = builtin_recipe("bf16-adam");
    s.framework.attention = Attention::flash;
    s.activations = ActivationModel::architecture;
    Settings eager = s;
    s.framework.optimizer_state = OptimizerState::lazy;
    CHECK(eager.framework.optimizer_state == OptimizerState::eager);  // the default
    const Report lazy_report = estimate(fixtures::gpt2_small(), s);
    const Report eager_report = estimate(fixtures::gpt2_small(), eager);
    const ReservedPeak made_late = reserved_peak(lazy_report, lazy_report.busiest(), {});
    const ReservedPeak made_first = reserved_peak(eager_report, eager_report.busiest(), {});
    // The same tensors at the same peak; only where the allocator put them differs.
    CHECK(lazy_report.busiest().peak_step().bytes.total() ==
          eager_report.busiest().peak_step().bytes.total());
    CHECK(made_late.bytes > made_first.bytes);
    CHECK(made_late.iteration == 2);
}

TEST_CASE("ZeRO-3's gathered weights are allocated on their own stream, in segments of their own",
          "[reserved]") {
    Settings s = with(1024, Recompute::full);
    s.parallel.dp = 8, s.parallel.zero = 3;
    for (const Architecture& model : {fixtures::llama_7b(), fixtures::gpt2_small()}) {
        const Report r = estimate(model, s);
        const RankReport& rank = r.busiest();
        const AllocationSequence seq =
            allocation_sequence(rank.timeline(), step_pieces(r, rank), 1);
        Count most_gathered;
        for (const Step& step : seq.steps)
            most_gathered = std::max(most_gathered, step.bytes.gathered_weights);
        REQUIRE(most_gathered > Count(0));
        const AllocatorResult run = simulate_allocator(seq.events, AllocatorConfig{});
        std::uint64_t gather_segments = 0;
        for (const AllocatorSegment& segment : run.segments_at_peak_reserved)
            if (segment.stream == gather_stream) gather_segments += segment.bytes;
        // The pool of the gather stream holds a layer's gathered weights whatever the compute
        // stream has cached.
        CHECK(gather_segments >= most_gathered.value());
    }
}

TEST_CASE("the allocator reserves at least what it allocates, and its band is ordered",
          "[reserved]") {
    for (const Case& c : cases()) {
        SECTION(c.name) {
            const Report r = estimate(c.model, c.settings);
            const RankReport& rank = r.busiest();
            const ReservedPeak peak = reserved_peak(r, rank, AllocatorConfig{});
            const std::uint64_t allocated = rank.peak_step().bytes.total().value();
            CHECK(peak.allocated_bytes >= allocated);
            CHECK(peak.bytes >= peak.allocated_bytes);
            CHECK(peak.first_step_bytes <= peak.bytes);
            CHECK(peak.high_bytes >= peak.bytes);
            CHECK_FALSE(peak.out_of_memory);
        }
    }
}

TEST_CASE("LLaMA 7B at 4,096 tokens, selective: expandable segments reserve no more than caching",
          "[reserved]") {
    const Report r = estimate(fixtures::llama_7b(), with(4096, Recompute::selective));
    AllocatorConfig expandable;
    expandable.mode = AllocatorMode::expandable;
    const ReservedPeak caching = reserved_peak(r, r.busiest(), AllocatorConfig{});
    const ReservedPeak grown = reserved_peak(r, r.busiest(), expandable);
    CHECK(grown.bytes <= caching.bytes);
    CHECK(grown.bytes >= r.peak_step().bytes.total());
    // The chapter's allocated figure is untouched by the simulation.
    CHECK(r.peak_step().bytes.total().value() == 116095778816ULL);
}

}  // namespace reserved_tests

namespace reserved_tests {

TEST_CASE("the device figure is the reserved one and the rows outside the allocator",
          "[reserved]") {
    Settings s = with(4096, Recompute::selective);
    s.parallel.tp = 2, s.parallel.dp = 4;
    const Report r = estimate(fixtures::llama_7b(), s);
    DeviceSettings device;
    device.gpu = gpu_facts_of("h100-sxm");
    REQUIRE(device.gpu);
    const DeviceFigures d = device_figures(r, device).front();
    CHECK(d.allocated == r.peak_step().bytes.total());
    CHECK(d.reserved.bytes >= d.allocated + Count(32ULL << 20));  // the cuBLAS workspace within
    CHECK(d.bytes == d.reserved.bytes + d.outside_bytes());
    CHECK(d.low_bytes <= d.bytes);
    CHECK(d.high_bytes >= d.bytes);
    std::vector<std::string> names;
    for (const DeviceRow& row : d.rows) names.emplace_back(row.name);
    const std::vector<std::string> expected{"cublas_workspace", "cublaslt_workspace",
                                            "cuda_context",     "nccl_communicator",
                                            "nccl_nvls",        "driver_reserved"};
    CHECK(names == expected);
    for (const DeviceRow& row : d.rows) {
        INFO(row.name);
        CHECK(row.low_bytes <= row.bytes);
        CHECK(row.bytes <= row.high_bytes);
        CHECK_FALSE(row.source.empty());
        // tp 2 and dp 4: two collective groups; NVLS only for the one of more than two ranks.
        if (row.name == "nccl_communicator") CHECK(row.count == 2);
        if (row.name == "nccl_nvls") CHECK(row.count == 1);
        if (row.in_allocator) CHECK(row.count == 2);  // the forward's thread and autograd's
    }
    // An unknown GPU takes every row's high end.
    const DeviceFigures unknown = device_figures(r, DeviceSettings{}).front();
    CHECK(unknown.bytes >= d.bytes);
    // The CPU platform has no CUDA rows.
    s.framework.platform = Platform::cpu;
    CHECK(device_figures(estimate(fixtures::llama_7b(), s), device).front().rows.empty());
}

}  // namespace reserved_tests

namespace reserved_tests {

TEST_CASE("NVLS buffers only for groups of more than two with two or more GPUs on the rank's node",
          "[reserved]") {
    // h100-sxm: 8 GPUs on one NVSwitch; ranks tp first, then cp, then dp (then ep within dp).
    using Row = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t,
                           std::uint64_t, std::uint64_t>;  // tp cp dp ep, communicators, NVLS
    const auto [tp, cp, dp, ep, communicators, nvls] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t,
                       std::uint64_t>({
            Row{8, 1, 128, 1, 2, 1},  // Llama 3's: dp's one GPU a node has none
            Row{4, 1, 4, 1, 2, 2},    // dp's two GPUs a node: counted (later NCCL makes them)
            Row{2, 1, 16, 1, 2, 1},   // dp's four a node; tp 2's two: none
            Row{1, 1, 64, 1, 1, 1},   // dp's eight a node
            Row{1, 4, 2, 1, 2, 2},    // cp within the node, dp x cp's eight
            Row{2, 4, 2, 1, 3, 2},    // cp 4 on a node (stride 2): NVLS; dp x cp's 4 a node too
            Row{2, 1, 8, 4, 3, 2},    // ep 4 within dp, stride 2: four a node, as dp's
            Row{8, 1, 16, 8, 3, 1},   // ep's one GPU a node
        }));
    CAPTURE(tp, cp, dp, ep);
    Parallelism p;
    p.tp = tp, p.cp = cp, p.dp = dp, p.ep = ep;
    std::uint64_t counted_communicators = 0, counted_nvls = 0;
    for (const DeviceRow& row : device_rows(Framework{}, p, gpu_facts_of("h100-sxm"))) {
        if (row.name == "nccl_communicator") counted_communicators = row.count;
        if (row.name == "nccl_nvls") counted_nvls = row.count;
    }
    CHECK(counted_communicators == communicators);
    CHECK(counted_nvls == nvls);
    // Without a GPU's facts every group of more than two is taken as on one node (leaning high).
    std::uint64_t unknown_nvls = 0;
    for (const DeviceRow& row : device_rows(Framework{}, p, std::nullopt))
        if (row.name == "nccl_nvls") unknown_nvls = row.count;
    CHECK(unknown_nvls == std::uint64_t((dp * cp > 2) + (tp > 2) + (cp > 2) + (ep > 2)));
    // A GPU with no NVSwitch has none.
    for (const DeviceRow& row : device_rows(Framework{}, p, gpu_facts_of("h100-pcie")))
        CHECK(row.name != "nccl_nvls");
}

}  // namespace reserved_tests

namespace reserved_tests {

TEST_CASE("plan shows only layouts whose device figure fits, and refuses those it does not",
          "[reserved][plan][slow-sanitized]") {
    PlanRequest request;
    request.gpus = 8, request.base.seq = 4096, request.global_batch = 64;
    request.capacity = 81559ULL << 20;  // an H100's
    request.device = DeviceSettings{};
    request.device->gpu = gpu_facts_of("h100-sxm");
    const PlanSummary summary = plan_top(fixtures::llama_7b(), request, 5);
    REQUIRE(summary.top.size() == 5);
    for (const PlanRow& row : summary.top) {
        REQUIRE(row.device);
        CHECK(*row.device <= request.capacity);
        CHECK(*row.device >= row.peak.bytes() + row.beside);
    }
    // Refused: peak and rows fit, the replayed allocator does not (at some capacity near an
    // H100's: whether a layout falls between the two depends on where the capacity cuts).
    std::size_t refused = 0;
    for (std::uint64_t less = 0; less < 8 && refused == 0; ++less) {
        PlanRequest near = request;
        near.capacity = Count(request.capacity.value() - (less << 29));
        for (const PlanRow& row : plan_top(fixtures::llama_7b(), near, 5).refused) {
            CHECK(row.peak.bytes() + row.beside <= near.capacity);
            CHECK(*row.device > near.capacity);
            ++refused;
        }
    }
    CHECK(refused > 0);
    // Without device settings the allocated peak alone decides, as before.
    request.device.reset();
    const PlanSummary bare = plan_top(fixtures::llama_7b(), request, 5);
    CHECK(bare.refused.empty());
    // It admits every layout the device figure does, and more: its best ranks no lower.
    REQUIRE(!bare.top.empty());
    CHECK(plan_key(bare.top[0]) <= plan_key(summary.top[0]));
}

TEST_CASE("fit on the device figure finds no larger size than on the allocated peak",
          "[reserved][fit]") {
    Settings s = with(0, Recompute::selective);
    s.parallel.dp = 8, s.parallel.zero = 3;
    const Count capacity = 81559ULL << 20;
    const FitResult plain =
        fit(fixtures::llama_7b(), s, FitDimension::seq, capacity, 256, 1ULL << 20);
    const FitResult device = fit(fixtures::llama_7b(), s, FitDimension::seq, capacity, 256,
                                 1ULL << 20, DeviceSettings{});
    REQUIRE(plain.largest);
    REQUIRE(device.largest);
    REQUIRE(device.largest->device);
    CHECK(device.largest->size < plain.largest->size);
    CHECK(*device.largest->device <= capacity);
    CHECK(device.first_over->weighed() > capacity);
}

TEST_CASE(
    "the loaded figures are the weights, each rounded; a model past the simulator's limits "
    "is not replayed",
    "[reserved]") {
    const Report r = estimate(fixtures::llama_7b(), with(2048, Recompute::full));
    const ReservedPeak peak = reserved_peak(r, r.busiest(), AllocatorConfig{});
    const Count weights = r.busiest().state.weights;
    CHECK(peak.loaded_allocated_bytes >= weights);
    CHECK(peak.loaded_allocated_bytes.value() <= weights.value() + 512 * 400);  // 291 tensors
    CHECK(peak.loaded_bytes >= peak.loaded_allocated_bytes);
    CHECK(peak.simulated);
    Architecture deep = fixtures::decoder();
    deep.layers = 5000;  // 10,000 steps and more
    const Report d = estimate(deep, with(8, Recompute::none));
    const ReservedPeak unsimulated = reserved_peak(d, d.busiest(), AllocatorConfig{});
    CHECK_FALSE(unsimulated.simulated);
    CHECK(unsimulated.bytes == d.peak_step().bytes.total());
}

TEST_CASE("a max split size keeps large blocks whole and still reserves what is allocated",
          "[reserved]") {
    const Report r = estimate(fixtures::llama_7b(), with(4096, Recompute::selective));
    AllocatorConfig limited;
    limited.max_split_size = 256ULL << 20;
    const ReservedPeak peak = reserved_peak(r, r.busiest(), limited);
    CHECK(peak.bytes >= peak.allocated_bytes);
    CHECK(peak.allocated_bytes >= r.peak_step().bytes.total());
}

}  // namespace reserved_tests

namespace reserved_tests {

TEST_CASE("Transformer Engine's workspace is a row only where its GEMMs run", "[reserved]") {
    Settings s = with(1024, Recompute::none);
    const auto names = [](const std::vector<DeviceRow>& rows) {
        std::vector<std::string> out;
        for (const DeviceRow& r : rows) out.emplace_back(r.name);
        return out;
    };
    const auto h100 = gpu_facts_of("h100-sxm"), a100 = gpu_facts_of("a100-80gb");
    CHECK(names(device_rows(s, h100)) ==
          std::vector<std::string>{"cublas_workspace", "cublaslt_workspace", "cuda_context",
                                   "driver_reserved"});
    s.framework.gemm = GemmLibrary::transformer_engine;
    const std::vector<DeviceRow> hopper = device_rows(s, h100), ampere = device_rows(s, a100);
    REQUIRE(names(hopper).size() == 5);
    CHECK(hopper[2].name == "te_cublas_workspace");
    CHECK(hopper[2].in_allocator);
    CHECK(hopper[2].bytes == Count((32ULL << 20) + 1024));
    CHECK(ampere[2].bytes == Count(4ULL << 20));
}

}  // namespace reserved_tests
