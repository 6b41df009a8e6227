// Mamba-1 mixers (Jamba): the config reader's layer pattern, parameters tensor by tensor as
// transformers' JambaMambaMixer holds them, the saved tensors of its slow path (closed forms of
// what validation/reference_trainer.py measures, validation/results/cpu-mamba.json) and of
// mamba_ssm's kernels, and serving's state per sequence in place of a KV cache.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/serve.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
struct MambaShape {
    std::uint64_t h, di, N, r, K;
    bool conv_bias, proj_bias, norms;
};
const MambaShape mamba_tiny{64, 128,  8,     4,
                            4,  true, false, true};  // validation/models/mamba-tiny.json
const MambaShape mamba_plain{
    48, 96, 6, 5, 3, false, true, false};  // MambaMixer's: biased projections, no inner norms

Architecture mamba_model(const MambaShape& x) {
    Architecture m;
    m.name = "mamba", m.hidden = x.h, m.layers = 2, m.heads = 4, m.ffn = 176, m.vocab = 128,
    m.max_positions = 64;
    m.position = Position::none, m.mixer = Mixer::mamba;
    m.ssm = {x.di, x.N, x.K, x.r, x.conv_bias, x.proj_bias, x.norms, false};
    return m;
}

/// One Mamba mixer's parameters, written out from modeling_jamba.py's JambaMambaMixer.__init__.
std::uint64_t mixer_parameters(const MambaShape& x) {
    return x.h * 2 * x.di + (x.proj_bias ? 2 * x.di : 0)  // in_proj
           + x.di * x.K + (x.conv_bias ? x.di : 0)        // conv1d (depthwise)
           + x.di * (x.r + 2 * x.N)                       // x_proj
           + x.r * x.di + x.di                            // dt_proj and its bias
           + x.di * x.N + x.di                            // A_log, D
           + (x.norms ? x.r + 2 * x.N : 0)                // dt, B and C norms
           + x.di * x.h + (x.proj_bias ? x.h : 0);        // out_proj
}

json jamba_config() {
    return json{{"model_type", "jamba"},    {"hidden_size", 64},        {"num_hidden_layers", 16},
                {"num_attention_heads", 4}, {"num_key_value_heads", 2}, {"intermediate_size", 96},
                {"vocab_size", 100},        {"num_experts", 4},         {"num_experts_per_tok", 2},
                {"attn_layer_period", 8},   {"attn_layer_offset", 4},   {"expert_layer_period", 2},
                {"expert_layer_offset", 1}, {"mamba_d_state", 8},       {"mamba_d_conv", 4},
                {"mamba_expand", 2},        {"mamba_dt_rank", "auto"}};
}
}  // namespace

TEST_CASE("a Mamba mixer's parameters, tensor by tensor", "[ssm][params]") {
    const MambaShape x = GENERATE(mamba_tiny, mamba_plain);
    CAPTURE(x.h);
    const Architecture m = mamba_model(x);
    const ParameterTable t = parameter_table(m);
    const std::uint64_t layer = mixer_parameters(x) + 2 * x.h + 3 * x.h * 176;
    CHECK(t.per_layer().value() == layer);
    CHECK(t.total().value() == 2 * layer + 2 * 128 * x.h + x.h);
    for (const ParamRow& r : t.rows) CHECK(r.tensor != "q_proj");
}

