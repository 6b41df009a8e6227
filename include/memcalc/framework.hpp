#pragma once
/// How the training framework runs a step, where frameworks differ: the kernels the architecture
/// activation model follows, the attention kernel, how the optimiser step runs and when the
/// gradients exist. One value in Settings; a profile (Megatron-LM, DeepSpeed, FSDP, ...) is a row
/// of them.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/attention_kernels.hpp"
#include "memcalc/kernels.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

/// How the optimiser step runs, which decides its temporaries (the recipe's step_temporary_bytes).
enum class OptimizerImpl {
    fused,     ///< one kernel over all tensors, nothing allocated: Megatron-LM, DeepSpeed, torch's
               ///< fused=True
    foreach,   ///< torch.optim's default on CUDA: sqrt(v) of every parameter at once
    for_loop,  ///< one tensor at a time (foreach=False): sqrt(v) and its quotient of the largest
               ///< tensor
};

inline const char* optimizer_impl_name(OptimizerImpl o) {
    switch (o) {
        case OptimizerImpl::fused: return "fused";
        case OptimizerImpl::foreach: return "foreach";
        case OptimizerImpl::for_loop: return "for-loop";
    }
    return "?";
}

/// When the gradients exist. Lazy: PyTorch after zero_grad(set_to_none=True), each made by the
/// backward step that writes it (the chapter's model); from the second micro-batch on every one is
/// held, accumulated into. Persistent: one contiguous buffer for the whole run, live at every step
/// (Megatron-LM's main_grad, fp32 with --recipe mixed-adam-fp32-grads; DeepSpeed's). Stepped:
/// the optimizer runs inside backward, each gradient stepped by an optimizer of its own and freed
/// once whole (torchtune's optimizer_in_bwd: a post-accumulate-grad hook per parameter).
enum class GradBuffer { lazy, persistent, stepped };

inline const char* grad_buffer_name(GradBuffer g) {
    switch (g) {
        case GradBuffer::lazy: return "lazy";
        case GradBuffer::persistent: return "persistent";
        case GradBuffer::stepped: return "stepped";
    }
    return "?";
}

/// When a sharded run (ZeRO-2/3, FSDP) reduces its gradients: after every micro-batch, or after
/// the last alone, each layer's gradient held unsharded in the micro-batches before it (FSDP's
/// no_sync, which lit-gpt's fabric.no_backward_sync enters for every micro-batch but the last).
enum class GradSync { every_microbatch, last_microbatch };

inline const char* grad_sync_name(GradSync g) {
    return g == GradSync::every_microbatch ? "every-microbatch" : "last-microbatch";
}

/// What a sharded run's gradient covers: each trained tensor (FSDP2, ZeRO) or each wrapped unit's
/// flat parameter (FSDP1 with use_orig_params=True: once any tensor of a layer trains, its one
/// gradient covers the layer's frozen tensors too, as torch's FSDP docstring warns).
enum class GradUnits { tensor, flat };

inline const char* grad_units_name(GradUnits g) {
    return g == GradUnits::tensor ? "tensor" : "flat";
}

/// ZeRO-3's input side and head (what no wrapped layer holds: FSDP's root unit): gathered while
/// they compute (the embedding in forward 1 and backward 1, the head at the loss and backward L),
/// or kept gathered from forward 1 to the end of backward (FSDP1's root, which its
/// _post_forward_reshard leaves unsharded "to be immediately used for backward"; FSDP2's, whose
/// root gets no post-forward mesh).
enum class RootGather { per_use, kept };

inline const char* root_gather_name(RootGather g) {
    return g == RootGather::per_use ? "per-use" : "kept";
}

/// When the optimiser's state (Adam's moments) is made. Lazy: at the first step, after its
/// backward (torch.optim's AdamW), in blocks the first step's activations freed, so the next
/// step's activations need segments of their own (measured on an H200 for a plain loop). Eager:
/// before the first step (DeepSpeed's initialize_optimizer_states, to keep those blocks whole);
/// torchtitan's published FSDP2 run reserves what eager gives, lazy 27% more (not yet explained).
enum class OptimizerState { lazy, eager };

inline const char* optimizer_state_name(OptimizerState s) {
    return s == OptimizerState::lazy ? "lazy" : "eager";
}

