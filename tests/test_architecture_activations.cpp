// The architecture-aware table against closed forms derived from validation/reference_trainer.py's
// measurements (torch 1.13, CPU), corrected by the documented effects to current CUDA PyTorch.
#include <array>
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "workspace_named.hpp"
#include "memcalc/architecture_activations.hpp"

using namespace memcalc;
using fixtures::beside;
using fixtures::gradients_from;
using fixtures::stream_input;
using fixtures::stream_other;
using fixtures::swept;
using fixtures::workspace_named;

namespace {
Architecture llama_like(std::uint64_t h, std::uint64_t a, std::uint64_t kv, std::uint64_t f) {
    Architecture m = fixtures::llama_7b();
    m.hidden = h, m.heads = a, m.kv_heads = kv, m.ffn = f;
    return m;
}
/// GPT-2's layer at another width, with its attention and residual dropouts.
Architecture gpt_with_dropout(std::uint64_t h, std::uint64_t a, std::uint64_t f) {
    Architecture m = fixtures::gpt2_small();
    m.hidden = h, m.heads = a, m.ffn = f, m.attention_dropout = 0.1, m.hidden_dropout = 0.1;
    return m;
}
}  // namespace

TEST_CASE("LLaMA-style layers: sb(16h + 8 + 8ad + 8f) + 6 a s^2 b with repeated k and v",
          "[architecture]") {
    using Row = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    const auto [h, a, kv, f] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>({
            Row{64, 4, 2, 176},
            Row{4096, 32, 8, 14336},
            Row{8192, 64, 8, 28672},
            Row{2048, 16, 1, 5632},
        }));
    const std::uint64_t s = GENERATE(16, 1000), b = GENERATE(1, 3);
    CAPTURE(h, a, kv, f, s, b);
    const Architecture m = llama_like(h, a, kv, f);
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    const std::uint64_t sb = s * b, d = h / a;
    // RMSNorm x2: 4 sbh fp32 copy + 4 sb + 2 sbh; q/k/v input 2 sbh; q, repeated k and v, o input 2
    // sb(ad) each; fp32 softmax 4 and its bf16 cast 2 per a s^2 b; MLP input 2 sbh; SwiGLU 4 x 2
    // sbf.
    CHECK(layer.total().value() == sb * (16 * h + 8 + 8 * a * d + 8 * f) + 6 * a * s * s * b);
    // Selective keeps k and v before the repeat (k heads) and drops every s x s tensor.
    CHECK(layer.kept(Recompute::selective).value() ==
          sb * (16 * h + 8 + 4 * a * d + 4 * kv * d + 8 * f));
    CHECK(layer.rebuilt(Recompute::selective).value() ==
          sb * 4 * a * d + 6 * a * s * s * b);  // the repeated k, v too
    CHECK(layer.kept(Recompute::full).value() == 2 * sb * h);
}

TEST_CASE("GPT-2 layers: Korthikanti's 34 sbh + 5 as^2b plus LayerNorm statistics",
          "[architecture]") {
    // With f = 4h, dropout and LayerNorm the architecture's rows are the formula's, row for row,
    // except that each LayerNorm also keeps its mean and 1/std in fp32 (8 sb).
    Architecture m = fixtures::gpt2_small();
    m.attention_dropout = 0.1, m.hidden_dropout = 0.1, m.softmax_fp32 = false;
    const std::uint64_t s = GENERATE(64, 1024), b = GENERATE(1, 2);
    const LayerActivations arch = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    const LayerActivations formula = korthikanti_layer(m, s, b, 2);
    CHECK(arch.total().value() == formula.total().value() + 2 * 8 * s * b);
    CHECK(arch.kept(Recompute::selective).value() ==
          formula.kept(Recompute::selective).value() + 16 * s * b);
}

TEST_CASE("the chapter's Decoder by the architecture: 3,456 bytes per sequence per block",
          "[architecture]") {
    // No dropout, a 2h MLP: 24 sbh + 2 as^2b (the formula corrected for the Decoder's own shape)
    // + 16 sb of LayerNorm statistics. The reference trainer measures 3,392 on CPU, whose LayerNorm
    // keeps its statistics in bf16 (64 bytes fewer).
    const LayerActivations layer =
        architecture_layer(fixtures::decoder(), 8, 1, DType::bf16, Attention::eager);
    const std::uint64_t sbh = 8 * 16, as2b = 2 * 8 * 8;
    CHECK(layer.total().value() == 24 * sbh + 2 * as2b + 16 * 8);
    CHECK(layer.total().value() == 3456);
}

