// Activation offload: each layer's kept activations go to host memory after its forward and come
// back for its backward; the device keeps the layers in transit. Hand-derived device and host
// bytes, the closed-form peak against the timeline, the host transfers' time, plan's alternatives
// and the CLI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/plan.hpp"
#include "run_program.hpp"
#include "step_named.hpp"

using namespace memcalc;
using fixtures::step_named;

namespace {
/// Korthikanti's layer on a small shape: s = 128, b = 1, h = 256, a = 4, 16-bit activations.
Architecture tiny() {
    Architecture m = fixtures::llama_7b();
    m.name = "tiny", m.layers = 6, m.hidden = 256, m.heads = 4, m.kv_heads = 4, m.ffn = 688,
    m.vocab = 1000;
    return m;
}
constexpr std::uint64_t sbh = 128 * 256;
constexpr std::uint64_t whole_layer =
    34 * sbh + 5 * 4 * 128 * 128;              // 34 sbh + 5 a s^2 b bytes: 1,441,792
constexpr std::uint64_t checkpoint = 2 * sbh;  // full recomputation keeps the input

Report run(const Architecture& m, Recompute mode, const Parallelism& p) {
    Settings s;
    s.seq = 128, s.recompute = mode, s.parallel = p;
    return estimate(m, s);
}
std::uint64_t kept(const RankReport& rank, const std::string& step) {
    return step_named(rank, step).bytes.kept_activations.value();
}
}  // namespace

TEST_CASE(
    "activation offload on one device: the host holds every layer, the device the layers in "
    "transit",
    "[offload][activations]") {
    const Architecture m = tiny();
    const auto [mode, A] =
        GENERATE(std::pair{Recompute::none, whole_layer}, std::pair{Recompute::full, checkpoint});
    CAPTURE(recompute_name(mode));
    Parallelism p;
    const Report plain = run(m, mode, p);
    p.offload_activations = true;
    const Report off = run(m, mode, p);
    const RankReport& r = off.busiest();
    CHECK(plain.busiest().host.value() == 0);
    CHECK(r.host.value() == 6 * A);  // what the device would have kept, all six layers
    // Forward k: layer k and layer k - 1, whose copy is in flight; without offload layers 1..k.
    CHECK(kept(r, "forward 1") == A);
    for (int k = 2; k <= 6; ++k) {
        CAPTURE(k);
        CHECK(kept(r, "forward " + std::to_string(k)) == 2 * A);
        CHECK(kept(plain.busiest(), "forward " + std::to_string(k)) == k * A);
    }
    CHECK(kept(r, "loss") == 2 * A);
    // Backward k: k and k - 1, being fetched back; k + 1's went when its step ended.
    for (int k = 2; k <= 6; ++k) CHECK(kept(r, "backward " + std::to_string(k)) == 2 * A);
    CHECK(kept(r, "backward 1") == A);
    // The rebuilt tensors and everything else are as they were: offload moves only what is kept.
    for (std::size_t i = 0; i < r.timeline().size(); ++i) {
        const Breakdown& a = r.timeline()[i].bytes;
        const Breakdown& b = plain.busiest().timeline()[i].bytes;
        CAPTURE(r.timeline()[i].name());
        CHECK(a.rebuilt_activations == b.rebuilt_activations);
        CHECK(a.total().value() - a.kept_activations.value() ==
              b.total().value() - b.kept_activations.value());
        CHECK(a.total() <= b.total());  // never more than without offload, at any step
    }
    CHECK(r.state.total() == plain.busiest().state.total());
    CHECK(off.peak_step().bytes.total() <= plain.peak_step().bytes.total());
}

