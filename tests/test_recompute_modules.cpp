// Megatron-LM's recompute_modules (selective recomputation of named parts of a layer) and its
// expert tensor parallelism (etp), against closed forms of the architecture's rows.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
Settings architecture_settings(std::uint64_t seq, ModuleSet modules,
                               Recompute mode = Recompute::selective) {
    Settings s;
    s.seq = seq, s.recompute = mode, s.recompute_modules = modules;
    s.activations = ActivationModel::architecture;
    return s;
}
/// Mixtral's layers, the first two of them dense (as DeepSeek's are) with a wider MLP.
Architecture mixtral_dense_then_moe() {
    Architecture m = fixtures::mixtral();
    m.name = "dense-then-moe", m.layers = 8;
    m.layer_kinds = {{"dense", 28672, 0, {}}, {"moe", {}, {}, {}}};
    m.layer_pattern = {{0, 2}, {1, 6}};
    return m;
}
LayerActivations layer_with(const Architecture& m, std::uint64_t s, ModuleSet modules,
                            Attention attention = Attention::eager) {
    return architecture_layer(m, s, 1, DType::bf16, attention, Platform::cuda, modules);
}
}  // namespace

TEST_CASE("recompute_modules core_attn is Korthikanti's selective recomputation, row for row",
          "[recompute_modules]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(),
                                    fixtures::mixtral(), mixtral_dense_then_moe());
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    CAPTURE(m.name, attention_name(attention));
    // The modules' own checkpoint rows leave the table: the rest is what 1.1 built.
    const Architecture layer = m.layer_kinds.empty() ? m : m.kind_view(0);
    const LayerActivations built =
        architecture_layer(layer, 512, 2, DType::bf16, attention, Platform::cuda, ModuleSet{0});
    const LayerActivations core = architecture_layer(layer, 512, 2, DType::bf16, attention);
    std::size_t checkpoints = 0;
    Count checkpoint_bytes;
    for (const auto& r : built.rows)
        if (r.role == ModuleRole::checkpoint) ++checkpoints, checkpoint_bytes += r.bytes;
    CHECK(core.rows.size() + checkpoints == built.rows.size());
    for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
        CHECK(core.kept(mode) + (mode == Recompute::selective ? checkpoint_bytes : Count(0)) ==
              built.kept(mode));
        CHECK(core.rebuilt(mode) == built.rebuilt(mode));
    }
    // Through the estimate: the default and core_attn named are one configuration.
    const Report a = estimate(m, architecture_settings(1024, {}));
    const Report b = estimate(m, architecture_settings(1024, ModuleSet::of({Module::core_attn})));
    CHECK(a.peak_step().bytes.total() == b.peak_step().bytes.total());
    CHECK(a.kept_activations == b.kept_activations);
}

TEST_CASE("recompute mlp keeps the MLP's input and drops SwiGLU's four sbf tensors",
          "[recompute_modules]") {
    const std::uint64_t s = GENERATE(128, 1000);
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t f = m.ffn, sb = s;
    const LayerActivations none = layer_with(m, s, ModuleSet::of({Module::mlp}));
    const LayerActivations core = layer_with(m, s, {});
    // gate's output (SiLU's input), SiLU's output, up's output, down's input: 4 x 2 sbf bytes.
    CHECK(none.kept(Recompute::selective).value() == none.total().value() - 8 * sb * f);
    CHECK(none.rebuilt(Recompute::selective).value() == 8 * sb * f);
    const LayerActivations both = layer_with(m, s, ModuleSet::of({Module::core_attn, Module::mlp}));
    CHECK(both.kept(Recompute::selective).value() ==
          core.kept(Recompute::selective).value() - 8 * sb * f);
    // One half at a time: the larger of the attention core's and the MLP's rebuilt rows.
    CHECK(both.rebuilt(Recompute::selective) ==
          std::max(core.rebuilt(Recompute::selective), none.rebuilt(Recompute::selective)));
}

