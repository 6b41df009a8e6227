// The step as real training loops run it: accumulated gradients, persistent gradient buffers, the
// checkpointed input counted once, expert and context sharding under ZeRO, offload, uneven stages.
#include <catch2/catch.hpp>

#include <algorithm>

#include "fixtures.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/plan.hpp"

using namespace memcalc;

namespace {
Report run(const Architecture& m, std::uint64_t seq, Recompute mode, const Parallelism& p,
           GradBuffer buffer = GradBuffer::lazy, const char* recipe = "mixed-adam") {
    Settings s;
    s.seq = seq, s.recompute = mode, s.parallel = p, s.framework.grad_buffer = buffer,
    s.recipe = builtin_recipe(recipe);
    return estimate(m, s);
}
std::uint64_t peak(const Report& r) { return r.peak_step().bytes.total().value(); }
using fixtures::step_named;
std::uint64_t up(std::uint64_t n, std::uint64_t by) { return (n + by - 1) / by; }
Architecture llama_405b() {
    Architecture m = fixtures::llama_7b();
    m.name = "llama-405b", m.hidden = 16384, m.layers = 126, m.heads = 128, m.kv_heads = 8,
    m.ffn = 53248;
    m.vocab = 128256;
    return m;
}
}  // namespace

TEST_CASE(
    "accumulated gradients: from micro-batch 2 on every gradient is held, exactly, per ZeRO stage",
    "[training-loop][accumulation]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::mistral_7b(), fixtures::gpt2_small());
    const unsigned zero = GENERATE(0u, 1u, 2u, 3u);
    const std::uint64_t M = GENERATE(2, 3, 8);
    CAPTURE(m.name, zero, M);
    Parallelism p;
    p.dp = 8, p.zero = zero;
    const Report one = run(m, 1024, Recompute::selective, p);
    p.microbatches = M;
    const Report many = run(m, 1024, Recompute::selective, p);
    const ParameterTable& t = *one.parameters;
    const std::uint64_t L = m.layers, g = 2;
    const std::uint64_t input = t.group(Group::input).value(), layer = t.per_layer().value();
    // What micro-batch 2 holds at its first backward step beyond what micro-batch 1 held there:
    // every layer's and the embeddings' gradients (ZeRO-2/3: this rank's reduce-scattered shard of
    // them), and for a tied table the head's fresh gradient of it, which autograd keeps until the
    // embedding's backward adds its own (measured by validation/gpu/replicate.py --microbatches 2).
    // (With ZeRO-2/3 micro-batch 1 holds that whole table's gradient too: only its shard is counted
    // among the gradients, and it is sharded once the embedding's backward hands it over.)
    const std::uint64_t tied = m.tied_embeddings && zero < 2 ? m.vocab * m.hidden * g : 0;
    const std::uint64_t added =
        tied + (zero >= 2 ? (up(input, 8) + L * up(layer, 8)) * g : (input + L * layer) * g);
    const std::string top = "backward " + std::to_string(L);
    const Step& first = step_named(many.busiest(), top);
    const Step& later = step_named(many.busiest(), top + " of micro-batch 2");
    CHECK(later.bytes.gradients.value() - first.bytes.gradients.value() == added);
    CHECK(later.bytes.total().value() - first.bytes.total().value() == added);
    // Micro-batch 1 is the one-micro-batch step; every later micro-batch is alike.
    CHECK(first.bytes.total() == step_named(one.busiest(), top).bytes.total());
    if (m.tied_embeddings && zero >= 2) {
        const std::uint64_t head = t.group(Group::head).value();
        CHECK(first.bytes.gradients.value() ==
              up(head, 8) * g + m.vocab * m.hidden * g + layer * g);  // + the bucket
    }
    CHECK(peak(many) >= peak(one));
    if (M > 2) {
        p.microbatches = 2;
        CHECK(peak(run(m, 1024, Recompute::selective, p)) == peak(many));
    }
    if (peak(many) > peak(one)) CHECK(many.peak_step().microbatch == 2);
}