TEST_CASE(
    "activation offload under a pipeline: the micro-batches in flight go to the host but one layer "
    "each",
    "[offload][activations]") {
    const Architecture m = tiny();
    const auto [mode, A] =
        GENERATE(std::pair{Recompute::none, whole_layer}, std::pair{Recompute::full, checkpoint});
    CAPTURE(recompute_name(mode));
    Parallelism p;
    p.pp = 2, p.microbatches = 4, p.offload_activations = true;
    const Report r = run(m, mode, p);
    // 1F1B: stage 0 holds min(P - 0, M) = 2 micro-batches of its 3 layers, stage 1 one.
    const RankReport& first = r.ranks[0];
    const RankReport& last = r.ranks[1];
    CHECK(first.host.value() == 2 * 3 * A);
    CHECK(last.host.value() == 1 * 3 * A);
    // Stage 0: the other micro-batch keeps one layer on the device beside the transit window.
    CHECK(kept(first, "forward 1") == A + A);
    CHECK(kept(first, "forward 3") == A + 2 * A);
    CHECK(kept(first, "backward 2") == A + 2 * A);
    CHECK(kept(first, "backward 2 of micro-batch 2") ==
          A + 2 * A);  // later ones hold min(P, M - 1) = 2 too
    CHECK(kept(first, "backward 1") == A + A);
    CHECK(kept(last, "backward 5") == 2 * A);
    CHECK(kept(last, "forward 6") == 2 * A);

    // Interleaved, vpp 3 of one-layer chunks: stage 0 holds 2 (P - 1) + (V - 1) P + 1 = 7 chunks.
    // At its first chunk the running micro-batch's other two are not in flight (steady state), so 6
    // are other micro-batches', each a layer on the device (the last of its chunk) beside the
    // transit window.
    p.vpp = 3;
    const Report v = run(m, mode, p);
    CHECK(v.ranks[0].in_flight == 7);
    CHECK(v.ranks[0].host.value() == 7 * A);
    CHECK(kept(v.ranks[0], "forward 1") == 6 * A + A);
}

TEST_CASE(
    "activation offload: the closed-form peak is the timeline's, across layouts and kinds of layer",
    "[offload][activations]") {
    Architecture
        kinds;  // a dense run, then experts: runs of one kind end inside the transit window
    kinds.name = "dense-then-moe";
    kinds.hidden = 512, kinds.layers = 8, kinds.heads = 8, kinds.kv_heads = 4, kinds.ffn = 256,
    kinds.vocab = 1000;
    kinds.max_positions = 2048, kinds.experts = 8, kinds.experts_per_token = 2;
    kinds.layer_kinds = {{"dense", 2048, 0, {}}, {"moe", {}, {}, {}}};
    kinds.layer_pattern = {{0, 3}, {1, 5}};
    const Architecture m = GENERATE_COPY(tiny(), fixtures::gpt2_small(), kinds);
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const int layout = GENERATE(0, 1, 2, 3);
    Settings s;
    s.seq = 256, s.recompute = mode, s.activations = ActivationModel::architecture;
    s.parallel.offload_activations = true;
    if (layout == 1)
        s.parallel.pp = 2, s.parallel.microbatches = 4, s.parallel.dp = 2, s.parallel.zero = 2;
    if (layout == 2)
        s.parallel.pp = 2, s.parallel.vpp = m.layers % 4 == 0 ? 2 : 3, s.parallel.microbatches = 4;
    if (layout == 3)
        s.parallel.microbatches = 3, s.parallel.dp = 2, s.parallel.zero = 3,
        s.parallel.offload = Offload::optimizer;
    if (m.layers % (s.parallel.pp * s.parallel.vpp) != 0) return;
    CAPTURE(m.name, recompute_name(mode), layout);
    const Estimator e(m);
    const Report full = e.estimate(s);
    const Summary closed = e.summary(s);
    CHECK(closed.peak.bytes.total() == full.peak_step().bytes.total());
    CHECK(closed.peak.name() == full.peak_step().name());
    for (const RankReport& rank : full.ranks) CHECK(rank.peak() == peak_index(rank.timeline()));
    if (layout != 0) return;
    // One stage: each step of the timeline, extrapolated along runs, is step_at's.
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables t = activation_tables(m, s.seq, 1, s.recipe.precision(), s.activations,
                                                 s.framework, s.recompute_modules, {});
    const Workload w = make_workload(m, s.recipe, s.seq, 1, mode, params, t, s.framework);
    const TimelineInputs in = stage_inputs(w, s.parallel, stage_facts(w, s.parallel, 0));
    const std::vector<Step> steps = timeline(in);
    REQUIRE(steps.size() == full.timeline().size());
    for (const Step& step : steps) {
        CAPTURE(step.name());
        const bool at_layer = step.phase == Phase::forward || step.phase == Phase::backward;
        CHECK(step.bytes.total() ==
              step_at(in, step.phase, at_layer ? step.layer : 0, step.microbatch).bytes.total());
    }
    CHECK(steps[peak_index(steps)].name() == full.peak_step().name());
}

