// Partial recomputation (Megatron-LM's --recompute-method block --recompute-num-layers N): the
// first N layers of each stage's chunk fully recomputed, the others keeping every activation.
#include <catch2/catch.hpp>
#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/plan.hpp"
#include "run_program.hpp"
#include "step_named.hpp"

using namespace memcalc;
using fixtures::step_named;

namespace {
/// 8 layers of width 256, 4 heads, at sequence 256: under Korthikanti's formula (bf16) a layer
/// keeps 34 sbh + 5 a s^2 b = 34 x 65,536 + 5 x 4 x 65,536 = 3,538,944 bytes without recomputation,
/// and its input, 2 sbh = 131,072 bytes, under full recomputation, rebuilding the other 3,407,872.
Architecture eight_layers() {
    Architecture m;
    m.name = "eight-layers";
    m.hidden = 256, m.layers = 8, m.heads = 4, m.ffn = 1024, m.vocab = 1000, m.max_positions = 256;
    return m;
}
constexpr std::uint64_t whole = 3538944, input = 131072, rebuilt = whole - input;

Settings partial(std::uint64_t n) {
    Settings s;
    s.seq = 256, s.recompute = Recompute::full;
    s.parallel.recompute_layers = n;
    return s;
}

using fixtures::dense_then_moe;  // two dense layers of width 2,048, then six of 8 experts
}  // namespace

TEST_CASE(
    "partial recomputation: N = 0 is none, N = layers is full, each N between keeps N inputs and "
    "the rest whole",
    "[partial_recompute]") {
    const Architecture m = eight_layers();
    Settings none = partial(0), full = partial(0);
    none.recompute = Recompute::none, none.parallel.recompute_layers.reset();
    full.parallel.recompute_layers.reset();
    const Report plain_none = estimate(m, none), plain_full = estimate(m, full);
    REQUIRE(plain_none.kept_activations == Count(8 * whole));
    REQUIRE(plain_full.kept_activations == Count(8 * input));
    for (std::uint64_t n = 0; n <= 8; ++n) {
        CAPTURE(n);
        const Report r = estimate(m, partial(n));
        CHECK(r.kept_activations == Count(n * input + (8 - n) * whole));
        // Forward 8 holds every layer's; backward k rebuilds layer k only where it was recomputed.
        CHECK(step_named(r.busiest(), "forward 8").bytes.kept_activations ==
              Count(n * input + (8 - n) * whole));
        for (std::uint64_t k = 1; k <= 8; ++k) {
            CAPTURE(k);
            CHECK(step_named(r.busiest(), "backward " + std::to_string(k))
                      .bytes.rebuilt_activations == Count(k <= n ? rebuilt : 0));
        }
        CHECK(r.compute.recompute ==
              Approx(plain_full.compute.recompute * static_cast<double>(n) / 8));
        if (n == 0) {
            CHECK(r.peak_step().bytes.total() == plain_none.peak_step().bytes.total());
            CHECK(r.peak_step().name() == plain_none.peak_step().name());
            CHECK(r.compute.recompute == 0);
        }
        if (n == 8) {
            CHECK(r.peak_step().bytes.total() == plain_full.peak_step().bytes.total());
            CHECK(r.peak_step().name() == plain_full.peak_step().name());
        }
        if (n > 0 && n < 8) {
            // Between the two: the peak falls as more layers are recomputed.
            CHECK(r.peak_step().bytes.total() < plain_none.peak_step().bytes.total());
            CHECK(r.peak_step().bytes.total() >= plain_full.peak_step().bytes.total());
            CHECK(r.peak_step().bytes.total() <=
                  estimate(m, partial(n - 1)).peak_step().bytes.total());
        }
    }
}

