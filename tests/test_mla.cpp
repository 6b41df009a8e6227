// Multi-head latent attention (DeepSeek-V2/V3) on two shapes: with a query latent (V3) and a plain
// q_proj (V2-Lite), v narrower than q (flash pads it) and as wide. Parameters tensor by tensor as
// transformers' DeepseekV3Attention holds them, Megatron-LM's tensor-parallel splits, and the saved
// tensors against closed forms of the rows validation/reference_trainer.py measures (MLA models).
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/flops.hpp"
#include "model_file.hpp"

using namespace memcalc;

namespace {
struct MlaShape {
    std::uint64_t h, a, q_rank, kv_rank, nope, rope, v, f;
};
// q_rank 0: V2-Lite's plain q_proj. The first has d_v != d_n + d_r, the second d_v == d_n + d_r.
const MlaShape with_query_latent{64, 4, 24, 16, 8, 4, 12, 96};
const MlaShape plain_query{48, 3, 0, 8, 6, 2, 8, 84};

Architecture mla_model(const MlaShape& x) {
    Architecture m;
    m.name = "mla", m.hidden = x.h, m.layers = 2, m.heads = x.a, m.ffn = x.f, m.vocab = 100,
    m.max_positions = 64;
    m.mla = {x.q_rank, x.kv_rank, x.nope, x.rope, x.v};
    return m;
}

/// One layer's attention parameters, each tensor written out: replicated (the down projections and
/// the latents' norms) and split by heads (the up projections and o_proj).
struct AttentionCounts {
    std::uint64_t replicated, split;
};
AttentionCounts attention_counts(const MlaShape& x) {
    const std::uint64_t qk = x.nope + x.rope;
    const std::uint64_t q_side_replicated =
        x.q_rank == 0 ? 0 : x.h * x.q_rank + x.q_rank;  // q_a_proj, q_a_layernorm
    const std::uint64_t q_side_split =
        x.q_rank == 0 ? x.h * x.a * qk : x.q_rank * x.a * qk;  // q_proj or q_b_proj
    return {
        q_side_replicated + x.h * (x.kv_rank + x.rope) +
            x.kv_rank,  // kv_a_proj_with_mqa, kv_a_layernorm
        q_side_split + x.kv_rank * x.a * (x.nope + x.v) + x.a * x.v * x.h};  // kv_b_proj, o_proj
}
}  // namespace

TEST_CASE("latent attention's parameters, tensor by tensor", "[mla][params]") {
    const MlaShape x = GENERATE(with_query_latent, plain_query);
    CAPTURE(x.q_rank);
    const Architecture m = mla_model(x);
    const ParameterTable t = parameter_table(m);
    const AttentionCounts attention = attention_counts(x);
    const std::uint64_t layer = attention.replicated + attention.split + 2 * x.h + 3 * x.h * x.f;
    CHECK(t.per_layer().value() == layer);
    CHECK(t.total().value() == 2 * layer + 2 * 100 * x.h + x.h);
    const auto row = [&](const char* name) {
        return std::find_if(t.rows.begin(), t.rows.end(),
                            [&](const ParamRow& r) { return r.tensor == name; });
    };
    CHECK(row("k_proj") == t.rows.end());
    CHECK(row("kv_a_proj_with_mqa")->dims.vector() ==
          std::vector<std::uint64_t>{x.h, x.kv_rank + x.rope});
    CHECK(row("kv_b_proj")->dims.vector() ==
          std::vector<std::uint64_t>{x.kv_rank, x.a * (x.nope + x.v)});
    CHECK(row("o_proj")->dims.vector() == std::vector<std::uint64_t>{x.a * x.v, x.h});
    CHECK((row("q_a_proj") == t.rows.end()) == (x.q_rank == 0));
    CHECK((row("q_proj") == t.rows.end()) == (x.q_rank != 0));
    CHECK(row("kv_a_layernorm.weight")->part == Part::norms);
    // attention_bias: q_a_proj's (when there is one), kv_a_proj_with_mqa's and o_proj's, never
    // q_proj's.
    Architecture biased = m;
    biased.bias = Bias::attention;
    CHECK(parameter_table(biased).per_layer().value() ==
          layer + (x.q_rank == 0 ? 0 : x.q_rank) + x.kv_rank + x.rope + x.h);
}

TEST_CASE(
    "tensor parallelism splits latent attention's up projections and o_proj by heads, not the down "
    "projections",
    "[mla][parallel]") {
    const MlaShape x = GENERATE(with_query_latent, plain_query);
    const std::uint64_t tp = x.a == 4 ? 4 : 3;
    Settings settings;
    settings.seq = 32, settings.micro_batch = 1, settings.recompute = Recompute::full,
    settings.parallel.tp = tp;
    const Report r = estimate(mla_model(x), settings);
    const AttentionCounts attention = attention_counts(x);
    const std::uint64_t rows = (100 + tp - 1) / tp;  // the vocabulary's rows each rank holds
    CHECK(r.busiest().parameters.value() ==
          2 * rows * x.h +
              2 * (attention.replicated + attention.split / tp + 2 * x.h + 3 * x.h * x.f / tp) +
              x.h);
}

