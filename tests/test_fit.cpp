#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/fit.hpp"

using namespace memcalc;

namespace {
Count peak(const Architecture& m, Settings s, FitDimension d, std::uint64_t size) {
    (d == FitDimension::seq ? s.seq : s.micro_batch) = size;
    return estimate(m, s).peak_step().bytes.total();
}
}  // namespace

TEST_CASE("fit: the size found fits and the next one up does not, by the peak model itself",
          "[fit]") {
    using Row =
        std::tuple<Architecture, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    //                     model                  dp  zero  capacity (bytes)   granule
    const auto [m, dp, zero, capacity, granule] =
        GENERATE(table<Architecture, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>({
            Row{fixtures::llama_7b(), 1, 0, 138900000000ULL, 1},
            Row{fixtures::llama_7b(), 8, 3, 78000000000ULL, 128},
            Row{fixtures::mistral_7b(), 4, 2, 70000000000ULL, 1},
            Row{fixtures::gpt2_small(), 1, 0, 8000000000ULL, 1},
        }));
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const FitDimension dimension = GENERATE(FitDimension::seq, FitDimension::micro_batch);
    CAPTURE(m.name, recompute_name(mode), dimension == FitDimension::seq ? "seq" : "micro-batch");
    Settings s;
    s.recompute = mode, s.seq = 1024, s.micro_batch = 1;
    s.parallel.dp = dp, s.parallel.zero = static_cast<unsigned>(zero);
    const std::uint64_t limit = dimension == FitDimension::seq && m.position == Position::learned
                                    ? m.max_positions
                                    : (1ULL << 40);
    const std::uint64_t g = dimension == FitDimension::seq ? granule : 1;
    const FitResult r = fit(m, s, dimension, capacity, g, limit);
    REQUIRE(r.largest);
    CHECK(r.largest->size % g == 0);
    CHECK(r.largest->peak <= Count(capacity));
    CHECK(r.largest->peak == peak(m, s, dimension, r.largest->size));
    if (r.first_over) {
        CHECK(r.first_over->size == r.largest->size + g);
        if (r.first_over->runs) CHECK(peak(m, s, dimension, r.first_over->size) > Count(capacity));
    } else {
        CHECK(r.largest->size + g >
              limit);  // the search limit itself fits (GPT-2's 1024 positions)
    }
}

TEST_CASE("fit: nothing fits when even the smallest size does not", "[fit]") {
    Settings s;
    s.micro_batch = 1;
    const FitResult r =
        fit(fixtures::llama_7b(), s, FitDimension::seq, 80000000000ULL, 1, 1ULL << 40);
    CHECK_FALSE(r.largest);
    REQUIRE(r.first_over);
    CHECK(r.first_over->size == 1);
    CHECK(r.first_over->peak > Count(80000000000ULL));  // 16 bytes x 6.7B parameters alone
}

TEST_CASE("fit: sizes whose byte counts overflow count as not fitting", "[fit]") {
    Settings s;
    s.micro_batch = 1;
    const FitResult r = fit(fixtures::llama_7b(), s, FitDimension::seq, ~0ULL, 1, ~0ULL);
    REQUIRE(r.largest);
    REQUIRE(r.first_over);
    CHECK_FALSE(r.first_over->runs);
    CHECK_THAT(r.first_over->reason, Catch::Contains("64 bits"));
}
