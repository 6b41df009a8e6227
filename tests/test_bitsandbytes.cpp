// bitsandbytes' 4-bit weights by quantiser and release: storage, what a 4-bit linear keeps, and
// what dequantising makes (bitsandbytes.hpp).
#include <catch2/catch.hpp>

#include <algorithm>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/finetune.hpp"

using namespace memcalc;

namespace {

FineTuning qlora(Quantizer quantizer, const char* release, bool double_quant = true) {
    FineTuning f;
    f.mode = Training::qlora;
    f.lora.targets = {"all-linear"};
    f.quantized.quantizer = quantizer;
    f.quantized.bitsandbytes = *bitsandbytes_version_of(release);
    f.quantized.double_quant = double_quant;
    return f;
}

LayerActivations layer(const Architecture& m, const FineTuning& f, std::uint64_t seq) {
    const LayerTuning tuning = layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0);
    return architecture_layer(m, seq, 1, DType::bf16, Attention::flash, Platform::cuda, {}, tuning);
}

}  // namespace

TEST_CASE("A bitsandbytes release is read as the row it falls in", "[bitsandbytes]") {
    using V = BitsandbytesVersion;
    const std::pair<const char*, V> rows[] = {{"0.39.0", V::v0_39},   {"0.41.1", V::v0_39},
                                              {"0.43.1", V::v0_43_0}, {"0.43.0", V::v0_43_0},
                                              {"0.43.2", V::v0_43_2}, {"0.45.0.dev0", V::v0_43_2},
                                              {"1.0", V::v0_43_2},    {"0.44", V::v0_43_2}};
    for (const auto& [text, row] : rows) {
        INFO(text);
        CHECK(bitsandbytes_version_of(text) == row);
    }
    for (const char* bad : {"0.38.1", "0", "", "x.41", "0.x", "0.41.x"}) {
        INFO(bad);
        CHECK_FALSE(bitsandbytes_version_of(bad));
    }
    CHECK(bitsandbytes_facts(V::v0_39).keeps_input);
    CHECK_FALSE(bitsandbytes_facts(V::v0_43_2).keeps_input);
}

TEST_CASE("Without double quantisation a 4-bit weight keeps an fp32 absmax per 64 values",
          "[bitsandbytes]") {
    for (const std::uint64_t n : {4096ULL * 4096, 11008ULL * 4096, 65ULL}) {
        INFO(n);
        const std::uint64_t blocks = (n + 63) / 64;
        CHECK(nf4_single_quant.bytes(Count(n)) == Count((n + 1) / 2 + blocks * 4));
    }
    CHECK(qlora(Quantizer::transformers, "0.43.2", false).base() == nf4_single_quant);
    CHECK(qlora(Quantizer::transformers, "0.43.2").base() == nf4_double_quant);
}

TEST_CASE("Lightning's quantiser stores the head in 4 bits, quantised from fp16",
          "[bitsandbytes]") {
    const Architecture m = fixtures::llama_7b();
    for (const Quantizer q : {Quantizer::transformers, Quantizer::lightning}) {
        const ParameterTable t = fine_tuned_table(m, parameter_table(m), qlora(q, "0.43.2"));
        for (const ParamRow& r : t.rows) {
            if (r.part != Part::head) continue;
            const bool weight = r.role == ParamRole::weight;
            CHECK(bool(r.storage) == (weight && quantizer_row(q).head));
            if (r.storage) CHECK(r.storage->quantized_from == DType::fp16);
        }
    }
    // bitsandbytes' own Params4bit quantised from fp16 before 0.43.0.
    CHECK(qlora(Quantizer::transformers, "0.42.0").base().quantized_from == DType::fp16);
    CHECK_FALSE(qlora(Quantizer::transformers, "0.43.0").base().quantized_from);
}

TEST_CASE("Before 0.43.2 each 4-bit linear keeps its input; from fp16 it dequantises twice",
          "[bitsandbytes]") {
    const Architecture m = fixtures::llama_7b();
    for (const std::uint64_t seq : {128ULL, 1000ULL}) {
        INFO(seq);
        const LayerActivations old = layer(m, qlora(Quantizer::lightning, "0.41.1"), seq);
        const LayerActivations now = layer(m, qlora(Quantizer::lightning, "0.43.2"), seq);
        // Both norms' outputs and the down projection's input; the output projection's input is
        // the attention kernel's output, kept already.
        const Count more = Count(seq) * (2 * m.hidden + m.ffn) * 2;
        CHECK(saved_bytes(old.rows) == saved_bytes(now.rows) + more);
        for (const auto& w : old.work)
            if (std::string(w.op).find("4-bit linear") != std::string::npos)
                CHECK(w.bytes == Count(m.hidden * m.ffn * (2 + 2)));  // fp16, then bf16
    }
}

