// Fine-tuning: frozen parts, LoRA adapters and QLoRA's 4-bit base. Parameter counts against what
// peft prints, 4-bit storage against the QLoRA paper's bits per parameter, saved tensors against
// hand sums on several shapes (validation/reference_trainer.py measures them in PyTorch).
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "model_file.hpp"
#include "run_program.hpp"
#include "workspace_named.hpp"
#include "memcalc/estimate.hpp"
#include "memcalc/finetune.hpp"

using namespace memcalc;

namespace {

Architecture llama_3_8b() {
    Architecture m;
    m.name = "llama-3-8b";
    m.hidden = 4096, m.layers = 32, m.heads = 32, m.kv_heads = 8, m.ffn = 14336, m.vocab = 128256;
    return m;
}

FineTuning lora(std::uint64_t rank, std::vector<std::string> targets,
                Training mode = Training::lora) {
    FineTuning f;
    f.mode = mode;
    f.lora.rank = rank;
    f.lora.targets = std::move(targets);
    return f;
}

Settings tuned(const FineTuning& f, std::uint64_t seq = 512) {
    Settings s;
    s.seq = seq, s.micro_batch = 2, s.activations = ActivationModel::architecture, s.tuning = f;
    return s;
}

}  // namespace

TEST_CASE("LoRA's adapter parameters are what peft prints", "[finetune]") {
    // peft's print_trainable_parameters(), r = 8 on q_proj and v_proj of Llama-2-7B:
    // "trainable params: 4,194,304 || all params: 6,742,609,920".
    const Report r7 =
        Estimator(fixtures::llama_7b()).estimate(tuned(lora(8, {"q_proj", "v_proj"})));
    CHECK(trainable_parameters(*r7.parameters) == Count(4194304));
    CHECK(r7.parameter_count == Count(6742609920ULL));
    // r = 16 on every linear of Llama-3-8B: "trainable params: 41,943,040 || all params:
    // 8,072,204,288".
    const Report r8 = Estimator(llama_3_8b()).estimate(tuned(lora(16, {"all-linear"})));
    CHECK(trainable_parameters(*r8.parameters) == Count(41943040));
    CHECK(r8.parameter_count == Count(8072204288ULL));
    // Naming every linear is all-linear on a dense model.
    const Report named = Estimator(llama_3_8b())
                             .estimate(tuned(lora(16, {"q_proj", "k_proj", "v_proj", "o_proj",
                                                       "gate_proj", "up_proj", "down_proj"})));
    CHECK(trainable_parameters(*named.parameters) == Count(41943040));
    // r = 8 on GPT-2's c_attn, one linear making q, k and v (peft's default target for GPT-2):
    // "trainable params: 294,912 || all params: 124,734,720 || trainable%: 0.2364".
    Architecture gpt2 = fixtures::gpt2_small();
    gpt2.fused_qkv = true;
    const Report fused = Estimator(gpt2).estimate(tuned(lora(8, {"c_attn"})));
    CHECK(trainable_parameters(*fused.parameters) == Count(294912));
    CHECK(fused.parameter_count == Count(124734720));
    // r = 16 on Phi-3-mini's qkv_proj, o_proj, gate_up_proj and down_proj (its q/k/v and gate/up
    // each one linear), as a peft user printed it: "trainable params: 25,165,824 || all params:
    // 3,846,245,376".
    Architecture phi3 = cli::load_preset("phi-3-mini").architecture;
    CHECK(phi3.fused_gate_up);
    phi3.fused_qkv = true;
    const Report both = Estimator(phi3).estimate(
        tuned(lora(16, {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"})));
    CHECK(trainable_parameters(*both.parameters) == Count(25165824));
    CHECK(both.parameter_count == Count(3846245376ULL));
    CHECK(trainable_parameters(
              *Estimator(phi3).estimate(tuned(lora(16, {"all-linear"}))).parameters) ==
          Count(25165824));
}

TEST_CASE("Adapters are written out per target, r x (in + out), and split as their linear",
          "[finetune]") {
    const Architecture m = fixtures::mistral_7b();  // grouped-query attention: k and v are narrower
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), lora(4, {"k_proj", "o_proj"}));
    const auto row = [&](Text name) -> const ParamRow& {
        for (const auto& r : t.rows)
            if (r.tensor == name) return r;
        FAIL("no row " << name);
        return t.rows.front();
    };
    CHECK(row("k_proj.lora_A").count == Count(4096 * 4));
    CHECK(row("k_proj.lora_B").count == Count(4 * 1024));
    CHECK(row("o_proj.lora_A").count == Count(4096 * 4));
    // A column-parallel linear's B splits by its columns; a row-parallel one's A by its rows.
    CHECK(row("k_proj.lora_A").split == ParamSplit::replicated);
    CHECK(row("k_proj.lora_B").split == ParamSplit::tensor);
    CHECK(row("o_proj.lora_A").split == ParamSplit::tensor);
    CHECK(row("o_proj.lora_B").split == ParamSplit::replicated);
    CHECK(row("k_proj.lora_B").part == Part::adapter);
    for (const auto& r : t.rows) CHECK(r.trainable == (r.part == Part::adapter));
    CHECK(trainable_parameters(t) == Count(32) * 4 * ((4096 + 1024) + (4096 + 4096)));
}

TEST_CASE("A fused q/k/v linear is one LoRA target: one adapter of h x r and r x (q + k + v)",
          "[finetune]") {
    Architecture m = GENERATE(fixtures::gpt2_small(), fixtures::mistral_7b());
    m.fused_qkv = true;
    CAPTURE(m.name);
    const std::uint64_t r = 8, h = m.hidden, L = m.layers;
    const std::uint64_t out = (m.heads + 2 * m.key_value_heads()) * m.head_size();
    for (const std::string name : {"c_attn", "qkv_proj", "in_proj", "query_key_value", "Wqkv"}) {
        const ParameterTable t = fine_tuned_table(m, parameter_table(m), lora(r, {name}));
        CHECK(trainable_parameters(t) == Count(L) * r * (h + out));
        // After the v weight, split as a column-parallel linear's, beside q (its first output).
        const auto b = std::find_if(t.rows.begin(), t.rows.end(), [](const ParamRow& row) {
            return row.tensor == Text("qkv_proj.lora_B");
        });
        REQUIRE(b != t.rows.end());
        CHECK(b->split == ParamSplit::tensor);
        CHECK(std::prev(b, 2)->linear == Linear::v);
        CHECK(layer_tuning(t, lora(r, {name}), 0).adapted == bit(Linear::q));
    }
    // all-linear adapts it as one too; its q, k and v are no modules of their own.
    const ParameterTable all = fine_tuned_table(m, parameter_table(m), lora(r, {"all-linear"}));
    CHECK(trainable_parameters(all) ==
          Count(L) * r *
              ((h + out) + (h + h) + 2 * (h + m.ffn) + (m.mlp == Mlp::gated ? h + m.ffn : 0)));
    CHECK_THROWS_WITH(fine_tuned_table(m, parameter_table(m), lora(r, {"q_proj"})),
                      Catch::Contains("lora target 'q_proj': q_proj, k_proj and v_proj are one "
                                      "linear in ") &&
                          Catch::Contains("(fused_qkv): target it as qkv_proj (or c_attn, "
                                          "in_proj, query_key_value, Wqkv)"));
    // Latent attention has no q/k/v linear to fuse.
    Architecture latent = cli::load_preset("deepseek-v2-lite").architecture;
    latent.fused_qkv = true;
    CHECK_THROWS_WITH(validate(latent), Catch::Contains("fused_qkv with latent attention"));
    // Unfused, the fused names name nothing.
    m.fused_qkv = false;
    CHECK_THROWS_WITH(fine_tuned_table(m, parameter_table(m), lora(r, {"c_attn"})),
                      Catch::Contains("lora target 'c_attn' names no linear layer") &&
                          Catch::Contains("c_attn is a fused linear: fused_qkv true says the "
                                          "code makes one"));
}

TEST_CASE(
    "A fused q/k/v adapter keeps one dropout and one r-wide output; its frozen forward "
    "holds all three outputs beside the adapter's",
    "[finetune]") {
    Architecture m = fixtures::gpt2_small();
    m.fused_qkv = true;
    const std::uint64_t s = GENERATE(64, 256), b = 2, r = 8, T = s * b, h = m.hidden, d = 2;
    CAPTURE(s);
    FineTuning fused = lora(r, {"c_attn"});
    fused.lora.fp32 = false;
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), fused);
    const LayerActivations layer = architecture_layer(
        m, s, b, DType::bf16, Attention::eager, Platform::cuda, {}, layer_tuning(t, fused, 0));
    std::uint64_t masks = 0, intermediates = 0;
    for (const SavedTensor& row : layer.rows) {
        const std::string op(row.op);
        if (op.find("LoRA dropout") != std::string::npos) masks += row.copies;
        if (op.find("LoRA B") != std::string::npos) intermediates += row.bytes.value();
    }
    CHECK(masks == 1);
    CHECK(intermediates == T * r * d);
    // Under full recomputation nothing keeps the input: the frozen forward holds it, the three
    // outputs, and the adapter's scaled output and sum, each as wide as all three.
    const Workspace& w = fixtures::workspace_named(layer, "q/k/v projections (frozen)");
    CHECK(w.bytes.value() == T * h * d + T * 3 * h * d + T * 3 * h * (d + d));
}

