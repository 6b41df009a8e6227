// Recompute::op, torchtitan's op-level selective checkpointing (activation_checkpoint.py
// @cfb93265): each layer checkpointed, its forward keeping the outputs of every odd-numbered
// bias-free linear (aten.mm) and of the attention kernel, in the paper's letters on more than one
// shape.
#include <catch2/catch.hpp>

#include "fixtures.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/estimate.hpp"

using namespace memcalc;

namespace {
Architecture llama_like(std::uint64_t h, std::uint64_t a, std::uint64_t kv, std::uint64_t f) {
    Architecture m = fixtures::llama_7b();
    m.hidden = h, m.heads = a, m.kv_heads = kv, m.ffn = f;
    return m;
}

/// Rows whose storage the policy's saved outputs are, and their bytes.
Count reused(const LayerActivations& layer) {
    Count sum;
    for (const auto& r : layer.rows)
        if (r.policy_saved) sum += r.bytes;
    return sum;
}
}  // namespace

TEST_CASE("op on LLaMA-style layers: q, v, gate and down kept of the seven mms", "[op_recompute]") {
    using Row = std::tuple<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>;
    const auto [h, a, kv, f] =
        GENERATE(table<std::uint64_t, std::uint64_t, std::uint64_t, std::uint64_t>({
            Row{64, 4, 2, 176},
            Row{4096, 32, 8, 14336},
            Row{2048, 16, 1, 5632},
        }));
    const std::uint64_t s = GENERATE(16, 1000), b = GENERATE(1, 3);
    CAPTURE(h, a, kv, f, s, b);
    const Architecture m = llama_like(h, a, kv, f);
    const std::uint64_t sb = s * b, d = h / a;

    // Eager, k and v repeated: q (rotated afterwards) and v (repeated) are outputs of their own;
    // the gate's output is SiLU's saved input; the down projection's output is the MLP's. 2 bytes
    // each.
    const LayerActivations eager = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    CHECK(eager.kept(Recompute::op).value() ==
          sb * (2 * h + 2 * a * d + 2 * kv * d + 2 * f + 2 * h));
    CHECK(reused(eager).value() == 2 * sb * f);
    CHECK(eager.rebuilt(Recompute::op).value() == eager.total().value() - 2 * sb * f);
    CHECK(eager.policy_output_bytes().value() == sb * (2 * a * d + 2 * kv * d + 2 * h));

    // Flash: the kernel's output and log-sum-exp are on the save list, and v is its input
    // unrepeated.
    const LayerActivations flash = architecture_layer(m, s, b, DType::bf16, Attention::flash);
    const std::uint64_t kernel = 2 * sb * a * d + 4 * a * sb;
    CHECK(flash.kept(Recompute::op).value() ==
          sb * (2 * h + 2 * a * d + 2 * kv * d + 2 * f + 2 * h) + kernel);
    CHECK(reused(flash).value() == 2 * sb * kv * d + kernel + 2 * sb * f);
    CHECK(flash.rebuilt(Recompute::op).value() == flash.total().value() - reused(flash).value());
    // Between full and none, as the policy's outputs are few of what the layer saves.
    CHECK(flash.kept(Recompute::op) > flash.kept(Recompute::full));
    CHECK(flash.kept(Recompute::op) < flash.kept(Recompute::none));

    // Its recomputation skips what it saved: q, v, gate and down, and under flash the kernel.
    const double T = static_cast<double>(sb), q = static_cast<double>(a * d);
    const double saved_mms = 2 * T * (h * q + h * kv * d + 2.0 * h * f);
    CHECK(eager.policy_spared_flops == Approx(saved_mms));
    CHECK(flash.policy_spared_flops == Approx(saved_mms + 2 * T * static_cast<double>(s) * 2 * q));
    // k, o and up rerun, in every layer: the estimate's recomputation under the policy.
    Settings st;
    st.seq = s, st.micro_batch = b, st.recompute = Recompute::op;
    st.activations = ActivationModel::architecture, st.framework.attention = Attention::flash;
    CHECK(estimate(m, st).compute.recompute ==
          Approx(static_cast<double>(m.layers) * 2 * T * (h * kv * d + q * h + h * f)));
}