TEST_CASE(
    "MatMul4Bit's ctx holds the inputs past their layer's backward, until the loop drops "
    "the loss",
    "[bitsandbytes]") {
    const Architecture m = fixtures::llama_7b();
    for (const std::uint64_t seq : {128ULL, 1000ULL}) {
        INFO(seq);
        Settings s;
        s.seq = seq, s.micro_batch = 1, s.activations = ActivationModel::architecture;
        s.framework.attention = Attention::flash;
        s.tuning = qlora(Quantizer::lightning, "0.43.2");
        const Report now = Estimator(m).estimate(s);
        s.tuning = qlora(Quantizer::lightning, "0.41.1");
        const Report old = Estimator(m).estimate(s);
        // Each layer's inputs of its 4-bit linears: both norms' outputs, the attention's output
        // (the flash kernel's, kept by it too until its backward) and the down projection's; and
        // the head's input.
        const Count layer = Count(seq) * (3 * m.hidden + m.ffn) * 2,
                    head = Count(seq) * m.hidden * 2;
        const auto total = [](const Report& r, const char* step) {
            return fixtures::step_named(r, step).bytes.total();
        };
        CHECK(total(old, "optimizer") == total(now, "optimizer") + layer * m.layers + head);
        // Backward 2: the layers after it have run theirs, their inputs still held; layers 1 and
        // 2 keep theirs as saved tensors (a backward step counts the first layer as its kind's
        // others, leaning high: its input needs no gradient, so it keeps none before its MLP).
        const Count saved = Count(seq) * (2 * m.hidden + m.ffn) * 2 * 2;
        CHECK(total(old, "backward 2") ==
              total(now, "backward 2") + layer * (m.layers - 2) + head + saved);
    }
}

TEST_CASE(
    "A 4-bit down projection's backward has its weight dequantised beside its input's "
    "gradient",
    "[bitsandbytes]") {
    const Architecture m = fixtures::llama_7b();
    for (const std::uint64_t seq : {128ULL, 20000ULL}) {
        for (const Quantizer q : {Quantizer::transformers, Quantizer::lightning}) {
            INFO(seq << " " << quantizer_row(q).name);
            const LayerActivations l = layer(m, qlora(q, "0.43.2"), seq);
            const Count weight(m.ffn * m.hidden), gradient = Count(seq) * m.ffn * 2;
            // Quantised from fp16: the fp16 weight and its bf16 cast, before the product.
            const Count both = weight * (q == Quantizer::lightning ? 4 : 2);
            const Count expected = std::max(both, weight * 2 + gradient);
            int found = 0;
            for (const auto& w : l.work)
                if (std::string(w.op) == "down projection backward") {
                    CHECK(w.bytes == expected);
                    ++found;
                }
            CHECK(found == 1);
        }
    }
}

TEST_CASE("memcalc --qlora-quantizer, --qlora-double-quant, --bitsandbytes-version",
          "[bitsandbytes][cli]") {
    const std::string base = "--preset llama-7b --seq 512 --train qlora --format json ";
    const auto r = testing::memcalc(base +
                                    "--qlora-quantizer lightning --qlora-double-quant false "
                                    "--bitsandbytes-version 0.41.1");
    REQUIRE(r.status == 0);
    const auto q = nlohmann::json::parse(r.out)["settings"]["training"];
    CHECK(q["quantization"]["quantizer"] == "lightning");
    CHECK(q["quantization"]["bitsandbytes_version"] == "0.39.0");
    CHECK(q["quantization"]["keeps_input"] == true);
    CHECK(q["base_storage"]["quantized_from"] == "fp16");
    CHECK(q["base_storage"]["scale"] == "fp32");
    const auto d = testing::memcalc(base);
    REQUIRE(d.status == 0);
    CHECK(nlohmann::json::parse(d.out)["peak"]["bytes"] <
          nlohmann::json::parse(r.out)["peak"]["bytes"]);
    for (const char* bad : {"--qlora-quantizer peft", "--qlora-double-quant yes",
                            "--bitsandbytes-version 0.38.0", "--bitsandbytes-version latest"}) {
        const auto e = testing::memcalc(base + bad);
        INFO(bad << ": " << e.err);
        CHECK(e.status != 0);
        CHECK(e.out.empty());
        CHECK(e.err.find('\n') == e.err.size() - 1);
    }
    const auto lora = testing::memcalc(
        "--preset llama-7b --seq 512 --train lora "
        "--qlora-quantizer lightning");
    CHECK(lora.status != 0);
    CHECK_THAT(lora.err, Catch::Contains("needs --train qlora, qadapter or qadapter-v2"));
}