TEST_CASE(
    "latent attention's saved tensors: the latents and their norms, q and k at every head, v in "
    "kv_b_proj's "
    "output",
    "[mla][architecture]") {
    const MlaShape x = GENERATE(with_query_latent, plain_query);
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    CAPTURE(x.q_rank, s, b);
    const Architecture m = mla_model(x);
    const std::uint64_t sb = s * b, qk = x.nope + x.rope, a = x.a;
    // Two RMSNorms 6 sbh + 4 sb each, the attention's and the MLP's inputs 2 sbh each, SwiGLU 8
    // sbf; the query latent's norm (6 r_q + 4) and q_b_proj's input (2 r_q); the key/value latent's
    // the same.
    const std::uint64_t latents = (x.q_rank == 0 ? 0 : 8 * x.q_rank + 4) + 8 * x.kv_rank + 4;
    const std::uint64_t common = sb * (16 * x.h + 8 + latents + 8 * x.f);
    const std::uint64_t scores = 6 * a * s * s * b;  // fp32 softmax and its bf16 cast

    const LayerActivations eager = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    // q and k (2 a (d_n + d_r) each), o_proj's input (2 a d_v); v a view of kv_b_proj's output at b
    // = 1, which keeps that output whole (2 a (d_n + d_v)), a copy of 2 a d_v when matmul copies it
    // (b > 1).
    const std::uint64_t v_kept = b == 1 ? 2 * a * (x.nope + x.v) : 2 * a * x.v;
    CHECK(eager.total().value() == common + sb * (4 * a * qk + v_kept + 2 * a * x.v) + scores);
    // Selective recomputation keeps q, k and the view of v (so kv_b_proj's output) for the
    // checkpoint.
    CHECK(eager.kept(Recompute::selective).value() ==
          common + sb * (4 * a * qk + 2 * a * (x.nope + x.v) + 2 * a * x.v));
    CHECK(eager.kept(Recompute::full).value() == 2 * sb * x.h);

    const LayerActivations flash = architecture_layer(m, s, b, DType::bf16, Attention::flash);
    const bool padded = x.v != qk;
    // The kernel keeps q, k, v and its output, and a log-sum-exp per head and token (4 a).
    // transformers pads v to q's width for it, and o_proj reads a copy of the output's unpadded
    // slice; unpadded, v is a view of kv_b_proj's output and the kernel's output is o_proj's input.
    const std::uint64_t kernel =
        padded ? 2 * a * qk + 2 * a * qk + 2 * a * x.v : 2 * a * (x.nope + x.v) + 2 * a * x.v;
    CHECK(flash.total().value() == common + sb * (4 * a * qk + kernel + 4 * a));
    const std::uint64_t dropped =
        4 * a + (padded ? 2 * a * qk : 0);  // the log-sum-exp, a padded output
    CHECK(flash.kept(Recompute::selective).value() == flash.total().value() - sb * dropped);
    // Megatron-LM copies v contiguous at its own width for Transformer Engine's kernel, whose
    // output o_proj reads as it is, whatever the widths.
    Architecture megatron = m;
    megatron.latent_v_padded = false;
    const LayerActivations te = architecture_layer(megatron, s, b, DType::bf16, Attention::flash);
    CHECK(te.total().value() == common + sb * (4 * a * qk + 2 * a * x.v + 2 * a * x.v + 4 * a));
    CHECK(architecture_layer(megatron, s, b, DType::bf16, Attention::eager).total() ==
          eager.total());
}

TEST_CASE(
    "latent attention in fp32: the key/value latent's norm keeps kv_a_proj_with_mqa's whole output",
    "[mla]") {
    // x.to(float32) of an fp32 slice is the slice itself, a view that keeps the latent and k's rope
    // part.
    const Architecture m = mla_model(with_query_latent);
    const LayerActivations fp32 = architecture_layer(m, 16, 1, DType::fp32, Attention::eager);
    const auto kv_norm_input =
        std::find_if(fp32.rows.begin(), fp32.rows.end(), [](const SavedTensor& r) {
            return r.op == "kv_a_layernorm (RMSNorm)" && r.bytes_per_element == 4 &&
                   r.symbol == "sb(r_kv+d_r)";
        });
    REQUIRE(kv_norm_input != fp32.rows.end());
    CHECK(kv_norm_input->elements.value() == 16 * (16 + 4));
}

