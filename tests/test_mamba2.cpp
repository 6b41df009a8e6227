// Mamba-2 mixers (Granite 4.0 H, model_type granitemoehybrid): parameters tensor by tensor as
// transformers' GraniteMoeHybridMambaLayer holds them, the tensors mamba_ssm's
// mamba_split_conv1d_scan_combined saves, the state-space duality's FLOPs, serving's state per
// sequence, and the config reader.
#include <catch2/catch.hpp>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/serve.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
struct Mamba2Shape {
    std::uint64_t h, di, N, G, H, K;
    bool conv_bias, proj_bias;
};
// Granite 4.0 H's biases, and a shape with two groups and every bias.
const Mamba2Shape granite_like{64, 128, 16, 1, 8, 4, true, false};
const Mamba2Shape two_groups{48, 96, 8, 2, 6, 3, false, true};

Architecture mamba2_model(const Mamba2Shape& x) {
    Architecture m;
    m.name = "mamba2", m.hidden = x.h, m.layers = 2, m.heads = 4, m.ffn = 176, m.vocab = 128,
    m.max_positions = 64;
    m.position = Position::none, m.mixer = Mixer::mamba2;
    m.ssm.d_inner = x.di, m.ssm.d_state = x.N, m.ssm.d_conv = x.K, m.ssm.groups = x.G,
    m.ssm.heads = x.H, m.ssm.chunk = 256;
    m.ssm.conv_bias = x.conv_bias, m.ssm.proj_bias = x.proj_bias;
    return m;
}

/// One Mamba-2 mixer's parameters, written out from GraniteMoeHybridMambaLayer.__init__.
std::uint64_t mamba2_parameters(const Mamba2Shape& x) {
    const std::uint64_t conv = x.di + 2 * x.G * x.N, in = x.di + conv + x.H;
    return x.h * in + (x.proj_bias ? in : 0)        // in_proj: z, x, B, C, dt
           + conv * x.K + (x.conv_bias ? conv : 0)  // conv1d (depthwise)
           + 3 * x.H                                // dt_bias, A_log, D
           + x.di                                   // the gated RMSNorm's weight
           + x.di * x.h + (x.proj_bias ? x.h : 0);  // out_proj
}

const std::string granite_configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";

json granite_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

Architecture granite_import(const json& config) {
    return cli::parse_hf_config(config.dump(), "g.json", "g").architecture;
}
}  // namespace

TEST_CASE("a Mamba-2 mixer's parameters, tensor by tensor", "[ssm][mamba2][params]") {
    const Mamba2Shape x = GENERATE(granite_like, two_groups);
    CAPTURE(x.h);
    const ParameterTable t = parameter_table(mamba2_model(x));
    const std::uint64_t layer = mamba2_parameters(x) + 2 * x.h + 3 * x.h * 176;
    CHECK(t.per_layer().value() == layer);
    CHECK(t.total().value() == 2 * layer + 2 * 128 * x.h + x.h);
    // granite_like by hand: in_proj 64 x 296, conv 160 x 5, 24, 128, out_proj 128 x 64.
    if (x.h == 64) CHECK(mamba2_parameters(x) == 18944 + 800 + 24 + 128 + 8192);
}

TEST_CASE("a Mamba-2 layer keeps in_proj's input and output, out_x and rstd",
          "[ssm][mamba2][activations]") {
    const Architecture m = mamba2_model(granite_like);
    const auto layer = [&](std::uint64_t s, std::uint64_t b) {
        return architecture_layer(m, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu);
    };
    const std::uint64_t s = 24, b = 3, T = s * b;
    const LayerActivations mamba = layer(s, b);
    Count before;
    for (std::size_t i = 0; i < mamba.first_mlp_half_row(); ++i) before += mamba.rows[i].bytes;
    // The norm's rows (fp32 input, 1/rms, normalised input), then: in_proj's input (bf16),
    // zxbcdt (2 x 128 + 2 x 16 + 8 = 296 wide), exp's output and A (8 fp32 each), out_x (128),
    // rstd (one fp32 per token and group).
    const std::uint64_t norm = 4 * T * 64 + 4 * T + 2 * T * 64;
    const std::uint64_t mixer = 2 * T * 64 + 2 * T * 296 + 2 * 4 * 8 + 2 * T * 128 + 4 * T;
    CHECK(before.value() == norm + mixer);
    // The rows after the mixer are an attention layer's.
    Architecture dense = m;
    dense.mixer = Mixer::attention;
    const LayerActivations attention =
        architecture_layer(dense, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu);
    Count after_attention, after_mamba;
    for (std::size_t i = attention.first_mlp_half_row(); i < attention.rows.size(); ++i)
        after_attention += attention.rows[i].bytes;
    for (std::size_t i = mamba.first_mlp_half_row(); i < mamba.rows.size(); ++i)
        after_mamba += mamba.rows[i].bytes;
    CHECK(after_mamba == after_attention);
    // Linear in the tokens: no per-step state, no chunk state kept.
    const auto kept = [&](std::uint64_t tokens) { return layer(tokens, 1).total().value(); };
    CHECK(kept(4096) - kept(2048) == 2 * (kept(2048) - kept(1024)));
}