TEST_CASE("A fused gate/up linear casts its input once under autocast and is one adapter",
          "[finetune]") {
    Architecture m = fixtures::mistral_7b();
    const std::uint64_t s = GENERATE(64, 512), b = 2, T = s * b, h = m.hidden, f = m.ffn;
    CAPTURE(s);
    const Precision amp = builtin_recipe("amp-adam").precision();
    const Count apart = architecture_layer(m, s, b, amp, Attention::flash).total();
    m.fused_gate_up = true;
    // Autocast's copy of the MLP's input for one linear, not two (2 bytes a value).
    CHECK(architecture_layer(m, s, b, amp, Attention::flash).total().value() ==
          apart.value() - T * h * 2);
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), lora(8, {"gate_up_proj"}));
    CHECK(trainable_parameters(t) == Count(m.layers) * 8 * (h + 2 * f));
    CHECK(layer_tuning(t, lora(8, {"gate_up_proj"}), 0).adapted == bit(Linear::gate));
    CHECK_THROWS_WITH(fine_tuned_table(m, parameter_table(m), lora(8, {"up_proj"})),
                      Catch::Contains("gate_proj and up_proj are one linear in ") &&
                          Catch::Contains("(fused_gate_up): target it as gate_up_proj"));
    m.mlp = Mlp::plain;
    CHECK_THROWS_WITH(validate(m), Catch::Contains("fused_gate_up needs a gated MLP"));
}

TEST_CASE("Mixture-of-experts adapters: one per expert, as peft adapts each expert's Linear",
          "[finetune]") {
    Architecture m = fixtures::mistral_7b();
    m.experts = 8, m.experts_per_token = 2;
    const ParameterTable t = fine_tuned_table(m, parameter_table(m), lora(8, {"down_proj"}));
    CHECK(trainable_parameters(t) == Count(32) * 8 * 8 * (14336 + 4096));
    // Stacked experts (gpt-oss) are one Parameter each, no Linear: nothing to adapt.
    m.stacked_experts = true;
    CHECK_THROWS_WITH(fine_tuned_table(m, parameter_table(m), lora(8, {"down_proj"})),
                      Catch::Contains("lora target 'down_proj' names no linear layer"));
}

