// An fp32 model under torch.autocast (the amp-adam recipe): the residual stream and the norms in
// fp32, each matmul saving its own bf16 copy of its input, and autocast's bf16 copies of the
// weights held from each layer's forward until its backward (until the forward ends, under full
// recomputation). Hand sums on several shapes; validation/results/cpu-amp.json holds the PyTorch
// measurements.
#include <catch2/catch.hpp>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "workspace_named.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"
#include "run_program.hpp"

using namespace memcalc;

namespace {
const Precision amp{DType::bf16, DType::fp32, true};

Settings amp_settings(Recompute mode, LossKernel loss = LossKernel::fp32, std::uint64_t seq = 256) {
    Settings s;
    s.seq = seq, s.micro_batch = 2, s.activations = ActivationModel::architecture,
    s.recompute = mode;
    s.recipe = builtin_recipe("amp-adam");
    s.framework.loss = loss;
    return s;
}
using fixtures::step_named;
std::uint64_t copies_at(const Report& r, const std::string& step) {
    return step_named(r, step).bytes.weight_copies.value();
}
/// The parameters autocast casts in one layer: every linear layer's weight and bias.
std::uint64_t cast_per_layer(const Architecture& m) {
    const std::uint64_t h = m.hidden, f = m.ffn, q = m.heads * m.head_size(),
                        kv = m.key_value_heads() * m.head_size();
    const std::uint64_t matrices =
        h * q + 2 * h * kv + q * h + (m.mlp == Mlp::gated ? 3 : 2) * h * f;
    const std::uint64_t biases = m.bias == Bias::all ? q + 2 * kv + h + f + h : 0;
    return matrices + biases;
}
}  // namespace

TEST_CASE(
    "amp-adam keeps fp32 weights, gradients and moments, computes in bf16, and runs under autocast",
    "[autocast][recipe]") {
    const Recipe& r = builtin_recipe("amp-adam");
    CHECK(r.bytes_per_parameter() == 16);  // 4 + 4 + 8: no master copy, the weights are it
    CHECK(r.master_bytes() == 0);
    CHECK(r.autocast);
    CHECK(r.stream() == DType::fp32);
    CHECK(r.activation_bytes() == 2);
    CHECK_FALSE(builtin_recipe("mixed-adam").autocast);
    CHECK(builtin_recipe("mixed-adam").stream() == DType::bf16);
}

TEST_CASE(
    "under autocast a layer keeps fp32 norms and a bf16 copy of its input for each projection",
    "[autocast][architecture]") {
    const std::uint64_t s = 512, b = 2;
    SECTION("LLaMA-style (RMSNorm, gated MLP, fp32 softmax): 10 sbh more") {
        const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
        CAPTURE(m.name);
        const std::uint64_t sbh = s * b * m.hidden;
        const auto bf16 =
            architecture_layer(m, s, b, DType::bf16, Attention::eager).total().value();
        const auto cast = architecture_layer(m, s, b, amp, Attention::eager).total().value();
        // Each norm's normalised input in fp32 (2 x 2 sbh), q, k and v each casting (4 sbh more),
        // gate and up each casting (2 sbh more); the RMSNorms' fp32 inputs are the stream itself,
        // no copies.
        CHECK(cast - bf16 == 10 * sbh);
    }
    SECTION("GPT-2-style (LayerNorm, plain MLP, bf16 softmax): 8 sbh and 4 as^2b more") {
        const Architecture m = fixtures::gpt2_small();
        const std::uint64_t sbh = s * b * m.hidden, scores = m.heads * s * s * b;
        const auto bf16 =
            architecture_layer(m, s, b, DType::bf16, Attention::eager).total().value();
        const auto cast = architecture_layer(m, s, b, amp, Attention::eager).total().value();
        // LayerNorm inputs in fp32 (2 x 2 sbh), q, k and v each casting (4 sbh); the fp32 mask
        // makes the scores fp32, so softmax keeps fp32 and the matmul over V a bf16 cast of it (4
        // as^2b more).
        CHECK(cast - bf16 == 8 * sbh + 4 * scores);
        // On CPU the LayerNorm statistics follow their fp32 input too: 2 x 2 sb x 2 bytes more.
        const auto bf16_cpu =
            architecture_layer(m, s, b, DType::bf16, Attention::eager, Platform::cpu)
                .total()
                .value();
        const auto cast_cpu =
            architecture_layer(m, s, b, amp, Attention::eager, Platform::cpu).total().value();
        CHECK(cast_cpu - bf16_cpu == 8 * sbh + 4 * scores + 8 * s * b);
    }
    SECTION("the checkpoint of full recomputation is the fp32 layer input") {
        const Architecture m = fixtures::llama_7b();
        CHECK(architecture_layer(m, s, b, amp, Attention::eager).input_bytes.value() ==
              4 * s * b * m.hidden);
    }
}