TEST_CASE(
    "activation offload's host transfers: each micro-batch's kept activations down and up, at the "
    "host link",
    "[offload][activations][time]") {
    const Architecture m = tiny();
    Settings s;
    s.seq = 128;
    s.parallel.pp = 2, s.parallel.microbatches = 4;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables t = activation_tables(m, 128, 1, s.recipe.precision(), s.activations,
                                                 s.framework, s.recompute_modules, {});
    const Workload w = make_workload(m, s.recipe, 128, 1, Recompute::none, params, t, s.framework);
    const Traffic before = traffic(w, s.parallel, stage_facts(w, s.parallel, 0));
    s.parallel.offload_activations = true;
    const StageFacts f = stage_facts(w, s.parallel, 0);
    CHECK(f.offloaded_activations.value() ==
          3 * whole_layer);  // one micro-batch's 3 layers on stage 0
    const Traffic after = traffic(w, s.parallel, f);
    CHECK(after.offload == Approx(2.0 * 4 * 3 * whole_layer));  // down and up, 4 micro-batches
    CHECK(after.total() == Approx(before.total() + after.offload));
    Gpu gpu;
    gpu.name = "round", gpu.memory = 80000000000ULL, gpu.peak_bf16_flops = 100'000'000'000'000ULL;
    gpu.intra_node_bandwidth = 100'000'000'000ULL, gpu.inter_node_bandwidth = 10'000'000'000ULL,
    gpu.gpus_per_node = 8;
    gpu.host_bandwidth = 20'000'000'000ULL;
    const auto time = step_time(gpu, s.parallel, 1e15, after);
    REQUIRE(time);
    CHECK(time->offload ==
          Approx(2.0 * 4 * 3 * whole_layer / 2e10));  // not hidden behind compute (leaning slow)
    // Uneven stages: the stage that offloads the most sets the time (the first 2 layers, the last
    // 4).
    Architecture odd = m;
    odd.layers = 7;
    const auto odd_params = parameter_splits(parameter_table(odd), odd.vocab);
    const Workload ow =
        make_workload(odd, s.recipe, 128, 1, Recompute::none, odd_params, t, s.framework);
    s.parallel.first_stage_layers = 3;  // and the last 4
    CHECK(traffic(ow, s.parallel, stage_facts(ow, s.parallel, 0)).offload ==
          Approx(2.0 * 4 * 4 * whole_layer));
}

TEST_CASE(
    "plan searches activation offload only where --offload lists it, alone or joined with "
    "ZeRO-Offload",
    "[offload][activations][plan]") {
    const Architecture m = tiny();
    PlanRequest request;
    request.gpus = 4, request.capacity = 4000000000ULL, request.base.seq = 1024,
    request.global_batch = 8;
    const auto key = [](const PlanRow& r) {
        const Parallelism& p = r.parallel;
        return std::tuple{p.dp,          p.tp,
                          p.pp,          p.vpp,
                          p.zero,        p.sequence_parallel,
                          r.micro_batch, static_cast<int>(r.recompute)};
    };
    request.offload = {Offload::none};
    const auto none = plan(m, request);
    std::set<decltype(key(none.front()))> plain, with_zero;
    for (const PlanRow& r : none) {
        plain.insert(key(r));
        if (r.parallel.zero >= 1) with_zero.insert(key(r));
    }
    // The empty list (every ZeRO-Offload mode) has no activation offload in it.
    request.offload = {};
    for (const PlanRow& r : plan(m, request)) CHECK_FALSE(r.parallel.offload_activations);

    request.offload = {OffloadMode(Offload::none, true), OffloadMode(Offload::optimizer, true)};
    std::set<decltype(key(none.front()))> activations, optimizer_activations;
    const Estimator e(m);
    for (const PlanRow& r : plan(m, request)) {
        REQUIRE(r.parallel.offload_activations);
        REQUIRE(r.parallel.offload != Offload::parameters);
        (r.parallel.offload == Offload::none ? activations : optimizer_activations).insert(key(r));
        // Each row's peak is a single estimate's with the same settings.
        Settings s = request.base;
        s.micro_batch = r.micro_batch, s.recompute = r.recompute, s.parallel = r.parallel;
        CHECK(e.summary(s).peak.bytes.total() == r.peak.bytes());
    }
    CHECK(activations == plain);  // every layout, once with activation offload
    CHECK(optimizer_activations ==
          with_zero);  // and with optimizer offload wherever a ZeRO stage allows it
    // A layout too big without it fits with it: at a capacity of its offloaded peak, only that
    // alternative fits.
    Settings s = request.base;
    s.parallel.dp = 4, s.micro_batch = 2;
    const Count without = e.summary(s).peak.bytes.total();
    s.parallel.offload_activations = true;
    const Count with = e.summary(s).peak.bytes.total();
    REQUIRE(with < without);
    request.capacity = with;
    request.dp = {4}, request.zero = {0}, request.micro_batches = {2},
    request.modes = {Recompute::none};
    request.offload = {Offload::none, OffloadMode(Offload::none, true)};
    const auto pair = plan(m, request);
    REQUIRE(pair.size() == 2);
    CHECK(pair[0].fits);
    CHECK(pair[0].parallel.offload_activations);
    CHECK_FALSE(pair[1].fits);
}

