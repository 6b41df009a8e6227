// LLaMA-Adapter v2 as lit-gpt's adapter_v2.py trains it (--train adapter-v2): adapter.py's
// prompt, a trained scale and bias on every linear's output (the head's too) and the norms
// trained. Parameters as lit-gpt prints them, each scaled linear's kept output and the first
// layer's norms, each by hand on several shapes.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "saved_bytes.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/finetune.hpp"

using namespace memcalc;

namespace {
FineTuning adapter_v2(std::uint64_t tokens = 10, std::uint64_t start = 2) {
    FineTuning f;
    f.mode = Training::adapter_v2, f.prompt.tokens = tokens, f.prompt.start_layer = start;
    return f;
}

/// Elements out of each linear of one layer, by hand: q, k, v, o and the MLP's.
std::uint64_t layer_outputs(const Architecture& m) {
    const std::uint64_t attention =
        m.heads * m.head_size() + 2 * m.key_value_heads() * m.head_size();
    const std::uint64_t mlp = (m.mlp == Mlp::gated ? 2 : 1) * m.ffn + m.hidden;
    return attention + m.hidden + mlp;
}

LayerActivations layer(const Architecture& m, std::uint64_t s, bool input_grad,
                       Training mode = Training::adapter_v2) {
    FineTuning f = adapter_v2();
    f.mode = mode;
    LayerTuning t = layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0);
    t.input_grad = input_grad, t.prompt_tokens = 0;
    return architecture_layer(m, s, 1, DType::bf16, Attention::flash, Runtime{}, {}, t);
}

}  // namespace

TEST_CASE("LLaMA-Adapter v2 trains a scale and bias per linear output and the norms",
          "[finetune][adapter]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::mistral_7b(), fixtures::gpt2_small());
    const std::uint64_t start = GENERATE(0, 2);
    CAPTURE(m.name, start);
    FineTuning v1 = adapter_v2(10, start);
    v1.mode = Training::adapter;
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), adapter_v2(10, start));
    Count norms;
    for (const ParamRow& r : parameter_table(m).rows)
        if (r.part == Part::norms || r.part == Part::final_norm)
            norms += parameter_table(m).in_model(r);
    const Count scales = Count(2 * m.layers * layer_outputs(m) + 2 * m.vocab);
    CHECK(trainable_parameters(t) ==
          trainable_parameters(fine_tuned_table(m, parameter_table(m), v1)) + scales + norms);
    CHECK(t.total() + norms == parameter_table(m).total() + trainable_parameters(t));
    CHECK_THROWS_WITH(
        fine_tuned_table(fixtures::mixtral(), parameter_table(fixtures::mixtral()), adapter_v2()),
        Catch::Contains("modelled on dense attention and MLP layers alone"));
}

TEST_CASE("Each scaled linear keeps its output plus the bias; the first layer its norms' x_norm",
          "[finetune][adapter]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const std::uint64_t s = GENERATE(100, 1000);
    CAPTURE(m.name, s);
    const LayerActivations full = layer(m, s, true);
    CHECK(fixtures::saved_bytes_where(full, "adapter v2") == 2 * s * layer_outputs(m));
    // Beside adapter.py's layer (frozen norms, no scales): the scaled outputs and each norm's
    // x_norm for its weight's gradient (a LayerNorm keeps its input either way).
    const std::uint64_t norm_outputs =
        fixtures::saved_bytes_where(full, "(RMSNorm)", "the normalised input");
    CHECK(norm_outputs == (m.norm == Norm::rmsnorm ? 2 * 2 * s * m.hidden : 0));
    CHECK(saved_bytes(full.rows).value() ==
          saved_bytes(layer(m, s, true, Training::adapter).rows).value() +
              fixtures::saved_bytes_where(full, "adapter v2") + norm_outputs);
    // The first layer's input needs no gradient: its first norm keeps what its weight's gradient
    // needs alone (an RMSNorm's x_norm), and everything after it as any layer (the MLP's norm reads
    // the attention half's sum, which needs one).
    const LayerActivations first = layer(m, s, false);
    const std::uint64_t norm_inputs =
        fixtures::saved_bytes_where(full, "attention norm (RMSNorm)") - norm_outputs / 2;
    CHECK(saved_bytes(first.rows).value() == saved_bytes(full.rows).value() - norm_inputs);
    CHECK(fixtures::saved_bytes_where(first, "adapter v2") ==
          fixtures::saved_bytes_where(full, "adapter v2"));
}

TEST_CASE("Adapter v2's head keeps its scaled output over the vocabulary to the loss",
          "[finetune][adapter]") {
    Architecture m = fixtures::llama_7b();
    m.input_require_grads = false;
    const std::uint64_t s = GENERATE(256, 1024);
    CAPTURE(s);
    Settings set;
    set.seq = s, set.micro_batch = 1, set.activations = ActivationModel::architecture;
    set.framework.attention = Attention::flash;
    const auto loss = [&](Training mode) {
        set.tuning = adapter_v2();
        set.tuning.mode = mode;
        const Report r = Estimator(m).estimate(set);
        return fixtures::step_named(r, "loss").bytes.kept_activations;
    };
    // Beside adapter.py's: every layer's scaled outputs and x_norms, the first two layers' own
    // rows (they keep nothing under adapter.py), the head's output and the final norm's x_norm.
    const Count v2 = loss(Training::adapter_v2), v1 = loss(Training::adapter);
    const std::uint64_t per_layer = 2 * s * layer_outputs(m) + 2 * 2 * s * m.hidden;
    const std::uint64_t head = 2 * s * m.vocab;
    CHECK(v2.value() > v1.value() + m.layers * per_layer + head);
}

TEST_CASE("memcalc --train adapter-v2 and qadapter-v2: settings, text and errors",
          "[finetune][adapter][cli]") {
    const std::string base = "--preset llama-7b --seq 512 --attention flash ";
    const auto run = testing::memcalc(base + "--train adapter-v2 --format json");
    REQUIRE(run.status == 0);
    const auto j = nlohmann::json::parse(run.out)["settings"]["training"];
    CHECK(j["mode"] == "adapter-v2");
    CHECK(j["prompt"]["tokens"] == 10);
    const auto q = testing::memcalc(base + "--train qadapter-v2 --qlora-quantizer lightning");
    REQUIRE(q.status == 0);
    CHECK(q.out.find("a trained scale and bias on every linear, the norms trained") !=
          std::string::npos);
    for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
             {"--train adapter-v2 --lora-rank 4",
              "--lora-rank 4 needs --train lora or qlora (got --train adapter-v2)"},
             {"--train adapter-v2 --qlora-double-quant true",
              "--qlora-double-quant true needs --train qlora, qadapter or qadapter-v2 (got "
              "--train adapter-v2)"},
             {"--train adapter-v3",
              "unknown --train 'adapter-v3' (did you mean 'adapter-v2'?) (full, frozen, lora, "
              "qlora, adapter, qadapter, adapter-v2 or qadapter-v2)"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(base + args);
        CHECK(bad.status == 2);
        CHECK(bad.out.empty());
        CHECK(bad.err == "memcalc: " + message + "\n");
    }
}
