// Google Benchmark micro-benchmarks: one estimate, one timeline, one layout's peak, a whole plan,
// the allocator simulator over a step's events.
// Run: build/bench/memcalc_bench (figures in docs/speed.md, with the command that made them).
#include <benchmark/benchmark.h>

#include "memcalc/memcalc.hpp"

namespace {

using namespace memcalc;

Architecture llama_7b() {
    Architecture m;
    m.name = "llama-7b", m.hidden = 4096, m.layers = 32, m.heads = 32, m.ffn = 11008,
    m.vocab = 32000;
    return m;
}

Architecture llama_405b() {
    Architecture m;
    m.name = "llama-3.1-405b", m.hidden = 16384, m.layers = 126, m.heads = 128, m.kv_heads = 8,
    m.ffn = 53248;
    m.vocab = 128256;
    return m;
}

void estimate_llama_7b(benchmark::State& state) {
    Settings s;
    s.seq = 4096, s.recompute = Recompute::selective;
    const Architecture m = llama_7b();
    for (auto _ : state) benchmark::DoNotOptimize(estimate(m, s));
}
BENCHMARK(estimate_llama_7b);

void estimate_llama_7b_new_model(benchmark::State& state) {  // no call's model is the last one's
    Settings s;
    s.seq = 4096, s.recompute = Recompute::selective;
    Architecture models[2] = {llama_7b(), llama_7b()};
    models[1].vocab += 64;  // one field apart: estimate() makes its tables again
    std::size_t i = 0;
    for (auto _ : state) benchmark::DoNotOptimize(estimate(models[i ^= 1], s));
}
BENCHMARK(estimate_llama_7b_new_model);

void estimate_llama_7b_kept_estimator(benchmark::State& state) {  // the model's tables made once
    Settings s;
    s.seq = 4096, s.recompute = Recompute::selective;
    const Estimator estimator(llama_7b());
    for (auto _ : state) benchmark::DoNotOptimize(estimator.estimate(s));
}
BENCHMARK(estimate_llama_7b_kept_estimator);

void estimate_llama_7b_architecture(benchmark::State& state) {
    Settings s;
    s.seq = 4096, s.recompute = Recompute::selective, s.activations = ActivationModel::architecture;
    const Architecture m = llama_7b();
    for (auto _ : state) benchmark::DoNotOptimize(estimate(m, s));
}
BENCHMARK(estimate_llama_7b_architecture);

void summary_llama_7b(
    benchmark::State& state) {  // a CSV sweep's configuration: the closed form, no tables kept
    Settings s;
    s.seq = 4096, s.recompute = Recompute::selective;
    const Estimator estimator(llama_7b());
    for (auto _ : state) benchmark::DoNotOptimize(estimator.summary(s));
}
BENCHMARK(summary_llama_7b);

void sweep_lines_llama_7b(benchmark::State& state) {  // a CSV sweep's rows along the micro-batch
    Settings s;
    s.seq = 4096;
    const Estimator estimator(llama_7b());
    const std::vector<Recompute> modes = {Recompute::none, Recompute::selective, Recompute::full};
    std::vector<std::uint64_t> batches;
    for (std::uint64_t b = 1; b <= 333; ++b) batches.push_back(b);
    for (auto _ : state) {
        MicroBatchLines lines(estimator, s, modes, batches);  // the probes, each a whole summary
        for (std::uint64_t b : batches) {
            if (!lines.covers(b)) {  // each mode made whole, as the sweep does
                Settings at = s;
                at.micro_batch = b;
                benchmark::DoNotOptimize(estimator.summaries(at, modes));
                continue;
            }
            for (std::size_t m = 0; m < modes.size(); ++m)
                benchmark::DoNotOptimize(lines.at(b, m).peak.bytes);
        }
    }
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batches.size() * 3));
}
BENCHMARK(sweep_lines_llama_7b);

Workload workload_405b(std::uint64_t b) {
    const Architecture m = llama_405b();
    return make_workload(m, *find_recipe("mixed-adam"), 8192, b, Recompute::selective,
                         parameter_splits(parameter_table(m), m.vocab),
                         activation_tables(m, 8192, b, DType::bf16, ActivationModel::korthikanti));
}

