// The MLP's activation functions as rows: what each keeps, summed by hand from
// validation/activation_functions.py's measurements (torch 1.13, CPU, bf16), on plain and gated
// MLPs.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "fixtures.hpp"
#include "workspace_named.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/estimate.hpp"
#include "render.hpp"

using namespace memcalc;
using fixtures::gradients_from;
using fixtures::swept;
using fixtures::workspace_named;

namespace {
Architecture with(Architecture m, Activation a, double mlp_dropout = 0) {
    m.activation = a, m.mlp_dropout = mlp_dropout;
    return m;
}

/// The MLP's rows: everything from the activation's first kept tensor to the down projection's
/// input.
Count mlp_bytes(const LayerActivations& layer) {
    Count sum;
    bool inside = false;
    for (const auto& r : layer.rows) {
        inside = inside || r.op == "MLP up projections";
        if (inside && r.op != "MLP up projections") sum += r.bytes;
        if (r.op == "down projection") break;
    }
    return sum;
}
}  // namespace

TEST_CASE("each activation function's MLP keeps its measured tensors of s b f, plain and gated",
          "[activation_functions]") {
    // Per element of s b f, in bf16 tensors: what the function keeps (measured), then a plain MLP
    // adds the down projection's input (its output); a gated one the output, the up projection's
    // output and their product. ReLU's output is the tensor the next op keeps anyway.
    using Row = std::tuple<Activation, std::uint64_t, std::uint64_t>;
    const auto [activation, plain, gated] =
        GENERATE(table<Activation, std::uint64_t, std::uint64_t>({
            Row{Activation::silu, 1 + 1, 1 + 3},
            Row{Activation::gelu, 1 + 1, 1 + 3},
            Row{Activation::gelu_tanh, 1 + 1, 1 + 3},
            Row{Activation::relu, 0 + 1, 0 + 3},
            Row{Activation::gelu_new, 4 + 1,
                4 + 3},  // input, tanh, 0.5 x, 1 + tanh: five where a fused GELU keeps two
            Row{Activation::gelu_fast, 7 + 1, 7 + 3},
            Row{Activation::quick_gelu, 2 + 1, 2 + 3},
            // relu's output, square's input: one storage.
            Row{Activation::relu2, 1 + 1, 1 + 3},
        }));
    const std::uint64_t s = GENERATE(16, 1000), b = GENERATE(1, 3);
    CAPTURE(activation_function(activation).name, s, b);
    const Architecture gpt = with(fixtures::gpt2_small(), activation),
                       llama = with(fixtures::llama_7b(), activation);
    const std::uint64_t plain_sbf = s * b * 3072, gated_sbf = s * b * 11008;
    CHECK(mlp_bytes(architecture_layer(gpt, s, b, DType::bf16, Attention::eager)).value() ==
          2 * plain * plain_sbf);
    CHECK(mlp_bytes(architecture_layer(llama, s, b, DType::bf16, Attention::flash)).value() ==
          2 * gated * gated_sbf);
    // In fp32 every one of them is 4 bytes: the chain runs in its input's dtype.
    CHECK(mlp_bytes(architecture_layer(gpt, s, b, DType::fp32, Attention::eager)).value() ==
          4 * plain * plain_sbf);
}

TEST_CASE(
    "the activation's backward in a plain MLP: 2 s b f tensors fused, 3 for a chain ending in a "
    "product",
    "[activation_functions]") {
    const std::uint64_t s = GENERATE(16, 512), f = 3072;
    for (const auto& fn : activation_functions) {
        CAPTURE(fn.name, s);
        const LayerActivations layer = architecture_layer(with(fixtures::gpt2_small(), fn.id), s, 1,
                                                          DType::bf16, Attention::eager);
        const Workspace& w = workspace_named(layer, std::string(fn.label) + " backward");
        // The squared ReLU's square and relu backward hold four at once (measured on CPU).
        const std::uint64_t chain = fn.id == Activation::relu2 ? 4 : 3;
        CHECK(w.bytes.value() == 2 * s * f * (fn.kernel == ActivationKernel::fused ? 2 : chain));
        CHECK(gradients_from(layer, w) == Linear::down);
        // The down projection's input is freed by then, unless it is ReLU's output, which ReLU
        // keeps.
        const auto sum = swept(layer, w, Recompute::none);
        CHECK(sum.covered.value() == (fn.keeps_output ? 0 : 2 * s * f));
    }
}

