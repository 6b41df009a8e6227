#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "step_named.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {
Report run(const Architecture& m, std::uint64_t seq, std::uint64_t batch, Recompute mode,
           const std::string& recipe = "mixed-adam") {
    Settings settings;
    settings.seq = seq, settings.micro_batch = batch, settings.recompute = mode,
    settings.recipe = builtin_recipe(recipe);
    return estimate(m, settings);
}
std::uint64_t peak_bytes(const Report& r) { return r.peak_step().bytes.total().value(); }
using fixtures::step_named;
}  // namespace

TEST_CASE("the chapter's LLaMA 7B figures to the byte", "[estimate][chapter]") {
    using Row = std::tuple<Recompute, std::uint64_t, const char*, std::uint64_t>;
    const auto [mode, peak, step, kept] =
        GENERATE(table<Recompute, std::uint64_t, const char*, std::uint64_t>({
            Row{Recompute::none, 199539351552ULL, "loss", 104152956928ULL},
            Row{Recompute::selective, 116095778816ULL, "backward 32", 32ULL * 34 * 4096 * 4096},
            // memcalc 1.x counted the checkpointed input twice: 110,731,771,904 = this + 2 sbh.
            Row{Recompute::full, 110698217472ULL, "backward 1", 32ULL * 2 * 4096 * 4096},
        }));
    CAPTURE(recompute_name(mode));
    const Report r = run(fixtures::llama_7b(), 4096, 1, mode);
    CHECK(r.parameter_count.value() == 6738415616ULL);
    CHECK(r.state.total().value() == 107814649856ULL);
    CHECK(r.activations.value() == 104152956928ULL);
    CHECK(r.kept_activations.value() == kept);
    CHECK(peak_bytes(r) == peak);
    CHECK(r.peak_step().name() == step);
}

TEST_CASE(
    "full recomputation counts the checkpointed input once, and never peaks above selective there",
    "[estimate][recompute]") {
    // The rebuilt layer's first saved tensor is the checkpoint's own storage: a LayerNorm's input,
    // or an RMSNorm's input when it is fp32 already (its upcast is then no copy).
    const std::uint64_t sbh = 4096ULL * 4096;
    const Report full = run(fixtures::llama_7b(), 4096, 1, Recompute::full);
    CHECK(full.layer.rebuilt(Recompute::full).value() == full.layer.total().value() - 2 * sbh);
    using Row = std::tuple<const char*, ActivationModel, std::uint64_t>;
    const auto [recipe, model,
                twice] = GENERATE(table<const char*, ActivationModel, std::uint64_t>({
        Row{"mixed-adam", ActivationModel::korthikanti, 2},  // the formula's LayerNorm input, bf16
        Row{"fp32-sgd", ActivationModel::korthikanti, 4},
        Row{"fp32-sgd", ActivationModel::architecture,
            4},  // RMSNorm's fp32 input is the checkpoint
        Row{"mixed-adam", ActivationModel::architecture, 0},  // its fp32 upcast is a new tensor
    }));
    CAPTURE(recipe, activation_model_name(model));
    Settings s;
    s.seq = 1024, s.recipe = builtin_recipe(recipe), s.activations = model;
    s.recompute = Recompute::full;
    const Report r = estimate(fixtures::llama_7b(), s);
    const std::uint64_t counted_once =
        r.layer.total().value() - r.layer.rebuilt(Recompute::full).value();
    CHECK(counted_once == twice * 1024 * 4096);
    // Where the rebuilt layer keeps nothing the checkpoint does not (the formula's layer), full
    // never peaks above selective.
    s.recompute = Recompute::selective;
    if (model == ActivationModel::korthikanti)
        CHECK(peak_bytes(r) <= peak_bytes(estimate(fixtures::llama_7b(), s)));
}

TEST_CASE("Mistral 7B selective: the peak derived by hand from the model document", "[estimate]") {
    const std::uint64_t P = 7241732096ULL, sbh = 4096ULL * 4096, as2b = 32ULL * 4096 * 4096,
                        sbV = 4096ULL * 32000;
    const std::uint64_t head = 4096 + 32000ULL * 4096;  // final norm and output head
    // persistent 14P, 32 layers' 34 sbh, layer 32's rebuilt scores, the incoming gradient,
    // logits and their gradient, the head's bf16 gradients.
    const std::uint64_t expected =
        14 * P + 32 * 34 * sbh + 5 * as2b + 2 * sbh + 2 * 2 * sbV + 2 * head;
    const Report r = run(fixtures::mistral_7b(), 4096, 1, Recompute::selective);
    CHECK(r.parameter_count.value() == P);
    CHECK(peak_bytes(r) == expected);
    CHECK(r.peak_step().name() == "backward 32");
}