TEST_CASE("offload activations in an estimate and a plan, and the names it refuses",
          "[offload][activations][cli][slow-sanitized]") {
    using nlohmann::json;
    const std::string estimate = "--preset llama-7b --seq 2048 --format json";
    const json plain = json::parse(testing::memcalc(estimate).out);
    const json off = json::parse(testing::memcalc(estimate + " --offload activations").out);
    CHECK(off["settings"]["parallel"]["offload"] == "activations");
    const auto host = off["ranks"][0]["host_bytes"].get<std::uint64_t>();
    // Korthikanti's LLaMA 7B layer at s = 2048, b = 1: 34 sbh + 5 a s^2 b bytes, 32 of them on the
    // host.
    const std::uint64_t layer = 34ULL * 2048 * 4096 + 5ULL * 32 * 2048 * 2048;
    CHECK(host == 32 * layer);
    CHECK(off["ranks"][0]["peak"]["bytes"].get<std::uint64_t>() <
          plain["ranks"][0]["peak"]["bytes"].get<std::uint64_t>());
    const json both = json::parse(
        testing::memcalc(estimate + " --dp 8 --zero 2 --offload optimizer+activations").out);
    CHECK(both["settings"]["parallel"]["offload"] == "optimizer+activations");
    const json alone =
        json::parse(testing::memcalc(estimate + " --dp 8 --zero 2 --offload optimizer").out);
    CHECK(both["ranks"][0]["host_bytes"].get<std::uint64_t>() ==
          alone["ranks"][0]["host_bytes"].get<std::uint64_t>() + host);
    CHECK(testing::memcalc(estimate + " --offload activations+optimizer --dp 8 --zero 2").out ==
          testing::memcalc(estimate + " --offload optimizer+activations --dp 8 --zero 2").out);
    const auto table = testing::memcalc("--preset llama-7b --seq 2048 --offload activations");
    CHECK_THAT(table.out, Catch::Contains("activations offloaded to host memory"));

    for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
             {"--offload activation", "did you mean 'activations'"},
             {"--offload optimizer,activations",
              "join ZeRO-Offload and activation offload with '+'"},
             {"--offload optimizer+parameters",
              "--offload must be none, optimizer, parameters or activations"},
             {"--offload activations+activations", "(got 'activations+activations')"},
             {"--offload none+activations", "(got 'none+activations')"},
             {"--offload activations+", "(got 'activations+')"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc("--preset llama-7b --seq 2048 " + args);
        CHECK(bad.status == 2);
        CHECK_THAT(bad.err, Catch::Contains(message));
        CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 1);
    }
    const auto needs_zero =
        testing::memcalc("--preset llama-7b --seq 2048 --offload optimizer+activations");
    CHECK(needs_zero.status != 0);
    CHECK_THAT(needs_zero.err, Catch::Contains("offloading the optimizer needs a ZeRO stage"));

    const std::string plan =
        "plan --preset llama-7b --gpus 8 --gpu h100-sxm --seq 4096 --global-batch 64 --top 50 "
        "--format json";
    const json rows = json::parse(
        testing::memcalc(plan + " --offload activations,optimizer+activations").out)["layouts"];
    REQUIRE(!rows.empty());
    std::set<std::string> seen;
    for (const auto& row : rows) {
        seen.insert(row["offload"].get<std::string>());
        CHECK(row["offload_seconds"].get<double>() > 0);
    }
    CHECK(seen.count("none") == 0);
    CHECK(seen.count("optimizer") == 0);
    CHECK(seen.count("activations") + seen.count("optimizer+activations") == seen.size());
    const auto typo = testing::memcalc(plan + " --offload none,activatons");
    CHECK(typo.status == 2);
    CHECK_THAT(typo.err, Catch::Contains("did you mean 'activations'"));
    const auto pinned = testing::memcalc(plan + " --offload parameters+activations --zero 1,2");
    CHECK(pinned.status == 2);
    CHECK_THAT(pinned.err, Catch::Contains("needs --zero 3"));
}
