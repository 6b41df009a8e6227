// Falcon-H1 (model_type falcon_h1): in every layer attention and a Mamba-2 mixer side by side on
// one RMSNorm's output (transformers' FalconH1DecoderLayer, modeling_falcon_h1.py): parameters
// tensor by tensor, the rows each branch keeps and what the layer's code holds beside them, the
// FLOPs and serving state of both, and the config reader.
#include <catch2/catch.hpp>

#include <algorithm>
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
struct FalconShape {
    std::uint64_t h, layers, heads, kv, head_dim, ffn, vocab, d_ssm, ssm_heads, N, G;
    bool rms_norm, tied;
};

/// FalconH1ForCausalLM's parameters, written out from modeling_falcon_h1.py (v4.53.0):
/// FalconH1Attention's q/k/v/o at head_dim, FalconH1Mixer's in_proj (z, x, B, C, dt), depthwise
/// conv1d with its bias, dt_bias, A_log, D, the gated norm where mamba_rms_norm and out_proj;
/// FalconH1MLP's gate, up and down; two RMSNorms a layer; the embedding, final norm and lm_head.
std::uint64_t falcon_parameters(const FalconShape& x) {
    const std::uint64_t attention = 2 * x.h * x.heads * x.head_dim + 2 * x.h * x.kv * x.head_dim;
    const std::uint64_t conv = x.d_ssm + 2 * x.G * x.N, in = x.d_ssm + conv + x.ssm_heads;
    const std::uint64_t mixer =
        x.h * in + conv * 4 + conv + 3 * x.ssm_heads + (x.rms_norm ? x.d_ssm : 0) + x.d_ssm * x.h;
    const std::uint64_t layer = attention + mixer + 3 * x.h * x.ffn + 2 * x.h;
    return x.layers * layer + x.vocab * x.h * (x.tied ? 1 : 2) + x.h;
}

json falcon_config(const FalconShape& x) {
    return {{"model_type", "falcon_h1"},
            {"hidden_size", x.h},
            {"num_hidden_layers", x.layers},
            {"num_attention_heads", x.heads},
            {"num_key_value_heads", x.kv},
            {"head_dim", x.head_dim},
            {"intermediate_size", x.ffn},
            {"vocab_size", x.vocab},
            {"mamba_d_ssm", x.d_ssm},
            {"mamba_n_heads", x.ssm_heads},
            {"mamba_d_head", x.d_ssm / x.ssm_heads},
            {"mamba_d_state", x.N},
            {"mamba_n_groups", x.G},
            {"mamba_chunk_size", 128},
            {"mamba_rms_norm", x.rms_norm},
            {"tie_word_embeddings", x.tied},
            {"max_position_embeddings", 131072}};
}

Architecture falcon_import(const json& config) {
    return cli::parse_hf_config(config.dump(), "f.json", "f").architecture;
}

// A small layer: head_dim unlike hidden / heads, as every released size's.
const FalconShape small{64, 2, 4, 2, 32, 96, 128, 128, 8, 16, 1, true, false};

Architecture small_model(bool gated_norm = true) {
    FalconShape x = small;
    x.rms_norm = gated_norm;
    return falcon_import(falcon_config(x));
}

/// The same layer with attention alone, or the Mamba-2 mixer alone (Granite 4.0 H's layer).
Architecture with_mixer(Architecture m, Mixer mixer) {
    m.mixer = mixer;
    return m;
}

LayerActivations layer_of(const Architecture& m, std::uint64_t s, std::uint64_t b) {
    return architecture_layer(m, s, b, Precision(DType::bf16), Attention::eager, Platform::cpu);
}

/// The caller's tensors alive beside the first workspace (in forward, or in backward) whose op
/// begins with `op`.
Count held_beside(const LayerActivations& layer, const std::string& op, bool backward = false) {
    for (std::size_t i = 0; i < layer.work.size(); ++i)
        if (layer.work[i].backward == backward && std::string(layer.work[i].op).rfind(op, 0) == 0)
            return layer.beside_bytes(i, Recompute::none, Holder::caller);
    FAIL("no workspace " << op);
    return Count(0);
}
/// The first core-attention op with a workspace, in forward or in backward.
std::string core_attention_op(const LayerActivations& layer, bool backward) {
    for (const Workspace& w : layer.work)
        if (w.backward == backward && w.module == Module::core_attn) return std::string(w.op);
    FAIL("no core attention workspace");
    return "";
}
}  // namespace