TEST_CASE("GPT-2 small full recomputation: tied head and learned positions by hand", "[estimate]") {
    const std::uint64_t P = 124439808ULL, s = 1024, h = 768, a = 12, V = 50257, layer = 7087872;
    const std::uint64_t sbh = s * h, as2b = a * s * s, sbV = s * V;
    const std::uint64_t head = V * h + 2 * h;  // the tied matrix's gradient appears with the head's
    const Report r = run(fixtures::gpt2_small(), s, 1, Recompute::full);
    // loss: persistent, 12 layer inputs, logits + fp32 softmax + logits gradient
    CHECK(step_named(r, "loss").bytes.total().value() == 14 * P + 12 * 2 * sbh + 8 * sbV);
    // backward 1: layer 1's input and its rebuilt layer (whose LayerNorm input is that checkpoint),
    // the incoming gradient, held logits, the head's gradients and layers 2..12's
    CHECK(step_named(r, "backward 1").bytes.total().value() ==
          14 * P + 2 * sbh + (32 * sbh + 5 * as2b) + 2 * sbh + 2 * sbV + 2 * head + 2 * 11 * layer);
    CHECK(step_named(r, "optimizer").bytes.total().value() == 16 * P + 2 * sbV);
    CHECK(r.peak_step().name() == "loss");
    CHECK(peak_bytes(r) == 2172737024ULL);
}

TEST_CASE("the peak is the largest step of the timeline for every preset-like shape",
          "[estimate]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), fixtures::mistral_7b());
    const std::uint64_t seq = GENERATE(128, 1024);
    const Recompute mode = GENERATE(Recompute::none, Recompute::selective, Recompute::full);
    const Report r = run(m, seq, 2, mode);
    for (const auto& s : r.timeline()) CHECK(s.bytes.total() <= r.peak_step().bytes.total());
    CHECK(r.timeline().size() == 2 * m.layers + 2);
    CHECK(step_named(r, "optimizer").bytes.gradients == r.state.gradients);
}

TEST_CASE("recomputation never raises kept activations or the peak", "[estimate]") {
    const Architecture m =
        GENERATE(fixtures::llama_7b(), fixtures::gpt2_small(), fixtures::mistral_7b());
    const std::uint64_t seq = GENERATE(8, 256, 1024);
    const std::uint64_t b = GENERATE(1, 3);
    const Report none = run(m, seq, b, Recompute::none), sel = run(m, seq, b, Recompute::selective),
                 full = run(m, seq, b, Recompute::full);
    CHECK(none.kept_activations >= sel.kept_activations);
    CHECK(sel.kept_activations >= full.kept_activations);
    CHECK(none.peak_step().bytes.total() >= sel.peak_step().bytes.total());
}

TEST_CASE("the recipe changes state and activation bytes but not the structure", "[estimate]") {
    const Report fp32 = run(fixtures::llama_7b(), 4096, 1, Recompute::none, "fp32-adam");
    CHECK(fp32.state.total().value() == 16 * 6738415616ULL);
    CHECK(fp32.activations.value() == 32ULL * (66ULL * 4096 * 4096 + 9ULL * 32 * 4096 * 4096));
    const Report megatron =
        run(fixtures::llama_7b(), 4096, 1, Recompute::none, "mixed-adam-fp32-grads");
    CHECK(megatron.state.total().value() == 18 * 6738415616ULL);
}

TEST_CASE("bad settings are refused with the value named", "[estimate]") {
    const Architecture m = fixtures::llama_7b();
    CHECK_THROWS_WITH(run(m, 0, 1, Recompute::none),
                      Catch::Contains("seq must be a positive integer"));
    CHECK_THROWS_WITH(run(m, 1024, 0, Recompute::none),
                      Catch::Contains("micro_batch must be a positive integer"));
    CHECK_THROWS_WITH(run(m, 1024, 1, Recompute::none, "adamw"),
                      Catch::Contains("unknown recipe 'adamw'"));
    CHECK_THROWS_WITH(run(fixtures::gpt2_small(), 2048, 1, Recompute::none),
                      Catch::Contains("seq 2048 exceeds the 1024 learned positions"));
}