TEST_CASE("op on GPT-2-style layers: biased linears run as addmm, off the list", "[op_recompute]") {
    Architecture m = fixtures::gpt2_small();
    const std::uint64_t s = GENERATE(64, 1024), b = GENERATE(1, 2);
    CAPTURE(s, b);
    const std::uint64_t sb = s * b, h = m.hidden, a = m.heads, f = m.ffn;
    // Eager: nothing of the layer is saved but the checkpoint's input, as under full recomputation.
    const LayerActivations eager = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    CHECK(eager.kept(Recompute::op) == eager.kept(Recompute::full));
    CHECK(eager.rebuilt(Recompute::op) == eager.rebuilt(Recompute::full));
    // Flash: the kernel's output and log-sum-exp besides.
    const LayerActivations flash = architecture_layer(m, s, b, DType::bf16, Attention::flash);
    CHECK(flash.kept(Recompute::op).value() == 2 * sb * h + 2 * sb * h + 4 * a * sb);
    CHECK(flash.rebuilt(Recompute::op).value() ==
          flash.rebuilt(Recompute::full).value() - 2 * sb * h - 4 * a * sb);
    // addmm is off the list: the recomputation skips the kernel alone.
    CHECK(eager.policy_spared_flops == 0);
    CHECK(flash.policy_spared_flops == Approx(2.0 * static_cast<double>(sb) *
                                              static_cast<double>(s) * 2 * static_cast<double>(h)));

    // Bias-free, learned positions: mm 1 (q), 3 (v) and 5 (up) are kept. At micro-batch 1 eager
    // matmul keeps views of q and v, the same storage; at 2 it keeps copies, and the outputs stay
    // beside them.
    m.bias = Bias::none;
    const LayerActivations plain = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    CHECK(plain.kept(Recompute::op).value() == 2 * sb * h + 2 * sb * h + 2 * sb * h + 2 * sb * f);
    CHECK(reused(plain).value() ==
          (b == 1 ? 4 * sb * h : 0) + 2 * sb * f);  // GELU's input is up's output
    CHECK(plain.rebuilt(Recompute::op).value() ==
          plain.rebuilt(Recompute::full).value() - reused(plain).value());
    CHECK(f == 4 * h);
}

TEST_CASE("op with biases on q, k and v (Qwen2): the count starts at the output projection",
          "[op_recompute]") {
    Architecture m = llama_like(64, 4, 2, 176);
    m.bias = Bias::qkv;
    const std::uint64_t s = 32, b = 1, sb = s * b, h = 64, f = 176;
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    // mm 1 is the output projection (kept), 2 the gate, 3 the up projection (gate x up keeps its
    // output), 4 down.
    CHECK(layer.kept(Recompute::op).value() == 2 * sb * h + 2 * sb * h + 2 * sb * f);
    CHECK(reused(layer).value() == 2 * sb * f);
    CHECK(
        layer.rows[layer.rows.size() - 2].policy_saved);  // "gate x up: the up projection's output"
}

TEST_CASE("op on a mixture of experts counts every expert's mms as kept (an upper bound)",
          "[op_recompute]") {
    Architecture m = llama_like(64, 4, 2, 176);
    m.experts = 4, m.experts_per_token = 2;
    const std::uint64_t s = 32, b = 1, sb = s * b, h = 64, a = 4, kv = 2, d = 16, f = 176, k = 2,
                        E = 4;
    const LayerActivations layer = architecture_layer(m, s, b, DType::bf16, Attention::eager);
    // q, v, the router's logits (mm 5), and each expert's gate, up and down outputs over its s b k
    // tokens.
    CHECK(layer.policy_output_bytes().value() == 2 * sb * a * d + 2 * sb * kv * d + 2 * sb * E);
    CHECK(reused(layer).value() == 2 * sb * k * f * 2 + 2 * sb * k * h);
    CHECK(layer.kept(Recompute::op).value() ==
          2 * sb * h + layer.policy_output_bytes().value() + reused(layer).value());
}

TEST_CASE("op through the whole step: each layer keeps its input and the policy's outputs",
          "[op_recompute]") {
    Settings s;
    s.seq = 2048, s.micro_batch = 8,
    s.activations = ActivationModel::architecture;  // activations outweigh the state
    s.framework.attention = Attention::flash;
    const Architecture m = fixtures::llama_7b();
    s.recompute = Recompute::op;
    const Report op = estimate(m, s);
    const LayerActivations layer =
        architecture_layer(m, s.seq, s.micro_batch, DType::bf16, Attention::flash);
    CHECK(op.kept_activations == Count(m.layers) * layer.kept(Recompute::op));
    s.recompute = Recompute::full;
    const Count full = estimate(m, s).peak_step().bytes.total();
    s.recompute = Recompute::none;
    const Count none = estimate(m, s).peak_step().bytes.total();
    CHECK(op.peak_step().bytes.total() > full);
    CHECK(op.peak_step().bytes.total() < none);
}

TEST_CASE("op needs the architecture model and one tensor-parallel rank", "[op_recompute]") {
    Settings s;
    s.seq = 2048, s.recompute = Recompute::op;
    CHECK_THROWS_WITH(estimate(fixtures::llama_7b(), s),
                      Catch::Contains("recompute op needs the architecture"));
    s.activations = ActivationModel::architecture, s.parallel.tp = 2;
    CHECK_THROWS_WITH(estimate(fixtures::llama_7b(), s), Catch::Contains("recompute op with tp 2"));
}
