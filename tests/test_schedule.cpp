// Pipeline schedules against their papers: in-flight counts, chunk placement, weight copies,
// bubbles.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/plan.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
Parallelism pipeline(std::uint64_t pp, std::uint64_t microbatches, Schedule s) {
    Parallelism p;
    p.pp = pp, p.microbatches = microbatches, p.schedule = s;
    return p;
}
/// LLaMA 7B's workload at `s` tokens, one sequence, under `mode`, the chapter's recipe.
Workload llama_7b_workload(Recompute mode, ActivationModel model = ActivationModel::korthikanti,
                           std::uint64_t s = 1024) {
    const Architecture m = fixtures::llama_7b();
    const ActivationTables t = activation_tables(m, s, 1, DType::bf16, model);
    return make_workload(m, Settings{}.recipe, s, 1, mode,
                         parameter_splits(parameter_table(m), m.vocab), t);
}
Report estimate_at_1024(const Architecture& m, const Parallelism& p) {
    Settings settings;
    settings.seq = 1024, settings.parallel = p;
    return estimate(m, settings);
}
}  // namespace

TEST_CASE("in flight per stage, as each paper's schedule gives it", "[schedule][pipeline]") {
    using Row = std::tuple<Schedule, std::uint64_t, std::uint64_t, std::vector<std::uint64_t>>;
    for (const auto& [schedule, P, M, expected] : {
             // 1F1B: stage k runs P - k forwards before its first backward (Narayanan et al. 2021,
             // Figure 4).
             Row{Schedule::one_f_one_b, 4, 8, {4, 3, 2, 1}},
             Row{Schedule::one_f_one_b, 4, 2, {2, 2, 2, 1}},
             // ZB-H1: W deferred so every stage holds what 1F1B's first does (Qi et al. 2024,
             // Figure 3).
             Row{Schedule::zb_h1, 4, 8, {4, 4, 4, 4}},
             Row{Schedule::zb_h1, 4, 3, {3, 3, 3, 3}},
             // ZB-V: 1F1B's peak on every rank, in chunks of half a stage: 2 P.
             Row{Schedule::zb_v, 4, 8, {8, 8, 8, 8}},
             // DualPipe: PP + 1 stages' activations on every rank (DeepSeek-V3, Table 2); the
             // README's 8 ranks, 20 micro-batches.
             Row{Schedule::dualpipe, 8, 20, {9, 9, 9, 9, 9, 9, 9, 9}},
         }) {
        const Parallelism p = pipeline(P, M, schedule);
        CAPTURE(schedule_name(schedule), P, M);
        for (std::uint64_t k = 0; k < P; ++k) CHECK(in_flight(p, k) == expected[k]);
    }
    // DualPipe's warm-up on rank k of P (its runtime's first two steps): 2 (P/2 - h - 1) forwards
    // of the first direction, then h + 1 pairs of both, h = min(k, P - 1 - k): P on every rank
    // before the first backward, and one more while a forward overlaps that backward.
    for (std::uint64_t P : {2, 4, 8, 16}) {
        const Parallelism p = pipeline(P, 2 * P, Schedule::dualpipe);
        for (std::uint64_t k = 0; k < P; ++k) {
            const std::uint64_t h = std::min(k, P - 1 - k),
                                warm_up = 2 * (P / 2 - h - 1) + 2 * (h + 1);
            CAPTURE(P, k);
            CHECK(in_flight(p, k) == warm_up + 1);
        }
    }
    // ZB-V holds 1F1B's first-stage activations on every rank: P micro-batches of a rank's L / P
    // layers.
    const Architecture m = fixtures::llama_7b();
    const Parallelism v = pipeline(4, 8, Schedule::zb_v),
                      one = pipeline(4, 8, Schedule::one_f_one_b);
    CHECK(in_flight(v, 2) * (m.layers / model_chunks(v)) == in_flight(one, 0) * (m.layers / 4));
}