TEST_CASE("QLoRA stores the base linears as bitsandbytes' NF4 with double quantisation",
          "[finetune]") {
    // The QLoRA paper: 4 bits a weight, plus 8/64 + 32/(64 x 256) bits of constants.
    const std::uint64_t n = 4096ULL * 4096;
    const Count bytes = nf4_double_quant.bytes(Count(n));
    CHECK(bytes == Count(n / 2 + n / 64 + n / 64 / 256 * 4));
    CHECK(static_cast<double>(bytes.value()) * 8 / static_cast<double>(n) ==
          Approx(4.126953125).epsilon(1e-12));
    // Rounded up: a partial block keeps a whole scale; a partial group of scales a whole fp32.
    CHECK(nf4_double_quant.bytes(Count(65)) == Count(33 + 2 + 4));

    const Architecture m = llama_3_8b();
    const Report q = Estimator(m).estimate(tuned(lora(16, {"all-linear"}, Training::qlora)));
    const Report l = Estimator(m).estimate(tuned(lora(16, {"all-linear"})));
    CHECK(trainable_parameters(*q.parameters) == trainable_parameters(*l.parameters));
    // Every layer linear in 4 bits; embeddings, norms and the head stay in the recipe's bf16.
    Count linear, other;
    for (const auto& r : q.parameters->rows) {
        if (r.part == Part::adapter) continue;
        (r.storage ? linear : other) += q.parameters->in_model(r);
        CHECK(bool(r.storage) == (r.group == Group::layer && r.dims.size() == 2));
    }
    const Count adapters = trainable_parameters(*q.parameters);
    // 224 tensors (32 layers x 7), each also keeping its 68 bytes of constants.
    CHECK(q.state.weights ==
          nf4_double_quant.bytes(linear) + Count(224 * 68) + other * 2 + adapters * 2);
    CHECK(q.state.gradients == adapters * 2);
    CHECK(q.state.optimizer_state == adapters * 8);
}

TEST_CASE("Frozen parts keep their weights alone", "[finetune]") {
    const Architecture m = fixtures::llama_7b();
    FineTuning f;
    f.mode = Training::frozen;
    f.frozen = {"embeddings", "attention"};
    const Report r = Estimator(m).estimate(tuned(f));
    const ParameterTable all = parameter_table(m);
    const std::uint64_t frozen =
        (all.part(Part::embedding) + Count(m.layers) * all.part(Part::attention)).value();
    const Count trains(all.total().value() - frozen);
    CHECK(trainable_parameters(*r.parameters) == trains);
    CHECK(r.state.gradients == trains * 2);
    CHECK(r.state.weights == all.total() * 2);
    // By tensor name too, as peft matches module names.
    f.frozen = {"q_proj"};
    CHECK(trainable_parameters(fine_tuned_table(m, all, f)).value() ==
          all.total().value() - 32ULL * 4096 * 4096);
    f.frozen = {"nothing_such"};
    CHECK_THROWS_WITH(fine_tuned_table(m, all, f),
                      Catch::Contains("frozen 'nothing_such' names no tensor"));
    f.frozen = {"all"};
    CHECK_THROWS_WITH(fine_tuned_table(m, all, f), Catch::Contains("leaves nothing"));
}

TEST_CASE("A frozen linear keeps no input for its weight; an adapter keeps its own", "[finetune]") {
    // Hand sums on three shapes: what LoRA on q and v (rank r, dropout) changes in one layer's
    // bytes.
    struct Shape_ {
        std::uint64_t h, heads, kv, f, s, b, r;
    };
    for (const Shape_ x : {Shape_{64, 4, 4, 176, 32, 2, 8}, Shape_{96, 6, 2, 256, 16, 1, 4},
                           Shape_{128, 8, 8, 344, 24, 3, 16}}) {
        Architecture m;
        m.name = "tiny", m.hidden = x.h, m.layers = 2, m.heads = x.heads, m.kv_heads = x.kv,
        m.ffn = x.f, m.vocab = 100;
        const std::uint64_t d = 2, sbh = x.s * x.b * x.h, sbf = x.s * x.b * x.f, tokens = x.s * x.b;
        FineTuning f = lora(x.r, {"q_proj", "v_proj"});
        f.lora.fp32 = false;  // adapters in the model's bf16: nothing cast for them
        const ParameterTable t = fine_tuned_table(m, parameter_table(m), f);
        const LayerTuning tuning = layer_tuning(t, f, 0);
        CHECK(tuning.adapted == (bit(Linear::q) | bit(Linear::v)));
        CHECK(tuning.frozen_norms);
        for (const Attention a : {Attention::eager, Attention::flash}) {
            const LayerActivations full = architecture_layer(m, x.s, x.b, DType::bf16, a);
            const LayerActivations lo =
                architecture_layer(m, x.s, x.b, DType::bf16, a, Platform::cuda, {}, tuning);
            // Gone: q/k/v's input, both norms' x_norm, the up projections' input, the down
            // projection's, and (eager) o_proj's: flash keeps its output as its own.
            const std::uint64_t gone = (4 + (a == Attention::eager ? 1 : 0)) * sbh * d + sbf * d;
            // Added: each adapter's dropout mask (1 B) and dropped-out input, and its r-wide
            // intermediate.
            const std::uint64_t added = 2 * sbh * (1 + d) + 2 * tokens * x.r * d;
            CHECK(lo.total().value() == full.total().value() - gone + added);
        }
        // Without dropout lora_A reads x itself: q/k/v's input stays, once.
        FineTuning undropped = f;
        undropped.lora.dropout = false;
        const LayerActivations full =
            architecture_layer(m, x.s, x.b, DType::bf16, Attention::eager);
        const LayerActivations plain =
            architecture_layer(m, x.s, x.b, DType::bf16, Attention::eager, Platform::cuda, {},
                               layer_tuning(t, undropped, 0));
        CHECK(plain.total().value() ==
              full.total().value() - (4 * sbh + sbf) * d + 2 * tokens * x.r * d);
        // peft's default fp32 adapters cast x for each (a copy of 4 bytes an element, which the
        // dropout reads) and compute A's output in fp32: q/k/v's input goes too.
        FineTuning fp32 = f;
        fp32.lora.fp32 = true;
        const LayerActivations upcast =
            architecture_layer(m, x.s, x.b, DType::bf16, Attention::eager, Platform::cuda, {},
                               layer_tuning(t, fp32, 0));
        CHECK(upcast.total().value() == full.total().value() - (5 * sbh + sbf) * d +
                                            2 * sbh * (1 + 4) + 2 * tokens * x.r * 4);
        fp32.lora.dropout = false;
        const LayerActivations cast =
            architecture_layer(m, x.s, x.b, DType::bf16, Attention::eager, Platform::cuda, {},
                               layer_tuning(t, fp32, 0));
        CHECK(cast.total().value() ==
              full.total().value() - (5 * sbh + sbf) * d + 2 * sbh * 4 + 2 * tokens * x.r * 4);
    }
}