TEST_CASE("sizes whose bytes overflow 64 bits are an error and never a wrapped number",
          "[estimate]") {
    const Architecture m = fixtures::llama_7b();
    CHECK_THROWS_WITH(run(m, 1ULL << 40, 1, Recompute::none), Catch::Contains("seq 1099511627776"));
    CHECK_THROWS_WITH(run(m, 4096, 1ULL << 50, Recompute::full),
                      Catch::Contains("micro-batch 1125899906842624"));
    Architecture wide = m;
    wide.vocab = 1ULL << 60;
    CHECK_THROWS_WITH(run(wide, 4096, 1, Recompute::none),
                      Catch::Contains("parameter count of llama-7b overflows"));
    // Just inside the limit still works: 10 million tokens of LLaMA 7B with full recomputation.
    CHECK_NOTHROW(run(m, 10000000, 1, Recompute::full));
}

TEST_CASE("the optimizer step's temporaries follow its implementation", "[estimate][workspace]") {
    const Architecture m = fixtures::llama_7b();
    Settings settings;
    settings.seq = 4096;
    const auto optimizer_work = [&](OptimizerImpl impl, const std::string& recipe = "mixed-adam") {
        settings.framework.optimizer = impl, settings.recipe = builtin_recipe(recipe);
        return step_named(estimate(m, settings), "optimizer").bytes.workspace.value();
    };
    const std::uint64_t P = 6738415616, largest = 32000ULL * 4096;  // the embedding and the head
    const std::uint64_t matrix = 4096ULL * 11008;                   // gate, up and down
    CHECK(optimizer_work(OptimizerImpl::fused) == 0);
    CHECK(optimizer_work(OptimizerImpl::foreach) == 4 * P);  // sqrt(v) of every parameter, fp32
    // sqrt(v) and the quotient of one tensor, beside the quotient of the one before: the head's
    // beside a layer's largest (transformers' Trainer steps it after the last down projection; the
    // embedding, stepped first, has none before it), fp32; bf16 under bf16-adam.
    CHECK(optimizer_work(OptimizerImpl::for_loop) == 4 * (2 * largest + matrix));
    CHECK(optimizer_work(OptimizerImpl::for_loop, "bf16-adam") == 2 * (2 * largest + matrix));
    // A pipeline's middle stage steps its layers alone: gate, up and down are h x f each.
    settings.parallel.pp = 4;
    const Report staged = estimate(m, settings);
    const Step& middle = staged.ranks[1].timeline().back();  // the optimizer step
    CHECK(middle.name() == "optimizer");
    CHECK(middle.bytes.workspace.value() == 2 * 3 * 4096ULL * 11008);
    settings.parallel.pp = 1;
    CHECK(optimizer_work(OptimizerImpl::foreach, "mixed-sgd") == 0);  // momentum updates in place
    // ZeRO-1 over 8 ranks: the foreach step covers this rank's shard of the state.
    settings.parallel.dp = 8, settings.parallel.zero = 1;
    CHECK(optimizer_work(OptimizerImpl::foreach) == 4 * ((P + 7) / 8));
    settings.parallel.offload = Offload::optimizer;  // the host runs the step
    CHECK(optimizer_work(OptimizerImpl::foreach) == 0);
    // The chapter's peaks do not move: its model has no workspaces and the default step is fused.
    settings.parallel = {}, settings.framework.optimizer = OptimizerImpl::fused,
    settings.recipe = builtin_recipe("mixed-adam");
    settings.recompute = Recompute::selective;
    CHECK(estimate(m, settings).peak_step().bytes.total().value() == 116095778816ULL);
}

TEST_CASE("the for-loop steps the token embedding first, with no tensor before it",
          "[estimate][workspace]") {
    // Measured (cpu-gpt2-small.json, torch.optim.AdamW's own loop): GPT-2's tied token table, its
    // largest tensor, is stepped first, alone; the position table after it holds the table's
    // quotient beside its own two. A vocabulary and widths no validation model has; more positions
    // than tokens, then fewer.
    Architecture m = fixtures::gpt2_small();
    m.vocab = 5000, m.hidden = 64, m.heads = 4, m.ffn = 256, m.layers = 2;
    m.max_positions = GENERATE(2048, 8192);
    CAPTURE(m.max_positions);
    Settings settings;
    settings.seq = 256, settings.framework.optimizer = OptimizerImpl::for_loop;
    const std::uint64_t table = 5000 * 64, positions = m.max_positions * 64, matrix = 64 * 256;
    const std::uint64_t expected =
        std::max({2 * table, 2 * positions + table, 2 * std::max(positions, matrix) + matrix});
    CHECK(step_named(estimate(m, settings), "optimizer").bytes.workspace.value() == 4 * expected);
    if (m.max_positions == 2048)
        CHECK(expected == 2 * table);  // the table alone, where it is the largest
}

