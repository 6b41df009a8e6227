// Uneven pipeline stages under every schedule (issue 36, item 2): the first and last stages' own
// layer counts, the split memcalc assumes where pp does not divide the layers, and each stage's
// peak from its own layers and micro-batches in flight.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/plan.hpp"
#include "model_file.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
Parallelism layout(Schedule s, std::uint64_t pp, std::uint64_t vpp, std::uint64_t first,
                   std::uint64_t last) {
    Parallelism p;
    p.pp = pp, p.vpp = vpp, p.schedule = s, p.microbatches = 2 * pp;
    p.first_stage_layers = first, p.last_stage_layers = last;
    return p;
}

Settings at_1024(const Parallelism& p, Recompute mode = Recompute::none) {
    Settings s;
    s.seq = 1024, s.parallel = p, s.recompute = mode;
    return s;
}

/// The most kept activations at any step of a rank's timeline.
Count most_kept(const RankReport& rank) {
    Count most;
    for (const Step& s : rank.timeline()) most = std::max(most, s.bytes.kept_activations);
    return most;
}

/// Each layer's copies over the ranks: every layer of 1..L once per copy the schedule keeps.
void check_every_layer_placed(const Report& r, std::uint64_t copies) {
    std::map<std::uint64_t, std::uint64_t> seen;
    for (const RankReport& k : r.ranks)
        for (std::uint64_t id : k.layer_ids) ++seen[id];
    REQUIRE(seen.size() == r.model.layers);
    CHECK(seen.begin()->first == 1);
    CHECK(seen.rbegin()->first == r.model.layers);
    for (const auto& [id, n] : seen) {
        CAPTURE(id);
        CHECK(n == copies);
    }
}
}  // namespace

TEST_CASE("uneven stages under every schedule: each rank runs its own pieces",
          "[uneven][pipeline]") {
    const Architecture m = fixtures::llama_7b();  // 32 layers
    using Row = std::tuple<Parallelism, std::vector<std::uint64_t>>;
    for (const auto& [p, counts] : {
             Row{layout(Schedule::one_f_one_b, 4, 1, 5, 9), {5, 9, 9, 9}},
             Row{layout(Schedule::zb_h1, 4, 1, 5, 9), {5, 9, 9, 9}},
             // Megatron-LM: the first rank's 6 layers in vpp = 2 chunks of 3, the middle 8 in 4s.
             Row{layout(Schedule::interleaved, 4, 2, 6, 10), {6, 8, 8, 10}},
             // ZB-V: 8 model chunks, the first and the last (1 layer each) both on rank 0.
             Row{layout(Schedule::zb_v, 4, 1, 1, 1), {2, 10, 10, 10}},
             // DualPipe: rank k holds stages k and 3 - k, so ranks 0 and 3 the first and last.
             Row{layout(Schedule::dualpipe, 4, 1, 2, 6), {8, 24, 24, 8}},
         }) {
        CAPTURE(schedule_name(p.pipeline_schedule()));
        const Estimator e(m);
        const Report r = e.estimate(at_1024(p));
        CHECK_FALSE(r.stage_split_assumed);
        REQUIRE(r.ranks.size() == counts.size());
        for (std::size_t k = 0; k < counts.size(); ++k) {
            CAPTURE(k);
            CHECK(r.ranks[k].layer_ids.size() == counts[k]);
            CHECK(stage_layer_count(p, m.layers, k) == counts[k]);
        }
        const std::uint64_t copies = schedule_row(p).parameter_copies;
        check_every_layer_placed(r, copies);
        Count parameters;
        for (const RankReport& k : r.ranks) parameters += k.parameters;
        CHECK(parameters == Count(copies) * r.parameter_count);
        // The closed form weighs the stages that can hold the most: it names the same stage and
        // peak as every rank's built timeline.
        for (Recompute mode : {Recompute::none, Recompute::full}) {
            const Report built = e.estimate(at_1024(p, mode));
            const Summary closed = e.summary(at_1024(p, mode));
            CAPTURE(recompute_name(mode));
            CHECK(closed.peak_stage == built.busiest().stage);
            CHECK(closed.peak.bytes.total() == built.peak_step().bytes.total());
        }
    }
}