TEST_CASE("recompute layernorm keeps each norm's input and drops its rows and its output",
          "[recompute_modules]") {
    const std::uint64_t s = GENERATE(64, 1000);
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t h = m.hidden;
    const LayerActivations norms = layer_with(m, s, ModuleSet::of({Module::layernorm}));
    // Each RMSNorm: its fp32 copy (4 sbh), 1/rms (4 sb), the normalised input (2 sbh); its output,
    // which the next projections saved (2 sbh); its input, the bf16 residual stream, kept instead
    // (2 sbh).
    CHECK(norms.kept(Recompute::selective).value() ==
          norms.total().value() - 2 * (6 * s * h + 4 * s + 2 * s * h) + 2 * 2 * s * h);
    CHECK(norms.rebuilt(Recompute::selective).value() == 8 * s * h + 4 * s);
    // With the MLP too, the MLP's checkpoint input is the norm's output, discarded all the same.
    const LayerActivations both = layer_with(m, s, ModuleSet::of({Module::layernorm, Module::mlp}));
    CHECK(both.kept(Recompute::selective).value() ==
          norms.kept(Recompute::selective).value() - 8 * s * m.ffn);
}

TEST_CASE("a LayerNorm's input is its checkpoint's: GPT-2 keeps no copy", "[recompute_modules]") {
    const Architecture m = fixtures::gpt2_small();
    const LayerActivations layer = layer_with(m, 256, ModuleSet::of({Module::layernorm}));
    for (const auto& r : layer.rows) CHECK(r.role != ModuleRole::checkpoint);
    // Two norms' statistics (2 x 2 fp32 per token) and two outputs (2 sbh each) are dropped.
    CHECK(layer.kept(Recompute::selective).value() ==
          layer.total().value() - 2 * 8 * 256 - 2 * 2 * 256 * m.hidden);
}

TEST_CASE(
    "recompute moe_act keeps the experts' first projections and drops the activation's outputs",
    "[recompute_modules]") {
    const Architecture m = fixtures::mixtral();
    const std::uint64_t s = 512, slots = s * 2, f = m.ffn;
    const LayerActivations act = layer_with(m, s, ModuleSet::of({Module::moe_act}));
    CHECK(act.kept(Recompute::selective).value() == act.total().value() - 2 * 2 * slots * f);
    // moe drops the whole MoE layer but its input, moe_act inside it too.
    const LayerActivations moe = layer_with(m, s, ModuleSet::of({Module::moe}));
    const LayerActivations both = layer_with(m, s, ModuleSet::of({Module::moe, Module::moe_act}));
    CHECK(both.kept(Recompute::selective) == moe.kept(Recompute::selective));
    CHECK(moe.kept(Recompute::selective) < act.kept(Recompute::selective));
    Count kept_in_moe;
    for (const auto& r : moe.rows)
        if ((r.module == Module::moe || r.module == Module::moe_act) &&
            r.kept(Recompute::selective))
            kept_in_moe += r.bytes;
    CHECK(kept_in_moe.value() == 2 * s * m.hidden);  // the router's input, the norm's output
}

TEST_CASE("recomputing the MLP too lowers what a dense or a mixed model keeps, and its peak",
          "[recompute_modules]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), mixtral_dense_then_moe());
    const Report before = estimate(m, architecture_settings(4096, {}));
    const Report after =
        estimate(m, architecture_settings(4096, ModuleSet::of({Module::core_attn, Module::mlp})));
    const Report norms =
        estimate(m, architecture_settings(
                        4096, ModuleSet::of({Module::core_attn, Module::mlp, Module::layernorm})));
    CAPTURE(m.name);
    CHECK(after.kept_activations < before.kept_activations);
    CHECK(norms.kept_activations < after.kept_activations);
    CHECK(after.peak_step().bytes.total() < before.peak_step().bytes.total());
    CHECK(after.compute.recompute > before.compute.recompute);  // the MLP's matrix products again
}

TEST_CASE("recompute_modules a model or a mode cannot honour is named", "[recompute_modules]") {
    using Case = std::tuple<Architecture, ModuleSet, Recompute, std::string>;
    const auto [m, modules, mode, message] =
        GENERATE(table<Architecture, ModuleSet, Recompute, std::string>({
            Case{fixtures::llama_7b(), ModuleSet::of({Module::moe_act}), Recompute::selective,
                 "recompute module moe_act: llama-7b has no mixture-of-experts layer"},
            Case{fixtures::mixtral(), ModuleSet::of({Module::mlp}), Recompute::selective,
                 "recompute module mlp: mixtral has no dense MLP layer"},
            Case{fixtures::mixtral(), ModuleSet::of({Module::mla_up_proj}), Recompute::selective,
                 "recompute module mla_up_proj: mixtral has no multi-latent attention"},
            Case{fixtures::llama_7b(), ModuleSet::of({Module::mlp}), Recompute::full,
                 "recompute_modules (mlp) needs recompute selective (got full)"},
        }));
    CHECK_THROWS_WITH(estimate(m, architecture_settings(1024, modules, mode)), message);
    CHECK_NOTHROW(
        estimate(mixtral_dense_then_moe(),
                 architecture_settings(1024, ModuleSet::of({Module::mlp, Module::moe_act}))));
}