TEST_CASE("partial recomputation per stage: uneven stages, and each model chunk with vpp",
          "[partial_recompute]") {
    const Architecture m = eight_layers();
    SECTION(
        "uneven stages 2, 4, 2: N = 3 recomputes both layers of the short stages, 3 of the middle "
        "one's 4") {
        Settings s = partial(3);
        s.parallel.pp = 3, s.parallel.first_stage_layers = 2, s.parallel.last_stage_layers = 2;
        const Report r = estimate(m, s);
        CHECK(r.kept_activations == Count(7 * input + 1 * whole));
        CHECK(r.compute.recompute == Approx(estimate(m, partial(8)).compute.recompute * 7 / 8));
        // Stage 1 (layers 3..6) holds 2 micro-batches (1F1B: min(P - k, M)): at forward 6, its own
        // and one more.
        const RankReport& middle = r.ranks[1];
        REQUIRE(middle.in_flight == 2);
        CHECK(step_named(middle, "forward 6").bytes.kept_activations ==
              Count(2 * (3 * input + 1 * whole)));
        CHECK(step_named(middle, "backward 6").bytes.rebuilt_activations == Count(0));
        CHECK(step_named(middle, "backward 5").bytes.rebuilt_activations == Count(rebuilt));
        // Stage 0 (layers 1, 2): 3 micro-batches of two checkpoints each.
        CHECK(step_named(r.ranks[0], "forward 2").bytes.kept_activations == Count(3 * 2 * input));
    }
    SECTION("pp 2 x vpp 2, chunks of 2: N = 1 recomputes the first layer of each chunk") {
        Settings s = partial(1);
        s.parallel.pp = 2, s.parallel.vpp = 2;
        const Report r = estimate(m, s);
        CHECK(r.kept_activations == Count(4 * input + 4 * whole));
        CHECK(r.compute.recompute == Approx(estimate(m, partial(8)).compute.recompute / 2));
        // Stage 0 runs layers 1, 2 (chunk 0) and 5, 6 (chunk 2); it holds 4 chunks at its first
        // backward, so 2 chunks of other micro-batches, each one checkpoint and one whole layer.
        const RankReport& first = r.ranks[0];
        REQUIRE(first.in_flight == 4);
        CHECK(step_named(first, "forward 6").bytes.kept_activations ==
              Count(2 * (input + whole) + 2 * (input + whole)));
        CHECK(step_named(first, "backward 5").bytes.rebuilt_activations == Count(rebuilt));
        CHECK(step_named(first, "backward 6").bytes.rebuilt_activations == Count(0));
        CHECK(step_named(first, "backward 1").bytes.rebuilt_activations == Count(rebuilt));
        CHECK(step_named(first, "backward 2").bytes.rebuilt_activations == Count(0));
    }
}

TEST_CASE("partial recomputation of mixed kinds: the first N of the stage, whatever their kind",
          "[partial_recompute][layer_kinds]") {
    const Architecture mixed = dense_then_moe();
    const Architecture dense = mixed.kind_view(0), moe = mixed.kind_view(1);
    for (auto activations : {ActivationModel::korthikanti, ActivationModel::architecture}) {
        CAPTURE(activation_model_name(activations));
        Settings s;
        s.seq = 1024, s.activations = activations, s.recompute = Recompute::full;
        s.parallel.pp = 2, s.parallel.recompute_layers = 3;
        Settings each = s;  // every layer of one kind, all recomputed
        each.parallel.recompute_layers.reset();
        const Report r = estimate(mixed, s), d = estimate(dense, each), e = estimate(moe, each);
        // Stage 0 runs dense 1, 2 and MoE 3 recomputed, MoE 4 not; stage 1 MoE 5, 6, 7 recomputed,
        // 8 not.
        const Recompute full = Recompute::full, none = Recompute::none;
        CHECK(r.kept_activations == Count(2) * d.layer.kept(full) + Count(4) * e.layer.kept(full) +
                                        Count(2) * e.layer.kept(none));
        CHECK(r.compute.recompute ==
              Approx(2 * d.compute.recompute / 8 + 4 * e.compute.recompute / 8));
        for (const RankReport& rank : r.ranks)
            for (const Step& step : rank.timeline()) {
                if (step.phase != Phase::backward) continue;
                CAPTURE(step.name());
                const bool recomputed = step.layer != 4 && step.layer != 8;
                const Report& own = step.layer <= 2 ? d : e;
                CHECK(step.bytes.rebuilt_activations ==
                      (recomputed ? own.layer.rebuilt(full) : Count(0)));
            }
        // Forward 2..4 add a dense checkpoint, an MoE one and a whole MoE layer; under
        // Korthikanti's formula (no embedding side) stage 0's forward 4 holds two such
        // micro-batches (1F1B), each with dense 1's too.
        const Count first = step_named(r.ranks[0], "forward 1").bytes.kept_activations;
        const Count fourth = step_named(r.ranks[0], "forward 4").bytes.kept_activations;
        CHECK(fourth == first + d.layer.kept(full) + e.layer.kept(full) + e.layer.kept(none));
        if (activations == ActivationModel::korthikanti)
            CHECK(fourth == Count(2) * (Count(2) * d.layer.kept(full) + e.layer.kept(full) +
                                        e.layer.kept(none)));
    }
}

