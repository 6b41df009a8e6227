// Models as kinds of layer in a pattern of runs: one kind, or the same kind split into runs, gives
// every preset's figures; a model of two kinds is each kind's sum; its timeline rebuilds each layer
// as its kind; the closed form stays allocation-free; model files give kinds; bad patterns are
// named.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <random>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"
#include "model_file.hpp"
#include "run_program.hpp"

using namespace memcalc;

// A sanitizer brings its own operator new, so only an unsanitized build counts allocations.
#if defined(__SANITIZE_ADDRESS__)
#define MEMCALC_COUNTS_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer) || \
    __has_feature(thread_sanitizer)
#define MEMCALC_COUNTS_ALLOCATIONS 0
#endif
#endif
#ifndef MEMCALC_COUNTS_ALLOCATIONS
#define MEMCALC_COUNTS_ALLOCATIONS 1
#endif

namespace {
std::atomic<std::uint64_t> allocations{0};
}  // namespace

#if MEMCALC_COUNTS_ALLOCATIONS
// Every allocation of the test program is counted, so a test can say a call made none. (GCC cannot
// see that this new and delete pair malloc with free.)
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(std::size_t n) {
    ++allocations;
    if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
    throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

namespace {

/// Every figure a report gives, step by step, is the same.
void require_same(const Report& a, const Report& b) {
    REQUIRE(a.parameter_count == b.parameter_count);
    CHECK(a.activations == b.activations);
    CHECK(a.kept_activations == b.kept_activations);
    CHECK(a.compute.step == b.compute.step);
    CHECK(a.compute.recompute == b.compute.recompute);
    REQUIRE(a.ranks.size() == b.ranks.size());
    CHECK(a.most_loaded == b.most_loaded);
    for (std::size_t r = 0; r < a.ranks.size(); ++r) {
        CHECK(a.ranks[r].parameters == b.ranks[r].parameters);
        const auto& x = a.ranks[r].timeline();
        const auto& y = b.ranks[r].timeline();
        REQUIRE(x.size() == y.size());
        for (std::size_t i = 0; i < x.size(); ++i) {
            CHECK(x[i].name() == y[i].name());
            CHECK(x[i].bytes.total() == y[i].bytes.total());
        }
        CHECK(a.ranks[r].peak_step().name() == b.ranks[r].peak_step().name());
    }
}

/// The same model with every layer of kinds that change nothing: one kind, or `kinds` alike ones
/// in runs of random lengths.
Architecture alike_kinds(Architecture m, std::size_t kinds, std::mt19937_64& random) {
    for (std::size_t k = 0; k < kinds; ++k)
        m.layer_kinds.push_back({"kind" + std::to_string(k), {}, {}, {}});
    for (std::uint64_t left = m.layers; left > 0;) {
        const std::uint64_t count = std::uniform_int_distribution<std::uint64_t>(1, left)(random);
        m.layer_pattern.push_back({random() % kinds, count});
        left -= count;
    }
    return m;
}

/// Layouts that split the layers several ways, each valid for `m` or skipped by the caller.
std::vector<Settings> layouts(const Architecture& m) {
    std::vector<Settings> out;
    Settings plain;
    plain.seq = m.max_positions == 0 ? 512 : std::min<std::uint64_t>(512, m.max_positions);
    out.push_back(plain);
    Settings staged = plain;
    staged.activations = ActivationModel::architecture, staged.recompute = Recompute::selective;
    staged.parallel.pp = 2, staged.parallel.dp = 2, staged.parallel.zero = 3,
    staged.parallel.microbatches = 4;
    out.push_back(staged);
    Settings interleaved = plain;
    interleaved.recompute = Recompute::full;
    interleaved.parallel.pp = 2, interleaved.parallel.vpp = 2,
    interleaved.parallel.microbatches = 4;
    if (m.layers % 4 == 0) out.push_back(interleaved);
    return out;
}

}  // namespace

TEST_CASE("one kind of layer, or alike kinds in runs, gives every preset's figures",
          "[layer_kinds]") {
    std::mt19937_64 random(20261130);
    for (const auto& name : cli::preset_names()) {
        const Architecture m = cli::load_preset(name).architecture;
        if (!m.layer_kinds.empty())
            continue;  // kinds of its own (DeepSeek's dense and MoE layers, sliding and full ones):
                       // the tests below split single-kind models
        for (const Settings& s : layouts(m)) {
            if (m.layers % s.parallel.pp != 0) continue;
            CAPTURE(name, s.parallel.pp, s.parallel.vpp, recompute_name(s.recompute));
            const Report plain = estimate(m, s);
            require_same(estimate(alike_kinds(m, 1, random), s), plain);
            require_same(estimate(alike_kinds(m, 3, random), s), plain);
        }
    }
}

using fixtures::dense_then_moe;

TEST_CASE("a model of a dense and a mixture-of-experts kind is each kind's sum", "[layer_kinds]") {
    const Architecture mixed = dense_then_moe();
    Architecture dense = mixed.kind_view(0), moe = mixed.kind_view(1);  // every layer of one kind
    for (auto activations : {ActivationModel::korthikanti, ActivationModel::architecture}) {
        Settings s;
        s.seq = 1024, s.micro_batch = 2, s.activations = activations,
        s.recompute = Recompute::selective;
        const Report r = estimate(mixed, s), d = estimate(dense, s), e = estimate(moe, s);
        const ParameterTable& t = *d.parameters;
        const Count outside =
            t.group(Group::input) + t.group(Group::head);  // the same in all three
        CHECK(r.parameter_count == outside + Count(2) * d.parameters->per_layer() +
                                       Count(6) * e.parameters->per_layer());
        CHECK(r.parameters->per_layer(0) == d.parameters->per_layer());
        CHECK(r.parameters->per_layer(1) == e.parameters->per_layer());
        CHECK(r.activations == Count(2) * d.layer.total() + Count(6) * e.layer.total());
        CHECK(r.kept_activations ==
              Count(2) * d.layer.kept(s.recompute) + Count(6) * e.layer.kept(s.recompute));
        CHECK(r.compute.step == Approx(0.25 * d.compute.step + 0.75 * e.compute.step));
        CHECK(r.compute.recompute ==
              Approx(0.25 * d.compute.recompute + 0.75 * e.compute.recompute));

        // Forward steps keep each layer as its kind; each backward step rebuilds its own kind.
        const Recompute full = Recompute::full;
        s.recompute = full;
        const Report f = estimate(mixed, s), fd = estimate(dense, s), fe = estimate(moe, s);
        for (const Step& step : f.timeline()) {
            if (step.phase != Phase::backward) continue;
            CAPTURE(step.name());
            const Report& own = step.layer <= 2 ? fd : fe;
            CHECK(step.bytes.rebuilt_activations == own.layer.rebuilt(full));
        }
        // Forward 8 keeps every layer's checkpoint; forward 1 the embedding side's and one dense
        // layer's.
        const Step& first_forward = f.timeline()[0];
        const Step& last_forward = f.timeline()[7];
        REQUIRE(last_forward.name() == "forward 8");
        CHECK(last_forward.bytes.kept_activations + fd.layer.kept(full) ==
              f.kept_activations + first_forward.bytes.kept_activations);
    }
}

TEST_CASE("a kind's own q/k norms have their weights in its layers", "[layer_kinds][params]") {
    Architecture m = dense_then_moe();  // heads of 64: 8 of them over 512
    const Count plain = parameter_table(m).total();
    const auto [norm, per_layer] =
        GENERATE(table<QkNorm, std::uint64_t>({{QkNorm::per_head, 2 * 64},     // q_norm, k_norm: d
                                               {QkNorm::whole, 512 + 4 * 64},  // a*d and k*d
                                               {QkNorm::none, 0}}));
    m.layer_kinds[1].qk_norm = norm;  // the 6 MoE layers' alone
    const ParameterTable t = parameter_table(m);
    CHECK(t.total() == plain + Count(6 * per_layer));
    CHECK(t.per_layer(0) == parameter_table(dense_then_moe()).per_layer(0));
}

TEST_CASE("the closed form of a mixed model allocates nothing and finds the timelines' peak",
          "[layer_kinds]") {
    Architecture m = dense_then_moe();
    m.layers = 16;
    m.layer_pattern = {{0, 3}, {1, 5}, {0, 1}, {1, 7}};
    Settings s;
    s.seq = 2048, s.activations = ActivationModel::architecture, s.recompute = Recompute::selective;
    s.parallel.pp = 4, s.parallel.vpp = 2, s.parallel.dp = 2, s.parallel.ep = 2,
    s.parallel.zero = 2;
    s.parallel.microbatches = 8;
    const Report r = estimate(m, s);
    const ActivationTables t =
        activation_tables(m, s.seq, s.micro_batch, DType::bf16, s.activations);
    const Workload w = make_workload(m, s.recipe, s.seq, s.micro_batch, s.recompute,
                                     parameter_splits(*r.parameters, m.vocab), t);
    const std::uint64_t before = allocations;
    const LayoutPeak peak = layout_peak(w, s.parallel);
    if (MEMCALC_COUNTS_ALLOCATIONS) CHECK(allocations == before);
    const Step& built = r.timeline()[r.peak()];  // the busiest rank's timeline, built
    CHECK(peak.bytes() == built.bytes.total());
    CHECK(peak.step.name() == built.name());
    CHECK(peak.stage == r.busiest().stage);
}

TEST_CASE("a bad pattern of layer kinds is named", "[layer_kinds]") {
    using Case = std::pair<std::vector<LayerRun>, std::string>;
    auto [pattern, message] = GENERATE(table<std::vector<LayerRun>, std::string>({
        Case{{{0, 2}, {1, 5}}, "layer_pattern covers 7 layers; the model has 8"},
        Case{{{0, 2}, {2, 6}}, "layer_pattern names kind 2 of 2"},
        Case{{{0, 2}, {1, 0}, {1, 6}}, "a layer_pattern run of 'moe' has 0 layers"},
        Case{{}, "layer_kinds and layer_pattern go together"},
    }));
    Architecture m = dense_then_moe();
    m.layer_pattern = pattern;
    CHECK_THROWS_WITH(validate(m), Catch::Contains(message));

    Architecture bad_kind = dense_then_moe();
    bad_kind.layer_kinds[1].experts_per_token = 9;
    CHECK_THROWS_WITH(validate(bad_kind),
                      "layer kind 'moe': experts_per_token (9) must not exceed experts (8)");
    Settings s;
    s.seq = 128, s.parallel.tp = 4;
    Architecture narrow = dense_then_moe();
    narrow.layer_kinds[0].ffn = 2046;
    CHECK_THROWS_WITH(estimate(narrow, s), "tp (4) must divide ffn (layer kind 'dense') (2046)");
}

TEST_CASE("a stage's layers by kind: counts and runs, across chunks and stage boundaries",
          "[layer_kinds]") {
    Architecture m = dense_then_moe();
    m.layers = 16;
    m.layer_pattern = {
        {0, 3}, {1, 5}, {0, 1}, {1, 7}};  // kinds of layers 1..16: 000 11111 0 1111111
    const LayerPattern pattern(m);
    CHECK(pattern.prefix(9) == KindCounts{4, 5, 0, 0});
    CHECK(pattern.kind_of(9) == 0);
    CHECK(pattern.kind_of(10) == 1);

    // Interleaved, pp 4 and 2 chunks of 2 layers each: stage 1 runs layers 3, 4 and 11, 12.
    StageLayers interleaved;
    interleaved.layers = 4, interleaved.chunk = 2, interleaved.stage = 1;
    interleaved.pass = 8, interleaved.first_layer = 2;  // each pass 4 chunks of 2
    interleaved.with(pattern);
    CHECK(interleaved.layer_id(2) == 11);
    CHECK(interleaved.counts(4) == KindCounts{1, 3, 0, 0});
    CHECK(interleaved.counts(1) == KindCounts{1, 0, 0, 0});
    CHECK(interleaved.run_end(1) == 1);
    CHECK(interleaved.run_end(2) == 2);  // layers 4 and 11 are alike but not consecutive
    CHECK(interleaved.run_start(4) == 3);
    CHECK(interleaved.run_end(3) == 4);
    // Mirrored chunks of unequal length (uneven DualPipe or ZB-V): the model's first layer, then
    // its last three, 14..16.
    StageLayers ends;
    ends.layers = 4, ends.chunk = 1, ends.mirrored = true, ends.mirror_first_layer = 13;
    ends.with(pattern);
    CHECK(ends.layer_id(0) == 1);
    CHECK(ends.layer_id(1) == 14);
    CHECK(ends.largest_chunk() == 3);
    CHECK_FALSE(ends.equal_chunks());
    CHECK(ends.counts(4) == KindCounts{1, 3, 0, 0});
    CHECK(ends.run_end(1) == 1);
    CHECK(ends.run_start(4) == 2);
    ends.recomputing(2);
    CHECK(ends.recomputed_counts(4) == KindCounts{1, 2, 0, 0});
    CHECK(ends.recomputed_at(3));
    CHECK_FALSE(ends.recomputed_at(4));

    // Two stages of 8: the second runs layers 9..16, its first of a run that began before it.
    StageLayers second;
    second.layers = 8, second.chunk = 8, second.stage = 1, second.first_layer = 8;
    second.with(pattern);
    CHECK(second.counts(8) == KindCounts{1, 7, 0, 0});
    CHECK(second.run_end(1) == 1);
    CHECK(second.run_start(2) == 2);
    CHECK(second.run_end(2) == 8);
    StageLayers first = second;
    first.stage = 0, first.first_layer = 0;
    CHECK(first.run_start(5) == 4);  // layers 4..8 are one run
    CHECK(first.run_end(4) == 8);
    // Four stages of 4: the third runs layers 9..12, the last three of a run that goes on past it.
    StageLayers third;
    third.layers = 4, third.chunk = 4, third.stage = 2, third.first_layer = 8;
    third.with(pattern);
    CHECK(third.run_end(2) == 4);
    CHECK(third.run_start(4) == 2);
}

namespace {
/// A model file of two kinds of layer, with `key` replaced by `value` (JSON) when given.
std::string mixed_file(const std::string& key = "", const std::string& value = "") {
    auto j = nlohmann::json::parse(
        R"({"name": "mixed", "hidden": 512, "layers": 8, "heads": 8, "kv_heads": 4,
        "ffn": 256, "vocab": 1000, "experts": 8, "experts_per_token": 2,
        "layer_kinds": [{"name": "dense", "ffn": 2048, "experts": 0}, {"name": "moe"}],
        "layer_pattern": [{"kind": "dense", "layers": 2}, {"kind": "moe", "layers": 6}]})");
    if (!key.empty()) j[key] = nlohmann::json::parse(value);
    return j.dump();
}
}  // namespace