TEST_CASE(
    "chunk placement: ZB-V's V, DualPipe's two directions, and who holds the embedding and head",
    "[schedule]") {
    const Parallelism v = pipeline(4, 8, Schedule::zb_v);
    CHECK(chunks_per_rank(v) == 2);
    CHECK(model_chunks(v) == 8);
    CHECK(stage_layers(v, 32, 0) ==
          std::vector<std::uint64_t>{1, 2, 3, 4, 29, 30, 31, 32});  // chunks 0 and 7
    CHECK(stage_layers(v, 32, 3) ==
          std::vector<std::uint64_t>{13, 14, 15, 16, 17, 18, 19, 20});  // chunks 3 and 4
    CHECK((holds_embedding(v, 0) && holds_head(v, 0)));
    CHECK_FALSE((holds_embedding(v, 3) || holds_head(v, 3)));

    const Parallelism d = pipeline(4, 8, Schedule::dualpipe);
    CHECK(model_chunks(d) == 4);  // the model's 4 stages, each held twice
    CHECK(stage_layers(d, 32, 1) == std::vector<std::uint64_t>{9, 10, 11, 12, 13, 14, 15, 16, 17,
                                                               18, 19, 20, 21, 22, 23, 24});
    for (std::uint64_t k : {0, 3}) CHECK((holds_embedding(d, k) && holds_head(d, k)));
    CHECK_FALSE((holds_embedding(d, 1) || holds_head(d, 2)));

    // Interleaved keeps Megatron-LM's placement: chunk c of rank k is the (c P + k)-th.
    Parallelism i = pipeline(4, 8, Schedule::interleaved);
    i.vpp = 2;
    CHECK(stage_layers(i, 32, 1) == std::vector<std::uint64_t>{5, 6, 7, 8, 21, 22, 23, 24});
    CHECK(holds_head(i, 3));
    CHECK_FALSE(holds_head(i, 0));
}

TEST_CASE("DualPipe: each rank holds two stages' weights, gradients and optimiser state",
          "[schedule][estimate]") {
    const Architecture m =
        fixtures::llama_7b();  // untied: the embedding on the first stage, the head on the last
    for (unsigned zero : {0u, 1u}) {
        Parallelism one = pipeline(4, 8, Schedule::one_f_one_b),
                    dual = pipeline(4, 8, Schedule::dualpipe);
        one.dp = dual.dp = 2, one.zero = dual.zero = zero;
        const Report a = estimate_at_1024(m, one), b = estimate_at_1024(m, dual);
        CAPTURE(zero);
        for (std::uint64_t k = 0; k < 4; ++k) {
            const RankReport &mine = b.ranks[k], &forward = a.ranks[k], &reverse = a.ranks[3 - k];
            CAPTURE(k);
            CHECK(mine.parameters == forward.parameters + reverse.parameters);
            CHECK(mine.state.weights == forward.state.weights + reverse.state.weights);
            CHECK(mine.state.gradients == forward.state.gradients + reverse.state.gradients);
            CHECK(mine.state.optimizer_state ==
                  forward.state.optimizer_state + reverse.state.optimizer_state);
            CHECK(mine.state.master_weights ==
                  forward.state.master_weights + reverse.state.master_weights);
        }
        // Twice the model's parameters across the pipeline; ZB-V keeps one copy.
        Count dual_total, v_total;
        const Report v = estimate_at_1024(m, pipeline(4, 8, Schedule::zb_v));
        for (std::uint64_t k = 0; k < 4; ++k)
            dual_total += b.ranks[k].parameters, v_total += v.ranks[k].parameters;
        CHECK(dual_total == Count(2) * v_total);
        CHECK(v_total == a.parameter_count);
    }
}

