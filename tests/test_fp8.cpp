// The fp8 recipe: Transformer Engine's linear layers save their inputs cast once to fp8 and keep an
// fp8 cast of each weight and of its transpose for the whole run. Read from TE 1.x's source, not
// measured (PyTorch 1.13 on CPU has no fp8): these are hand sums on several shapes.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {
const Precision fp8{DType::bf16, DType::bf16, false, Storage{DType::fp8_e4m3}};

Settings fp8_settings(Recompute mode) {
    Settings s;
    s.seq = 256, s.micro_batch = 2, s.activations = ActivationModel::architecture,
    s.recompute = mode;
    s.recipe = builtin_recipe("fp8");
    return s;
}

/// One layer's linear weights, written out: q, k, v, o and the MLP's matrices (every expert's), no
/// biases, no router.
std::uint64_t linear_weights(const Architecture& m) {
    const std::uint64_t h = m.hidden, f = m.ffn, q = m.heads * m.head_size(),
                        kv = m.key_value_heads() * m.head_size();
    const std::uint64_t mlp = (m.mlp == Mlp::gated ? 3 : 2) * h * f;
    return h * q + 2 * h * kv + q * h + (m.is_moe() ? m.experts : 1) * mlp;
}

Architecture mixtral_like() {
    Architecture m = fixtures::mistral_7b();
    m.name = "mixtral-like";
    m.experts = 8, m.experts_per_token = 2;
    return m;
}
}  // namespace

TEST_CASE(
    "the fp8 recipe keeps mixed-precision Adam's state and names Transformer Engine's linears",
    "[fp8][recipe]") {
    const Recipe& r = builtin_recipe("fp8");
    CHECK(r.bytes_per_parameter() == 16);  // the state is mixed-adam's; the casts are no state
    REQUIRE(r.linears);
    CHECK(r.linears->storage == Storage{DType::fp8_e4m3});
    CHECK(r.linears->weight_casts == 2);
    CHECK(r.precision().linear_inputs == Storage{DType::fp8_e4m3});
    CHECK_FALSE(builtin_recipe("mixed-adam").linears);
    CHECK_FALSE(builtin_recipe("mixed-adam").precision().linear_inputs);
}

TEST_CASE("fp8 linears save one 1-byte cast of each input instead of the 2-byte tensor",
          "[fp8][architecture]") {
    const std::uint64_t s = 512, b = 2;
    const auto total = [&](const Architecture& m, Precision p, Attention a) {
        return static_cast<std::int64_t>(architecture_layer(m, s, b, p, a).total().value());
    };
    SECTION(
        "dense layers: q/k/v's and the MLP's inputs, the output projection's and the down "
        "projection's") {
        const Architecture m =
            GENERATE(fixtures::llama_7b(), fixtures::mistral_7b(), fixtures::gpt2_small());
        CAPTURE(m.name);
        const std::int64_t sbh = s * b * m.hidden, sbq = s * b * m.heads * m.head_size(),
                           sbf = s * b * m.ffn;
        // Eager: the output projection's input was its own bf16 row; it becomes its cast.
        CHECK(total(m, fp8, Attention::eager) - total(m, DType::bf16, Attention::eager) ==
              -(2 * sbh + sbq + sbf));
        // Flash: the kernel keeps its bf16 output whatever the next layer does; the cast comes
        // beside it.
        CHECK(total(m, fp8, Attention::flash) - total(m, DType::bf16, Attention::flash) ==
              -(2 * sbh + sbf) + sbq);
    }
    SECTION(
        "experts: the gathered tokens and each slot's down projection input; the router keeps "
        "bf16") {
        const Architecture m = mixtral_like();
        const std::int64_t sbh = s * b * m.hidden, sbq = s * b * m.heads * m.head_size();
        const std::int64_t slots = static_cast<std::int64_t>(s * b * m.experts_per_token);
        CHECK(total(m, fp8, Attention::eager) - total(m, DType::bf16, Attention::eager) ==
              -(sbh + sbq + slots * static_cast<std::int64_t>(m.hidden + m.ffn)));
    }
    SECTION(
        "the head's input stays bf16: Megatron-LM's output layer is no Transformer Engine module") {
        const Architecture m = fixtures::llama_7b();
        CHECK(saved_bytes(head_saved(m, s, b, fp8)) ==
              saved_bytes(head_saved(m, s, b, DType::bf16)));
    }
}

