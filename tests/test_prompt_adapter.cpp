// LLaMA-Adapter as lit-gpt's adapter.py trains it (--train adapter): a gated prompt per layer from
// a start layer over a frozen base. Parameters as lit-gpt prints them, the prompt attention's rows,
// and the leading layers that keep nothing, each by hand on several shapes.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "saved_bytes.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/bitsandbytes.hpp"
#include "memcalc/finetune.hpp"

using namespace memcalc;

namespace {
FineTuning adapter(std::uint64_t tokens = 10, std::uint64_t start = 2,
                   Training mode = Training::adapter) {
    FineTuning f;
    f.mode = mode, f.prompt.tokens = tokens, f.prompt.start_layer = start;
    return f;
}

LayerActivations prompted_layer(Architecture m, std::uint64_t s, std::uint64_t b,
                                std::uint64_t tokens, bool input_grad,
                                Attention attention = Attention::flash,
                                Training mode = Training::adapter) {
    m.input_require_grads = false;
    const FineTuning f = adapter(10, 2, mode);
    LayerTuning t = layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0);
    t.input_grad = input_grad, t.prompt_tokens = tokens;  // 0: the frozen base's layer alone
    return architecture_layer(m, s, b, DType::bf16, attention, Runtime{}, {}, t);
}

}  // namespace

TEST_CASE("LLaMA-Adapter trains a prompt and a gate per head in each layer from the start",
          "[finetune][adapter]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::mistral_7b(), fixtures::gpt2_small());
    const std::uint64_t tokens = GENERATE(1, 10), start = GENERATE(0, 2);
    CAPTURE(m.name, tokens, start);
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), adapter(tokens, start));
    CHECK(trainable_parameters(t) == Count((m.layers - start) * (tokens * m.hidden + m.heads)));
    CHECK(t.total() == parameter_table(m).total() + trainable_parameters(t));
    // lit-gpt's finetune/adapter.py prints 1,229,760 for Llama 2 7B (its resource table)
    if (m.name == fixtures::llama_7b().name && tokens == 10 && start == 2)
        CHECK(trainable_parameters(t) == Count(1'229'760));
    CHECK_THROWS_WITH(fine_tuned_table(m, parameter_table(m), adapter(tokens, m.layers)),
                      Catch::Contains("adapter start layer " + std::to_string(m.layers)));
}

TEST_CASE("The prompt attention keeps its output for the gate, its bias and log-sum-exp for q",
          "[finetune][adapter]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const std::uint64_t s = GENERATE(100, 1000), b = GENERATE(1, 2), tokens = GENERATE(10, 20);
    CAPTURE(m.name, s, b, tokens);
    const std::uint64_t a = m.heads, d = m.head_size();
    const LayerActivations plain = prompted_layer(m, s, b, 0, true);
    const LayerActivations layer = prompted_layer(m, s, b, tokens, true);
    const std::uint64_t output = s * b * a * d * 2, bias = s * ((tokens + 15) / 16 * 16) * 2,
                        lse = a * ((s + 31) / 32 * 32) * b * 4;
    CHECK(fixtures::saved_bytes_where(layer, "prompt gate") == output);
    CHECK(fixtures::saved_bytes_where(layer, "prompt attention") == bias + lse);
    CHECK(saved_bytes(layer.rows) == saved_bytes(plain.rows) + Count(output + bias + lse));
    // Its input needing no gradient (the first prompted layer's): the gate's product alone keeps
    // anything in the attention, and its output needs a gradient from there.
    const LayerActivations first = prompted_layer(m, s, b, tokens, false);
    CHECK(fixtures::saved_bytes_where(first, "prompt gate") == output);
    CHECK(fixtures::saved_bytes_where(first, "prompt attention") == 0);
    CHECK(fixtures::saved_bytes_where(first, "flash attention") == 0);
    CHECK(saved_bytes(prompted_layer(m, s, b, 0, false).rows) == Count(0));
}

TEST_CASE("Under a prompt the output projection reads the gated sum alone, eager or flash",
          "[finetune][adapter]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    const std::uint64_t s = GENERATE(100, 1000), b = GENERATE(1, 2), tokens = 10;
    CAPTURE(m.name, attention_name(attention), s, b);
    const std::uint64_t output = s * b * m.heads * m.head_size() * 2,
                        bias = s * ((tokens + 15) / 16 * 16) * 2,
                        lse = m.heads * ((s + 31) / 32 * 32) * b * 4;
    // The prompt adds the same whatever the kernel: the attention's output is not the output
    // projection's input (the gated sum is), which the eager path once counted too.
    const LayerActivations plain = prompted_layer(m, s, b, 0, true, attention);
    const LayerActivations layer = prompted_layer(m, s, b, tokens, true, attention);
    CHECK(saved_bytes(layer.rows) == saved_bytes(plain.rows) + Count(output + bias + lse));
    // v2 scales the projection's output: its row once, s b h in bf16.
    const LayerActivations v2 =
        prompted_layer(m, s, b, tokens, true, attention, Training::adapter_v2);
    CHECK(fixtures::saved_bytes_where(v2, "output projection: adapter v2") == s * b * m.hidden * 2);
}

