// Parallelism against the papers' own figures and formulas, through the general code path.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {
Report run(const Architecture& m, std::uint64_t seq, std::uint64_t batch, Recompute mode,
           const Parallelism& p) {
    Settings settings;
    settings.seq = seq, settings.micro_batch = batch, settings.recompute = mode,
    settings.parallel = p;
    return estimate(m, settings);
}
Architecture gpt3_175b() {  // GPT-3 175B's layer: h = 12288, a = 96
    Architecture m;
    m.name = "gpt3", m.hidden = 12288, m.layers = 96, m.heads = 96, m.ffn = 4 * 12288,
    m.vocab = 51200;
    return m;
}
Architecture small_llama_8kv() {
    Architecture m = fixtures::llama_7b();
    m.name = "small-llama", m.layers = 16, m.hidden = 2048, m.heads = 16, m.kv_heads = 8,
    m.ffn = 5632;
    return m;
}
Parallelism layout(std::uint64_t dp, std::uint64_t tp, std::uint64_t pp, unsigned zero = 0,
                   bool sp = false) {
    Parallelism p;
    p.dp = dp, p.tp = tp, p.pp = pp, p.zero = zero, p.sequence_parallel = sp;
    return p;
}
}  // namespace

TEST_CASE(
    "ZeRO's 7.5B-parameter example at 64-way data parallelism (Rajbhandari et al. 2020, Figure 1)",
    "[parallel][zero]") {
    using Row = std::tuple<unsigned, std::uint64_t>;
    const auto [stage, bytes] = GENERATE(table<unsigned, std::uint64_t>({
        Row{0, 120000000000ULL},  // baseline: (2 + 2 + K) psi = 16 x 7.5B = 120 GB
        Row{1, 31406250000ULL},   // P_os: 2 psi + 2 psi + K psi / N = 31.4 GB
        Row{2, 16640625000ULL},   // P_os+g: 2 psi + (2 + K) psi / N = 16.6 GB
        Row{3, 1875000000ULL},    // P_os+g+p: (2 + 2 + K) psi / N = 1.9 GB
    }));
    CAPTURE(stage);
    CHECK(sharded_state(7500000000ULL, *find_recipe("mixed-adam"), stage, 64).total().value() ==
          bytes);
}

TEST_CASE("every rank's state under ZeRO follows the sharding of its own parameters",
          "[parallel][zero]") {
    const Architecture m = fixtures::llama_7b();
    const Report one = run(m, 1024, 1, Recompute::full, layout(1, 1, 1));
    for (unsigned zero = 0; zero <= 3; ++zero) {
        CAPTURE(zero);
        const Report r = run(m, 1024, 1, Recompute::full, layout(8, 1, 1, zero));
        CHECK(r.ranks.size() == 1);
        CHECK(r.busiest().state.total() ==
              sharded_state(one.parameter_count, r.settings.recipe, zero, 8).total());
        CHECK(r.peak_step().bytes.total() <= one.peak_step().bytes.total());
    }
    // Hybrid sharding: shard within groups of 4, replicate across the two groups.
    Parallelism hybrid = layout(8, 1, 1, 3);
    hybrid.shard_group = 4;
    CHECK(run(m, 1024, 1, Recompute::full, hybrid).busiest().state.total() ==
          sharded_state(one.parameter_count, one.settings.recipe, 3, 4).total());
}

TEST_CASE("ZeRO-3 gathers each layer's weights for forward and backward, not for the optimizer",
          "[parallel][zero]") {
    const Architecture m = fixtures::llama_7b();
    const Report r = run(m, 1024, 1, Recompute::full, layout(8, 1, 1, 3));
    const Count layer_weights = r.parameters->per_layer() * 2;  // bf16
    // The embedding in forward 1 and backward 1, the head (and the final norm) at the loss and
    // backward L: whole, beyond the eighth this rank keeps (bf16).
    const auto beyond_shard = [](std::uint64_t bytes) { return bytes - (bytes + 7) / 8; };
    const std::uint64_t input = beyond_shard(m.vocab * m.hidden * 2),
                        head = beyond_shard((m.vocab + 1) * m.hidden * 2);
    const auto root = [&](const Step& step) -> std::uint64_t {
        const bool first = step.name() == "forward 1" || step.name() == "backward 1";
        const bool last = step.name() == "loss" || step.name() == "backward 32";
        return first ? input : last ? head : 0;
    };
    for (const auto& step : r.timeline()) {
        CAPTURE(step.name());
        if (step.phase == Phase::forward || step.phase == Phase::backward)
            CHECK(step.bytes.gathered_weights.value() ==
                  2 * layer_weights.value() + root(step));  // the layer and the prefetched next
        else
            CHECK(step.bytes.gathered_weights.value() == root(step));
    }
    // FSDP1's root, not resharded after forward: both from forward 1 to the end of backward.
    Settings kept = r.settings;
    kept.framework.root_gather = RootGather::kept;
    const Report fsdp1 = Estimator(m).estimate(kept);
    for (const auto& step : fsdp1.timeline()) {
        CAPTURE(step.name());
        const std::uint64_t layers =
            step.phase == Phase::forward || step.phase == Phase::backward ? 2 : 0;
        CHECK(step.bytes.gathered_weights.value() ==
              layers * layer_weights.value() + (step.phase == Phase::optimizer ? 0 : input + head));
    }
    // ZeRO-2/3 hold a layer's full gradient until it is reduce-scattered.
    const Step& last_backward = r.timeline()[r.timeline().size() - 2];
    CHECK(last_backward.bytes.gradients >= layer_weights);
}