TEST_CASE("the command line's --recompute-modules: core_attn is --recompute selective",
          "[recompute_modules][cli]") {
    const std::string base =
        "memcalc --preset llama-7b --seq 2048 --activations architecture --recompute selective";
    const auto plain = testing::shell(base + " --format json");
    const auto named = testing::shell(base + " --recompute-modules core_attn --format json");
    REQUIRE(plain.status == 0);
    CHECK(named.out == plain.out);
    const auto mlp = testing::shell(base + " --recompute-modules core_attn,mlp");
    CHECK(mlp.status == 0);
    CHECK(mlp.out != testing::shell(base).out);
    const auto unknown = testing::shell(base + " --recompute-modules core_attn,mpl");
    CHECK(unknown.status != 0);
    CHECK(unknown.out.empty());
    CHECK(unknown.err ==
          "memcalc: --recompute-modules: unknown module 'mpl' (known: core_attn, mlp, moe_act, "
          "layernorm, moe, "
          "shared_experts, mla_up_proj)\n");
    const auto full =
        testing::shell("memcalc --preset llama-7b --recompute full --recompute-modules mlp");
    CHECK(full.status != 0);
    CHECK(full.err == "memcalc: --recompute-modules needs --recompute selective (got 'full')\n");
    const auto dense = testing::shell(base + " --recompute-modules moe_act");
    CHECK(dense.status != 0);
    CHECK(dense.out.empty());
    CHECK(dense.err ==
          "memcalc: recompute module moe_act: llama-7b has no mixture-of-experts layer\n");
}

TEST_CASE("expert tensor parallelism splits the experts' weights by etp, the rest by tp",
          "[parallel][etp]") {
    const Architecture m = GENERATE(fixtures::mixtral(), mixtral_dense_then_moe());
    const std::uint64_t tp = 4, ep = GENERATE(1, 2);
    Settings s = architecture_settings(1024, {}, Recompute::full);
    s.parallel.dp = 2, s.parallel.tp = tp, s.parallel.ep = ep;
    const Report by_tp = estimate(m, s);
    s.parallel.etp = tp;
    const Report same = estimate(m, s);
    CHECK(same.busiest().parameters == by_tp.busiest().parameters);
    CHECK(same.peak_step().bytes.total() == by_tp.peak_step().bytes.total());
    // The experts' weights on a rank, from the parameter table.
    Count experts;
    for (const auto& r : by_tp.parameters->rows)
        if (r.expert) experts += by_tp.parameters->in_model(r);
    REQUIRE(experts.value() % (tp * ep) == 0);
    for (std::uint64_t etp : {1, 2}) {
        CAPTURE(m.name, ep, etp);
        s.parallel.etp = etp;
        const Report r = estimate(m, s);
        CHECK(r.busiest().parameters.value() == by_tp.busiest().parameters.value() -
                                                    experts.value() / (tp * ep) +
                                                    experts.value() / (etp * ep));
        CHECK(r.peak_step().bytes.total() > by_tp.peak_step().bytes.total());
    }
}

TEST_CASE("etp splits the experts' hidden activations, and its bad values are named",
          "[parallel][etp]") {
    const Architecture m = fixtures::mixtral();
    Settings s = architecture_settings(1024, {}, Recompute::none);
    s.parallel.dp = 2, s.parallel.tp = 4;
    const std::uint64_t slots_f = 1024ULL * 2 * m.ffn;
    Count at_tp, at_one;
    for (std::uint64_t etp : {4, 1}) {
        s.parallel.etp = etp;
        const Report r = estimate(m, s);
        Count hidden;
        for (const auto& row : r.layer.rows)
            if (row.split == ActivationSplit::expert_tensor) hidden += row.bytes;
        (etp == 4 ? at_tp : at_one) = hidden;
    }
    CHECK(at_one.value() == 4 * at_tp.value());
    CHECK(at_tp.value() % (slots_f / 4) == 0);
    using Case = std::tuple<Architecture, std::uint64_t, std::uint64_t, std::string>;
    const auto [model, etp, ep,
                message] = GENERATE(table<Architecture, std::uint64_t, std::uint64_t, std::string>({
        Case{fixtures::mixtral(), 3, 1, "etp x ep (3 x 1) must divide tp x cp x dp (4 x 1 x 2)"},
        Case{fixtures::mixtral(), 16, 1, "etp x ep (16 x 1) must divide tp x cp x dp (4 x 1 x 2)"},
        Case{fixtures::llama_7b(), 2, 1, "etp (2) needs a mixture-of-experts model"},
    }));
    Settings bad = s;
    bad.parallel.etp = etp, bad.parallel.ep = ep;
    bad.parallel.dp = ep > 1 ? 2 : bad.parallel.dp;
    CHECK_THROWS_WITH(estimate(model, bad), message);
}