TEST_CASE("flash attention keeps no s x s tensor, a log-sum-exp per row instead",
          "[architecture]") {
    const Architecture m = llama_like(4096, 32, 8, 14336);
    const std::uint64_t s = GENERATE(1024, 8192);
    const LayerActivations eager = architecture_layer(m, s, 1, DType::bf16, Attention::eager);
    const LayerActivations flash = architecture_layer(m, s, 1, DType::bf16, Attention::flash);
    for (const auto& row : flash.rows) CHECK(row.symbol != "as^2b");
    // Doubling the sequence doubles a flash layer exactly: nothing grows with s^2.
    CHECK(architecture_layer(m, 2 * s, 1, DType::bf16, Attention::flash).total().value() ==
          2 * flash.total().value());
    CHECK(flash.total() < eager.total());
    // q, k and v at their own widths, the output, and the fp32 log-sum-exp (a s b).
    const std::uint64_t sb = s, h = 4096, a = 32, kv = 8, d = 128, f = 14336;
    CHECK(flash.total().value() ==
          sb * (16 * h + 8 + 2 * a * d + 4 * kv * d + 2 * a * d + 8 * f) + 4 * a * sb);
}

TEST_CASE("mixture of experts: every token's k slots, whatever the routing", "[architecture]") {
    Architecture m = llama_like(64, 4, 2, 96);
    m.experts = 4, m.experts_per_token = 2;
    const std::uint64_t s = GENERATE(16, 32), b = GENERATE(1, 2);
    const std::uint64_t sb = s * b, h = 64, a = 4, d = 16, f = 96, E = 4, k = 2;
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    // The measured HF sparse block (reference trainer): router softmax 4E, top-k indices and
    // renormalised weights 12k, their sum 4, and per routed slot 6h + 8f + 18.
    CHECK(layer.total().value() ==
          sb * (16 * h + 12 + 8 * a * d + 4 * E + 12 * k + k * (6 * h + 8 * f + 18)) +
              6 * a * s * s * b);
}

TEST_CASE("the head and the embedding side", "[architecture]") {
    const Architecture m = fixtures::llama_7b();
    const std::uint64_t s = 4096, V = 32000, h = 4096;
    // final RMSNorm (6 sbh + 4 sb), the head's input (2 sbh), fp32 log-probabilities (4 sbV), int64
    // targets (8 sb)
    CHECK(saved_bytes(head_saved(m, s, 1, DType::bf16)).value() ==
          8 * s * h + 4 * s + 4 * s * V + 8 * s);
    // token ids (8 sb) and the rotary cos and sin tables (2 x 2 s d)
    CHECK(saved_bytes(input_side_saved(m, s, 1, DType::bf16)).value() == 8 * s + 4 * s * 128);
}