TEST_CASE("uneven stages: a stage's kept activations are its layers x one layer's x in flight",
          "[uneven][pipeline]") {
    // Two layouts that differ only in the middle stages' layers: stage 1's most kept activations
    // differ by the layers it gained, times one layer's, times its micro-batches in flight; under
    // ZB-H1 the k of them that wait for W (stage k) hold one layer's W reads instead.
    const Architecture m = fixtures::llama_7b();
    const Estimator e(m);
    const Count reads = weight_pass_reads(m, weight_pass_widths(parameter_table(m), 0), 0, 1024, 2)
                            .on_rank(Parallelism{}, m.vocab);
    using Row = std::tuple<Schedule, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    for (const auto& [schedule, pp, first_a, first_b, stage] : {
             Row{Schedule::one_f_one_b, 4, 2, 8, 1},
             Row{Schedule::one_f_one_b, 4, 2, 8, 2},
             Row{Schedule::one_f_one_b, 8, 1, 4, 3},
             Row{Schedule::zb_h1, 4, 2, 8, 1},
         }) {
        CAPTURE(schedule_name(schedule), pp, stage);
        const Parallelism a = layout(schedule, pp, 1, first_a, first_a),
                          b = layout(schedule, pp, 1, first_b, first_b);
        const Report ra = e.estimate(at_1024(a)), rb = e.estimate(at_1024(b));
        const std::uint64_t gained =
            ra.ranks[stage].layer_ids.size() - rb.ranks[stage].layer_ids.size();
        CHECK(gained == 2 * (first_b - first_a) / (pp - 2));
        const Count one_layer = Count(ra.kept_activations.value() / m.layers);
        CHECK(ra.ranks[stage].in_flight == in_flight(a, stage));
        const std::uint64_t waiting = schedule == Schedule::zb_h1 ? stage : 0;
        const Count per_layer =
            one_layer * Count(ra.ranks[stage].in_flight - waiting) + reads * Count(waiting);
        CHECK(most_kept(ra.ranks[stage]).value() - most_kept(rb.ranks[stage]).value() ==
              (Count(gained) * per_layer).value());
    }
}

TEST_CASE("pp that does not divide the layers: the estimate splits as plan does, and says so",
          "[uneven][pipeline]") {
    const Architecture m = fixtures::llama_7b();
    for (Schedule s : {Schedule::one_f_one_b, Schedule::zb_h1, Schedule::dualpipe}) {
        CAPTURE(schedule_name(s));
        Parallelism p = layout(s, 6, 1, 0, 0);  // 32 layers over 6: 4 + 4 x 6 + 4
        const Report r = estimate(m, at_1024(p));
        CHECK(r.stage_split_assumed);
        const auto split = stage_split(m.layers, 6, 0, 0);
        REQUIRE(split);
        CHECK(r.settings.parallel.first_stage_layers == split->first);
        CHECK(r.settings.parallel.last_stage_layers == split->second);
        CHECK(piece_layers(r.settings.parallel, m.layers, 0) == 4);
        CHECK(piece_layers(r.settings.parallel, m.layers, 1) == 6);
        check_every_layer_placed(r, schedule_row(p).parameter_copies);
        // An even layout assumes nothing.
        p.pp = 4;
        CHECK_FALSE(estimate(m, at_1024(p)).stage_split_assumed);
    }
}

TEST_CASE("DeepSeek-V3's 61 layers on 16 stages, under 1F1B and DualPipe", "[uneven][pipeline]") {
    const Architecture m = cli::load_preset("deepseek-v3").architecture;
    REQUIRE(m.layers == 61);
    for (Schedule s : {Schedule::one_f_one_b, Schedule::dualpipe}) {
        CAPTURE(schedule_name(s));
        Settings settings = at_1024(layout(s, 16, 1, 0, 0), Recompute::full);
        settings.activations = ActivationModel::architecture;
        const Report r = estimate(m, settings);
        CHECK(r.stage_split_assumed);
        CHECK(r.settings.parallel.first_stage_layers == 2);
        CHECK(r.settings.parallel.last_stage_layers == 3);
        check_every_layer_placed(r, schedule_row(settings.parallel).parameter_copies);
        const bool dual = s == Schedule::dualpipe;
        // DualPipe: rank 0 holds stages 0 and 15 (2 + 3 layers), the others two of 4.
        CHECK(r.ranks[0].layer_ids.size() == (dual ? 5 : 2));
        CHECK(r.ranks[1].layer_ids.size() == (dual ? 8 : 4));
        CHECK(r.ranks[15].layer_ids.size() == (dual ? 5 : 3));
        if (dual) CHECK(r.ranks[0].layer_ids.back() == 61);
        const Summary closed = Estimator(m).summary(settings);
        CHECK(closed.peak_stage == r.busiest().stage);
        CHECK(closed.peak.bytes.total() == r.peak_step().bytes.total());
    }
}