TEST_CASE(
    "a loop that holds its logits keeps the previous micro-batch's until the next forward returns",
    "[training-loop][accumulation]") {
    Parallelism p;
    p.microbatches = 2;
    const std::uint64_t sbV = 1024ULL * 32000;
    const Report formula = run(fixtures::llama_7b(), 1024, Recompute::full, p);
    CHECK(step_named(formula.busiest(), "forward 1").bytes.logits.value() == 0);
    CHECK(step_named(formula.busiest(), "forward 1 of micro-batch 2").bytes.logits.value() ==
          2 * sbV);
    CHECK(step_named(formula.busiest(), "loss of micro-batch 2").bytes.total().value() ==
          step_named(formula.busiest(), "loss").bytes.total().value() + 2 * sbV +
              2 * formula.parameter_count.value());  // and every gradient, held
    // The architecture model: the previous logits live beside the loss's fp32 copy of the new ones
    // (its forward), not into its backward, whose two fp32 gradients of the logits are larger.
    Settings s;
    s.seq = 1024, s.recompute = Recompute::full, s.parallel = p,
    s.activations = ActivationModel::architecture;
    const Report arch = estimate(fixtures::llama_7b(), s);
    const std::uint64_t mask = saved_bytes(arch.forward_buffers).value();
    CHECK(step_named(arch.busiest(), "loss").bytes.workspace.value() == 8 * sbV + mask);
    CHECK(step_named(arch.busiest(), "loss of micro-batch 2").bytes.workspace.value() ==
          std::max(4 * sbV + mask + 2 * sbV, 8 * sbV + mask));
    CHECK(step_named(arch.busiest(), "forward 1 of micro-batch 2").bytes.logits.value() == 2 * sbV);
}

TEST_CASE("the chapter's step grows by the held gradients with 4 micro-batches",
          "[training-loop][accumulation]") {
    Parallelism p;
    p.microbatches = 4;
    const Report r = run(fixtures::llama_7b(), 4096, Recompute::selective, p);
    const std::uint64_t P = 6738415616ULL, head = 4096 + 32000ULL * 4096;
    CHECK(peak(r) == 116095778816ULL + 2 * (P - head));
    CHECK(r.peak_step().name() == "backward 32 of micro-batch 2");
    CHECK(r.peak_step().microbatch == 2);
}

TEST_CASE(
    "a persistent gradient buffer is live at every step; a lazy one appears as backward writes it",
    "[training-loop][grad-buffer]") {
    const Architecture m = fixtures::llama_7b();
    Parallelism p;
    const Report lazy = run(m, 2048, Recompute::full, p);
    const Report persistent = run(m, 2048, Recompute::full, p, GradBuffer::persistent);
    const std::uint64_t P = lazy.parameter_count.value();
    CHECK(step_named(lazy.busiest(), "forward 1").bytes.gradients.value() == 0);
    CHECK(step_named(persistent.busiest(), "forward 1").bytes.gradients.value() == 2 * P);
    CHECK(step_named(persistent.busiest(), "backward 32").bytes.gradients.value() == 2 * P);
    // One micro-batch with a persistent buffer peaks as any later micro-batch does with a lazy one.
    p.microbatches = 4;
    CHECK(peak(persistent) == peak(run(m, 2048, Recompute::full, p)));
    CHECK(peak(persistent) > peak(lazy));
    // Megatron-LM's main_grad is fp32: with its recipe the buffer is 4 B per parameter.
    const Report megatron = run(m, 2048, Recompute::full, Parallelism{}, GradBuffer::persistent,
                                "mixed-adam-fp32-grads");
    CHECK(step_named(megatron.busiest(), "forward 1").bytes.gradients.value() == 4 * P);
    // ZeRO-2: this rank's shard for the whole run, and the bucket a backward step fills.
    p = {};
    p.dp = 4, p.zero = 2;
    const Report sharded = run(m, 2048, Recompute::full, p, GradBuffer::persistent);
    const std::uint64_t layer = sharded.parameters->per_layer().value();
    CHECK(step_named(sharded.busiest(), "backward 32").bytes.gradients.value() ==
          step_named(sharded.busiest(), "forward 1").bytes.gradients.value() + 2 * layer);
}