TEST_CASE("workspaces of a LLaMA layer: the scores, softmax and SwiGLU temporaries, by hand",
          "[architecture][workspace]") {
    const std::uint64_t h = 64, a = 4, kv = 2, f = 176, d = 16;
    const Architecture m = llama_like(h, a, kv, f);
    const std::uint64_t s = GENERATE(8, 64, 1000), b = GENERATE(1, 3);
    CAPTURE(s, b);
    const std::uint64_t sb = s * b, A = a * s * s * b;
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    REQUIRE(layer.work.size() == 7 + 2 * 3);  // and each RMSNorm's three backward ops
    // The product with V's backward: the weights' gradient (2A), the output's and the repeated v's
    // (2 sb(ad) each).
    CHECK(workspace_named(layer, "attention over V backward").bytes.value() ==
          2 * A + 4 * sb * a * d);
    CHECK(workspace_named(layer, "Q K^T / sqrt(d) + mask").bytes.value() == 4 * A);
    // Its bf16 input and the fp32 copy it softmaxes (measured on an H200, torch 2.11).
    CHECK(workspace_named(layer, "softmax").bytes.value() == 6 * A);
    const Workspace& softmax = workspace_named(layer, "softmax backward");
    // Its output's fp32 gradient and the two fp32 tensors CUDA's backward makes.
    CHECK(softmax.bytes.value() == 12 * A);
    CHECK(gradients_from(layer, softmax) == Linear::o);
    // Freed by then: the bf16 weights (2A), the output projection's input, the MLP norm and input,
    // SwiGLU's 8 sbf.
    const std::uint64_t later =
        2 * A + 2 * sb * a * d + (4 * sb * h + 4 * sb + 2 * sb * h) + 2 * sb * h + 8 * sb * f;
    CHECK(swept(layer, softmax, Recompute::none).covered.value() == later);
    CHECK(swept(layer, softmax, Recompute::none).adds().value() ==
          (12 * A > later ? 12 * A - later : 0));
    // Selective recomputation rebuilds the same rows for the backward step: the same effect.
    CHECK(swept(layer, softmax, Recompute::selective).covered.value() == later);
    // gate x up's backward: its incoming gradient and both factors' (3 x 2 sbf), the down input
    // freed.
    const Workspace& swiglu = workspace_named(layer, "gate x up backward");
    CHECK(swiglu.bytes.value() == 6 * sb * f);
    CHECK(gradients_from(layer, swiglu) == Linear::down);
    CHECK(swept(layer, swiglu, Recompute::none).adds().value() == 4 * sb * f);
    // The down projection's backward: its input's gradient (2 sbf), its input (gate x up) still
    // live.
    const Workspace& down = workspace_named(layer, "down projection backward");
    CHECK(down.bytes.value() == 2 * sb * f);
    CHECK(gradients_from(layer, down) == Linear::down);
    CHECK(swept(layer, down, Recompute::none).covered.value() == 0);
    CHECK(down.linear == Linear::down);
    CHECK_FALSE(down.weightless());
    CHECK(swiglu.weightless());
    CHECK(softmax.weightless());
    // In a full recomputation's forward nothing is kept, so the scores come on top of all made
    // before.
    const Workspace& scores = workspace_named(layer, "Q K^T / sqrt(d) + mask");
    CHECK(swept(layer, scores, Recompute::full).covered.value() == 0);
    CHECK(swept(layer, scores, Recompute::full).adds() > scores.bytes);
    // The last add: the layer's input and the attention half's sum (an RMSNorm keeps only fp32
    // copies of them), the MLP's output and the new sum, 4 x 2 sbh; not modelled under full.
    const Workspace& last = workspace_named(layer, "residual add (the layer's last op)");
    CHECK(last.bytes.value() == 8 * sb * h);
    CHECK(swept(layer, last, Recompute::none).adds().value() == 8 * sb * h);
    CHECK(swept(layer, last, Recompute::selective).adds().value() == 8 * sb * h);
    CHECK(swept(layer, last, Recompute::full).adds().value() == 0);
}

TEST_CASE("an RMSNorm's backward op by op, in a layer and as the final norm, by hand",
          "[architecture][workspace]") {
    const std::uint64_t h = GENERATE(64, 96), s = GENERATE(8, 40), b = GENERATE(1, 2);
    CAPTURE(h, s, b);
    const std::uint64_t sbh = s * b * h, sb = s * b;
    Architecture m = llama_like(h, 4, 2, 176);
    m.vocab = GENERATE(65, 1000);
    const std::uint64_t sbV = sb * m.vocab;
    const std::string pow = " (RMSNorm) backward: pow(x, 2)";
    const auto ops = [&](const LayerActivations& l, const std::string& what) {
        return std::array<std::uint64_t, 3>{
            workspace_named(l, what + " (RMSNorm) backward: x_norm * weight").bytes.value(),
            workspace_named(l, what + " (RMSNorm) backward: x * rsqrt").bytes.value(),
            workspace_named(l, what + pow).bytes.value()};
    };
    // bf16: the weight's product 3 x 2 sbh; x * rsqrt 3 x 4 sbh; pow five fp32 sbh.
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    CHECK(ops(layer, "attention norm") ==
          std::array<std::uint64_t, 3>{6 * sbh, 12 * sbh, 20 * sbh});
    // In a layer the rows after it are gone by then: the attention norm's pow adds nothing.
    CHECK(swept(layer, workspace_named(layer, "attention norm" + pow), Recompute::none)
              .adds()
              .value() == 0);
    // The final norm's pow runs after the loss's and the head's backward: freed by then the
    // log-probabilities (bf16 loss: 2 sbV), the target ids, the head's input, x_norm and 1/rms.
    const LayerActivations head = head_program(m, s, b, DType::bf16, {}, LossKernel::bf16);
    const std::uint64_t freed = 2 * sbV + 8 * sb + 2 * sbh + 2 * sbh + 4 * sb;
    CHECK(swept(head, workspace_named(head, "final norm" + pow), Recompute::none).covered.value() ==
          freed);
    // Before torch 2.2 mean() kept x^2 (4 sbh), freed before pow's backward.
    const LayerActivations old_head = head_program(
        m, s, b, DType::bf16, Runtime{Platform::cuda, TorchVersion::v1_13}, LossKernel::bf16);
    CHECK(swept(old_head, workspace_named(old_head, "final norm" + pow), Recompute::none)
              .covered.value() == freed + 4 * sbh);
    // Autocast: the stream is fp32, so is x_norm: the weight's product holds 3 x 4 sbh.
    const Precision amp{DType::bf16, DType::fp32, true};
    CHECK(ops(head_program(m, s, b, amp), "final norm")[0] == 12 * sbh);
    // A frozen weight takes no gradient: no x_norm kept, the product holds two tensors.
    LayerTuning frozen;
    frozen.frozen_norms = true;
    CHECK(ops(head_program(m, s, b, DType::bf16, {}, LossKernel::fp32, frozen), "final norm")[0] ==
          4 * sbh);
}