TEST_CASE(
    "a dropout inside the MLP keeps its mask (CUDA) or noise (CPU) and the dropped-out hidden",
    "[activation_functions]") {
    const std::uint64_t s = GENERATE(16, 1000), b = GENERATE(1, 2);
    const std::uint64_t sbf = s * b * 3072, sbf_gated = s * b * 11008;
    for (const Platform platform : {Platform::cuda, Platform::cpu}) {
        const std::uint64_t noise = platform == Platform::cuda ? 1 : 2;
        CAPTURE(s, b, platform == Platform::cuda);
        const auto mlp = [&](const Architecture& m) {
            return mlp_bytes(architecture_layer(m, s, b, DType::bf16, Attention::eager, platform))
                .value();
        };
        // gelu_new: its 4 tensors, the noise, the dropped-out hidden; its own output is kept by
        // nothing.
        CHECK(mlp(with(fixtures::gpt2_small(), Activation::gelu_new, 0.1)) ==
              (2 * 4 + noise + 2) * sbf);
        // ReLU now keeps its own output: the down projection's input is the dropout's.
        CHECK(mlp(with(fixtures::gpt2_small(), Activation::relu, 0.1)) == (2 + noise + 2) * sbf);
        // Gated: SwiGLU's four tensors plus the noise of the product it drops out.
        CHECK(mlp(with(fixtures::llama_7b(), Activation::silu, 0.1)) ==
              (2 * 4 + noise) * sbf_gated);
        // Off (the default), nothing changes.
        CHECK(mlp(with(fixtures::gpt2_small(), Activation::relu, 0)) == 2 * sbf);
    }
    const LayerActivations layer = architecture_layer(
        with(fixtures::gpt2_small(), Activation::gelu, 0.1), s, b, DType::bf16, Attention::eager);
    const Workspace& w = workspace_named(layer, "MLP dropout backward");
    CHECK(w.bytes.value() == 4 * sbf);
    CHECK(swept(layer, w, Recompute::none).covered.value() ==
          2 * sbf);  // only the down projection's input is gone
}

TEST_CASE("the chapter's formula and its LLaMA 7B figures do not depend on the activation function",
          "[activation_functions][chapter]") {
    const Architecture llama = fixtures::llama_7b();
    for (const auto& fn : activation_functions) {
        CAPTURE(fn.name);
        const Architecture m = with(llama, fn.id);
        CHECK(korthikanti_layer(m, 4096, 1, 2).total() ==
              korthikanti_layer(llama, 4096, 1, 2).total());
    }
    // The chapter's peaks (recompute none, selective, full) under the default settings, whatever
    // the function.
    using Row = std::pair<Recompute, std::uint64_t>;
    const auto [mode, peak] = GENERATE(table<Recompute, std::uint64_t>(
        {Row{Recompute::none, 199539351552ULL}, Row{Recompute::selective, 116095778816ULL},
         Row{Recompute::full, 110698217472ULL}}));
    Settings settings;
    settings.seq = 4096, settings.recompute = mode;
    for (const Activation a : {Activation::silu, Activation::gelu_new, Activation::relu})
        CHECK(estimate(with(llama, a, 0.1), settings).peak_step().bytes.total().value() == peak);
}

TEST_CASE("every activation function row is complete and its name unique",
          "[activation_functions]") {
    for (const auto& fn : activation_functions) {
        CAPTURE(fn.name);
        CHECK(find_activation_function(fn.name) == &fn);
        CHECK(&activation_function(fn.id) == &fn);
        CHECK(!fn.code.empty());
        CHECK(!fn.source.empty());
        for (std::size_t i = 0; i < fn.kept_count(); ++i) CHECK(!fn.kept[i].why.empty());
        // A chain keeps at least what its last product needs (relu2's square: its one input); a
        // fused kernel one tensor at most.
        const std::size_t chain_least = fn.id == Activation::relu2 ? 1 : 2;
        CHECK((fn.kernel == ActivationKernel::ops ? fn.kept_count() >= chain_least
                                                  : fn.kept_count() <= 1));
    }
    CHECK(find_activation_function("gelu_newer") == nullptr);
}

TEST_CASE("memcalc activation-functions lists every row with its code and what it keeps",
          "[activation_functions][cli]") {
    const auto listed = nlohmann::json::parse(
        cli::render_listing(cli::activation_functions_listing(), cli::Format::json));
    REQUIRE(listed.size() == activation_functions.size());
    for (const auto& f : listed) {
        const ActivationFunction* row = find_activation_function(f["name"].get<std::string>());
        REQUIRE(row != nullptr);
        CHECK(f["implementation"] == kernel_name(row->kernel));
        CHECK(f["kept_tensors"] == row->kept_count());
        CHECK(f["backward_workspace_tensors"] == row->backward_workspace);
        CHECK(f["code"] == std::string(row->code));
    }
    CHECK_THAT(cli::render_listing(cli::activation_functions_listing(), cli::Format::table),
               Catch::Contains("torch.pow(x, 3.0)"));
}

TEST_CASE("an activation function's kept input is flagged where it is named, and only there",
          "[activations]") {
    std::size_t inputs = 0;
    for (const ActivationFunction& f : activation_functions)
        for (std::size_t i = 0; i < f.kept_count(); ++i) {
            CAPTURE(f.name, i);
            CHECK(f.kept[i].input == (f.kept[i].tensor == "its input"));
            if (f.kept[i].input) ++inputs;
        }
    CHECK(inputs >= 5);
}
