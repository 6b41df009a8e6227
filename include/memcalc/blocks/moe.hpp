#pragma once
/// Mixture-of-experts layers: the router, each dispatch, the shared experts.
#include <algorithm>
#include <cstdint>
#include <string>

#include "memcalc/blocks/mlp.hpp"

namespace memcalc::detail {

/// The router of HF's sparse mixture-of-experts block (moe_rows), to the dispatch's indices, over
/// `slots` token-slots.
inline void router_rows(TableBuilder& t, const Architecture& m, const Sizes& z, Count slots) {
    if (m.input_jitter >
        0)  // in place on the router's input, whose row follows (architecture_layer)
        t.add("input jitter (in place)", "the noise, uniform in [1 - jitter, 1 + jitter]",
              "the input's gradient is multiplied by it", shape::sbh, z.sbh, z.s);
    if (m.router_input_fp32)
        t.add("router", "its input, cast to fp32", "its weight's gradient is input^T x grad",
              shape::sbh, z.sbh, dtype::fp32);
    t.policy_output(
        t.linear_saved(m.router_bias == RouterBias::trainable, z.tokens * m.experts, m.hidden),
        "router", "its logits", shape::sbE, z.tokens * m.experts, z.d);
    if (m.router == Router::sparsemixer) {
        // Twice, once per expert picked: masked_fill keeps its mask; softmax its output; gather the
        // sampled expert's index; the Heun correction (MultiplierProcessor) the gathered weight. In
        // the logits' dtype.
        t.add("sparsemixer: masked_fill",
              "the mask of logits too far below the best (bool), per pass",
              "the gradient is zeroed where it was filled", shape::sbE, z.tokens * m.experts,
              dtype::mask, Keep::always, 2);
        t.add("sparsemixer: softmax", "its output over the unmasked logits, per pass",
              "softmax's gradient is written in its output", shape::sbE, z.tokens * m.experts, z.d,
              Keep::always, 2);
        t.add("sparsemixer: gather", "the sampled expert's index (int64), per pass",
              "gather's gradient scatters by it", shape::sb, z.tokens, 8, Keep::always, 2);
        t.add("sparsemixer: Heun correction", "the gathered weight, per pass",
              "the logits' gradient is scaled by it", shape::sb, z.tokens, z.d, Keep::always, 2);
    } else {
        t.add("router softmax", "routing probabilities, fp32",
              "softmax's gradient is written in its output", shape::sbE, z.tokens * m.experts,
              dtype::fp32);
        t.add("top-k", "the chosen experts' indices (int64)", "to scatter the gradient back",
              shape::sbk, slots, 8);
    }
    if (m.renormalize_topk &&
        m.router == Router::softmax_topk) {  // without it (norm_topk_prob false) the top-k
                                             // probabilities are used as they are
        t.add("renormalise top-k", "the top-k probabilities, fp32",
              "division's gradient needs the numerator", shape::sbk, slots, dtype::fp32);
        t.add("renormalise top-k", "their sum per token, fp32",
              "division's gradient needs the denominator", shape::sb, z.tokens, dtype::fp32);
    }
    if (m.expert_dispatch == ExpertDispatch::permuted)
        t.add("permute", "the slots' sorted token indices (int64)", "unpermute scatters by them",
              shape::sbk, slots, 8);
    else
        t.add("dispatch", "token and slot indices per expert (2 x int64)",
              "index and index_add need them", shape::sbk, slots, 16);
}

/// Each expert's tokens gathered from the stream (moe_rows), as its first projections keep them,
/// and the stacked weights' copies.
inline void gathered_rows(TableBuilder& t, const Architecture& m, const Sizes& z, Count slots) {
    // Gathered from the stream: under autocast fp32, and each expert's first projections cast it
    // again. Narrow linears keep only their cast of it.
    const LinearSet first = mlp_input_readers(m);
    const LinearOutput first_out = mlp_input_output(m, slots * m.ffn, shape::sbkf);
    bool gathered_kept = false;
    if (z.narrow)
        gathered_kept =
            projection_input_row(t, z, "experts: first projections", "the gathered tokens",
                                 slots * m.hidden, shape::sbkh, 1, first_out, first);
    else if ((first & ~t.tuning.frozen) != 0 ||
             ((first & t.tuning.adapted) != 0 && !t.tuning.adapter_dropout &&
              !adapter_upcast(t, z, z.s))) {
        t.add("dispatch", "the gathered tokens", "the expert's first projections need their input",
              shape::sbkh, slots * m.hidden, z.s);
        gathered_kept = true;
    }
    if (z.autocast)
        gathered_kept = projection_input_row(t, z, "experts: first projections",
                                             "the gathered tokens", slots * m.hidden, shape::sbkh,
                                             mlp_input_projections(m), {}, first) ||
                        gathered_kept;
    // Frozen, the experts' first projections keep no input but make it and their outputs as dense
    // ones do (all s b k slots at once: one expert's tokens are at most s b, leaning high), beside
    // the MLP norm's output the experts gather from (and the residual stream:
    // stream_beside).
    after_linears(t, z, "experts: first projections", first, slots, slots * m.hidden, shape::sbkh,
                  z.s, input_row(gathered_kept), first_out, z.sbh * z.d);
    t.gradient(first_out.weight);
    if (m.stacked_experts) {
        // Each expert with tokens indexes the stacked weights with a tensor: copies, which the
        // matmuls keep; counted for every expert (with s b k slots spread over E, all are hit).
        const Count weights = Count(m.experts) * (mlp_input_projections(m) + 1) * m.hidden * m.ffn;
        t.add("experts: stacked weights indexed", "each expert's projection weights, copied",
              "the input's gradient is the output's gradient x W^T", shape::expert_weights, weights,
              z.d);
        t.add("experts: stacked weights indexed", "the hit experts' ids (int64)",
              "index's gradient scatters by them", shape::experts, m.experts, 8);
    }
}

/// The kernels of transformers' sparse block beside its linears and the experts' activation: the
/// router's, and where the model's loop runs the experts one at a time, each hit expert's
/// (launches.hpp; after mlp_rows has counted one expert's activation, which the loop repeats).
inline void moe_launches(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.input_jitter > 0) t.launch(LaunchOp::input_jitter);
    if (m.router == Router::sparsemixer) {
        t.launch(LaunchOp::sparsemixer);
    } else {
        t.launch(LaunchOp::router_topk);
        const bool logits_fp32 = m.router_input_fp32 || z.d == dtype::fp32;
        if (!logits_fp32) t.launch(LaunchOp::cast);  // softmax(dtype=float32) copies them first
        if (z.s != dtype::fp32) t.launch(LaunchOp::cast);  // the weights to the stream's dtype
        if (m.renormalize_topk) t.launch(LaunchOp::topk_renormalize);
    }
    t.launch(LaunchOp::expert_hits);
    t.launch(z.kernels->one_hot_launches);
    if (!z.runtime.expert_loop) return;
    // Every expert a micro-batch's token-slots can reach runs.
    const double hit = static_cast<double>(
        std::min<std::uint64_t>(m.experts, z.tokens.value() * m.active_experts()));
    t.launch(LaunchOp::expert_loop, hit);
    if (m.stacked_experts) t.launch(LaunchOp::stacked_expert_loop, hit);
    t.launch(LaunchOp::gradient_sum, hit - 1);  // the routing weights' gradients, one an expert
    t.loop_experts(Module::moe_act, hit);
}

