#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "memcalc/plan.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
Architecture small_llama_4kv() {
    Architecture m = fixtures::llama_7b();
    m.name = "small-llama", m.layers = 16, m.hidden = 2048, m.heads = 16, m.kv_heads = 4,
    m.ffn = 5632;
    return m;
}
using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, unsigned, bool,
                       std::uint64_t, int, std::uint64_t, int>;
/// Which layout a row is: its degrees, micro-batch, mode and offload.
Key layout_text_key(const PlanRow& r) {
    const Parallelism& p = r.parallel;
    return {p.dp,          p.tp,
            p.pp,          p.cp,
            p.zero,        p.sequence_parallel,
            r.micro_batch, static_cast<int>(r.recompute),
            p.vpp,         static_cast<int>(p.offload)};
}
}  // namespace

TEST_CASE("plan on 8 devices evaluates exactly the layouts a hand enumeration finds", "[plan]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 8, request.capacity = 20000000000ULL, request.base.seq = 1024,
    request.global_batch = 16;
    const auto rows = plan(m, request);

    // By hand: dp x tp x pp x cp = 8; tp divides heads (16), kv heads (4) and ffn; pp divides the
    // 16 layers; the sequence splits over cp (and tp with sequence parallelism); ZeRO needs dp > 1;
    // the micro-batch divides the 16 sequences per replica; three recomputation modes; with pp > 1
    // and micro-batches a multiple of pp, also each interleaving of a rank's 16 / pp layers (vpp 2,
    // 4, ...); offload none, optimizer with ZeRO 1-3, parameters with ZeRO 3 (0, 1, 2 as the enum
    // counts them).
    std::set<Key> expected;
    for (std::uint64_t tp : {1, 2, 4, 8})
        for (std::uint64_t pp : {1, 2, 4, 8})
            for (std::uint64_t cp : {1, 2, 4, 8}) {
                if (8 % (tp * pp * cp) != 0) continue;
                const std::uint64_t dp = 8 / (tp * pp * cp);
                if (4 % tp != 0) continue;  // kv heads
                for (bool sp : {false, true})
                    for (unsigned zero = 0; zero <= 3; ++zero)
                        for (std::uint64_t b : {1, 2, 4, 8, 16})
                            for (int mode = 0; mode < 3; ++mode) {
                                if ((sp && tp == 1) || (zero > 0 && dp == 1) || (16 / dp) % b != 0)
                                    continue;
                                const std::uint64_t microbatches = 16 / (dp * b);
                                for (std::uint64_t vpp : {1, 2, 4, 8, 16})
                                    for (int offload = 0;
                                         offload <= static_cast<int>(zero == 3  ? 2
                                                                     : zero > 0 ? 1
                                                                                : 0);
                                         ++offload)
                                        if (vpp == 1 || (pp > 1 && (16 / pp) % vpp == 0 &&
                                                         microbatches % pp == 0))
                                            expected.insert(
                                                {dp, tp, pp, cp, zero, sp, b, mode, vpp, offload});
                            }
            }
    std::set<Key> found;
    std::map<Key, bool> fits;
    std::vector<PlanRow>
        partial;  // the fewest layers per chunk whose full recomputation fits: rows of their own
    for (const auto& r : rows) {
        if (r.parallel.recompute_layers) {
            partial.push_back(r);
            continue;
        }
        found.insert(layout_text_key(r));
        fits[layout_text_key(r)] = r.fits;
        // Interleaving divides the bubble by vpp: (P - 1) / (v M + P - 1).
        const double P = static_cast<double>(r.parallel.pp),
                     M = static_cast<double>(r.parallel.microbatches),
                     v = static_cast<double>(r.parallel.vpp);
        CHECK(r.bubble == Approx((P - 1) / (v * M + P - 1)));
    }
    CHECK(rows.size() == expected.size() + partial.size());
    CHECK(found == expected);
    // Only where full recomputation fits and none does not, each N below the chunk's layers
    // (test_partial_recompute finds them where they must be).
    for (const PlanRow& r : partial) {
        Key full = layout_text_key(r), none = full;
        std::get<7>(none) = static_cast<int>(Recompute::none);
        CHECK(r.recompute == Recompute::full);
        CHECK(fits.at(full));
        CHECK_FALSE(fits.at(none));
        CHECK(*r.parallel.recompute_layers >= 1);
        CHECK(*r.parallel.recompute_layers < 16 / (r.parallel.pp * r.parallel.vpp));
    }
    CHECK(std::any_of(rows.begin(), rows.end(),
                      [](const PlanRow& r) { return r.parallel.vpp == 4 && r.fits; }));
    CHECK(std::any_of(rows.begin(), rows.end(), [](const PlanRow& r) {
        return r.parallel.offload == Offload::parameters && r.fits;
    }));
}

TEST_CASE("plan's peaks are estimate()'s, and the ranking follows its rule", "[plan]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 8, request.capacity = 12000000000ULL, request.base.seq = 2048,
    request.global_batch = 8;
    // The chapter's model, and the architecture's with its workspaces and a foreach optimiser step.
    const bool framework = GENERATE(false, true);
    if (framework)
        request.base.activations = ActivationModel::architecture,
        request.base.framework.optimizer = OptimizerImpl::foreach;
    const auto rows = plan(m, request);
    bool fitting = true;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const PlanRow& r = rows[i];
        Settings s;
        s.seq = 2048, s.micro_batch = r.micro_batch, s.recompute = r.recompute,
        s.parallel = r.parallel;
        s.activations = request.base.activations,
        s.framework.optimizer = request.base.framework.optimizer;
        const Report e = estimate(m, s);
        CAPTURE(i);
        CHECK(r.peak.bytes() == e.peak_step().bytes.total());
        CHECK(r.fits == (e.peak_step().bytes.total() <= request.capacity));
        if (!r.fits) fitting = false;
        CHECK((r.fits || !fitting));  // every fitting layout comes first
        if (i > 0 && rows[i - 1].fits == r.fits) CHECK_FALSE(plan_order(r, rows[i - 1]));
        const double P = static_cast<double>(r.parallel.pp),
                     M = static_cast<double>(r.parallel.steps_per_batch()),
                     v = static_cast<double>(r.parallel.vpp);
        CHECK(r.bubble == Approx((P - 1) / (v * M + P - 1)));
    }
}

TEST_CASE(
    "plan tries torchtitan's per-op policy only where asked, and peaks it as estimate() does "
    "but under tp, which the policy's model lacks",
    "[plan]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 8, request.capacity = 12000000000ULL, request.base.seq = 2048,
    request.global_batch = 8, request.base.activations = ActivationModel::architecture;
    for (const PlanRow& r : plan(m, request)) CHECK(r.recompute != Recompute::op);
    request.modes = {Recompute::op};
    std::size_t fitting = 0;
    for (const PlanRow& r : plan(m, request)) {
        REQUIRE(r.recompute == Recompute::op);
        CAPTURE(layout_text_key(r));
        if (r.parallel.tp > 1) {
            CHECK_FALSE(r.fits);  // estimate() refuses it: no peak to rank
            continue;
        }
        Settings s;
        s.seq = 2048, s.micro_batch = r.micro_batch, s.recompute = Recompute::op,
        s.parallel = r.parallel, s.activations = ActivationModel::architecture;
        CHECK(r.peak.bytes() == estimate(m, s).peak_step().bytes.total());
        fitting += r.fits;
    }
    CHECK(fitting > 0);
}

TEST_CASE("plan: a mixture-of-experts model also enumerates expert parallelism", "[plan]") {
    Architecture m = small_llama_4kv();
    m.experts = 4, m.experts_per_token = 2;
    PlanRequest request;
    request.gpus = 4, request.capacity = 80000000000ULL, request.base.seq = 512,
    request.global_batch = 4;
    std::set<std::uint64_t> eps;
    for (const auto& r : plan(m, request)) eps.insert(r.parallel.ep);
    CHECK(eps == std::set<std::uint64_t>{1, 2, 4});
}

TEST_CASE("plan_top keeps the best k fitting layouts in plan's order, and counts them all",
          "[plan]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 16, request.capacity = 20000000000ULL, request.base.seq = 1024,
    request.global_batch = 32;
    const auto all = plan(m, request);
    const std::size_t fitting = static_cast<std::size_t>(
        std::count_if(all.begin(), all.end(), [](const PlanRow& r) { return r.fits; }));
    REQUIRE(fitting > 10);
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{7}, fitting, fitting + 5}) {
        const PlanSummary top = plan_top(m, request, k);
        CAPTURE(k);
        // Once it keeps k, a layout ranked below the k-th by its fields before the peak is not
        // weighed (nor a partial row it could lead to); keeping them all, every one is.
        const bool keeps_all = k == 0 || k >= fitting;
        CHECK((top.ranked_out > 0) == !keeps_all);
        CHECK((keeps_all ? top.evaluated == all.size() : top.evaluated <= all.size()));
        CHECK((keeps_all ? top.fitting == fitting : top.fitting < fitting));
        REQUIRE(top.top.size() == std::min(k, fitting));
        for (std::size_t i = 0; i < top.top.size(); ++i) {
            CHECK(plan_key(top.top[i]) == plan_key(all[i]));
            CHECK(layout_text_key(top.top[i]) == layout_text_key(all[i]));
        }
    }
}

