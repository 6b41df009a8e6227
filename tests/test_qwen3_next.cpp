// Qwen3-Next (model_type qwen3_next): Gated DeltaNet layers beside gated full attention, parameters
// tensor by tensor as transformers' Qwen3NextGatedDeltaNet and Qwen3NextAttention hold them, what
// fla's kernels save, the FLOPs, serving's state per sequence, the config reader and the
// published totals with and without the checkpoint's mtp.* module.
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
/// d_i = H value heads x d_v; q and k G heads of N; K taps.
struct DeltaNetShape {
    std::uint64_t h, H, dv, G, N, K;
    std::uint64_t di() const { return H * dv; }
};
const DeltaNetShape qwen_like{64, 8, 16, 4, 16, 4};
const DeltaNetShape uneven{48, 6, 8, 2, 12, 3};

Architecture deltanet_model(const DeltaNetShape& x) {
    Architecture m;
    m.name = "gdn", m.hidden = x.h, m.layers = 2, m.heads = 4, m.ffn = 176, m.vocab = 128,
    m.max_positions = 64;
    m.mixer = Mixer::gated_deltanet;
    m.ssm.d_inner = x.di(), m.ssm.d_state = x.N, m.ssm.d_conv = x.K, m.ssm.groups = x.G,
    m.ssm.heads = x.H, m.ssm.chunk = 64, m.ssm.conv_bias = false;
    return m;
}

/// One Gated DeltaNet's parameters, written out from Qwen3NextGatedDeltaNet.__init__.
std::uint64_t deltanet_parameters(const DeltaNetShape& x) {
    const std::uint64_t key = x.G * x.N, conv = 2 * key + x.di();
    return x.h * (2 * key + 2 * x.di())  // in_proj_qkvz
           + x.h * 2 * x.H               // in_proj_ba
           + conv * x.K                  // conv1d, depthwise, no bias
           + 2 * x.H                     // dt_bias, A_log
           + x.dv                        // the gated RMSNorm's weight, one head's width
           + x.di() * x.h;               // out_proj
}

const std::string qwen_next_configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";

json qwen_next_json(const std::string& path) {
    std::ifstream in(path);
    return json::parse(in);
}

cli::ModelFile qwen_next_import(const json& config) {
    return cli::parse_hf_config(config.dump(), "q.json", "q");
}
}  // namespace

TEST_CASE("a Gated DeltaNet's parameters, tensor by tensor", "[qwen3_next][params]") {
    const DeltaNetShape x = GENERATE(qwen_like, uneven);
    CAPTURE(x.h);
    const ParameterTable t = parameter_table(deltanet_model(x));
    const std::uint64_t layer = deltanet_parameters(x) + 2 * x.h + 3 * x.h * 176;
    CHECK(t.per_layer().value() == layer);
    CHECK(t.total().value() == 2 * layer + 2 * 128 * x.h + x.h);
    // qwen_like by hand: qkvz 64 x 384, ba 64 x 16, conv 256 x 4, 16, 16, out_proj 128 x 64.
    if (x.h == 64) CHECK(deltanet_parameters(x) == 24576 + 1024 + 1024 + 16 + 16 + 8192);
}

TEST_CASE("gated attention's q_proj is twice as wide", "[qwen3_next][params]") {
    Architecture m = deltanet_model(qwen_like);
    m.mixer = Mixer::attention, m.qk_norm = QkNorm::per_head;
    const std::uint64_t plain = parameter_table(m).total().value();
    m.attention_output_gate = true;
    CHECK(parameter_table(m).total().value() == plain + 2 * 64 * 64);  // 2 layers, h x a*d more
}

