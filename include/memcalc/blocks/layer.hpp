#pragma once
/// One transformer layer: its norms, its mixer, its MLP or experts and the residual stream.
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "memcalc/blocks/attention.hpp"
#include "memcalc/blocks/attention_mamba2.hpp"
#include "memcalc/blocks/cross_attention.hpp"
#include "memcalc/blocks/gated_deltanet.hpp"
#include "memcalc/blocks/mamba.hpp"
#include "memcalc/blocks/mamba2.hpp"
#include "memcalc/blocks/moe.hpp"
#include "memcalc/blocks/norm.hpp"

namespace memcalc {

namespace detail {

/// What mixes a layer's tokens, as its attention half writes it: a row per Mixer, so a new mixer
/// is a row (and its block's file).
struct MixerBlock {
    Mixer mixer;
    /// Its output projection: autocast casts that weight last, and the layer's policy output is it.
    Linear output;
    /// The linear whose gradient step follows the mixer's ops (none: its backward keeps no
    /// workspace, so none is needed).
    Linear gradient;
    bool (*output_biased)(const Architecture&);
    std::uint64_t (*output_inputs)(const Architecture&);  ///< the output projection's input width
    void (*rows)(TableBuilder&, const Architecture&, const Sizes&, std::uint64_t micro_batch,
                 Attention);
};

inline const MixerBlock& mixer_block(Mixer mixer) {
    static const MixerBlock rows[] = {
        {Mixer::attention, Linear::o, Linear::o,
         [](const Architecture& m) { return m.bias == Bias::attention || m.bias == Bias::all; },
         [](const Architecture& m) { return m.heads * m.value_head_size(); },
         [](TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t,
            Attention attention) { attention_rows(t, m, z, attention); }},
        {Mixer::mamba, Linear::mamba_out, Linear::none,
         [](const Architecture& m) { return m.ssm.proj_bias; },
         [](const Architecture& m) { return m.ssm.d_inner; },
         [](TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t micro_batch,
            Attention) { mamba_rows(t, m, z, micro_batch); }},
        {Mixer::mamba2, Linear::mamba_out, Linear::mamba_out,
         [](const Architecture& m) { return m.ssm.proj_bias; },
         [](const Architecture& m) { return m.ssm.d_inner; },
         [](TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t micro_batch,
            Attention) { mamba2_rows(t, m, z, micro_batch); }},
        {Mixer::gated_deltanet, Linear::mamba_out, Linear::mamba_out,
         [](const Architecture&) { return false; },
         [](const Architecture& m) { return m.ssm.d_inner; },
         [](TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t micro_batch,
            Attention) { deltanet_rows(t, m, z, micro_batch); }},
        // Falcon-H1: attention's o_proj is the layer's last linear.
        {Mixer::attention_mamba2, Linear::o, Linear::o,
         [](const Architecture& m) { return m.bias == Bias::attention || m.bias == Bias::all; },
         [](const Architecture& m) { return m.heads * m.value_head_size(); },
         [](TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t micro_batch,
            Attention attention) { attention_mamba2_rows(t, m, z, micro_batch, attention); }},
        // mllama's, with images: k and v over the images' tokens.
        {Mixer::cross_attention, Linear::o, Linear::o, [](const Architecture&) { return false; },
         [](const Architecture& m) { return m.heads * m.value_head_size(); },
         [](TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t,
            Attention attention) { cross_attention_rows(t, m, z, attention); }},
    };
    for (const MixerBlock& row : rows)
        if (row.mixer == mixer) return row;
    return rows[0];
}

/// How a MoE layer's experts take their tokens: a row per ExpertDispatch.
using ExpertRows = void (*)(TableBuilder&, const Architecture&, const Sizes&);
inline ExpertRows expert_rows(ExpertDispatch dispatch) {
    static constexpr std::pair<ExpertDispatch, ExpertRows> rows[] = {
        {ExpertDispatch::routed, moe_rows},
        {ExpertDispatch::every_token, every_token_expert_rows},
        {ExpertDispatch::permuted, permuted_expert_rows},
    };
    for (const auto& [id, write] : rows)
        if (id == dispatch) return write;
    return moe_rows;
}

/// One layer of blocks and the residual stream between them (architecture_layer), written in
/// steps: the attention (or Mamba) half, the MLP (or experts) half, the last add, fine-tuning's
/// temporaries.
class LayerBlocks {
public:
    LayerBlocks(TableBuilder& t, const Architecture& m, const Sizes& z, std::uint64_t micro_batch,
                Attention attention, const LayerTuning& tuning)
        : t(t),
          m(m),
          z(z),
          d(z.d),
          micro_batch(micro_batch),
          attention(attention),
          tuning(tuning),
          shared_norm(m.parallel_attention && m.norms_per_layer == 1),
          norm_keeps_stream(m.norm == Norm::layernorm || z.s == dtype::fp32 ||
                            (!m.norms_before_branches() && !z.autocast && !z.narrow)),
          unkept_stream(norm_keeps_stream ? Count(0) : z.sbh * z.s),
          held(m.attention_output_held && !m.parallel_attention && m.mixer != Mixer::none
                   ? z.sbh * z.d
                   : Count(0)),
          one_block(m.mixer == Mixer::none || !m.has_mlp) {}

