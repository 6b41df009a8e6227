#pragma once
// What a fuzz target does with a model it managed to read: estimate it in several ways and render
// the results, so every path the program takes after loading sees the odd shapes the fuzzer makes.
// memcalc::error is the one acceptable failure; anything else (a crash, a sanitizer report, another
// exception) is a bug.
#include <algorithm>

#include "memcalc/memcalc.hpp"
#include "render.hpp"

inline void exercise(const memcalc::Architecture& m) {
    using namespace memcalc;
    const std::uint64_t context =
        m.max_positions == 0 ? 4096 : std::min<std::uint64_t>(m.max_positions, 4096);
    for (std::uint64_t seq : {std::uint64_t{1}, std::uint64_t{7}, context})
        for (Recompute mode :
             {Recompute::none, Recompute::selective, Recompute::full, Recompute::op})
            for (ActivationModel model :
                 {ActivationModel::korthikanti, ActivationModel::architecture}) {
                Settings s;
                s.seq = seq, s.micro_batch = seq == 7 ? 3 : 1, s.recompute = mode,
                s.activations = model;
                // Each platform and optimizer implementation somewhere, without multiplying the
                // runs.
                if (model == ActivationModel::architecture && seq == 7)
                    s.framework.platform = Platform::cpu;
                s.framework.optimizer = mode == Recompute::none        ? OptimizerImpl::fused
                                        : mode == Recompute::selective ? OptimizerImpl::foreach
                                                                       : OptimizerImpl::for_loop;
                if (seq == context)
                    s.parallel.tp = 2, s.parallel.pp = 2, s.parallel.dp = 2, s.parallel.zero = 3;
                // Accumulated and persistent gradients, and uneven stages, somewhere too.
                if (seq == 7)
                    s.parallel.microbatches = 3, s.parallel.pp = 3,
                    s.parallel.first_stage_layers = 1;
                if (mode == Recompute::full) s.framework.grad_buffer = GradBuffer::persistent;
                // Each loss kernel, and a loop that drops its logits.
                s.framework.loss = seq == 1                  ? LossKernel::fp32
                                   : seq == 7                ? LossKernel::bf16
                                   : mode == Recompute::full ? LossKernel::fused
                                                             : LossKernel::fp32_inplace;
                if (mode == Recompute::op)
                    s.framework.loss = seq == 7 ? LossKernel::fused_linear : LossKernel::chunked;
                s.framework.loss_chunks = seq == 1 ? 3 : 8;  // more chunks than tokens, once
                // An fp32 model under autocast (its weight casts, its two dtypes) on the long
                // sequence.
                if (model == ActivationModel::architecture && seq == context)
                    s.recipe = builtin_recipe("amp-adam");
                // Narrow (fp8) linears, their saved casts and weight casts, on the shortest one.
                if (model == ActivationModel::architecture && seq == 1)
                    s.recipe = builtin_recipe("fp8");
                if (mode == Recompute::selective) s.framework.logits = LogitsLife::freed;
                // A k/v cache kept with the output, somewhere.
                if (seq == 7 || mode == Recompute::full) s.framework.kv_cache = KvCache::kept;
                try {
                    const Report r = estimate(m, s);
                    // The allocator's replay, the slowest part under the sanitizers, three times
                    // a model: the JSON's at seq 1, both renderings' with the expandable allocator.
                    cli::View view, table_view;
                    view.device_figures = mode == Recompute::none &&
                                          model == ActivationModel::architecture && seq != context;
                    if (seq == 7) view.device.allocator.mode = AllocatorMode::expandable;
                    table_view = view;
                    table_view.device_figures = view.device_figures && seq == 7;
                    (void)cli::report_json(r, view).dump();
                    (void)cli::report_table(r, table_view);
                    (void)cli::csv_row(r);
                } catch (const error&) {}
            }
    // Serving it: each weight format, a cache dtype, tensor parallelism, and the largest batch.
    for (const WeightFormat& format : weight_formats) {
        ServeSettings s;
        s.context = context, s.batch = 3, s.weights = &format,
        s.tp = format.values == DType::int4 ? 2 : 1;
        s.kv_dtype = format.values == DType::bf16 ? DType::bf16 : DType::fp8_e4m3;
        try {
            (void)serve(m, s);
            (void)serve_fit(m, s, Count(80'000'000'000ULL));
        } catch (const error&) {}
    }
}
