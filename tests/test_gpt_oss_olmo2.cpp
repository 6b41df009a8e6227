// OLMo 2 (norms after the branches, q/k norms over the whole projection, RMSNorm scaled in fp32)
// and gpt-oss (attention sinks, biased experts and router, the clamped SwiGLU, alternating sliding
// and full layers): exact parameters on the published configs and on small shapes, and the tensors
// they keep.
#include <catch2/catch.hpp>

#include <string>
#include <tuple>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/params.hpp"
#include "memcalc/workload.hpp"
#include "model_file.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
const std::string configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";

Architecture olmo2_shape(std::uint64_t h, std::uint64_t layers, std::uint64_t heads,
                         std::uint64_t kv, std::uint64_t f) {
    Architecture m;
    m.hidden = h, m.layers = layers, m.heads = heads, m.kv_heads = kv, m.ffn = f, m.vocab = 1000;
    m.norm_position = NormPosition::post, m.qk_norm = QkNorm::whole, m.rmsnorm_fp32_scale = true;
    return m;
}

Architecture gpt_oss_shape(std::uint64_t h, std::uint64_t layers, std::uint64_t heads,
                           std::uint64_t kv, std::uint64_t d, std::uint64_t f, std::uint64_t E,
                           std::uint64_t k) {
    Architecture m;
    m.hidden = h, m.layers = layers, m.heads = heads, m.kv_heads = kv, m.head_dim = d, m.ffn = f,
    m.vocab = 1000;
    m.experts = E, m.experts_per_token = k, m.bias = Bias::all,
    m.activation = Activation::clamped_swiglu;
    m.attention_sinks = true, m.router_bias = RouterBias::trainable, m.rmsnorm_fp32_scale = true;
    m.softmax_fp32 = false;
    m.stacked_experts = true;
    return m;
}

/// The bytes of the rows whose op starts with `op`.
std::uint64_t op_bytes(const LayerActivations& layer, const std::string& op) {
    std::uint64_t sum = 0;
    for (const auto& r : layer.rows)
        if (std::string(r.op).rfind(op, 0) == 0) sum += r.bytes.value();
    return sum;
}
}  // namespace

TEST_CASE("OLMo 2 and gpt-oss configs import their quirks", "[gpt_oss][olmo2][hf_config]") {
    const auto olmo = cli::load_hf_config(configs + "olmo-2-0425-1b.json").architecture;
    CHECK(olmo.norm_position == NormPosition::post);
    CHECK(olmo.qk_norm == QkNorm::whole);
    CHECK(olmo.rmsnorm_fp32_scale);
    CHECK_FALSE(olmo.norms_before_branches());

    const auto oss = cli::load_hf_config(configs + "gpt-oss-20b.json");
    const Architecture& g = oss.architecture;
    CHECK(g.attention_sinks);
    CHECK(g.router_bias == RouterBias::trainable);
    CHECK(g.bias == Bias::all);
    CHECK(g.activation == Activation::clamped_swiglu);
    CHECK(g.head_size() == 64);
    CHECK(g.active_experts() == 4);
    // layer_types alternate sliding (128) and full: two kinds in 24 runs, 12 layers each.
    REQUIRE(g.kind_count() == 2);
    CHECK(g.layer_pattern.size() == 24);
    CHECK(g.kind_view(0).window == 128);
    CHECK(g.kind_view(1).window == 0);
    CHECK(g.layers_of_kind(0) == 12);
    CHECK(g.distinct_windows() == 2);
    CHECK(oss.description.find("MXFP4") != std::string::npos);
    const auto big = cli::load_hf_config(configs + "gpt-oss-120b.json").architecture;
    CHECK(big.layers_of_kind(1) == 18);
    CHECK(big.experts == 128);
}

TEST_CASE("OLMo 2's parameters: two post-norms and whole-width q/k norms a layer, on two shapes",
          "[olmo2][params]") {
    using Row =
        std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    const auto [h, L, a, k, f] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>(
            {Row{64, 2, 4, 4, 96}, Row{2048, 16, 16, 16, 8192}, Row{512, 3, 8, 2, 1376}}));
    CAPTURE(h, L, a, k, f);
    const Architecture m = olmo2_shape(h, L, a, k, f);
    const std::uint64_t d = h / a;
    const std::uint64_t per_layer =
        2 * h + a * d + k * d + 2 * h * a * d + 2 * h * k * d + 3 * h * f;
    const ParameterTable t = parameter_table(m);
    CHECK(t.per_layer().value() == per_layer);
    CHECK(t.total().value() == L * per_layer + 2 * 1000 * h + h);
    for (const auto& r : t.rows) {
        CHECK(std::string(r.tensor) != "attention_norm.weight");
        CHECK(std::string(r.tensor) != "mlp_norm.weight");
    }
    // Post-norms are only for sequential layers of two norms.
    Architecture bad = m;
    bad.norms_per_layer = 4;
    CHECK_THROWS_WITH(validate(bad),
                      "norm_position post needs norms_per_layer 2 and a sequential layer (got "
                      "norms_per_layer 4)");
}