TEST_CASE("a model file's kinds of layer read back as the model they describe",
          "[layer_kinds][model_file]") {
    const Architecture read = cli::parse_model_json(mixed_file(), "m.json", "m").architecture;
    Architecture expected = dense_then_moe();
    REQUIRE(read.layer_kinds.size() == 2);
    CHECK(read.layer_kinds[0].name == "dense");
    CHECK(read.layer_kinds[0].ffn == std::uint64_t{2048});
    CHECK(read.layer_kinds[0].experts == std::uint64_t{0});
    CHECK(!read.layer_kinds[1].ffn);
    REQUIRE(read.layer_pattern.size() == 2);
    CHECK(read.layer_pattern[1].kind == 1);
    CHECK(read.layer_pattern[1].count == 6);
    Settings s;
    s.seq = 1024;
    expected.max_positions = 0;
    CHECK(estimate(read, s).peak_step().bytes.total() ==
          estimate(expected, s).peak_step().bytes.total());
}

TEST_CASE("every bad kind of layer or pattern in a model file is named",
          "[layer_kinds][model_file]") {
    using Case = std::pair<std::string, std::string>;  // file text, what the message says
    auto [text, message] = GENERATE(table<std::string, std::string>({
        Case{
            mixed_file("layer_pattern",
                       R"([{"kind": "dnese", "layers": 2}, {"kind": "moe", "layers": 6}])"),
            "m.json: layer_pattern[0]: kind 'dnese' is not in layer_kinds (did you mean 'dense'?)"},
        Case{mixed_file("layer_pattern",
                        R"([{"kind": "dense", "layers": 2}, {"kind": "moe", "layers": 5}])"),
             "m.json: layer_pattern covers 7 layers; the model has 8"},
        Case{mixed_file("layer_pattern",
                        R"([{"kind": "dense", "layers": 0}, {"kind": "moe", "layers": 8}])"),
             "m.json: layer_pattern[0]: layers must be a positive integer (got 0)"},
        Case{mixed_file("layer_kinds", R"([{"name": "dense"}, {"name": "dense"}])"),
             "m.json: layer_kinds[1]: name 'dense' is given twice"},
        Case{mixed_file("layer_kinds", R"([{"name": "dense", "experts": -1}, {"name": "moe"}])"),
             "m.json: layer_kinds[0]: experts must be a non-negative integer (got number -1)"},
        Case{
            mixed_file("layer_kinds", R"([{"name": "dense", "mixers": "mamba"}, {"name": "moe"}])"),
            "m.json: layer_kinds[0]: unknown key 'mixers'"},
        Case{mixed_file("layer_kinds", R"([{"name": "dense", "mixer": "mamba"}, {"name": "moe"}])"),
             "m.json: layer kind 'dense': mamba_inner must be a positive integer (got 0)"},
        Case{mixed_file("layer_kinds", R"([{"name": "dense", "mixer": "ssm"}, {"name": "moe"}])"),
             "m.json: layer_kinds[0]: mixer"},
        Case{mixed_file("layer_kinds",
                        R"([{"name": "dense", "experts_per_token": 9}, {"name": "moe"}])"),
             "m.json: layer kind 'dense': experts_per_token (9) must not exceed experts (8)"},
        Case{mixed_file("layer_kinds", "[]"),
             "m.json: layer_kinds must be a non-empty array of objects"},
    }));
    CAPTURE(text);
    CHECK_THROWS_WITH(cli::parse_model_json(text, "m.json", "m"), Catch::Contains(message));
    auto no_pattern = nlohmann::json::parse(mixed_file());
    no_pattern.erase("layer_pattern");
    CHECK_THROWS_WITH(cli::parse_model_json(no_pattern.dump(), "m.json", "m"),
                      "m.json: layer_kinds and layer_pattern go together: give both or neither");
}