TEST_CASE(
    "a backward workspace finds the layer's gradients from its tensor on, each bias with its "
    "weight",
    "[estimate][workspace]") {
    const ParameterTable llama = parameter_table(fixtures::llama_7b());
    const std::uint64_t h = 4096, f = 11008;
    // o_proj, the MLP norm, gate, up and down.
    CHECK(gradients_from(llama, Linear::o, 32000).replicated.value() == h);
    CHECK(gradients_from(llama, Linear::o, 32000).tensor.value() == h * h + 3 * h * f);
    CHECK(gradients_from(llama, Linear::none, 32000).tensor.value() == 0);
    // GPT-2's biases come after all its MLP weights in the table: from down_proj on means down_proj
    // and its bias, not the up projection's bias listed after it.
    const ParameterTable gpt2 = parameter_table(fixtures::gpt2_small());
    const SplitParams down = gradients_from(gpt2, Linear::down, 50257);
    CHECK(down.tensor.value() == 3072 * 768);
    CHECK(down.replicated.value() == 768);
}

TEST_CASE("the embedding's backward writes a whole table's gradient after layer 1's backward",
          "[estimate][workspace]") {
    // GPT-2 small at a short sequence: its tied 50257 x 768 table dwarfs a layer's activations, so
    // the moment after layer 1's backward, with every layer's gradient written, is the largest of
    // backward 1: the embedding's gradient and the out-of-place sum with the head's, 2 x V h x 2 B.
    Architecture m = fixtures::gpt2_small();
    m.softmax_fp32 = false;
    Settings settings;
    settings.seq = 256, settings.activations = ActivationModel::architecture;
    const Report r = estimate(m, settings);
    const Step& last = step_named(r, "backward 1");
    const Step& before = step_named(r, "backward 2");
    const std::uint64_t table = 50257ULL * 768 * 2,
                        layer_grads = r.parameters->per_layer().value() * 2;
    // Persistent state, the head's and all 12 layers' gradients, the token ids and positions' side,
    // the two tables, the incoming activation gradient and the logits still held.
    const Breakdown& b = last.bytes;
    CHECK(b.total().value() == (b.weights + b.master_weights + b.optimizer_state).value() +
                                   saved_bytes(r.input_side).value() + b.gradients.value() +
                                   layer_grads +
                                   (r.parameters->group(Group::input).value() * 2 + 2 * table) +
                                   b.activation_gradient.value() + b.logits.value());
    CHECK(last.bytes.total() > before.bytes.total());
    // Under the chapter's formula the step is as it was: no workspaces there.
    settings.activations = ActivationModel::korthikanti;
    CHECK(step_named(estimate(m, settings), "backward 1").bytes.workspace.value() == 0);
}

TEST_CASE(
    "nanoGPT's registered masks: max_positions^2 per layer in the weights' dtype, on every step",
    "[estimate][buffers]") {
    using Row = std::tuple<Architecture, const char*, std::uint64_t>;
    const auto [shape, recipe, bytes] = GENERATE(table<Architecture, const char*, std::uint64_t>({
        Row{fixtures::gpt2_small(), "mixed-adam", 2},
        Row{fixtures::gpt2_small(), "amp-adam", 4},
        Row{fixtures::llama_7b(), "mixed-adam", 2},
        Row{fixtures::llama_7b(), "fp32-adam", 4},
    }));
    CAPTURE(shape.name, recipe);
    Architecture registered = shape;
    registered.causal_mask_buffer = CausalMaskBuffer::per_layer;
    Settings settings;
    settings.seq = 512, settings.activations = ActivationModel::architecture,
    settings.recipe = builtin_recipe(recipe);
    const Report with = estimate(registered, settings), without = estimate(shape, settings);
    const std::uint64_t buffers = shape.layers * shape.max_positions * shape.max_positions * bytes;
    CHECK(with.state.weights.value() == without.state.weights.value() + buffers);
    CHECK(with.ranks.front().state.weights.value() ==
          without.ranks.front().state.weights.value() + buffers);
    // Each layer's bool s^2 instead of the one s^2 b mask of the stream's dtype, built per forward.
    const std::uint64_t stream = bytes_per_element(settings.recipe.precision().stream);
    CHECK(with.activations.value() == without.activations.value() + shape.layers * 512 * 512);
    CHECK(saved_bytes(with.forward_buffers).value() + 512 * 512 * stream ==
          saved_bytes(without.forward_buffers).value());
    for (std::size_t i = 0; i < with.timeline().size(); ++i)
        CHECK(with.timeline()[i].bytes.weights.value() ==
              without.timeline()[i].bytes.weights.value() + buffers);
    // Flash attention: nanoGPT registers no mask.
    settings.framework.attention = Attention::flash;
    CHECK(estimate(registered, settings).state.weights == estimate(shape, settings).state.weights);
    // nanoGPT asserts the sequence fits its block size.
    settings.framework.attention = Attention::eager, settings.seq = shape.max_positions + 1;
    CHECK_THROWS_WITH(estimate(registered, settings),
                      Catch::Contains("exceeds the " + std::to_string(shape.max_positions)));
}