TEST_CASE("partial recomputation: the closed-form peak is the timelines' over layouts, kinds and N",
          "[partial_recompute]") {
    Architecture m = dense_then_moe();
    m.layers = 16;
    m.layer_pattern = {{0, 3}, {1, 5}, {0, 1}, {1, 7}};
    const std::uint64_t pp = GENERATE(1, 2, 4), vpp = GENERATE(1, 2);
    if (vpp > 1 && pp == 1) return;
    const bool mixed = GENERATE(false, true);
    const Architecture model = mixed ? m : m.kind_view(1);
    const std::uint64_t chunk = 16 / (pp * vpp);
    for (std::uint64_t n = 0; n <= chunk; ++n) {
        Settings s;
        s.seq = 1024, s.activations = ActivationModel::architecture, s.recompute = Recompute::full;
        s.parallel.pp = pp, s.parallel.vpp = vpp, s.parallel.dp = 2, s.parallel.zero = 1,
        s.parallel.microbatches = 2 * pp;
        s.parallel.recompute_layers = n;
        CAPTURE(pp, vpp, mixed, n);
        const Report r = estimate(model, s);
        for (const RankReport& rank : r.ranks) {  // the closed form's peak, the timeline's
            const Step& built = rank.timeline()[rank.peak()];
            CHECK(rank.peak_step().bytes.total() == built.bytes.total());
            CHECK(rank.peak_step().name() == built.name());
        }
        const Summary sum = Estimator(model).summary(s);
        CHECK(sum.peak.bytes.total() == r.peak_step().bytes.total());
        CHECK(sum.kept_activations == r.kept_activations);
    }
}