TEST_CASE("falcon_h1's parameters: attention, a Mamba-2 mixer and an MLP in every layer",
          "[falcon_h1][params]") {
    // Each released size's shape as its config.json gives it (third-party copies; 7B's count has
    // no published figure to compare), with the figure published rounded where one is.
    const auto [x, rounded, unit] = GENERATE(table<FalconShape, std::uint64_t, std::uint64_t>({
        {{1024, 36, 8, 2, 64, 2048, 32784, 1536, 24, 128, 1, false, false}, 521, 1'000'000},
        {{2048, 24, 8, 2, 128, 4608, 65537, 3072, 48, 256, 1, true, false}, 16, 100'000'000},
        {{2560, 32, 10, 2, 128, 6144, 65536, 4096, 32, 256, 1, true, false}, 31, 100'000'000},
        {{3072, 44, 12, 2, 128, 12288, 130048, 3072, 24, 256, 1, true, false}, 76, 100'000'000},
        {{512, 24, 8, 2, 64, 768, 32768, 768, 24, 64, 1, false, true}, 91, 1'000'000},
    }));
    CAPTURE(x.h, x.layers);
    const Architecture m = falcon_import(falcon_config(x));
    CHECK(m.mixer == Mixer::attention_mamba2);
    const std::uint64_t count = parameter_table(m).total().value();
    CHECK(count == falcon_parameters(x));
    CHECK((count + unit / 2) / unit == rounded);
}

TEST_CASE("falcon_h1's config: the 0.5B file, its mixer's widths and the refusals",
          "[falcon_h1][hf_config]") {
    const cli::ModelFile file = cli::load_hf_config(std::string(MEMCALC_SOURCE_DIR) +
                                                    "/tests/configs/falcon-h1-0.5b-instruct.json");
    const Architecture& m = file.architecture;
    CHECK(m.mixer == Mixer::attention_mamba2);
    CHECK(m.head_size() == 64);
    CHECK(m.key_value_heads() == 2);
    CHECK(m.ssm.d_inner == 1536);
    CHECK(m.ssm.heads == 24);
    CHECK(m.ssm.d_state == 128);
    CHECK(m.ssm.chunk == 128);
    CHECK_FALSE(m.ssm.gated_norm);  // mamba_rms_norm false: 0.5B alone has no gated norm
    CHECK_FALSE(m.tied_embeddings);
    CHECK(parameter_table(m).total().value() == 521'411'104);
    CHECK_THAT(file.description, Catch::Contains("mamba_split_conv1d_scan_combined"));
    json config = falcon_config(small);
    config["projectors_bias"] = true;
    CHECK_THROWS_WITH(falcon_import(config),
                      Catch::Contains("projectors_bias differs from mamba_proj_bias"));
    config = falcon_config(small);
    config["mamba_d_head"] = 32;
    CHECK_THROWS_WITH(falcon_import(config),
                      Catch::Contains("mamba_d_head (32) x mamba_n_heads (8) must be mamba_d_ssm "
                                      "(128)"));
    config = falcon_config(small);
    config.erase("mamba_d_ssm");  // null or absent: mamba_expand x hidden_size
    CHECK(falcon_import(config).ssm.d_inner == 128);
}

TEST_CASE("a Falcon-H1 layer keeps attention's rows and the Mamba-2 mixer's, each on its own copy",
          "[falcon_h1][activations]") {
    const bool gated_norm = GENERATE(true, false);
    const Architecture m = small_model(gated_norm);
    const std::uint64_t s = 40, b = 3, T = s * b;
    const LayerActivations falcon = layer_of(m, s, b);
    const LayerActivations attention = layer_of(with_mixer(m, Mixer::attention), s, b);
    // The mixer's rows beyond attention's: in_proj's input (a copy, bf16), zxbcdt (2 x 128 + 2 x
    // 16 + 8 = 296 wide), exp's output and A (8 fp32 each), out_x (128), rstd with the norm.
    const std::uint64_t mixer = 2 * T * 64 + 2 * T * 296 + 2 * 4 * 8 + 2 * T * 128;
    CHECK(falcon.total().value() == attention.total().value() + mixer + (gated_norm ? 4 * T : 0));
    // Neither branch's input is the norm's output, which no row keeps.
    for (const SavedTensor& row : falcon.rows) {
        CAPTURE(row.op, row.tensor);
        if (row.op == "q/k/v projections" || row.op == "in_proj") CHECK_FALSE(row.norm_output);
    }
    // Affine in the tokens (A and exp's output are a head's each), as each branch is.
    const auto kept = [&](std::uint64_t tokens) { return layer_of(m, tokens, 1).total().value(); };
    const auto attention_kept = [&](std::uint64_t tokens) {
        return layer_of(with_mixer(m, Mixer::attention), tokens, 1).total().value();
    };
    const auto mixer_kept = [&](std::uint64_t tokens) {
        return kept(tokens) - attention_kept(tokens);
    };
    CHECK(mixer_kept(512) - mixer_kept(256) == 2 * (mixer_kept(256) - mixer_kept(128)));
    CHECK(mixer_kept(512) - mixer_kept(256) > 0);
}

