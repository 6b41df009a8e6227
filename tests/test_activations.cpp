#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/activations.hpp"

using namespace memcalc;

namespace {
Architecture shaped(std::uint64_t h, std::uint64_t a) {
    Architecture m = fixtures::llama_7b();
    m.hidden = h, m.heads = a;
    return m;
}
}  // namespace

TEST_CASE("the per-op rows add up to s b h (34 + 5 a s / h)", "[activations]") {
    using Row = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    const auto [s, b, h, a] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>({
            Row{4096, 1, 4096, 32},
            Row{2048, 4, 5120, 40},
            Row{8, 1, 16, 2},
            Row{1, 1, 1, 1},
            Row{1000, 3, 768, 12},
            Row{131072, 1, 8192, 64},
        }));
    CAPTURE(s, b, h, a);
    const LayerActivations layer = korthikanti_layer(shaped(h, a), s, b, 2);
    const std::uint64_t sbh = s * b * h, as2b = a * s * s * b;
    CHECK(layer.total().value() == 34 * sbh + 5 * as2b);
    CHECK(layer.rebuilt(Recompute::selective).value() == 5 * as2b);
    CHECK(layer.kept(Recompute::none) == layer.total());
    CHECK(layer.kept(Recompute::selective).value() == 34 * sbh);
    CHECK(layer.kept(Recompute::full).value() == 2 * sbh);
    CHECK(layer.rebuilt(Recompute::none).value() == 0);
    CHECK(layer.rebuilt(Recompute::selective).value() == 5 * as2b);
    // The rebuilt layer's LayerNorm input is the checkpoint itself: counted once, in what full
    // keeps.
    CHECK(layer.rebuilt(Recompute::full).value() == 32 * sbh + 5 * as2b);
}

TEST_CASE("LLaMA 7B keeps 3254779904 bytes per layer at s = 4096", "[activations]") {
    const LayerActivations layer = korthikanti_layer(fixtures::llama_7b(), 4096, 1, 2);
    CHECK(layer.total().value() == 3254779904ULL);
    CHECK((Count(32) * layer.total()).value() == 104152956928ULL);
}

TEST_CASE("the chapter's Decoder: 2496 values per sequence per block by the formula",
          "[activations]") {
    const LayerActivations layer = korthikanti_layer(fixtures::decoder(), 8, 1, 2);
    CHECK(layer.total().value() == 4992);      // bytes
    CHECK(layer.total().value() / 2 == 2496);  // 16-bit values, the chapter's unit
}

TEST_CASE("activations are linear in the micro-batch", "[activations]") {
    const std::uint64_t s = GENERATE(8, 512, 4096);
    const Architecture m = fixtures::llama_7b();
    const LayerActivations one = korthikanti_layer(m, s, 1, 2), two = korthikanti_layer(m, s, 2, 2),
                           eight = korthikanti_layer(m, s, 8, 2);
    CHECK(two.total().value() == 2 * one.total().value());
    CHECK(eight.total().value() == 8 * one.total().value());
    for (auto mode : {Recompute::none, Recompute::selective, Recompute::full})
        CHECK(two.kept(mode).value() == 2 * one.kept(mode).value());
}

TEST_CASE("fp32 activations: values double and masks stay one byte", "[activations]") {
    const LayerActivations layer = korthikanti_layer(fixtures::llama_7b(), 4096, 1, 4);
    const std::uint64_t sbh = 4096ULL * 4096, as2b = 32ULL * 4096 * 4096;
    CHECK(layer.total().value() == 66 * sbh + 9 * as2b);
    CHECK(layer.kept(Recompute::full).value() == 4 * sbh);
}