    void write() {
        // Nemotron-H's layers hold one block each (modeling_nemotron_h.py, NemotronHBlock.forward:
        // norm, its mixer, the residual add).
        if (m.mixer != Mixer::none) attention_half();
        if (m.has_mlp) mlp_half();
        last_add();
        dequantized_work();
        dora_work();
    }

private:
    // Megatron-LM's layernorm module: input_layernorm and pre_mlp_layernorm. Its checkpoint keeps
    // the norm's input: a row of the norm's where that is the input itself, else a copy of its own.
    void layer_norm(const std::string& what, bool input_kept, bool layer_input) {
        t.section(Module::layernorm);
        if (!norm_rows(t, m, z, what, input_kept, layer_input))
            t.checkpoint_input("the norm's input (the residual stream)", shape::sbh, z.sbh, z.s);
    }

    void attention_half() {
        t.stream_beside(unkept_stream, 0);
        // The first layer under a frozen embedding: its norm keeps nothing, nor a branch without
        // an adapter (nothing in it needs a gradient).
        const bool input_grad = t.input_grad();
        t.quiet(!input_grad && !pre_norm_trains());
        if (m.norms_before_branches())
            layer_norm(shared_norm ? "layer norm" : "attention norm", false, true);
        if (pre_norm_trains()) t.input_grad(true);  // its output needs one from here
        const bool branch_grad = t.input_grad();
        t.quiet(!branch_grad && !attention_trains());
        t.section(Module::attention);
        // Autocast casts each weight as its linear runs: inside the mixer the output projection's
        // is still to come.
        const MixerBlock& mixer = mixer_block(m.mixer);
        t.casts_pending(mixer.output);
        mixer.rows(t, m, z, micro_batch, attention);
        t.gradient(mixer.gradient);  // after the mixer's ops: its output projection runs last
        t.casts_pending(Linear::none);
        t.section(Module::none);
        const bool output_biased = mixer.output_biased(m);
        t.policy_output(t.linear_saved(output_biased, z.sbh, mixer.output_inputs(m)),
                        "output projection", "its output", shape::sbh, z.sbh, z.d);
        if (m.norms_after_branches()) norm_rows(t, m, z, "post-attention norm", false, false, true);
        if (m.hidden_dropout > 0 && !m.parallel_attention)
            dropout_row(t, z, z.compute, "attention residual dropout", shape::sbh, z.sbh);
        if (!m.parallel_attention && m.has_mlp) t.launch(LaunchOp::residual_add);
        t.quiet(false);
        // A parallel MLP reads the layer's input; a sequential one the sum, which needs a gradient
        // once the attention had one.
        t.input_grad(m.parallel_attention ? (shared_norm ? branch_grad : input_grad)
                                          : branch_grad || attention_trains() || prompted() ||
                                                (tuning.scaled & ~mlp_linears) != 0);
    }

