// The nvfp4 recipe: Transformer Engine's NVFP4 linears (2.8 and later) save their inputs'
// columnwise NVFP4 copy, fp4 values two a byte and an fp8 scale per 16, and keep a weight's rowwise
// and columnwise copies. Read from TE's source (nvfp4_tensor.py, linear.py), not measured (no
// Blackwell GPU and no fp4 type on CPU): hand sums on several shapes, against the fp8 recipe's.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "fixtures.hpp"
#include "run_program.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {
const Precision nvfp4_precision{DType::bf16, DType::bf16, false, recipe_table::te_nvfp4.storage};
const Precision fp8_precision{DType::bf16, DType::bf16, false, Storage{DType::fp8_e4m3}};

/// n elements in NVFP4: the values two a byte and an fp8 scale per 16, each rounded up.
std::int64_t nvfp4_bytes(std::uint64_t n) {
    return static_cast<std::int64_t>((n + 1) / 2 + (n + 15) / 16);
}
/// One NVFP4 tensor of n elements: those bytes and its fp32 amax.
std::int64_t nvfp4_tensor(std::uint64_t n) { return nvfp4_bytes(n) + 4; }

/// One layer's linear weights, written out: q, k, v, o and the MLP's matrices.
std::uint64_t nvfp4_linear_weights(const Architecture& m) {
    const std::uint64_t h = m.hidden, f = m.ffn, q = m.heads * m.head_size(),
                        kv = m.key_value_heads() * m.head_size();
    return h * q + 2 * h * kv + q * h + (m.mlp == Mlp::gated ? 3 : 2) * h * f;
}
}  // namespace

TEST_CASE("the nvfp4 recipe keeps mixed-precision Adam's state and names its linears' format",
          "[nvfp4][recipe]") {
    const Recipe& r = builtin_recipe("nvfp4");
    CHECK(r.bytes_per_parameter() == 16);
    REQUIRE(r.linears);
    CHECK(r.linears->storage.dtype == DType::fp4_e2m1);
    CHECK(r.linears->storage.block == 16);
    CHECK(r.linears->storage.scale == DType::fp8_e4m3);
    CHECK(r.linears->weight_casts == 2);
    CHECK(narrow_linear_key(*r.linears) == "nvfp4");
    CHECK(narrow_linear_key(*builtin_recipe("fp8").linears) == "fp8-e4m3");
    // 1,000 elements: 500 bytes of values and 63 scales.
    CHECK(r.linears->storage.bytes(Count(1000)).value() == 563);
}

TEST_CASE("nvfp4 linears save each input's fp4 values and fp8 scales where fp8 saves a byte each",
          "[nvfp4][architecture]") {
    const std::uint64_t s = GENERATE(512, 100), b = 2;
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    CAPTURE(m.name, s);
    const auto total = [&](Precision p) {
        return static_cast<std::int64_t>(
            architecture_layer(m, s, b, p, Attention::eager).total().value());
    };
    const std::uint64_t sbh = s * b * m.hidden, sbq = s * b * m.heads * m.head_size(),
                        sbf = s * b * m.ffn;
    // q/k/v's input, the output projection's, the MLP's and the down projection's.
    std::int64_t saved = 0;
    for (const std::uint64_t n : {sbh, sbq, sbh, sbf})
        saved += static_cast<std::int64_t>(n) - nvfp4_tensor(n);
    CHECK(total(nvfp4_precision) == total(fp8_precision) - saved);
    // Each one as two rows: the values and the scales.
    const LayerActivations layer = architecture_layer(m, s, b, nvfp4_precision, Attention::eager);
    std::uint64_t scales = 0;
    for (const SavedTensor& row : layer.rows)
        if (Text(row.tensor).find("fp8-e4m3 scales, one per 16") != Text::npos)
            scales += row.bytes.value();
    CHECK(scales == (sbh + 15) / 16 * 2 + (sbq + 15) / 16 + (sbf + 15) / 16 + 4 * 4);
}

TEST_CASE("an nvfp4 linear's backward casts its output's gradient rowwise and columnwise",
          "[nvfp4][architecture]") {
    const std::uint64_t s = 512, b = 2, tokens = s * b;
    const Architecture m = fixtures::llama_7b();
    std::map<std::string, std::int64_t> casts;
    for (const Workspace& w : architecture_layer(m, s, b, nvfp4_precision, Attention::flash).work)
        if (w.backward && Text(w.tensor).find("gradient cast to") != Text::npos)
            casts[linear_row(w.linear).tensor] += static_cast<std::int64_t>(w.bytes.value());
    REQUIRE(casts.size() == 4);
    CHECK(casts.at("q_proj") == 2 * nvfp4_tensor(tokens * 3 * m.hidden));
    CHECK(casts.at("gate_proj") == 2 * nvfp4_tensor(tokens * 2 * m.ffn));
    CHECK(casts.at("down_proj") == 2 * nvfp4_tensor(tokens * m.hidden));
}

TEST_CASE("nvfp4 weight copies, rowwise and columnwise, are held at every step",
          "[nvfp4][timeline]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    CAPTURE(m.name);
    Settings settings;
    settings.seq = 256, settings.micro_batch = 2;
    settings.activations = ActivationModel::architecture;
    settings.recipe = builtin_recipe("nvfp4");
    const Report r = estimate(m, settings);
    const std::int64_t copies = 2 * nvfp4_bytes(nvfp4_linear_weights(m)) * m.layers;
    for (const char* step : {"forward 1", "loss", "backward 1", "optimizer"})
        CHECK(static_cast<std::int64_t>(
                  fixtures::step_named(r.busiest(), step).bytes.weight_copies.value()) == copies);
}

TEST_CASE("nvfp4 through the program: listed, and said by a recipe file", "[nvfp4][cli]") {
    const std::string args = "--preset llama-7b --seq 2048 --activations architecture --format csv";
    const auto by_name = testing::memcalc(args + " --recipe nvfp4");
    REQUIRE(by_name.status == 0);
    const std::string path = "nvfp4_recipe_test.json";
    const nlohmann::json row = testing::listed_recipe("nvfp4", path);
    REQUIRE(row.is_object());
    CHECK(row["linears"] == "nvfp4");
    CHECK_THAT(row["linear_casts_source"].get<std::string>(),
               Catch::Contains("nvfp4_tensor.py"));  // where it is read from
    const auto by_file = testing::memcalc(args + " --recipe-file " + path);
    CHECK(by_file.status == 0);
    CHECK(by_file.out == by_name.out);
    std::remove(path.c_str());
}