TEST_CASE(
    "a pipeline's later micro-batches hold the gradients, with one fewer micro-batch left to start",
    "[training-loop][pipeline]") {
    const Architecture m = fixtures::llama_7b();
    Parallelism p;
    p.pp = 4, p.microbatches = GENERATE(4, 8);
    const Report r = run(m, 2048, Recompute::selective, p);
    const Count layer = r.layer.kept(Recompute::selective);
    // Stage 0 at its last forward step: 1F1B holds min(P, M) micro-batches for micro-batch 1, and
    // min(P, M - 1) for micro-batch 2 (the most any later one holds).
    const std::uint64_t later = std::min<std::uint64_t>(4, p.microbatches - 1);
    CHECK(step_named(r.ranks[0], "forward 8").bytes.kept_activations == Count(4 * 8) * layer);
    CHECK(step_named(r.ranks[0], "forward 8 of micro-batch 2").bytes.kept_activations ==
          Count(later * 8) * layer);
    for (const auto& k : r.ranks) {
        CAPTURE(k.stage);
        const std::string name = "backward " + std::to_string(k.layer_ids.back());
        CHECK(step_named(k, name + " of micro-batch 2").bytes.gradients >
              step_named(k, name).bytes.gradients);
    }
}

TEST_CASE("expert state shards over the expert-data-parallel group, dense state over dp x cp",
          "[training-loop][sharding]") {
    const Architecture moe = fixtures::mixtral();
    const unsigned zero = GENERATE(1u, 2u, 3u);
    const std::uint64_t ep = GENERATE(1, 2, 8);
    CAPTURE(zero, ep);
    Parallelism p;
    p.dp = 8, p.ep = ep, p.zero = zero;
    const Report r = run(moe, 1024, Recompute::full, p);
    const std::uint64_t P = r.parameter_count.value();
    const std::uint64_t experts = 32ULL * 8 * 3 * 4096 * 14336, dense = P - experts;
    // Every rank holds dense / dp and, of its experts / ep, a 1 / (dp / ep) share of the state.
    const std::uint64_t shard = up(dense, 8) + up(experts / ep, 8 / ep);
    const TrainingState& s = r.busiest().state;
    CHECK(s.optimizer_state.value() == 8 * shard);
    CHECK(s.master_weights.value() == 4 * shard);
    // Summed over the ranks, nothing of the model's state is lost.
    CHECK(8 * s.total().value() >= 16 * P);
    if (ep == 8 && zero == 3)
        CHECK(s.total().value() == 93405585408ULL);  // each expert's state whole

    // Context-parallel ranks hold the same weights: ZeRO shards over dp x cp.
    Parallelism c;
    c.dp = 2, c.cp = 4, c.zero = zero;
    const Report llama = run(fixtures::llama_7b(), 8192, Recompute::full, c);
    const std::uint64_t L = llama.parameter_count.value();
    CHECK(llama.busiest().state.optimizer_state.value() == 8 * up(L, 8));
    CHECK(8 * llama.busiest().state.total().value() >= 16 * L);
}