TEST_CASE(
    "Full recomputation of a LoRA layer: the rerun forward at its largest op, beside the gradients "
    "made before it",
    "[finetune]") {
    // A shape of its own (h 96, 6 heads over 2 key/value heads, f 256, s 16, b 2, r 4), LoRA on
    // every linear without dropout, fp32 adapters beside the bf16 model; sb = 32 tokens.
    Architecture m;
    m.name = "lora-rerun", m.hidden = 96, m.layers = 2, m.heads = 6, m.kv_heads = 2, m.ffn = 256,
    m.vocab = 100;
    const std::uint64_t s = 16, b = 2, r = 4, tokens = s * b, sbh = tokens * 96, sbf = tokens * 256;
    FineTuning f = lora(r, {"all-linear"});
    f.lora.dropout = false;
    const ParameterTable table = fine_tuned_table(m, parameter_table(m), f);
    for (const Platform platform : {Platform::cuda, Platform::cpu}) {
        INFO((platform == Platform::cpu ? "cpu" : "cuda"));
        const std::uint64_t copy =
            platform == Platform::cpu ? 4 : 0;  // the CPU add's fp32 copy of the base output
        const LayerActivations l = architecture_layer(m, s, b, DType::bf16, Attention::eager,
                                                      platform, {}, layer_tuning(table, f, 0));
        // At up(x), the last of the MLP's frozen linears: their input (no row keeps it: each fp32
        // adapter casts its own), 2 sbh; gate(x), act(gate(x)) (made before up(x)) and up(x), 2 sbf
        // each; up's adapter output scaled, its sum (fp32) and on CPU the base output's copy.
        // Beside them the residual stream no row keeps (the RMSNorms keep fp32 copies): the
        // attention half's sum, and the layer's input unless a checkpoint keeps it, 2 sbh each.
        const Workspace *up = nullptr, *down = nullptr;
        for (const auto& w : l.work) {
            if (std::string(w.op) == "MLP up projections (frozen)") up = &w;
            if (std::string(w.op) == "down projection (frozen)") down = &w;
        }
        REQUIRE(up != nullptr);
        REQUIRE(down != nullptr);
        CHECK(up->bytes.value() == 2 * sbh + 3 * 2 * sbf + sbf * (4 + copy + 4));
        CHECK(fixtures::stream_other(l, *up) == 2 * sbh);
        CHECK(fixtures::stream_input(l, *up) == 2 * sbh);
        // At down(x), the layer's last linear: its input (2 sbf, no row), the MLP's input (2 sbh),
        // its output (2 sbh) and its adapter's scaled output and sum (and copy); beside them the
        // stream, as at up(x).
        CHECK(down->bytes.value() == 2 * sbf + 2 * 2 * sbh + sbh * (4 + copy + 4));
        CHECK(fixtures::stream_other(l, *down) == 2 * sbh);
        // Before the rerun: the scaled adapter output's gradient (fp32) and the base output's, cast
        // to bf16.
        CHECK(fixtures::rerun_bytes(l) == sbh * (4 + 2));

        // The first backward step holds every row, and the rerun forward adds what is not one of
        // them at its largest: up(x)'s workspace less the rows made after it (act's input, its
        // output, up(x): 2 sbf each; down's fp32 cast of its input, 4 sbf; its r-wide A output, 4
        // tokens r), or down(x)'s, made after every row; beside those gradients, and the causal
        // mask (2 s^2 b bytes) recomputation keeps. On CUDA down(x) holds the most, on CPU up(x),
        // whose 2 sbf-wide copy outweighs down's 4 sbh.
        Settings set = tuned(f, s);
        set.micro_batch = b, set.recompute = Recompute::full, set.framework.platform = platform;
        const Report rep = Estimator(m).estimate(set);
        const Step& last = rep.timeline().at(m.layers + 1);  // forward 1, 2, loss, backward 2
        REQUIRE(last.name() == "backward 2");
        CHECK(last.bytes.rebuilt_activations == l.total());
        // Full recomputation's checkpoint keeps the layer's input: the stream beside is the half's
        // sum alone.
        const std::uint64_t at_up = up->bytes.value() + 2 * sbh - (10 * sbf + 4 * tokens * r),
                            at_down = down->bytes.value() + 2 * sbh;
        CHECK((platform == Platform::cpu ? at_up > at_down : at_down > at_up));
        CHECK(last.bytes.workspace.value() == 2 * s * s * b + std::max(at_up, at_down) + 6 * sbh);
        CHECK(last.bytes.workspace.value() == 2 * s * s * b +
                                                  (platform == Platform::cpu
                                                       ? 4 * sbh + 8 * sbf - 4 * tokens * r
                                                       : 14 * sbh + 2 * sbf) +
                                                  6 * sbh);
    }
    // bf16 adapters: only the scaled output's gradient is new (the sum passes the incoming one on
    // as it is); none where the down projection has no adapter, or under frozen training, whose
    // last linear reads a saved weight.
    FineTuning bf16 = f;
    bf16.lora.fp32 = false;
    CHECK(fixtures::rerun_bytes(architecture_layer(m, s, b, DType::bf16, Attention::eager,
                                                   Platform::cuda, {},
                                                   layer_tuning(table, bf16, 0))) == 2 * sbh);
    const FineTuning qv = lora(r, {"q_proj", "v_proj"});
    CHECK(fixtures::rerun_bytes(architecture_layer(
              m, s, b, DType::bf16, Attention::eager, Platform::cuda, {},
              layer_tuning(fine_tuned_table(m, parameter_table(m), qv), qv, 0))) == 0);
}