TEST_CASE("jamba's config: attention every period-th layer, experts every other, dt_rank auto",
          "[ssm][hf_config]") {
    const Architecture m = cli::parse_hf_config(jamba_config().dump(), "j.json", "j").architecture;
    REQUIRE(m.kind_count() == 3);
    CHECK(m.ssm.d_inner == 128);
    CHECK(m.ssm.dt_rank == 4);  // ceil(64 / 16)
    CHECK(m.ssm.kernels);       // JambaConfig's use_mamba_kernels default
    std::uint64_t attention = 0, routed = 0;
    const LayerPattern pattern(m);
    for (std::uint64_t layer = 1; layer <= m.layers; ++layer) {
        const Architecture v = m.kind_view(pattern.kind_of(layer));
        const std::uint64_t i = layer - 1;
        CAPTURE(i);
        CHECK((v.mixer == Mixer::attention) == (i % 8 == 4));
        CHECK(v.is_moe() == (i % 2 == 1));
        attention += v.mixer == Mixer::attention, routed += v.is_moe();
    }
    CHECK(attention == 2);
    CHECK(routed == 8);
    // A dt_rank given as a number; a word other than "auto" is refused naming the key.
    json numbered = jamba_config();
    numbered["mamba_dt_rank"] = 7;
    CHECK(cli::parse_hf_config(numbered.dump(), "j.json", "j").architecture.ssm.dt_rank == 7);
    numbered["mamba_dt_rank"] = "wide";
    CHECK_THROWS_WITH(cli::parse_hf_config(numbered.dump(), "j.json", "j"),
                      Catch::Contains("mamba_dt_rank"));
    // One expert: no layer routes, so every Mamba layer is one kind.
    json dense = jamba_config();
    dense["num_experts"] = 1;
    CHECK(cli::parse_hf_config(dense.dump(), "j.json", "j").architecture.kind_count() == 2);
}

TEST_CASE("a Mamba mixer without its widths is refused", "[ssm][model]") {
    Architecture m = mamba_model(mamba_tiny);
    m.ssm.d_state = 0;
    CHECK_THROWS_WITH(validate(m), Catch::Contains("mamba_state must be a positive integer"));
}

TEST_CASE("the slow path's saved tensors in closed form, as measured on CPU",
          "[ssm][activations]") {
    // validation/results/cpu-mamba.json: mamba-tiny's layer keeps, less the documented mean()
    // effect, 638,592 bytes at s 16, b 2 and 1,271,552 at s 32, b 2 (bf16, eager, CPU).
    const Architecture m = mamba_model(mamba_tiny);
    const auto kept = [&](std::uint64_t s, std::uint64_t b) {
        return architecture_layer(m, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu)
            .total()
            .value();
    };
    CHECK(kept(16, 2) == 638592);
    CHECK(kept(32, 2) == 1271552);
    // The mixer's rows alone, written out: d = 2 bytes, x_proj's output of r + 2N = 20.
    const auto mixer = [&](std::uint64_t s, std::uint64_t b) {
        const std::uint64_t T = s * b, di = 128, N = 8, r = 4, K = 4;
        return 2 * T * 64  // in_proj's input (the norm's output)
               + 2 * T * 2 * di +
               2 * (s + K - 1) * b * di  // in_proj's output, the padded conv output
               + 2 * T * di              // u
               + (4 * T * r + 4 * T + 2 * T * r) +
               2 * (4 * T * N + 4 * T + 2 * T * N)  // the three norms
               + 2 * T * r + 2 * T * N              // dt_proj's input, C
               + 2 * 2 * T * di                     // softplus's input and output
               + 2 * 4 * di * N                     // exp's output and A
               + 4 * T * di * N + 4 * T * N + 4 * T * di * N + 4 * T * di  // dA, B fp32, dB, u fp32
               + 2 * b * di * N + 4 * (s - 1) * b * di * N + 2 * T * di * N  // the states
               + 3 * 2 * T * di;  // y + u D, SiLU(z), out_proj's input
    };
    Architecture dense = m;
    dense.mixer = Mixer::attention;
    const std::uint64_t s = 24, b = 3;
    const auto attention_layer =
        architecture_layer(dense, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu);
    const auto mamba_layer =
        architecture_layer(m, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu);
    // The rows after the mixer (the MLP half, the residual) are the same in both layers.
    Count after_attention, after_mamba;
    for (std::size_t i = attention_layer.first_mlp_half_row(); i < attention_layer.rows.size(); ++i)
        after_attention += attention_layer.rows[i].bytes;
    for (std::size_t i = mamba_layer.first_mlp_half_row(); i < mamba_layer.rows.size(); ++i)
        after_mamba += mamba_layer.rows[i].bytes;
    CHECK(after_mamba == after_attention);
    Count before;
    for (std::size_t i = 0; i < mamba_layer.first_mlp_half_row(); ++i)
        before += mamba_layer.rows[i].bytes;
    // The attention norm's rows (fp32 input, 1/rms, normalised input) precede in_proj's input.
    CHECK(before.value() == 4 * s * b * 64 + 4 * s * b + 2 * s * b * 64 + mixer(s, b));
}