TEST_CASE("the bubble of each schedule from one chunk's F, B and W, by hand", "[schedule][time]") {
    // A chunk of time 1 with forward share 1/3: F = W = 1/3, B = 2/3 (W the weight-gradient half of
    // it).
    const ChunkTimes t = chunk_times(1, 1.0 / 3);
    CHECK(t.forward == Approx(1.0 / 3));
    CHECK(t.backward == Approx(2.0 / 3));
    CHECK(t.weight == Approx(1.0 / 3));
    // P = 4, M = 8: 1F1B (P-1)(F+B) = 3 chunks of 8: 3/8 of the compute.
    CHECK(bubble_share(pipeline(4, 8, Schedule::one_f_one_b)) == Approx(3.0 / 8));
    Parallelism interleaved = pipeline(4, 8, Schedule::interleaved);
    interleaved.vpp = 2;  // the same 3 chunks, each half a stage: of 16
    CHECK(bubble_share(interleaved) == Approx(3.0 / 16));
    // ZB-H1: (P-1)(F+B-2W) = 3 x 1/3 = 1 chunk of 8.
    CHECK(bubble_share(pipeline(4, 8, Schedule::zb_h1)) == Approx(1.0 / 8));
    CHECK(bubble_share(pipeline(4, 8, Schedule::zb_v)) == 0);
    // DualPipe: (P/2-1)(F&B+B-3W) = 1 x (1 + 2/3 - 1) = 2/3 of a chunk; each micro-batch one chunk
    // per rank.
    CHECK(bubble_share(pipeline(4, 8, Schedule::dualpipe)) == Approx(2.0 / 3 / 8));
    CHECK(bubble_share(pipeline(8, 20, Schedule::dualpipe)) == Approx(3 * (2.0 / 3) / 20));
    // Full recomputation puts another forward into B: share 1/4, F = W = 1/4, B = 3/4.
    CHECK(bubble_share(pipeline(4, 8, Schedule::zb_h1), 0.25) == Approx(3 * (1 - 0.5) / 8));
    CHECK(bubble_share(pipeline(4, 8, Schedule::dualpipe), 0.25) == Approx((1 + 0.75 - 0.75) / 8));
    CHECK(bubble_share(pipeline(4, 8, Schedule::one_f_one_b), 0.25) ==
          Approx(3.0 / 8));  // 1F1B's needs no split

    // In step_time: the bubble is that share of the compute.
    Gpu g;
    g.name = "round", g.peak_bf16_flops = 100'000'000'000'000ULL, g.gpus_per_node = 8;
    g.intra_node_bandwidth = 100'000'000'000ULL, g.inter_node_bandwidth = 10'000'000'000ULL;
    const auto time = step_time(g, pipeline(4, 8, Schedule::dualpipe), 1.6e16, Traffic{});
    REQUIRE(time);
    CHECK(time->compute == Approx(1.6e16 / (4 * 1e14 * g.gemm_efficiency)));  // 57 s
    CHECK(time->bubble == Approx(time->compute / 12));
}

TEST_CASE("invalid schedules are refused with the value named", "[schedule]") {
    const Architecture m = fixtures::llama_7b();
    using Row = std::tuple<Parallelism, const char*>;
    Parallelism zb_v_vpp = pipeline(4, 8, Schedule::zb_v),
                interleaved_one = pipeline(4, 8, Schedule::interleaved),
                uneven = pipeline(4, 8, Schedule::zb_v);
    zb_v_vpp.vpp = 2, uneven.first_stage_layers = 5;  // 27 left for 7 chunks
    for (const auto& [p, message] : {
             Row{pipeline(3, 6, Schedule::dualpipe),
                 "schedule dualpipe needs an even pp (got pp 3)"},
             Row{pipeline(4, 6, Schedule::dualpipe), "at least 2 x pp = 8 (got microbatches 6)"},
             Row{pipeline(4, 9, Schedule::dualpipe),
                 "an even number of micro-batches of at least 2 x pp = 8 (got microbatches 9)"},
             Row{pipeline(4, 4, Schedule::zb_v),
                 "schedule zb-v needs micro-batches of at least 2 x pp = 8 (got microbatches 4)"},
             Row{pipeline(1, 8, Schedule::zb_v), "schedule zb-v needs pp > 1"},
             Row{zb_v_vpp, "schedule zb-v runs 2 chunks per rank: vpp must be 1 (got vpp 2)"},
             Row{interleaved_one, "schedule interleaved needs vpp > 1 (got vpp 1)"},
             Row{uneven, "the other 7 model chunks cannot split the remaining 27 layers evenly"},
             Row{pipeline(32, 64, Schedule::zb_v),
                 "schedule zb-v cuts the model into 64 chunks (2 x pp), which must divide layers "
                 "(32)"},
         }) {
        CAPTURE(message);
        CHECK_THROWS_WITH(validate(p, m, 1024), Catch::Contains(message));
    }
    CHECK_NOTHROW(validate(pipeline(32, 64, Schedule::dualpipe), m, 1024));
    CHECK_THROWS_WITH(parse_schedule("zbv"), Catch::Contains("(got 'zbv')"));
}