TEST_CASE("latent attention's rotary tables are d_r wide; its FLOPs count the latents' projections",
          "[mla]") {
    const MlaShape x = with_query_latent;
    const Architecture m = mla_model(x);
    const auto input_side = input_side_saved(m, 16, 1, DType::bf16);
    REQUIRE(input_side.size() == 2);
    CHECK(input_side[1].elements.value() == 2 * 16 * x.rope);
    const ComputeCost c = compute_cost(m, 16, 1, Recompute::none);
    const AttentionCounts attention = attention_counts(x);
    const double matrices = static_cast<double>(attention.replicated + attention.split - x.q_rank -
                                                x.kv_rank);  // no norms
    CHECK(c.attention_core == Approx(2.0 * 16 * 16 * x.a * (x.nope + x.rope + x.v)));
    CHECK(c.layer_forward() ==
          Approx(2.0 * 16 * matrices + c.attention_core + 2.0 * 16 * 3 * x.h * x.f));
}

TEST_CASE("latent attention's widths are checked: named fields, no standard-attention leftovers",
          "[mla][validation]") {
    const auto fails = [](Architecture m, const std::string& fragment) {
        try {
            validate(m);
        } catch (const error& e) {
            CAPTURE(e.what());
            CHECK(std::string(e.what()).find(fragment) != std::string::npos);
            return;
        }
        FAIL("no error for " + fragment);
    };
    const Architecture m = mla_model(with_query_latent);
    CHECK_NOTHROW(validate(m));
    Architecture bad = m;
    bad.kv_heads = 2;
    fails(bad, "kv_heads (2) must equal heads");
    bad = m, bad.head_dim = 64;
    fails(bad, "head_dim (64) is qk_nope_head_dim + qk_rope_head_dim (12)");
    bad = m, bad.head_dim = 12;
    CHECK_NOTHROW(validate(bad));
    bad = m, bad.mla.qk_rope_head_dim = 3;
    fails(bad, "qk_rope_head_dim must be even");
    bad = m, bad.mla.v_head_dim = 0;
    fails(bad, "v_head_dim must be a positive integer");
    bad = m, bad.mla.kv_lora_rank = 0;
    fails(bad, "q_lora_rank (24) is a width of latent attention: it needs kv_lora_rank > 0");
    bad = m, bad.position = Position::learned;
    fails(bad, "latent attention needs position rotary");
    bad = m, bad.bias = Bias::qkv;
    fails(bad, "bias under latent attention is none or attention");
}

TEST_CASE("model files name latent attention by config.json's keys", "[mla][model_file]") {
    const auto file =
        cli::parse_model_json(R"({"hidden": 64, "layers": 2, "heads": 4, "ffn": 96, "vocab": 100,
        "q_lora_rank": 0, "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4,
        "v_head_dim": 12})",
                              "mla.json", "mla");
    CHECK(file.architecture.mla.enabled());
    CHECK(file.architecture.head_size() == 12);
    CHECK(file.architecture.value_head_size() == 12);
    CHECK(file.architecture.rotary_dim() == 4);
    CHECK_THROWS_WITH(
        cli::parse_model_json(R"({"hidden": 64, "layers": 2, "heads": 4, "ffn": 96, "vocab": 100,
        "kv_lora_rank": 16, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4})",
                              "mla.json", "mla"),
        "mla.json: v_head_dim must be a positive integer (got 0)");
}

TEST_CASE(
    "DeepSeek's config.json: dense layers then MoE layers, latent attention, the MTP layer "
    "described",
    "[mla][hf_config]") {
    const std::string configs = std::string(MEMCALC_SOURCE_DIR) + "/tests/configs/";
    const auto v3 = cli::load_hf_config(configs + "deepseek-v3.json");
    const Architecture& m = v3.architecture;
    CHECK(m.mla.q_lora_rank == 1536);
    CHECK(m.head_size() == 192);
    CHECK(m.value_head_size() == 128);
    REQUIRE(m.layer_pattern.size() == 2);
    CHECK(m.layers_of_kind(0) == 3);
    CHECK(m.kind_view(0).ffn == 18432);
    CHECK(!m.kind_view(0).is_moe());
    CHECK(m.kind_view(1).experts == 256);
    CHECK(m.kind_view(1).shared_ffn == 2048);
    CHECK(m.router_bias == RouterBias::buffer);
    // The checkpoint's one multi-token-prediction layer: a MoE layer, enorm, hnorm, eh_proj (2h x
    // h) and shared_head.norm; with its router bias and copies of the embedding and head it brings
    // the main model's 671,026,419,200 checkpoint elements to the safetensors total less the fp8
    // scales.
    const ParameterTable t = parameter_table(m);
    const std::uint64_t mtp = t.per_layer(1).value() + 3 * 7168 + 2 * 7168ull * 7168;
    CHECK(mtp == 11610067968ull);
    CHECK(v3.description.find("1 multi-token-prediction layer") != std::string::npos);
    CHECK(v3.description.find(std::to_string(mtp) + " parameters") != std::string::npos);
    CHECK(t.total().value() + 58 * 256 + mtp + 256 + 2 * 129280ull * 7168 + 41540496 ==
          684531386000ull);
    // The presets are the configs.
    CHECK(parameter_table(cli::load_preset("deepseek-v3").architecture).total() == t.total());
    const auto lite = cli::load_hf_config(configs + "deepseek-v2-lite.json");
    CHECK(lite.architecture.mla.q_lora_rank == 0);
    CHECK(!lite.architecture.renormalize_topk);
    CHECK(lite.description.find("multi-token") == std::string::npos);
    CHECK(v3.notes.size() == 1);
    CHECK(lite.notes.empty());
    CHECK(parameter_table(cli::load_preset("deepseek-v2-lite").architecture).total() ==
          parameter_table(lite.architecture).total());
}