TEST_CASE(
    "an fp8 linear's backward casts its output's gradient to fp8 and transposes it: 2 bytes per "
    "output element",
    "[fp8][architecture]") {
    const std::uint64_t s = 512, b = 2;
    const auto casts = [&](const Architecture& m, Precision p) {
        std::map<std::string, std::uint64_t> bytes;  // by the linear's weight
        const LayerActivations layer = architecture_layer(m, s, b, p, Attention::flash);
        for (const Workspace& w : layer.work)
            if (w.backward && Text(w.tensor).find("gradient cast to") != Text::npos)
                bytes[linear_row(w.linear).tensor] += w.bytes.value();
        return bytes;
    };
    SECTION("dense layers: q/k/v, the output projection, gate and up, the down projection") {
        const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
        CAPTURE(m.name);
        const std::uint64_t tokens = s * b, q = m.heads * m.head_size(),
                            kv = m.key_value_heads() * m.head_size();
        const auto c = casts(m, fp8);
        REQUIRE(c.size() == 4);
        CHECK(c.at("q_proj") == 2 * tokens * (q + 2 * kv));
        CHECK(c.at("o_proj") == 2 * tokens * m.hidden);
        CHECK(c.at(m.mlp == Mlp::gated ? "gate_proj" : "up_proj") ==
              2 * tokens * m.ffn * (m.mlp == Mlp::gated ? 2 : 1));
        CHECK(c.at("down_proj") == 2 * tokens * m.hidden);
        CHECK(casts(m, DType::bf16)
                  .empty());  // bf16 linears run their GEMMs on the gradient as it is
    }
    SECTION("experts: per routed token-slot; the router casts nothing") {
        const Architecture m = mixtral_like();
        const std::uint64_t slots = s * b * m.experts_per_token;
        const auto c = casts(m, fp8);
        CHECK(c.at("gate_proj") == 2 * slots * 2 * m.ffn);
        CHECK(c.at("down_proj") == 2 * slots * m.hidden);
    }
}

TEST_CASE(
    "fp8 weight casts (the weight and its transpose) are held at every step, this rank's share",
    "[fp8][timeline]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), mixtral_like());
    CAPTURE(m.name);
    const std::uint64_t casts =
        2 * linear_weights(m);  // one byte each for the cast and its transpose
    const auto at = [](const RankReport& r, const std::string& step) {
        return fixtures::step_named(r, step).bytes.weight_copies.value();
    };
    const std::string L = std::to_string(m.layers);
    for (Recompute mode : {Recompute::none, Recompute::full}) {
        const Report r = estimate(m, fp8_settings(mode));
        for (const std::string& step :
             {std::string("forward 1"), std::string("loss"), "backward " + L,
              std::string("backward 1"), std::string("optimizer")})
            CHECK(at(r.busiest(), step) == m.layers * casts);
    }
    Settings split = fp8_settings(Recompute::selective);
    split.parallel.tp = 2, split.parallel.pp = 2;
    const Report r = estimate(m, split);
    REQUIRE(r.ranks.size() == 2);
    for (const RankReport& stage : r.ranks)
        for (const Step& step : stage.timeline())
            CHECK(step.bytes.weight_copies.value() == m.layers / 2 * casts / 2);
    // No casts without narrow linears.
    Settings plain = fp8_settings(Recompute::none);
    plain.recipe = builtin_recipe("mixed-adam");
    CHECK(at(estimate(m, plain).busiest(), "optimizer") == 0);
}

TEST_CASE(
    "fp8 through the program: needs the architecture model; a recipe file can say its linears",
    "[fp8][cli]") {
    // Said with the formula, refused; not said, the recipe takes the architecture model.
    const auto formula =
        testing::memcalc("--preset llama-7b --recipe fp8 --activations korthikanti");
    CHECK(formula.status == 2);
    CHECK(formula.out.empty());
    CHECK_THAT(formula.err, Catch::Contains("--recipe fp8 needs --activations architecture"));
    const auto chosen = testing::memcalc("--preset llama-7b --seq 512 --recipe fp8");
    CHECK(chosen.status == 0);
    CHECK(chosen.out == testing::memcalc("--preset llama-7b --seq 512 --recipe fp8 "
                                         "--activations architecture")
                            .out);
    CHECK_THAT(chosen.err, Catch::Contains("--recipe fp8 takes the architecture model"));

    const std::string args = "--preset llama-7b --seq 2048 --activations architecture --format csv";
    const auto by_name = testing::memcalc(args + " --recipe fp8");
    REQUIRE(by_name.status == 0);
    const std::string path = "fp8_recipe_test.json";
    const nlohmann::json row = testing::listed_recipe("fp8", path);
    REQUIRE(row.is_object());
    CHECK(row["linears"] == "fp8-e4m3");
    const auto by_file = testing::memcalc(args + " --recipe-file " + path);
    CHECK(by_file.status == 0);
    CHECK(by_file.out == by_name.out);

    std::ofstream(path)
        << R"({"name": "wide", "weights": "bf16", "gradients": "bf16", "activations": "bf16",
                               "optimizer": "adam", "linears": "bf16"})";
    const auto wide = testing::memcalc(args + " --recipe-file " + path);
    CHECK(wide.status != 0);
    CHECK(wide.out.empty());
    CHECK_THAT(wide.err,
               Catch::Contains("linears is bf16, not narrower than the activations (bf16)"));
    std::remove(path.c_str());
}