TEST_CASE("the program: --schedule in the estimate's JSON and table, and its refusals",
          "[schedule][cli]") {
    const std::string run =
        "--preset llama-7b --seq 1024 --pp 4 --microbatches 8 --format json --schedule ";
    const auto dual = testing::memcalc(run + "dualpipe");
    REQUIRE(dual.status == 0);
    const auto j = nlohmann::json::parse(dual.out);
    CHECK(j["settings"]["parallel"]["schedule"] == "dualpipe");
    CHECK(j["settings"]["parallel"]["parameter_copies"] == 2);
    CHECK(j["ranks"][1]["in_flight"] == 5);
    CHECK(j["ranks"][3]["holds_embedding"] == true);
    const auto plain = nlohmann::json::parse(
        testing::memcalc(
            "--preset llama-7b --seq 1024 --pp 4 --vpp 2 --microbatches 8 --format json")
            .out);
    CHECK(plain["settings"]["parallel"]["schedule"] ==
          "interleaved");  // --vpp alone: interleaved, as before
    const auto table =
        testing::memcalc("--preset llama-7b --seq 1024 --pp 4 --microbatches 8 --schedule zb-v");
    CHECK_THAT(table.out, Catch::Contains("(ZB-V, 2 chunks per rank)"));
    for (const auto& [args, message] : {
             std::pair{"--preset llama-7b --pp 4 --schedule 1f1b --vpp 2",
                       "--schedule 1f1b runs one chunk per rank: --vpp must be 1 (got 2)"},
             std::pair{"--preset llama-7b --pp 4 --schedule zbv",
                       "--schedule must be 1f1b, interleaved, zb-h1, zb-v, dualpipe (got 'zbv')"},
             std::pair{"--preset llama-7b --pp 3 --microbatches 6 --schedule dualpipe",
                       "schedule dualpipe needs an even pp (got pp 3)"},
         }) {
        const auto r = testing::memcalc(args);
        CAPTURE(args);
        CHECK(r.status != 0);
        CHECK_THAT(r.err, Catch::Contains(message));
    }
}

TEST_CASE("plan searches the schedules asked for, and its peaks are estimate()'s",
          "[schedule][plan][pin]") {
    Architecture m = fixtures::llama_7b();
    m.name = "small-llama", m.layers = 16, m.hidden = 2048, m.heads = 16, m.kv_heads = 4,
    m.ffn = 5632;
    PlanRequest request;
    request.gpus = 8, request.capacity = 40000000000ULL, request.base.seq = 1024,
    request.global_batch = 32;
    // Unasked: 1F1B and interleaved only.
    for (const PlanRow& r : plan(m, request)) {
        const Schedule s = r.parallel.pipeline_schedule();
        CHECK((s == Schedule::one_f_one_b || s == Schedule::interleaved));
    }
    request.schedules = {Schedule::dualpipe, Schedule::zb_v};
    const auto rows = plan(m, request);
    REQUIRE(!rows.empty());
    bool dual = false, v = false;
    for (const PlanRow& r : rows) {
        const Parallelism& p = r.parallel;
        CAPTURE(p.pp, p.microbatches, schedule_name(p.pipeline_schedule()));
        REQUIRE(p.pp > 1);
        CHECK(p.vpp == 1);
        CHECK(p.steps_per_batch() >= 2 * p.pp);
        if (p.schedule == Schedule::dualpipe) {
            CHECK(p.pp % 2 == 0);
            dual = true;
        } else {
            CHECK(p.schedule == Schedule::zb_v);
            v = true;
        }
        // Recomputation reruns the forward inside B: the forward's share of the chunk falls below
        // 1/3.
        const ComputeCost c = compute_cost(m, 1024, r.micro_batch, r.recompute);
        const double idle = bubble_share(p, c.step / 3 / (c.step + c.recompute));
        CHECK(r.bubble == Approx(idle / (1 + idle)).margin(1e-12));
        if (r.recompute == Recompute::none) CHECK(idle == Approx(bubble_share(p)));
    }
    CHECK((dual && v));
    // A few rows' peaks against a full estimate's busiest rank.
    for (std::size_t i = 0; i < rows.size(); i += rows.size() / 5 + 1) {
        const PlanRow& r = rows[i];
        Settings s = request.base;
        s.micro_batch = r.micro_batch, s.recompute = r.recompute, s.parallel = r.parallel;
        CAPTURE(i, r.parallel.pp, schedule_name(r.parallel.schedule));
        CHECK(estimate(m, s).peak_step().bytes.total() == r.peak.bytes());
    }
    const auto csv = testing::memcalc(
        "plan --preset llama-7b --gpus 8 --gpu h100-sxm --seq 4096 --global-batch 64 --top 3 "
        "--format csv --pp 4 --schedule dualpipe");
    REQUIRE(csv.status == 0);
    CHECK_THAT(csv.out, Catch::Contains(",vpp,offload,schedule,recompute_layers,host_bytes\n") &&
                            Catch::Contains(",dualpipe,"));
    CHECK_THAT(csv.out, !Catch::Contains(",1f1b,"));
}