TEST_CASE("a model of several kinds through the program: each kind shown, --compare refused",
          "[layer_kinds][cli]") {
    const std::string path = "layer_kinds_test.json";
    {
        std::ofstream out(path);
        out << mixed_file();
    }
    const auto json_run = testing::memcalc("--model-file " + path +
                                           " --seq 1024 --activations architecture --format json");
    REQUIRE(json_run.status == 0);
    const auto report = nlohmann::json::parse(json_run.out);
    CHECK(report["model"]["layer_pattern"][0]["kind"] == "dense");
    CHECK(report["parameters"]["per_layer"].is_null());
    const auto& kinds = report["parameters"]["layer_kinds"];
    REQUIRE(kinds.size() == 2);
    const std::uint64_t layers =
        kinds[0]["total"].get<std::uint64_t>() * 2 + kinds[1]["total"].get<std::uint64_t>() * 6;
    CHECK(report["parameters"]["total"].get<std::uint64_t>() ==
          layers + report["parameters"]["embedding"].get<std::uint64_t>() +
              report["parameters"]["head"].get<std::uint64_t>() +
              report["parameters"]["final_norm"].get<std::uint64_t>());
    const auto& saved = report["activations"]["layer_kinds"];
    REQUIRE(saved.size() == 2);
    CHECK(saved[0]["layer_bytes"] !=
          saved[1]["layer_bytes"]);  // a 2048-wide dense MLP against two 256-wide experts
    CHECK(report["activations"]["bytes"].get<std::uint64_t>() ==
          2 * saved[0]["layer_bytes"].get<std::uint64_t>() +
              6 * saved[1]["layer_bytes"].get<std::uint64_t>());

    const auto table =
        testing::memcalc("--model-file " + path + " --seq 1024 --activations architecture");
    CHECK(table.out.find("one 'dense' layer") != std::string::npos);
    CHECK(table.out.find("Activations of one 'moe' layer") != std::string::npos);
    const auto csv =
        testing::memcalc("--model-file " + path + " --seq 1024 --per-layer --format csv");
    CHECK(csv.out.rfind("kind,op,", 0) == 0);
    const auto compare =
        testing::memcalc("--model-file " + path + " --seq 1024 --compare megatron");
    CHECK(compare.status != 0);
    CHECK(compare.out.empty());
    CHECK(compare.err.find("--compare needs layers all alike") != std::string::npos);
    std::remove(path.c_str());
}