TEST_CASE("a Mamba-2 layer's fused function: its forward and backward temporaries by hand",
          "[ssm][mamba2][activations]") {
    const Architecture m = mamba2_model(granite_like);
    const std::uint64_t s = 300, b = 2, T = s * b, c = 2, Q = 256;  // two chunks, the last part
    const LayerActivations layer =
        architecture_layer(m, s, b, Precision(DType::bf16), Attention::flash);
    const auto find = [&](bool backward) -> const Workspace& {
        for (const Workspace& w : layer.work)
            if (w.backward == backward && w.op.find("mamba_split_conv1d") == 0) return w;
        FAIL("no workspace");
        return layer.work.front();
    };
    // Forward: conv output (160 wide), states (fp32 and bf16), dt and its cumsum (8 heads, fp32),
    // C B^T (fp32), the gated norm's output (128).
    const std::uint64_t states = b * c * 128 * 16, cumsums = b * 8 * c * Q * 8;
    const std::uint64_t cb = b * c * 1 * Q * Q * 4;
    CHECK(find(false).bytes.value() == 2 * T * 160 + states * 6 + cumsums + cb + 2 * T * 128);
    // Backward: conv output and its gradient, zxbcdt's gradient (296), the norm's output and the
    // output's gradient, states and their gradients (fp32), C B^T and its gradient.
    const Workspace& backward = find(true);
    CHECK(backward.bytes.value() ==
          2 * T * (2 * 160 + 296 + 2 * 128) + states * 8 + cumsums + 2 * cb);
    CHECK(backward.linear == Linear::mamba_out);
}

TEST_CASE("Mamba-2 without the kernels, under autocast or the formula model is refused",
          "[ssm][mamba2][activations]") {
    Architecture slow = mamba2_model(granite_like);
    slow.ssm.kernels = false;
    CHECK_THROWS_WITH(validate(slow), Catch::Contains("mamba_split_conv1d_scan_combined"));
    const Architecture m = mamba2_model(granite_like);
    CHECK_THROWS_WITH(
        architecture_layer(m, 16, 1, Precision(DType::bf16, DType::fp32, true), Attention::flash),
        Catch::Contains("autocast"));
}

TEST_CASE("a Mamba-2 mixer without its widths is refused, naming the field",
          "[ssm][mamba2][model]") {
    using Field = std::uint64_t StateSpace::*;
    const auto [field, name] = GENERATE(table<Field, std::string>({
        {&StateSpace::d_inner, "mamba_inner"},
        {&StateSpace::d_state, "mamba_state"},
        {&StateSpace::d_conv, "mamba_conv"},
        {&StateSpace::heads, "mamba_heads"},
        {&StateSpace::groups, "mamba_groups"},
        {&StateSpace::chunk, "mamba_chunk"},
    }));
    CAPTURE(name);
    Architecture m = mamba2_model(granite_like);
    m.ssm.*field = 0;
    CHECK_THROWS_WITH(validate(m), Catch::Contains(name + " must be a positive integer"));
    Architecture uneven = mamba2_model(granite_like);
    uneven.ssm.heads = 7;
    CHECK_THROWS_WITH(validate(uneven), Catch::Contains("mamba_heads (7) must divide"));
    uneven.ssm.heads = 8, uneven.ssm.groups = 3;
    CHECK_THROWS_WITH(validate(uneven), Catch::Contains("mamba_groups (3) must divide"));
}

TEST_CASE("a Mamba-2 layer's FLOPs: its projections and the chunked scan", "[ssm][mamba2][flops]") {
    const Architecture m = mamba2_model(granite_like);
    const auto forward = [&](std::uint64_t s) {
        return compute_cost(m, s, 1, Recompute::none).layer_forward();
    };
    const double h = 64, di = 128, N = 16, G = 1, mlp = 2 * h * 176 * 3;
    // Shorter than a chunk: the chunk is the sequence.
    const double T = 16;
    CHECK(forward(16) == Approx(2 * T * h * 296 + 2 * T * di * h + 2 * T * 16 * (di + G * N) +
                                4 * T * N * di + T * mlp));
    // Longer: chunks of 256, so linear in s.
    CHECK(forward(4096) == Approx(2 * forward(2048)));
}