TEST_CASE("gpt-oss's parameters: sinks, biased q/k/v/o, biased router and experts, on two shapes",
          "[gpt_oss][params]") {
    using Row =
        std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    const auto [h, a, k, f, E] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>(
            {Row{2880, 64, 8, 2880, 32}, Row{96, 4, 2, 160, 8}}));
    CAPTURE(h, a, k, f, E);
    const std::uint64_t d = 64;
    const Architecture m = gpt_oss_shape(h, 4, a, k, d, f, E, 2);
    const std::uint64_t attention =
        (h * a * d + a * d) + 2 * (h * k * d + k * d) + (a * d * h + h) + a;
    const std::uint64_t moe = (h * E + E) + E * (h * 2 * f + 2 * f) + E * (f * h + h);
    CHECK(parameter_table(m).per_layer().value() == 2 * h + attention + moe);
    // Without sinks and the router's bias: exactly a per layer and E per layer fewer.
    Architecture plain = m;
    plain.attention_sinks = false, plain.router_bias = RouterBias::none;
    CHECK(parameter_table(m).total().value() - parameter_table(plain).total().value() ==
          4 * (a + E));
}

TEST_CASE(
    "OLMo 2's layer keeps fp32 whole-width q/k norms and fp32 post-norms of the branch outputs",
    "[olmo2][activations]") {
    const std::uint64_t s = GENERATE(16, 512), b = GENERATE(1, 2);
    CAPTURE(s, b);
    const Architecture m = olmo2_shape(512, 2, 8, 8, 1376);
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    const std::uint64_t sbh = s * b * 512, sb = s * b;
    // x upcast (fp32), 1/rms per token (fp32), the normalised x in fp32: 4 + 4 + 4 bytes.
    CHECK(op_bytes(layer, "q_norm (whole width)") == 8 * sbh + 4 * sb);
    CHECK(op_bytes(layer, "k_norm (whole width)") == 8 * sbh + 4 * sb);
    CHECK(op_bytes(layer, "post-attention norm") == 8 * sbh + 4 * sb);
    CHECK(op_bytes(layer, "post-MLP norm") == 8 * sbh + 4 * sb);
    CHECK(op_bytes(layer, "attention norm") == 0);
    CHECK(op_bytes(layer, "MLP norm") == 0);
    // q, k and v read the layer's input itself: the row is the checkpoint under full recomputation.
    bool input_row = false;
    for (const auto& r : layer.rows)
        if (std::string(r.op) == "q/k/v projections") input_row = r.layer_input;
    CHECK(input_row);
    // LLaMA's RMSNorm keeps the normalised input in bf16: 2 s b h less per norm than OLMo 2's.
    Architecture narrow = m;
    narrow.rmsnorm_fp32_scale = false;
    const LayerActivations llama_scaled =
        architecture_layer(narrow, s, b, DType::bf16, Attention::eager);
    CHECK(layer.total().value() - llama_scaled.total().value() == 2 * (2 * sbh) + 2 * (2 * sbh));
}

TEST_CASE("gpt-oss's eager attention softmaxes s + 1 columns and keeps the row maxima's indices",
          "[gpt_oss][activations]") {
    const std::uint64_t s = GENERATE(16, 4096), b = GENERATE(1, 3);
    CAPTURE(s, b);
    const Architecture m = gpt_oss_shape(96, 2, 4, 2, 64, 160, 8, 2);
    const LayerActivations eager = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    CHECK(op_bytes(eager, "softmax") == 2 * 4 * s * (s + 1) * b);
    CHECK(op_bytes(eager, "scores - max (sinks)") == 8 * 4 * s * b);
    Architecture no_sinks = m;
    no_sinks.attention_sinks = false;
    const LayerActivations plain =
        architecture_layer(no_sinks, s, b, DType::bf16, Attention::eager);
    CHECK(eager.total().value() - plain.total().value() == 2 * 4 * s * b + 8 * 4 * s * b);
    // A fused kernel keeps a log-sum-exp per row either way.
    CHECK(architecture_layer(m, s, b, DType::bf16, Attention::flash).total() ==
          architecture_layer(no_sinks, s, b, DType::bf16, Attention::flash).total());
}

TEST_CASE(
    "gpt-oss's experts: the clamped SwiGLU keeps seven s b k f tensors and the stacked weights' "
    "copies",
    "[gpt_oss][activations]") {
    const std::uint64_t s = GENERATE(16, 1024), b = GENERATE(1, 2);
    CAPTURE(s, b);
    const Architecture m = gpt_oss_shape(96, 2, 4, 2, 64, 160, 8, 2);
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::flash);
    const std::uint64_t sbkf = s * b * 2 * 160;
    // its input, the clamped gate, sigmoid's output; the product's two factors (its output, up + 1)
    // and the up projection's output (clamp's); the down projection's input: 7 tensors of 2 bytes.
    const std::uint64_t chain = op_bytes(layer, "experts: clamped SwiGLU") +
                                op_bytes(layer, "experts: gate x up") +
                                op_bytes(layer, "experts: down projection");
    CHECK(chain == 7 * 2 * sbkf);
    CHECK(op_bytes(layer, "experts: stacked weights indexed") == 2 * 8 * 3 * 96 * 160 + 8 * 8);
}