TEST_CASE("forward workspaces find the residual stream's unkept tensors beside them",
          "[architecture][workspace]") {
    // The caller holds the layer's input, and the MLP half runs beside the attention half's sum; no
    // row keeps either where an RMSNorm keeps only an fp32 copy (measured: cpu-rotary-wide512.json,
    // selective forward).
    const std::uint64_t h = GENERATE(64, 96), s = GENERATE(8, 40), b = GENERATE(1, 2);
    CAPTURE(h, s, b);
    const std::uint64_t sbh = s * b * h;
    const Architecture llama = llama_like(h, 4, 2, 176);
    const LayerActivations l = architecture_layer(llama, s, b, DType::bf16, Attention::eager);
    const Workspace& softmax = workspace_named(l, "softmax");
    CHECK(stream_input(l, softmax) == 2 * sbh);
    CHECK(stream_other(l, softmax) == 0);
    CHECK(stream_input(l, workspace_named(l, "residual add (the layer's last op)")) ==
          0);  // its bytes count it
    // It adds 2 sbh under none and selective recomputation; full recomputation's checkpoint keeps
    // the layer's input already, so there it adds nothing.
    LayerActivations bare = l;  // the same layer, softmax's stream input taken away
    for (std::size_t k = 1; k < bare.program.size(); ++k)
        if (bare.program[k].kind == StepKind::op && &l.work[bare.program[k].index] == &softmax)
            for (std::size_t j = bare.first_beside_of(k); j < k; ++j)
                if (std::string(bare.beside[bare.program[j].index].name) == "the layer's input")
                    bare.beside[bare.program[j].index].bytes = Count(0);
    for (const Recompute mode : {Recompute::none, Recompute::selective, Recompute::full}) {
        CAPTURE(recompute_name(mode));
        const std::uint64_t with = swept(l, softmax, mode).added.value();
        const Workspace& without = bare.work[std::size_t(&softmax - l.work.data())];
        CHECK(with - swept(bare, without, mode).added.value() ==
              (mode == Recompute::full ? 0 : 2 * sbh));
    }
    // (The MLP half's: the attention half's sum beside it too; test_finetune.cpp's frozen MLP
    // checks it.) An fp32 stream: the RMSNorm's fp32 "copy" is the stream itself, a row; a
    // LayerNorm keeps its input.
    const LayerActivations fp32 = architecture_layer(llama, s, b, DType::fp32, Attention::eager);
    CHECK(stream_input(fp32, workspace_named(fp32, "softmax")) == 0);
    Architecture gpt = llama;
    gpt.norm = Norm::layernorm, gpt.mlp = Mlp::plain, gpt.position = Position::learned,
    gpt.softmax_fp32 = false;
    const LayerActivations g = architecture_layer(gpt, s, b, DType::bf16, Attention::eager);
    CHECK(stream_input(g, workspace_named(g, "softmax")) == 0);
    // GPT-2's code holds the attention's output until the layer returns: 2 sbh more at the last
    // add.
    gpt.attention_output_held = true;
    const LayerActivations held = architecture_layer(gpt, s, b, DType::bf16, Attention::eager);
    CHECK(workspace_named(held, "residual add (the layer's last op)").bytes.value() ==
          workspace_named(g, "residual add (the layer's last op)").bytes.value() + 2 * sbh);
}

