// Google Benchmark micro-benchmarks: one estimate, one timeline, one layout's peak, a whole plan.
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

}  // namespace

BENCHMARK_MAIN();
