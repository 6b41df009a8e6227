// Llama 4 (transformers' modeling_llama4.py): chunked attention on its rotary layers, NoPE layers
// with a query temperature, the weightless L2 norm of q and k, and Llama4TextMoe running every
// expert over every token; the framework's grouped GEMM in its place. Checked against the rows
// measured by validation/reference_trainer.py (results/cpu-llama4.json).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>
#include <string>

#include "memcalc/architecture_activations.hpp"
#include "memcalc/params.hpp"
#include "memcalc/workload.hpp"
#include "model_file.hpp"

using namespace memcalc;
using nlohmann::json;

namespace {
Architecture llama4_shape(std::uint64_t h, std::uint64_t heads, std::uint64_t kv, std::uint64_t d,
                          std::uint64_t f, std::uint64_t E, std::uint64_t k) {
    Architecture m;
    m.name = "llama4-shape", m.hidden = h, m.layers = 4, m.heads = heads, m.kv_heads = kv,
    m.head_dim = d, m.ffn = f;
    m.vocab = 1000, m.experts = E, m.experts_per_token = k, m.shared_ffn = f,
    m.renormalize_topk = false;
    m.softmax_fp32 = false, m.qk_norm = QkNorm::l2, m.attention_chunk = 8;
    m.expert_dispatch = ExpertDispatch::every_token;
    return m;
}

std::uint64_t kept(const Architecture& m, std::uint64_t s, std::uint64_t b,
                   Recompute mode = Recompute::none, Attention attention = Attention::eager) {
    return architecture_layer(m, s, b, DType::bf16, attention).kept(mode).value();
}

json scout_config() {
    return {{"model_type", "llama4_text"}, {"hidden_size", 5120},
            {"intermediate_size", 8192},   {"intermediate_size_mlp", 16384},
            {"num_hidden_layers", 48},     {"num_attention_heads", 40},
            {"num_key_value_heads", 8},    {"head_dim", 128},
            {"vocab_size", 202048},        {"num_local_experts", 16},
            {"num_experts_per_tok", 1},    {"interleave_moe_layer_step", 1},
            {"use_qk_norm", true},         {"attention_chunk_size", 8192},
            {"tie_word_embeddings", false}};
}
}  // namespace

TEST_CASE(
    "Llama 4's MoE as transformers trains it: every expert over every token, the scores in the "
    "input",
    "[llama4][architecture]") {
    const auto [h, heads, kv, d, f, E,
                k] = GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t,
                                    std::uint64_t, std::uint64_t, std::uint64_t>(
        {{64, 4, 2, 16, 32, 4, 1}, {5120, 40, 8, 128, 8192, 16, 1}, {256, 8, 8, 32, 96, 8, 2}}));
    const std::uint64_t s = GENERATE(16, 4096), b = GENERATE(1, 2);
    const Architecture every = llama4_shape(h, heads, kv, d, f, E, k);
    Architecture routed = every;
    routed.expert_dispatch = ExpertDispatch::routed;
    CAPTURE(h, E, k, s, b);
    const std::uint64_t T = s * b;
    const LayerActivations layer = architecture_layer(every, s, b, DType::bf16, Attention::eager);
    // Everything but the MoE block's own rows is the routed layer's: the norm, attention, the
    // router's input and the shared expert.
    std::uint64_t moe = 0;
    for (const auto& r : layer.rows)
        if (r.module == Module::moe || r.module == Module::moe_act) moe += r.bytes.value();
    // indices (int64, T k), sigmoid (fp32, T E), the repeated tokens, the scores' column, the bmm's
    // input (bf16, E T h each but the column), gate_up (E T 2f), act(gate) (E T f) and the down
    // bmm's input (E T f).
    const std::uint64_t expected =
        T * k * 8 + T * E * 4 + E * T * (2 * h + 1) * 2 + E * T * 4 * f * 2;
    // The router's input (the norm's output) is counted by its projection row in the moe section.
    CHECK(moe == expected + T * h * 2);
    // It is larger than the routed slots by about E / k for the experts' part.
    CHECK(kept(every, s, b) > kept(routed, s, b));
    // Full recomputation keeps the layer's input alone either way.
    CHECK(kept(every, s, b, Recompute::full) == T * h * 2);
}

