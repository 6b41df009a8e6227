// Phi-3.5-MoE's training-path router (transformers' sparsemixer in modeling_phimoe.py) and its
// input jitter, as rows beside Mixtral's experts. Measured by validation/reference_trainer.py
// (models/phimoe-tiny.json, results/cpu-phimoe.json).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "memcalc/architecture_activations.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
Architecture phimoe_shape(std::uint64_t h, std::uint64_t E) {
    Architecture m;
    m.name = "phimoe-shape", m.hidden = h, m.layers = 2, m.heads = 8, m.kv_heads = 2, m.ffn = 2 * h,
    m.vocab = 1000;
    m.norm = Norm::layernorm, m.bias = Bias::attention, m.experts = E, m.experts_per_token = 2;
    m.renormalize_topk = false;
    return m;
}
std::uint64_t layer_kept(const Architecture& m, std::uint64_t s, std::uint64_t b,
                         Recompute mode = Recompute::none) {
    return architecture_layer(m, s, b, DType::bf16, Attention::eager).kept(mode).value();
}
}  // namespace

TEST_CASE("the sparsemixer keeps two masks, two softmaxes, two indices and two gathered weights",
          "[phimoe][architecture]") {
    const std::uint64_t h = GENERATE(64, 4096), E = GENERATE(4, 16);
    const std::uint64_t s = GENERATE(16, 4096), b = GENERATE(1, 2);
    CAPTURE(h, E, s, b);
    const Architecture top2 = phimoe_shape(h, E);
    Architecture mixer = top2;
    mixer.router = Router::sparsemixer;
    const std::uint64_t T = s * b;
    // Per pass: a bool mask and a bf16 softmax over E, an int64 index, a bf16 weight; against
    // Mixtral's fp32 softmax over E and its int64 top-2 indices.
    const std::uint64_t sparse = 2 * (T * E + 2 * T * E + 8 * T + 2 * T),
                        softmax_topk = 4 * T * E + 8 * T * 2;
    for (Recompute mode : {Recompute::none, Recompute::selective})
        CHECK(layer_kept(mixer, s, b, mode) + softmax_topk ==
              layer_kept(top2, s, b, mode) + sparse);
    CHECK(layer_kept(mixer, s, b, Recompute::full) == layer_kept(top2, s, b, Recompute::full));
    // The input's jitter keeps its noise, the width of the stream.
    Architecture jittered = mixer;
    jittered.input_jitter = 0.01;
    CHECK(layer_kept(jittered, s, b) - layer_kept(mixer, s, b) == 2 * T * h);
}

TEST_CASE("Phi-3.5-MoE's config imports the sparsemixer and its input jitter",
          "[phimoe][hf_config]") {
    json phi = {
        {"model_type", "phimoe"},     {"hidden_size", 4096},       {"intermediate_size", 6400},
        {"num_hidden_layers", 32},    {"num_attention_heads", 32}, {"num_key_value_heads", 8},
        {"vocab_size", 32064},        {"num_local_experts", 16},   {"num_experts_per_tok", 2},
        {"attention_bias", true},     {"lm_head_bias", true},      {"input_jitter_noise", 0.01},
        {"router_jitter_noise", 0.01}};
    const Architecture m = cli::parse_hf_config(phi.dump(), "phi.json", "phi").architecture;
    CHECK(m.router == Router::sparsemixer);
    CHECK(m.input_jitter == 0.01);
    CHECK_FALSE(m.renormalize_topk);
    phi.erase("input_jitter_noise");  // PhimoeConfig's default: none
    CHECK(cli::parse_hf_config(phi.dump(), "phi.json", "phi").architecture.input_jitter == 0);
    phi["num_experts_per_tok"] = 3;
    CHECK_THROWS_WITH(cli::parse_hf_config(phi.dump(), "phi.json", "phi"),
                      Catch::Contains("sparsemixer picks 2 experts"));
    phi["num_experts_per_tok"] = 2, phi["input_jitter_noise"] = 1.5;
    CHECK_THROWS_WITH(cli::parse_hf_config(phi.dump(), "phi.json", "phi"),
                      Catch::Contains("input_jitter_noise"));
}