TEST_CASE(
    "Korthikanti et al. 2022, Table 2: activations per layer under tensor and sequence parallelism",
    "[parallel][tensor]") {
    const Architecture m = GENERATE(gpt3_175b(), fixtures::llama_7b());
    const std::uint64_t t = GENERATE(1, 2, 4, 8);
    const bool sp = GENERATE(false, true);
    const std::uint64_t s = 2048, b = GENERATE(1, 4);
    if (sp && t == 1) return;
    CAPTURE(m.name, t, sp, b);
    const double sbh = static_cast<double>(s * b * m.hidden), as_h = 5.0 * m.heads * s / m.hidden;
    const auto bytes = [&](Recompute mode) {
        return static_cast<double>(
            run(m, s, b, mode, layout(1, t, 1, 0, sp)).layer.kept(mode).value());
    };
    const double T = static_cast<double>(t);
    if (sp) {
        CHECK(bytes(Recompute::none) == Approx(sbh * (34 / T + as_h / T)).epsilon(1e-12));
        CHECK(bytes(Recompute::selective) == Approx(sbh * 34 / T).epsilon(1e-12));
        CHECK(bytes(Recompute::full) ==
              Approx(2 * sbh / T).epsilon(1e-12));  // the layer input is sequence-sharded
    } else {
        CHECK(bytes(Recompute::none) == Approx(sbh * (10 + 24 / T + as_h / T)).epsilon(1e-12));
        CHECK(bytes(Recompute::selective) == Approx(sbh * (10 + 24 / T)).epsilon(1e-12));
        CHECK(bytes(Recompute::full) == Approx(2 * sbh).epsilon(1e-12));
    }
}

TEST_CASE(
    "tensor parallelism splits the matrices, vocabulary-parallel embedding and head, not the norms",
    "[parallel][tensor]") {
    const Architecture m = fixtures::llama_7b();
    const Report r = run(m, 1024, 1, Recompute::full, layout(1, 8, 1));
    // attention 4 h^2 / 8 + MLP 3 h f / 8 + norms 2 h, per layer; embedding and head 32000 / 8 rows
    // each; final norm h
    const std::uint64_t h = 4096, f = 11008;
    CHECK(r.busiest().parameters.value() ==
          2 * 4000 * h + 32 * (4 * h * h / 8 + 3 * h * f / 8 + 2 * h) + h);
    // A vocabulary that tp does not divide is padded: 50257 rows over 4 ranks are 12565 each.
    const Report gpt2 = run(fixtures::gpt2_small(), 1024, 1, Recompute::full, layout(1, 4, 1));
    const std::uint64_t g = 768;
    CHECK(gpt2.busiest().parameters.value() ==
          12565 * g + 1024 * g +
              12 * (2 * 2 * g + (4 * g * g + 3 * g) / 4 + g + (2 * g * 3072 + 3072) / 4 + g) +
              2 * g);
}