namespace {
/// Everything a row's layout is, for comparing two searches' rows.
auto whole_layout(const PlanRow& r) {
    const Parallelism& p = r.parallel;
    return std::tuple{layout_text_key(r),
                      p.ep,
                      p.etp,
                      static_cast<int>(p.schedule),
                      p.recompute_layers,
                      p.offload_activations,
                      p.first_stage_layers,
                      p.last_stage_layers};
}

/// plan_top(k) against the first k fitting rows of plan(), which weighs every layout's peak.
void check_top_matches_plan(const Architecture& m, const PlanRequest& request, std::size_t k) {
    const auto all = plan(m, request);
    const PlanSummary top = plan_top(m, request, k);
    std::vector<PlanRow> best;
    for (const PlanRow& r : all)
        if (r.fits && best.size() < k) best.push_back(r);
    CAPTURE(m.name, request.gpus, k, request.gpu.has_value(), all.size(), top.ranked_out);
    REQUIRE(top.top.size() == best.size());
    for (std::size_t i = 0; i < best.size(); ++i) {
        CAPTURE(i);
        CHECK(plan_key(top.top[i]) == plan_key(best[i]));
        CHECK(whole_layout(top.top[i]) == whole_layout(best[i]));
    }
}
}  // namespace

namespace {
/// A GPU of round figures, for hand-derived times: 100 TFLOP/s, 100 GB/s in a node of 8, 10 GB/s
/// out.
Gpu round_gpu() {
    Gpu g;
    g.name = "round", g.memory = 80000000000ULL;
    g.peak_bf16_flops = 100'000'000'000'000ULL;
    g.intra_node_bandwidth = 100'000'000'000ULL, g.inter_node_bandwidth = 10'000'000'000ULL,
    g.gpus_per_node = 8;
    g.host_bandwidth = 20'000'000'000ULL;
    g.collective_sm_share = 0;  // the hand-derived times below count exposed messages alone
    return g;
}
}  // namespace

// [slow-sanitized]: 36 whole searches, each enumerated twice; the sanitizers add nothing here.
TEST_CASE("plan_top ranks layouts out before their peak without changing its answer",
          "[plan][prune][slow-sanitized]") {
    struct Model {
        Architecture m;
        std::uint64_t capacity;
    };
    const std::vector<Model> models{{small_llama_4kv(), 20000000000ULL},
                                    {fixtures::mixtral(), 60000000000ULL},
                                    {fixtures::dense_then_moe(), 300000000ULL}};
    const std::vector<std::optional<Gpu>> gpus{std::nullopt, round_gpu(), *find_gpu("h100-sxm")};
    const std::vector<std::vector<Schedule>> schedules{
        {}, {Schedule::one_f_one_b, Schedule::zb_h1, Schedule::zb_v, Schedule::dualpipe}};
    for (const Model& model : models)
        for (const auto& gpu : gpus)
            for (const auto& listed : schedules) {
                PlanRequest request;
                request.gpus = 16, request.capacity = model.capacity, request.base.seq = 1024,
                request.global_batch = 32;
                request.gpu = gpu, request.schedules = listed;
                for (std::size_t k : {std::size_t{1}, std::size_t{5}})
                    check_top_matches_plan(model.m, request, k);
            }
}

TEST_CASE("step_time: each term against hand-derived values", "[plan][time]") {
    const Gpu g = round_gpu();
    Parallelism p;
    p.dp = 4, p.tp = 2, p.pp = 2,
    p.microbatches = 8;  // 16 GPUs: tp x dp = 8 fills a node, pp crosses nodes
    Traffic bytes;
    bytes.tensor_parallel = 1e9, bytes.pipeline = 1e8, bytes.context_parallel = 5e9;
    bytes.data_parallel.last_backward = 2e9, bytes.data_parallel.pieces = 10;
    const auto t = step_time(g, p, 1.6e16, bytes);
    REQUIRE(t);
    const double compute = 1.6e16 / (16 * 1e14 * g.gemm_efficiency);  // 14.3 s
    CHECK(t->compute == Approx(compute));
    // tp (span 2) inside a node at 100 GB/s, pp (span 16) across nodes at 10 GB/s: on the critical
    // path, and in the bubble's (pp - 1) / micro-batches of each micro-batch's time; cp is 1.
    const double per_microbatch = 1e9 / 1e11 + 1e8 / 1e10;
    CHECK(t->bubble == Approx((compute + per_microbatch) / 8));
    // dp's 0.02 s hide under the last micro-batch's backward (2/3 of an eighth of the compute)
    // but for its last piece's, a tenth, which no backward follows.
    CHECK(t->communication == Approx(per_microbatch + 0.002));
    CHECK(t->seconds() ==
          Approx(compute + (compute + per_microbatch) / 8 + per_microbatch + 0.002));

    p.dp = 8, p.pp = 1;                        // dp spans 16 GPUs: its all-reduce leaves the node
    bytes.data_parallel.last_backward = 2e10;  // 2 s at 10 GB/s: more than the last backward's 1.19
    const auto wide = step_time(g, p, 1.6e16, bytes);
    REQUIRE(wide);
    CHECK(wide->bubble == 0);
    // Nine of the ten pieces run beside a tenth of that backward each; the rest is exposed.
    CHECK(wide->communication == Approx(1e9 / 1e11 + 2e10 / 1e10 - compute * 2 / 3 / 8 * 0.9));

    // Each message pays its link's latency: tp's in the node, the ring's across it, where the
    // attention it feeds hides what it can.
    Traffic messages;
    messages.tensor_parallel_messages = 1000, messages.context_parallel_messages = 1000;
    Parallelism ring;
    ring.tp = 2, ring.cp = 8, ring.microbatches = 8;
    DeviceWork work;
    work.flops = 1.6e16, work.attention_flops = 1.6e13;  // 1.6e13 / 16 / (1e14 x 0.4): 0.025 s
    const auto latent = step_time(g, ring, work, messages);
    REQUIRE(latent);
    CHECK(latent->communication ==
          Approx(1000 * g.intra_node_latency +
                 std::max(0.0, 1000 * g.inter_node_latency - 1.6e13 / 16 / (1e14 * 0.4))));

    Gpu no_network = g;
    no_network.inter_node_bandwidth = 0;
    CHECK_FALSE(step_time(no_network, p, 1.6e16, bytes));  // a figure it needs is missing
    p.dp = 4;
    CHECK(step_time(no_network, p, 1.6e16, bytes));  // 8 GPUs: one node, no network needed
    Gpu no_peak = g;
    no_peak.peak_bf16_flops = 0;
    CHECK_FALSE(step_time(no_peak, p, 1.6e16, bytes));
}

TEST_CASE("step_time: collective matmuls hide tensor-parallel collectives but a piece of each",
          "[plan][time]") {
    const Gpu g = round_gpu();
    Parallelism p;
    p.tp = 4, p.microbatches = 1;
    Traffic bytes;
    bytes.tensor_parallel = 1e10;                       // 0.1 s inside the node at 100 GB/s
    const double flops = 4 * 1e14 * g.gemm_efficiency;  // one second of matrix products each
    const auto plain = step_time(g, p, flops, bytes);
    REQUIRE(plain);
    CHECK(plain->communication == Approx(0.1));
    bytes.tensor_parallel_pieces = 4;  // in tp pieces beside the products: a quarter exposed
    const auto split = step_time(g, p, flops, bytes);
    REQUIRE(split);
    CHECK(split->communication == Approx(0.025 + 0.075 * g.collective_sm_share));
    // Past what the products hide (three quarters of their second), the rest is exposed too.
    bytes.tensor_parallel = 2e11;  // 2 s
    const auto long_messages = step_time(g, p, flops, bytes);
    REQUIRE(long_messages);
    CHECK(long_messages->communication == Approx(2 - 0.75 + 0.75 * g.collective_sm_share));
    // Half run beside the attention's projections, half the MLP's: a small projection share
    // leaves its half exposed past them, which the MLP's products cannot take.
    bytes.tensor_parallel = 4e10, bytes.projection_share = 0.05;  // 0.2 s a half
    const auto lopsided = step_time(g, p, flops, bytes);
    REQUIRE(lopsided);
    const double exposed = (0.2 - 0.05 * 0.75) + 0.2 / 4;
    CHECK(lopsided->communication == Approx(exposed + (0.4 - exposed) * g.collective_sm_share));
    // LLaMA 7B: 8 h^2 of projections a token beside 6 h ffn of its gated MLP.
    Architecture llama;
    llama.hidden = 4096, llama.layers = 32, llama.heads = 32, llama.ffn = 11008;
    llama.vocab = 32000;
    CHECK(projection_share(llama) == Approx(8.0 * 4096 / (8.0 * 4096 + 6.0 * 11008)));
}

