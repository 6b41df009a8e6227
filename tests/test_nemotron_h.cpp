// Nemotron-H (model_type nemotron_h): layers of one block each, a Mamba-2 mixer, attention or a
// squared-ReLU MLP after its own RMSNorm; parameters tensor by tensor as transformers'
// NemotronHBlock holds them, what a layer of one block keeps, and the config reader.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/serve.hpp"
#include "memcalc/workload.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
const std::string nemotron_configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";

Architecture nemotron_import(const json& config) {
    return cli::parse_hf_config(config.dump(), "n.json", "n").architecture;
}

/// A small Nemotron-H: `pattern` a character a layer.
json small_nemotron(const std::string& pattern) {
    return {{"model_type", "nemotron_h"},
            {"hidden_size", 64},
            {"num_hidden_layers", pattern.size()},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 2},
            {"head_dim", 16},
            {"intermediate_size", 96},
            {"vocab_size", 128},
            {"mamba_num_heads", 8},
            {"mamba_head_dim", 16},
            {"n_groups", 2},
            {"ssm_state_size", 16},
            {"hybrid_override_pattern", pattern}};
}

/// One layer's saved bytes, its rows summed.
std::uint64_t one_block_kept(const Architecture& m, std::uint64_t s, std::uint64_t b) {
    return architecture_layer(m, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu)
        .total()
        .value();
}
}  // namespace

TEST_CASE("Nemotron-H 8B Base: its checkpoint's total, a kind of layer at a time",
          "[nemotron_h][hf_config][params]") {
    const Architecture m =
        cli::load_hf_config(nemotron_configs + "nemotron-h-8b-base-8k.json").architecture;
    REQUIRE(m.kind_count() == 3);
    const ParameterTable t = parameter_table(m);
    const std::uint64_t h = 4096, di = 128 * 64, conv = di + 2 * 8 * 128;
    // Mamba-2: its norm, in_proj (z, x, B, C, dt), conv1d and its bias, dt_bias, A_log, D, the
    // gated norm, out_proj.
    const std::uint64_t mamba = h + h * (di + conv + 128) + 5 * conv + 3 * 128 + di + di * h;
    const std::uint64_t attention = h + 2 * h * 4096 + 2 * h * 1024;  // q, o; k, v of 8 heads
    const std::uint64_t mlp = h + 2 * h * 21504;                      // up and down, no gate
    CHECK(t.per_layer(0).value() == mamba);
    CHECK(t.per_layer(1).value() == mlp);
    CHECK(t.per_layer(2).value() == attention);
    CHECK(m.layers_of_kind(0) == 24);
    CHECK(m.layers_of_kind(1) == 24);
    CHECK(m.layers_of_kind(2) == 4);
    CHECK(t.total().value() == 24 * (mamba + mlp) + 4 * attention + 2 * 131072 * h + h);
    CHECK(t.total().value() == 8100852736u);
}

TEST_CASE("Nemotron 3 Nano 30B-A3B: experts in the E layers, its checkpoint's total",
          "[nemotron_h][hf_config][params][moe]") {
    const Architecture m =
        cli::load_hf_config(nemotron_configs + "nemotron-3-nano-30b-a3b.json").architecture;
    REQUIRE(m.kind_count() == 3);
    const ParameterTable t = parameter_table(m);
    const std::uint64_t h = 2688, di = 64 * 64, conv = di + 2 * 8 * 128, E = 128;
    const std::uint64_t mamba = h + h * (di + conv + 64) + 5 * conv + 3 * 64 + di + di * h;
    // The router (its e_score_correction_bias a buffer), 128 experts' up and down of 1856 and
    // the shared expert's of 3712, no gates.
    const std::uint64_t moe = h + E * h + E * 2 * h * 1856 + 2 * h * 3712;
    const std::uint64_t attention = h + 2 * h * 4096 + 2 * h * 256;  // 2 k/v heads of 128
    CHECK(t.per_layer(0).value() == mamba);
    CHECK(t.per_layer(1).value() == moe);
    CHECK(t.per_layer(2).value() == attention);
    CHECK(m.layers_of_kind(0) == 23);
    CHECK(m.layers_of_kind(1) == 23);
    CHECK(m.layers_of_kind(2) == 6);
    CHECK(t.total().value() == 23 * (mamba + moe) + 6 * attention + 2 * 131072 * h + h);
    CHECK(t.total().value() == 31577937344u);
}

