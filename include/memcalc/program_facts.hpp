#pragma once
/// How a model's code is written, where programs of one architecture differ (nanoGPT's GPT and
/// transformers' GPT-2 share a shape, not a memory): a row each, its model-file key also its option
/// (--softmax-fp32 false), so a fact read from a program's source can be said of any model,
/// a preset or a --config. The listing is `memcalc program-facts`; a new fact is a row here.
#include <array>
#include <string>
#include <utility>
#include <vector>
#include <tuple>

#include "memcalc/framework.hpp"
#include "memcalc/model.hpp"

namespace memcalc {

inline const char* flag_name(bool on) { return on ? "true" : "false"; }
inline const char* causal_mask_buffer_name(CausalMaskBuffer b) {
    return causal_mask_buffer(b).name.data();  // a literal: terminated
}
inline const char* rotary_embedding_name(RotaryEmbedding r) {
    return rotary_embedding(r).name.data();  // a literal: terminated
}
inline const char* expert_dispatch_text(ExpertDispatch d) {
    return expert_dispatch_name(d).data();  // a literal: terminated
}

inline constexpr std::array<bool, 2> flag_values{false, true};

inline const auto program_facts = std::make_tuple(
    Switch{"softmax_fp32", "softmax fp32", &Architecture::softmax_fp32, flag_values, flag_name,
           "Eager attention's softmax in fp32 (true: softmax(x, dtype=float32), as LLaMA-style\n"
           "code calls it) or in the scores' dtype (false: GPT-2's, nanoGPT's)"},
    Switch{"attention_output_held", "output held", &Architecture::attention_output_held,
           flag_values, flag_name,
           "The layer's code keeps the attention's output in a name of its own until it returns\n"
           "(true: transformers' GPT2Block) or rebinds it (false: LLaMA-style code)"},
    Switch{
        "causal_mask_buffer", "mask buffer", &Architecture::causal_mask_buffer,
        std::array{CausalMaskBuffer::none, CausalMaskBuffer::per_layer,
                   CausalMaskBuffer::per_layer_added, CausalMaskBuffer::per_layer_bool},
        causal_mask_buffer_name,
        "Eager attention's causal mask: none (built each forward and added), per_layer (a\n"
        "max_positions^2 buffer in every layer, cast with the weights, masked_fill: nanoGPT's),\n"
        "per_layer_added (such a buffer added to the scores: llama2.c's) or per_layer_bool (a\n"
        "bool buffer, never cast, torch.where on it keeping nothing: transformers' GPT-2)"},
    Switch{"mask_in_product", "mask in product", &Architecture::mask_in_product, flag_values,
           flag_name,
           "The built mask is added inside the product, baddbmm(mask, q, k^T), which autocast\n"
           "casts with q and k (true: torch's MultiheadAttention) or out of place (false)"},
    Switch{"fused_qkv", "fused q/k/v", &Architecture::fused_qkv, flag_values, flag_name,
           "q, k and v are one linear (true: GPT-2's c_attn, nanoGPT's, torch's in_proj), whose\n"
           "input autocast casts once, or three (false)"},
    Switch{"fused_gate_up", "fused gate/up", &Architecture::fused_gate_up, flag_values, flag_name,
           "A gated MLP's gate and up are one linear (true: Phi-3's gate_up_proj), whose input\n"
           "autocast casts once and whose output is both, or two (false)"},
    Switch{"repeat_kv", "repeat k/v", &Architecture::repeat_kv, flag_values, flag_name,
           "With grouped k/v heads, the code copies k and v to every query head before a fused\n"
           "attention kernel, which keeps the copies (true: torchtune's, torchtitan's,\n"
           "transformers' sdpa before torch 2.5) or hands it the groups (false: flash-attn's)"},
    Switch{"embedding_outputs_held", "embeddings held", &Architecture::embedding_outputs_held,
           flag_values, flag_name,
           "The forward keeps the token and position embeddings' outputs in names of their own\n"
           "until it returns (true: nanoGPT's tok_emb and pos_emb) or only their sum (false)"},
    Switch{
        "input_require_grads", "input requires grad", &Architecture::input_require_grads,
        flag_values, flag_name,
        "Under adapters, the frozen embedding's output requires grad all the same (true:\n"
        "transformers' enable_input_require_grads, which peft's prepare_model_for_kbit_training\n"
        "and gradient checkpointing call) or not (false: lit-gpt's, a loop that only wraps\n"
        "linears): then the first layer keeps nothing before its first adapter"},
    Switch{"params_in_model_order", "params in order", &Architecture::params_in_model_order,
           flag_values, flag_name,
           "A for-loop optimiser steps the parameters in one group in the model's order (true:\n"
           "torch.optim.AdamW(model.parameters()), the head after the final norm) or in groups\n"
           "(false: the Trainer's and nanoGPT's weight-decay groups; memcalc leans high)"},
    Switch{"logits_fp32", "logits fp32", &Architecture::logits_fp32, flag_values, flag_name,
           "The model's forward returns its logits upcast to fp32, the head's own dropped (true:\n"
           "transformers' LLaMA-family code 4.30-4.44, logits.float()) or as the head made them\n"
           "(false)"},
    Switch{"rotary_embedding", "rotary tables", &Architecture::rotary_embedding,
           std::array{RotaryEmbedding::shared, RotaryEmbedding::per_layer,
                      RotaryEmbedding::per_layer_cached, RotaryEmbedding::shared_fp32},
           rotary_embedding_name,
           "Where rotary's cos and sin are made: shared (transformers 4.45+: once per forward),\n"
           "per_layer (4.40-4.44: in every layer), per_layer_cached (4.31-4.38: cached buffers)\n"
           "or shared_fp32 (lit-gpt's: the model's buffers in fp32, sliced for every layer)"},
    Switch{"rmsnorm_fp32_scale", "norm fp32 scale", &Architecture::rmsnorm_fp32_scale, flag_values,
           flag_name,
           "RMSNorm multiplies its weight into the fp32 result before casting back (true: T5's,\n"
           "OLMo 2's, gpt-oss's: it keeps that in fp32) or casts first (false: LLaMA's)"},
    Switch{"stacked_experts", "stacked experts", &Architecture::stacked_experts, flag_values,
           flag_name,
           "Experts' weights are stacked tensors that each expert indexes, copying them (true:\n"
           "gpt-oss's code), or a module each (false)"},
    Switch{
        "expert_dispatch", "expert dispatch", &Architecture::expert_dispatch,
        std::array{ExpertDispatch::routed, ExpertDispatch::every_token, ExpertDispatch::permuted},
        expert_dispatch_text,
        "Which tokens the experts run over, and how: routed (each expert its tokens, gathered,\n"
        "weighted and index_added back: transformers'), every_token (every expert over every\n"
        "token, scores multiplied in: transformers' Llama4TextMoe) or permuted (Megatron-LM\n"
        "0.13+: permuted by index, the weights applied in the activation, nothing kept)"},
    Switch{"rmsnorm_kernel", "RMSNorm kernel", &Architecture::rmsnorm_kernel,
           std::array{RmsnormKernel::torch, RmsnormKernel::fused, RmsnormKernel::torch_input_dtype},
           rmsnorm_kernel_name,
           "How RMSNorm runs: torch (PyTorch's ops, transformers' RMSNorm: an fp32 copy of x,\n"
           "1/rms and x_norm kept), fused (one kernel, Transformer Engine's and Apex's: x itself\n"
           "and 1/rms kept, its backward one kernel) or torch_input_dtype (PyTorch's ops in x's\n"
           "own dtype, lit-gpt's: x itself, 1/rms and x_norm in it)"},
    Switch{"compile", "compiled layers", &Architecture::compile,
           std::array{Compile::none, Compile::layers}, compile_name,
           "none (eager) or layers: torch.compile on each layer (torchtune's, torchtitan's),\n"
           "whose min-cut partition keeps RMSNorm's input and 1/rms, a GLU's gate and up, an\n"
           "activation's input, and makes the rest of those chains again in backward (measured\n"
           "on torch 1.13's partitioner and 2.6's torch.compile, which keeps GELU's output); an\n"
           "activation function not measured keeps all"},
    Switch{"fused_glu", "fused GLU", &Architecture::fused_glu, flag_values, flag_name,
           "A gated MLP's act(gate) x up is one kernel keeping gate and up alone, act recomputed\n"
           "in backward (true: Megatron-LM's bias_swiglu_impl, Transformer Engine's, Liger's) or\n"
           "torch's ops, which keep act's output too (false: transformers')"},
    Switch{"latent_v_padded", "latent v padded", &Architecture::latent_v_padded, flag_values,
           flag_name,
           "Latent attention under a fused kernel: v padded to q's head width and the output's\n"
           "slice copied for o_proj (true: transformers' flash_attention_2) or v copied\n"
           "contiguous at its own width (false: Megatron-LM's MLA on Transformer Engine)"},
    Switch{"sequence_first", "sequence first", &Architecture::sequence_first, flag_values,
           flag_name,
           "The layers hold activations sequence-first, [s, b, h] (true: Megatron-LM's), so a\n"
           "fused kernel taking batch-first tensors alone (--attention-kernel flash-attention-2)\n"
           "gets copies of q, k, v and, where b > 1, its output is copied for the output\n"
           "projection beside the kernel's own; or batch-first (false: most programs)"},
    Switch{"q_heads_first", "q heads-first", &Architecture::q_heads_first, flag_values, flag_name,
           "q reaches a fused kernel as a contiguous [b, heads, s, d] tensor (true: lit-gpt's,\n"
           "its rotary torch.cat after the fused q/k/v's permute), so a kernel whose output takes\n"
           "q's layout (flash-attention-2, cudnn) returns it heads-first and the program's\n"
           "transpose and reshape copy it for the output projection; or a transposed view of\n"
           "[b, s, heads, d] (false: transformers', nanoGPT's, torchtune's)"},
    Switch{"router_input_fp32", "router fp32 input", &Architecture::router_input_fp32, flag_values,
           flag_name,
           "The router's linear runs on an fp32 copy of its input, which it keeps (true:\n"
           "transformers' DeepSeek-V3, Megatron-LM's --moe-router-dtype fp32 before July 2025)\n"
           "or on the input itself (false)"});

/// A profile's program facts as listed and as profile files give them: "repeat_kv=true, ...".
inline std::string program_fact_list(const std::vector<std::pair<Text, Text>>& facts) {
    std::string out;
    for (const auto& [key, value] : facts)
        out += (out.empty() ? "" : ", ") + std::string(key) + "=" + std::string(value);
    return out;
}

/// `f(row)` for every program fact, in order.
template <class F>
void for_each_program_fact(F&& f) {
    std::apply([&](const auto&... row) { (f(row), ...); }, program_facts);
}

}  // namespace memcalc