TEST_CASE(
    "autocast's weight copies live from each layer's forward to its backward, or to the forward's "
    "end "
    "under full recomputation",
    "[autocast][timeline]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), fixtures::mistral_7b());
    CAPTURE(m.name);
    const std::uint64_t layer = 2 * cast_per_layer(m),
                        head = 2 * m.vocab * m.hidden;  // bf16 copies
    const std::string L = std::to_string(m.layers);
    const Report none = estimate(m, amp_settings(Recompute::none));
    const Report full = estimate(m, amp_settings(Recompute::full));
    for (const Report* r : {&none, &full}) {
        CHECK(copies_at(*r, "forward 1") == layer);
        CHECK(copies_at(*r, "forward 3") == 3 * layer);
        // The cache holds them all, with the head's, unless the step's moment is the final norm's
        // backward (the head's gradient written): the head's cast is freed, and under full
        // recomputation the cache's.
        const bool norm_moment = step_named(*r, "loss").bytes.gradients.value() > 0;
        const std::uint64_t saved = r == &none ? m.layers * layer : 0;
        CHECK(copies_at(*r, "loss") == (norm_moment ? saved : m.layers * layer + head));
        CHECK(copies_at(*r, "optimizer") == 0);
    }
    // At 256 tokens an untied head's fp32 gradient, with the final norm's weight, outgrows the
    // loss's backward; at 1,024 the loss's moment holds every cast.
    if (!m.tied_embeddings) {
        const Step& loss = step_named(none, "loss");
        CHECK(loss.bytes.weight_copies.value() == m.layers * layer);
        CHECK(loss.bytes.gradients.value() == 4 * (m.vocab * m.hidden + m.hidden));
    }
    const Report longer = estimate(m, amp_settings(Recompute::none, LossKernel::fp32, 1024));
    CHECK(copies_at(longer, "loss") == m.layers * layer + head);
    CHECK(copies_at(none, "backward " + L) ==
          m.layers * layer);  // the head's is gone by then (measured)
    CHECK(copies_at(none, "backward 3") == 3 * layer);
    CHECK(copies_at(full, "backward " + L) == layer);  // the recomputed layer casts its own again
    CHECK(copies_at(full, "backward 3") == layer);
    // Without autocast there are none.
    Settings plain = amp_settings(Recompute::none);
    plain.recipe = builtin_recipe("mixed-adam");
    const Report mixed = estimate(m, plain);
    CHECK(copies_at(mixed, "loss") == 0);
}

TEST_CASE("autocast runs cross_entropy in fp32: a bf16 loss call gets fp32 log-probabilities",
          "[autocast][loss]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    CAPTURE(m.name);
    const auto head = [&](LossKernel loss) {
        return saved_bytes(estimate(m, amp_settings(Recompute::none, loss)).head).value();
    };
    CHECK(head(LossKernel::bf16) == head(LossKernel::fp32));
    CHECK(head(LossKernel::fp32) - head(LossKernel::fused) == 256 * 2 * m.vocab * 4);
    CHECK(loss_dtype(LossKernel::bf16, DType::bf16) == DType::bf16);  // without autocast, as called
}