TEST_CASE("under every schedule the closed-form layout peak equals the most loaded timeline's",
          "[schedule][fast]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const Recompute mode = GENERATE(Recompute::none, Recompute::full);
    const ActivationModel model =
        GENERATE(ActivationModel::korthikanti, ActivationModel::architecture);
    for (Schedule schedule : {Schedule::zb_h1, Schedule::zb_v, Schedule::dualpipe})
        for (std::uint64_t pp : {2, 4, 6})
            for (unsigned zero : {0u, 3u}) {
                Parallelism p = pipeline(pp, 2 * pp, schedule);
                p.dp = 2, p.zero = zero;
                try {
                    validate(p, m, 512);
                } catch (const error&) {
                    continue;  // gpt2's 12 layers: no ZB-V on 4 stages
                }
                Settings settings;
                settings.seq = 512, settings.recompute = mode, settings.activations = model,
                settings.parallel = p;
                CAPTURE(m.name, recompute_name(mode), schedule_name(schedule), pp, zero);
                const Report r = estimate(m, settings);
                const ActivationTables t = activation_tables(m, 512, 1, DType::bf16, model);
                const Workload w = make_workload(m, r.settings.recipe, 512, 1, mode,
                                                 parameter_splits(*r.parameters, m.vocab), t);
                const LayoutPeak fast = layout_peak(w, p);
                CHECK(fast.bytes() == r.peak_step().bytes.total());
                CHECK(fast.stage == r.busiest().stage);
            }
}

TEST_CASE(
    "a deferred weight-gradient pass holds each linear's input and its output's gradient, by hand",
    "[schedule][pipeline]") {
    const Architecture m = fixtures::llama_7b();
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const std::uint64_t s = 4096, h = 4096, f = 11008, d = 2, V = m.vocab;
    // One layer: q, k, v and o (h to h), gate and up (h to f), down (f to h); each its output's
    // gradient, and its input, which q, k and v share, as gate and up do.
    const SplitBytes reads = weight_pass_reads(m, params->weight_pass[0], 0, s, d);
    const Parallelism whole;
    CHECK(reads.on_rank(whole, V) == Count(s) * (8 * h + 3 * f) * d);
    // Tensor-parallel: the 4 sides of the model's width stay whole (W reads the gathered input),
    // the rest split.
    Parallelism tp2;
    tp2.tp = 2, tp2.sequence_parallel = true;
    CHECK(reads.on_rank(tp2, V) == Count(s) * (4 * h + (4 * h + 3 * f) / 2) * d);
    // A frozen linear has no weight gradient, so nothing waits for it; when it led its input's
    // readers, the next one holds the input.
    using Frozen = std::pair<const char*, std::uint64_t>;  // a linear frozen, W's reads then
    for (const auto& [name, elements] :
         {Frozen{"down_proj", 7 * h + 2 * f}, Frozen{"gate_proj", 8 * h + 2 * f}}) {
        ParameterTable frozen = parameter_table(m);
        for (ParamRow& row : frozen.rows)
            if (row.tensor == Text(name)) row.trainable = false;
        CAPTURE(name);
        CHECK(weight_pass_reads(m, weight_pass_widths(frozen, 0), 0, s, d).on_rank(whole, V) ==
              Count(s) * elements * d);
    }

    // Stage k of 4, 8 micro-batches: under ZB-V each other micro-batch (chunk) in flight counts
    // the larger of its saved tensors and W's reads; 1F1B its saved tensors; ZB-H1's and
    // DualPipe's orders say which wait for W: DualPipe's only when P / 2 + k + 1 chunks are left,
    // k + 1 of them (dualpipe.py's steps 6 and 7). The formula's layer keeps 34 sbh + 5 as^2b
    // bytes with nothing recomputed and 34 sbh under selective recomputation (more than W's 32.1
    // sbh), 2 sbh under full (less).
    for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
        const ActivationTables t =
            activation_tables(m, s, 1, DType::bf16, ActivationModel::korthikanti);
        const Workload w = make_workload(m, Settings{}.recipe, s, 1, mode, params, t);
        const Count kept = w.layers[0].kept.on_rank(whole, V), read = reads.on_rank(whole, V);
        const Count either = std::max(kept, read);
        CAPTURE(recompute_name(mode));
        CHECK((kept > read) == (mode != Recompute::full));
        const auto others = [&](Schedule schedule, std::uint64_t stage) {
            const Parallelism p = pipeline(4, 8, schedule);
            return stage_inputs(w, p, stage_facts(w, p, stage)).other_microbatches;
        };
        CHECK(others(Schedule::one_f_one_b, 0) == Count(3 * 8) * kept);
        CHECK(others(Schedule::zb_v, 0) == Count(6 * 4) * either);  // 8 chunks, 2 running, 4 each
        for (std::uint64_t stage : {0, 1, 3}) {
            CAPTURE(stage);
            // 4 in flight, 8 layers each; stage k's first k backwards defer W (ZB-H1's order),
            // and those hold W's reads alone.
            CHECK(others(Schedule::zb_h1, stage) ==
                  Count(8 * (3 - stage)) * kept + Count(8 * stage) * read);
            if (stage == 3) continue;
            // 5 chunks in flight (P + 1), 2 running, 8 layers each; W waits with 3 (4) left of
            // stage 0 (1), 1 (2) of them waiting.
            CHECK(others(Schedule::dualpipe, stage) ==
                  std::max(Count(3 * 8) * kept, Count(8 * (stage + 1)) * read));
        }
    }
}