TEST_CASE(
    "a kept k/v cache: the copies backward does not keep, from each forward for as long as the "
    "logits",
    "[estimate][buffers]") {
    // Per layer 2 s b k d bytes of bf16 where backward keeps other tensors: eager attention's
    // repeated k and v (grouped-query), or full recomputation's bare input; none where it keeps k
    // and v themselves.
    using Row = std::tuple<Architecture, Attention, Recompute, bool>;
    const auto [shape, attention, mode, extra] =
        GENERATE(table<Architecture, Attention, Recompute, bool>({
            Row{fixtures::mistral_7b(), Attention::eager, Recompute::none, true},
            Row{fixtures::mistral_7b(), Attention::eager, Recompute::selective, false},
            Row{fixtures::mistral_7b(), Attention::eager, Recompute::full, true},
            Row{fixtures::mistral_7b(), Attention::flash, Recompute::none, false},
            Row{fixtures::gpt2_small(), Attention::eager, Recompute::none, false},
            Row{fixtures::gpt2_small(), Attention::flash, Recompute::full, true},
        }));
    const LogitsLife logits = GENERATE(LogitsLife::held, LogitsLife::freed);
    CAPTURE(shape.name, attention_name(attention), recompute_name(mode), logits_life_name(logits));
    Settings settings;
    settings.seq = 256, settings.activations = ActivationModel::architecture,
    settings.recompute = mode;
    settings.framework.attention = attention, settings.framework.logits = logits;
    const Report off = estimate(shape, settings);
    settings.framework.kv_cache = KvCache::kept;
    const Report kept = estimate(shape, settings);
    const std::uint64_t whole = 2 * 256 * shape.key_value_heads() * shape.head_size() * 2,
                        per_layer = extra ? whole : 0;
    const std::uint64_t L = shape.layers;
    const bool held = logits == LogitsLife::held;
    const auto added = [&](const std::string& step) {
        return step_named(kept, step).bytes.total().value() -
               step_named(off, step).bytes.total().value();
    };
    CHECK(added("forward 3") == 3 * per_layer);
    CHECK(added("loss") == L * per_layer);
    // Held with the output, the cache is whole again once a layer's backward has freed the k and v
    // it saved (the running layer's counted so, leaning high; measured: cpu-buffers.json).
    CHECK(added("backward " + std::to_string(L)) == (held ? (L - 1) * per_layer + whole : 0));
    CHECK(added("backward 1") == (held ? L * whole : 0));
    CHECK(added("optimizer") == (held ? L * whole : 0));
}