TEST_CASE("a Gated DeltaNet layer keeps what fla's kernels save", "[qwen3_next][activations]") {
    const DeltaNetShape x = GENERATE(qwen_like, uneven);
    CAPTURE(x.h);
    const Architecture m = deltanet_model(x);
    const std::uint64_t s = 24, b = 3, T = s * b, h = x.h, H = x.H, HN = x.H * x.N, di = x.di();
    const LayerActivations layer =
        architecture_layer(m, s, b, Precision(DType::bf16), Attention::flash);
    Count before;
    for (std::size_t i = 0; i < layer.first_mlp_half_row(); ++i) before += layer.rows[i].bytes;
    const std::uint64_t norm = 4 * T * h + 4 * T + 2 * T * h;
    const std::uint64_t mixer = 2 * T * h                         // in_proj's input
                                + 2 * T * (di + 2 * x.G * x.N)    // the convolution's input
                                + 2 * 4 * T * H + 2 * 4 * H       // softplus, exp
                                + 2 * T * H                       // beta
                                + 2 * 2 * T * HN + 2 * 4 * T * H  // q, k and their 1/norms
                                + 2 * T * di + 4 * T * H          // v, g's cumsum
                                + 2 * T * H * 64                  // A
                                + 2 * 2 * T * di + 4 * T * H      // the norm's input, z, rstd
                                + 2 * T * di;                     // out_proj's input
    CHECK(before.value() == norm + mixer);
    // Linear in the tokens: the recurrent state is not kept per step.
    const auto kept = [&](std::uint64_t tokens) {
        return architecture_layer(m, tokens, 1, Precision(DType::bf16), Attention::flash)
            .total()
            .value();
    };
    CHECK(kept(4096) - kept(2048) == 2 * (kept(2048) - kept(1024)));
}

TEST_CASE("a Gated DeltaNet's kernel temporaries by hand", "[qwen3_next][activations]") {
    const DeltaNetShape x = GENERATE(qwen_like, uneven);
    const Architecture m = deltanet_model(x);
    const std::uint64_t s = 100, b = 2, T = s * b, c = 2;  // two chunks of 64, the last part
    const std::uint64_t di = x.di(), HN = x.H * x.N, states = b * c * di * x.N;
    const LayerActivations layer =
        architecture_layer(m, s, b, Precision(DType::bf16), Attention::flash);
    const auto find = [&](bool backward) -> const Workspace& {
        for (const Workspace& w : layer.work)
            if (w.backward == backward && w.op.find("chunk_gated_delta_rule") == 0) return w;
        FAIL("no workspace");
        return layer.work.front();
    };
    CHECK(find(false).bytes.value() == 2 * states + 2 * T * (2 * di + 3 * HN));
    CHECK(find(true).bytes.value() == 6 * states + 2 * T * (4 * di + 6 * HN));
    CHECK(find(true).linear == Linear::mamba_out);
}

TEST_CASE("Gated DeltaNet under autocast, the formula model or without kernels is refused",
          "[qwen3_next][activations]") {
    const Architecture m = deltanet_model(qwen_like);
    CHECK_THROWS_WITH(
        architecture_layer(m, 16, 1, Precision(DType::bf16, DType::fp32, true), Attention::flash),
        Catch::Contains("Gated DeltaNet layers under autocast"));
    Architecture slow = m;
    slow.ssm.kernels = false;
    CHECK_THROWS_WITH(validate(slow), Catch::Contains("without fla's kernels"));
}

TEST_CASE("serving: a Gated DeltaNet keeps its convolution over q, k and v and a state",
          "[qwen3_next][serve]") {
    const DeltaNetShape x = GENERATE(qwen_like, uneven);
    CAPTURE(x.h);
    ServeSettings s;
    s.context = 4096, s.batch = 2;
    const ServeReport r = serve(deltanet_model(x), s);
    CHECK(r.state_layers == 2);
    CHECK(r.cache_layers == 0);
    // conv states: (d_i + 2 G N) channels x K taps in bf16; H x N x d_v per layer in fp32.
    const std::uint64_t conv = x.di() + 2 * x.G * x.N;
    CHECK(r.state_bytes_per_sequence.value() == 2 * (conv * x.K * 2 + x.H * x.N * x.dv * 4));
}