TEST_CASE("1F1B: stage k holds min(P - k, M) micro-batches; interleaved: Megatron-LM's warm-up",
          "[parallel][pipeline]") {
    Parallelism p = layout(1, 1, 4);
    p.microbatches = 8;
    CHECK(in_flight(p, 0) == 4);
    CHECK(in_flight(p, 1) == 3);
    CHECK(in_flight(p, 3) == 1);
    p.microbatches = 2;
    CHECK(in_flight(p, 0) == 2);
    CHECK(in_flight(p, 3) == 1);
    // Interleaved, V = 2 chunks per rank: 2 (P - k - 1) + (V - 1) P + 1 chunks, at most M V.
    p.vpp = 2, p.microbatches = 8;
    CHECK(in_flight(p, 0) == 2 * 3 + 4 + 1);
    CHECK(in_flight(p, 3) == 0 + 4 + 1);
    p.microbatches = 2;
    CHECK(in_flight(p, 0) == 4);
    // Megatron's first-stage penalty: L (1 + (P - 1) / (P V)) layers of activations.
    const std::uint64_t L = 32, P = 4, V = 2;
    p.microbatches = 64;
    CHECK(in_flight(p, 0) * (L / (P * V)) * P * V == L * (P * V + P - 1));
    // Stage 0's layers when interleaved: chunks 0 and 2 of 8 layers... of 4 each here.
    CHECK(stage_layers(p, 32, 1) == std::vector<std::uint64_t>{5, 6, 7, 8, 21, 22, 23, 24});
}

TEST_CASE(
    "pipeline stages through the general path: the first holds the most activations, the last the "
    "head",
    "[parallel][pipeline]") {
    const Architecture m = fixtures::llama_7b();
    Parallelism p = layout(1, 1, 4);
    p.microbatches = 8;
    const Report r = run(m, 2048, 1, Recompute::selective, p);
    REQUIRE(r.ranks.size() == 4);
    CHECK(r.ranks[0].holds_embedding);
    CHECK(r.ranks[3].holds_head);
    // Micro-batch 1 and 2 (standing for 2..8): its 8 layers and the loss each, then the optimizer.
    CHECK(r.ranks[3].timeline().size() == 2 * (2 * 8 + 1) + 1);
    CHECK(r.ranks[0].timeline().size() == 2 * (2 * 8) + 1);  // no loss step
    const Count layer = r.layer.kept(Recompute::selective);
    // Stage 0 at its last forward step: 4 micro-batches x 8 layers, the whole model's worth.
    const Step& last_forward = r.ranks[0].timeline()[7];
    CHECK(last_forward.name() == "forward 8");
    CHECK(last_forward.bytes.kept_activations == Count(32) * layer);
    // With the architecture model the first stage also keeps each in-flight micro-batch's token ids
    // and rotary tables, and each other one's causal mask, which the checkpoints it handed it to
    // keep (measured: validation/results/cpu-pipeline-schedules.json).
    Settings settings;
    settings.seq = 2048, settings.recompute = Recompute::selective, settings.parallel = p;
    settings.activations = ActivationModel::architecture;
    const Report a = estimate(m, settings);
    const Count mask = Count(2048) * 2048 * 2;
    CHECK(a.ranks[0].timeline()[7].bytes.kept_activations ==
          Count(32) * a.layer.kept(Recompute::selective) + Count(4) * saved_bytes(a.input_side) +
              Count(3) * mask);
}

TEST_CASE("context parallelism splits every token: a layer's tensors and the logits by cp",
          "[parallel][context]") {
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t cp = GENERATE(2, 4, 8);
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    Parallelism p;
    p.cp = cp;
    const Report one = run(m, 8192, 1, mode, Parallelism{});
    const Report split = run(m, 8192, 1, mode, p);
    CHECK(split.layer.kept(mode).value() * cp == one.layer.kept(mode).value());
    CHECK(split.ranks[0].parameters ==
          one.ranks[0].parameters);  // every context-parallel rank holds the model
    const auto loss_logits = [](const Report& r) {
        for (const auto& step : r.timeline())
            if (step.phase == Phase::loss) return step.bytes.logits.value();
        return std::uint64_t{0};
    };
    CHECK(loss_logits(split) * cp == loss_logits(one));
}

TEST_CASE("expert parallelism splits the experts, not the router or attention",
          "[parallel][experts]") {
    Architecture mixtral = fixtures::mistral_7b();
    mixtral.name = "mixtral", mixtral.experts = 8, mixtral.experts_per_token = 2;
    Parallelism p;
    p.dp = 8, p.ep = GENERATE(2, 4, 8);
    const Report r = run(mixtral, 1024, 1, Recompute::full, p);
    const std::uint64_t expert_params =
        32ULL * 8 * 3 * 4096 * 14336;  // 32 layers of 8 SwiGLU experts
    const std::uint64_t all = r.parameter_count.value();
    CHECK(r.busiest().parameters.value() == all - expert_params + expert_params / p.ep);
}