TEST_CASE(
    "per-layer rotary embeddings: their buffers in the weights' dtype on every rank and step, "
    "their cos and sin per layer",
    "[estimate][buffers]") {
    // transformers 4.31-4.37 registers inv_freq (head_dim / 2) and cos and sin caches
    // (max_positions x head_dim) in every attention layer; 4.40-4.44 inv_freq alone.
    // model.to(dtype) casts them all.
    using Row = std::tuple<Architecture, const char*, std::uint64_t>;
    const auto [shape, recipe, bytes] = GENERATE(table<Architecture, const char*, std::uint64_t>({
        Row{fixtures::llama_7b(), "mixed-adam", 2},
        Row{fixtures::llama_7b(), "amp-adam", 4},
        Row{fixtures::mistral_7b(), "mixed-adam", 2},
        Row{fixtures::mistral_7b(), "fp32-adam", 4},
    }));
    const RotaryEmbedding kind =
        GENERATE(RotaryEmbedding::per_layer, RotaryEmbedding::per_layer_cached);
    const std::uint64_t tp = GENERATE(1, 2);
    CAPTURE(shape.name, recipe, rotary_embedding(kind).name, tp);
    Architecture own = shape;
    own.max_positions = 4096, own.rotary_embedding = kind;
    Architecture shared = own;
    shared.rotary_embedding = RotaryEmbedding::shared;
    Settings settings;
    settings.seq = 512, settings.activations = ActivationModel::architecture,
    settings.recipe = builtin_recipe(recipe);
    settings.parallel.tp = tp;
    const Report with = estimate(own, settings), without = estimate(shared, settings);
    const std::uint64_t d = shape.head_size(), L = shape.layers;
    const std::uint64_t caches = kind == RotaryEmbedding::per_layer_cached ? 2 * 4096 * d : 0;
    const std::uint64_t buffers = L * (caches + d / 2) * bytes;
    CHECK(with.state.weights.value() == without.state.weights.value() + buffers);
    // Buffers are no parameters: tensor parallelism leaves each rank's module its whole buffers.
    CHECK(with.ranks.front().state.weights.value() ==
          without.ranks.front().state.weights.value() + buffers);
    for (std::size_t i = 0; i < with.timeline().size(); ++i)
        CHECK(with.timeline()[i].bytes.weights.value() ==
              without.timeline()[i].bytes.weights.value() + buffers);
    // Each layer's own cos and sin in the compute dtype (v's: bf16 under autocast too) in place of
    // the one shared pair.
    const std::uint64_t pair = 2 * 512 * d * bytes_per_element(settings.recipe.precision().compute);
    CHECK(with.activations.value() == without.activations.value() + L * pair);
    CHECK(saved_bytes(with.input_side).value() + pair == saved_bytes(without.input_side).value());
}

TEST_CASE("rotary caches shorter than the sequence are rebuilt at its length in the compute dtype",
          "[estimate][buffers]") {
    // transformers 4.31-4.37: forward calls _set_cos_sin_cache(seq_len, dtype=x.dtype) past
    // max_positions.
    Architecture own = fixtures::llama_7b();
    own.rotary_embedding = RotaryEmbedding::per_layer_cached;
    Architecture shared = fixtures::llama_7b();
    Settings settings;
    settings.recipe = builtin_recipe("amp-adam");  // fp32 weights, bf16 compute
    const std::uint64_t d = 128, L = 32;
    for (const std::uint64_t seq : {std::uint64_t{2048}, std::uint64_t{3000}}) {
        settings.seq = seq;
        const std::uint64_t caches = seq > 2048 ? 2 * seq * d * 2 : 2 * 2048 * d * 4;
        CHECK(estimate(own, settings).state.weights.value() ==
              estimate(shared, settings).state.weights.value() + L * (caches + d / 2 * 4));
    }
}

TEST_CASE("a reentrant checkpoint holds the recomputed layer's output through its backward",
          "[estimate][recompute]") {
    const auto [seq, micro_batch] =
        GENERATE(table<std::uint64_t, std::uint64_t>({{512, 1}, {1024, 2}, {256, 3}}));
    CAPTURE(seq, micro_batch);
    Settings s;
    s.seq = seq, s.micro_batch = micro_batch, s.recompute = Recompute::full;
    s.activations = ActivationModel::architecture;
    const Architecture m = fixtures::llama_7b();
    const Report plain = Estimator(m).estimate(s);
    s.framework.checkpoint = CheckpointImpl::reentrant;
    const Report reentrant = Estimator(m).estimate(s);
    const Count output(seq * micro_batch * m.hidden * 2);  // the layer's output, bf16
    for (const std::uint64_t layer : {std::uint64_t{1}, std::uint64_t{17}, m.layers}) {
        const std::string step = "backward " + std::to_string(layer);
        CHECK(fixtures::step_named(reentrant, step).bytes.rebuilt_activations ==
              fixtures::step_named(plain, step).bytes.rebuilt_activations + output);
    }
    // Forward steps, and recomputation other than full, are as before.
    CHECK(fixtures::step_named(reentrant, "forward 3").bytes.total() ==
          fixtures::step_named(plain, "forward 3").bytes.total());
    s.recompute = Recompute::selective;
    const Report selective = Estimator(m).estimate(s);
    s.framework.checkpoint = CheckpointImpl::non_reentrant;
    CHECK(Estimator(m).estimate(s).peak_step().bytes.total() ==
          selective.peak_step().bytes.total());
}