TEST_CASE("partial recomputation's errors name the value", "[partial_recompute]") {
    const Architecture m = eight_layers();
    Settings s = partial(9);
    CHECK_THROWS_WITH(estimate(m, s), "recompute_layers (9) exceeds the 8 layers of the model");
    s = partial(5);
    s.parallel.pp = 2;
    CHECK_THROWS_WITH(estimate(m, s),
                      "recompute_layers (5) exceeds the 4 layers of the largest pipeline stage");
    s.parallel.vpp = 2;
    s.parallel.recompute_layers = 3;
    CHECK_THROWS_WITH(estimate(m, s), "recompute_layers (3) exceeds the 2 layers of a model chunk");
    s = partial(2);
    for (Recompute mode : {Recompute::none, Recompute::selective}) {
        s.recompute = mode;
        CHECK_THROWS_WITH(estimate(m, s),
                          std::string("recompute_layers (2) needs recompute full (got ") +
                              recompute_name(mode) + ")");
    }
    // Through the program: one line naming the value, a non-zero status.
    const auto selective =
        testing::memcalc("--preset llama-7b --seq 2048 --recompute selective --recompute-layers 4");
    CHECK(selective.status != 0);
    CHECK(selective.err ==
          "memcalc: --recompute-layers 4 needs --recompute full (got 'selective')\n");
    const auto many = testing::memcalc(
        "--preset llama-7b --seq 2048 --recompute full --pp 4 --recompute-layers 9");
    CHECK(many.status != 0);
    CHECK(many.err ==
          "memcalc: recompute_layers (9) exceeds the 8 layers of the largest pipeline stage\n");
    const auto word =
        testing::memcalc("--preset llama-7b --seq 2048 --recompute full --recompute-layers three");
    CHECK(word.status != 0);
    CHECK(word.err ==
          "memcalc: --recompute-layers must be a whole number of layers or all (got 'three')\n");
    const auto all = testing::memcalc(
        "--preset llama-7b --seq 2048 --recompute selective --recompute-layers all");
    CHECK(all.status != 0);
    CHECK(all.err == "memcalc: --recompute-layers all needs --recompute full (got 'selective')\n");
    // An estimate's all is full recomputation itself.
    CHECK(testing::memcalc("--preset llama-7b --seq 2048 --recompute full --recompute-layers all")
              .out == testing::memcalc("--preset llama-7b --seq 2048 --recompute full").out);
    const auto plan = testing::memcalc(
        "plan --preset llama-7b --seq 2048 --gpus 8 --global-batch 8 --device-memory 80GB "
        "--recompute none,selective --recompute-layers 2");
    CHECK(plan.status != 0);
    CHECK(plan.err ==
          "memcalc: --recompute-layers 2 needs --recompute full (got 'none,selective')\n");
}

TEST_CASE("the program reports recompute_layers in its JSON, CSV and table",
          "[partial_recompute][cli]") {
    const std::string run =
        "--preset llama-7b --seq 4096 --recompute full --pp 4 --recompute-layers 3";
    const auto json = nlohmann::json::parse(testing::memcalc(run + " --format json").out);
    CHECK(json["settings"]["recompute_layers"] == 3);
    CHECK(json["settings"]["recompute"] == "full");
    const auto plain =
        nlohmann::json::parse(testing::memcalc("--preset llama-7b --seq 4096 --format json").out);
    CHECK(plain["settings"]["recompute_layers"].is_null());
    const std::string csv = testing::memcalc(run + " --format csv").out;
    const std::string header = csv.substr(0, csv.find('\n'));
    const std::string columns =
        ",last_stage_layers,training,recompute_layers,usable_bytes,fits,spare_bytes";
    CHECK(header.substr(header.size() - columns.size()) == columns);
    CHECK(csv.substr(csv.size() - 6) == ",3,,,\n");
    CHECK(testing::memcalc(run).out.find("recompute full (first 3 layers of each stage)") !=
          std::string::npos);
}