/// HF's sparse mixture-of-experts block: route, gather each expert's tokens, run it, weight,
/// scatter.
inline void moe_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    // Every token goes to k experts: s b k rows in all, whatever the routing; the experts compute
    // over as many, or each over the busiest one's share (Architecture::expert_imbalance).
    const Count routed = z.tokens * m.active_experts();
    const Count slots = m.dispatched_slots(z.tokens.value());
    router_rows(t, m, z, routed);
    gathered_rows(t, m, z, slots);
    // Which experts' mms the op-level policy saves depends on how many experts the routing fills
    // and in what order: counted as if it saved every one (an upper bound; about half are).
    t.every_mm(true);
    const bool down_saved = mlp_rows(t, m, z, shape::sbkf, slots * m.ffn, "experts: ");
    t.every_mm(false);
    t.add("expert output x weight", "the expert outputs", "the routing weight's gradient",
          shape::sbkh, slots * m.hidden, z.d, Keep::always, 1,
          RowFacts{}.saved_by_policy(down_saved));
    // transformers casts the routing weights to the stream's dtype, which the weighted outputs
    // take.
    t.add("expert output x weight", std::string("the routing weights, ") + dtype_name(z.stream),
          "the expert output's gradient", shape::sbk, slots, z.s);
    t.add("combine (index_add)", "the weighted expert outputs", "index_add keeps its source",
          shape::sbkh, slots * m.hidden, z.s);
    moe_launches(t, m, z);
}