/// How the program computes the loss from the logits.
enum class LossKernel {
    fp32,   ///< cross_entropy(logits.float()): an fp32 copy, fp32 log-probabilities saved, fp32
            ///< gradients
    bf16,   ///< cross_entropy on the logits as they are (nanoGPT's call on bf16 logits): all in the
            ///< compute dtype
    fused,  ///< one kernel (Liger's, Transformer Engine's): its gradient written over the logits,
            ///< nothing else saved (read from their sources, not measured; Megatron-LM's "fusion"
            ///< still keeps an fp32 copy)
    /// Megatron-LM's VocabParallelCrossEntropy: one fp32 copy of the logits, softmaxed in place and
    /// kept, its gradient written over it; the logits' gradient is that cast back to the compute
    /// dtype.
    fp32_inplace,
    /// torchtune's CEWithChunkedOutputLoss, eager: the head runs chunk by chunk (the logits a list,
    /// whole in the compute dtype); each chunk is upcast in turn, eager log-softmax keeping every
    /// chunk's fp32 output; backward runs a chunk's fp32 gradients at a time
    /// (Framework::loss_chunks).
    chunked,
    /// Liger's fused linear cross-entropy (LigerFusedLinearCrossEntropyFunction): the logits never
    /// whole; its forward takes the head chunk by chunk over the tokens, writing the hidden states'
    /// and the head weight's gradients, which it keeps for backward.
    fused_linear,
    /// lit-gpt's chunked_cross_entropy over its head's chunks (lm_head_chunk_size): the logits a
    /// list, whole in the compute dtype; cross_entropy on each chunk as it is, log-softmax keeping
    /// every chunk's output; backward runs a chunk's gradients at a time.
    chunked_bf16,
    /// torchtune's CEWithChunkedOutputLoss with its loss compiled (training.compile_loss) on
    /// PyTorch 2: each chunk's cross-entropy one inductor graph reading the chunk as it is and
    /// keeping it (and 8 B a token); autograd runs every chunk's loss backward before the head's,
    /// so the logits, then their gradients, are all alive at once (measured on torch 2.6, CPU:
    /// validation/chunked_loss_peak.py).
    chunked_compiled,
};

/// Whether the loss splits the tokens into Framework::loss_chunks equal chunks by default
/// (torchtune's num_output_chunks).
inline bool chunks_by_count(LossKernel l) {
    return l == LossKernel::chunked || l == LossKernel::chunked_compiled;
}

/// Whether the loss runs a chunk of tokens at a time, its gradients a chunk's.
inline bool chunked_loss(LossKernel l) {
    return l == LossKernel::chunked || l == LossKernel::chunked_bf16 ||
           l == LossKernel::chunked_compiled;
}

inline const char* loss_kernel_name(LossKernel l) {
    switch (l) {
        case LossKernel::fp32: return "fp32";
        case LossKernel::bf16: return "bf16";
        case LossKernel::fused: return "fused";
        case LossKernel::fp32_inplace: return "fp32-inplace";
        case LossKernel::chunked: return "chunked";
        case LossKernel::fused_linear: return "fused-linear";
        case LossKernel::chunked_bf16: return "chunked-bf16";
        case LossKernel::chunked_compiled: return "chunked-compiled";
    }
    return "?";
}

/// Whether the training loop keeps the model's output (the logits) through backward. Held:
/// nanoGPT's `logits, loss = model(x, y)` keeps them to the end of the micro-batch, the next
/// forward's return freeing them. Freed: transformers' Trainer returns the loss alone, so they go
/// once the loss is made.
enum class LogitsLife { held, freed };

inline const char* logits_life_name(LogitsLife l) {
    return l == LogitsLife::held ? "held" : "freed";
}

/// Whether the model hands back each layer's k and v (transformers' use_cache, on by default in its
/// configs): off, or kept in the output, which lives as the logits do (held to the next forward, or
/// freed once the loss is made). transformers turns it off itself under gradient checkpointing.
enum class KvCache { off, kept };

inline const char* kv_cache_name(KvCache c) { return c == KvCache::off ? "off" : "kept"; }

/// How a MoE layer's experts run: as the model's code writes them (ExpertDispatch: transformers'
/// Llama 4 runs every expert over every token), or as Megatron-LM's dropless grouped GEMM over the
/// routed slots.
enum class MoeKernel { model_code, grouped_gemm };

inline const char* moe_kernel_name(MoeKernel k) {
    return k == MoeKernel::model_code ? "model-code" : "grouped-gemm";
}