TEST_CASE("traffic: full recomputation reruns the forward's collectives, async TP splits them",
          "[plan][time]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 4, request.global_batch = 4, request.base.seq = 1024;
    Parallelism p;
    p.tp = 4, p.microbatches = 4, p.sequence_parallel = true;
    const auto bytes = [&](Recompute mode, std::optional<std::uint64_t> first, TpOverlap overlap) {
        PlanRequest with = request;
        with.base.framework.tp_overlap = overlap;
        detail::WorkloadCache workload(m, with);
        Parallelism q = p;
        q.recompute_layers = first;
        const Workload& w = workload(1, mode)->first;
        return traffic(w, q, stage_facts(w, q, 0));
    };
    const Traffic none = bytes(Recompute::none, std::nullopt, TpOverlap::none);
    const Traffic full = bytes(Recompute::full, std::nullopt, TpOverlap::none);
    CHECK(none.tensor_parallel_pieces == 1);
    CHECK(full.tensor_parallel == Approx(none.tensor_parallel * 6 / 4));  // 6 collectives, not 4
    CHECK(full.tensor_parallel_messages == Approx(none.tensor_parallel_messages * 6 / 4));
    const double L = static_cast<double>(m.layers);
    const Traffic two = bytes(Recompute::full, 2, TpOverlap::none);  // two layers rerun
    CHECK(two.tensor_parallel == Approx(none.tensor_parallel * (4 * L + 2 * 2) / (4 * L)));
    CHECK(bytes(Recompute::selective, std::nullopt, TpOverlap::none).tensor_parallel ==
          Approx(none.tensor_parallel));  // the attention core alone: no collective
    CHECK(bytes(Recompute::none, std::nullopt, TpOverlap::matmul).tensor_parallel_pieces == 4);
    p.sequence_parallel = false;  // all-reduces: no collective matmul to run them in
    CHECK(bytes(Recompute::none, std::nullopt, TpOverlap::matmul).tensor_parallel_pieces == 1);
}

TEST_CASE("step_time: the roofline, attention's kernel, element-wise work and all-to-alls",
          "[plan][time]") {
    Gpu g = round_gpu();
    g.memory_bandwidth = 1'000'000'000'000ULL;  // 1 TB/s
    Parallelism p;
    p.dp = 2, p.microbatches = 4;
    DeviceWork work;
    work.flops = 1.4e15, work.attention_flops = 4e14, work.attention_computed = 0.5;
    work.elementwise_bytes = 5e11;
    work.weight_reads = 1e11;  // 0.1 s: under the products' 1e15 / 2 / 7e13 = 7.1 s
    auto t = step_time(g, p, work, Traffic{});
    REQUIRE(t);
    const double matmuls = 1e15 / 2 / (1e14 * 0.7), attention = 2e14 / 2 / (1e14 * 0.4);
    CHECK(t->compute == Approx(matmuls + attention + 0.5));
    work.weight_reads = 1e13;  // 10 s of reading: the products wait on memory
    t = step_time(g, p, work, Traffic{});
    REQUIRE(t);
    CHECK(t->compute == Approx(10 + attention + 0.5));

    Parallelism experts;
    experts.pp = 4, experts.ep = 4, experts.microbatches = 8;
    Traffic a2a;
    a2a.expert_parallel = 1e10, a2a.expert_parallel_messages = 100;  // in one node: 0.101 s
    const auto plain = step_time(g, experts, 1e15, a2a);
    REQUIRE(plain);
    CHECK(plain->communication == Approx(0.1 + 100 * g.intra_node_latency));
    experts.schedule = Schedule::dualpipe;  // its chunk pairs hide the all-to-alls
    const auto dual = step_time(g, experts, 1e15, a2a);
    REQUIRE(dual);
    CHECK(dual->communication == 0);
}

TEST_CASE("slowest_stage_share: the head's logits beside the last stage's layers", "[plan][time]") {
    const Architecture m = small_llama_4kv();  // 16 layers
    Settings s;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(
        m, 1024, 1, s.recipe.precision(), s.activations, s.framework, s.recompute_modules, {});
    const Workload w =
        make_workload(m, s.recipe, 1024, 1, Recompute::none, params, tables, s.framework);
    const ComputeCost c = compute_cost(m, 1024, 1, Recompute::none);
    const double L = 3 * c.layer_forward(), H = 3 * c.head_forward;
    Parallelism p;
    CHECK(slowest_stage_share(w, p, c) == 1);  // no pipeline
    p.pp = 2, p.microbatches = 2;              // 8 + 8 layers, the head on the second
    CHECK(slowest_stage_share(w, p, c) == Approx((8 * L + H) * 2 / (16 * L + H)));
    p.pp = 4, p.microbatches = 4;
    p.first_stage_layers = 3, p.last_stage_layers = 3;  // 3 + 5 + 5 + 3
    CHECK(slowest_stage_share(w, p, c) == Approx(std::max(5 * L, 3 * L + H) * 4 / (16 * L + H)));
    // Recomputation reruns every layer's forward, not the head's: the layers weigh more.
    const ComputeCost full = compute_cost(m, 1024, 1, Recompute::full);
    p.first_stage_layers = p.last_stage_layers = 0;
    CHECK(slowest_stage_share(w, p, full) ==
          Approx((4 * (L + L / 3) + H) * 4 / (16 * (L + L / 3) + H)));
}

TEST_CASE("element-wise traffic: eager RMSNorm's temporaries, none where fused or compiled",
          "[plan][time]") {
    const Architecture m = small_llama_4kv();
    const Settings s;
    const std::uint64_t seq = 1024;
    // One layer's EagerTraffic on one device under `mode`, its tables the architecture model's.
    const auto traffic = [&](const Architecture& a, Recompute mode, const Framework& f) {
        const auto params = parameter_splits(parameter_table(a), a.vocab);
        const ActivationTables t = activation_tables(a, seq, 1, s.recipe.precision(),
                                                     ActivationModel::architecture, f, {}, {});
        const Workload w = make_workload(a, s.recipe, seq, 1, mode, params, t, f);
        return w.layers[0].eager_traffic.on_rank(Parallelism{}, a.vocab).value();
    };
    const std::uint64_t sbh = seq * m.hidden, fp32 = 4, bf16 = 2;
    // Two norms a layer, each temporary written and read: in forward pow(x, 2)'s and x * rsqrt's
    // outputs; in backward the weight's two products and seven fp32 tensors.
    const std::uint64_t forward = 2 * fp32, backward = 2 * bf16 + 7 * fp32;
    CHECK(traffic(m, Recompute::none, s.framework) == 2 * 2 * sbh * (forward + backward));
    // Full recomputation runs each norm's forward again; selective keeps the norms' rows.
    CHECK(traffic(m, Recompute::full, s.framework) == 2 * 2 * sbh * (2 * forward + backward));
    CHECK(traffic(m, Recompute::selective, s.framework) == 2 * 2 * sbh * (forward + backward));
    // Before torch 2.2 mean keeps x^2: a row, which the element-wise passes count.
    Framework old = s.framework;
    old.torch = TorchVersion::v1_13;
    CHECK(traffic(m, Recompute::none, old) == 2 * 2 * sbh * (fp32 + backward));
    // One fused kernel, or a compiled layer, keeps its intermediates on chip.
    Architecture fused = m, compiled = m;
    fused.rmsnorm_kernel = RmsnormKernel::fused;
    compiled.compile = Compile::layers;
    CHECK(traffic(fused, Recompute::none, s.framework) == 0);
    CHECK(traffic(compiled, Recompute::none, s.framework) == 0);
}

TEST_CASE("element-wise traffic: the loss kernel's passes over the vocabulary, on the head's stage",
          "[plan][time]") {
    Architecture m = small_llama_4kv();
    m.rmsnorm_kernel = RmsnormKernel::fused;  // the final norm's own temporaries: none
    Settings s;
    const std::uint64_t seq = 1024;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const auto workload = [&](LossKernel loss, Precision precision) {
        Framework f = s.framework;
        f.loss = loss;
        const ActivationTables t =
            activation_tables(m, seq, 1, precision, ActivationModel::architecture, f, {}, {});
        return make_workload(m, s.recipe, seq, 1, Recompute::none, params, t, f);
    };
    const auto traffic = [&](LossKernel loss, Precision precision = Precision(DType::bf16)) {
        return workload(loss, precision).head_traffic.on_rank(Parallelism{}, m.vocab).value();
    };
    // Each temporary written once and read once: N elements of the logits, fp32 or bf16.
    const std::uint64_t N = seq * m.vocab, wide = 4, narrow = 2;
    // Eager cross_entropy(logits.float()): the copy; NLL's dense gradient; its cast back.
    CHECK(traffic(LossKernel::fp32) == 2 * N * (wide + wide + narrow));
    CHECK(traffic(LossKernel::chunked) == traffic(LossKernel::fp32));
    CHECK(traffic(LossKernel::bf16) == 2 * N * narrow);  // no copy: NLL's gradient in bf16
    const Precision autocast(DType::bf16, DType::fp32, true);
    CHECK(traffic(LossKernel::bf16, autocast) == traffic(LossKernel::fp32, autocast));
    // Megatron-LM's: three passes in place forward, two backward, then the cast.
    CHECK(traffic(LossKernel::fp32_inplace) == 2 * N * (5 * wide + narrow));
    CHECK(traffic(LossKernel::fused) == 2 * N * 2 * narrow);
    CHECK(traffic(LossKernel::fused_linear) == 2 * N * 2 * narrow);
    // fp32 training: no copy to make.
    CHECK(traffic(LossKernel::fp32, Precision(DType::fp32)) == 2 * N * wide);
    // A device's step: the head's stage holds it, the mean stage a pp-th, each micro-batch; the
    // log-probabilities the fp32 kernel keeps take the element-wise passes as a layer's rows do.
    PlanRequest request;
    request.gpus = 2, request.global_batch = 4, request.base.seq = seq;
    Parallelism p;
    p.pp = 2, p.microbatches = 4;
    const auto bytes = [&](LossKernel loss) {
        const Workload w = workload(loss, Precision(DType::bf16));
        const ComputeCost c = compute_cost(m, seq, 1, Recompute::none);
        const StageMix mix = stage_mix(m.layers, w.parameters->pattern, p);
        return device_work(w, p, stage_facts(w, p, 0), mix, c, request, 1.0 / 3).elementwise_bytes;
    };
    const double kept = elementwise_passes * static_cast<double>(N * wide);
    CHECK(bytes(LossKernel::fp32) - bytes(LossKernel::fused) ==
          Approx((kept + static_cast<double>(2 * N * (2 * wide - narrow))) * 4 / 2));
}