TEST_CASE("the command line's --etp: the layout shows it, a bad value is named",
          "[parallel][etp][cli]") {
    const auto json = testing::shell(
        "memcalc --preset mixtral-8x7b --seq 1024 --dp 2 --tp 4 --etp 1 --format json");
    REQUIRE(json.status == 0);
    CHECK(json.out.find("\"etp\": 1") != std::string::npos);
    const auto table =
        testing::shell("memcalc --preset mixtral-8x7b --seq 1024 --dp 2 --tp 4 --etp 1");
    CHECK(table.out.find("each expert split over etp 1") != std::string::npos);
    const auto bad = testing::shell("memcalc --preset mixtral-8x7b --seq 1024 --tp 4 --etp 8");
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK(bad.err == "memcalc: etp x ep (8 x 1) must divide tp x cp x dp (4 x 1 x 1)\n");
}

TEST_CASE(
    "recompute_modules shared_experts drops the shared expert's own rows and keeps its input, the "
    "router's",
    "[recompute_modules][shared_experts]") {
    Architecture m = fixtures::mixtral();
    m.name = "mixtral-with-shared",
    m.shared_ffn = GENERATE(std::uint64_t{4096}, std::uint64_t{14336});
    m.shared_expert_gate = GENERATE(false, true);
    CAPTURE(m.shared_ffn, m.shared_expert_gate);
    const LayerActivations core = layer_with(m, 512, ModuleSet::of({Module::core_attn}));
    const LayerActivations shared =
        layer_with(m, 512, ModuleSet::of({Module::core_attn, Module::shared_experts}));
    Count inside;
    for (const auto& r : core.rows)
        if (r.module == Module::shared_experts && r.role == ModuleRole::inside &&
            r.kept(Recompute::selective))
            inside += r.bytes;
    // At least the shared MLP's hidden tensors (gate's and up's outputs, the down projection's
    // input).
    CHECK(inside >= Count(512) * m.shared_ffn * 2 * 3);
    CHECK(core.kept(Recompute::selective).value() - shared.kept(Recompute::selective).value() ==
          inside.value());
    // moe checkpoints the whole MoE layer, the shared expert with it.
    CHECK(layer_with(m, 512, ModuleSet::of({Module::core_attn, Module::moe}))
              .kept(Recompute::selective) < shared.kept(Recompute::selective));
    // A model without shared experts is refused, naming the module.
    CHECK_THROWS_WITH(estimate(fixtures::mixtral(),
                               architecture_settings(512, ModuleSet::of({Module::shared_experts}))),
                      Catch::Contains("shared_experts") && Catch::Contains("shared experts"));
}

TEST_CASE(
    "with an expert tensor-parallel degree of its own, ep spans tp x dp, as Megatron's "
    "expert group does",
    "[parallel][etp]") {
    const Architecture m = GENERATE(fixtures::mixtral(), mixtral_dense_then_moe());
    CAPTURE(m.name);
    Settings s = architecture_settings(1024, {}, Recompute::full);
    s.parallel.dp = 2, s.parallel.tp = 2, s.parallel.zero = 1;
    const Report whole = estimate(m, s);  // every expert on each rank, split by tp
    Count experts;
    for (const auto& r : whole.parameters->rows)
        if (r.expert) experts += whole.parameters->in_model(r);
    s.parallel.etp = 1, s.parallel.ep = 4;  // the four ranks of tp x dp hold two experts each
    const Report spanned = estimate(m, s);
    CHECK(spanned.busiest().parameters.value() ==
          whole.busiest().parameters.value() - experts.value() / 2 + experts.value() / 4);
    // Without its own degree the experts follow tp, and ep stays within dp.
    Settings within = s;
    within.parallel.etp = 0;
    CHECK_THROWS_WITH(estimate(m, within), "ep (4) must divide dp (2)");
    s.parallel.ep = 8;
    CHECK_THROWS_WITH(estimate(m, s), "etp x ep (1 x 8) must divide tp x cp x dp (2 x 1 x 2)");
}