TEST_CASE("serving: a Mamba-2 layer keeps its convolution over x, B and C and a state",
          "[ssm][mamba2][serve]") {
    const Architecture m = mamba2_model(granite_like);
    ServeSettings s;
    s.context = 4096, s.batch = 2;
    const ServeReport r = serve(m, s);
    CHECK(r.state_layers == 2);
    CHECK(r.cache_layers == 0);
    // conv_states: (128 + 2 x 16) channels x 4 taps, bf16; ssm_states: 8 heads x 16 x 16, fp32.
    CHECK(r.state_bytes_per_sequence.value() == 2 * (160 * 4 * 2 + 128 * 16 * 4));
}

TEST_CASE("granitemoehybrid's configs: Mamba-2 and attention layers, experts and a shared MLP",
          "[ssm][mamba2][hf_config]") {
    const Architecture tiny =
        cli::load_hf_config(granite_configs + "granite-4.0-h-tiny.json").architecture;
    REQUIRE(tiny.kind_count() == 2);
    CHECK(tiny.ssm.d_inner == 3072);
    CHECK(tiny.ssm.heads == 48);
    CHECK(tiny.ssm.groups == 1);
    CHECK(tiny.ssm.chunk == 256);
    CHECK(tiny.ssm.kernels);
    CHECK(tiny.experts == 64);
    CHECK(tiny.ffn == 512);
    CHECK(tiny.shared_ffn == 1024);
    CHECK_FALSE(tiny.shared_expert_gate);
    CHECK(tiny.position == Position::none);  // position_embedding_type nope
    CHECK(tiny.tied_embeddings);
    const LayerPattern pattern(tiny);
    for (std::uint64_t layer = 1; layer <= tiny.layers; ++layer) {
        CAPTURE(layer);
        const bool attention = (layer - 1) % 10 == 5;
        CHECK((tiny.kind_view(pattern.kind_of(layer)).mixer == Mixer::attention) == attention);
    }
    // No experts: the shared MLP is the layer's MLP.
    const Architecture micro =
        cli::load_hf_config(granite_configs + "granite-4.0-h-micro.json").architecture;
    CHECK_FALSE(micro.any_moe());
    CHECK(micro.ffn == 8192);
    CHECK(micro.shared_ffn == 0);
    const Architecture small =
        cli::load_hf_config(granite_configs + "granite-4.0-h-small.json").architecture;
    CHECK(small.experts == 72);
    CHECK(small.experts_per_token == 10);
    CHECK(small.shared_ffn == 1536);
    // Every layer Mamba-2 without layer_types; rope turns rotary on.
    json plain = granite_json(granite_configs + "granite-4.0-h-micro.json");
    plain.erase("layer_types");
    plain["position_embedding_type"] = "rope";
    const Architecture all_mamba = granite_import(plain);
    CHECK(all_mamba.kind_count() == 1);
    CHECK(all_mamba.mixer == Mixer::mamba2);
    CHECK(all_mamba.position == Position::rotary);
    // "auto" head width.
    plain["mamba_d_head"] = "auto";
    CHECK(granite_import(plain).ssm.heads == 64);
}

TEST_CASE("granitemoehybrid's bad values are refused naming the key", "[ssm][mamba2][hf_config]") {
    const json good = granite_json(granite_configs + "granite-4.0-h-tiny.json");
    const auto [key, value, message] = GENERATE(table<std::string, json, std::string>({
        {"mamba_n_heads", 0, "mamba_n_heads must be a positive integer"},
        {"mamba_d_state", 0, "mamba_d_state must be a positive integer"},
        {"mamba_d_conv", 0, "mamba_d_conv must be a positive integer"},
        {"mamba_n_groups", 0, "mamba_n_groups must be a positive integer"},
        {"mamba_chunk_size", 0, "mamba_chunk_size must be a positive integer"},
        {"mamba_expand", 0, "mamba_expand must be a positive integer"},
        {"mamba_n_heads", 50, "mamba_n_heads (50) must divide"},
        {"mamba_d_head", 32, "mamba_d_head (32) x mamba_n_heads (48)"},
        {"mamba_d_head", "wide", "mamba_d_head must be a positive integer or \"auto\""},
        {"mamba_n_groups", 5, "mamba_groups (5) must divide mamba_heads (48)"},
        {"shared_intermediate_size", 0, "shared_intermediate_size must be a positive integer"},
        {"position_embedding_type", "alibi", "position_embedding_type 'alibi'"},
        {"layer_types", json::array({"mamba"}), "layer_types has 1 entries"},
    }));
    CAPTURE(key);
    json bad = good;
    bad[key] = value;
    CHECK_THROWS_WITH(granite_import(bad), Catch::Contains(message));
    json missing = good;
    missing.erase("hidden_size");
    CHECK_THROWS_WITH(granite_import(missing), Catch::Contains("hidden_size"));
}