TEST_CASE("a Falcon-H1 layer holds the norm's output through both branches, and the mixer's",
          "[falcon_h1][activations]") {
    const Architecture m = small_model();
    const std::uint64_t s = 40, b = 3, sbh_bytes = s * b * 64 * 2;
    const LayerActivations falcon = layer_of(m, s, b);
    const LayerActivations attention = layer_of(with_mixer(m, Mixer::attention), s, b);
    const LayerActivations mamba2 = layer_of(with_mixer(m, Mixer::mamba2), s, b);
    // During the fused Mamba-2 function: the norm's output beside what the mixer alone has.
    CHECK(held_beside(falcon, "mamba_split_conv1d_scan_combined").value() ==
          held_beside(mamba2, "mamba_split_conv1d_scan_combined").value() + sbh_bytes);
    // During attention's softmax: the norm's output and the mixer's scaled output as well.
    const std::string softmax = core_attention_op(attention, false);
    CHECK(held_beside(falcon, softmax).value() ==
          held_beside(attention, softmax).value() + 2 * sbh_bytes);
    // In backward, attention's branch first: the sum's gradient held through it, then the norm
    // output's gradient from attention through the mixer's.
    const std::string mixer_backward = "mamba_split_conv1d_scan_combined backward";
    CHECK(held_beside(falcon, mixer_backward, true).value() ==
          held_beside(mamba2, mixer_backward, true).value() + sbh_bytes);
    const std::string attention_backward = core_attention_op(attention, true);
    CHECK(held_beside(falcon, attention_backward, true).value() ==
          held_beside(attention, attention_backward, true).value() + sbh_bytes);
    // in_proj's output and its product with the mup_vector side by side (296 wide, bf16).
    CHECK(std::any_of(falcon.work.begin(), falcon.work.end(), [&](const Workspace& w) {
        return w.op == "in_proj(x) * mup_vector" && w.bytes.value() == 2 * s * b * 296 * 2;
    }));
}

TEST_CASE("a Falcon-H1 layer's FLOPs are attention's and the Mamba-2 mixer's",
          "[falcon_h1][flops]") {
    const Architecture m = small_model();
    const std::uint64_t s = GENERATE(16, 4096);
    const auto forward = [&](const Architecture& v) {
        return compute_cost(v, s, 2, Recompute::none).layer_forward();
    };
    const double mlp = 2.0 * static_cast<double>(s * 2) * 64 * 96 * 3;
    CHECK(forward(m) == Approx(forward(with_mixer(m, Mixer::attention)) +
                               forward(with_mixer(m, Mixer::mamba2)) - mlp));
}

TEST_CASE("serving Falcon-H1: every layer caches k and v and keeps a Mamba-2 state",
          "[falcon_h1][serve]") {
    const Architecture m = small_model();
    ServeSettings s;
    s.context = 4096, s.batch = 2;
    const ServeReport r = serve(m, s);
    const ServeReport attention = serve(with_mixer(m, Mixer::attention), s);
    const ServeReport mamba2 = serve(with_mixer(m, Mixer::mamba2), s);
    CHECK(r.cache_layers == 2);
    CHECK(r.state_layers == 2);
    CHECK(r.kv_bytes_per_token == attention.kv_bytes_per_token);
    CHECK(r.state_bytes_per_sequence == mamba2.state_bytes_per_sequence);
    // conv_states: (128 + 2 x 16) channels x 4 taps, bf16; ssm_states: 128 x 16, fp32.
    CHECK(r.state_bytes_per_sequence.value() == 2 * (160 * 4 * 2 + 128 * 16 * 4));
}

TEST_CASE("a Falcon-H1 training step: estimated in bf16, refused under autocast and the formula",
          "[falcon_h1][estimate]") {
    const Architecture m = small_model();
    Settings settings;
    settings.seq = 64, settings.activations = ActivationModel::architecture;
    const Report r = estimate(m, settings);
    // Its weights, gradients and Adam's state beneath the peak, the mixer's rows above them.
    CHECK(r.busiest().peak_step().bytes.total().value() >
          r.busiest().state.total().value() + r.layer.total().value());
    settings.recipe = builtin_recipe("amp-adam");
    CHECK_THROWS_WITH(estimate(m, settings), Catch::Contains("autocast"));
    settings.recipe = builtin_recipe("mixed-adam");
    settings.activations = ActivationModel::korthikanti;
    CHECK_THROWS_WITH(estimate(m, settings), Catch::Contains("Mamba-2"));
}