TEST_CASE("ZeRO-Offload moves partitioned gradients to the host as DeepSpeed does",
          "[training-loop][offload]") {
    const Architecture m = fixtures::mistral_7b();
    Parallelism p;
    p.zero = 2, p.offload = Offload::optimizer;
    const Report r = run(m, 4096, Recompute::full, p);
    const std::uint64_t P = r.parameter_count.value(), layer = r.parameters->per_layer().value();
    // DeepSpeed's own estimate for one GPU: 2P, the bf16 weights.
    CHECK(r.busiest().state.total().value() == 2 * P);
    CHECK(r.busiest().state.total().value() == 14483464192ULL);
    // Host: fp32 master copy, Adam's moments and an fp32 copy of the gradients.
    CHECK(r.busiest().host.value() == 16 * P);
    const RankReport& k = r.busiest();
    CHECK(step_named(k, "forward 1").bytes.gradients.value() == 0);
    CHECK(step_named(k, "backward 32").bytes.gradients.value() ==
          2 * layer);  // the bucket in flight
    CHECK(step_named(k, "optimizer").bytes.gradients.value() == 0);
    // ZeRO-1 reduces at the end of backward: its gradients stay on the device until then.
    p.zero = 1, p.dp = 2;
    const Report z1 = run(m, 4096, Recompute::full, p);
    CHECK(z1.busiest().state.gradients.value() == 2 * P);
    CHECK(z1.busiest().host.value() == 16 * up(P, 2));
    p.zero = 0, p.dp = 1;
    CHECK_THROWS_WITH(run(m, 4096, Recompute::full, p),
                      Catch::Contains("offloading the optimizer needs a ZeRO stage"));
}

TEST_CASE("uneven pipeline stages: Llama 3.1 405B's 126 layers on 16 stages",
          "[training-loop][pipeline]") {
    const Architecture m = llama_405b();
    Parallelism p;
    p.pp = 16;
    // Neither end given: the split plan makes (stage_split), assumed and said so.
    const Report assumed = run(m, 1024, Recompute::full, p);
    CHECK(assumed.stage_split_assumed);
    CHECK(assumed.ranks[0].layer_ids.size() == 7);
    p.first_stage_layers = 7, p.last_stage_layers = 7;
    const Report r = run(m, 1024, Recompute::full, p);
    CHECK_FALSE(r.stage_split_assumed);
    CHECK(assumed.peak_step().bytes.total() == r.peak_step().bytes.total());
    REQUIRE(r.ranks.size() == 16);
    CHECK(r.ranks[0].layer_ids.size() == 7);
    CHECK(r.ranks[0].layer_ids.front() == 1);
    CHECK(r.ranks[1].layer_ids.front() == 8);
    CHECK(r.ranks[1].layer_ids.size() == 8);
    CHECK(r.ranks[15].layer_ids.back() == 126);
    CHECK(r.ranks[15].layer_ids.size() == 7);
    Count total;
    for (const auto& k : r.ranks) total += k.parameters;
    CHECK(total == r.parameter_count);
    // The second stage (8 layers, 15 micro-batches in flight) outweighs the first (7 layers, 16).
    CHECK(r.busiest().stage == 1);
    // The closed form finds the same device and peak as the built timelines.
    const ActivationTables t =
        activation_tables(m, 1024, 1, DType::bf16, ActivationModel::korthikanti);
    const Workload w = make_workload(m, *find_recipe("mixed-adam"), 1024, 1, Recompute::full,
                                     parameter_splits(*r.parameters, m.vocab), t);
    const LayoutPeak closed = layout_peak(w, p);
    CHECK(closed.stage == r.busiest().stage);
    CHECK(closed.bytes() == r.timeline()[r.peak()].bytes.total());
    // Only the first stage given: the other 15 split the rest.
    p.last_stage_layers = 0, p.first_stage_layers = 6;
    CHECK(run(m, 1024, Recompute::full, p).ranks[15].layer_ids.size() == 8);
    p.first_stage_layers = 7;
    CHECK_THROWS_WITH(run(m, 1024, Recompute::full, p),
                      Catch::Contains("cannot split the remaining 119 layers"));
    p.first_stage_layers = 200;
    CHECK_THROWS_WITH(run(m, 1024, Recompute::full, p), Catch::Contains("exceeds layers (126)"));
    p.first_stage_layers = 5, p.last_stage_layers = 9, p.vpp = 2;  // vpp chunks a stage
    CHECK_THROWS_WITH(run(m, 1024, Recompute::full, p),
                      Catch::Contains("first_stage_layers (5) must be a multiple of vpp (2)"));
    // Ends a layer short of the others' 8, the embedding and the loss counted as layers (Llama 3's
    // 405B run): interleaved, the short chunks as long as the others', the closed form the loop's.
    p.first_stage_layers = 7, p.last_stage_layers = 7, p.microbatches = 16;
    for (std::uint64_t vpp : {2, 4, 8}) {
        p.vpp = vpp;
        const auto interleaved = run(m, 1024, Recompute::full, p);
        CHECK(interleaved.ranks[0].layer_ids.size() == 7);
        CHECK(interleaved.ranks[1].layer_ids.size() == 8);
        const LayoutPeak peak = layout_peak(w, p);
        CHECK(peak.bytes() == interleaved.peak_step().bytes.total());
    }
}