TEST_CASE(
    "partial recomputation reruns the first N layers of each model chunk once per micro-batch, "
    "whatever the schedule",
    "[schedule][recompute]") {
    const Architecture m = fixtures::llama_7b();
    const Workload w = llama_7b_workload(Recompute::full);
    using Row =
        std::tuple<Schedule, std::uint64_t, std::uint64_t>;  // schedule, vpp, the model's chunks
    for (const auto& [schedule, vpp, chunks] :
         {Row{Schedule::one_f_one_b, 1, 4}, Row{Schedule::interleaved, 2, 8},
          Row{Schedule::zb_h1, 1, 4}, Row{Schedule::zb_v, 1, 8},
          // DualPipe keeps each of the 4 stages twice; a micro-batch runs one copy.
          Row{Schedule::dualpipe, 1, 4}}) {
        Parallelism p = pipeline(4, 8, schedule);
        p.vpp = vpp;
        CHECK(model_chunks(p) == chunks);
        for (std::uint64_t n : {1, 2, 3}) {
            p.recompute_layers = n;
            CAPTURE(schedule_name(schedule), n);
            CHECK(recomputed_layers(w, p)[0] == chunks * n);
        }
    }
}

TEST_CASE(
    "a pipeline stage holds what the CPU pipeline runs measured: received inputs, its own rotary "
    "tables, masks",
    "[schedule][pipeline]") {
    // validation/results/cpu-pipeline-schedules.json: each term by hand on LLaMA 7B's shape
    // (RMSNorm, rotary) and GPT-2's (LayerNorm, which keeps its input: nothing received is extra).
    const std::uint64_t s = 1024;
    for (const Architecture& m : {fixtures::llama_7b(), fixtures::gpt2_small()}) {
        const bool rms = m.norm == Norm::rmsnorm;
        const auto params = parameter_splits(parameter_table(m), m.vocab);
        const ActivationTables t =
            activation_tables(m, s, 1, DType::bf16, ActivationModel::architecture);
        const Count stream = Count(s) * m.hidden * 2,
                    rotary = rms ? Count(2) * s * m.rotary_dim() * 2 : Count(0);
        const Count mask = Count(s) * s * 2;  // eager attention's, built once per forward
        CAPTURE(m.name);
        for (Recompute mode : {Recompute::none, Recompute::full}) {
            const Workload w = make_workload(m, Settings{}.recipe, s, 1, mode, params, t);
            CHECK(w.stage_side.on_rank(Parallelism{}, m.vocab) == rotary);
            const Parallelism p = pipeline(4, 8, Schedule::one_f_one_b);
            for (std::uint64_t stage : {0, 1, 3}) {
                const StageFacts f = stage_facts(w, p, stage);
                const TimelineInputs in = stage_inputs(w, p, f);
                CAPTURE(recompute_name(mode), stage);
                // Received: a stage after the first, unless its first layer keeps the tensor
                // (LayerNorm, checkpoint).
                const bool received = stage > 0 && rms && mode == Recompute::none;
                const Count embedding_side =
                    stage == 0 ? Count(f.in_flight) * w.input_side.on_rank(p, m.vocab) : Count(0);
                CHECK(in.input_side_kept ==
                      embedding_side +
                          Count(f.in_flight) * (rotary + (received ? stream : Count(0))));
                // Under recomputation each other micro-batch in flight keeps its mask.
                const Count per_microbatch =
                    Count(f.layers.layers) * w.layers[0].kept.on_rank(p, m.vocab);
                CHECK(in.other_microbatches ==
                      Count(f.in_flight - 1) *
                          (per_microbatch + (mode == Recompute::full ? mask : Count(0))));
            }
        }
    }
}