TEST_CASE("the CPU platform: bf16 LayerNorm statistics and a softmax over an fp32 copy",
          "[architecture][workspace]") {
    const Architecture llama = llama_like(64, 4, 2, 176);
    const std::uint64_t s = 32, A = 4 * s * s;
    const LayerActivations cuda =
        architecture_layer(llama, s, 1, DType::bf16, Attention::eager, Platform::cuda);
    const LayerActivations cpu =
        architecture_layer(llama, s, 1, DType::bf16, Attention::eager, Platform::cpu);
    CHECK(cuda.total() == cpu.total());  // RMSNorm has no statistics to keep
    CHECK(workspace_named(cpu, "softmax").bytes.value() == 6 * A);   // its input and the fp32 copy
    CHECK(workspace_named(cuda, "softmax").bytes.value() == 6 * A);  // bf16 is copied on CUDA too
    CHECK(workspace_named(cpu, "softmax backward").bytes.value() ==
          8 * A);  // the input's gradient in fp32 too
    CHECK(workspace_named(cuda, "softmax backward").bytes.value() == 12 * A);  // and one more
    // CUDA upcasts fp16 as it reads: no copy, and its backward's two tensors are fp16.
    const LayerActivations fp16 =
        architecture_layer(llama, s, 1, DType::fp16, Attention::eager, Platform::cuda);
    CHECK(workspace_named(fp16, "softmax").bytes.value() == 2 * A);
    CHECK(workspace_named(fp16, "softmax backward").bytes.value() == 8 * A);

    Architecture gpt2 = fixtures::gpt2_small();  // LayerNorm, softmax in the activations' dtype
    const LayerActivations g_cuda =
        architecture_layer(gpt2, s, 1, DType::bf16, Attention::eager, Platform::cuda);
    const LayerActivations g_cpu =
        architecture_layer(gpt2, s, 1, DType::bf16, Attention::eager, Platform::cpu);
    CHECK(g_cuda.total().value() ==
          g_cpu.total().value() + 2 * 4 * s);  // two LayerNorms, 8 sb in fp32, 4 sb in bf16
    const std::uint64_t G = 12 * s * s;
    CHECK(workspace_named(g_cpu, "softmax backward").bytes.value() == 4 * G);
    CHECK(workspace_named(g_cuda, "softmax backward").bytes.value() == 6 * G);
    // No repeat: v's gradient sits beside a v selective recomputation's checkpoint still holds, 2
    // sbh.
    CHECK(beside(g_cuda, workspace_named(g_cuda, "softmax backward"), Recompute::selective,
                 Holder::checkpoint) == 2 * s * 768);
    CHECK(beside(g_cuda, workspace_named(g_cuda, "softmax backward"), Recompute::none,
                 Holder::checkpoint) == 0);  // only selective recomputation's checkpoint
    CHECK(beside(cpu, workspace_named(cpu, "softmax backward"), Recompute::selective,
                 Holder::checkpoint) == 0);  // the repeat v goes as it comes
    const Workspace& g_softmax = workspace_named(g_cuda, "softmax backward");
    CHECK(swept(g_cuda, g_softmax, Recompute::selective).added.value() -
              swept(g_cuda, g_softmax, Recompute::none).added.value() ==
          2 * s * 768);
    CHECK(workspace_named(g_cuda, "GELU (tanh) backward").bytes.value() == 4 * s * 3072);
    // LayerNorm keeps its input, so the last add adds only the MLP's output and the sum.
    CHECK(workspace_named(g_cuda, "residual add (the layer's last op)").bytes.value() ==
          4 * s * 768);
    // The final LayerNorm too.
    CHECK(saved_bytes(head_saved(gpt2, s, 1, DType::bf16, Platform::cuda)).value() ==
          saved_bytes(head_saved(gpt2, s, 1, DType::bf16, Platform::cpu)).value() + 4 * s);
}