/// Whose GEMMs the linears run: PyTorch's (its cuBLAS workspaces, device rows of every CUDA
/// program) or Transformer Engine's, which keeps a cuBLAS workspace of its own (outside.hpp).
enum class GemmLibrary { torch, transformer_engine };

inline const char* gemm_library_name(GemmLibrary g) {
    return g == GemmLibrary::torch ? "torch" : "transformer-engine";
}

/// Which torch.utils.checkpoint full recomputation calls: non-reentrant (use_reentrant=False: a
/// layer's recomputed tensors go as its backward takes them) or reentrant (torch's default before
/// 2.4, transformers' gradient_checkpointing_enable(): CheckpointFunction.backward reruns the layer
/// and holds its output while the layer's backward runs).
enum class CheckpointImpl { non_reentrant, reentrant };

inline const char* checkpoint_impl_name(CheckpointImpl c) {
    return c == CheckpointImpl::reentrant ? "reentrant" : "non-reentrant";
}

/// Whether data-parallel messages run beside compute: layers (each layer's gathers and gradient
/// reduction beside its neighbours' forward or backward: DDP's buckets, Megatron-LM's
/// overlap_grad_reduce and overlap_param_gather, FSDP's and ZeRO-3's prefetch) or none (after the
/// backward and before the forward: DeepSpeed's overlap_comm off, Megatron-LM without those).
enum class DpOverlap { layers, none };

inline const char* dp_overlap_name(DpOverlap o) {
    return o == DpOverlap::layers ? "layers" : "none";
}

/// Whether tensor-parallel collectives run beside the matrix products they feed: none (each
/// all-gather or reduce-scatter before or after its linear) or matmul (collective matmuls:
/// torchtitan's async TP, Transformer Engine's userbuffers under Megatron-LM's
/// --tp-comm-overlap), which split each into tp pieces under as many slices of the product.
enum class TpOverlap { none, matmul };

inline const char* tp_overlap_name(TpOverlap o) {
    return o == TpOverlap::matmul ? "matmul" : "none";
}

struct Framework {
    Platform platform = Platform::cuda;              ///< the architecture model's kernels
    Attention attention = Attention::eager;          ///< eager scores, or a fused (flash) kernel
    OptimizerImpl optimizer = OptimizerImpl::fused;  ///< decides the optimiser step's temporaries
    GradBuffer grad_buffer = GradBuffer::lazy;       ///< when the gradients exist
    LossKernel loss = LossKernel::fp32;              ///< how the loss is computed
    LogitsLife logits = LogitsLife::held;  ///< whether the loop keeps the logits through backward
    KvCache kv_cache = KvCache::off;  ///< whether the model's output keeps each layer's k and v
    MoeKernel moe = MoeKernel::model_code;    ///< which tokens the experts compute over
    TorchVersion torch = TorchVersion::v2_2;  ///< what autograd keeps (kernels.hpp's torch_rows)
    GemmLibrary gemm = GemmLibrary::torch;    ///< whose workspaces the allocator holds
    OptimizerState optimizer_state = OptimizerState::eager;     ///< when the moments are made
    CheckpointImpl checkpoint = CheckpointImpl::non_reentrant;  ///< full recomputation's call
    /// --loss chunked: the chunks the tokens are split into (torchtune's num_output_chunks).
    std::uint64_t loss_chunks = 8;
    /// A chunked loss's chunks of this many tokens of each sequence instead (lit-gpt's
    /// lm_head_chunk_size, 128 in its fine-tuning scripts); 0: loss_chunks equal ones.
    std::uint64_t loss_chunk_tokens = 0;
    DpOverlap dp_overlap = DpOverlap::layers;  ///< the step time's: data-parallel messages hidden
    TpOverlap tp_overlap = TpOverlap::none;    ///< the step time's: tensor-parallel ones
    /// Which fused kernel --attention flash runs (attention_kernels.hpp): its rate for the step
    /// time, its layouts for what a sequence-first program copies.
    AttentionKernel attention_kernel = AttentionKernel::flash_attention_2;
    /// The program's CUBLAS_WORKSPACE_CONFIG as bytes (cublas_workspace_config_bytes); none: unset,
    /// each GPU's default (outside.hpp).
    std::optional<std::uint64_t> cublas_workspace = std::nullopt;
    GradSync grad_sync = GradSync::every_microbatch;  ///< when sharded gradients are reduced
    GradUnits grad_units = GradUnits::tensor;         ///< what one gradient covers
    RootGather root_gather = RootGather::per_use;     ///< ZeRO-3's input side and head

