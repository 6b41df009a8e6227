// torchao's float8 and MXFP8 linears keep their inputs in bf16 and cast in each pass: each pass is
// a program of tensors made and freed (linear_casts.hpp), read from torchao v0.18's autograd
// functions, not measured (PyTorch 1.13 has no float8). These are hand sums of those programs on
// several shapes, and what the recipes change in a layer and a step.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "workspace_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/plan.hpp"

using namespace memcalc;

namespace {
const LinearCasts& row(std::string_view key) {
    const LinearCasts* r = find_linear_casts(key);
    REQUIRE(r != nullptr);
    return *r;
}

/// Elements of one linear of `in` and `out` features over `tokens` tokens.
LinearOperands operands(std::uint64_t tokens, std::uint64_t in, std::uint64_t out, bool compiled) {
    return {Count(tokens * in), Count(in * out), Count(tokens * out), 2, compiled};
}
}  // namespace

TEST_CASE("torchao's tensorwise float8 passes, summed by hand", "[linear_casts]") {
    const auto [tokens, in, out] = GENERATE(
        std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>{8192, 4096, 14336},
        std::tuple{8192, 14336, 4096}, std::tuple{2, 4096, 4096}, std::tuple{512, 768, 2304});
    CAPTURE(tokens, in, out);
    const std::uint64_t I = tokens * in, O = tokens * out, W = in * out;
    const LinearCasts& t = row("torchao-float8-tensorwise");
    SECTION("eager: each cast holds two fp32 copies beside its float8 result") {
        const LinearOperands x = operands(tokens, in, out, false);
        // Forward: the input's cast, then the weight's beside the input's float8 copy, then the
        // GEMM's bf16 output beside both casts.
        CHECK(cast_pass_peak(t.forward, x).value() == std::max({9 * I, I + 9 * W, I + W + 2 * O}));
        // Backward: the gradient's and the weight's casts, the weight's column-major copy and
        // the input's gradient; the gradient and the input cast again; both copied for the GEMM.
        CHECK(cast_pass_peak(t.backward, x).value() ==
              std::max(
                  {9 * O, O + 9 * W, O + 2 * W + 2 * I, 10 * O + W + 2 * I, 2 * O + W + 11 * I}));
    }
    SECTION("compiled: the casts alone") {
        const LinearOperands x = operands(tokens, in, out, true);
        CHECK(cast_pass_peak(t.forward, x).value() == I + W + 2 * O);
        CHECK(cast_pass_peak(t.backward, x).value() ==
              std::max(O + 2 * W + 2 * I, 3 * O + W + 4 * I));
    }
    SECTION("rowwise: a scale a row (1/32 B an element, rounded up) and the fp32 scale products") {
        const LinearOperands x = operands(tokens, in, out, true);
        const auto c = [](std::uint64_t n) { return (33 * n + 31) / 32; };
        const LinearCasts& r = row("torchao-float8-rowwise");
        CHECK(cast_pass_peak(r.forward, x).value() == c(I) + c(W) + 2 * O);
        // Eager, the gradients' GEMMs also hold the fp32 outer product of their scales.
        CHECK(cast_pass_peak(r.backward, operands(tokens, in, out, false)).value() ==
              std::max({8 * O + c(O), c(O) + 8 * W + c(W), c(O) + 2 * c(W) + 6 * I,
                        2 * c(O) + c(W) + 2 * I + 8 * O, 2 * c(O) + c(W) + 10 * I + c(I),
                        3 * c(O) + c(W) + 2 * I + 2 * c(I) + 4 * W}));
    }
    SECTION("MXFP8: an E8M0 scale per 32 elements and the GEMMs' swizzled scales, no fp32") {
        const auto c = [](std::uint64_t n) { return (33 * n + 31) / 32 + (n + 31) / 32; };
        const LinearCasts& m = row("torchao-mxfp8");
        for (const bool compiled : {false, true}) {
            const LinearOperands x = operands(tokens, in, out, compiled);
            CHECK(cast_pass_peak(m.forward, x).value() == c(I) + c(W) + 2 * O);
            CHECK(cast_pass_peak(m.backward, x).value() == 2 * c(O) + c(W) + c(I) + 2 * I);
        }
    }
}