TEST_CASE("the fused kernels keep far less than the slow path, and a state per 2048-token chunk",
          "[ssm][activations]") {
    Architecture slow = mamba_model(mamba_tiny), fused = slow;
    fused.ssm.kernels = true;
    const auto kept = [](const Architecture& m, std::uint64_t s) {
        return architecture_layer(m, s, 1, Precision(DType::bf16), Attention::flash)
            .total()
            .value();
    };
    CHECK(kept(fused, 512) < kept(slow, 512));
    // One more token past a chunk adds its tokens' rows and a whole chunk state (fp32, b d_i 2N).
    const std::uint64_t step = kept(fused, 2049) - kept(fused, 2048),
                        next = kept(fused, 2050) - kept(fused, 2049);
    CHECK(step - next == 4 * 128 * 2 * 8);
    // Korthikanti's formula counts the same chunk states in its Mamba layer.
    const auto formula = [&](std::uint64_t s) {
        return korthikanti_mamba_layer(fused, s, 1, 2).total().value();
    };
    CHECK((formula(2049) - formula(2048)) - (formula(2050) - formula(2049)) == 4 * 128 * 2 * 8);
    CHECK(formula(512) != korthikanti_layer(fused, 512, 1, 2).total().value());
}

TEST_CASE("autocast and fine-tuning of Mamba layers are refused, not guessed",
          "[ssm][activations]") {
    const Architecture m = mamba_model(mamba_tiny);
    CHECK_THROWS_WITH(
        architecture_layer(m, 16, 1, Precision(DType::bf16, DType::fp32, true), Attention::eager),
        Catch::Contains("autocast"));
}

TEST_CASE("serving: Mamba layers keep a state per sequence, no KV cache", "[ssm][serve]") {
    const Architecture m = cli::parse_hf_config(jamba_config().dump(), "j.json", "j").architecture;
    ServeSettings s;
    s.context = 4096, s.batch = 3;
    const ServeReport short_context = serve(m, s);
    s.context = 65536;
    const ServeReport long_context = serve(m, s);
    CHECK(short_context.state_layers == 14);
    CHECK(short_context.cache_layers == 2);
    // 14 layers x d_i 128 x (4 conv taps bf16 + 8 states fp32), whatever the context.
    CHECK(short_context.state_bytes_per_sequence.value() == 14 * 128 * (4 * 2 + 8 * 4));
    CHECK(short_context.ssm_state == long_context.ssm_state);
    CHECK(short_context.ssm_state.value() == 3 * 14 * 128 * 40);
    // The KV cache: k and v of 2 heads of 16 over the 2 attention layers only.
    CHECK(short_context.kv_bytes_per_token.value() == 2 * 2 * 2 * 16 * 2);
    CHECK(long_context.peak() == long_context.weights + long_context.kv_cache +
                                     long_context.ssm_state + long_context.activations);
    s.tp = 2;
    CHECK(serve(m, s).state_bytes_per_sequence.value() == 14 * 64 * 40);
    Architecture odd = m;
    odd.ssm.d_inner = 130;
    s.tp = 4;
    CHECK_THROWS_WITH(serve(odd, s), Catch::Contains("inner channels"));
}

TEST_CASE("a Mamba layer's FLOPs are its four matrices", "[ssm][flops]") {
    const Architecture m = mamba_model(mamba_tiny);
    const ComputeCost c = compute_cost(m, 16, 1, Recompute::none);
    const double T = 16, di = 128, h = 64, r = 4, N = 8;
    CHECK(c.layer_forward() == Approx(2 * T * di * (3 * h + r + 2 * N + r) + 2 * T * h * 176 * 3));
}