TEST_CASE(
    "under a schedule deferring W, a backward step holds the W reads of its own layer and those "
    "its B has passed",
    "[schedule][pipeline]") {
    const Architecture m = fixtures::llama_7b();
    const Workload w = llama_7b_workload(Recompute::full);
    const Count reads = w.weight_pass_reads[0].on_rank(Parallelism{}, m.vocab);
    // ZB-H1's stage 0 runs whole backwards.
    using Row = std::pair<Schedule, std::uint64_t>;  // the schedule, a stage
    for (const auto& [schedule, stage] :
         {Row{Schedule::one_f_one_b, 3}, Row{Schedule::zb_h1, 3}, Row{Schedule::zb_h1, 0}}) {
        const Parallelism p = pipeline(4, 8, schedule);
        const TimelineInputs in = stage_inputs(w, p, stage_facts(w, p, stage));
        TimelineInputs none = in;
        for (LayerInputs& layer : none.layer) layer.weight_reads = 0;
        const bool defers = schedule == Schedule::zb_h1 && stage > 0;
        for (std::uint64_t position = 1; position <= in.layers; ++position) {
            CAPTURE(schedule_name(schedule), stage, position);
            const Count with = step_at(in, Phase::backward, position).bytes.kept_activations;
            const Count without = step_at(none, Phase::backward, position).bytes.kept_activations;
            CHECK(with == without + (defers ? Count(in.layers - position + 1) * reads : Count(0)));
        }
    }
}

TEST_CASE(
    "interleaved: at its chunk c the running micro-batch's later chunks are other micro-batches' "
    "instead",
    "[schedule][pipeline]") {
    // Measured (validation/results/cpu-pipeline-schedules.json, interleaved under full
    // recomputation): in steady state the most chunks stay in flight while the running
    // micro-batch's later chunks are not, so at its first chunk another micro-batch's chunk (its
    // checkpoints and its mask) stands in each such place.
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t s = 1024;
    const Workload w = llama_7b_workload(Recompute::full, ActivationModel::architecture, s);
    Parallelism p = pipeline(4, 8, Schedule::interleaved);
    p.vpp = 2;
    const TimelineInputs in = stage_inputs(w, p, stage_facts(w, p, 1));
    const Count mask = Count(s) * s * 2;
    REQUIRE(in.chunk == 4);
    CHECK(in.spare_chunks == 1);
    CHECK(in.spare_chunk == Count(4) * w.layers[0].kept.on_rank(p, m.vocab) + mask);
    // Each chunk's forward built its own mask, which that chunk's checkpoints keep.
    CHECK(in.recompute_buffers == Count(2) * mask);
    // Backward at the first chunk's last layer holds the spare chunk; at the second chunk's first,
    // none.
    TimelineInputs none = in;
    none.spare_chunks = 0;
    for (std::uint64_t position : {4, 5}) {
        const Count with = step_at(in, Phase::backward, position).bytes.kept_activations;
        const Count without = step_at(none, Phase::backward, position).bytes.kept_activations;
        CAPTURE(position);
        CHECK(with == without + (position <= 4 ? in.spare_chunk : Count(0)));
    }
    // One chunk a rank (1F1B): nothing of the kind.
    const Parallelism one = pipeline(4, 8, Schedule::one_f_one_b);
    CHECK(stage_inputs(w, one, stage_facts(w, one, 1)).spare_chunks == 0);
}