TEST_CASE("the framework's grouped GEMM counts Llama 4's experts over the routed slots",
          "[llama4][framework]") {
    const Architecture every = llama4_shape(256, 8, 2, 32, 96, 8, 1);
    Architecture routed = every;
    routed.expert_dispatch = ExpertDispatch::routed;
    Framework grouped;
    grouped.moe = MoeKernel::grouped_gemm;
    for (std::uint64_t s : {64, 512}) {
        CAPTURE(s);
        const auto as_written =
            activation_tables(every, s, 2, DType::bf16, ActivationModel::architecture);
        const auto swapped =
            activation_tables(every, s, 2, DType::bf16, ActivationModel::architecture, grouped);
        const auto plain =
            activation_tables(routed, s, 2, DType::bf16, ActivationModel::architecture);
        CHECK(swapped.layer.total() == plain.layer.total());
        CHECK(as_written.layer.total() > swapped.layer.total());
    }
    // Megatron-LM's profile runs the grouped GEMM.
    CHECK(find_profile("megatron")->framework.moe == MoeKernel::grouped_gemm);
    CHECK(find_profile("default")->framework.moe == MoeKernel::model_code);
}

TEST_CASE("the L2 norm of q and k keeps an fp32 copy and 1/rms per head and token, no x_norm",
          "[llama4][architecture]") {
    const std::uint64_t s = GENERATE(16, 2048), b = GENERATE(1, 3);
    const std::uint64_t heads = GENERATE(4, 40), kv = GENERATE(1, 4);
    Architecture with = llama4_shape(64, heads, kv, 16, 32, 4, 1);
    with.expert_dispatch = ExpertDispatch::routed;
    Architecture without = with;
    without.qk_norm = QkNorm::none;
    CAPTURE(s, b, heads, kv);
    const std::uint64_t T = s * b;
    const std::uint64_t l2 = 4 * T * (heads + kv) * 16 + 4 * T * (heads + kv);
    for (Recompute mode : {Recompute::none, Recompute::selective})
        CHECK(kept(with, s, b, mode) - kept(without, s, b, mode) == l2);
    CHECK(kept(with, s, b, Recompute::none, Attention::flash) -
              kept(without, s, b, Recompute::none, Attention::flash) ==
          l2);
}

TEST_CASE("NoPE layers: no rotary, no qk norm, the temperature's s fp32 scales",
          "[llama4][architecture]") {
    const std::uint64_t s = GENERATE(16, 8192), b = GENERATE(1, 2);
    Architecture nope = llama4_shape(64, 4, 2, 16, 32, 4, 1);
    nope.position = Position::none, nope.qk_norm = QkNorm::none, nope.attention_chunk = 0;
    Architecture tuned = nope;
    tuned.attention_temperature = true;
    CAPTURE(s, b);
    CHECK(kept(tuned, s, b) - kept(nope, s, b) == 4 * s);  // (1, s, 1, 1) expanded over the batch
    // Rotary layers do not scale their queries.
    Architecture rotary = tuned;
    rotary.position = Position::rotary;
    Architecture rotary_plain = rotary;
    rotary_plain.attention_temperature = false;
    CHECK(kept(rotary, s, b) == kept(rotary_plain, s, b));
}

