// Shared experts beside routed ones (DeepSeek, Qwen2-MoE, Llama 4), Qwen2-MoE's sigmoid gate on
// them, a router's bias and top-k renormalisation: exact parameters, the saved tensors they add,
// and how tensor and expert parallelism split them.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"
#include "model_file.hpp"
#include "run_program.hpp"
#include <nlohmann/json.hpp>
#include <cmath>

using namespace memcalc;

namespace {
/// Qwen1.5-MoE-A2.7B's layer: 60 experts of 1408, top 4, a gated shared expert of 5632, q/k/v
/// biases.
Architecture qwen2_moe_like() {
    Architecture m;
    m.name = "qwen2-moe-like", m.hidden = 2048, m.layers = 24, m.heads = 16, m.ffn = 1408,
    m.vocab = 151936;
    m.bias = Bias::qkv, m.experts = 60, m.experts_per_token = 4, m.shared_ffn = 5632,
    m.shared_expert_gate = true;
    return m;
}
/// A DeepSeek-like layer: 64 experts of 256, two shared experts (512 wide), grouped queries, a
/// trainable router bias.
Architecture deepseek_like() {
    Architecture m;
    m.name = "deepseek-like", m.hidden = 1024, m.layers = 8, m.heads = 16, m.kv_heads = 4,
    m.ffn = 256, m.vocab = 32000, m.experts = 64, m.experts_per_token = 6, m.shared_ffn = 2 * 256;
    m.router_bias = RouterBias::trainable;
    return m;
}
Report estimate_recomputed(const Architecture& m, const Parallelism& p) {
    Settings settings;
    settings.seq = 512, settings.micro_batch = 1, settings.recompute = Recompute::full,
    settings.parallel = p;
    return estimate(m, settings);
}
}  // namespace

TEST_CASE(
    "a shared expert is one dense gated MLP per MoE layer; its gate a Linear(h, 1); the router's "
    "bias E",
    "[shared_experts][params]") {
    // Qwen2-MoE: 4 h^2 + 3 h (attention, q/k/v biases) + 2 h (norms) + h E (router) + 3 E h f + 3 h
    // f_s + h (gate)
    const ParameterTable qwen = parameter_table(qwen2_moe_like());
    CHECK(qwen.per_layer().value() == 570560512);
    // DeepSeek-like: 2 h a d + 2 h k d + 2 h + h E + E (bias) + 3 E h f + 3 h f_s
    const ParameterTable deepseek = parameter_table(deepseek_like());
    CHECK(deepseek.per_layer().value() == 54593600);
    for (const ParameterTable* t : {&qwen, &deepseek})
        for (const auto& row : t->rows) {
            CAPTURE(std::string(row.tensor));
            if (std::string(row.tensor).rfind("shared_expert.", 0) == 0) {
                CHECK(row.split == ParamSplit::tensor);
                CHECK_FALSE(row.expert);
            }
        }
    // A registered buffer (DeepSeek-V3's e_score_correction_bias) is no parameter.
    Architecture buffered = deepseek_like();
    buffered.router_bias = RouterBias::buffer;
    CHECK(parameter_table(buffered).per_layer().value() == 54593600 - 64);
}

TEST_CASE("a dense kind of a MoE model has no shared expert, gate or router bias",
          "[shared_experts][kinds]") {
    Architecture m = deepseek_like();
    m.layers = 3;
    m.layer_kinds = {{"dense", std::uint64_t{2048}, std::uint64_t{0}, {}}, {"moe", {}, {}, {}}};
    m.layer_pattern = {{0, 1}, {1, 2}};
    const ParameterTable t = parameter_table(m);
    const std::uint64_t attention_and_norms = 2 * 1024 * 1024 + 2 * 1024 * 256 + 2 * 1024;
    CHECK(t.per_layer(0).value() == attention_and_norms + 3 * 1024 * 2048);
    CHECK(t.per_layer(1).value() == 54593600);
    // A kind may give its own shared width.
    m.layer_kinds[1].shared_ffn = 1024;
    CHECK(parameter_table(m).per_layer(1).value() == 54593600 + 3 * 1024 * 512);
}