TEST_CASE("a casting recipe keeps bf16's tensors and adds each linear's casts where it runs",
          "[linear_casts][architecture]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    CAPTURE(m.name);
    const std::uint64_t s = 1024, b = 2, T = s * b;
    const Recipe& tensorwise = builtin_recipe("float8-tensorwise");
    const LayerActivations bf16 = architecture_layer(m, s, b, DType::bf16, Attention::flash);
    const LayerActivations casts =
        architecture_layer(m, s, b, tensorwise.precision(), Attention::flash);
    CHECK(casts.total() == bf16.total());  // nothing more kept
    // The down projection, one linear of ffn inputs and hidden outputs.
    const LinearOperands down{Count(T * m.ffn), Count(m.ffn * m.hidden), Count(T * m.hidden), 2,
                              false};
    const Workspace& w = fixtures::workspace_named(casts, "down projection backward");
    CHECK(w.bytes == cast_pass_peak(tensorwise.casts->backward, down));
    CHECK(w.split == ActivationSplit::replicated);
    CHECK(w.linear == Linear::down);
    // q/k/v: the largest of the three, q (hidden x heads x head size).
    const LinearOperands q{Count(T * m.hidden), Count(m.hidden * m.heads * m.head_size()),
                           Count(T * m.heads * m.head_size()), 2, false};
    CHECK(fixtures::workspace_named(casts, "q/k/v projections backward").bytes ==
          cast_pass_peak(tensorwise.casts->backward, q));
    CHECK(fixtures::workspace_named(casts, "output projection backward").bytes > Count(0));
}

TEST_CASE("casting recipes are refused where their linears are not each a step",
          "[linear_casts][recipe]") {
    Settings s;
    s.seq = 512, s.activations = ActivationModel::architecture;
    s.recipe = builtin_recipe("mxfp8");
    Architecture moe = fixtures::mistral_7b();
    moe.experts = 8, moe.experts_per_token = 2;
    CHECK_THROWS_WITH(Estimator(moe).estimate(s), Catch::Contains("torchao MXFP8 linears in") &&
                                                      Catch::Contains("are not modelled"));
    s.tuning.mode = Training::lora;
    s.tuning.lora.rank = 8;
    s.tuning.lora.targets = {"q_proj", "v_proj"};
    CHECK_THROWS_WITH(Estimator(fixtures::llama_7b()).estimate(s),
                      Catch::Contains("frozen or adapted torchao MXFP8 linears"));
}

TEST_CASE("a step under a casting recipe peaks at least as high as bf16's, state unchanged",
          "[linear_casts][estimate]") {
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    CAPTURE(recompute_name(mode));
    Settings s;
    s.seq = 2048, s.micro_batch = 2, s.activations = ActivationModel::architecture;
    s.framework.attention = Attention::flash;
    s.recompute = mode;
    const Estimator e(fixtures::llama_7b());
    const Report bf16 = e.estimate(s);
    for (const char* name : {"float8-tensorwise", "float8-rowwise", "mxfp8"}) {
        CAPTURE(name);
        s.recipe = builtin_recipe(name);
        const Report casts = e.estimate(s);
        CHECK(casts.state.total() == bf16.state.total());
        CHECK(casts.kept_activations == bf16.kept_activations);
        CHECK(casts.peak_step().bytes.total() >= bf16.peak_step().bytes.total());
    }
}

