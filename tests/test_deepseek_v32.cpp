// DeepSeek-V3.2 (model_type deepseek_v32): DeepSeek-V3 with a lightning indexer in every layer
// (transformers' DeepseekV32Indexer, under torch.no_grad) whose top-k keys mask the attention:
// its parameters, the temporaries of its forward and what the attention holds of its choice, its
// FLOPs (forward only), its key cache in serving, and the config reader.
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
/// A small DeepSeek-V3.2 config: V3's keys (two dense layers, then experts) and the indexer's.
json v32_config(std::uint64_t index_heads = 3, std::uint64_t index_head_dim = 16) {
    return {{"model_type", "deepseek_v32"},
            {"hidden_size", 64},
            {"num_hidden_layers", 4},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 4},
            {"intermediate_size", 176},
            {"moe_intermediate_size", 32},
            {"n_routed_experts", 8},
            {"n_shared_experts", 1},
            {"num_experts_per_tok", 2},
            {"first_k_dense_replace", 2},
            {"vocab_size", 128},
            {"q_lora_rank", 24},
            {"kv_lora_rank", 16},
            {"qk_nope_head_dim", 8},
            {"qk_rope_head_dim", 4},
            {"v_head_dim", 12},
            {"index_n_heads", index_heads},
            {"index_head_dim", index_head_dim},
            {"index_topk", 24},
            {"max_position_embeddings", 4096}};
}

Architecture v32_import(const json& config) {
    return cli::parse_hf_config(config.dump(), "v32.json", "v32").architecture;
}

/// The same model without its indexer: DeepSeek-V3.
Architecture without_indexer(Architecture m) {
    m.mla.index_heads = m.mla.index_head_dim = m.mla.index_topk = 0;
    return m;
}

/// DeepseekV32Indexer's parameters, written out: wq_b (r_q x A D), wk (h x D), k_norm's weight
/// and bias (D each), weights_proj (h x A).
std::uint64_t indexer_parameters(std::uint64_t h, std::uint64_t r_q, std::uint64_t A,
                                 std::uint64_t D) {
    return r_q * A * D + h * D + 2 * D + h * A;
}

LayerActivations v32_layer(const Architecture& m, std::uint64_t s, std::uint64_t b,
                           Attention attention = Attention::eager,
                           Platform platform = Platform::cpu) {
    return architecture_layer(m, s, b, Precision(DType::bf16), attention, platform);
}

/// The bytes of the forward workspace whose op is `op`.
std::uint64_t v32_workspace(const LayerActivations& layer, const std::string& op) {
    for (const Workspace& w : layer.work)
        if (!w.backward && w.op == op) return w.bytes.value();
    FAIL("no workspace " << op);
    return 0;
}

/// The caller's tensors beside the first forward core-attention workspace.
Count v32_held_at_core(const LayerActivations& layer) {
    for (std::size_t i = 0; i < layer.work.size(); ++i)
        if (!layer.work[i].backward && layer.work[i].module == Module::core_attn)
            return layer.beside_bytes(i, Recompute::none, Holder::caller);
    FAIL("no core attention workspace");
    return Count(0);
}
}  // namespace