TEST_CASE("a Gated DeltaNet's FLOPs: its projections and the chunked products",
          "[qwen3_next][flops]") {
    const Architecture m = deltanet_model(qwen_like);
    const auto forward = [&](std::uint64_t s) {
        return compute_cost(m, s, 1, Recompute::none).layer_forward();
    };
    const double h = 64, di = 128, N = 16, HN = 128, in = 2 * 64 + 2 * 128 + 16;
    const double T = 16, mlp = 2 * h * 176 * 3;  // shorter than a chunk: Q is the sequence
    CHECK(forward(16) == Approx(2 * T * h * in + 2 * T * di * h + 2 * T * 16 * (3 * HN + 2 * di) +
                                6 * T * N * di + T * mlp));
    CHECK(forward(4096) == Approx(2 * forward(2048)));
}

TEST_CASE("Qwen3-Next-80B-A3B: the published totals, without and with the mtp.* module",
          "[qwen3_next][hf_config]") {
    const cli::ModelFile file =
        cli::load_hf_config(qwen_next_configs + "qwen3-next-80b-a3b-instruct.json");
    const Architecture& m = file.architecture;
    CHECK(parameter_table(m).total().value() == 79674391296);  // Qwen3NextForCausalLM's
    Architecture with = m;
    with.mtp_layers = 1;
    CHECK(parameter_table(with).total().value() == 81324862720);  // the safetensors total
    REQUIRE(file.notes.size() == 1);
    CHECK(file.notes[0].find("1650471424") != std::string::npos);
    REQUIRE(m.kind_count() == 2);
    CHECK(m.attention_output_gate);
    CHECK(m.qk_norm == QkNorm::per_head);
    CHECK(m.ssm.d_inner == 4096);
    CHECK(m.ssm.heads == 32);
    CHECK(m.ssm.groups == 16);
    CHECK(m.ssm.d_state == 128);
    CHECK(m.experts == 512);
    CHECK(m.experts_per_token == 10);
    CHECK(m.shared_ffn == 512);
    CHECK(m.shared_expert_gate);
    CHECK(m.renormalize_topk);
    const LayerPattern pattern(m);
    for (std::uint64_t layer = 1; layer <= m.layers; ++layer) {
        CAPTURE(layer);
        CHECK((m.kind_view(pattern.kind_of(layer)).mixer == Mixer::attention) == (layer % 4 == 0));
    }
    // layer_types, where given, says the same.
    json typed = qwen_next_json(qwen_next_configs + "qwen3-next-80b-a3b-instruct.json");
    json types = json::array();
    for (int i = 0; i < 48; ++i)
        types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
    typed["layer_types"] = types;
    CHECK(parameter_table(qwen_next_import(typed).architecture).total().value() == 79674391296);
}

TEST_CASE("qwen3_next's bad values are refused naming the key", "[qwen3_next][hf_config]") {
    const json good = qwen_next_json(qwen_next_configs + "qwen3-next-80b-a3b-instruct.json");
    const auto [key, value, message] = GENERATE(table<std::string, json, std::string>({
        {"linear_num_value_heads", 0, "linear_num_value_heads must be a positive integer"},
        {"linear_num_key_heads", 0, "linear_num_key_heads must be a positive integer"},
        {"linear_key_head_dim", 0, "linear_key_head_dim must be a positive integer"},
        {"linear_value_head_dim", 0, "linear_value_head_dim must be a positive integer"},
        {"linear_conv_kernel_dim", 0, "linear_conv_kernel_dim must be a positive integer"},
        {"full_attention_interval", 0, "full_attention_interval must be a positive integer"},
        {"linear_num_key_heads", 5, "linear_num_key_heads (5) must divide"},
        {"shared_expert_intermediate_size", 0, "shared_expert_intermediate_size must be"},
        {"mlp_only_layers", json::array({1}), "mlp_only_layers"},
        {"layer_types", json::array({"full_attention"}), "layer_types has 1 entries"},
    }));
    CAPTURE(key);
    json bad = good;
    bad[key] = value;
    CHECK_THROWS_WITH(qwen_next_import(bad), Catch::Contains(message));
    json wrong = good;
    json types = json::array();
    for (int i = 0; i < 48; ++i) types.push_back("sliding_attention");
    wrong["layer_types"] = types;
    CHECK_THROWS_WITH(qwen_next_import(wrong),
                      Catch::Contains("'sliding_attention' is not linear_attention"));
}