TEST_CASE("chunked attention keeps what full attention keeps; eager builds a mask for it",
          "[llama4][attention]") {
    const Architecture m =
        cli::parse_hf_config(scout_config().dump(), "scout.json", "scout").architecture;
    REQUIRE(m.kind_count() == 2);
    const Architecture chunked = m.kind_view(0), global = m.kind_view(1);
    CHECK(chunked.attention_chunk == 8192);
    CHECK(global.attention_chunk == 0);
    Architecture unchunked = chunked;
    unchunked.attention_chunk = 0;
    for (Attention a : {Attention::eager, Attention::flash})
        CHECK(kept(chunked, 4096, 1, Recompute::none, a) ==
              kept(unchunked, 4096, 1, Recompute::none, a));
    CHECK(m.distinct_windows() == 2);
    const auto eager = activation_tables(m, 1024, 2, DType::bf16, ActivationModel::architecture);
    REQUIRE(eager.forward_buffers.size() == 1);
    CHECK(eager.forward_buffers[0].bytes.value() ==
          2 * 1024ULL * 1024 * 2 * 2);  // two s^2 b bf16 masks
    Framework flash;
    flash.attention = Attention::flash;
    CHECK(activation_tables(m, 1024, 2, DType::bf16, ActivationModel::architecture, flash)
              .forward_buffers.empty());
}

TEST_CASE("Llama 4's configs: a kind per (MoE or dense, rotary or NoPE) pair",
          "[llama4][hf_config]") {
    json scout = scout_config();
    const auto file = cli::parse_hf_config(scout.dump(), "scout.json", "scout");
    const Architecture& m = file.architecture;
    CHECK(m.expert_dispatch == ExpertDispatch::every_token);
    CHECK_FALSE(m.softmax_fp32);
    CHECK(m.attention_temperature);
    REQUIRE(m.layer_kinds.size() == 2);
    CHECK(m.layers_of_kind(0) == 36);  // rotary, chunked
    CHECK(m.layers_of_kind(1) == 12);  // every 4th: NoPE
    CHECK(m.kind_view(0).qk_norm == QkNorm::l2);
    CHECK(m.kind_view(1).qk_norm == QkNorm::none);
    CHECK(m.kind_view(1).position == Position::none);
    CHECK(m.layer_pattern.size() == 24);
    CHECK(m.layer_pattern[1].kind == 1);
    CHECK(m.layer_pattern[1].count == 1);
    CHECK(file.notes.back().find("every expert over every token") != std::string::npos);

    // Maverick: dense layers 0, 2, ...; MoE ones 1, 3, ...; every 4th (3, 7, ...) NoPE, all of them
    // MoE.
    scout["num_local_experts"] = 128, scout["interleave_moe_layer_step"] = 2,
    scout["use_qk_norm"] = false;
    const Architecture maverick = cli::parse_hf_config(scout.dump(), "m.json", "m").architecture;
    REQUIRE(maverick.layer_kinds.size() == 3);
    CHECK(maverick.layer_kinds[0].name == "dense");
    CHECK(maverick.layers_of_kind(0) == 24);
    CHECK(maverick.layers_of_kind(1) == 12);
    CHECK(maverick.layers_of_kind(2) == 12);
    CHECK(maverick.kind_view(0).qk_norm == QkNorm::none);
    CHECK(parameter_table(maverick).total().value() == 400711848960ULL);

    // no_rope_layers given outright, and an early config's numeric attn_temperature_tuning.
    scout = scout_config();
    scout["num_hidden_layers"] = 4, scout["no_rope_layers"] = {0, 1, 1, 1},
    scout["attn_temperature_tuning"] = 0;
    const Architecture listed = cli::parse_hf_config(scout.dump(), "l.json", "l").architecture;
    CHECK_FALSE(listed.attention_temperature);
    REQUIRE(listed.layer_kinds.size() == 2);
    CHECK(listed.layer_kinds[0].name == "moe_nope");
    CHECK(listed.layers_of_kind(1) == 3);
    scout["no_rope_layers"] = {1, 1};
    CHECK_THROWS_WITH(cli::parse_hf_config(scout.dump(), "l.json", "l"),
                      Catch::Contains("no_rope_layers has 2 entries; num_hidden_layers is 4"));
    scout["no_rope_layers"] = json::array();
    scout["attn_temperature_tuning"] = "yes";
    CHECK_THROWS_WITH(cli::parse_hf_config(scout.dump(), "l.json", "l"),
                      Catch::Contains("attn_temperature_tuning"));
}