TEST_CASE("beside E layers an MLP layer stays dense at intermediate_size",
          "[nemotron_h][hf_config][moe]") {
    json config = small_nemotron("M-E*");
    config.update({{"n_routed_experts", 8},
                   {"num_experts_per_tok", 2},
                   {"moe_intermediate_size", 32},
                   {"moe_shared_expert_intermediate_size", 48}});
    const Architecture m = nemotron_import(config);
    REQUIRE(m.kind_count() == 4);
    CHECK(m.kind_view(1).experts == 0);
    CHECK(m.kind_view(1).ffn == 96);
    CHECK(m.kind_view(2).experts == 8);
    CHECK(m.kind_view(2).ffn == 32);
    CHECK(m.kind_view(2).shared_ffn == 48);
    const ParameterTable t = parameter_table(m);
    CHECK(t.per_layer(1).value() == 64 + 2 * 64 * 96);
    CHECK(t.per_layer(2).value() == 64 + 8 * 64 + 8 * 2 * 64 * 32 + 2 * 64 * 48);
    config["moe_latent_size"] = 16;
    CHECK_THROWS_WITH(nemotron_import(config), Catch::Contains("moe_latent_size"));
}

TEST_CASE("a layer of one block keeps its norm's rows and its block's, and no other half",
          "[nemotron_h][activations]") {
    const std::uint64_t s = GENERATE(24, 40), b = GENERATE(1, 3), T = s * b;
    CAPTURE(s, b);
    const Architecture m = nemotron_import(small_nemotron("M-*"));
    // An RMSNorm: its fp32 input, 1/rms and the normalised input (test_mamba2's rows).
    const std::uint64_t norm = 4 * T * 64 + 4 * T + 2 * T * 64;
    // The MLP alone: up's input, relu's output (square's input) and the square (down's input).
    const std::uint64_t mlp = norm + 2 * T * 64 + 2 * T * 96 + 2 * T * 96;
    CHECK(one_block_kept(m.kind_view(1), s, b) == mlp);
    // The Mamba-2 mixer alone: in_proj's input and output (2 x 128 + 2 x 2 x 16 + 8 wide), exp's
    // output and A (8 fp32 each), out_x (128), rstd (one fp32 per token and group).
    const std::uint64_t mamba =
        norm + 2 * T * 64 + 2 * T * (2 * 128 + 64 + 8) + 2 * 4 * 8 + 2 * T * 128 + 4 * T * 2;
    CHECK(one_block_kept(m.kind_view(0), s, b) == mamba);
    // The attention layer alone has the rows an attention layer's first half has (its selective
    // checkpoint's rows too, which no total counts).
    Architecture both = m.kind_view(2);
    both.has_mlp = true;
    const auto rows = [&](const Architecture& layer, bool first_half_only) {
        const LayerActivations t = architecture_layer(layer, s, b, Precision(DType::bf16),
                                                      Attention::eager, Platform::cpu);
        Count sum;
        const std::size_t end = first_half_only ? t.first_mlp_half_row() : t.rows.size();
        for (std::size_t i = 0; i < end; ++i) sum += t.rows[i].bytes;
        return sum.value();
    };
    CHECK(rows(m.kind_view(2), false) == rows(both, true));
}

TEST_CASE("Nemotron-H's layers: FLOPs, serving's cache and state, the formula refused",
          "[nemotron_h][flops][serve]") {
    const Architecture m = nemotron_import(small_nemotron("M-*-"));
    const ComputeCost c = compute_cost(m, 32, 1, Recompute::none);
    // The MLP layers: up and down, 2 T h f each; no attention in them.
    CHECK(c.kind_forward[1] == Approx(2.0 * 32 * 64 * 96 * 2));
    ServeSettings s;
    s.context = 256, s.batch = 1;
    const ServeReport r = serve(m, s);
    CHECK(r.cache_layers == 1);  // the attention layer alone caches keys and values
    CHECK(r.state_layers == 1);  // the Mamba-2 layer keeps a state
    CHECK_THROWS_WITH(
        activation_tables(m, 32, 1, Precision(DType::bf16), ActivationModel::korthikanti),
        Catch::Contains("Korthikanti's formula has no"));
}

TEST_CASE("nemotron_h's bad values are refused naming the key", "[nemotron_h][hf_config]") {
    using Row = std::pair<std::string, std::string>;
    const auto [pattern, message] = GENERATE(table<std::string, std::string>({
        Row{"M-E", "missing key 'moe_intermediate_size'"},
        Row{"M-x", "hybrid_override_pattern has 'x'; memcalc reads M (Mamba-2), * (attention)"},
    }));
    CHECK_THROWS_WITH(nemotron_import(small_nemotron(pattern)), Catch::Contains(message));
    json longer = small_nemotron("M-*");
    longer["num_hidden_layers"] = 4;
    CHECK_THROWS_WITH(
        nemotron_import(longer),
        Catch::Contains("hybrid_override_pattern has 3 layers; num_hidden_layers is 4"));
    json missing = small_nemotron("M-*");
    missing.erase("hybrid_override_pattern");
    CHECK_THROWS_WITH(nemotron_import(missing),
                      Catch::Contains("missing key 'hybrid_override_pattern'"));
    json biased = small_nemotron("M-*");
    biased["mlp_bias"] = true;
    CHECK_THROWS_WITH(nemotron_import(biased), Catch::Contains("mlp_bias true"));
}