TEST_CASE("the device's optimiser step: a fused kernel's passes or the unfused code's, sharded",
          "[plan][time]") {
    const Architecture m = small_llama_4kv();
    const Settings s;
    const Recipe& r = s.recipe;
    REQUIRE(r.master);  // mixed precision: an fp32 master copy beside the weights
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(m, 1024, 1, r.precision(), s.activations,
                                                      s.framework, s.recompute_modules, {});
    const auto bytes = [&](OptimizerImpl impl, Parallelism p) {
        Framework f = s.framework;
        f.optimizer = impl;
        const Workload w = make_workload(m, r, 1024, 1, Recompute::none, params, tables, f);
        return traffic(w, p, stage_facts(w, p, 0)).device_optimizer;
    };
    const Workload plain = make_workload(m, r, 1024, 1, Recompute::none, params, tables, {});
    const double P = static_cast<double>(stage_facts(plain, {}, 0).parameters.value());
    const double state = static_cast<double>(bytes_per_element(r.state)),
                 master = static_cast<double>(r.master_bytes()),
                 weight = static_cast<double>(r.weight_bytes()),
                 gradient = static_cast<double>(r.gradient_bytes());
    // Fused: Adam's m and v read and written, the master read and written, the gradient read;
    // then the master cast back to the weights.
    const double fused = P * (2 * 2 * state + 2 * master + gradient + weight);
    CHECK(bytes(OptimizerImpl::fused, {}) == Approx(fused));
    // torch.optim's foreach and loop: AdamW's 20 passes over each tensor in the state dtype.
    CHECK(bytes(OptimizerImpl::foreach, {}) == Approx(P * (20 * state + weight)));
    CHECK(bytes(OptimizerImpl::for_loop, {}) == bytes(OptimizerImpl::foreach, {}));
    Parallelism sharded;
    sharded.dp = 4, sharded.zero = 1;  // each rank steps its quarter
    CHECK(bytes(OptimizerImpl::fused, sharded) == Approx(fused / 4).epsilon(1e-6));
    sharded.offload = Offload::optimizer;  // the host steps it
    CHECK(bytes(OptimizerImpl::fused, sharded) == 0);
    // At the memory's bandwidth, after the last backward; a GPU without the figure: untimed.
    Traffic t;
    t.device_optimizer = 2e12;
    Gpu g = round_gpu();
    CHECK(step_time(g, {}, 1e15, t)->optimizer == 0);
    g.memory_bandwidth = 1'000'000'000'000ULL;
    const auto timed = step_time(g, {}, 1e15, t);
    CHECK(timed->optimizer == Approx(2));
    CHECK(timed->seconds() == Approx(timed->compute + 2));
}

TEST_CASE("Muon's Newton-Schulz on the device: every layer matrix whole, shared over replicas",
          "[plan][time]") {
    const Architecture m = small_llama_4kv();  // h 2048, k and v 512 wide, ffn 5632, 16 layers
    const Recipe muon = *find_recipe("muon");
    Settings s;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(m, 1024, 1, muon.precision(), s.activations,
                                                      s.framework, s.recompute_modules, {});
    const auto flops = [&](const Recipe& r, Parallelism p) {
        const Workload w = make_workload(m, r, 1024, 1, Recompute::none, params, tables, {});
        return newton_schulz_on_rank(w, p, stage_facts(w, p, 0));
    };
    // Five steps of X X^T, A A and B X: 5 (4 m^2 M + 2 m^3) for an m x M matrix, m <= M.
    const auto ns = [](double a, double b) { return 5 * (4 * a * a * b + 2 * a * a * a); };
    const double layer = 2 * ns(2048, 2048) + 2 * ns(512, 2048) + 3 * ns(2048, 5632);
    CHECK(flops(muon, {}) == Approx(16 * layer));
    Parallelism p;
    p.dp = 4, p.tp = 2;  // each replica a quarter; both tensor-parallel ranks the whole matrices
    CHECK(flops(muon, p) == Approx(16 * layer / 4));
    p.pp = 2, p.microbatches = 2;  // the first stage's 8 layers
    CHECK(flops(muon, p) == Approx(8 * layer / 4));
    CHECK(flops(s.recipe, p) == 0);  // Adam multiplies no matrices
    // At the GEMM efficiency, after the last backward.
    DeviceWork work;
    work.optimizer_flops = 7e13;
    const auto t = step_time(round_gpu(), {}, work, Traffic{});
    REQUIRE(t);
    CHECK(t->optimizer == Approx(7e13 / (1e14 * 0.7)));
}

TEST_CASE(
    "plan's times: the step's FLOPs with recomputation at the busiest stage's pace, and 2 x "
    "gradient bytes x (dp-1)/dp",
    "[plan][time]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 16, request.capacity = 20000000000ULL, request.base.seq = 1024,
    request.global_batch = 32;
    request.gpu = round_gpu();
    const auto rows = plan(m, request);
    double last = 0;
    bool fitting = true;
    for (const PlanRow& r : rows) {
        REQUIRE(r.time);
        const Parallelism& p = r.parallel;
        ComputeCost c = compute_cost(m, 1024, r.micro_batch, r.recompute);
        if (const auto& n = r.parallel.recompute_layers)  // the first n of each chunk, of 16 layers
            c.recompute *= static_cast<double>(*n * p.pp * p.vpp) / 16;
        const double flops = (c.step + c.recompute) * static_cast<double>(32 / r.micro_batch);
        // The attention core's share of the FLOPs at its kernel's rate (eager: every score), the
        // rest at the GEMMs'; the round GPU has no memory bandwidth, so no memory-bound work.
        const double attention = flops * 3 * c.attention_core * 16 / c.step;
        // The busiest pipeline rank sets the pace: its layers' work and the head's, over the
        // mean's.
        double most = 0, total = 0;
        for (std::uint64_t stage = 0; stage < p.pp; ++stage) {
            const double work = static_cast<double>(stage_layer_count(p, 16, stage)) *
                                    (3 * c.layer_forward() + c.recompute / 16) +
                                (holds_head(p, stage) ? 3 * c.head_forward : 0);
            most = std::max(most, work), total += work;
        }
        const double share = most * static_cast<double>(p.pp) / total;
        CHECK(r.time->compute == Approx(share * ((flops - attention) / (16 * 1e14 * 0.7) +
                                                 attention / (16 * 1e14 * 0.4))));
        CHECK(r.time->bubble >= r.time->compute * static_cast<double>(p.pp - 1) /
                                    static_cast<double>(p.microbatches * p.vpp) * (1 - 1e-9));
        if (r.fits != fitting)
            last = 0, fitting = r.fits;  // each group ranked by time, fitting ones first
        CHECK(r.time->seconds() >= last);
        last = r.time->seconds();
        const auto tokens = tokens_per_second_per_gpu(request, r);
        REQUIRE(tokens);
        CHECK(*tokens == Approx(32.0 * 1024 / (r.time->seconds() * 16)));
        CHECK((r.time->offload > 0) ==
              (p.offload != Offload::none));  // only offload crosses the host link
    }
    // A layout whose only traffic is the gradient all-reduce: dp 16 (two nodes: across them).
    Settings s;
    s.seq = 1024, s.micro_batch = 2, s.parallel.dp = 16, s.parallel.microbatches = 1;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(
        m, 1024, 2, s.recipe.precision(), s.activations, s.framework, s.recompute_modules, {});
    const Workload w =
        make_workload(m, s.recipe, 1024, 2, Recompute::none, params, tables, s.framework);
    const StageFacts f = stage_facts(w, s.parallel, 0);
    const Traffic bytes = traffic(w, s.parallel, f);
    const DataParallelBytes& dp = bytes.data_parallel;
    CHECK(dp.last_backward == Approx(2.0 * static_cast<double>(f.parameters.value()) *
                                     static_cast<double>(s.recipe.gradient_bytes()) * 15 / 16));
    CHECK(dp.total() == dp.last_backward);  // once a step, beside the one micro-batch's backward
    CHECK(dp.pieces == static_cast<double>(m.layers));
    CHECK(bytes.tensor_parallel == 0);
    CHECK(bytes.pipeline == 0);
    CHECK(bytes.context_parallel == 0);
    const auto t = step_time(round_gpu(), s.parallel, 1e15, bytes);
    REQUIRE(t);
    // Of the all-reduce, a layer at a time, what the one micro-batch's backward (2/3 of the
    // compute) does not hide: its last layer's, or what runs past the backward.
    const double backward = 1e15 / (16 * 1e14 * 0.7) * 2 / 3, n = dp.pieces;
    const double comm = dp.last_backward / 1e10;
    CHECK(t->communication == Approx(std::max(comm / n, comm - backward * (n - 1) / n)));
    CHECK(step_time(round_gpu(), s.parallel, 1e12, bytes)->communication ==
          Approx(comm - backward / 1000 * (n - 1) / n));  // a short step hides little
}