    /// This framework running `kernel`: a profile row names it without spelling every switch
    /// before it.
    Framework with(AttentionKernel kernel) const {
        Framework f = *this;
        f.attention_kernel = kernel;
        return f;
    }
    Framework with(RootGather gather) const {
        Framework f = *this;
        f.root_gather = gather;
        return f;
    }
};

/// CUBLAS_WORKSPACE_CONFIG as PyTorch reads it (CublasHandlePool.cpp's parseChosenWorkspaceSize):
/// ":SIZE:COUNT" pairs, SIZE KiB each, their products summed; none where `text` is not one or more
/// such pairs or the sum overflows.
inline std::optional<std::uint64_t> cublas_workspace_config_bytes(std::string_view text) {
    const auto number = [&](std::uint64_t& out) {
        if (text.empty() || text.front() != ':') return false;
        text.remove_prefix(1);
        std::size_t n = 0;
        out = 0;
        for (; n < text.size() && text[n] >= '0' && text[n] <= '9'; ++n) {
            if (out > (UINT64_MAX - 9) / 10) return false;
            out = out * 10 + std::uint64_t(text[n] - '0');
        }
        text.remove_prefix(n);
        return n > 0;
    };
    std::uint64_t total = 0, size = 0, count = 0;
    do {
        if (!number(size) || !number(count)) return std::nullopt;
        if (size > UINT64_MAX / 1024 || (count > 0 && size * 1024 > (UINT64_MAX - total) / count))
            return std::nullopt;
        total += size * 1024 * count;
    } while (!text.empty());
    return total;
}

/// A setting as a row: its key (profile or model files, JSON reports; the option is --key with '-'
/// for '_'), its member of `Owner`, its choices and their names. Options, files, the listings and
/// the reports all loop over a tuple of them (framework_switches, program_facts.hpp's), so a new
/// setting is a row there.
template <class E, std::size_t N, class Owner = Framework>
struct Switch {
    Text key;
    Text heading;  ///< the listing's
    E Owner::*member;
    std::array<E, N> values;
    const char* (*name)(E);
    Text help;  ///< for --help: what each choice means
    /// Other text a value is read from ("2.4" for the 2.2 row), where names are not all it takes.
    std::optional<E> (*read)(std::string_view) = nullptr;

    /// "fused, foreach or for-loop"
    std::string choice_list() const {
        std::string out;
        for (std::size_t i = 0; i < N; ++i)
            out += std::string(i == 0 ? "" : i + 1 == N ? " or " : ", ") + name(values[i]);
        return out;
    }
    const E* find(std::string_view text) const {
        for (const E& v : values)
            if (text == name(v)) return &v;
        const std::optional<E> other = read ? read(text) : std::nullopt;
        for (const E& v : values)
            if (other == v) return &v;
        return nullptr;
    }
    std::string option() const {
        std::string o = "--" + std::string(key);
        std::replace(o.begin(), o.end(), '_', '-');
        return o;
    }
};

template <class E, std::size_t N, class Owner>
Switch(Text, Text, E Owner::*, std::array<E, N>, const char* (*)(E), Text) -> Switch<E, N, Owner>;
template <class E, std::size_t N, class Owner>
Switch(Text, Text, E Owner::*, std::array<E, N>, const char* (*)(E), Text,
       std::optional<E> (*)(std::string_view)) -> Switch<E, N, Owner>;