TEST_CASE(
    "amp-adam through the program: needs the architecture model; a recipe file can say autocast",
    "[autocast][cli]") {
    // Said with the formula, refused; not said, the recipe takes the architecture model.
    const auto formula =
        testing::memcalc("--preset llama-7b --recipe amp-adam --activations korthikanti");
    CHECK(formula.status == 2);
    CHECK(formula.out.empty());
    CHECK_THAT(formula.err, Catch::Contains("--recipe amp-adam needs --activations architecture"));
    const auto chosen = testing::memcalc("--preset llama-7b --seq 512 --recipe amp-adam");
    CHECK(chosen.status == 0);
    CHECK(chosen.out == testing::memcalc("--preset llama-7b --seq 512 --recipe amp-adam "
                                         "--activations architecture")
                            .out);
    CHECK_THAT(chosen.err, Catch::Contains("--recipe amp-adam takes the architecture model"));

    const std::string args = "--preset llama-7b --seq 2048 --activations architecture --format csv";
    const auto by_name = testing::memcalc(args + " --recipe amp-adam");
    REQUIRE(by_name.status == 0);
    const auto json = testing::memcalc(
        "--preset llama-7b --recipe amp-adam --activations architecture --format json");
    CHECK_THAT(json.out, Catch::Contains("\"weight_copies\""));

    // The listing's row is a recipe file that says the same, autocast included.
    const auto listing = testing::memcalc("recipes --format json");
    REQUIRE(listing.status == 0);
    const std::string path = "autocast_recipe_test.json";
    for (const auto& row : nlohmann::json::parse(listing.out))
        if (row["name"] == "amp-adam") std::ofstream(path) << row.dump();
    const auto by_file = testing::memcalc(args + " --recipe-file " + path);
    CHECK(by_file.status == 0);
    CHECK(by_file.out == by_name.out);

    std::ofstream(path)
        << R"({"name": "bad", "weights": "fp32", "gradients": "fp32", "activations": "bf16",
                               "optimizer": "adam", "autocast": 1})";
    const auto bad = testing::memcalc(args + " --recipe-file " + path);
    CHECK(bad.status != 0);
    CHECK(bad.out.empty());
    CHECK_THAT(bad.err, Catch::Contains("autocast must be true or false"));
    std::remove(path.c_str());
}

TEST_CASE("a forward op under autocast runs before the later linears' casts exist",
          "[autocast][workspace]") {
    // Measured (peak_live.py, llama-mid, amp-adam, full recomputation, 2 micro-batches): at the
    // scores' add of forward 4 only q, k and v are cast; o, gate, up and down come after. Each
    // forward workspace names the first tensor not yet cast; the step, which counts the layer's
    // casts whole, is that much smaller.
    for (const Architecture& m :
         {fixtures::llama_7b(), fixtures::gpt2_small(), fixtures::mistral_7b()}) {
        const Settings s = amp_settings(Recompute::none);
        const auto params = parameter_splits(parameter_table(m), m.vocab);
        const ActivationTables t =
            activation_tables(m, s.seq, s.micro_batch, s.recipe.precision(), s.activations);
        const LayerActivations& layer = t.layer;
        const std::uint64_t h = m.hidden, f = m.ffn, q = m.heads * m.head_size();
        const std::uint64_t mlp =
            (m.mlp == Mlp::gated ? 3 : 2) * h * f + (m.bias == Bias::all ? f + h : 0);
        const std::uint64_t o = q * h + (m.bias == Bias::all ? h : 0);
        const std::uint64_t down = h * f + (m.bias == Bias::all ? h : 0);
        const Parallelism whole;
        CAPTURE(m.name);
        std::size_t attention = 0;
        const std::vector<Linear> uncast_by_op = layer.uncast_by_op();
        for (const Workspace& w : layer.work) {
            if (w.backward) continue;
            const Linear uncast_from = uncast_by_op[std::size_t(&w - layer.work.data())];
            const SplitParams uncast =
                tensors_from(params->table, uncast_from, m.vocab, false, 0, autocast_copies);
            CAPTURE(std::string(w.op));
            const Count pending = uncast.on_rank(whole, m.vocab);
            if (fixtures::at_layer_end(layer, w)) {
                CHECK(pending == Count(0));
            } else if (uncast_from == Linear::o) {
                ++attention;
                CHECK(pending == Count(o + mlp));
            } else if (uncast_from == Linear::down) {
                CHECK(pending == Count(down));
            }
        }
        CHECK(attention > 0);  // the scores' workspaces
        // The step: a forward step's workspace no longer includes casts that are not made yet.
        const Workload w = make_workload(m, s.recipe, s.seq, s.micro_batch, Recompute::none, params,
                                         t, s.framework);
        const TimelineInputs in = stage_inputs(w, whole, stage_facts(w, whole, 0));
        Count without;
        for (const WorkspaceEffect& e : w.layers[0].forward_work)
            without = std::max(without, e.on_rank(whole, m.vocab, 0));
        CHECK(in.layer[0].forward_work <= without);
        CHECK(in.layer[0].forward_work.value() + (o + mlp) * 2 >= without.value());
    }
}