TEST_CASE("data-parallel bytes by ZeRO stage, each beside the compute it serves", "[plan][time]") {
    const Architecture m = small_llama_4kv();
    Settings s;
    s.parallel.dp = 4, s.parallel.microbatches = 4;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(
        m, 1024, 2, s.recipe.precision(), s.activations, s.framework, s.recompute_modules, {});
    const auto bytes_at = [&](unsigned zero, std::uint64_t gathered, DpOverlap overlap) {
        Parallelism p = s.parallel;
        p.zero = zero, p.gathered_layers = gathered;
        Framework f = s.framework;
        f.dp_overlap = overlap;
        const Workload w = make_workload(m, s.recipe, 1024, 2, Recompute::none, params, tables, f);
        const StageFacts facts = stage_facts(w, p, 0);
        const double P = static_cast<double>(facts.parameters.value()) * 3 / 4;  // ring over 4
        return std::pair{traffic(w, p, facts).data_parallel, P};
    };
    const double g = static_cast<double>(s.recipe.gradient_bytes()),
                 wb = static_cast<double>(s.recipe.weight_bytes());
    const auto [plain, P] = bytes_at(0, 2, DpOverlap::layers);
    CHECK(plain.last_backward == Approx(2 * P * g));  // one all-reduce a step
    CHECK(plain.total() == plain.last_backward);
    CHECK(plain.pieces == static_cast<double>(m.layers));
    const auto one = bytes_at(1, 2, DpOverlap::layers).first;  // reduce-scatter, then gather
    CHECK(one.last_backward == Approx(P * g));
    CHECK(one.first_forward == Approx(P * wb));
    CHECK(one.total() == Approx(P * (g + wb)));
    const auto two = bytes_at(2, 2, DpOverlap::layers).first;  // a reduce-scatter each micro-batch
    CHECK(two.every_backward == Approx(4 * P * g));
    CHECK(two.first_forward == Approx(P * wb));
    CHECK(two.last_backward == 0);
    const auto three = bytes_at(3, 2, DpOverlap::layers).first;
    CHECK(three.every_forward == Approx(4 * P * wb));  // a gather each forward
    CHECK(three.every_backward ==
          Approx(4 * P * (wb + g)));  // and each backward, with the reduction
    CHECK(three.exposed == 0);
    const auto unfetched = bytes_at(3, 1, DpOverlap::layers).first;  // no layer prefetched
    CHECK(unfetched.exposed == Approx(8 * P * wb));
    CHECK(unfetched.every_backward == Approx(4 * P * g));
    CHECK(unfetched.every_forward == 0);
    const auto none = bytes_at(3, 2, DpOverlap::none).first;
    CHECK(none.exposed == Approx(three.total()));
    CHECK(none.total() == Approx(three.total()));

    // On the round GPU (dp 4 in a node: 100 GB/s), each window's messages beside its compute: a
    // forward a third of the step, a backward two thirds; n pieces, the last one's exposed.
    const Gpu gpu = round_gpu();
    const double n = three.pieces;
    for (const double flops : {1e13, 1e17}) {
        const double compute = flops / (4 * 1e14 * 0.7);
        const double forward = three.every_forward / 1e11, backward = three.every_backward / 1e11;
        const auto beside = [&](double c, double window) {
            return std::max(c / n, c - window * (n - 1) / n);
        };
        Traffic bytes;
        bytes.data_parallel = three;
        const auto t = step_time(gpu, s.parallel, flops, bytes);
        REQUIRE(t);
        CHECK(t->communication ==
              Approx(beside(forward, compute / 3) + beside(backward, compute * 2 / 3)));
        bytes.data_parallel = none;
        CHECK(step_time(gpu, s.parallel, flops, bytes)->communication ==
              Approx(forward + backward));  // none hidden
    }
}

TEST_CASE("hidden messages take their kernels' share of the compute they run beside",
          "[plan][time]") {
    Gpu g = round_gpu();
    g.collective_sm_share = 0.25;
    Parallelism ring;
    ring.tp = 2, ring.cp = 8, ring.microbatches = 8;  // the ring crosses nodes: 10 GB/s
    DeviceWork work;
    work.flops = 1.6e16, work.attention_flops = 1.6e14;   // attention: 1.6e14/16/(1e14 x 0.4)
    const double attention = 1.6e14 / 16 / (1e14 * 0.4);  // 0.25 s
    Traffic bytes;
    bytes.context_parallel = 1e9;  // 0.1 s: hidden under the attention, a quarter of it lost
    const auto hidden = step_time(g, ring, work, bytes);
    REQUIRE(hidden);
    CHECK(hidden->communication == Approx(0.1 * 0.25));
    bytes.context_parallel = 5e9;  // 0.5 s: 0.25 s exposed past the attention, 0.25 s hidden
    const auto past = step_time(g, ring, work, bytes);
    REQUIRE(past);
    CHECK(past->communication == Approx(0.5 - attention + attention * 0.25));

    // A data-parallel all-reduce of 0.2 s in 10 pieces beside the last backward: one piece
    // exposed, nine hidden.
    Parallelism dp;
    dp.dp = 8, dp.microbatches = 1;
    Traffic reduce;
    reduce.data_parallel.last_backward = 2e10 * 0.2 / 2, reduce.data_parallel.pieces = 10;
    const auto t = step_time(g, dp, 1.6e16, reduce);
    REQUIRE(t);
    const double comm = reduce.data_parallel.last_backward / 1e11;  // dp 8 fills the node
    CHECK(t->communication == Approx(comm / 10 + comm * 9 / 10 * 0.25));
    g.collective_sm_share = 0;
    CHECK(step_time(g, dp, 1.6e16, reduce)->communication == Approx(comm / 10));
}

TEST_CASE("plan_fewest: the first count, by hand, on which a layout fits", "[plan][fewest]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.capacity = 9000000000ULL, request.base.seq = 2048, request.global_batch = 16;
    // By hand: the first count whose plan has a fitting row.
    std::uint64_t first = 0, first_even = 0;
    for (std::uint64_t n = 1; n <= 16 && (first == 0 || first_even == 0); ++n) {
        request.gpus = n;
        const auto rows = plan(m, request);
        const bool fits =
            std::any_of(rows.begin(), rows.end(), [](const PlanRow& r) { return r.fits; });
        if (fits && first == 0) first = n;
        if (fits && first_even == 0 && n % 4 == 0) first_even = n;
    }
    REQUIRE(first > 1);  // one device does not hold it: the search has work to do
    PlanRequest any = request;
    const PlanSummary found = plan_fewest(m, any, 1, 3);
    CHECK(any.gpus == first);
    CHECK(found.fitting > 0);
    for (const PlanRow& r : found.top) CHECK(r.parallel.devices() == first);
    PlanRequest nodes = request;
    plan_fewest(m, nodes, 4, 3);
    CHECK(nodes.gpus == first_even);
    PlanRequest hopeless = request;
    hopeless.capacity = 1000;
    hopeless.tp = {1}, hopeless.pp = {1}, hopeless.cp = {1},
    hopeless.dp = {1};  // pinned to one device: a quick no
    const PlanSummary none = plan_fewest(m, hopeless, 1, 3);
    CHECK(hopeless.gpus == 0);
    CHECK(none.fitting == 0);
}

TEST_CASE("pinned degrees, ZeRO stages and sequence parallelism restrict the search to them",
          "[plan][pin]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 16, request.capacity = 20000000000ULL, request.base.seq = 1024,
    request.global_batch = 32;
    const auto all = plan(m, request);
    PlanRequest pinned = request;
    pinned.tp = {2, 4}, pinned.zero = {1}, pinned.sequence_parallel = true, pinned.pp = {2},
    pinned.modes = {Recompute::selective};
    pinned.micro_batches = {1, 2};
    const auto some = plan(m, pinned);
    std::set<Key> expected, found;
    for (const PlanRow& r : all) {
        const Parallelism& p = r.parallel;
        // a pinned ZeRO stage says nothing of a single replica, which keeps stage 0
        const bool zero = p.zero == 1 || (p.dp == 1 && p.zero == 0);
        if ((p.tp == 2 || p.tp == 4) && zero && p.sequence_parallel && p.pp == 2 &&
            r.recompute == Recompute::selective && r.micro_batch <= 2)
            expected.insert(layout_text_key(r));
    }
    for (const PlanRow& r : some) found.insert(layout_text_key(r));
    REQUIRE(!expected.empty());
    CHECK(found == expected);
    CHECK(some.size() == expected.size());
    // Pinned on or off, it binds where tp > 1 (Megatron-LM turns it off at tp 1).
    for (bool sp : {true, false}) {
        PlanRequest with = request;
        with.sequence_parallel = sp;
        std::set<Key> kept, seen;
        for (const PlanRow& r : all)
            if (r.parallel.tp == 1 || r.parallel.sequence_parallel == sp)
                kept.insert(layout_text_key(r));
        const auto rows = plan(m, with);
        for (const PlanRow& r : rows) seen.insert(layout_text_key(r));
        CHECK(seen == kept);
        CHECK(std::any_of(rows.begin(), rows.end(),
                          [](const PlanRow& r) { return r.parallel.tp == 1; }));
        CHECK(std::any_of(rows.begin(), rows.end(),
                          [](const PlanRow& r) { return r.parallel.tp > 1; }));
    }
    const auto some_rows = [&](const PlanRequest& r) {
        auto rows = plan(m, r);
        REQUIRE(!rows.empty());
        return rows;
    };
    // Micro-batch counts: as many as pipeline stages (torchtitan's default), or those listed.
    PlanRequest per_stage = request;
    per_stage.microbatches_per_stage = true;
    const auto staged = some_rows(per_stage);
    for (const PlanRow& r : staged) CHECK(r.parallel.microbatches == r.parallel.pp);
    CHECK(std::any_of(staged.begin(), staged.end(),
                      [](const PlanRow& r) { return r.parallel.pp > 1; }));
    PlanRequest listed = request;
    listed.microbatch_counts = {4};
    const auto four = some_rows(listed);
    for (const PlanRow& r : four) {
        CHECK(r.parallel.microbatches == 4);
        CHECK(r.micro_batch * r.parallel.dp * 4 == request.global_batch);
    }
    PlanRequest by_dp = request;
    by_dp.dp = {4}, by_dp.cp = {1};
    for (const PlanRow& r : plan(m, by_dp)) {
        CHECK(r.parallel.dp == 4);
        CHECK(r.parallel.cp == 1);
    }
    PlanRequest interleaved = request;
    interleaved.vpp = {2};
    const auto two = some_rows(interleaved);
    for (const PlanRow& r : two) {
        CHECK(r.parallel.vpp == 2);
        CHECK(r.parallel.microbatches % r.parallel.pp == 0);
    }
}