TEST_CASE("DeepSeek's configs that memcalc cannot model are refused by name", "[mla][hf_config]") {
    const std::string base =
        R"({"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "intermediate_size": 96, "vocab_size": 100, "kv_lora_rank": 16,
        "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 12)";
    CHECK(cli::parse_hf_config(base + "}", "c.json", "c").architecture.mla.enabled());
    CHECK_THROWS_WITH(
        cli::parse_hf_config(base + R"(, "n_routed_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 32, "moe_layer_freq": 2})",
                             "c.json", "c"),
        Catch::Contains("moe_layer_freq 2"));
    CHECK_THROWS_WITH(cli::parse_hf_config(base + R"(, "num_key_value_heads": 2})", "c.json", "c"),
                      Catch::Contains("kv_heads (2) must equal heads"));
}

TEST_CASE(
    "recompute module mla_up_proj drops q, k and v (or kv_b_proj's output) and keeps k's rope part",
    "[mla][recompute_modules]") {
    const MlaShape x = GENERATE(with_query_latent, plain_query);
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    const std::uint64_t s = GENERATE(16, 512), b = GENERATE(1, 2);
    CAPTURE(x.q_rank, attention_name(attention), s, b);
    const Architecture m = mla_model(x);
    const auto layer = [&](ModuleSet modules) {
        return architecture_layer(m, s, b, DType::bf16, attention, Platform::cuda, modules);
    };
    const LayerActivations core = layer(ModuleSet::of({Module::core_attn}));
    const LayerActivations up = layer(ModuleSet::of({Module::core_attn, Module::mla_up_proj}));
    const std::uint64_t T = s * b, qk = x.nope + x.rope;
    const bool padded = attention == Attention::flash && x.v != qk;
    // q and k at every head, and v's storage: kv_b_proj's output, or flash's padded copy; less the
    // checkpoint's k rope part (bf16), a view of kv_a_proj_with_mqa's whole output.
    const std::uint64_t outputs = 2 * 2 * T * x.a * qk + 2 * T * x.a * (padded ? qk : x.nope + x.v);
    CHECK(core.kept(Recompute::selective).value() - up.kept(Recompute::selective).value() ==
          outputs - 2 * T * (x.kv_rank + x.rope));
    // Without recomputation nothing changes; the backward step rebuilds what was dropped.
    CHECK(core.kept(Recompute::none) == up.kept(Recompute::none));
    CHECK(up.rebuilt(Recompute::selective) >= core.rebuilt(Recompute::selective));
    // Without core_attn the same, but that eager attention at b > 1 keeps matmul's copy of v, not
    // the output it was copied from (which only the core attention's checkpoint kept).
    const LayerActivations norms = layer(ModuleSet::of({Module::layernorm}));
    const LayerActivations norms_up =
        layer(ModuleSet::of({Module::layernorm, Module::mla_up_proj}));
    const std::uint64_t copied =
        attention == Attention::eager && b > 1 ? 2 * T * x.a * (x.nope + x.v) : 0;
    CHECK(norms.kept(Recompute::selective).value() - norms_up.kept(Recompute::selective).value() ==
          outputs - copied - 2 * T * (x.kv_rank + x.rope));
}

TEST_CASE("recompute-modules mla_up_proj runs on a latent-attention model",
          "[mla][recompute_modules][cli]") {
    Architecture m = mla_model(with_query_latent);
    Settings settings;
    settings.seq = 256, settings.recompute = Recompute::selective,
    settings.activations = ActivationModel::architecture;
    const Report core = estimate(m, settings);
    settings.recompute_modules = ModuleSet::of({Module::core_attn, Module::mla_up_proj});
    const Report up = estimate(m, settings);
    CHECK(up.kept_activations < core.kept_activations);
}