namespace {
/// One GPT-2-shaped layer with LoRA on q and v alone (every other linear frozen) under autocast,
/// and its parameters; no dropout, so the layer's last add takes the down projection's output.
struct FrozenAmpLayer {
    Architecture m = fixtures::gpt2_small();
    FineTuning f;
    ParameterTable table;
    LayerActivations layer;
    static constexpr std::uint64_t s = 64, b = 2;

    FrozenAmpLayer() {
        m.hidden = 96, m.heads = 3, m.ffn = 320, m.attention_dropout = 0, m.hidden_dropout = 0;
        f.mode = Training::lora, f.lora.rank = 4, f.lora.targets = {"q_proj", "v_proj"};
        table = fine_tuned_table(m, parameter_table(m), f);
        layer = architecture_layer(m, s, b, amp, Attention::eager, Platform::cpu, {},
                                   layer_tuning(table, f, 0));
    }
    const WorkspaceEffect& effect(const LayerWork& w, const std::string& op) const {
        for (const auto* list : {&w.forward_work, &w.backward_work})
            for (const WorkspaceEffect& e : *list)
                if (Text(layer.work[e.source].op) == Text(op)) return e;
        FAIL("no workspace " << op);
        return w.forward_work.front();
    }
};
}  // namespace

TEST_CASE("a linear's autocast cast exists while its op runs and goes when its backward returns",
          "[autocast][workspace][finetune]") {
    // Measured (peak_live.py over nanoGPT with LoRA on c_attn, cpu-third-party-lora.json): at
    // GELU's backward the frozen c_proj's bf16 cast is gone, though it writes no gradient; at
    // c_proj's own forward and backward it is alive. Frozen or trained alike.
    const FrozenAmpLayer x;
    const Recompute mode = GENERATE(Recompute::none, Recompute::full);
    CAPTURE(recompute_name(mode));
    const LayerWork w = layer_work(x.layer, mode, x.table, x.m.vocab, 0);
    const Parallelism whole;
    const std::uint64_t h = x.m.hidden, ff = x.m.ffn, down = ff * h + h, mlp = down + h * ff + ff;
    const auto params = [&](const SplitParams& p) { return p.on_rank(whole, x.m.vocab).value(); };
    const WorkspaceEffect& act = x.effect(w, "GELU (tanh) backward");
    CHECK(params(act.cast_freed) == down);
    CHECK(params(act.gradients) == 0);  // frozen: no gradient stands in for the cast
    CHECK(params(x.effect(w, "down projection backward").cast_freed) == 0);
    CHECK(params(x.effect(w, "down projection (frozen)").uncast) == 0);
    CHECK(params(x.effect(w, "output projection (frozen)").uncast) == mlp);  // not o's own
    // The step counts the layer's casts whole: the activation's backward takes its freed one off.
    const std::uint64_t d = 2, g = 4;
    const Count unfreed = act.on_rank(whole, x.m.vocab, 0, 0);
    CHECK(act.on_rank(whole, x.m.vocab, 0, Count(down * d)).value() + down * d ==
          std::max<std::uint64_t>(unfreed.value(), down * d));
    // Trained, each gradient written counts whole (4 bytes) and its linear's cast comes off: a
    // norm's gradient has no cast to replace (it counted 2 bytes before).
    const LayerActivations trained =
        architecture_layer(x.m, x.s, x.b, amp, Attention::eager, Platform::cpu);
    const LayerWork tw = layer_work(trained, mode, parameter_table(x.m), x.m.vocab, 0);
    const std::uint64_t after_scores = h * h + h + mlp;  // the output projection on
    std::size_t found = 0;
    for (const WorkspaceEffect& e : tw.backward_work) {
        if (Text(trained.work[e.source].op) != Text("softmax backward")) continue;
        ++found;
        CHECK(params(e.gradients) == after_scores + 2 * h);  // and the MLP norm's weight and bias
        CHECK(params(e.cast_freed) == after_scores);
        CHECK(e.on_rank(whole, x.m.vocab, Count(params(e.gradients) * g),
                        Count(params(e.cast_freed) * d)) ==
              e.on_rank(whole, x.m.vocab, Count(after_scores * (g - d) + 2 * h * g)));
    }
    CHECK(found == 1);
}