TEST_CASE(
    "offload's host transfers: the gradient shard down, the weight shard up, at the host bandwidth",
    "[plan][time][offload]") {
    const Architecture m = small_llama_4kv();
    Settings s;
    s.seq = 1024, s.micro_batch = 2;
    s.parallel.dp = 4, s.parallel.zero = 3, s.parallel.microbatches = 4;  // 32 sequences a step
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(
        m, 1024, 2, s.recipe.precision(), s.activations, s.framework, s.recompute_modules, {});
    const Workload w =
        make_workload(m, s.recipe, 1024, 2, Recompute::none, params, tables, s.framework);
    // By hand: every parameter trains; ZeRO-3 over 4 ranks leaves each a quarter (rounded up).
    const double P = static_cast<double>(stage_facts(w, s.parallel, 0).parameters.value());
    const double shard = std::ceil(P / 4), g = static_cast<double>(s.recipe.gradient_bytes()),
                 wb = static_cast<double>(s.recipe.weight_bytes());
    const Traffic none = traffic(w, s.parallel, stage_facts(w, s.parallel, 0));
    CHECK(none.offload == 0);

    s.parallel.offload =
        Offload::optimizer;  // gradients down, the updated weights back, once a step
    const Traffic optimizer = traffic(w, s.parallel, stage_facts(w, s.parallel, 0));
    CHECK(optimizer.offload == Approx(shard * g + shard * wb));
    CHECK(optimizer.data_parallel.total() ==
          Approx(none.data_parallel.total()));  // the network's bytes are as they were
    CHECK(optimizer.total() == Approx(none.total() + optimizer.offload));
    const Gpu gpu = round_gpu();
    const auto t = step_time(gpu, s.parallel, 1e15, optimizer);
    REQUIRE(t);
    CHECK(t->offload == Approx((shard * g + shard * wb) / 2e10));
    // The host's Adam step: the fp32 master copy and both moments read and written (2 x 12 bytes),
    // the fp32 gradient read and the weight written: 30 bytes for each parameter of the shard, at
    // the assumed bandwidth.
    CHECK(none.host_optimizer == 0);
    CHECK(optimizer.host_optimizer == Approx(30 * shard));
    CHECK(t->host_optimizer == Approx(30 * shard / assumed_host_optimizer_bandwidth));
    CHECK(t->seconds() ==
          Approx(t->compute + t->bubble + t->communication + t->offload + t->host_optimizer));

    s.parallel.offload = Offload::parameters;  // and the weights up for each of 4 micro-batches'
                                               // forward and backward
    const StageFacts f = stage_facts(w, s.parallel, 0);
    CHECK(static_cast<double>(f.host_weights.value()) == shard * wb);
    const Traffic parameters = traffic(w, s.parallel, f);
    CHECK(parameters.offload == Approx(shard * g + 2 * 4 * shard * wb));
    CHECK(parameters.host_optimizer ==
          Approx(30 * shard));  // the same step, wherever the weights live
    const auto tp = step_time(gpu, s.parallel, 1e15, parameters);
    REQUIRE(tp);
    CHECK(tp->offload == Approx((shard * g + 8 * shard * wb) / 2e10));

    Gpu no_host = gpu;  // without the host link's figure an offloaded layout has no time; the rest
                        // keep theirs
    no_host.host_bandwidth = 0;
    CHECK_FALSE(step_time(no_host, s.parallel, 1e15, parameters));
    s.parallel.offload = Offload::none;
    CHECK(step_time(no_host, s.parallel, 1e15, none));
}

TEST_CASE("plan --offload pins the offload modes, and names a mode no pinned ZeRO stage allows",
          "[plan][pin][offload][cli][slow-sanitized]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 16, request.capacity = 20000000000ULL, request.base.seq = 1024,
    request.global_batch = 32;
    const auto all = plan(m, request);
    for (const std::vector<Offload>& pins :
         {std::vector<Offload>{Offload::parameters},
          std::vector<Offload>{Offload::none, Offload::optimizer}}) {
        PlanRequest pinned = request;
        pinned.offload = {pins.begin(), pins.end()};
        std::set<Key> expected, found;
        for (const PlanRow& r : all)
            if (allowed(pins, r.parallel.offload)) expected.insert(layout_text_key(r));
        for (const PlanRow& r : plan(m, pinned)) {
            found.insert(layout_text_key(r));
            if (r.parallel.offload == Offload::parameters) CHECK(r.parallel.zero == 3);
            if (r.parallel.offload == Offload::optimizer) CHECK(r.parallel.zero >= 1);
        }
        REQUIRE(!expected.empty());
        CHECK(found == expected);
    }
    const std::string run =
        "plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 4096 --global-batch 64 --top 5 "
        "--format json";
    const auto parameters = testing::memcalc(run + " --offload parameters");
    REQUIRE(parameters.status == 0);
    const auto rows = nlohmann::json::parse(parameters.out)["layouts"];
    REQUIRE(!rows.empty());
    for (const auto& row : rows) {
        CHECK(row["offload"] == "parameters");
        CHECK(row["zero"] == 3);
    }
    const auto csv = testing::memcalc(
        "plan --preset llama-7b --gpus 8 --gpu h100-sxm --seq 4096 --global-batch 64 --top 2 "
        "--format csv --offload optimizer --zero 2");
    REQUIRE(csv.status == 0);
    CHECK_THAT(csv.out, Catch::StartsWith("rank,") &&
                            Catch::Contains(",vpp,offload,schedule,recompute_layers,host_bytes\n"));
    CHECK_THAT(csv.out,
               Catch::Contains(
                   ",optimizer,1f1b,,"));  // every layer of its recomputation, then its host bytes
    // Not given, none alone is tried (offload's host memory and CPU time go unchecked): asked for,
    // all three.
    const auto unasked = nlohmann::json::parse(testing::memcalc(run).out);
    const auto three =
        nlohmann::json::parse(testing::memcalc(run + " --offload none,optimizer,parameters").out);
    const auto only_none = nlohmann::json::parse(testing::memcalc(run + " --offload none").out);
    CHECK(unasked["evaluated"] == only_none["evaluated"]);
    CHECK(three["evaluated"].get<std::size_t>() > only_none["evaluated"].get<std::size_t>());
    for (const auto& row : unasked["layouts"]) CHECK(row["offload"] == "none");
    const auto wrong = testing::memcalc(run + " --offload parameters --zero 1,2");
    CHECK(wrong.status == 2);
    CHECK_THAT(wrong.err, Catch::Contains("--offload parameters needs --zero 3"));
    const auto typo = testing::memcalc(run + " --offload optimiser");
    CHECK(typo.status == 2);
    CHECK_THAT(typo.err, Catch::Contains("did you mean 'optimizer'"));
}

TEST_CASE("a layout that offloads fits only where its host memory does too, when that is given",
          "[plan][offload]") {
    const Architecture m = fixtures::llama_7b();
    PlanRequest request;
    request.gpus = 8, request.capacity = 1ULL << 50, request.base.seq = 1024,
    request.global_batch = 8;
    request.dp = {8}, request.zero = {3}, request.modes = {Recompute::none},
    request.micro_batches = {1};
    request.offload = {OffloadMode{Offload::optimizer, false}};
    // ZeRO-Offload's host share of a device, by hand: the fp32 master copy, Adam's two fp32 moments
    // and the fp32 gradient shard, 16 bytes for each of its ceil(6,738,415,616 / 8) parameters.
    const Count host = Count(842'301'952) * 16;
    const auto only_row = [&] {
        const auto rows = plan(m, request);
        REQUIRE(rows.size() == 1);
        CHECK(rows.front().parallel.offload == Offload::optimizer);
        CHECK(rows.front().host == host);
        return rows.front();
    };
    CHECK(only_row().fits);  // no host memory given: not checked
    request.host_capacity = host;
    CHECK(only_row().fits);
    request.host_capacity = Count(host.value() - 1);
    CHECK_FALSE(only_row().fits);
    // A layout that keeps everything on the device is not held to it.
    request.offload = {OffloadMode{Offload::none, false}};
    const auto rows = plan(m, request);
    REQUIRE(rows.size() == 1);
    CHECK(rows.front().host == Count(0));
    CHECK(rows.front().fits);
}