TEST_CASE(
    "a shared expert's saved tensors are a dense MLP's over every token; the gate adds its sigmoid "
    "and the "
    "product's factor",
    "[shared_experts][architecture]") {
    const std::uint64_t s = GENERATE(128, 1024), b = GENERATE(1, 2);
    const Architecture with = GENERATE(qwen2_moe_like(), deepseek_like());
    CAPTURE(with.name, s, b);
    Architecture without = with;
    without.shared_ffn = 0, without.shared_expert_gate = false;
    const std::uint64_t sb = s * b, sbh = sb * with.hidden, sbfs = sb * with.shared_ffn;
    const std::uint64_t gate =
        with.shared_expert_gate ? 2 * sb + 2 * sbh : 0;  // sigmoid's output, the MLP's
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    const auto total = [&](const Architecture& m, Precision p) {
        return architecture_layer(m, s, b, p, attention).total().value();
    };
    // bf16: SwiGLU keeps the gate's output, SiLU's, the up projection's and the down projection's
    // input.
    CHECK(total(with, DType::bf16) - total(without, DType::bf16) == 4 * 2 * sbfs + gate);
    // The same rows as a dense SwiGLU MLP of that width adds to a layer.
    Architecture dense = fixtures::llama_7b(), dense_wider = dense;
    dense_wider.ffn = dense.ffn + with.shared_ffn;
    CHECK(total(dense_wider, DType::bf16) - total(dense, DType::bf16) == 4 * 2 * sbfs);
    // Autocast: gate_proj and up_proj each cast the input (bf16), and so does the shared expert's
    // gate.
    const Precision autocast{DType::bf16, DType::fp32, true};
    CHECK(total(with, autocast) - total(without, autocast) ==
          4 * 2 * sbfs + gate + 2 * 2 * sbh + (with.shared_expert_gate ? 2 * sbh : 0));
    // Every recomputation but full keeps them all.
    const LayerActivations a = architecture_layer(with, s, b, DType::bf16, attention);
    const LayerActivations c = architecture_layer(without, s, b, DType::bf16, attention);
    CHECK(a.kept(Recompute::selective).value() - c.kept(Recompute::selective).value() ==
          4 * 2 * sbfs + gate);
    CHECK(a.kept(Recompute::full) == c.kept(Recompute::full));
}

TEST_CASE(
    "without renormalisation (norm_topk_prob false) the top-k probabilities and their sum are not "
    "kept",
    "[shared_experts][architecture]") {
    const std::uint64_t s = GENERATE(64, 512), b = GENERATE(1, 3);
    Architecture m = GENERATE(qwen2_moe_like(), deepseek_like());
    CAPTURE(m.name, s, b);
    const std::uint64_t renormalised =
        architecture_layer(m, s, b, DType::bf16, Attention::flash).total().value();
    m.renormalize_topk = false;
    const std::uint64_t raw =
        architecture_layer(m, s, b, DType::bf16, Attention::flash).total().value();
    CHECK(renormalised - raw == 4 * s * b * m.experts_per_token + 4 * s * b);
}

TEST_CASE("expert parallelism leaves the shared expert whole; tensor parallelism splits it",
          "[shared_experts][parallel]") {
    const Architecture m = GENERATE(qwen2_moe_like(), deepseek_like());
    CAPTURE(m.name);
    Architecture without = m;
    without.shared_ffn = 0, without.shared_expert_gate = false;
    const std::uint64_t mats =
        3 * m.hidden * m.shared_ffn * m.layers;  // the shared experts' matrices
    const std::uint64_t gate =
        m.shared_expert_gate ? m.hidden * m.layers : 0;  // replicated, like the router
    Parallelism ep;
    ep.dp = 4, ep.ep = GENERATE(2, 4);
    CHECK(estimate_recomputed(m, ep).busiest().parameters.value() -
              estimate_recomputed(without, ep).busiest().parameters.value() ==
          mats + gate);
    Parallelism tp;
    tp.tp = GENERATE(2, 4);
    CHECK(estimate_recomputed(m, tp).busiest().parameters.value() -
              estimate_recomputed(without, tp).busiest().parameters.value() ==
          mats / tp.tp + gate);
    // tp must divide the shared width too.
    Architecture odd = m;
    odd.shared_ffn = 1000 + 2;
    tp.tp = 4;
    CHECK_THROWS_WITH(estimate_recomputed(odd, tp), Catch::Contains("shared_ffn"));
}

TEST_CASE("shared experts, their gate and a router bias need routed experts",
          "[shared_experts][validate]") {
    Architecture dense = fixtures::llama_7b();
    dense.shared_ffn = 1024;
    CHECK_THROWS_WITH(validate(dense), Catch::Contains("shared_ffn (1024) needs experts > 0"));
    Architecture ungated = qwen2_moe_like();
    ungated.shared_ffn = 0;
    CHECK_THROWS_WITH(validate(ungated),
                      Catch::Contains("shared_expert_gate needs shared_ffn > 0"));
    Architecture biased = fixtures::llama_7b();
    biased.router_bias = RouterBias::trainable;
    CHECK_THROWS_WITH(validate(biased), Catch::Contains("router_bias needs experts > 0"));
}