TEST_CASE("QLoRA's layer dequantises its largest weight while it computes", "[finetune]") {
    const Architecture m = fixtures::llama_7b();
    const FineTuning f = lora(8, {"all-linear"}, Training::qlora);
    const LayerTuning tuning = layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0);
    CHECK(tuning.dequantized == Count(4096ULL * 11008));
    const LayerActivations l =
        architecture_layer(m, 128, 1, DType::bf16, Attention::flash, Platform::cuda, {}, tuning);
    int found = 0;
    for (const auto& w : l.work)
        if (std::string(w.op).find("4-bit linear") != std::string::npos) {
            CHECK(w.bytes == Count(4096ULL * 11008 * 2));
            ++found;
        }
    CHECK(found == 2);  // forward and backward
}

TEST_CASE("Fine-tuning needs the architecture model, and composes with fit", "[finetune]") {
    Settings s = tuned(lora(8, {"q_proj"}));
    s.activations = ActivationModel::korthikanti;
    CHECK_THROWS_WITH(Estimator(fixtures::llama_7b()).estimate(s),
                      Catch::Contains("training lora needs the architecture"));
    CHECK_THROWS_WITH(Estimator(fixtures::llama_7b()).estimate(tuned(lora(8, {"w_pack"}))),
                      Catch::Contains("lora target 'w_pack' names no linear layer of llama-7b"));
    // LoRA's peak is well below full training's at the same size.
    const Report full = Estimator(fixtures::llama_7b()).estimate(tuned(FineTuning{}, 2048));
    const Report lo =
        Estimator(fixtures::llama_7b()).estimate(tuned(lora(8, {"q_proj", "v_proj"}), 2048));
    CHECK(lo.peak_step().bytes.total() < full.peak_step().bytes.total());
}

TEST_CASE("memcalc --train: spellings, JSON and errors", "[finetune][cli]") {
    const auto r = testing::memcalc(
        "--preset llama-7b --seq 512 --train lora --lora-rank 8 --lora-targets q_proj,v_proj "
        "--format json");
    REQUIRE(r.status == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["parameters"]["trainable"] == 4194304);
    CHECK(j["parameters"]["total"] == 6742609920ULL);
    CHECK(j["settings"]["training"]["mode"] == "lora");
    CHECK(j["settings"]["activations"] == "architecture");
    const auto q = testing::memcalc(
        "--preset llama-3-8b --seq 512 --train qlora --lora-rank 16 --lora-targets all-linear "
        "--format json");
    REQUIRE(q.status == 0);
    CHECK(nlohmann::json::parse(q.out)["parameters"]["trainable"] == 41943040);
    for (const char* bad :
         {"--train lorra", "--train frozen", "--lora-rank 8", "--train lora --lora-rank 0",
          "--train lora --lora-dropout 1.5", "--train lora --frozen mlp",
          "--train lora --activations korthikanti", "--train lora --lora-targets w_pack",
          "--frozen all", "--train lora --lora-dtype int8", "--train lora --lora-variant vera",
          "--lora-variant dora"}) {
        const auto e = testing::memcalc(std::string("--preset llama-7b --seq 512 ") + bad);
        INFO(bad << ": " << e.err);
        CHECK(e.status != 0);
        CHECK(e.out.empty());
        CHECK(e.err.find('\n') == e.err.size() - 1);  // one line
    }
}

namespace {

FineTuning dora(std::uint64_t rank, std::vector<std::string> targets,
                Training mode = Training::lora) {
    FineTuning f = lora(rank, std::move(targets), mode);
    f.lora.variant = LoraVariant::dora;
    return f;
}

}  // namespace

TEST_CASE("DoRA adds a trained magnitude vector of out_features per adapted linear",
          "[finetune][dora]") {
    // peft's DoraLinearLayer: lora_magnitude_vector.weight has the base's out_features elements.
    // Llama-2-7B, r = 8 on q_proj and v_proj: LoRA's 4,194,304 and 32 layers x 2 x 4096.
    const Report r7 =
        Estimator(fixtures::llama_7b()).estimate(tuned(dora(8, {"q_proj", "v_proj"})));
    CHECK(trainable_parameters(*r7.parameters) == Count(4194304 + 32 * 2 * 4096));
    CHECK(r7.parameter_count == Count(6742609920ULL + 32 * 2 * 4096));
    // Llama-3-8B, r = 16 on every linear: 41,943,040 and 32 x (4096 + 1024 + 1024 + 4096 + 14336 +
    // 14336 + 4096).
    const Report r8 = Estimator(llama_3_8b()).estimate(tuned(dora(16, {"all-linear"})));
    CHECK(trainable_parameters(*r8.parameters) == Count(41943040 + 32 * 43008));
    // QDoRA: the same adapters over the 4-bit base.
    const Report q8 =
        Estimator(llama_3_8b()).estimate(tuned(dora(16, {"all-linear"}, Training::qlora)));
    CHECK(trainable_parameters(*q8.parameters) == trainable_parameters(*r8.parameters));
    // Experts: one per expert's down_proj (out = h); split as its linear (row-parallel: whole).
    Architecture moe = fixtures::mistral_7b();
    moe.experts = 8, moe.experts_per_token = 2;
    const ParameterTable t =
        fine_tuned_table(moe, parameter_table(moe), dora(8, {"down_proj", "k_proj"}));
    CHECK(trainable_parameters(t) ==
          Count(32) * (8 * (8 * (14336 + 4096) + 4096) + 8 * (4096 + 1024) + 1024));
    for (const auto& r : t.rows) {
        if (r.tensor == "down_proj.lora_magnitude_vector") CHECK(r.split == ParamSplit::replicated);
        if (r.tensor == "k_proj.lora_magnitude_vector") CHECK(r.split == ParamSplit::tensor);
    }
    const LayerTuning tuning = layer_tuning(t, dora(8, {"down_proj", "k_proj"}), 0);
    CHECK(tuning.dora);
    const AdaptedShape& down = tuning.shapes[static_cast<std::size_t>(Linear::down)];
    CHECK(down.in == 14336);
    CHECK(down.out == 4096);
    CHECK(down.modules == 8);
    CHECK(tuning.shapes[static_cast<std::size_t>(Linear::k)].out == 1024);
}