/// Megatron-LM's token dispatchers (ExpertDispatch::permuted, core 0.13+: token_dispatcher.py,
/// experts.py TEGroupedMLP): route, permute the token-slots by index and all-to-all them, which
/// keep no activation; the experts' first projection keeps its input, the routing weights are
/// multiplied in the activation (weighted_bias_swiglu_impl keeps them; torch's ops keep the
/// product's input too); the outputs go back and unpermute by index, keeping nothing.
inline void permuted_expert_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    const Count routed = z.tokens * m.active_experts();
    const Count slots = m.dispatched_slots(z.tokens.value());
    router_rows(t, m, z, routed);
    gathered_rows(t, m, z, slots);
    t.add("experts: activation x routing weight", "the routing weights, fp32",
          "the activation's gradient is scaled by them", shape::sbk, slots, dtype::fp32);
    t.every_mm(true);  // as moe_rows
    const bool down_saved = mlp_rows(t, m, z, shape::sbkf, slots * m.ffn, "experts: ");
    t.every_mm(false);
    if (!m.fused_glu)
        t.add("experts: activation x routing weight", "its input, the activation's output",
              "the routing weights' gradient", shape::sbkf, slots * m.ffn, z.d);
    t.policy_output(down_saved, "experts: down projection", "its output", shape::sbkh,
                    slots * m.hidden, z.d);
}

/// Every token through every expert (ExpertDispatch::every_token), as transformers' Llama4TextMoe
/// runs it in training: the router's top-k logits scattered into -inf and passed through an fp32
/// sigmoid; the tokens repeated E times and multiplied by their scores (the product keeps both: the
/// repeated tokens and the scores' transposed copy); one bmm with the stacked gate_up_proj (its
/// input kept, and its output, which act(gate) and the product with up read as views); act(gate)
/// and its product with up (the down bmm's input) kept; the E outputs summed, which keeps nothing.
/// Under autocast the tokens stay in the stream's dtype and bmm keeps its cast of the product.
inline void every_token_expert_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    constexpr Shape sbEh{"sbE(h)", ActivationSplit::sequence},
        sbEf{"sbE(f)", ActivationSplit::expert_tensor};
    const Count copies = z.tokens * m.experts;  // s b E token-copies
    const ActivationFunction& fn = activation_function(m.activation);
    t.policy_output(
        t.linear_saved(m.router_bias == RouterBias::trainable, z.tokens * m.experts, m.hidden),
        "router", "its logits", shape::sbE, z.tokens * m.experts, z.d);
    t.add("router top-k", "the chosen experts' indices (int64)",
          "topk's and scatter's gradients go by them", shape::sbk, z.tokens * m.active_experts(),
          8);
    t.add("router sigmoid", "its output over every expert, fp32",
          "sigmoid's gradient is written in its output", shape::sbE, z.tokens * m.experts,
          dtype::fp32);
    t.add("tokens x scores", "the tokens, repeated for every expert", "the scores' gradient", sbEh,
          copies * m.hidden, z.s);
    t.add("tokens x scores", "the scores, one column (transposed copy)", "the tokens' gradient",
          shape::sbE, copies, z.d);
    t.add("experts: gate_up bmm",
          z.autocast ? "its input, the weighted tokens, cast by autocast"
                     : "its input, the weighted tokens",
          "gate_up_proj's gradient = input^T x output gradient", sbEh, copies * m.hidden, z.d);
    t.gradient(mlp_input_output(m, Count(0), sbEf).weight);  // the gate_up bmm has run
    const Module outer = t.section(Module::moe_act);
    t.add("experts: gate_up bmm", "its output, gate and up (which act and the product view)",
          std::string(fn.label) + "'s derivative is taken at gate; the product's gradient needs up",
          sbEf, copies * m.ffn * 2, z.d, Keep::always, 1, RowFacts{}.input_of_module());
    for (std::size_t i = 0; i < fn.kept_count(); ++i)  // its input is gate, a view of the row above
        if (!fn.kept[i].input)
            t.add("experts: " + std::string(fn.label) +
                      (fn.kept[i].op.empty() ? "" : ": " + std::string(fn.kept[i].op)),
                  std::string(fn.kept[i].tensor), std::string(fn.kept[i].why), sbEf, copies * m.ffn,
                  z.d);
    t.add("experts: up x act(gate)", std::string(fn.label) + "'s output",
          "up's gradient is act(gate) x grad", sbEf, copies * m.ffn, z.d);
    t.workspace(true, "experts: up x act(gate) backward",
                "its incoming gradient and the gradients of both factors",
                bytes_of(3 * z.d, std::string(Text(sbEf.symbol))), Count(3 * z.d) * copies * m.ffn);
    t.add("experts: down bmm", "its input, up x act(gate)",
          "down_proj's gradient = input^T x output gradient", sbEf, copies * m.ffn, z.d);
    t.section(outer);
}