TEST_CASE("FSDP2's float8 all-gather: the linears' weights gathered at 1 B, none cast again",
          "[linear_casts][zero]") {
    const auto [tokens, in, out] =
        GENERATE(std::tuple<std::uint64_t, std::uint64_t, std::uint64_t>{8192, 4096, 14336},
                 std::tuple{4, 8192, 8192});
    CAPTURE(tokens, in, out);
    const std::uint64_t I = tokens * in, O = tokens * out, W = in * out;
    const LinearCasts& g = row("torchao-float8-all-gather");
    CHECK(g.gathered_weight_bytes == 1);
    // The weight's column-major copy for the input's gradient is still made.
    CHECK(cast_pass_peak(g.forward, operands(tokens, in, out, true)).value() == I + 2 * O);
    CHECK(cast_pass_peak(g.backward, operands(tokens, in, out, true)).value() ==
          std::max(O + W + 2 * I, 3 * O + 4 * I));
    CHECK(cast_pass_peak(g.backward, operands(tokens, in, out, false)).value() ==
          std::max({9 * O, O + W + 2 * I, 10 * O + 2 * I, 2 * O + 11 * I}));

    // A step: each gathered layer's linears at 1 B where float8-tensorwise gathers 2.
    const Architecture m = fixtures::llama_7b();
    Settings s;
    s.seq = 1024, s.activations = ActivationModel::architecture, s.recompute = Recompute::full;
    s.parallel.dp = 8, s.parallel.zero = 3;
    s.recipe = builtin_recipe("float8-tensorwise");
    const Report bf16 = Estimator(m).estimate(s);
    s.recipe = builtin_recipe("float8-all-gather");
    const Report fp8 = Estimator(m).estimate(s);
    const std::uint64_t h = m.hidden, linears = 4 * h * h + 3 * h * m.ffn;  // one layer's
    const auto &a = bf16.timeline(), &b = fp8.timeline();
    REQUIRE(a.size() == b.size());
    for (std::size_t i = 0; i < a.size(); ++i) {
        CAPTURE(a[i].name());
        // The layers' gathers (the loss step gathers the head alone, in bf16 under both).
        if (a[i].phase != Phase::forward && a[i].phase != Phase::backward) continue;
        CHECK(a[i].bytes.gathered_weights.value() - b[i].bytes.gathered_weights.value() ==
              2 * linears);  // the layer and the prefetched next
    }
    s.parallel.zero = 1;
    CHECK_THROWS_WITH(Estimator(m).estimate(s),
                      Catch::Contains("needs --zero 3 (FSDP); zero is 1"));
}

TEST_CASE("a casting recipe through the program says what its casts are read from",
          "[linear_casts][cli]") {
    const auto table = testing::memcalc("--preset llama-7b --seq 512 --recipe float8-tensorwise");
    CHECK(table.status == 0);
    CHECK_THAT(table.err, Catch::Contains("float8-tensorwise: torchao float8, tensorwise casts as "
                                          "read from torchao v0.18") &&
                              Catch::Contains("(not measured)"));
    const auto json = testing::memcalc(
        "--preset llama-7b --seq 512 --recipe float8-tensorwise --activations architecture "
        "--format json");
    CHECK(json.status == 0);
    CHECK(json.err.empty());  // a script's output says nothing on stderr
    const auto refused = testing::memcalc("--preset llama-7b --seq 512 --recipe float8-all-gather");
    CHECK(refused.status != 0);
    CHECK(refused.out.empty());
    CHECK_THAT(refused.err, Catch::Contains("needs --zero 3 (FSDP); zero is 0"));
}

TEST_CASE("plan tries float8-all-gather under ZeRO-3 alone", "[linear_casts][plan]") {
    PlanRequest request;
    request.gpus = 8, request.capacity = 80000000000ULL, request.base.seq = 1024,
    request.global_batch = 16;
    request.base.activations = ActivationModel::architecture;
    request.base.recipe = builtin_recipe("float8-all-gather");
    const auto rows = plan(fixtures::llama_7b(), request);
    REQUIRE_FALSE(rows.empty());
    for (const auto& row : rows) {
        CAPTURE(row.parallel.dp, row.parallel.tp, row.parallel.pp);
        CHECK(row.parallel.zero == 3);
        CHECK(row.parallel.dp > 1);
    }
}

TEST_CASE("a fused q/k/v projection casts as one linear of all three outputs",
          "[linear_casts][recipe]") {
    const std::uint64_t s = GENERATE(512, 1024), b = 2, T = s * b;
    const Recipe& rowwise = builtin_recipe("float8-rowwise");
    Architecture m = GENERATE(fixtures::gpt2_small(), fixtures::mistral_7b());
    m.fused_qkv = true;
    CAPTURE(m.name, s);
    const LayerActivations layer =
        architecture_layer(m, s, b, rowwise.precision(), Attention::flash);
    // In h, out q + k + v: the fused weight and output, one pass each way.
    const std::uint64_t out = (m.heads + 2 * m.key_value_heads()) * m.head_size();
    const LinearOperands qkv{Count(T * m.hidden), Count(m.hidden * out), Count(T * out), 2, false};
    CHECK(fixtures::workspace_named(layer, "q/k/v projections").bytes ==
          cast_pass_peak(rowwise.casts->forward, qkv));
    CHECK(fixtures::workspace_named(layer, "q/k/v projections backward").bytes ==
          cast_pass_peak(rowwise.casts->backward, qkv));
}