TEST_CASE("plan splits stages the way the 405B run did when pp does not divide the layers",
          "[training-loop][plan]") {
    using Split = std::pair<std::uint64_t, std::uint64_t>;
    CHECK(stage_split(126, 16, 0, 0) == Split{7, 7});
    CHECK(stage_split(32, 4, 0, 0) == Split{0, 0});
    CHECK(stage_split(126, 4, 0, 0) == Split{31, 31});
    CHECK(stage_split(125, 16, 0, 0) ==
          Split{6, 7});  // 125 - 14 x 8 = 13: the last stage takes the odd one
    CHECK(stage_split(61, 16, 0, 0) == Split{2, 3});  // DeepSeek-V3
    CHECK_FALSE(stage_split(17, 16, 0, 0));           // 14 stages of 2 are already more than 17
    CHECK(stage_split(32, 4, 5, 0) == Split{5, 0});
    CHECK_FALSE(stage_split(32, 4, 6, 0));  // 26 layers over 3 stages
    PlanRequest q;
    q.gpus = 16, q.capacity = Count(1ULL << 50), q.base.seq = 1024, q.global_batch = 32,
    q.max_tp = 1;
    bool seen = false;
    for (const PlanRow& row : plan(llama_405b(), q))
        if (row.parallel.pp == 16) {
            seen = true;
            CHECK(row.parallel.first_stage_layers == 7);
            CHECK(row.parallel.last_stage_layers == 7);
        }
    CHECK(seen);
}

TEST_CASE(
    "a later micro-batch's fresh weight gradient: at a linear's backward, none at the ops without "
    "weights",
    "[training-loop][accumulation][workspace]") {
    // Measured (peak_live.py, 2 micro-batches): at the softmax's and the activation's backward
    // autograd has already added the output and down projections' gradients into the held ones; the
    // down projection's own backward holds its fresh one beside its input's gradient (counted as
    // the layer's largest, leaning high). Widths no validation model has; a short sequence makes
    // the MLP's backward the layer's largest, a long one the softmax's.
    Architecture gpt = fixtures::gpt2_small(), llama = fixtures::llama_7b();
    gpt.hidden = 96, gpt.heads = 3, gpt.ffn = 320, gpt.hidden_dropout = 0.1;
    llama.hidden = 128, llama.heads = 4, llama.kv_heads = 2, llama.ffn = 352;
    const Architecture m = GENERATE_COPY(gpt, llama);
    const std::uint64_t seq = GENERATE(16, 48, 700);
    const Platform platform = GENERATE(Platform::cuda, Platform::cpu);
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    const Recompute mode = GENERATE(Recompute::none, Recompute::full);
    CAPTURE(m.name, seq, platform == Platform::cpu, attention == Attention::flash,
            recompute_name(mode));
    Framework f;
    f.platform = platform, f.attention = attention;
    const Recipe recipe = builtin_recipe("bf16-adam");
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    const ActivationTables t =
        activation_tables(m, seq, 1, recipe.precision(), ActivationModel::architecture, f);
    const Workload w = make_workload(m, recipe, seq, 1, mode, params, t, f);
    const Parallelism whole;
    const TimelineInputs in = stage_inputs(w, whole, stage_facts(w, whole, 0));
    const std::uint64_t fresh = params->fresh_gradient[0].on_rank(whole, m.vocab).value() * 2;
    CHECK(fresh >= m.hidden * m.ffn * 2);
    const auto& effects = w.layers[0].backward_work;
    REQUIRE(effects.size() ==
            std::size_t(std::count_if(t.layer.work.begin(), t.layer.work.end(),
                                      [](const Workspace& w) { return w.backward; })));
    Count most, weightless_most, down;
    for (std::size_t i = 0; i < effects.size(); ++i) {
        const Workspace& work = t.layer.work[effects[i].source];
        CAPTURE(std::string(work.op));
        const bool linear = Text(work.op) == Text("down projection backward");
        CHECK(work.weightless() == !linear);
        // Its input's gradient, and after a residual dropout its output's.
        if (linear)
            CHECK(work.bytes.value() == seq * (m.ffn + (m.hidden_dropout > 0 ? m.hidden : 0)) * 2);
        const Count without = effects[i].on_rank(whole, m.vocab, 0);
        most = std::max(most, effects[i].on_rank(whole, m.vocab, linear ? fresh : 0));
        if (linear)
            down = effects[i].on_rank(whole, m.vocab, fresh);
        else
            weightless_most = std::max(weightless_most, without);
    }
    CHECK(down > Count(fresh));  // the fresh gradient and (part of) its input's
    CHECK(in.layer[0].backward_work_held == most);
    CHECK(in.layer[0].backward_work_held == std::max(down, weightless_most));
    if (seq == 700 && attention == Attention::eager)
        CHECK(in.layer[0].backward_work_held == weightless_most);
}