inline const auto framework_switches = std::make_tuple(
    Switch{
        "platform", "platform", &Framework::platform, std::array{Platform::cuda, Platform::cpu},
        platform_name,
        "Whose PyTorch kernels the architecture model follows: cuda (default) or cpu, which\n"
        "keeps LayerNorm statistics in bf16, softmaxes an fp32 copy and keeps a dropout's noise\n"
        "in the compute dtype (how validation/gpu/ measures the model without a GPU)"},
    Switch{"attention", "attention", &Framework::attention,
           std::array{Attention::eager, Attention::flash}, attention_name, ""},
    Switch{
        "optimizer_impl", "optimizer step", &Framework::optimizer,
        std::array{OptimizerImpl::fused, OptimizerImpl::foreach, OptimizerImpl::for_loop},
        optimizer_impl_name,
        "How the optimizer step runs, which decides its temporaries: fused (default: Megatron-LM,\n"
        "DeepSpeed, torch fused=True; none), foreach (torch.optim's default on CUDA: sqrt(v) of\n"
        "every parameter at once) or for-loop (one tensor at a time: two of the largest)"},
    Switch{"grad_buffer", "gradients", &Framework::grad_buffer,
           std::array{GradBuffer::lazy, GradBuffer::persistent, GradBuffer::stepped},
           grad_buffer_name,
           "When gradients exist: lazy (default: PyTorch with zero_grad(set_to_none=True); each\n"
           "appears as backward makes it, and from the second micro-batch on all are held),\n"
           "persistent (Megatron-LM's and DeepSpeed's contiguous buffer, live at every step;\n"
           "Megatron's is fp32 main_grad: pair it with --recipe mixed-adam-fp32-grads) or\n"
           "stepped (the optimizer in backward, torchtune's optimizer_in_bwd: each gradient\n"
           "stepped by its own optimizer and freed once whole; one micro-batch, one replica)"},
    Switch{"grad_sync", "gradient sync", &Framework::grad_sync,
           std::array{GradSync::every_microbatch, GradSync::last_microbatch}, grad_sync_name,
           "When a sharded run (--zero 2/3) reduces its gradients: every-microbatch (default) or\n"
           "last-microbatch (FSDP's no_sync, lit-gpt's fabric.no_backward_sync: the micro-batches\n"
           "before the last hold every layer's gradient unsharded; not with --offload)"},
    Switch{"grad_units", "gradient units", &Framework::grad_units,
           std::array{GradUnits::tensor, GradUnits::flat}, grad_units_name,
           "What one gradient covers: tensor (default: each trained tensor; FSDP2, ZeRO) or flat\n"
           "(FSDP1 with use_orig_params=True, Fabric's: a layer with any trained tensor has one\n"
           "gradient over all of its weights, the frozen ones too)"},
    Switch{"root_gather", "root gather", &Framework::root_gather,
           std::array{RootGather::per_use, RootGather::kept}, root_gather_name,
           "ZeRO-3's embedding and head, gathered whole: per-use (default: while they compute,\n"
           "forward 1 and backward 1, the loss and backward L) or kept (FSDP's root unit, which\n"
           "FSDP1 and FSDP2 do not reshard after forward: from forward 1 to the end of backward;\n"
           "the fsdp2 and torchtitan profiles')"},
    Switch{
        "loss", "loss", &Framework::loss,
        std::array{LossKernel::fp32, LossKernel::bf16, LossKernel::fused, LossKernel::fp32_inplace,
                   LossKernel::chunked, LossKernel::fused_linear, LossKernel::chunked_bf16,
                   LossKernel::chunked_compiled},
        loss_kernel_name,
        "How the loss is computed: fp32 (default: cross_entropy(logits.float()), as transformers\n"
        "does: an fp32 copy, fp32 log-probabilities and gradients), bf16 (cross_entropy on the\n"
        "logits in the compute dtype, as nanoGPT calls it), fused (Liger's or Transformer\n"
        "Engine's kernel: the gradient written over the logits, nothing else kept),\n"
        "fp32-inplace (Megatron-LM's: an fp32 copy softmaxed in place, kept, its gradient\n"
        "written over it), chunked (torchtune's CEWithChunkedOutputLoss: the head and the\n"
        "fp32 upcast a chunk of tokens at a time, --loss-chunks; log-softmax still keeps every\n"
        "chunk's fp32 output, eager or compiled by torch 1.13) or fused-linear (Liger's fused\n"
        "linear cross-entropy: no logits, a chunk of tokens' at a time; the hidden states' and\n"
        "the head's gradients made in forward; over the whole vocabulary, whatever --tp) or\n"
        "chunked-bf16 (lit-gpt's chunked_cross_entropy: the head a chunk at a time, each\n"
        "chunk's loss in the logits' dtype, every chunk's log-probabilities kept) or\n"
        "chunked-compiled (torchtune's chunked loss compiled, PyTorch 2: each chunk's kept as it\n"
        "is, no log-probabilities; every chunk's gradient made before the head's backward)"},
    Switch{"logits", "logits", &Framework::logits, std::array{LogitsLife::held, LogitsLife::freed},
           logits_life_name,
           "Whether the loop keeps the logits through backward: held (default: nanoGPT's\n"
           "'logits, loss = model(x, y)', until the next forward returns) or freed (transformers'\n"
           "Trainer, which keeps only the loss)"},
    Switch{
        "kv_cache", "k/v cache", &Framework::kv_cache, std::array{KvCache::off, KvCache::kept},
        kv_cache_name,
        "Whether the model's output keeps each layer's k and v (use_cache left on in training):\n"
        "off (default) or kept, for as long as the logits live (--logits); only the copies\n"
        "backward does not keep already count (repeated k/v, recomputation)"},
    Switch{"moe_kernel", "MoE kernel", &Framework::moe,
           std::array{MoeKernel::model_code, MoeKernel::grouped_gemm}, moe_kernel_name,
           "How a MoE layer's experts run: model-code (default: as the model's code writes them;\n"
           "transformers' Llama 4 runs every expert over every token, the router's scores\n"
           "multiplied into the input) or grouped-gemm (Megatron-LM's dropless grouped GEMM over\n"
           "the routed token-slots alone)"},
    Switch{
        "torch_version", "torch", &Framework::torch,
        std::array{TorchVersion::v1_13, TorchVersion::v2_2}, torch_version_name,
        "The PyTorch release the program runs on, where what autograd keeps changes: 1.13\n"
        "(through 2.1: mean() keeps its input, RMSNorm's fp32 x^2) or 2.2 (default: and later);\n"
        "any release number is read as the row it falls in (2.4 is 2.2's)",
        torch_version_of},
    Switch{"gemm", "GEMMs", &Framework::gemm,
           std::array{GemmLibrary::torch, GemmLibrary::transformer_engine}, gemm_library_name,
           "Whose GEMMs the linears run, for the device figure: torch (default) or\n"
           "transformer-engine (Megatron-LM's default transformer_impl: a cuBLAS workspace of its\n"
           "own beside PyTorch's)"},
    Switch{
        "optimizer_state", "optimizer state", &Framework::optimizer_state,
        std::array{OptimizerState::lazy, OptimizerState::eager}, optimizer_state_name,
        "When the optimiser's moments are made, which moves the reserved figure alone: lazy\n"
        "(torch.optim's AdamW in a plain loop, the pytorch, hf-trainer and nanogpt profiles':\n"
        "at the first step, in blocks its activations freed, so the next step's need new\n"
        "segments; measured on an H200) or eager (default: before the first step, as DeepSpeed's\n"
        "initialize_optimizer_states does; what torchtitan's published FSDP2 run agrees with)"},
    Switch{"checkpoint", "checkpoint", &Framework::checkpoint,
           std::array{CheckpointImpl::non_reentrant, CheckpointImpl::reentrant},
           checkpoint_impl_name,
           "Which torch.utils.checkpoint --recompute full calls: non-reentrant (default) or\n"
           "reentrant (torch's default before 2.4, transformers' gradient_checkpointing_enable():\n"
           "the recomputed layer's output held through the layer's backward)"},
    Switch{"dp_overlap", "dp overlap", &Framework::dp_overlap,
           std::array{DpOverlap::layers, DpOverlap::none}, dp_overlap_name,
           "For the step time: whether data-parallel messages run beside compute: layers\n"
           "(default: each layer's weight gathers and gradient reduction beside its neighbours'\n"
           "forward or backward, as DDP's buckets, FSDP's prefetch and Megatron-LM's\n"
           "--overlap-grad-reduce run them) or none (all exposed: DeepSpeed ZeRO-1/2's default)"},
    Switch{"tp_overlap", "tp overlap", &Framework::tp_overlap,
           std::array{TpOverlap::none, TpOverlap::matmul}, tp_overlap_name,
           "For the step time: whether tensor-parallel collectives run beside the matrix\n"
           "products they feed, with sequence parallelism: none (default) or matmul (collective\n"
           "matmuls: torchtitan's async TP, Megatron-LM's --tp-comm-overlap), each in tp pieces,\n"
           "the first or last exposed"},
    Switch{
        "attention_kernel", "attention kernel", &Framework::attention_kernel,
        std::array{AttentionKernel::flash_attention_2, AttentionKernel::cudnn,
                   AttentionKernel::flash_attention_3},
        attention_kernel_name,
        "The kernel --attention flash runs, at its measured rate on Hopper for the step time\n"
        "(the GPU's attention_efficiency elsewhere): flash-attention-2 (default: PyTorch's\n"
        "SDPA; Transformer Engine's before Hopper), cudnn (Transformer Engine's on Hopper) or\n"
        "flash-attention-3. flash-attn's take batch-first tensors alone, which a sequence_first\n"
        "program copies for them; cuDNN's the program's own layout"});