TEST_CASE("flash attention: one backward workspace and no mask", "[architecture][workspace]") {
    const Architecture m = llama_like(4096, 32, 8, 14336);
    const std::uint64_t s = 4096, sbq = s * 4096, sbkv = s * 1024;
    const LayerActivations flash = architecture_layer(m, s, 1, DType::bf16, Attention::flash);
    CHECK(workspace_named(flash, "flash attention backward").bytes.value() ==
          6 * sbq + 4 * sbkv + 4 * 32 * s);
    for (const auto& w : flash.work) CHECK(w.formula.find("as^2b") == std::string::npos);
    CHECK(forward_buffers(s, 1, DType::bf16, Attention::flash).empty());
    CHECK(saved_bytes(forward_buffers(s, 3, DType::bf16, Attention::eager)).value() ==
          2 * s * s * 3);
}

TEST_CASE(
    "nanoGPT's registered mask: masked_fill keeps a bool s^2 in each layer, no mask is shared",
    "[architecture][buffers]") {
    // Measured with torch 1.13: masked_fill(bias[:, :, :s, :s] == 0, -inf) saves the comparison's
    // (1, 1, s, s) bool result, whatever the batch and heads (validation/results/cpu-buffers.json).
    using Row = std::pair<Architecture, std::uint64_t>;
    const auto [shape, a] = GENERATE(table<Architecture, std::uint64_t>(
        {Row{fixtures::gpt2_small(), 12}, Row{llama_like(256, 4, 2, 704), 4}}));
    const std::uint64_t s = GENERATE(64, 1000), b = GENERATE(1, 3);
    CAPTURE(shape.hidden, s, b);
    Architecture added = shape, registered = shape;
    registered.causal_mask_buffer = CausalMaskBuffer::per_layer;
    const LayerActivations with =
        architecture_layer(registered, s, b, DType::bf16, Attention::eager);
    const LayerActivations without = architecture_layer(added, s, b, DType::bf16, Attention::eager);
    CHECK(with.total().value() == without.total().value() + s * s);
    CHECK(with.kept(Recompute::selective) ==
          without.kept(Recompute::selective));  // the checkpoint remakes it
    CHECK(with.rebuilt(Recompute::selective).value() ==
          without.rebuilt(Recompute::selective).value() + s * s);
    CHECK(with.kept(Recompute::full) == without.kept(Recompute::full));
    // The scaled scores and the filled ones, both bf16: 4 as^2b, with the bool mask beside them.
    CHECK(workspace_named(with, "Q K^T / sqrt(d), masked_fill").bytes.value() == 4 * a * s * s * b);
    CHECK(
        forward_buffers(s, b, DType::bf16, Attention::eager, CausalMaskBuffer::per_layer).empty());
    CHECK(saved_bytes(forward_buffers(s, b, DType::bf16, Attention::eager)).value() ==
          2 * s * s * b);
    // Flash attention: nanoGPT registers nothing and masks inside the kernel.
    CHECK(architecture_layer(registered, s, b, DType::bf16, Attention::flash).total() ==
          architecture_layer(added, s, b, DType::bf16, Attention::flash).total());
}

TEST_CASE(
    "q_norm and k_norm (Qwen3, Gemma 3) keep an RMSNorm's tensors per head: fp32 input, 1/rms, "
    "output",
    "[architecture][qk_norm]") {
    const std::uint64_t s = 512, b = 2;
    Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    CAPTURE(m.name);
    const std::uint64_t sbq = s * b * m.heads * m.head_size(),
                        sbkv = s * b * m.key_value_heads() * m.head_size();
    const std::uint64_t rows = s * b * (m.heads + m.key_value_heads());
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    const auto total = [&](const Architecture& a, DType d) {
        return architecture_layer(a, s, b, d, attention).total().value();
    };
    Architecture normed = m;
    normed.qk_norm = QkNorm::per_head;
    // bf16: the projection's output upcast (4), its normalised cast back (2), an fp32 1/rms per
    // head and token.
    CHECK(total(normed, DType::bf16) - total(m, DType::bf16) == 6 * (sbq + sbkv) + 4 * rows);
    // fp32: the input is the projection's output itself (4), the normalised one fp32 too (4).
    CHECK(total(normed, DType::fp32) - total(m, DType::fp32) == 8 * (sbq + sbkv) + 4 * rows);
    // Outside the core attention: every recomputation but full keeps them.
    const LayerActivations layer = architecture_layer(normed, s, b, DType::bf16, attention);
    CHECK(
        layer.sum(Recompute::selective).value() -
            architecture_layer(m, s, b, DType::bf16, attention).sum(Recompute::selective).value() ==
        6 * (sbq + sbkv) + 4 * rows);
}

