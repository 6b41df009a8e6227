// torch.compile on each layer (Architecture::compile): what the min-cut partition keeps, as
// validation/compile_partitioner.py measured it on torch 1.13 for nanoGPT, llama2.c, transformers'
// LLaMA and GPT-2 and torch's TransformerEncoderLayer, and on torch 2.6 (torch.compile with
// inductor) for nanoGPT, llama2.c and the TransformerEncoderLayer; here on other shapes.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {

LayerActivations layer(const Architecture& m, std::uint64_t s, std::uint64_t b,
                       TorchVersion torch = TorchVersion::v2_2) {
    return architecture_layer(m, s, b, DType::bf16, Attention::flash, {Platform::cuda, torch});
}

Architecture compiled(Architecture m) {
    m.compile = Compile::layers;
    return m;
}

Architecture with_activation(Architecture m, Activation a) {
    m.activation = a;
    return m;
}

}  // namespace

TEST_CASE(
    "a compiled LLaMA-style layer keeps RMSNorm's input and 1/rms, gate, up and their "
    "product: the fp32 copies, x_norm and SiLU's output are made again in backward",
    "[compile][architecture]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::mistral_7b());
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    const TorchVersion torch = GENERATE(TorchVersion::v1_13, TorchVersion::v2_2);
    CAPTURE(m.name, s, b, torch_version_name(torch));
    const std::uint64_t sbh = s * b * m.hidden, sbf = s * b * m.ffn;
    // Per norm: the fp32 copy (4 sbh), x^2 before torch 2.2 (4 sbh), x_norm (2 sbh) go; its bf16
    // input (2 sbh) stays. SiLU's output (2 sbf) goes.
    const std::uint64_t mean_input = torch == TorchVersion::v1_13 ? 4 : 0;
    CHECK(layer(m, s, b, torch).total().value() - layer(compiled(m), s, b, torch).total().value() ==
          2 * (4 + mean_input) * sbh + 2 * sbf);
    // What the partition keeps is what the fused kernels keep, under every recomputation.
    Architecture fused = m;
    fused.rmsnorm_kernel = RmsnormKernel::fused, fused.fused_glu = true;
    for (Recompute mode : {Recompute::none, Recompute::selective, Recompute::full})
        CHECK(layer(compiled(m), s, b, torch).sum(mode) == layer(fused, s, b, torch).sum(mode));
}

TEST_CASE(
    "a compiled plain MLP makes the activation's output again for the down projection where "
    "measured so, and keeps every tensor of a function not measured",
    "[compile][architecture]") {
    const Architecture gpt = fixtures::gpt2_small();
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    struct Row {
        Activation activation;
        TorchVersion torch;
        std::uint64_t recomputed;  ///< 2 s b f tensors the partition makes again
    };
    // torch 1.13: gelu's output, and gelu_new's output, 0.5 x and 1 + tanh (its input and tanh's
    // output kept), made again. torch 2.6's torch.compile keeps gelu's output; gelu_new on it was
    // not measured. The rest not measured, kept whole.
    const Row row = GENERATE(Row{Activation::gelu, TorchVersion::v1_13, 1},
                             Row{Activation::gelu_new, TorchVersion::v1_13, 3},
                             Row{Activation::gelu, TorchVersion::v2_2, 0},
                             Row{Activation::gelu_new, TorchVersion::v2_2, 0},
                             Row{Activation::gelu_tanh, TorchVersion::v1_13, 0},
                             Row{Activation::quick_gelu, TorchVersion::v2_2, 0},
                             Row{Activation::relu2, TorchVersion::v1_13, 0});
    CAPTURE(activation_function(row.activation).name, torch_version_name(row.torch), s, b);
    const Architecture m = with_activation(gpt, row.activation);
    // LayerNorm keeps its input and statistics either way.
    CHECK(layer(m, s, b, row.torch).total().value() -
              layer(compiled(m), s, b, row.torch).total().value() ==
          row.recomputed * 2 * s * b * m.ffn);
}

TEST_CASE(
    "where the partition was not measured a compiled layer keeps eager's rows: q and k's "
    "norms, the experts' activations",
    "[compile][architecture]") {
    const std::uint64_t s = GENERATE(16, 100), b = GENERATE(1, 2);
    const Architecture llama = fixtures::llama_7b();
    const std::uint64_t sbh = s * b * llama.hidden, sbf = s * b * llama.ffn;
    Architecture normed = llama;
    normed.qk_norm = QkNorm::per_head;
    // Only the two stream norms and SiLU's output change, q and k's norms or not.
    CHECK(layer(normed, s, b).total().value() - layer(compiled(normed), s, b).total().value() ==
          2 * 4 * sbh + 2 * sbf);
    // Mixtral's experts keep SiLU's output: only its two stream norms change.
    const Architecture moe = fixtures::mixtral();
    CHECK(layer(moe, s, b).total().value() - layer(compiled(moe), s, b).total().value() ==
          2 * 4 * s * b * moe.hidden);
}

TEST_CASE("compiling the layers leaves the embedding, the final norm, the head and the loss eager",
          "[compile][architecture]") {
    const Architecture m = GENERATE(fixtures::llama_7b(), fixtures::gpt2_small());
    const std::uint64_t s = GENERATE(16, 100);
    const Precision bf16 = DType::bf16;
    CHECK(saved_bytes(head_saved(m, s, 2, bf16)) ==
          saved_bytes(head_saved(compiled(m), s, 2, bf16)));
    CHECK(saved_bytes(input_side_saved(m, s, 2, bf16)) ==
          saved_bytes(input_side_saved(compiled(m), s, 2, bf16)));
}

TEST_CASE("compiled layers need the architecture model: Korthikanti's formula has no ops to keep",
          "[compile][errors]") {
    Settings s;
    s.seq = 128;
    CHECK_THROWS_WITH(estimate(compiled(fixtures::llama_7b()), s),
                      Catch::Contains("compile layers needs the architecture activation model"));
    s.activations = ActivationModel::architecture;
    CHECK(estimate(compiled(fixtures::llama_7b()), s).busiest().peak_step().bytes.total() >
          Count(0));
}
