#include <catch2/catch.hpp>

#include "memcalc/timeline.hpp"

using namespace memcalc;

namespace {
// Two layers with small, distinct numbers so each step's sum can be checked by hand.
TimelineInputs two_layers() {
    TimelineInputs in;
    in.layers = 2;
    in.weights = 1000, in.master_weights = 2000, in.optimizer_state = 4000;
    in.layer[0].kept = 100, in.layer[0].rebuilt = 30;
    in.head_gradients = 7, in.layer[0].gradients = 50, in.input_gradients = 9;
    in.logits = 11, in.loss_buffers = 22, in.logits_gradient = 13;
    in.activation_gradient = 3;
    return in;
}
}  // namespace

TEST_CASE("each step holds what the model says by hand for two layers", "[timeline]") {
    const auto steps = timeline(two_layers());
    REQUIRE(steps.size() == 6);
    const std::uint64_t persistent = 7000;
    CHECK(steps[0].name() == "forward 1");
    CHECK(steps[0].bytes.total().value() == persistent + 100);
    CHECK(steps[1].name() == "forward 2");
    CHECK(steps[1].bytes.total().value() == persistent + 200);
    CHECK(steps[2].name() == "loss");
    CHECK(steps[2].bytes.total().value() == persistent + 200 + 11 + 22 + 13);
    CHECK(steps[3].name() ==
          "backward 2");  // kept 1..2, rebuilt, act grad, logits + logits grad, head grads
    CHECK(steps[3].bytes.total().value() == persistent + 200 + 30 + 3 + 11 + 13 + 7);
    CHECK(steps[4].name() == "backward 1");  // kept 1, layer 2's gradients now done
    CHECK(steps[4].bytes.total().value() == persistent + 100 + 30 + 3 + 11 + 7 + 50);
    CHECK(steps[5].name() == "optimizer");  // every gradient, the held logits
    CHECK(steps[5].bytes.total().value() == persistent + 7 + 100 + 9 + 11);
}

TEST_CASE("the peak is the largest step and the earliest on a tie", "[timeline]") {
    TimelineInputs in = two_layers();
    auto steps = timeline(in);
    const std::size_t p = peak_index(steps);
    for (const auto& s : steps) CHECK(s.bytes.total() <= steps[p].bytes.total());
    CHECK(steps[p].name() == "backward 2");

    in = TimelineInputs{};
    in.layers = 3;
    in.weights = 5;  // nothing but weights: every step ties
    steps = timeline(in);
    CHECK(peak_index(steps) == 0);
    CHECK(timeline_with_peak(in).peak == 0);  // found in one pass, ties in a linear run included

    in.layers = 40;  // long linear runs, each flat: the earliest of their ends wins
    CHECK(timeline_with_peak(in).peak == 0);
    in.layer[0].kept = 1;  // rising forward, falling backward: the last forward step (or the loss)
    const TimelineWithPeak made = timeline_with_peak(in);
    CHECK(made.peak == peak_index(made.steps));
    CHECK(made.steps[made.peak].name() == "forward 40");
}

TEST_CASE("workspaces join the step they run in", "[timeline][workspace]") {
    TimelineInputs in = two_layers();
    in.forward_buffers = 100000, in.layer[0].forward_work = 20000, in.loss_work = 300000;
    in.layer[0].backward_work = 4000000, in.recompute_buffers = 50000000,
    in.optimizer_work = 600000000;
    const auto steps = timeline(in);
    CHECK(steps[0].bytes.workspace.value() == 120000);  // the mask and the layer's own
    CHECK(steps[1].bytes.workspace.value() == 120000);
    CHECK(steps[2].bytes.workspace.value() ==
          300000);  // the loss's, the mask included by its maker
    CHECK(steps[3].bytes.workspace.value() ==
          54000000);  // the layer's, and what the checkpoints hold
    CHECK(steps[4].bytes.workspace.value() == 54000000);
    CHECK(steps[5].bytes.workspace.value() == 600000000);
    CHECK(peak_step(in).name() == "optimizer");
    CHECK(peak_step(in).bytes.total() == steps[5].bytes.total());
}

TEST_CASE(
    "under full recomputation with autocast the loss step is its forward with the layers' casts "
    "or its backward without them, the larger",
    "[timeline]") {
    TimelineInputs in = two_layers();
    in.layer[0].weight_copies = 40;               // each layer's casts
    in.loss_forward_work = 5, in.loss_work = 60;  // the backward's part is the larger workspace
    const auto loss_bytes = [](const TimelineInputs& t) {
        return step_at(t, Phase::loss, 0).bytes.total().value();
    };
    const std::uint64_t base = 7000 + 200 + 11 + 22 + 13;
    CHECK(loss_bytes(in) == base + 80 + 60);  // casts kept by the saved tensors
    in.weight_copies_recast = true;
    CHECK(loss_bytes(in) == base + 80 + 5);  // the forward: 85 over the backward's 60
    in.layer[0].weight_copies = 20;
    CHECK(loss_bytes(in) == base + 60);  // the backward: the casts are gone
    CHECK(step_at(in, Phase::loss, 0).bytes.weight_copies.value() == 0);
}

TEST_CASE("recast, a frozen weight's cast lives only while its op runs: autocast caches none",
          "[timeline]") {
    TimelineInputs in = two_layers();
    in.layer[0].weight_copies = 40, in.layer[0].uncached_copies = 30;  // 10 trainable (adapters)
    const auto copies = [&](Phase phase, std::uint64_t position) {
        return step_at(in, phase, position).bytes.weight_copies.value();
    };
    // Saved by autograd for the input's gradient without recomputation, frozen or not.
    CHECK(copies(Phase::forward, 2) == 80);
    in.weight_copies_recast = true;
    CHECK(copies(Phase::forward, 1) == 40);       // its own, while its ops run
    CHECK(copies(Phase::forward, 2) == 10 + 40);  // layer 1's cached casts beside its own
    in.loss_forward_work = 100, in.loss_work = 1;
    CHECK(step_at(in, Phase::loss, 0).bytes.total().value() ==
          7000 + 200 + 11 + 22 + 13 + 100 + 20);  // the forward's moment: the cached casts
    CHECK(copies(Phase::backward, 2) == 40);      // rebuilt: saved again for the input's gradient
}