    static constexpr LinearSet mlp_linears =
        bit(Linear::gate) | bit(Linear::up) | bit(Linear::down) | bit(Linear::router) |
        bit(Linear::shared_gate) | bit(Linear::shared_up) | bit(Linear::shared_down) |
        bit(Linear::shared_expert_gate);
    /// Whether an adapter sits in the attention (or mixer): the layer's linears beyond the MLP's.
    bool attention_trains() const { return (tuning.adapted & ~mlp_linears) != 0; }
    bool mlp_trains() const { return (tuning.adapted & mlp_linears) != 0; }
    /// Whether LLaMA-Adapter's gated prompt joins the attention's output here.
    bool prompted() const { return tuning.prompt_tokens > 0; }
    /// Whether the norms before the branches train where the rest is frozen (LLaMA-Adapter v2):
    /// they keep what their weights' gradients need, and their outputs need gradients.
    bool pre_norm_trains() const {
        return m.norms_before_branches() && tuning.any() && !tuning.frozen_norms;
    }

    void mlp_half() {
        t.mlp_half();
        // Its input needing no gradient (the first layer's, frozen embedding): its norm keeps
        // nothing, nor the MLP unless an adapter sits in it.
        mlp_input_grad = t.input_grad();
        t.quiet(!mlp_input_grad && !mlp_trains());
        // Beside the MLP: the attention half's sum, or a parallel layer's attention output, and
        // the output where the layer's code holds it.
        t.stream_beside(unkept_stream, m.mixer == Mixer::none ? Count(0)
                                       : m.parallel_attention ? z.sbh * d
                                                              : unkept_stream + held);
        mlp_input();
        if (m.is_moe()) {
            expert_rows(m.expert_dispatch)(t, m, z);
            t.section(Module::shared_experts);  // inside the MoE layer; its input, the router's,
                                                // kept already
            shared_expert_rows(t, m, z);
            t.gradient(Linear::down);
        } else {
            t.casts_pending(Linear::down);
            t.policy_output(
                mlp_rows(t, m, z, shape::sbf, z.sbf, "", Linear::down, m.hidden_dropout > 0),
                "MLP down projection", "its output", shape::sbh, z.sbh, z.d);
            t.gradient(Linear::down);
            t.casts_pending(Linear::none);
        }
        if (m.mixer == Mixer::cross_attention) cross_attention_mlp_gate_rows(t, z);
        t.section(Module::none);
        if (m.norms_after_branches()) norm_rows(t, m, z, "post-MLP norm", false, false, true);
        if (m.hidden_dropout > 0)
            dropout_row(t, z, z.compute,
                        m.parallel_attention ? "residual dropout" : "MLP residual dropout",
                        shape::sbh, z.sbh);
        t.quiet(false);
    }

    /// The MLP's norm and what its first linears keep of their input.
    void mlp_input() {
        if (!shared_norm && m.norms_before_branches()) {
            t.quiet(!mlp_input_grad && !pre_norm_trains());
            layer_norm("MLP norm", m.parallel_attention, m.mixer == Mixer::none);
            if (pre_norm_trains()) mlp_input_grad = true, t.input_grad(true);
            t.quiet(!mlp_input_grad && !mlp_trains());
        }
        t.section(m.is_moe() ? Module::moe : Module::mlp);
        // Under autocast a shared norm's output is cast again by the MLP's projections (the router,
        // for experts); narrow linears save their own cast of it. A router is no Transformer Engine
        // module: it keeps its input in the compute dtype.
        const Sizes& mlp_sizes = m.is_moe() ? z.wide_linears() : z;
        // The module's checkpoint keeps the norm's output: the row below where it is that very
        // storage.
        bool input_is_norm_output = !mlp_sizes.autocast && !mlp_sizes.narrow;
        // Its readers: the MLP's first projections, or the router and, reading it too unless
        // autocast casts it for them, the shared experts.
        const LinearSet shared_readers =
            m.shared_ffn > 0 && !z.autocast && !z.narrow
                ? mlp_input_readers(m, true) |
                      (m.shared_expert_gate ? bit(Linear::shared_expert_gate) : 0)
                : 0;
        const LinearSet readers =
            m.is_moe() ? bit(Linear::router) | shared_readers : mlp_input_readers(m);
        const std::string first = m.is_moe() ? "router and experts" : "MLP up projections";
        // A router's output is not tabled; the experts' blocks write their gradient steps.
        const LinearOutput first_out =
            m.is_moe() ? LinearOutput{} : mlp_input_output(m, z.sbf, shape::sbf);
        InputRow input = InputRow::earlier;  // with a shared norm, the q/k/v projections' row
        if (!shared_norm || z.autocast || z.narrow) {
            const bool input_kept =
                projection_input_row(t, mlp_sizes, first, "their input", z.sbh, shape::sbh,
                                     m.is_moe() ? 1 : mlp_input_casts(m), first_out, readers,
                                     RowFacts{}
                                         .input_of_module(input_is_norm_output)
                                         .output_of_norm(input_is_norm_output));
            input_is_norm_output = input_is_norm_output && input_kept;
            input = input_row(input_kept);
        } else {
            linear_casts_work(t, mlp_sizes, first, z.sbh, first_out);
        }
        if (!input_is_norm_output)
            t.checkpoint_input("the norm's output", shape::sbh, z.sbh, z.s, true);
        // Beside the MLP's frozen linears: the residual stream the layer adds their output to.
        after_linears(t, z, first, readers, z.tokens, z.sbh, shape::sbh, z.s, input, first_out);
        t.gradient(first_out.weight);
    }