TEST_CASE("The layers before the first prompt keep nothing: the loss step holds the rest",
          "[finetune][adapter]") {
    Architecture m = fixtures::llama_7b();
    m.input_require_grads = false;
    const std::uint64_t start = GENERATE(0, 2, 5), s = GENERATE(256, 1024);
    CAPTURE(start, s);
    Settings set;
    set.seq = s, set.micro_batch = 1, set.activations = ActivationModel::architecture;
    set.framework.attention = Attention::flash;
    set.tuning = adapter(10, start);
    const Report r = Estimator(m).estimate(set);
    const LayerActivations full = prompted_layer(m, s, 1, 10, true);
    const LayerActivations first = prompted_layer(m, s, 1, 10, false);
    const Count kept = fixtures::step_named(r, "loss").bytes.kept_activations;
    const Count layers = saved_bytes(full.rows) * (m.layers - start - 1) + saved_bytes(first.rows);
    CHECK(kept >= layers);
    CHECK(kept.value() - layers.value() < 4 * s * m.hidden);  // the input side's, the head's
    // Forward steps 2 .. start hold layers that keep nothing; the first prompted layer's less than
    // the others.
    const auto forward = [&](std::uint64_t p) {
        return fixtures::step_named(r, "forward " + std::to_string(p)).bytes.kept_activations;
    };
    CHECK(forward(start + 1).value() - forward(1).value() <
          forward(start + 2).value() - forward(start + 1).value());
    for (std::uint64_t p = 2; p <= start; ++p) CHECK(forward(p) == forward(1));
}

TEST_CASE("memcalc --train adapter: its options, settings and errors", "[finetune][adapter][cli]") {
    const std::string base = "--preset llama-7b --seq 512 --attention flash ";
    const auto training = [&](const std::string& args) {
        const auto run = testing::memcalc(base + args + " --format json");
        REQUIRE(run.status == 0);
        return nlohmann::json::parse(run.out)["settings"]["training"];
    };
    const auto j = training("--train adapter --adapter-prompt-tokens 12 --adapter-start-layer 4");
    CHECK(j["mode"] == "adapter");
    CHECK(j["prompt"]["tokens"] == 12);
    CHECK(j["prompt"]["start_layer"] == 4);
    const auto q =
        training("--train qadapter --qlora-quantizer lightning --bitsandbytes-version 0.41.1");
    CHECK(q["mode"] == "qadapter");
    CHECK(q["prompt"]["tokens"] == 10);
    CHECK(q["base_storage"]["dtype"] == "nf4");
    CHECK(q["quantization"]["keeps_input"] == true);
    const auto text = testing::memcalc(base + "--train adapter");
    REQUIRE(text.status == 0);
    CHECK(text.out.find("training adapter (a 10-token prompt, gated, in every layer from 2): "
                        "1,229,760 trainable") != std::string::npos);
    for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
             {"--adapter-prompt-tokens 4",
              "--adapter-prompt-tokens 4 needs --train adapter, qadapter, adapter-v2 or "
              "qadapter-v2 (got "
              "--train full)"},
             {"--train lora --adapter-start-layer 1",
              "--adapter-start-layer 1 needs --train adapter, qadapter, adapter-v2 or qadapter-v2 "
              "(got --train lora)"},
             {"--train adapter --adapter-start-layer x",
              "--adapter-start-layer must be a layer's index, counted from 0 (got 'x')"},
             {"--train adapter --adapter-prompt-tokens 0",
              "--adapter-prompt-tokens must be a positive integer (got '0')"},
             {"--train adapter --lora-rank 4",
              "--lora-rank 4 needs --train lora or qlora (got "
              "--train adapter)"}}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(base + args);
        CHECK(bad.status == 2);
        CHECK(bad.out.empty());
        CHECK(bad.err == "memcalc: " + message + "\n");
    }
    const auto past = testing::memcalc(base + "--train adapter --adapter-start-layer 32");
    CHECK(past.status != 0);
    CHECK(past.out.empty());
    CHECK(past.err.find("adapter start layer 32 leaves no layer of") != std::string::npos);
}

TEST_CASE("qadapter: LLaMA-Adapter over a 4-bit base, its linears' inputs kept by old releases",
          "[finetune][adapter][bitsandbytes]") {
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    m.input_require_grads = false;
    CAPTURE(m.name);
    FineTuning f = adapter();
    f.mode = Training::qadapter, f.quantized.quantizer = Quantizer::lightning;
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), f);
    CHECK(trainable_parameters(t) ==
          trainable_parameters(fine_tuned_table(m, parameter_table(m), adapter())));
    // The base stored as QLoRA's is, by the same quantiser: every linear, the head too.
    FineTuning qlora = f;
    qlora.mode = Training::qlora;
    const auto four_bit = [](const ParameterTable& table) {
        Count n;
        for (const ParamRow& r : table.rows)
            if (r.storage && r.storage->dtype == DType::nf4) n += table.in_model(r);
        return n;
    };
    CHECK(four_bit(t) == four_bit(fine_tuned_table(m, parameter_table(m), qlora)));
    CHECK(four_bit(t).value() > parameter_table(m).total().value() / 2);
    const auto layer = [&](const char* release, bool input_grad) {
        f.quantized.bitsandbytes = *bitsandbytes_version_of(release);
        LayerTuning tuning = layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0);
        tuning.input_grad = input_grad;
        return saved_bytes(
            architecture_layer(m, 256, 1, DType::bf16, Attention::flash, Runtime{}, {}, tuning)
                .rows);
    };
    // In the first prompted layer the projections reading its input keep nothing (it needs no
    // gradient), but the output projection keeps the gated sum, which does: the others keep more.
    const std::uint64_t full = layer("0.41.1", true).value() - layer("0.43.2", true).value(),
                        first = layer("0.41.1", false).value() - layer("0.43.2", false).value(),
                        gated = 256 * m.heads * m.value_head_size() * 2;
    CHECK(first >= gated);
    CHECK(full > first);
}
