// The optimizer in backward (--grad-buffer stepped, torchtune's optimizer_in_bwd): each gradient
// stepped by an optimizer of its own and freed once whole. By hand from the shapes: no gradient
// held through backward but a tied table's (autograd sums its two uses first), a backward step's
// moment of one tensor's gradient beside its step, an optimizer step with nothing left to step;
// and what it refuses.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {
Settings in_backward(OptimizerImpl impl, GradBuffer buffer) {
    Settings s;
    s.seq = 16, s.micro_batch = 1, s.activations = ActivationModel::architecture;
    s.recipe = builtin_recipe("bf16-adam");
    s.framework.attention = Attention::flash;
    s.framework.optimizer = impl, s.framework.grad_buffer = buffer;
    return s;
}
}  // namespace

TEST_CASE("The optimizer in backward holds no gradient but a tied table's", "[optimizer]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    CAPTURE(m.name);
    const Report stepped =
        Estimator(m).estimate(in_backward(OptimizerImpl::fused, GradBuffer::stepped));
    // bf16 gradients: GPT-2's tied table waits from the head's backward for the embedding's.
    const Count table = m.tied_embeddings ? Count(m.vocab) * m.hidden * 2 : Count(0);
    std::size_t backward = 0;
    for (const Step& s : stepped.timeline()) {
        if (s.phase != Phase::backward) continue;
        CHECK(s.bytes.gradients == table);
        ++backward;
    }
    CHECK(backward == m.layers);
    const Step& step = fixtures::step_named(stepped, "optimizer");
    CHECK(step.bytes.gradients == Count(0));
    CHECK(step.bytes.workspace == Count(0));
    // The state is the same; only the gradients' lives are shorter.
    const Report lazy = Estimator(m).estimate(in_backward(OptimizerImpl::fused, GradBuffer::lazy));
    CHECK(step.bytes.optimizer_state ==
          fixtures::step_named(lazy, "optimizer").bytes.optimizer_state);
    CHECK(stepped.peak_step().bytes.total() < lazy.peak_step().bytes.total());
}

TEST_CASE("The optimizer in backward: a layer's largest tensor stepped beside its gradient",
          "[optimizer]") {
    // LLaMA 7B at 16 tokens: the MLP's 11008 x 4096 matrices are the largest tensors, and the ops'
    // own temporaries are small beside them. bf16 gradient, then the step over that tensor alone:
    // foreach's sqrt(v) (bf16 state), a for-loop's two copies, none fused (the gradient then
    // beside the op that writes it, a little more).
    const Architecture m = fixtures::llama_7b();
    const Count largest = Count(11008) * 4096;
    const auto work = [&](OptimizerImpl impl) {
        const Report r = Estimator(m).estimate(in_backward(impl, GradBuffer::stepped));
        return fixtures::step_named(r, "backward 16").bytes.workspace;
    };
    CHECK(work(OptimizerImpl::foreach) == largest * (2 + 2));
    CHECK(work(OptimizerImpl::for_loop) == largest * (2 + 2 * 2));
    CHECK(work(OptimizerImpl::fused) > largest * 2);
    CHECK(work(OptimizerImpl::fused) < largest * (2 + 2));
}

TEST_CASE("memcalc --grad-buffer stepped: one micro-batch, one replica", "[optimizer][cli]") {
    const std::string base = "--preset llama-7b --seq 512 --grad-buffer stepped ";
    const auto ok = testing::memcalc(base + "--format json");
    REQUIRE(ok.status == 0);
    CHECK(ok.out.find("\"grad_buffer\": \"stepped\"") != std::string::npos);
    for (const auto& [args, message] :
         std::vector<std::pair<std::string, std::string>>{{"--microbatches 4", "4 micro-batches"},
                                                          {"--dp 2", "dp 2"},
                                                          {"--dp 2 --zero 1", "zero 1"},
                                                          {"--recipe muon", "muon"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(base + args);
        CHECK(bad.status == 1);  // what the model cannot do, as every such refusal
        CHECK(bad.out.empty());
        CHECK(bad.err.find(message) != std::string::npos);
        CHECK(bad.err.find("grad_buffer stepped") != std::string::npos);
    }
}

TEST_CASE("plan --grad-buffer stepped ranks only the layouts it models", "[optimizer][plan]") {
    const auto run = testing::memcalc(
        "plan --preset llama-7b --gpus 8 --grad-buffer stepped --seq 2048 --gpu h100-sxm "
        "--global-batch 64 --format json");
    REQUIRE(run.status == 0);
    const nlohmann::json j = nlohmann::json::parse(run.out);
    REQUIRE(!j["layouts"].empty());
    for (const auto& layout : j["layouts"]) {
        CHECK(layout["dp"] == 1);
        CHECK(layout["microbatches"] == 1);
        CHECK(layout["zero"] == 0);
    }
}