TEST_CASE(
    "DoRA keeps the base output, the adapter's output and, dropped out over a cast weight, the "
    "weight",
    "[finetune][dora]") {
    // Per adapted linear, peft's DoRA forward (measured per layer on CPU,
    // validation/results/cpu-dora.txt): the base output (bf16; with a dropout F.linear(dropout(x),
    // W) in the adapter's dtype), B A x (adapter's dtype), three out-vectors; with a dropout and W
    // of another dtype than the adapter, W cast (out x in).
    struct Shape_ {
        std::uint64_t h, heads, kv, f, s, b, r;
    };
    for (const Shape_ x : {Shape_{64, 4, 4, 176, 32, 2, 8}, Shape_{96, 6, 2, 256, 16, 1, 4},
                           Shape_{128, 8, 8, 344, 24, 3, 16}}) {
        Architecture m;
        m.name = "tiny", m.hidden = x.h, m.layers = 2, m.heads = x.heads, m.kv_heads = x.kv,
        m.ffn = x.f, m.vocab = 100;
        const std::uint64_t tokens = x.s * x.b, q_out = x.h, v_out = x.kv * (x.h / x.heads);
        CAPTURE(x.h, x.kv, x.s, x.b);
        for (const bool dropout : {false, true})
            for (const bool fp32 : {false, true}) {
                CAPTURE(dropout, fp32);
                FineTuning lo = lora(x.r, {"q_proj", "v_proj"});
                lo.lora.dropout = dropout, lo.lora.fp32 = fp32;
                FineTuning d = lo;
                d.lora.variant = LoraVariant::dora;
                const LayerActivations l = architecture_layer(
                    m, x.s, x.b, DType::bf16, Attention::eager, Platform::cuda, {},
                    layer_tuning(fine_tuned_table(m, parameter_table(m), lo), lo, 0));
                const LayerActivations dl = architecture_layer(
                    m, x.s, x.b, DType::bf16, Attention::eager, Platform::cuda, {},
                    layer_tuning(fine_tuned_table(m, parameter_table(m), d), d, 0));
                const std::uint64_t own = fp32 ? 4 : 2, base = dropout ? own : 2;
                std::uint64_t extra = 0;
                for (const std::uint64_t out : {q_out, v_out})
                    extra += tokens * out * (base + own) + 3 * out * own +
                             (dropout && fp32 ? out * x.h * own : 0);
                CHECK(dl.total().value() == l.total().value() + extra);
                // The weight norm's workspace: I (in x in), B A, W + scaled B A, the scaled term,
                // and W cast where it is; q_proj (in = out = h) is the largest.
                const Workspace& norm = fixtures::workspace_named(dl, "DoRA weight norm");
                CHECK(norm.bytes.value() ==
                      (x.h * x.h + (fp32 ? 4 : 3) * x.h * q_out + x.h * x.r) * own);
                // Backward, assumed (leaning high): four s b out tensors of the widest adapted
                // linear, q_proj's.
                CHECK(fixtures::workspace_named(dl, "DoRA backward").bytes.value() ==
                      4 * tokens * q_out * own);
            }
    }
    // QDoRA with a dropout: the dequantised weight is kept even for adapters of the model's dtype.
    const Architecture m = fixtures::llama_7b();
    FineTuning q = dora(8, {"v_proj"}, Training::qlora);
    q.lora.fp32 = false;
    const LayerActivations ql =
        architecture_layer(m, 64, 1, DType::bf16, Attention::flash, Platform::cuda, {},
                           layer_tuning(fine_tuned_table(m, parameter_table(m), q), q, 0));
    bool weight_kept = false;
    for (const auto& row : ql.rows)
        if (row.tensor == "the base weight, dequantised")
            weight_kept = row.bytes == Count(4096ULL * 4096 * 2);
    CHECK(weight_kept);
}

TEST_CASE("Frozen routed experts' first projections: their forward's workspace per routed slot",
          "[finetune][moe]") {
    // Mixtral-like layers (8 experts, 2 a token) on two shapes: under LoRA on q,v the experts' gate
    // and up keep no input, but make the gathered tokens (s b k h), their two outputs and act(gate)
    // (s b k f each) beside the norm's output (s b h), as a dense MLP's frozen linears do, and the
    // residual stream (stream_other).
    struct Shape_ {
        std::uint64_t h, f, experts, k, s, b;
    };
    for (const Shape_ x : {Shape_{64, 224, 8, 2, 32, 2}, Shape_{96, 160, 4, 1, 16, 3},
                           Shape_{4096, 14336, 8, 2, 64, 1}}) {
        Architecture m;
        m.name = "mixtral-like", m.hidden = x.h, m.layers = 2, m.heads = 8, m.kv_heads = 4,
        m.ffn = x.f, m.vocab = 100;
        m.experts = x.experts, m.experts_per_token = x.k;
        CAPTURE(x.h, x.f, x.experts, x.k);
        const std::uint64_t tokens = x.s * x.b, slots = tokens * x.k, sbh = tokens * x.h;
        FineTuning f = lora(8, {"q_proj", "v_proj"});
        const LayerActivations l =
            architecture_layer(m, x.s, x.b, DType::bf16, Attention::flash, Platform::cuda, {},
                               layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0));
        const Workspace& first =
            fixtures::workspace_named(l, "experts: first projections (frozen)");
        CHECK(first.bytes.value() == slots * x.h * 2 + sbh * 2 + 3 * slots * x.f * 2);
        CHECK(fixtures::stream_other(l, first) == sbh * 2);
        // The down projection's, per slot too: its input (s b k f), its output (s b k h), the MLP's
        // input.
        const Workspace& down = fixtures::workspace_named(l, "experts: down projection (frozen)");
        CHECK(down.bytes.value() == slots * x.f * 2 + slots * x.h * 2 + sbh * 2);
        CHECK(fixtures::stream_other(l, down) == sbh * 2);
        // Adapters on the experts' gate_proj (fp32, dropout): each keeps its cast input; the scaled
        // output, and the sum in fp32, beside the largest output; and their input gradient's sum in
        // backward.
        FineTuning g = lora(8, {"gate_proj"});
        const LayerActivations gl =
            architecture_layer(m, x.s, x.b, DType::bf16, Attention::flash, Platform::cuda, {},
                               layer_tuning(fine_tuned_table(m, parameter_table(m), g), g, 0));
        CHECK(fixtures::workspace_named(gl, "experts: first projections (frozen)").bytes.value() ==
              slots * x.h * 2 + sbh * 2 + 3 * slots * x.f * 2 + slots * x.f * (4 + 4));
        CHECK(fixtures::workspace_named(gl, "experts: first projections backward (LoRA)")
                  .bytes.value() == slots * x.h * std::max<std::uint64_t>(3 * 2, 2 * 4 + 2));
    }
}