TEST_CASE("deepseek_v32's parameters: DeepSeek-V3's and an indexer in every layer",
          "[deepseek_v32][params]") {
    const std::string configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";
    const cli::ModelFile exp = cli::load_hf_config(configs + "deepseek-v3.2-exp.json");
    const Architecture v3 = cli::load_hf_config(configs + "deepseek-v3.json").architecture;
    const std::uint64_t per_layer = indexer_parameters(7168, 1536, 64, 128);
    CHECK(per_layer == 13'959'424);
    CHECK(parameter_table(exp.architecture).total().value() ==
          parameter_table(v3).total().value() + 61 * per_layer);
    CHECK(parameter_table(exp.architecture).total().value() == 671'877'929'216);
    // The checkpoint's multi-token-prediction layer holds an indexer too: V3's 11,610,068,224 less
    // its router's bias (a buffer, 256 values).
    CHECK_THAT(exp.description, Catch::Contains(std::to_string(11'610'067'968 + per_layer)));
    CHECK_THAT(exp.description, Catch::Contains("torch.no_grad"));
    // Another shape: the indexer's tensors in each of its four layers.
    const auto [A, D] = GENERATE(table<std::uint64_t, std::uint64_t>({{3, 16}, {8, 4}, {1, 64}}));
    const Architecture m = v32_import(v32_config(A, D));
    CHECK(parameter_table(m).total().value() ==
          parameter_table(without_indexer(m)).total().value() +
              4 * indexer_parameters(64, 24, A, D));
}

TEST_CASE("deepseek_v32's config: the indexer's keys and their refusals",
          "[deepseek_v32][hf_config]") {
    const Architecture m = v32_import(v32_config());
    CHECK(m.mla.index_heads == 3);
    CHECK(m.mla.index_head_dim == 16);
    CHECK(m.mla.index_topk == 24);
    json config = v32_config();
    config.erase("index_n_heads");  // DeepseekV32Config's defaults: 64 heads of 128, top 2048
    CHECK(v32_import(config).mla.index_heads == 64);
    config = v32_config();
    config.erase("q_lora_rank");  // a plain q_proj (DeepSeek-V2-Lite's)
    CHECK_THROWS_WITH(v32_import(config),
                      Catch::Contains("index_n_heads (3): the indexer's q reads "
                                      "the query latent"));
    config = v32_config(3, 2);
    CHECK_THROWS_WITH(v32_import(config),
                      Catch::Contains("index_head_dim (2) must hold the rotary part"));
}

TEST_CASE("a DeepSeek-V3.2 layer keeps V3's tensors: its indexer runs under no_grad",
          "[deepseek_v32][activations]") {
    const Architecture m = v32_import(v32_config());
    const std::uint64_t s = GENERATE(16, 40), b = GENERATE(1, 3), T = s * b;
    CAPTURE(s, b);
    const LayerActivations eager = v32_layer(m, s, b), v3 = v32_layer(without_indexer(m), s, b);
    CHECK(eager.total().value() == v3.total().value());
    // A checkpointed core attention keeps its mask, the one the top-k filled (bf16, s^2 b).
    CHECK(eager.kept(Recompute::selective).value() ==
          v3.kept(Recompute::selective).value() + 2 * T * s);
    // A sparse kernel keeps the int32 indices: k = min(index_topk, s) a token.
    const std::uint64_t k = std::min<std::uint64_t>(24, s);
    CHECK(v32_layer(m, s, b, Attention::flash).total().value() ==
          v32_layer(without_indexer(m), s, b, Attention::flash).total().value() + 4 * T * k);
}

TEST_CASE("a DeepSeek-V3.2 layer's indexer: its forward's temporaries and the mask held",
          "[deepseek_v32][activations]") {
    const Architecture m = v32_import(v32_config());
    const std::uint64_t s = 40, b = GENERATE(1, 3), T = s * b, A = 3, D = 16, rope = 4, k = 24;
    CAPTURE(b);
    const LayerActivations layer = v32_layer(m, s, b);
    // q (wq_b's output, its rotated part, concatenated) and k (normed, rotated, concatenated).
    const std::uint64_t qk = 2 * T * (A * (2 * D + rope) + 2 * D + rope);
    const std::uint64_t scores = 4 * T * A * s, broadcast = b > 1 ? 4 * T * D * s : 0;
    CHECK(v32_workspace(layer, "matmul(q.float(), k^T) (indexer, no grad)") ==
          qk + 4 * T * (A + 1) * D + broadcast + scores);
    CHECK(v32_workspace(layer, "scores x scale, F.relu (indexer, no grad)") == qk + 2 * scores);
    // On CPU the bf16 mask is copied to fp32 to be added to the fp32 index scores; CUDA reads it.
    const std::uint64_t kept = qk + scores + 4 * T * A;
    CHECK(v32_workspace(layer, "index scores + mask (indexer, no grad)") == kept + 3 * 4 * T * s);
    CHECK(v32_workspace(v32_layer(m, s, b, Attention::eager, Platform::cuda),
                        "index scores + mask (indexer, no grad)") == kept + 2 * 4 * T * s);
    CHECK(v32_workspace(layer, "topk (indexer, no grad)") == kept + 4 * T * s + 12 * T * k);
    // Beside the core attention: the int32 indices, the bool mask and the filled bf16 mask.
    CHECK(v32_held_at_core(layer).value() ==
          v32_held_at_core(v32_layer(without_indexer(m), s, b)).value() + 4 * T * k + 3 * T * s);
}

TEST_CASE("a DeepSeek-V3.2 step counts its indexer's FLOPs once: it has no backward",
          "[deepseek_v32][flops]") {
    const Architecture m = v32_import(v32_config());
    const std::uint64_t s = GENERATE(16, 4096), b = 2;
    const double T = static_cast<double>(s * b), A = 3, D = 16;
    const double indexer = 2 * T * (24 * A * D + 64 * (D + A)) + 2 * T * double(s) * A * (D + 1);
    const ComputeCost with = compute_cost(m, s, b, Recompute::full);
    const ComputeCost without = compute_cost(without_indexer(m), s, b, Recompute::full);
    CHECK(with.step == Approx(without.step + 4 * indexer));
    CHECK(with.recompute == Approx(without.recompute + 4 * indexer));  // a rerun layer reruns it
}

TEST_CASE("serving DeepSeek-V3.2: the indexer's fp8 key and scale beside the latent",
          "[deepseek_v32][serve]") {
    const auto [D, bytes] = GENERATE(table<std::uint64_t, std::uint64_t>({{16, 20}, {128, 132}}));
    const Architecture m = v32_import(v32_config(3, D));
    ServeSettings s;
    s.context = 4096, s.batch = 2;
    const ServeReport r = serve(m, s), v3 = serve(without_indexer(m), s);
    CHECK(r.indexer_key_bytes == bytes);
    CHECK(r.kv_bytes_per_token.value() == v3.kv_bytes_per_token.value() + 4 * bytes);
}