TEST_CASE("a rotary embedding per layer: each layer keeps its own cos and sin, none is shared",
          "[architecture][buffers]") {
    // Measured with torch 1.13 (saved_tensors_hooks): q * cos and rotate_half(q) * sin keep the
    // layer's (1, 1, s, head_dim) cos and sin, whatever the batch; k's products the same two.
    using Row = std::pair<Architecture, std::uint64_t>;
    const auto [shape, d] = GENERATE(table<Architecture, std::uint64_t>(
        {Row{llama_like(256, 4, 2, 688), 64}, Row{fixtures::mistral_7b(), 128}}));
    const RotaryEmbedding kind =
        GENERATE(RotaryEmbedding::per_layer, RotaryEmbedding::per_layer_cached);
    const std::uint64_t s = GENERATE(64, 1000), b = GENERATE(1, 3);
    const Attention attention = GENERATE(Attention::eager, Attention::flash);
    CAPTURE(shape.hidden, rotary_embedding(kind).name, s, b, attention_name(attention));
    Architecture own = shape;
    own.rotary_embedding = kind;
    const LayerActivations with = architecture_layer(own, s, b, DType::bf16, attention);
    const LayerActivations shared = architecture_layer(shape, s, b, DType::bf16, attention);
    const std::uint64_t pair = 2 * s * d * 2;  // cos and sin, bf16
    CHECK(with.total().value() == shared.total().value() + pair);
    CHECK(with.kept(Recompute::selective).value() ==
          shared.kept(Recompute::selective).value() + pair);
    CHECK(with.kept(Recompute::full) == shared.kept(Recompute::full));
    // The model-level pair is gone: each layer made its own.
    CHECK(saved_bytes(input_side_saved(shape, s, b, DType::bf16)).value() ==
          saved_bytes(input_side_saved(own, s, b, DType::bf16)).value() + pair);
    // Under autocast they take v's dtype, bf16, as well.
    const Precision autocast{DType::bf16, DType::fp32, true};
    CHECK(architecture_layer(own, s, b, autocast, attention).total().value() ==
          architecture_layer(shape, s, b, autocast, attention).total().value() + pair);
}

TEST_CASE("learned positions have no rotary embedding to place", "[architecture][buffers]") {
    Architecture own = fixtures::gpt2_small();
    own.rotary_embedding = RotaryEmbedding::per_layer_cached;
    CHECK(
        architecture_layer(own, 128, 2, DType::bf16, Attention::eager).total() ==
        architecture_layer(fixtures::gpt2_small(), 128, 2, DType::bf16, Attention::eager).total());
}