TEST_CASE(
    "model files give shared experts, their gate, the router bias and renormalisation, per kind "
    "too",
    "[shared_experts][model_file]") {
    const std::string text =
        R"({"hidden": 1024, "layers": 3, "heads": 16, "kv_heads": 4, "ffn": 256, "vocab": 32000,
        "experts": 64, "experts_per_token": 6, "shared_ffn": 512, "router_bias": "trainable",
        "renormalize_topk": false,
        "layer_kinds": [{"name": "dense", "ffn": 2048, "experts": 0},
                        {"name": "moe", "shared_ffn": 1024, "shared_expert_gate": true,
                            "router_bias": "buffer"}],
        "layer_pattern": [{"kind": "dense", "layers": 1}, {"kind": "moe", "layers": 2}]})";
    const Architecture m = cli::parse_model_json(text, "m.json", "m").architecture;
    CHECK(m.shared_ffn == 512);
    CHECK(m.router_bias == RouterBias::trainable);
    CHECK_FALSE(m.renormalize_topk);
    const Architecture moe = m.kind_view(1), dense = m.kind_view(0);
    CHECK(moe.shared_ffn == 1024);
    CHECK(moe.shared_expert_gate);
    CHECK(moe.router_bias == RouterBias::buffer);
    CHECK(dense.shared_ffn == 0);
    CHECK(dense.router_bias == RouterBias::none);
    CHECK_THROWS_WITH(
        cli::parse_model_json(R"({"hidden": 64, "layers": 1, "heads": 4, "ffn": 64, "vocab": 10,
        "experts": 4, "router_bias": "learned"})",
                              "m.json", "m"),
        Catch::Contains("router_bias must be one of buffer, none, trainable (got 'learned')"));
}

TEST_CASE(
    "an uneven expert load: each expert computes over the busiest one's token-slots, the "
    "router over every token's k",
    "[moe][imbalance]") {
    const Architecture base = GENERATE(fixtures::mixtral(), qwen2_moe_like(), deepseek_like());
    const double imbalance = GENERATE(1.0, 1.25, 2.0, 100.0);
    CAPTURE(base.name, imbalance);
    Settings s;
    s.seq = 1000, s.micro_batch = 3, s.activations = ActivationModel::architecture;
    const std::uint64_t tokens = 3000, k = base.active_experts(), E = base.experts;
    // Each expert's share, rounded up, at most every token (100 x: every token everywhere).
    const auto busiest = static_cast<std::uint64_t>(
        std::ceil(static_cast<double>(tokens * k) * imbalance / static_cast<double>(E)));
    const std::uint64_t dispatched = std::min(tokens, busiest) * E;
    Architecture m = base;
    m.expert_imbalance = imbalance;
    CHECK(m.dispatched_slots(tokens) == (imbalance == 1.0 ? tokens * k : dispatched));
    const auto by_shape = [&](const Report& r, const std::string& symbol) {
        Count sum;
        for (const auto& row : r.layer.rows)
            if (std::string(row.symbol) == symbol) sum += row.bytes;
        return sum.value();
    };
    const Report even = estimate(base, s), uneven = estimate(m, s);
    for (const char* symbol : {"sbk(h)", "sbk(f)"}) {
        CAPTURE(symbol);
        REQUIRE(by_shape(even, symbol) % (tokens * k) == 0);
        CHECK(by_shape(uneven, symbol) ==
              by_shape(even, symbol) / (tokens * k) * m.dispatched_slots(tokens));
    }
    // The router's rows are per token and expert: as they were.
    CHECK(by_shape(uneven, "sbE") == by_shape(even, "sbE"));
    // The loss step holds every layer's: more with any imbalance.
    const auto loss = [](const Report& r) {
        for (const Step& step : r.timeline())
            if (step.phase == Phase::loss) return step.bytes.total().value();
        return std::uint64_t{0};
    };
    CHECK((loss(uneven) > loss(even)) == (imbalance > 1.0));
}

TEST_CASE(
    "the option --expert-imbalance and the model-file key expert_imbalance: one figure, bad values "
    "named",
    "[moe][imbalance][cli]") {
    const auto option =
        testing::memcalc("--preset mixtral-8x7b --seq 512 --expert-imbalance 1.5 --format json");
    REQUIRE(option.status == 0);
    const auto document = nlohmann::json::parse(option.out);
    CHECK(document["settings"]["expert_imbalance"] == 1.5);
    const auto dense = testing::memcalc("--preset llama-7b --seq 512 --format json");
    CHECK(nlohmann::json::parse(dense.out)["settings"]["expert_imbalance"].is_null());
    const Architecture read =
        cli::parse_model_json(R"({"name": "m", "hidden": 64, "layers": 2, "heads": 4, "ffn": 128,
                                 "vocab": 100, "experts": 4, "experts_per_token": 2,
                                 "expert_imbalance": 1.5})",
                              "m.json", "m")
            .architecture;
    CHECK(read.expert_imbalance == 1.5);
    using Case = std::pair<std::string, std::string>;
    const auto [args, message] = GENERATE(table<std::string, std::string>({
        Case{"--preset mixtral-8x7b --expert-imbalance 0.9",
             "--expert-imbalance must be a number from 1 to 1e6 (got '0.9')"},
        Case{"--preset mixtral-8x7b --expert-imbalance nan",
             "--expert-imbalance must be a number from 1 to 1e6 (got 'nan')"},
        Case{"--preset llama-7b --expert-imbalance 2",
             "--expert-imbalance 2: llama-7b has no mixture-of-experts layer"},
    }));
    CAPTURE(args);
    const auto bad = testing::memcalc(args + " --seq 512");
    CHECK(bad.status == 2);
    CHECK(bad.out.empty());
    CHECK(bad.err == "memcalc: " + message + "\n");
}