TEST_CASE(
    "bitsandbytes' stored bytes for Llama-3-8B's linears and a shape whose blocks do not divide",
    "[finetune][qlora]") {
    // bitsandbytes' quantize_4bit(blocksize 64, compress_statistics, nf4) stores per weight of n
    // elements: (n + 1) / 2 packed bytes, ceil(n / 64) absmax quantised to uint8
    // (quantize_blockwise, blocksize 256), ceil(ceil(n / 64) / 256) fp32 second-level absmax, an
    // fp32 offset and a 16-entry fp32 code.
    const auto bnb = [](std::uint64_t n) {
        const std::uint64_t blocks = (n + 63) / 64;
        return (n + 1) / 2 + blocks + (blocks + 255) / 256 * 4 + 4 + 16 * 4;
    };
    // Llama-3-8B: per layer q, o 4096 x 4096; k, v 4096 x 1024; gate, up, down 4096 x 14336. By
    // hand: 2 (8,388,608 + 262,144 + 4,096 + 68) + 2 (2,097,152 + 65,536 + 1,024 + 68) + 3
    // (29,360,128 + 917,504 + 14,336 + 68).
    const std::uint64_t layer = 2 * 8654916 + 2 * 2163780 + 3 * 30292036;
    CHECK(layer == 2 * bnb(4096 * 4096) + 2 * bnb(4096 * 1024) + 3 * bnb(4096 * 14336));
    CHECK(layer * 32 == 3600432000ULL);
    // The rest in bf16: embeddings and head (128,256 x 4096 each), 65 norms of 4096; adapters r =
    // 16 in bf16.
    const Report q =
        Estimator(llama_3_8b()).estimate(tuned(lora(16, {"all-linear"}, Training::qlora)));
    CHECK(q.state.weights.value() == 3600432000ULL + (2 * 525336576ULL + 65 * 4096 + 41943040) * 2);

    // SmolLM-135M's shape (h 576, 9 heads over 3, f 1536, 30 layers, tied): q and o have 5,184
    // blocks, k and v 1,728, so their second-level scales round up per tensor (21 and 7 of 256), as
    // bitsandbytes stores each Linear4bit on its own.
    Architecture smol;
    smol.name = "smollm-135m", smol.hidden = 576, smol.layers = 30, smol.heads = 9,
    smol.kv_heads = 3, smol.ffn = 1536;
    smol.vocab = 49152, smol.tied_embeddings = true;
    const std::uint64_t smol_layer = 2 * bnb(576 * 576) + 2 * bnb(576 * 192) + 3 * bnb(576 * 1536);
    CHECK(smol_layer == 2 * (165888 + 5184 + 21 * 4 + 68) + 2 * (55296 + 1728 + 7 * 4 + 68) +
                            3 * (442368 + 13824 + 54 * 4 + 68));
    const Report s = Estimator(smol).estimate(tuned(lora(8, {"all-linear"}, Training::qlora)));
    const std::uint64_t adapters = trainable_parameters(*s.parameters).value();
    CHECK(adapters ==
          30 * 8 * (2 * (576 + 576) + 2 * (576 + 192) + 2 * (576 + 1536) + (1536 + 576)));
    CHECK(s.state.weights.value() == smol_layer * 30 + (49152 * 576 + 61 * 576 + adapters) * 2);
}

TEST_CASE("memcalc --lora-variant dora and the CSV's training column", "[finetune][cli][dora]") {
    const auto d = testing::memcalc(
        "--preset llama-7b --seq 512 --train lora --lora-variant dora --format json");
    REQUIRE(d.status == 0);
    const auto j = nlohmann::json::parse(d.out);
    CHECK(j["parameters"]["trainable"] == 4194304 + 32 * 2 * 4096);
    CHECK(j["settings"]["training"]["lora"]["variant"] == "dora");
    CHECK_THAT(
        testing::memcalc("--preset llama-7b --seq 512 --train qlora --lora-variant dora").out,
        Catch::Contains("training qlora (DoRA, rank 8 on q_proj, v_proj"));
    // The training column comes last, so the columns before it keep their places.
    const auto header_and_row = [](const std::string& flags) {
        const auto run = testing::memcalc("--preset llama-7b --seq 512,1024 --format csv " + flags);
        REQUIRE(run.status == 0);
        return run.out;
    };
    const std::string full = header_and_row(""), q = header_and_row("--train qlora");
    CHECK(
        full.rfind(
            "model,seq,micro_batch,recompute,recipe,activations,attention,parameters,state_bytes,",
            0) == 0);
    // training, then partial recomputation's recompute_layers (empty: every layer of the mode).
    CHECK_THAT(full,
               Catch::Contains("first_stage_layers,last_stage_layers,training,recompute_layers,"));
    // then the verdict's usable_bytes, fits and spare_bytes: empty without a device
    CHECK_THAT(full, Catch::Contains(",full,,,,\nllama-7b,1024,"));
    CHECK(full.substr(full.size() - 10) == ",full,,,,\n");
    CHECK_THAT(q, Catch::Contains(",qlora,,,,\nllama-7b,1024,"));
    CHECK(q.substr(q.size() - 11) == ",qlora,,,,\n");
}