TEST_CASE(
    "plan: the fewest recomputed layers that fit (N fits, N - 1 does not), ranked by its time",
    "[partial_recompute][plan]") {
    const Architecture m = eight_layers();
    PlanRequest request;
    request.base.seq = 256, request.gpus = 1, request.global_batch = 4;
    request.micro_batches = {1};
    request.modes = {Recompute::none, Recompute::full};
    request.gpu = Gpu{};
    request.gpu->name = "round", request.gpu->memory = 80000000000ULL,
    request.gpu->peak_bf16_flops = 100'000'000'000'000ULL;
    request.gpu->intra_node_bandwidth = 100'000'000'000ULL,
    request.gpu->inter_node_bandwidth = 10'000'000'000ULL;
    request.gpu->gpus_per_node = 8;
    // Capacities between full recomputation's peak and none's: each asks for a different N.
    Settings s;
    s.seq = 256, s.parallel.microbatches = 4;
    const auto peak = [&](Recompute mode, std::optional<std::uint64_t> n) {
        Settings with = s;
        with.recompute = mode, with.parallel.recompute_layers = n;
        return estimate(m, with).peak_step().bytes.total();
    };
    const Count none = peak(Recompute::none, std::nullopt),
                full = peak(Recompute::full, std::nullopt);
    REQUIRE(full < none);
    std::vector<std::uint64_t> found;
    for (std::uint64_t step = 1; step <= 3; ++step) {
        request.capacity = Count(full.value() + (none.value() - full.value()) * step / 4);
        CAPTURE(request.capacity.value());
        const auto rows = plan(m, request);
        const auto it = std::find_if(rows.begin(), rows.end(), [](const PlanRow& r) {
            return r.parallel.recompute_layers.has_value();
        });
        REQUIRE(it != rows.end());
        const std::uint64_t n = *it->parallel.recompute_layers;
        CHECK(it->recompute == Recompute::full);
        CHECK(it->fits);
        CHECK(peak(Recompute::full, n) <= request.capacity);
        CHECK(peak(Recompute::full, n - 1) > request.capacity);
        CHECK(it->peak.bytes() == peak(Recompute::full, n));
        // It ranks first: fewer layers rerun their forward than under full recomputation.
        CHECK(it == rows.begin());
        const auto plain = std::find_if(rows.begin(), rows.end(), [](const PlanRow& r) {
            return r.recompute == Recompute::full && !r.parallel.recompute_layers;
        });
        REQUIRE(plain != rows.end());
        CHECK(it->recompute_fraction ==
              Approx(plain->recompute_fraction * static_cast<double>(n) / 8));
        REQUIRE(it->time);
        CHECK(it->time->seconds() < plain->time->seconds());
        found.push_back(n);
    }
    CHECK(
        std::is_sorted(found.begin(), found.end(), std::greater<>()));  // more memory, fewer layers
    CHECK(found.front() > found.back());
    // Where none fits, no partial layout is searched; pinned, every full row takes N.
    request.capacity = Count(none.value() + 1);
    for (const PlanRow& r : plan(m, request)) CHECK_FALSE(r.parallel.recompute_layers);
    // A program that checkpoints every layer has no fewer to choose: no partial row, and full's
    // own row is the one that fits.
    request.capacity = Count(full.value() + (none.value() - full.value()) / 2);
    request.partial_recompute = false;
    const auto every = plan(m, request);
    REQUIRE(!every.empty());
    for (const PlanRow& r : every) CHECK_FALSE(r.parallel.recompute_layers);
    CHECK(every.front().recompute == Recompute::full);
    CHECK(every.front().fits);
    request.partial_recompute = true;
    request.recompute_layers = 2;
    request.capacity = Count(full.value() + (none.value() - full.value()) / 4);
    const auto pinned = plan(m, request);
    REQUIRE(!pinned.empty());
    for (const PlanRow& r : pinned) {
        CHECK(r.recompute == Recompute::full);
        CHECK(r.parallel.recompute_layers == std::optional<std::uint64_t>(2));
        CHECK(r.peak.bytes() == peak(Recompute::full, 2));
    }
    // Through the program: the row's recompute_layers, appended to its JSON and CSV.
    const std::string run =
        "plan --preset llama-7b --seq 4096 --gpus 8 --global-batch 16 --pp 2 --tp 4 --zero 0 "
        "--recompute none,full --device-memory 40GB -b 1";
    const auto j = nlohmann::json::parse(testing::memcalc(run + " --format json").out);
    REQUIRE(!j["layouts"].empty());
    CHECK(j["layouts"][0]["recompute_layers"].is_number());
    const std::string csv = testing::memcalc(run + " --format csv").out;
    CHECK(csv.substr(0, csv.find('\n')).find(",offload,schedule,recompute_layers") !=
          std::string::npos);
    // --recompute-layers all: every full row recomputes every layer.
    const auto all = nlohmann::json::parse(
        testing::memcalc(run + " --recompute-layers all --format json --top 100").out);
    REQUIRE(!all["layouts"].empty());
    for (const auto& layout : all["layouts"]) CHECK(layout["recompute_layers"].is_null());
    CHECK(std::any_of(all["layouts"].begin(), all["layouts"].end(),
                      [](const auto& l) { return l["recompute"] == "full"; }));
}

