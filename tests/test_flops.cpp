#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/flops.hpp"

using namespace memcalc;

TEST_CASE("matrix-product FLOPs of a tiny layer by hand", "[flops]") {
    // h=8, a=2 (d=4), f=16, plain MLP, V=10, s=4, b=1: T=4 tokens.
    // projections 2*4*8*(8+16) + 2*4*8*8 = 1536 + 512; scores and weights.V 2*2*4*4*8 = 512;
    // MLP 2*4*8*16*2 = 2048. Layer 4608. Head 2*4*8*10 = 640.
    Architecture m;
    m.hidden = 8, m.layers = 3, m.heads = 2, m.ffn = 16, m.vocab = 10, m.mlp = Mlp::plain;
    const ComputeCost c = compute_cost(m, 4, 1, Recompute::full);
    CHECK(c.attention_core == 512);
    CHECK(c.layer_forward() == 4608);
    CHECK(c.head_forward == 640);
    CHECK(c.step == 3 * (3 * 4608 + 640));
    CHECK(c.recompute == 3 * 4608);
    CHECK(compute_cost(m, 4, 1, Recompute::selective).recompute == 3 * 512);
    CHECK(compute_cost(m, 4, 1, Recompute::none).recompute == 0);
}

TEST_CASE("full recomputation costs about a third more compute", "[flops]") {
    const ComputeCost full = compute_cost(fixtures::llama_7b(), 4096, 1, Recompute::full);
    CHECK(full.recompute_fraction() > 0.30);
    CHECK(full.recompute_fraction() < 1.0 / 3);  // the head is not recomputed
    const ComputeCost sel = compute_cost(fixtures::llama_7b(), 4096, 1, Recompute::selective);
    CHECK(sel.recompute_fraction() < 0.1 * full.recompute_fraction() * 2);
    CHECK(sel.recompute_fraction() > 0);
}