TEST_CASE("every degree 1 and no sharding is the single device, to the byte", "[parallel]") {
    const Report r = run(fixtures::llama_7b(), 4096, 1, Recompute::selective, Parallelism{});
    CHECK(r.peak_step().bytes.total().value() == 116095778816ULL);
    CHECK(r.ranks.size() == 1);
}

TEST_CASE("sharding and splitting never raise a rank's memory above the single device's",
          "[parallel][property]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), small_llama_8kv());
    const std::uint64_t seq = GENERATE(256, 1024);
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const Report one = run(m, seq, 1, mode, Parallelism{});
    const Count single = one.peak_step().bytes.total();
    for (std::uint64_t dp : {1, 2, 8})
        for (unsigned zero : {0u, 1u, 2u, 3u})
            for (std::uint64_t tp : {1, 2, 4})
                for (bool sp : {false, true})
                    for (std::uint64_t pp : {1, 2, 4}) {
                        if ((sp && tp == 1) || (zero > 0 && dp == 1) || m.heads % tp != 0) continue;
                        CAPTURE(m.name, seq, recompute_name(mode), dp, zero, tp, sp, pp);
                        const Report r = run(m, seq, 1, mode, layout(dp, tp, pp, zero, sp));
                        for (const auto& rank : r.ranks) {
                            CHECK(rank.state.total() <= one.state.total());
                            CHECK(rank.peak_step().bytes.total() <= single);
                        }
                    }
}

TEST_CASE("degrees that do not fit the model are refused with the degree named", "[parallel]") {
    const Architecture m = fixtures::llama_7b();
    CHECK_THROWS_WITH(run(m, 1024, 1, Recompute::none, layout(1, 3, 1)),
                      Catch::Contains("tp (3) must divide heads (32)"));
    // pp 5 splits as plan would (5 + 3 x 7 + 6); 31 stages of 32 layers cannot.
    CHECK(run(m, 1024, 1, Recompute::none, layout(1, 1, 5)).stage_split_assumed);
    CHECK_THROWS_WITH(run(m, 1024, 1, Recompute::none, layout(1, 1, 31)),
                      Catch::Contains("pp (31) must divide layers (32)"));
    CHECK_THROWS_WITH(run(m, 1000, 1, Recompute::none, layout(1, 16, 1, 0, true)),
                      Catch::Contains("cp x tp (sequence parallel) (16) must divide seq (1000)"));
    Parallelism p;
    p.ep = 2;
    CHECK_THROWS_WITH(run(m, 1024, 1, Recompute::none, p),
                      Catch::Contains("ep (2) needs a mixture-of-experts model"));
    p = layout(4, 1, 1, 0);
    p.shard_group = 2;
    CHECK_THROWS_WITH(run(m, 1024, 1, Recompute::none, p),
                      Catch::Contains("shard_group needs a ZeRO stage"));
}

TEST_CASE("the closed-form layout peak equals the most loaded timeline's, step for step",
          "[parallel][fast]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), small_llama_8kv());
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const ActivationModel model =
        GENERATE(ActivationModel::korthikanti, ActivationModel::architecture);
    for (std::uint64_t tp : {1, 2, 4})
        for (std::uint64_t pp : {1, 2, 4})
            for (unsigned zero : {0u, 1u, 3u})
                for (std::uint64_t vpp : {1, 2}) {
                    if (m.heads % tp != 0 || (vpp > 1 && pp == 1) || m.layers % (pp * vpp) != 0)
                        continue;
                    Parallelism p = layout(4, tp, pp, zero, tp > 1);
                    p.vpp = vpp;
                    p.microbatches = 3;
                    Settings settings;
                    settings.seq = 512, settings.micro_batch = 2, settings.recompute = mode,
                    settings.activations = model;
                    settings.parallel = p;
                    CAPTURE(m.name, recompute_name(mode), tp, pp, zero, vpp);
                    const Report r = estimate(m, settings);
                    const ActivationTables t = activation_tables(m, 512, 2, DType::bf16, model);
                    const Workload w = make_workload(m, r.settings.recipe, 512, 2, mode,
                                                     parameter_splits(*r.parameters, m.vocab), t);
                    const LayoutPeak fast = layout_peak(w, p);
                    CHECK(fast.bytes() == r.peak_step().bytes.total());
                    CHECK(fast.step.name() == r.peak_step().name());
                    CHECK(fast.stage == r.busiest().stage);
                    // The per-rank table the report shows adds up to what the timeline uses.
                    CHECK(r.layer.kept(mode) == w.layers[0].kept.on_rank(p, m.vocab));
                }
}