TEST_CASE("a stage's layers split into runs where the recomputed ones end",
          "[partial_recompute][layer_kinds]") {
    Architecture m = dense_then_moe();
    m.layers = 16;
    m.layer_pattern = {
        {0, 3}, {1, 5}, {0, 1}, {1, 7}};  // kinds of layers 1..16: 000 11111 0 1111111
    const LayerPattern pattern(m);
    // Interleaved, pp 4 and chunks of 2: stage 1 runs layers 3, 4 and 11, 12; the first of each
    // chunk recomputed.
    StageLayers interleaved;
    interleaved.layers = 4, interleaved.chunk = 2, interleaved.stage = 1;
    interleaved.pass = 8, interleaved.first_layer = 2;  // each pass 4 chunks of 2
    interleaved.with(pattern).recomputing(1);
    CHECK(interleaved.counts(4) == KindCounts{1, 3, 0, 0});
    CHECK(interleaved.recomputed_counts(4) == KindCounts{1, 1, 0, 0});
    CHECK(interleaved.recomputed_counts(2) == KindCounts{1, 0, 0, 0});
    CHECK(interleaved.recomputed_counts(3) == KindCounts{1, 1, 0, 0});
    CHECK(interleaved.run_end(3) == 3);  // layers 11 and 12 are alike, but only 11 is recomputed
    CHECK(interleaved.run_start(4) == 4);
    CHECK(interleaved.recomputed_at(3));
    CHECK_FALSE(interleaved.recomputed_at(4));
    // One kind, one chunk of 8, the first 3 recomputed: runs 1..3 and 4..8.
    StageLayers one;
    one.layers = 8, one.chunk = 8;
    one.recomputing(3);
    CHECK_FALSE(one.uniform());
    CHECK(one.run_end(1) == 3);
    CHECK(one.run_start(3) == 1);
    CHECK(one.run_end(4) == 8);
    CHECK(one.run_start(8) == 4);
    CHECK(one.recomputed_counts(5) == KindCounts{3, 0, 0, 0});
    CHECK(one.counts(5) == KindCounts{5, 0, 0, 0});
    one.recomputing(8);  // every layer: one run again
    CHECK(one.uniform());
}

TEST_CASE(
    "on a CPU each checkpoint keeps the generator state it restores: one a layer, one a recomputed "
    "module",
    "[partial_recompute][checkpoint]") {
    const Architecture m = GENERATE(eight_layers(), fixtures::gpt2_small());
    CAPTURE(m.name);
    constexpr std::uint64_t state = 5056;  // torch.get_rng_state().numel(), torch 1.13
    const ModuleSet core = ModuleSet::of({Module::core_attn}),
                    core_and_mlp = ModuleSet::of({Module::core_attn, Module::mlp});
    for (const auto& [mode, modules, checkpoints] : {std::tuple{Recompute::none, core, 0u},
                                                     {Recompute::full, core, 1u},
                                                     {Recompute::selective, core, 1u},
                                                     {Recompute::selective, core_and_mlp, 2u}}) {
        for (const Platform platform : {Platform::cuda, Platform::cpu}) {
            CAPTURE(static_cast<int>(mode), checkpoints, platform == Platform::cpu);
            Settings s;
            s.seq = 128, s.recompute = mode, s.activations = ActivationModel::architecture,
            s.recompute_modules = modules;
            s.framework.platform = platform, s.framework.attention = Attention::eager;
            const Report report = estimate(m, s);
            const RankReport& r = report.busiest();
            // Forward 3 holds one layer's more than forward 2: its saved tensors, and on a CPU its
            // checkpoints' states.
            const std::uint64_t layer = step_named(r, "forward 3").bytes.kept_activations.value() -
                                        step_named(r, "forward 2").bytes.kept_activations.value();
            const std::uint64_t saved =
                architecture_layer(m, 128, 1, DType::bf16, Attention::eager, platform, modules)
                    .kept(mode)
                    .value();
            CHECK(layer == saved + (platform == Platform::cpu ? checkpoints * state : 0));
        }
    }
}