TEST_CASE("the program: an assumed stage split in the table and JSON, and bad stage counts",
          "[uneven][cli]") {
    const std::string v3 = "--preset deepseek-v3 --seq 1024 --recompute full --pp 16 ";
    const auto json_run =
        testing::memcalc(v3 + "--schedule dualpipe --microbatches 32 --format json");
    REQUIRE(json_run.status == 0);
    const auto j = nlohmann::json::parse(json_run.out);
    CHECK(j["settings"]["parallel"]["stage_split_assumed"] == true);
    CHECK(j["settings"]["parallel"]["first_stage_layers"] == 2);
    CHECK(j["settings"]["parallel"]["last_stage_layers"] == 3);
    CHECK(j["ranks"][0]["layers"].size() == 5);
    const auto table = testing::memcalc(v3);
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out, Catch::Contains("Note on the pipeline: 16 pipeline stages do not divide "
                                          "the 61 layers; memcalc assumed 2 + 14 x 4 + 3"));
    const auto given = testing::memcalc(v3 +
                                        "--first-stage-layers 3 --last-stage-layers 2 "
                                        "--format json");
    REQUIRE(given.status == 0);
    CHECK(nlohmann::json::parse(given.out)["settings"]["parallel"]["stage_split_assumed"] == false);
    const std::string llama = "--preset llama-7b --seq 1024 --pp 4 ";
    for (const auto& [args, message] : {
             std::pair{"--first-stage-layers 30 --last-stage-layers 2",
                       "first_stage_layers (30) + last_stage_layers (2) leaves 0 of 32 layers for "
                       "the other 2 pipeline stages: at least one each"},
             std::pair{"--first-stage-layers 40", "exceeds layers (32)"},
             std::pair{"--vpp 2 --first-stage-layers 5 --last-stage-layers 5",
                       "first_stage_layers (5) must be a multiple of vpp (2)"},
             std::pair{"--schedule dualpipe --microbatches 8 --first-stage-layers 31 "
                       "--last-stage-layers 1",
                       "leaves 0 of 32 layers for the other 2 model chunks"},
         }) {
        CAPTURE(args);
        const auto bad = testing::memcalc(llama + args);
        CHECK(bad.status != 0);
        CHECK(bad.out.empty());
        CHECK_THAT(bad.err, Catch::Contains(message));
        CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
    }
}

TEST_CASE("plan searches DualPipe where pp does not divide the layers, each row as estimated",
          "[uneven][plan]") {
    // DeepSeek-V3's published layout ran its 61 layers on 16 DualPipe stages; here 13 layers on
    // pp 4 (2 + 2 x 4 + 3, as the estimate assumes), and ZB-V, whose 8 chunks take no such split.
    Architecture m = fixtures::llama_7b();
    m.layers = 13;
    PlanRequest request;
    request.gpus = 4, request.capacity = 1ULL << 40, request.base.seq = 1024,
    request.global_batch = 8;
    request.pp = {4};
    request.schedules = {Schedule::dualpipe, Schedule::zb_v};
    const std::vector<PlanRow> rows = plan(m, request);
    REQUIRE_FALSE(rows.empty());
    for (const PlanRow& row : rows) {
        const Parallelism& p = row.parallel;
        CAPTURE(schedule_name(p.schedule), p.microbatches, recompute_name(row.recompute));
        CHECK(p.schedule == Schedule::dualpipe);
        CHECK(p.first_stage_layers == 2);
        CHECK(p.last_stage_layers == 3);
        Settings s = at_1024(p, row.recompute);
        s.micro_batch = row.micro_batch;
        CHECK(row.peak.bytes() == estimate(m, s).peak_step().bytes.total());
    }
}