    void last_add() {
        t.launch(LaunchOp::residual_add, m.parallel_attention ? 2 : 1);  // a parallel layer's three
        // The last add: the MLP's output (compute dtype) and the sum (the stream's), beside the
        // residual stream's earlier tensors that no row keeps.
        const std::uint64_t stream =
            (m.parallel_attention ? (norm_keeps_stream ? 2 * d + z.s : 2 * d + 2 * z.s)
             : one_block          ? (norm_keeps_stream ? d + z.s : d + 2 * z.s)
                                  : (norm_keeps_stream ? d + z.s : d + 3 * z.s)) +
            z.upcast + (held > Count(0) ? d : 0);
        const std::string what =
            std::string(
                m.parallel_attention
                    ? (norm_keeps_stream
                           ? "the attention's and the MLP's outputs, the sum"
                           : "the layer's input, the attention's and the MLP's outputs, the sum")
                : one_block ? (norm_keeps_stream ? "the block's output and the sum"
                                                 : "the layer's input, the block's output, the sum")
                            : (norm_keeps_stream ? "the MLP's output and the sum"
                                                 : "the layer's input, the attention half's sum, "
                                                   "the MLP's output, the sum")) +
            (z.upcast ? ", the MLP's output upcast (CPU)" : "") +
            (held > Count(0) ? ", the attention's output (held)" : "");
        t.layer_end("residual add (the layer's last op)", what, bytes_of(stream, "sbh"),
                    Count(stream) * z.sbh);
    }

    void dequantized_work() {
        // QLoRA: each 4-bit linear dequantises its weight to the compute dtype while it computes,
        // forward and backward (bitsandbytes' MatMul4Bit); the largest, beside everything the layer
        // keeps. Quantised from fp16, it dequantises to fp16 and casts that: both alive at once.
        if (tuning.dequantized == Count(0)) return;
        const std::uint64_t bytes = dequantized_bytes(tuning.dequantized_from, z.compute);
        const std::string what = bytes > d ? "the largest weight, dequantised to " +
                                                 std::string(dtype_name(*tuning.dequantized_from)) +
                                                 " and cast"
                                           : "the largest weight, dequantised";
        t.workspace(false, "4-bit linear (bitsandbytes)", what, bytes_of(bytes, "x its elements"),
                    tuning.dequantized * bytes);
        t.workspace(true, "4-bit linear backward", what, bytes_of(bytes, "x its elements"),
                    tuning.dequantized * bytes, tuning.dequantized_linear);
    }