TEST_CASE("memcalc fit says what trains in its CSV and JSON", "[finetune][cli][fit]") {
    const auto csv = testing::memcalc(
        "fit --preset llama-3.2-1b --train lora --device-memory 24GB --format csv");
    REQUIRE(csv.status == 0);
    CHECK(csv.out.rfind("model,search,recompute,largest,peak_bytes,peak_step,peak_stage,headroom_"
                        "bytes,next_size,"
                        "next_peak_bytes,training,device_bytes,next_device_bytes\n",
                        0) == 0);
    CHECK_THAT(csv.out, Catch::Contains(",lora,"));
    const auto json = testing::memcalc(
        "fit --preset llama-3.2-1b --train qlora --device-memory 24GB --format json");
    REQUIRE(json.status == 0);
    CHECK(nlohmann::json::parse(json.out)["training"] == "qlora");
}

TEST_CASE("LoRA's errors name the rank that overflows and all-linear given beside names",
          "[finetune][cli][errors]") {
    const std::string lora = "--preset llama-7b --train lora --activations architecture ";
    const std::string rank = "--lora-rank 18446744073709551615";
    const std::string says = "lora rank 18446744073709551615 makes the adapters of llama-7b";
    const std::string plan = "plan " + lora + rank +
                             " --device-memory 80GB --gpus 8 --seq 4096 "
                             "--global-batch 8";
    for (const std::string& args : {lora + rank, lora + "--lora-rank 4503599627370496", plan}) {
        CAPTURE(args);
        const auto bad = testing::memcalc(args);
        CHECK(bad.status != 0);
        CHECK(bad.out.empty());
        CHECK_THAT(bad.err, Catch::Contains(args.find("4503599627370496") != std::string::npos
                                                ? "lora rank 4503599627370496 makes the adapters"
                                                : says));
    }
    const auto mixed = testing::memcalc(lora + "--lora-targets all-linear,q_proj");
    CHECK(mixed.status != 0);
    CHECK(mixed.out.empty());
    CHECK(mixed.err ==
          "memcalc: lora target all-linear adapts every linear layer: give it "
          "alone, or names alone (got all-linear,q_proj)\n");
}

TEST_CASE("A checkpointed layer's tape holds the gradients made before its rerun while it rebuilds",
          "[finetune][tape]") {
    // LoRA on the down projection, whose output the layer's last add takes as it is: the rerun
    // starts with the adapter's gradients made, as torch's non-reentrant checkpoint runs it.
    for (const std::uint64_t h : {64, 96}) {
        Architecture m = fixtures::llama_7b();
        m.hidden = h, m.layers = 2, m.heads = 4, m.kv_heads = 2, m.ffn = 3 * h, m.vocab = 100;
        const FineTuning f = lora(4, {"down_proj"});
        const LayerActivations l =
            architecture_layer(m, 16, 2, DType::bf16, Attention::eager, Platform::cuda, {},
                               layer_tuning(fine_tuned_table(m, parameter_table(m), f), f, 0));
        REQUIRE(fixtures::rerun_bytes(l) > 0);
        for (Recompute mode : {Recompute::none, Recompute::full, Recompute::op}) {
            CAPTURE(h, recompute_name(mode));
            const tape::Tape tp = tape::from_program(l, mode);
            const std::vector<SplitBytes> live = tape::live_after_each(tp);
            std::size_t held_at_rebuild = 0, rebuilds = 0;
            bool held = false;
            for (std::size_t i = 0; i < tp.events.size(); ++i) {
                const tape::Event& e = tp.events[i];
                if (tp.tensors[e.tensor].name == Text("the gradients made before the rerun"))
                    held = e.kind == tape::EventKind::alloc;
                if (e.kind != tape::EventKind::rebuild) continue;
                ++rebuilds;
                if (held) ++held_at_rebuild;
                CHECK(live[i].total() >= Count(fixtures::rerun_bytes(l)));
            }
            CHECK(held_at_rebuild == rebuilds);
            CHECK((rebuilds > 0) == (mode != Recompute::none));
        }
    }
}

TEST_CASE("DoRA's backward is a linear's op: it names the linear whose weight it writes",
          "[finetune][dora]") {
    // Workspace::linear: the first adapted linear; in a kind with no adapter (a dense
    // layer beside experts, DoRA on the router alone) its 0 bytes count beside a fresh gradient
    // as they did when weightless was a flag, through the first frozen linear.
    Architecture m;
    m.name = "tiny", m.hidden = 64, m.layers = 2, m.heads = 4, m.kv_heads = 4, m.ffn = 176,
    m.vocab = 100;
    const FineTuning d = dora(8, {"v_proj", "down_proj"});
    LayerTuning tuning = layer_tuning(fine_tuned_table(m, parameter_table(m), d), d, 0);
    const auto backward = [&] {
        const LayerActivations l =
            architecture_layer(m, 16, 2, DType::bf16, Attention::eager, Platform::cuda, {}, tuning);
        return fixtures::workspace_named(l, "DoRA backward");
    };
    CHECK(backward().linear == Linear::v);
    CHECK_FALSE(backward().weightless());
    tuning.adapted = 0;
    CHECK(backward().bytes.value() == 0);
    CHECK(backward().linear == Linear::q);
    CHECK_FALSE(backward().weightless());
}