/// Shared experts: a dense MLP over every token beside the routed ones, reading the MLP norm's
/// output (the router's input, kept already; under autocast its projections cast it again).
/// Qwen2-MoE scales its output by sigmoid(shared_expert_gate(x)), which keeps the sigmoid's output
/// and the MLP's; the sum with the routed output keeps nothing.
inline void shared_expert_rows(TableBuilder& t, const Architecture& m, const Sizes& z) {
    if (m.shared_ffn == 0) return;
    // Without autocast they read the router's input, whose row (architecture_layer) counts their
    // adapters.
    if (z.autocast || z.narrow) {
        projection_input_row(t, z, "shared expert: up projections", "their input", z.sbh,
                             shape::sbh, mlp_input_projections(m), {}, mlp_input_readers(m, true));
        adapter_rows(t, z, "shared expert: up projections", mlp_input_readers(m, true), z.tokens,
                     z.sbh, shape::sbh, z.s);
    }
    const bool down_saved = mlp_rows(t, m, z, shape::sbfs, z.tokens * m.shared_ffn,
                                     "shared expert: ", Linear::shared_down);
    t.launch(LaunchOp::residual_add);  // its sum with the routed output; its input's gradient's
    if (!m.shared_expert_gate) {
        t.policy_output(down_saved, "shared expert: down projection", "its output", shape::sbh,
                        z.sbh, z.d);
        return;
    }
    if (z.autocast) {
        projection_input_row(t, z.wide_linears(), "shared expert gate", "its input", z.sbh,
                             shape::sbh, 1, {}, bit(Linear::shared_expert_gate));
        adapter_rows(t, z, "shared expert gate", bit(Linear::shared_expert_gate), z.tokens, z.sbh,
                     shape::sbh, z.s);
    }
    t.policy_output(t.linear_saved(false, z.tokens, m.hidden), "shared expert gate", "its output",
                    shape::sb, z.tokens, z.d);
    t.add("shared expert gate: sigmoid", "its output (also a factor of the product)",
          "sigmoid's gradient is written in its output; the product's other factor's gradient",
          shape::sb, z.tokens, z.d);
    t.add("shared expert output x gate", "the shared expert's output", "the gate's gradient",
          shape::sbh, z.sbh, z.d, Keep::always, 1, RowFacts{}.saved_by_policy(down_saved));
    t.launch(LaunchOp::shared_expert_gate);
}

}  // namespace memcalc::detail