void timeline_405b_stage(benchmark::State& state) {
    const Workload w = workload_405b(1);
    Parallelism p;
    p.dp = 16, p.tp = 8, p.pp = 2, p.zero = 1, p.sequence_parallel = true, p.microbatches = 8;
    const TimelineInputs in = stage_inputs(w, p, stage_facts(w, p, 0));
    for (auto _ : state) benchmark::DoNotOptimize(timeline(in));
}
BENCHMARK(timeline_405b_stage);

void layout_peak_405b(benchmark::State& state) {
    const Workload w = workload_405b(1);
    Parallelism p;
    p.dp = 16, p.tp = 8, p.pp = 2, p.zero = 1, p.sequence_parallel = true, p.microbatches = 8;
    for (auto _ : state) benchmark::DoNotOptimize(layout_peak(w, p));
    state.SetItemsProcessed(state.iterations());
}
BENCHMARK(layout_peak_405b);

void plan_405b_on_1024_gpus(benchmark::State& state) {
    PlanRequest request;
    request.gpus = 1024, request.capacity = 78000000000ULL, request.base.seq = 8192,
    request.global_batch = 2048;
    const Architecture m = llama_405b();
    std::size_t layouts = 0;
    for (auto _ : state) {  // as `memcalc plan --top 10` runs it
        const PlanSummary result = plan_top(m, request, 10);
        layouts += result.evaluated;
        benchmark::DoNotOptimize(result.top.data());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(layouts));
}
BENCHMARK(plan_405b_on_1024_gpus)->Unit(benchmark::kMillisecond);

/// The search: Llama 3.1 405B on 16,384 H100s, ranked by step time (no device check).
void plan_405b_on_16384_h100s(benchmark::State& state) {
    PlanRequest request;
    request.gpus = 16384, request.capacity = 85520000000ULL, request.base.seq = 8192,
    request.global_batch = 2048, request.offload = {OffloadMode{}};
    request.gpu = *find_gpu("h100-sxm");
    const Architecture m = llama_405b();
    std::size_t layouts = 0;
    for (auto _ : state) {
        const PlanSummary result = plan_top(m, request, 3);
        layouts += result.evaluated;
        benchmark::DoNotOptimize(result.top.data());
    }
    state.SetItemsProcessed(static_cast<std::int64_t>(layouts));
}
BENCHMARK(plan_405b_on_16384_h100s)->Unit(benchmark::kMillisecond);

/// A training step's shape for the allocator: each of 2,000 layers allocates 25 tensors of mixed
/// sizes (0.5 KiB to 40 MiB) in the forward pass, half freed at once, the rest freed in reverse
/// in the backward pass: 100,000 events.
std::vector<AllocatorEvent> step_events() {
    std::vector<AllocatorEvent> events;
    std::vector<std::uint64_t> kept;
    std::uint64_t id = 0;
    for (std::uint64_t layer = 0; layer < 2000; ++layer) {
        for (std::uint64_t t = 0; t < 25; ++t) {
            const std::uint64_t bytes = (512ULL << ((layer * 7 + t * 5) % 17)) + t * 4096;
            events.push_back(alloc_event(++id, bytes, static_cast<std::uint32_t>(t % 5 == 0)));
            if (t % 2 == 0) {
                events.push_back(free_event(id));
            } else {
                kept.push_back(id);
            }
        }
    }
    for (auto it = kept.rbegin(); it != kept.rend(); ++it) events.push_back(free_event(*it));
    return events;
}

void allocator_step(benchmark::State& state) {
    const std::vector<AllocatorEvent> events = step_events();
    AllocatorConfig config;
    config.mode = state.range(0) == 0 ? AllocatorMode::caching : AllocatorMode::expandable;
    for (auto _ : state) benchmark::DoNotOptimize(simulate_allocator(events, config));
    state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(events.size()));
}
BENCHMARK(allocator_step)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