TEST_CASE(
    "host memory (--host-memory) is checked in plan and in a single estimate, and said where it is "
    "not",
    "[plan][offload][cli]") {
    const std::string run =
        "plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 1024 --global-batch 8 --dp 8 "
        "--zero 3 --offload optimizer --recompute none -b 1";
    // 16 B for each of the device's 842,301,952 parameters: 13.5 GB.
    const auto unchecked = testing::memcalc(run);
    REQUIRE(unchecked.status == 0);
    CHECK_THAT(unchecked.out,
               Catch::Contains("Host memory was not checked") && Catch::Contains("13.5 GB"));
    const auto roomy = nlohmann::json::parse(
        testing::memcalc(run + " --host-memory 13476831232B --format json").out);
    CHECK(roomy["host_memory_bytes"] == 13476831232ULL);
    REQUIRE(roomy["layouts"].size() == 1);
    CHECK(roomy["layouts"][0]["host_bytes"] == 13476831232ULL);
    const auto tight = testing::memcalc(run + " --host-memory 13476831231B");
    REQUIRE(tight.status == 0);
    CHECK_THAT(tight.out,
               Catch::Contains("No layout fits") && Catch::Contains("at most 13.5 GB a device"));

    const std::string single =
        "--preset llama-7b --seq 1024 --dp 8 --zero 3 --offload optimizer --device-memory 80GB";
    CHECK_THAT(testing::memcalc(single + " --host-memory 16GB").out,
               Catch::Contains("host memory: 13.5 GB fits in 16.0 GB: 2.5 GB to spare"));
    CHECK_THAT(testing::memcalc(single + " --host-memory 12GB").out,
               Catch::Contains("host memory: 13.5 GB does not fit in 12.0 GB: 1.5 GB over"));
    const auto bad = testing::memcalc(single + " --host-memory lots");
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK_THAT(bad.err, Catch::Contains("--host-memory") && Catch::Contains("lots"));
}

namespace {
/// The rows for_each_layout makes, besides partial recomputation's, and the stages SearchSize says
/// they measure.
SearchSize made_by_search(const Architecture& m, const PlanRequest& request) {
    const bool uniform = LayerPattern(m).uniform();
    SearchSize made;
    for_each_layout(m, request, [&](const PlanRow& row) {
        if (row.parallel.recompute_layers && !request.recompute_layers) return;  // searched partial
        ++made.layouts;
        made.stages += uniform ? std::min<std::uint64_t>(row.parallel.pp, 3) : row.parallel.pp;
    });
    return made;
}

/// `r` with every knob that multiplies or restricts a search turned.
std::vector<PlanRequest> varied_searches(const PlanRequest& r) {
    PlanRequest wide = r;  // every schedule, offload and sequence parallelism
    for (const ScheduleRow& row : schedule_rows) wide.schedules.push_back(row.schedule);
    if (r.gpus > 1) wide.sequence_parallel = true;
    wide.offload = {{Offload::none, false},
                    {Offload::optimizer, false},
                    {Offload::none, true},
                    {Offload::parameters, true}};
    PlanRequest pinned = r;  // micro-batches, modes, recomputed layers and vpp
    pinned.micro_batches = {1, 3}, pinned.modes = {Recompute::full}, pinned.recompute_layers = 2;
    pinned.vpp = {1, 2};
    PlanRequest uneven = r;
    uneven.first_stage_layers = 4;
    PlanRequest counts = r;  // micro-batch counts: as many as stages, or listed
    counts.microbatches_per_stage = true;
    PlanRequest listed = r;
    listed.microbatch_counts = {2, 4};
    return {r, wide, pinned, uneven, counts, listed};
}
}  // namespace

TEST_CASE("a search is counted before it runs: its layouts exactly, and the stages each measures",
          "[plan][limit][slow-sanitized]") {
    PlanRequest base;
    base.capacity = 9000000000ULL, base.base.seq = 1024, base.global_batch = 48;
    for (std::uint64_t gpus : {1, 6, 8, 12}) {
        base.gpus = gpus;
        for (const Architecture& m : {small_llama_4kv(), fixtures::dense_then_moe()})
            for (const PlanRequest& request : varied_searches(base)) {
                CAPTURE(m.name, gpus, request.schedules.size(), request.micro_batches.size(),
                        request.first_stage_layers);
                const SearchSize counted = SearchCounter(m, request).size(gpus);
                const SearchSize made = made_by_search(m, request);
                CHECK(counted.layouts == made.layouts);
                CHECK(counted.stages == made.stages);
            }
    }
}

TEST_CASE(
    "a search past its limit is refused before it measures a layout, naming its size and the "
    "limit",
    "[plan][limit]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 8, request.capacity = 9000000000ULL, request.base.seq = 1024;
    request.global_batch = 16;
    const SearchSize size = SearchCounter(m, request).size(8);
    REQUIRE(size.layouts > 100);
    request.search_limit = size.stages;  // at the limit: searched
    CHECK(plan_top(m, request, 3).evaluated >= size.layouts);
    request.search_limit = size.stages - 1;
    std::size_t seen = 0;
    const auto count = [&](std::size_t) { ++seen; };
    const std::string says = "a plan on 8 devices would evaluate " + std::to_string(size.layouts) +
                             " layouts, measuring " + std::to_string(size.stages) +
                             " pipeline stages, past the search limit of " +
                             std::to_string(size.stages - 1);
    CHECK_THROWS_WITH(plan_top(m, request, 3, count), Catch::Contains(says));
    CHECK_THROWS_AS(plan(m, request, count), search_limit_error);
    // The search for the fewest counts every count it may try before it tries one.
    PlanRequest fewest = request;
    fewest.capacity = 1000;
    std::uint64_t every = 0;
    SearchCounter counter(m, fewest);
    for (std::uint64_t n = 2; n <= fewest_gpus_limit; n += 2) every += counter.size(n).stages;
    fewest.search_limit = every - 1;
    CHECK_THROWS_WITH(plan_fewest(m, fewest, 2, 3, count),
                      Catch::Contains("the search for the fewest devices (up to 16384, 2 at "
                                      "a time) would evaluate") &&
                          Catch::Contains(std::to_string(every) + " pipeline stages"));
    CHECK(seen == 0);
}

TEST_CASE("a search past its time limit ends with the best so far and its coverage",
          "[plan][limit]") {
    const Architecture m = small_llama_4kv();
    PlanRequest request;
    request.gpus = 8, request.capacity = 9000000000ULL, request.base.seq = 1024;
    request.global_batch = 16;
    const PlanSummary whole = plan_top(m, request, 3);
    CHECK(whole.complete);
    CHECK(whole.coverage() == 1);
    CHECK(whole.layouts == SearchCounter(m, request).size(8).layouts);
    request.time_limit = 0.0;  // past at once: the deadline is looked at before the first layout
    const PlanSummary none = plan_top(m, request, 3);
    CHECK_FALSE(none.complete);
    CHECK(none.evaluated == 0);
    CHECK(none.coverage() == 0);
    CHECK(none.top.empty());
    request.time_limit = 3600.0;  // never reached: the same as no limit
    const PlanSummary hour = plan_top(m, request, 3);
    CHECK(hour.complete);
    CHECK(hour.evaluated == whole.evaluated);
    REQUIRE(hour.top.size() == whole.top.size());
    for (std::size_t i = 0; i < hour.top.size(); ++i)
        CHECK(plan_key(hour.top[i]) == plan_key(whole.top[i]));
}

TEST_CASE("plan ends a search too large at its time limit, and --search-limit refuses it up front",
          "[plan][limit][cli]") {
    // memcalc 1.2 measured the first's 224 million layouts for 667 s, the second's 4.4 million 63.
    const std::string huge =
        "timeout 60 memcalc plan --preset llama-7b --gpus 14414400 --seq 720720 "
        "--global-batch 963761198400 --device-memory 80GB";
    const auto bounded = testing::shell(huge + " --time-limit 1 --format json");
    REQUIRE(bounded.status == 0);
    const auto j = nlohmann::json::parse(bounded.out);
    CHECK(j["complete"] == false);
    CHECK(j["time_limit_seconds"] == 1.0);
    CHECK(j["coverage"].get<double>() < 0.5);
    CHECK(j["coverage"].get<double>() ==
          Approx(j["evaluated"].get<double>() / 224220096.0).epsilon(1e-9));
    CHECK(j["seconds"].get<double>() < 30);
    const auto refused = testing::shell(huge + " --search-limit 20000000");
    CHECK(refused.status == 2);
    CHECK(refused.out.empty());
    CHECK_THAT(refused.err, Catch::Contains("a plan on 14414400 devices would evaluate 224220096 "
                                            "layouts, measuring 582987456 pipeline stages, past "
                                            "the search limit of 20000000") &&
                                Catch::Contains("or raise --search-limit"));
    const auto fewest = testing::shell(
        "timeout 20 memcalc plan --preset deepseek-v3 --search-limit 20000000 "
        "--device-memory 4GB --seq 4096 --global-batch 1024");
    CHECK(fewest.status == 2);
    CHECK(fewest.out.empty());
    CHECK_THAT(fewest.err, Catch::Contains("the search for the fewest devices (up to 16384) would "
                                           "evaluate 4382169 layouts") &&
                               Catch::Contains("narrow it (--gpus, --tp"));
    const std::string small =
        "plan --preset llama-7b --gpus 8 --seq 4096 --global-batch 64 --device-memory 80GB";
    CHECK_THAT(testing::memcalc(small + " --search-limit 10").err,
               Catch::Contains("past the search limit of 10:"));
    CHECK(testing::memcalc(small + " --search-limit 100000").status == 0);
    CHECK_THAT(testing::memcalc(small + " --time-limit soon").err,
               Catch::Contains("--time-limit must be seconds, 0 for no limit (got 'soon')"));
}