TEST_CASE(
    "autocast, gradients held: an op without weights no longer holds the copies its linears' "
    "backward freed",
    "[training-loop][accumulation][workspace]") {
    // Measured (cpu-amp.json, 2 micro-batches, GPT-2 selective +1.2% before): at the softmax's
    // backward of micro-batch 2 the output and MLP projections' bf16 copies are gone, as in
    // micro-batch 1, where the gradients written stand in for them. Widths no validation model has;
    // at these lengths the softmax's backward is the layer's largest.
    Architecture m = fixtures::gpt2_small();
    m.hidden = 96, m.heads = 3, m.ffn = 320, m.attention_dropout = 0, m.hidden_dropout = 0;
    const std::uint64_t seq = GENERATE(500, 900);
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const Platform platform = GENERATE(Platform::cuda, Platform::cpu);
    CAPTURE(seq, recompute_name(mode), platform == Platform::cpu);
    Framework f;
    f.platform = platform, f.attention = Attention::eager;
    const auto params = parameter_splits(parameter_table(m), m.vocab);
    // The layer's largest backward workspace with gradients held, and the softmax's backward
    // effect.
    const auto held_work = [&](const char* recipe) {
        const Recipe r = builtin_recipe(recipe);
        const ActivationTables t =
            activation_tables(m, seq, 1, r.precision(), ActivationModel::architecture, f);
        const Workload w = make_workload(m, r, seq, 1, mode, params, t, f);
        std::pair<Count, WorkspaceEffect> out;
        for (const WorkspaceEffect& e : w.layers[0].backward_work)
            if (Text(t.layer.work[e.source].op) == Text("softmax backward")) out.second = e;
        const Parallelism whole;
        out.first = stage_inputs(w, whole, stage_facts(w, whole, 0)).layer[0].backward_work_held;
        return out;
    };
    const auto [amp, softmax] = held_work("amp-adam");
    const Parallelism whole;
    const std::uint64_t copies =
        (96 * 96 + 96) + (96 * 320 + 320) + (320 * 96 + 96);  // o_proj, up and down, with biases
    CHECK(softmax.weightless);
    CHECK(softmax.cast_freed.on_rank(whole, m.vocab).value() == copies);
    CHECK(amp.value() == softmax.on_rank(whole, m.vocab, 0).value() - 2 * copies);
    // Without autocast no weight has a copy: nothing to take off.
    const auto [bf16, plain_softmax] = held_work("bf16-adam");
    CHECK(plain_softmax.cast_freed.on_rank(whole, m.vocab).value() ==
          copies);  // the weights' tensors, whatever the recipe
    CHECK(bf16 == plain_softmax.on_rank(whole, m.vocab, 0));
}