    void dora_work() {
        // DoRA: each adapted linear's forward makes ||W + B A|| from B A x I (an in x in identity
        // through the adapter), W as the adapter's dtype, W + scaling B A and the scaled term; the
        // largest, beside the layer.
        if (tuning.dora) {
            const std::uint64_t own = adapter_bytes(t, z);
            const std::uint64_t copies = 3 + (dora_weight_copied(t, z) ? 1 : 0);
            Count largest, widest;
            for (std::size_t l = 0; l < tuning.shapes.size(); ++l) {
                const AdaptedShape& w = tuning.shapes[l];
                if ((tuning.adapted & bit(Linear(l))) == 0) continue;
                largest = std::max(largest, (Count(w.in) * w.in + Count(copies) * w.in * w.out +
                                             Count(w.in) * tuning.rank) *
                                                own);
                widest = std::max(widest, Count(w.out));
            }
            t.workspace(false, "DoRA weight norm",
                        "I (in x in), B A, W cast, W + scaled B A, largest linear",
                        bytes_of(own, "x (in^2 + " + std::to_string(copies) + " in out + in r)"),
                        largest);
            // Not measured (saved-tensor hooks see no temporaries): the output's gradient and those
            // of the two products' factors, s b out each in the adapter's dtype, at the widest
            // adapted linear (an expert's tokens are at most s b). Leans high. A linear's op: in a
            // kind with no adapter its 0 bytes still count beside a fresh gradient, as before (a
            // frozen linear).
            t.workspace(true, "DoRA backward",
                        "its output's gradient and the products' factors' gradients, widest linear",
                        bytes_of(4 * own, "sb(out)"), z.tokens * widest * (4 * own),
                        first_linear(tuning.adapted != 0 ? tuning.adapted : tuning.frozen));
        }
    }

    // Named as the free block functions name their parameters, so each step reads as they do.
    TableBuilder& t;
    const Architecture& m;
    const Sizes& z;
    const std::uint64_t d, micro_batch;
    const Attention attention;
    const LayerTuning& tuning;
    bool mlp_input_grad = true;  ///< the MLP's input needs a gradient (mlp_half's)
    /// The residual stream's tensors are alive in the caller while the layer runs; rows keep them
    /// only where a LayerNorm keeps its input (an RMSNorm keeps an fp32 copy, the stream itself
    /// when that is fp32) or, without pre-norms, the projections read the stream itself (unless
    /// they cast it).
    const bool shared_norm, norm_keeps_stream;
    const Count unkept_stream, held;
    const bool one_block;  ///< a layer of its mixer alone or of its MLP alone (Nemotron-H)
};

}  // namespace detail

/// One layer's saved tensors as PyTorch keeps them for this architecture, `d`-byte activations.
/// `modules`: what selective recomputation checkpoints (select_modules); none ({0}): the table
/// unselected, every module's checkpoint rows in it. `tuning`: what fine-tuning changes
/// (finetune.hpp); by default every weight trains.
inline LayerActivations architecture_layer(const Architecture& m, std::uint64_t seq,
                                           std::uint64_t micro_batch, Precision precision,
                                           Attention attention, Runtime runtime = {},
                                           ModuleSet modules = {}, const LayerTuning& tuning = {}) {
    // mllama's cross-attention without images: skipped, so not even a checkpoint's input is kept.
    if (!m.runs_in_step()) return {};
    detail::Sizes z(m, seq, micro_batch, precision, runtime);
    z.inside_layer(m.compile);
    LayerActivations layer;
    detail::TableBuilder t(layer.rows, &layer, tuning);
    detail::LayerBlocks(t, m, z, micro_batch, attention, tuning).write();
    layer.input_bytes = z.sbh * z.s;  // the checkpoint keeps the layer's input
    if (z.kernels->checkpoint_rng_state > 0)
        layer.checkpoint_tensors.push_back({"RNG state", Count(z.kernels->checkpoint_rng_state),
                                            ActivationSplit::replicated, CheckpointHeld::always});
    // The down projection's output, which the layer's last add takes as it is (no experts'
    // weighting, post-norm or dropout after it): the gradients reached before any saved tensor is
    // read are alive while the forward reruns. A LoRA adapter's beside it; under autocast the
    // output's gradient cast from the fp32 stream to the compute dtype (measured: nanoGPT's
    // frozen c_proj, validation/results/cpu-third-party-lora.json).
    const bool adapted = (tuning.adapted & bit(Linear::down)) != 0;
    if (!m.is_moe() && !m.norms_after_branches() && m.hidden_dropout == 0 &&
        (adapted || z.s != z.d))
        layer.checkpoint_tensors.push_back(
            {"the gradients made before the rerun",
             adapted ? detail::adapter_gradients_at_rerun(t, z, z.sbh) : z.sbh * z.d,
             ActivationSplit::replicated, CheckpointHeld::rerun});
    if (modules.bits != 0) select_modules(layer, modules);
    return layer;
}

}  // namespace memcalc