TEST_CASE("sliding and full layers keep the same tensors; eager attention builds a mask per window",
          "[gpt_oss][window]") {
    const auto g = cli::load_hf_config(configs + "gpt-oss-20b.json").architecture;
    const std::uint64_t s = GENERATE(128, 4096);
    CAPTURE(s);
    CHECK(architecture_layer(g.kind_view(0), s, 1, DType::bf16, Attention::eager).total() ==
          architecture_layer(g.kind_view(1), s, 1, DType::bf16, Attention::eager).total());
    const auto tables = activation_tables(g, s, 2, DType::bf16, ActivationModel::architecture);
    REQUIRE(tables.forward_buffers.size() == 1);
    CHECK(tables.forward_buffers[0].copies == 2);
    CHECK(tables.forward_buffers[0].bytes.value() == 2 * 2 * s * s * 2);
    // Mistral's window covers every layer: one mask.
    const auto mistral = cli::load_hf_config(configs + "mistral-7b-v0.1.json").architecture;
    CHECK(mistral.window == 4096);
    CHECK(mistral.kind_count() == 1);
    CHECK(activation_tables(mistral, s, 1, DType::bf16, ActivationModel::architecture)
              .forward_buffers[0]
              .copies == 1);
}

TEST_CASE(
    "Qwen3 with use_sliding_window slides from max_window_layers on; bad layer_types are named",
    "[window][hf_config]") {
    const std::string qwen =
        R"({"model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 6,
            "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 96, "vocab_size": 100,
        "use_sliding_window": true, "sliding_window": 32, "max_window_layers": 4})";
    const auto m = cli::parse_hf_config(qwen, "q.json", "q").architecture;
    REQUIRE(m.kind_count() == 2);
    CHECK(m.layers_of_kind(0) == 4);
    CHECK(m.kind_view(1).window == 32);
    CHECK_THROWS_WITH(
        cli::parse_hf_config(R"({"model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96,
        "vocab_size": 100,
        "num_local_experts": 4, "num_experts_per_tok": 2, "layer_types": ["sliding_attention"]})",
                             "g.json", "g"),
        "g.json: layer_types has 1 entries; num_hidden_layers is 2");
}

TEST_CASE(
    "the gpt-oss, OLMo 2 and Gemma 3 presets count their published figures and equal their configs",
    "[gpt_oss][olmo2][presets]") {
    using Row = std::tuple<const char*, const char*, std::uint64_t>;
    const auto [preset, config, published] =
        GENERATE(table<const char*, const char*, std::uint64_t>(
            {Row{"gpt-oss-20b", "gpt-oss-20b", 20914757184ULL},
             Row{"gpt-oss-120b", "gpt-oss-120b", 116829156672ULL},
             Row{"olmo-2-1b", "olmo-2-0425-1b", 1484916736ULL},
             Row{"gemma-3-1b", "gemma-3-1b-pt", 999885952ULL}}));
    CAPTURE(preset);
    const Architecture p = cli::load_preset(preset).architecture;
    const Architecture c = cli::load_hf_config(configs + config + ".json").architecture;
    CHECK(parameter_table(p).total().value() == published);
    CHECK(parameter_table(c).total().value() == published);
    // The preset keeps every field the importer sets: the same saved tensors, kind by kind.
    REQUIRE(p.kind_count() == c.kind_count());
    CHECK(p.distinct_windows() == c.distinct_windows());
    for (std::size_t k = 0; k < p.kind_count(); ++k)
        CHECK(architecture_layer(p.kind_view(k), 256, 1, DType::bf16, Attention::eager).total() ==
              architecture_layer(c.kind_view(k), 256, 1, DType::bf16, Attention::eager).total());
}

TEST_CASE("an import's notes are printed beside its estimate, in the table and in JSON",
          "[gpt_oss][cli]") {
    const std::string config = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/gpt-oss-20b.json";
    const auto table = testing::memcalc("--config " + config + " --seq 1024");
    REQUIRE(table.status == 0);
    CHECK_THAT(table.out,
               Catch::Contains("Note on gpt-oss-20b: the checkpoint stores the experts as MXFP4"));
    const auto json = testing::memcalc("--config " + config + " --seq 1024 --format json");
    REQUIRE(json.status == 0);
    CHECK_THAT(json.out, Catch::Contains("\"model_notes\""));
    // A preset has none.
    CHECK_THAT(testing::memcalc("--preset gpt-oss-20b --seq 1024").out,
               !Catch::Contains("Note on"));
}