/// The share of `gpu`'s bf16 peak the attention core of a program on `f` runs at.
inline double attention_efficiency(const Gpu& gpu, const Framework& f) {
    return attention_efficiency(gpu, f.attention == Attention::flash, f.attention_kernel);
}

/// `f(row)` for every framework switch, in order.
template <class F>
void for_each_switch(F&& f) {
    std::apply([&](const auto&... row) { (f(row), ...); }, framework_switches);
}

/// A named framework: how training programs built on it run a step. A new one is a row here (or a
/// JSON file of the keys `memcalc profiles --format json` prints); command-line flags override its
/// values.
struct FrameworkProfile {
    Text name, description, source;
    Framework framework;
    /// How the framework's own model code is written, as program facts (program_facts.hpp) by key
    /// and value: they hold over the model's, and an option given holds over them.
    std::vector<std::pair<Text, Text>> program = {};
};

inline constexpr Text default_profile = "default";

// Each row says which upstream code it follows. What memcalc measures is each setting on its own
// (validation/); that a framework runs with these settings is read from its source, not measured.
inline const std::array<FrameworkProfile, 9> framework_profiles{{
    {"default",
     "the chapter's model: CUDA kernels, eager attention, a fused optimiser step, gradients made "
     "by backward",
     "the chapter (Korthikanti et al. 2022's accounting)",
     {Platform::cuda, Attention::eager, OptimizerImpl::fused, GradBuffer::lazy, LossKernel::fp32,
      LogitsLife::held, KvCache::off}},
    {"pytorch",
     "a PyTorch 2 loop on CUDA: torch.optim's default (foreach) step, zero_grad(set_to_none=True), "
     "attention as written",
     "torch.optim docs (foreach is the default on CUDA); Optimizer.zero_grad (set_to_none=True by "
     "default since 2.0)",
     {Platform::cuda, Attention::eager, OptimizerImpl::foreach, GradBuffer::lazy, LossKernel::fp32,
      LogitsLife::held, KvCache::off, MoeKernel::model_code, TorchVersion::v2_2, GemmLibrary::torch,
      OptimizerState::lazy}},
    {"megatron",
     "Megatron-LM: fused attention, a fused Adam step, the contiguous main_grad buffer (fp32 under "
     "bf16: "
     "pair with --recipe mixed-adam-fp32-grads), a loss softmaxing an fp32 copy of the logits in "
     "place; the logits stay in the model",
     "Megatron-LM core 0.9-0.14 (MoE: 0.13+): DistributedDataParallel's grad buffer, FusedAdam; "
     "VocabParallelCrossEntropy (fused "
     "or not) softmaxes an fp32 copy of the logits and keeps it for backward; GPTModel returns the "
     "loss, not the logits",
     Framework{Platform::cuda, Attention::flash, OptimizerImpl::fused, GradBuffer::persistent,
               LossKernel::fp32_inplace, LogitsLife::freed, KvCache::off, MoeKernel::grouped_gemm,
               TorchVersion::v2_2, GemmLibrary::transformer_engine}
         .with(AttentionKernel::cudnn),
     // TENorm: Transformer Engine's fused RMSNorm; bias_swiglu_impl (bias_activation_fusion, on
     // by default); MLA's value.contiguous() for TE's attention; [s, b, h] activations; the
     // token dispatchers of core 0.13+ (weighted_bias_swiglu_impl); the router on its input as
     // given (moe_router_dtype None)
     {{"rmsnorm_kernel", "fused"},
      {"fused_glu", "true"},
      {"latent_v_padded", "false"},
      {"sequence_first", "true"},
      {"expert_dispatch", "permuted"},
      {"router_input_fp32", "false"}}},
    {"deepspeed",
     "DeepSpeed's engine: a fused Adam step, a contiguous gradient buffer; attention as the "
     "model's code writes it",
     "DeepSpeed 0.14-0.16: FusedAdam and its ZeRO stage 1/2 gradient partitions "
     "(runtime/zero/stage_1_and_2.py), whose initialize_optimizer_states makes the state "
     "before the first step",
     {Platform::cuda, Attention::eager, OptimizerImpl::fused, GradBuffer::persistent,
      LossKernel::fp32, LogitsLife::held, KvCache::off, MoeKernel::model_code, TorchVersion::v2_2,
      GemmLibrary::torch, OptimizerState::eager}},
    {"fsdp2",
     "PyTorch FSDP2 (fully_shard) with a plain loop: torch.optim's foreach AdamW on the shards, "
     "gradients made by "
     "backward and reduce-scattered; pair with --zero 3",
     "torch 2.4-2.6 torch.distributed.fsdp.fully_shard; torch.optim.AdamW (foreach on CUDA)",
     // fully_shard's root is not resharded after forward (FSDPState._lazy_init: "for the root,
     // do not reshard after forward ... post_forward_mesh_info = None")
     Framework{Platform::cuda, Attention::flash, OptimizerImpl::foreach, GradBuffer::lazy,
               LossKernel::fp32, LogitsLife::held, KvCache::off}
         .with(RootGather::kept)},
    {"torchtitan",
     "torchtitan's trainer: FSDP2 (pair with --zero 3), SDPA, a foreach AdamW, the loss over fp32 "
     "logits, "
     "which it deletes before backward; its per-op selective checkpointing is --recompute op",
     "torchtitan 0.1 (2025): train.py (pred = model(inputs); loss = loss_fn(pred, labels); del "
     "pred), "
     "cross_entropy_loss (pred.float()), build_optimizers (implementation foreach)",
     Framework{Platform::cuda, Attention::flash, OptimizerImpl::foreach, GradBuffer::lazy,
               LossKernel::fp32, LogitsLife::freed, KvCache::off}
         .with(RootGather::kept),  // fully_shard's root, as fsdp2's
     {{"repeat_kv", "true"}}},     // models/llama3/model.py: repeat_kv before SDPA
    {"hf-trainer",
     "transformers' Trainer: SDPA attention (the default), torch's foreach AdamW (adamw_torch), "
     "the loss over fp32 logits (ForCausalLMLoss), the outputs dropped once the loss is taken",
     "transformers 4.46-4.53: Trainer.compute_loss returns the loss alone; "
     "loss_utils.ForCausalLMLoss upcasts the "
     "logits; attn_implementation defaults to sdpa; gradient_checkpointing_enable() without "
     "kwargs checkpoints with use_reentrant=True",
     {Platform::cuda, Attention::flash, OptimizerImpl::foreach, GradBuffer::lazy, LossKernel::fp32,
      LogitsLife::freed, KvCache::off, MoeKernel::model_code, TorchVersion::v2_2,
      GemmLibrary::torch, OptimizerState::lazy, CheckpointImpl::reentrant},
     // sdpa_attention.py: repeat_kv unless torch >= 2.5 and no attention mask (the Trainer's
     // collators pass one)
     {{"repeat_kv", "true"}}},
    {"nanogpt",
     "nanoGPT's train.py on CUDA: flash attention (torch 2), AdamW(fused=True), "
     "zero_grad(set_to_none=True); "
     "'logits, loss = model(X, Y)' keeps the logits to the next forward; under autocast the loss "
     "runs in fp32",
     "karpathy/nanoGPT train.py and model.py (2023): configure_optimizers uses fused AdamW on "
     "CUDA; "
     "cross_entropy is on autocast's fp32 list",
     {Platform::cuda, Attention::flash, OptimizerImpl::fused, GradBuffer::lazy, LossKernel::fp32,
      LogitsLife::held, KvCache::off, MoeKernel::model_code, TorchVersion::v2_2, GemmLibrary::torch,
      OptimizerState::lazy},
     {{"embedding_outputs_held", "true"}}},  // model.py:177-179: tok_emb, pos_emb
    {"cpu-replication",
     "validation/'s CPU replication: PyTorch's CPU kernels, eager attention, a for-loop optimiser "
     "step",
     "validation/gpu/replicate.py --device cpu (its MixedAdam steps one tensor at a time and "
     "makes its state when built)",
     {Platform::cpu, Attention::eager, OptimizerImpl::for_loop, GradBuffer::lazy, LossKernel::fp32,
      LogitsLife::held, KvCache::off, MoeKernel::model_code, TorchVersion::v2_2, GemmLibrary::torch,
      OptimizerState::eager}},
}};

/// The built-in profile of that name, or nullptr.
inline const FrameworkProfile* find_profile(std::string_view name) {
    for (const auto& p : framework_profiles)
        if (p.name == name) return &p;
    return nullptr;
}

}  // namespace memcalc