TEST_CASE(
    "selective recomputation: the MLP half's backward runs before the core attention is rebuilt",
    "[architecture][workspace]") {
    // A GPT-style layer with dropout, of a width no validation model has: the checkpoint reruns the
    // core attention when backward first reaches it, after the MLP half's backward (measured:
    // cpu-recipes.json).
    const Architecture m = gpt_with_dropout(96, 3, 320);
    const std::uint64_t s = GENERATE(24, 200), b = GENERATE(1, 2);
    const Platform platform = GENERATE(Platform::cuda, Platform::cpu);
    CAPTURE(s, b, platform == Platform::cpu);
    const std::uint64_t sbh = s * b * 96, sbf = s * b * 320, A = 3 * s * s * b;
    const LayerActivations l = architecture_layer(m, s, b, DType::bf16, Attention::eager, platform);
    const auto sum = [&](const Workspace& w, Recompute mode, const LayerActivations& in) {
        return tape::workspace_sums(in, mode)[std::size_t(&w - in.work.data())];
    };
    // A dropout keeps bf16 noise on CPU (F.dropout), a bool mask on CUDA (native_dropout).
    const std::uint64_t noise = platform == Platform::cpu ? 2 : 1;
    // The MLP's workspaces see none of the attention's rebuilt rows (softmax, noise, dropped
    // weights); with nothing recomputed the same rows are kept, and live.
    const Workspace& gelu = workspace_named(l, "GELU (tanh) backward");
    CHECK(l.rebuilt(Recompute::selective).value() == (4 + noise) * A);
    CHECK(sum(gelu, Recompute::selective, l).covered.value() -
              sum(gelu, Recompute::none, l).covered.value() ==
          (4 + noise) * A);
    // Where the MLP half is rebuilt too, the step counts the larger half only: the attention's stay
    // uncounted.
    const LayerActivations both =
        architecture_layer(m, s, b, DType::bf16, Attention::eager, platform,
                           ModuleSet::of({Module::core_attn, Module::mlp}));
    const Workspace& gelu_both = workspace_named(both, "GELU (tanh) backward");
    CHECK(sum(gelu_both, Recompute::selective, both).covered.value() ==
          sum(gelu_both, Recompute::none, both).covered.value());
    // The core attention's first backward op, the product with V's: the weights' gradient, the
    // output's and v's (2 A + 4 sbh), on CPU two contiguous copies more (4 sbh), every row from the
    // output projection's input freed.
    const Workspace& over_v = workspace_named(l, "attention over V backward");
    CHECK(over_v.bytes.value() == 2 * A + (platform == Platform::cpu ? 8 : 4) * sbh);
    CHECK(gradients_from(l, over_v) == Linear::o);
    const std::uint64_t stats =
        (platform == Platform::cpu ? 4 : 8) * s * b;  // the MLP norm's mean and 1/std
    // The output projection's input, the MLP norm's and the up projection's (2 sbh each), two
    // residual dropouts' noise, the MLP norm's statistics, GELU's input and the down projection's
    // (2 sbf each).
    const std::uint64_t later = 3 * 2 * sbh + 2 * noise * sbh + stats + 2 * 2 * sbf;
    for (const Recompute mode : {Recompute::none, Recompute::selective}) {
        CAPTURE(recompute_name(mode));
        CHECK(sum(over_v, mode, l).covered.value() == later);
    }
}

TEST_CASE(
    "dropouts' own moments: the attention's forward, the residual's gradient at the down "
    "projection",
    "[architecture][workspace]") {
    // Measured with peak_live.py (GPT-2 with dropout, s = 512): under full recomputation forward 1
    // peaks at F.dropout's product over the scores, and every backward step at the down
    // projection's weight gradient, where the residual dropout's backward has made the output's
    // gradient. A width no validation model has.
    const Architecture m = gpt_with_dropout(80, 5, 288);
    const std::uint64_t s = GENERATE(20, 300), b = GENERATE(1, 3);
    const Platform platform = GENERATE(Platform::cuda, Platform::cpu);
    CAPTURE(s, b, platform == Platform::cpu);
    const std::uint64_t sbh = s * b * 80, sbf = s * b * 288, A = 5 * s * s * b;
    const std::uint64_t drawn =
        platform == Platform::cpu ? 2 : 1;  // CPU noise in bf16, CUDA's bool mask
    const LayerActivations l = architecture_layer(m, s, b, DType::bf16, Attention::eager, platform);
    const auto effect = [&](const Workspace& w, Recompute mode) {
        return tape::workspace_sums(l, mode)[std::size_t(&w - l.work.data())];
    };
    // The dropout over the scores draws its noise or mask and writes its output beside its input,
    // softmax's output.
    const Workspace& dropped = workspace_named(l, "attention dropout");
    CHECK_FALSE(dropped.backward);
    CHECK(dropped.bytes.value() == (drawn + 2) * A);
    // Without recomputation both are rows the step counts already; under full recomputation's
    // forward nothing is kept, so it outgrows softmax's moment (softmax's input beside the same
    // rows) by the noise or mask.
    CHECK(effect(dropped, Recompute::none).adds().value() == 0);
    const Workspace& softmax = workspace_named(l, "softmax");
    CHECK(effect(dropped, Recompute::full).adds().value() -
              effect(softmax, Recompute::full).adds().value() ==
          drawn * A);
    // The down projection's backward: its input's gradient and, after the residual dropout, its
    // output's (2 sbh).
    const Workspace& down = workspace_named(l, "down projection backward");
    CHECK(down.bytes.value() == 2 * sbf + 2 * sbh);
    Architecture undropped = m;
    undropped.hidden_dropout = 0;
    const LayerActivations plain =
        architecture_layer(undropped, s, b, DType::bf16, Attention::eager, platform);
    CHECK(workspace_named(plain, "down projection backward").bytes.value() == 2 * sbf);
}
