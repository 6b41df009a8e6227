#include <catch2/catch.hpp>
#include <algorithm>
#include <set>
#include <tuple>

#include "fixtures.hpp"
#include "memcalc/plan.hpp"

using namespace memcalc;

namespace {
Architecture small_llama() {
    Architecture m = fixtures::llama_7b();
    m.name = "small-llama", m.layers = 16, m.hidden = 2048, m.heads = 16, m.kv_heads = 4, m.ffn = 5632;
    return m;
}
using Key = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, unsigned, bool, std::uint64_t, int>;
/// Which layout a row is: its degrees, micro-batch and mode.
Key layout_text_key(const PlanRow& r) {
    const Parallelism& p = r.parallel;
    return {p.dp, p.tp, p.pp, p.cp, p.zero, p.sequence_parallel, r.micro_batch, static_cast<int>(r.recompute)};
}
}  // namespace

TEST_CASE("plan on 8 devices evaluates exactly the layouts a hand enumeration finds", "[plan]") {
    const Architecture m = small_llama();
    PlanRequest request;
    request.gpus = 8, request.capacity = 20000000000ULL, request.base.seq = 1024, request.global_batch = 16;
    const auto rows = plan(m, request);

    // By hand: dp x tp x pp x cp = 8; tp divides heads (16), kv heads (4) and ffn; pp divides the 16
    // layers; the sequence splits over cp (and tp with sequence parallelism); ZeRO needs dp > 1; the
    // micro-batch divides the 16 sequences per replica; three recomputation modes.
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
                                if ((sp && tp == 1) || (zero > 0 && dp == 1) || (16 / dp) % b != 0) continue;
                                expected.insert({dp, tp, pp, cp, zero, sp, b, mode});
                            }
            }
    std::set<Key> found;
    for (const auto& r : rows) {
        const Parallelism& p = r.parallel;
        found.insert({p.dp, p.tp, p.pp, p.cp, p.zero, p.sequence_parallel, r.micro_batch, static_cast<int>(r.recompute)});
    }
    CHECK(rows.size() == expected.size());
    CHECK(found == expected);
}

TEST_CASE("plan's peaks are estimate()'s, and the ranking follows its rule", "[plan]") {
    const Architecture m = small_llama();
    PlanRequest request;
    request.gpus = 8, request.capacity = 12000000000ULL, request.base.seq = 2048, request.global_batch = 8;
    // The chapter's model, and the architecture's with its workspaces and a foreach optimiser step.
    const bool framework = GENERATE(false, true);
    if (framework)
        request.base.activations = ActivationModel::architecture, request.base.framework.optimizer = OptimizerImpl::foreach;
    const auto rows = plan(m, request);
    bool fitting = true;
    for (std::size_t i = 0; i < rows.size(); ++i) {
        const PlanRow& r = rows[i];
        Settings s;
        s.seq = 2048, s.micro_batch = r.micro_batch, s.recompute = r.recompute, s.parallel = r.parallel;
        s.activations = request.base.activations, s.framework.optimizer = request.base.framework.optimizer;
        const Report e = estimate(m, s);
        CAPTURE(i);
        CHECK(r.peak.bytes() == e.peak_step().bytes.total());
        CHECK(r.fits == (e.peak_step().bytes.total() <= request.capacity));
        if (!r.fits) fitting = false;
        CHECK((r.fits || !fitting));  // every fitting layout comes first
        if (i > 0 && rows[i - 1].fits == r.fits) CHECK_FALSE(plan_order(r, rows[i - 1]));
        const double P = static_cast<double>(r.parallel.pp), M = static_cast<double>(r.parallel.steps_per_batch());
        CHECK(r.bubble == Approx((P - 1) / (M + P - 1)));
    }
}

TEST_CASE("plan: a mixture-of-experts model also enumerates expert parallelism", "[plan]") {
    Architecture m = small_llama();
    m.experts = 4, m.experts_per_token = 2;
    PlanRequest request;
    request.gpus = 4, request.capacity = 80000000000ULL, request.base.seq = 512, request.global_batch = 4;
    std::set<std::uint64_t> eps;
    for (const auto& r : plan(m, request)) eps.insert(r.parallel.ep);
    CHECK(eps == std::set<std::uint64_t>{1, 2, 4});
}

TEST_CASE("plan_top keeps the best k fitting layouts in plan's order, and counts them all", "[plan]") {
    const Architecture m = small_llama();
    PlanRequest request;
    request.gpus = 16, request.capacity = 20000000000ULL, request.base.seq = 1024, request.global_batch = 32;
    const auto all = plan(m, request);
    const std::size_t fitting =
        static_cast<std::size_t>(std::count_if(all.begin(), all.end(), [](const PlanRow& r) { return r.fits; }));
    REQUIRE(fitting > 10);
    for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{7}, fitting, fitting + 5}) {
        const PlanSummary top = plan_top(m, request, k);
        CAPTURE(k);
        CHECK(top.evaluated == all.size());
        CHECK(top.fitting == fitting);
        REQUIRE(top.top.size() == std::min(k, fitting));
        for (std::size_t i = 0; i < top.top.size(); ++i) {
            CHECK(plan_key(top.top[i]) == plan_key(all[i]));
            CHECK(layout_text_key(top.top[i]) == layout_text_key(all[i]));
        }
    }
}