TEST_CASE("under autocast the down projection's output gradient is cast before the rerun",
          "[autocast][recompute][finetune]") {
    // Measured (as above, full recomputation): the residual add's backward casts the fp32 stream's
    // gradient to bf16 for the down projection's output before the rerun reads a saved tensor;
    // beside the frozen down projection its caller holds the norm's fp32 output.
    const FrozenAmpLayer x;
    const std::uint64_t sbh = x.s * x.b * x.m.hidden, sbf = x.s * x.b * x.m.ffn;
    CHECK(fixtures::rerun_bytes(x.layer) == sbh * 2);
    const Workspace& down = fixtures::workspace_named(x.layer, "down projection (frozen)");
    CHECK(down.bytes.value() == sbf * 2 + sbh * 4 + sbh * 2);
    // In bf16 the stream is the output's dtype: nothing is cast, and the norm's output is bf16.
    const LayerActivations bf16 =
        architecture_layer(x.m, x.s, x.b, DType::bf16, Attention::eager, Platform::cpu, {},
                           layer_tuning(x.table, x.f, 0));
    CHECK(fixtures::rerun_bytes(bf16) == 0);
    CHECK(fixtures::workspace_named(bf16, "down projection (frozen)").bytes.value() ==
          sbf * 2 + sbh * 2 + sbh * 2);
}

TEST_CASE(
    "a checkpointed layer's forward frees a module's rows when it returns; its rerun keeps them",
    "[recompute][workspace][finetune]") {
    // Measured (as above): under full recomputation nanoGPT's forward 6 is 7 MB below a forward
    // that keeps every row to the layer's end; the rerun, whose tensors the checkpoint saves for
    // the backward, keeps them all.
    const FrozenAmpLayer x;
    const LayerWork w = layer_work(x.layer, Recompute::full, x.table, x.m.vocab, 0);
    const Parallelism whole;
    const auto at_down = [&](const std::vector<WorkspaceEffect>& effects) {
        for (const WorkspaceEffect& e : effects)
            if (Text(x.layer.work[e.source].op) == Text("down projection (frozen)"))
                return e.added.on_rank(whole, x.m.vocab).value();
        FAIL("no down projection");
        return std::uint64_t(0);
    };
    // At the MLP's last linear every row made outside the MLP is gone but a norm's output.
    std::uint64_t gone = 0;
    for (const SavedTensor& r : x.layer.rows)
        if (rebuilt_by(r, Recompute::full) && r.module != Module::mlp && !r.norm_output)
            gone += r.bytes.value();
    REQUIRE(gone > 0);
    CHECK(at_down(w.rerun_work) - at_down(w.forward_work) == gone);
    // Without recomputation nothing reruns.
    CHECK(layer_work(x.layer, Recompute::none, x.table, x.m.vocab, 0).rerun_work.empty());
}