TEST_CASE(
    "stage layers past the model's, and a GPU file's node past plan's reach, are named up "
    "front",
    "[plan][errors][cli]") {
    // memcalc 1.2 wrapped 16 + (2^64 - 16) to 0 and blamed the sequence; plan dropped every
    // pipelined layout instead; and a node of 2^64 - 1 GPUs had plan try no count at all and
    // suggest more memory.
    const std::string stages = "--first-stage-layers 16 --last-stage-layers 18446744073709551600";
    const std::string says =
        "first_stage_layers (16) + last_stage_layers (18446744073709551600) "
        "exceeds layers (32)";
    const std::string plan =
        "plan --preset llama-7b --gpus 8 --device-memory 80GB --seq 4096 "
        "--global-batch 8 ";
    for (const std::string& args : {"--preset llama-7b --pp 4 " + stages, plan + stages}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(args);
        CHECK(bad.status != 0);
        CHECK(bad.out.empty());
        CHECK_THAT(bad.err, Catch::Contains(says));
    }
    const auto most = testing::shell(
        "f=$(mktemp); printf '{\"name\": \"big\", \"memory_bytes\": 80000000000, "
        "\"gpus_per_node\": 18446744073709551615}' > $f; memcalc plan --preset llama-7b "
        "--gpu-file $f --seq 4096 --global-batch 64; s=$?; rm $f; exit $s");
    CHECK(most.status != 0);
    CHECK(most.out.empty());
    CHECK_THAT(most.err, Catch::Contains("gpus_per_node must be at most 16384, the most GPUs plan "
                                         "searches (got 18446744073709551615)"));
    PlanRequest r;
    r.capacity = 80000000000ULL, r.base.seq = 4096, r.global_batch = 64;
    CHECK_THROWS_WITH(plan_fewest(fixtures::llama_7b(), r, 16385, 1),
                      Catch::Contains("step (16385) exceeds"));
}

TEST_CASE("traffic: expert all-to-alls, 4 a MoE layer a micro-batch, only where ep > 1",
          "[plan][time]") {
    const Architecture m =
        fixtures::dense_then_moe();  // layers 0-1 dense, 2-7 of 8 experts, 2 each
    Settings s;
    s.seq = 512, s.activations = ActivationModel::architecture;
    s.parallel.dp = 4, s.parallel.ep = 4, s.parallel.pp = 2, s.parallel.microbatches = 2;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables tables = activation_tables(
        m, 512, 1, s.recipe.precision(), s.activations, s.framework, s.recompute_modules, {});
    const Workload w =
        make_workload(m, s.recipe, 512, 1, Recompute::none, params, tables, s.framework);
    const double slot = 512.0 * 2 * 512 * static_cast<double>(s.recipe.activation_bytes());
    // Stage 0 holds 2 dense and 2 MoE layers, stage 1 four MoE layers; 2 micro-batches each.
    const Traffic first = traffic(w, s.parallel, stage_facts(w, s.parallel, 0));
    CHECK(first.expert_parallel == Approx(4 * 0.75 * slot * 2 * 2));
    CHECK(first.expert_parallel_messages == 4 * 2 * 2);
    const Traffic last = traffic(w, s.parallel, stage_facts(w, s.parallel, 1));
    CHECK(last.expert_parallel == Approx(4 * 0.75 * slot * 4 * 2));
    s.parallel.ep = 1;
    const Traffic none = traffic(w, s.parallel, stage_facts(w, s.parallel, 1));
    CHECK(none.expert_parallel == 0);
    CHECK(none.expert_parallel_messages == 0);
}

TEST_CASE("step_time: an fp8 recipe's linears at the GPU's fp8 rate", "[plan][time]") {
    Gpu g = round_gpu();
    g.peak_fp8_flops = 2 * g.peak_bf16_flops;
    Parallelism p;
    p.dp = 2, p.microbatches = 4;
    DeviceWork work;
    work.flops = 1.4e15, work.attention_flops = 4e14, work.narrow_flops = 6e14;
    auto t = step_time(g, p, work, Traffic{});
    REQUIRE(t);
    const double bf16 = 4e14 / 2 / (1e14 * 0.7), fp8 = 6e14 / 2 / (2e14 * 0.7),
                 attention = 4e14 / 2 / (1e14 * 0.4);
    CHECK(t->compute == Approx(bf16 + fp8 + attention));
    g.peak_fp8_flops = 0;  // a GPU with no fp8 rate: its bf16 rate, leaning slow
    t = step_time(g, p, work, Traffic{});
    REQUIRE(t);
    CHECK(t->compute == Approx(1e15 / 2 / (1e14 * 0.7) + attention));
}

TEST_CASE("an fp8 recipe's casts: bytes per operand from each library's program, by hand",
          "[plan][time]") {
    // torchao tensorwise (linear_casts.hpp): an input is cast in forward (read 2 B, write 1) and
    // again in backward with a column-major copy (1 + 1): 8 B an element; the output's gradient
    // twice in backward and copied once: 8; each eager cast's two fp32 temporaries, written and
    // read: 16 B more a cast. A weight: forward's cast, backward's cast and copy: 8 (+32 eager).
    const LinearCasts& tensorwise = linear_cast_rows[0];
    CHECK(tensorwise.operand_traffic(2, true) == Approx(8));
    CHECK(tensorwise.operand_traffic(2, false) == Approx(40));
    CHECK(tensorwise.weight_traffic(2, true) == Approx(8));
    CHECK(tensorwise.weight_traffic(2, false) == Approx(40));

    // A tiny LLaMA layer, 16 tokens: its linears read 64 (q, k, v), 64 (o), 64 (gate, up) and
    // 128 (down) wide inputs and write 3 x 64 + 64 + 2 x 128 + 64 wide outputs: 896 a token,
    // 14,336 elements; 40,960 weights.
    Architecture m;
    m.name = "tiny", m.hidden = 64, m.layers = 2, m.heads = 4, m.ffn = 128, m.vocab = 256;
    const auto narrow = [&](const char* recipe, std::uint64_t microbatches) {
        const Recipe& r = builtin_recipe(recipe);
        const Workload w = make_workload(
            m, r, 16, 1, Recompute::none, parameter_splits(parameter_table(m), m.vocab),
            activation_tables(m, 16, 1, r.precision(), ActivationModel::architecture));
        Parallelism p;
        p.microbatches = microbatches;
        return narrow_cast_bytes(w, p, 0);
    };
    // Transformer Engine: each operand read (2 B) and cast with its transpose (1 + 1) every
    // micro-batch, each weight so once a step.
    CHECK(narrow("fp8", 1) == Approx(14336 * 4 + 40960 * 4));
    CHECK(narrow("fp8", 2) == Approx(2 * 14336 * 4 + 40960 * 4));
    CHECK(narrow("float8-tensorwise", 2) == Approx(2 * (14336 * 40 + 40960 * 40)));
    CHECK(narrow("mixed-adam", 2) == 0);

    // The FLOPs the narrow format runs: all but the attention core and the head.
    PlanRequest request;
    request.global_batch = 4;
    for (const char* recipe : {"fp8", "mixed-adam"}) {
        const Recipe& r = builtin_recipe(recipe);
        const Workload w = make_workload(
            m, r, 16, 1, Recompute::none, parameter_splits(parameter_table(m), m.vocab),
            activation_tables(m, 16, 1, r.precision(), ActivationModel::architecture));
        const ComputeCost cost = compute_cost(m, 16, 1, Recompute::none);
        const DeviceWork work =
            device_flops(w, stage_mix(m.layers, w.parameters->pattern, {}), cost, request, 1.0 / 3);
        const double head = 3 * cost.head_forward * 4;
        CAPTURE(recipe);
        CHECK(work.narrow_flops ==
              Approx(r.narrow_matmuls() ? work.flops - work.attention_flops - head : 0));
        if (r.narrow_matmuls()) CHECK(work.narrow_flops > 0.5 * work.flops);
    }
}

TEST_CASE("a stage mix's longest chunk is the layout's, whatever its schedule and stage split",
          "[plan]") {
    Architecture m = fixtures::llama_7b();
    const LayerPattern none;
    std::size_t checked = 0;
    for (std::uint64_t layers : {30, 32, 33}) {
        m.layers = layers;
        for (Schedule schedule : {Schedule::one_f_one_b, Schedule::interleaved, Schedule::zb_h1,
                                  Schedule::zb_v, Schedule::dualpipe})
            for (std::uint64_t pp : {2, 3, 4, 8})
                for (std::uint64_t vpp : {1, 2, 4})
                    for (std::uint64_t ends : {0, 1, 3}) {
                        Parallelism p;
                        p.pp = pp, p.vpp = vpp, p.schedule = schedule, p.microbatches = 2 * pp;
                        p.first_stage_layers = p.last_stage_layers = ends;
                        try {
                            validate(p, m, 4096);
                        } catch (const error&) {
                            continue;
                        }
                        CAPTURE(layers, schedule_name(schedule), pp, vpp, ends);
                        CHECK(stage_mix(layers, none, p).largest_chunk == largest_chunk(p, layers));
                        ++checked;
                    }
    }
    CHECK(checked >= 70);  // 76 layouts of the 405 tried are valid
}
