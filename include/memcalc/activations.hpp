#pragma once
/// The tensors one transformer layer keeps for its backward pass, and what each recomputation mode
/// keeps or rebuilds. The reference table is Korthikanti et al. 2022 (Reducing Activation
/// Recomputation in Large Transformer Models, section 4.1): s b h (34 + 5 a s / h) bytes per layer.
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "memcalc/activation_functions.hpp"
#include "memcalc/attention_kernels.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/kernels.hpp"
#include "memcalc/launches.hpp"
#include "memcalc/linears.hpp"
#include "memcalc/model.hpp"
#include "memcalc/text.hpp"
#include "memcalc/units.hpp"

namespace memcalc {

/// op: torchtitan's op-level selective checkpointing (activation_checkpoint.mode "selective",
/// selective_ac_option "op"): each layer is checkpointed, and its forward keeps the outputs of the
/// ops a policy names (every odd-numbered aten.mm of the layer, the attention kernels), which the
/// recomputation in its backward reuses. Source: pytorch/torchtitan torchtitan/distributed/
/// activation_checkpoint.py @cfb93265 (_apply_op_sac) and models/llama3/infra/parallelize.py
/// @018740b7
/// (_op_sac_save_list).
enum class Recompute { none, selective, full, op };

inline const char* recompute_name(Recompute r) {
    switch (r) {
        case Recompute::none: return "none";
        case Recompute::selective: return "selective";
        case Recompute::full: return "full";
        case Recompute::op: return "op";
    }
    return "?";
}

/// Whether the whole layer runs under a checkpoint, its input the checkpoint's (full and op).
inline bool checkpoints_layer(Recompute r) { return r == Recompute::full || r == Recompute::op; }

/// Where the per-layer table comes from: Korthikanti et al.'s formula (the chapter's), or the
/// architecture's own ops as PyTorch's eager implementations save them.
enum class ActivationModel { korthikanti, architecture };
/// Eager attention materialises the s x s scores; a fused (flash) kernel keeps a log-sum-exp per
/// row.
enum class Attention { eager, flash };

/// Whose kernels a table follows: the platform's and the PyTorch version's. A Platform alone is
/// the newest modelled version's.
struct Runtime {
    Platform platform = Platform::cuda;
    TorchVersion torch = TorchVersion::v2_2;
    /// The routed experts run one at a time in the model's own loop (transformers' sparse blocks,
    /// MoeKernel::model_code), each its own kernels; else one grouped GEMM runs them all. Launches
    /// alone depend on it.
    bool expert_loop = true;
    /// The kernel --attention flash runs, whose layouts decide the copies a sequence-first
    /// program makes for it (Architecture::sequence_first).
    AttentionKernel attention_kernel = AttentionKernel::flash_attention_2;
    Runtime(Platform platform = Platform::cuda, TorchVersion torch = TorchVersion::v2_2,
            bool expert_loop = true,
            AttentionKernel attention_kernel = AttentionKernel::flash_attention_2)
        : platform(platform),
          torch(torch),
          expert_loop(expert_loop),
          attention_kernel(attention_kernel) {}
};

inline const char* activation_model_name(ActivationModel m) {
    return m == ActivationModel::korthikanti ? "korthikanti" : "architecture";
}
inline const char* attention_name(Attention a) { return a == Attention::eager ? "eager" : "flash"; }

/// Megatron-LM's recompute_modules (transformer_config.py), the parts of a layer selective
/// recomputation can checkpoint; `none` and `attention` (the projections around the core) are never
/// recomputed. core_attn, mlp, moe and shared_experts checkpoint a module and keep its input;
/// layernorm, moe_act and mla_up_proj discard their output once its consumer has run and recompute
/// it before that one's backward.
enum class Module : std::uint8_t {
    none,
    attention,
    core_attn,
    layernorm,
    mlp,
    moe,
    moe_act,
    shared_experts,
    mla_up_proj
};
inline constexpr std::size_t module_count = static_cast<std::size_t>(Module::mla_up_proj) + 1;

inline constexpr Module recomputable_modules[] = {
    Module::core_attn,      Module::mlp,        Module::moe_act, Module::layernorm, Module::moe,
    Module::shared_experts, Module::mla_up_proj};

inline const char* module_name(Module m) {
    switch (m) {
        case Module::none: return "none";
        case Module::attention: return "attention";
        case Module::core_attn: return "core_attn";
        case Module::layernorm: return "layernorm";
        case Module::mlp: return "mlp";
        case Module::moe: return "moe";
        case Module::moe_act: return "moe_act";
        case Module::shared_experts: return "shared_experts";
        case Module::mla_up_proj: return "mla_up_proj";
    }
    return "?";
}

/// The modules selective recomputation checkpoints: Megatron-LM's default is core_attn alone.
struct ModuleSet {
    std::uint32_t bits = 1u << unsigned(Module::core_attn);
    static ModuleSet of(std::initializer_list<Module> ms) {
        ModuleSet s{0};
        for (Module m : ms) s.bits |= 1u << unsigned(m);
        return s;
    }
    bool has(Module m) const { return (bits >> unsigned(m)) & 1u; }
    /// moe_act and shared_experts run inside the MoE layer, which `moe` checkpoints whole.
    bool recomputes(Module m) const {
        return has(m) ||
               ((m == Module::moe_act || m == Module::shared_experts) && has(Module::moe));
    }
    bool is_default() const { return bits == ModuleSet{}.bits; }
    bool operator==(const ModuleSet& o) const { return bits == o.bits; }
    bool operator!=(const ModuleSet& o) const { return bits != o.bits; }
    /// "core_attn,mlp", in recomputable_modules' order.
    std::string names() const {
        std::string out;
        for (Module m : recomputable_modules)
            if (has(m)) out += (out.empty() ? "" : ",") + std::string(module_name(m));
        return out;
    }
};

/// What a row is to its module's checkpoint (SavedTensor::role).
enum class ModuleRole : std::uint8_t {
    inside,      ///< made inside the module: recomputing it drops the row
    input,       ///< the module's input itself, which its checkpoint keeps
    checkpoint,  ///< the checkpoint's own copy of the input, which no other row keeps: only when
                 ///< recomputed
};

/// Which recomputation modes keep a saved tensor from its forward step to its backward step.
/// (Full recomputation keeps only the layer's input, whatever the row says.)
enum class Keep {
    always,          ///< every mode but full
    not_selective,   ///< made inside the core attention: selective recomputation rebuilds it
    only_selective,  ///< an input of the core attention that only selective recomputation's
                     ///< checkpoint saves
};

inline const char* keep_name(Keep k) {
    switch (k) {
        case Keep::always: return "always";
        case Keep::not_selective: return "not_selective";
        case Keep::only_selective: return "only_selective";
    }
    return "?";
}

/// How a saved tensor divides across a tensor-parallel group (Korthikanti et al. 2022, Table 2).
enum class ActivationSplit {
    tensor,  ///< inside a tensor-parallel region (per head, per MLP column, per vocabulary slice):
             ///< / tp
    sequence,    ///< on the residual stream (norms, dropout, the linear layers' inputs): / tp with
                 ///< sequence parallelism
    replicated,  ///< the same on every tensor-parallel rank (token ids, rotary tables)
    vocab,       ///< vocabulary-parallel logits: ceil(V / tp) of the V columns
    /// inside an expert's hidden width: / etp, the expert tensor-parallel ranks (tp unless given).
    /// Megatron-LM gathers the token-slots over them under sequence parallelism, which this leans
    /// high for (/ tp there).
    expert_tensor,
};

/// A saved tensor's shape: its element count in the paper's letters, and how it divides across
/// ranks. Rows name one of these, so a new shape says its split where it is written, never guessed
/// from text.
struct Shape {
    const char* symbol;
    ActivationSplit split;
};

namespace shape {
inline constexpr Shape sbh{"sbh", ActivationSplit::sequence};  ///< the residual stream
inline constexpr Shape sb{"sb",
                          ActivationSplit::sequence};  ///< a value per token (norm statistics)
inline constexpr Shape ids{"sb",
                           ActivationSplit::replicated};  ///< token or target ids, on every rank
inline constexpr Shape sbq{
    "sb(ad)", ActivationSplit::tensor};  ///< queries (or keys, values repeated to every head)
inline constexpr Shape sbkv{"sb(kd)",
                            ActivationSplit::tensor};        ///< keys or values at their own heads
inline constexpr Shape sbf{"sbf", ActivationSplit::tensor};  ///< the MLP's hidden width
inline constexpr Shape scores{"as^2b", ActivationSplit::tensor};  ///< attention scores per head
// Cross-attention's keys over the images' N tokens a sequence (mllama's), not the sequence's.
inline constexpr Shape Nbkv{"Nb(kd)", ActivationSplit::tensor};  ///< keys or values
inline constexpr Shape Nbq{"Nb(ad)", ActivationSplit::tensor};   ///< them at every query head
inline constexpr Shape kNb{"kNb", ActivationSplit::tensor};      ///< a value per head and key
inline constexpr Shape asNb{"asNb", ActivationSplit::tensor};    ///< scores against them
inline constexpr Shape asb{"asb", ActivationSplit::tensor};      ///< a value per head and query
inline constexpr Shape ksb{"ksb",
                           ActivationSplit::tensor};  ///< a value per key/value head and token
inline constexpr Shape sbE{
    "sbE", ActivationSplit::sequence};  ///< router probabilities per token and expert
inline constexpr Shape sbk{"sbk", ActivationSplit::sequence};  ///< a value per routed token-slot
inline constexpr Shape sbkh{"sbk(h)",
                            ActivationSplit::sequence};  ///< routed tokens at the model's width
inline constexpr Shape sbkf{
    "sbk(f)", ActivationSplit::expert_tensor};  ///< routed tokens at an expert's hidden width
inline constexpr Shape sbfs{"sb(f_s)",
                            ActivationSplit::tensor};  ///< every token at the shared experts' width
inline constexpr Shape sd{
    "sd", ActivationSplit::replicated};  ///< per position and head dimension (rotary tables)
inline constexpr Shape sh{"sh", ActivationSplit::replicated};  ///< per position, the model's width
inline constexpr Shape sbV{"sbV", ActivationSplit::vocab};  ///< logits: a vocabulary slice per rank
inline constexpr Shape mask{"s^2b",
                            ActivationSplit::replicated};  ///< the causal mask, on every rank
inline constexpr Shape ss{
    "s^2", ActivationSplit::replicated};  ///< per query and key, broadcast over batch and heads
inline constexpr Shape expert_weights{
    "E(3hf)", ActivationSplit::tensor};  ///< copies of every expert's weights
inline constexpr Shape experts{"E", ActivationSplit::replicated};  ///< a value per expert
}  // namespace shape

/// One tensor saved for backward: `copies` tensors of `symbol` elements each.
struct SavedTensor {
    Text op;               ///< the op that saves it
    Text tensor;           ///< what it saves
    Text why;              ///< why backward needs it
    Text symbol;           ///< element count in the paper's letters: "sbh", "as^2b"
    std::uint64_t copies;  ///< how many such tensors ("Q and K" is 2 sbh elements)
    std::uint64_t bytes_per_element;
    Keep keep;
    Count elements;
    Count bytes;
    ActivationSplit split = ActivationSplit::tensor;
    /// The layer's input itself, the same storage (a LayerNorm's input): under full recomputation
    /// it is the checkpoint, which checkpointing detaches and does not copy, so it is counted once.
    bool layer_input = false;
    /// The output of an op the op-level policy saves (an odd-numbered mm, the attention kernel),
    /// the same storage: Recompute::op keeps it from the forward and its recomputation reuses it.
    bool policy_saved = false;
    Module module = Module::none;  ///< the part of the layer that saves it (TableBuilder's section)
    ModuleRole role = ModuleRole::inside;
    /// The storage is a norm's output (a projection's saved input): the layernorm module discards
    /// it.
    bool norm_output = false;
    /// Embedding side: built by every pipeline stage for its own layers (the shared rotary tables),
    /// not by the first alone.
    bool every_stage = false;
    /// Forward buffers: held by the first stage's forward in a name of its own until it returns
    /// (an embedding's output), which no checkpoint keeps.
    bool forward_local = false;
    /// Held by autograd's graph past its layer's backward, until the loop drops the step's output
    /// (bitsandbytes' MatMul4Bit before 0.43.2 keeps its input in its ctx, not as a saved tensor).
    bool graph_held = false;

    bool kept(Recompute mode) const {
        switch (mode) {
            case Recompute::none: return keep != Keep::only_selective;
            case Recompute::selective: return keep != Keep::not_selective;
            case Recompute::full: return false;
            case Recompute::op: return policy_saved;
        }
        return true;
    }
};

/// An output the op-level policy saves that no backward needs, so no row is (the q projection's,
/// the down projection's): kept by Recompute::op alone, from the forward until its recomputation
/// pops it. Its place in the forward is its ProgramStep's.
struct PolicyOutput {
    SavedTensor tensor;
};

/// A temporary that lives only while one op of the layer runs and is never saved for backward: the
/// scores being scaled, a softmax's gradient. Where it runs is its ProgramStep's place in the
/// layer's program: in forward the rows after it are not made yet, in backward they are freed
/// already.
struct Workspace {
    bool backward;  ///< made by the op's backward (else by its forward)
    Text op;        ///< the op running
    Text tensor;    ///< what it makes
    Text formula;   ///< its bytes in the paper's letters: "4 as^2b + 2 as^2b"
    Count bytes;
    ActivationSplit split;
    Module module = Module::none;  ///< the part of the layer whose op runs
    /// The linear whose op this is: its weight's autocast cast exists while it runs. In backward
    /// it writes that weight's gradient (a frozen base's, its adapters' or its input's gradient
    /// alone, counts alike). None: its op has no weights (an activation, a product, a dropout,
    /// the core attention), so a later micro-batch's fresh weight gradient is not alive: autograd
    /// has added the one before into the held one (measured: peak_live.py). Else the layer's
    /// largest counts, leaning high.
    Linear linear = Linear::none;

    /// A backward op with no weights (`linear` none).
    bool weightless() const { return backward && linear == Linear::none; }
};

/// Bytes an op's unfused kernels pass to one another through memory: temporaries written by one
/// kernel and read by the next (eager RMSNorm's fp32 intermediates), beyond the saved tensors the
/// element-wise passes count. A fused kernel or a compiled layer keeps them on chip: none.
struct EagerTraffic {
    bool backward;
    Text op;
    Count bytes;  ///< written and read: twice the temporaries'
    ActivationSplit split;
    /// Forward: a row of the op; where the recomputation does not keep it, the op runs again
    /// (no_row: where the layer is checkpointed).
    std::size_t row = 0;
    static constexpr std::size_t no_row = ~std::size_t{0};

    /// Its bytes under `mode`, a forward op's twice where it runs again.
    Count under(Recompute mode, const std::vector<SavedTensor>& rows) const;
};

/// Who holds a tensor alive beside an op that did not make it.
enum class Holder : std::uint8_t {
    caller,      ///< the layer's caller: the residual stream
    checkpoint,  ///< a checkpoint, which keeps what the rest of the program has freed
};

/// A tensor alive while an op runs that the op did not make and no row keeps, under the modes in
/// `modes` (bits of Recompute): the residual stream the caller holds (measured:
/// validation/results/cpu-rotary-wide512.json, selective), a gradient only a checkpoint still
/// holds (v's, at the softmax's backward under selective recomputation).
struct Beside {
    Text name;
    Count bytes;
    ActivationSplit split;
    Holder holder;
    std::uint8_t modes;

    static constexpr std::uint8_t mode_bit(Recompute r) { return 1u << unsigned(r); }
    bool alive(Recompute r) const { return (modes & mode_bit(r)) != 0; }
};

/// When a checkpoint's own tensor (CheckpointTensor) is alive.
enum class CheckpointHeld : std::uint8_t {
    always,  ///< from the forward until the backward returns, one per checkpoint
    rerun,   ///< while the checkpoint reruns the forward, in a checkpointed layer's backward
};

/// A tensor a checkpoint holds that is no row: the CPU RNG state torch.utils.checkpoint restores
/// before rerunning (preserve_rng_state; a CUDA one's is a host tensor), or the gradients a
/// checkpointed layer's backward makes before it first reads a saved tensor (torch's non-reentrant
/// checkpoint reruns the forward then), on the residual stream's width: gathered whole, as a
/// row-parallel output's gradient is.
struct CheckpointTensor {
    Text name;
    Count bytes;
    ActivationSplit split;
    CheckpointHeld held;
};

/// What a step of a layer's program is (ProgramStep).
enum class StepKind : std::uint8_t {
    row,        ///< rows[index] is made
    op,         ///< work[index] runs (a backward op runs in backward, in the program's reverse)
    beside,     ///< beside[index] is alive while the next op step runs
    policy,     ///< policy_outputs[index] is made
    mlp_half,   ///< the MLP half begins: selective recomputation rebuilds each half apart
    layer_end,  ///< the modules have returned; the ops after it run at the layer's last op
    /// Autocast casts each weight as its linear runs: the forward ops after it run before the
    /// weight of Linear(index) (and every later tensor's) is cast; Linear::none: none is pending.
    /// A step counts the layer's casts whole.
    casts_pending,
    /// Linear(index) runs: in backward its weight's gradient is written here, and exists at every
    /// backward op before it in forward order (with every later tensor's of the layer: its norms,
    /// its biases), the first of those linears naming them (gradients_by_op).
    grad,
};

/// One step of a layer's program: its forward in order; its backward is the same read backwards.
struct ProgramStep {
    StepKind kind;
    std::uint32_t index;  ///< into the list its kind names (unused for markers)
};

struct LayerActivations {
    std::vector<SavedTensor> rows;
    std::vector<Workspace> work;  ///< the largest temporaries of its ops (architecture model only)
    /// The op-level policy's saved outputs that are no row (architecture model only; none means
    /// Recompute::op keeps what full does).
    std::vector<PolicyOutput> policy_outputs;
    /// Forward FLOPs whose outputs the op-level policy saves: its recomputation skips them (the
    /// saved matrix products' and the fused attention kernel's, as compute_cost counts them).
    double policy_spared_flops = 0;
    std::vector<Beside> beside;  ///< tensors alive beside an op, which it did not make
    /// The order in which the rows are made and the ops run (architecture model only; empty: the
    /// rows in order, no op).
    std::vector<ProgramStep> program;
    Count input_bytes;  ///< the layer's input: all that full recomputation keeps
    std::vector<CheckpointTensor> checkpoint_tensors;  ///< what its checkpoints hold beside rows
    std::vector<EagerTraffic> eager_traffic;  ///< its unfused ops' temporaries (architecture model)
    /// Kernels its ops but the matrix products launch, by the module that runs them (architecture
    /// model; the products come from the parameter table: LayerLaunches).
    std::array<Launches, module_count> launches{};
    /// Its routed experts' linears launch this many times each: the experts a model's loop runs
    /// one at a time (every one a micro-batch's slots can reach); 1 where one grouped GEMM runs
    /// them all.
    double looped_experts = 1;

    /// The first row of the MLP half (its norm, the MLP or the MoE layer), or rows.size() where
    /// the program marks none with a row after it: selective recomputation rebuilds one half at a
    /// time, in its backward, with the recomputed norm that feeds it.
    std::size_t first_mlp_half_row() const;
    /// The first of the beside steps just before program step `k`, whose tensors are alive while
    /// its op runs (`k` itself where there is none).
    std::size_t first_beside_of(std::size_t k) const {
        while (k > 0 && program[k - 1].kind == StepKind::beside) --k;
        return k;
    }
    /// The bytes held by `holder` alive beside op `work_index` while it runs under `mode`.
    Count beside_bytes(std::size_t work_index, Recompute mode, Holder holder) const;
    /// For each op (by its index in `work`), the first linear whose weight's autocast copy is not
    /// made yet while it runs (StepKind::casts_pending); none in backward.
    std::vector<Linear> uncast_by_op() const;
    /// For each op (by its index in `work`), the first linear whose weight's gradient exists while
    /// it runs: in backward that of the first grad step after it in forward order; none in
    /// forward, and in backward where no linear after it has run (the layer's last ops).
    std::vector<Linear> gradients_by_op() const;

    Count sum(Recompute mode) const {
        Count total;
        for (const auto& r : rows)
            if (r.kept(mode)) total += r.bytes;
        return total;
    }
    /// Everything the layer saves with no recomputation.
    Count total() const { return sum(Recompute::none); }
    /// The op-level policy's outputs beyond the rows.
    Count policy_output_bytes() const {
        Count total;
        for (const auto& p : policy_outputs) total += p.tensor.bytes;
        return total;
    }
    /// The same as saved-tensor rows, for a table of their own.
    std::vector<SavedTensor> policy_output_rows() const {
        std::vector<SavedTensor> out;
        for (const auto& p : policy_outputs) out.push_back(p.tensor);
        return out;
    }
    /// Bytes a layer holds from its forward step until its backward step: under the op-level policy
    /// the checkpoint's input and the saved op outputs.
    Count kept(Recompute mode) const {
        if (mode == Recompute::full) return input_bytes;
        if (mode == Recompute::op) return input_bytes + sum(mode) + policy_output_bytes();
        return sum(mode);
    }
    /// Bytes a layer's backward step rebuilds by running part of its forward again.
    Count rebuilt(Recompute mode) const;
    /// How many checkpoints it runs under: the layer's own (full, op), or one for each module whose
    /// rows selective recomputation rebuilds (a MoE layer's parts each count: leaning high).
    std::uint64_t checkpoints(Recompute mode) const;
};

/// Whether a layer's backward step makes a row again: saved with no recomputation, not kept under
/// `mode`, and not the checkpointed input itself (a checkpointed layer keeps that storage already).
inline bool rebuilt_by(const SavedTensor& r, Recompute mode) {
    return r.kept(Recompute::none) && !r.kept(mode) && !(checkpoints_layer(mode) && r.layer_input);
}

inline std::size_t LayerActivations::first_mlp_half_row() const {
    std::size_t rows_before = 0;
    for (const ProgramStep& step : program) {
        if (step.kind == StepKind::mlp_half) return rows_before;
        if (step.kind == StepKind::row) ++rows_before;
    }
    return rows.size();
}

inline Count LayerActivations::beside_bytes(std::size_t work_index, Recompute mode,
                                            Holder holder) const {
    Count held;
    for (std::size_t k = 0; k < program.size(); ++k) {
        if (program[k].kind != StepKind::op || program[k].index != work_index) continue;
        for (std::size_t j = first_beside_of(k); j < k; ++j) {
            const Beside& b = beside[program[j].index];
            if (b.holder == holder && b.alive(mode)) held += b.bytes;
        }
    }
    return held;
}

inline std::vector<Linear> LayerActivations::uncast_by_op() const {
    std::vector<Linear> out(work.size(), Linear::none);
    Linear pending = Linear::none;
    for (const ProgramStep& step : program) {
        if (step.kind == StepKind::casts_pending) pending = Linear(step.index);
        if (step.kind == StepKind::op && !work[step.index].backward) out[step.index] = pending;
    }
    return out;
}

inline std::vector<Linear> LayerActivations::gradients_by_op() const {
    std::vector<Linear> out(work.size(), Linear::none);
    Linear written = Linear::none;  // walking the backward: the gradients written so far
    for (auto step = program.rbegin(); step != program.rend(); ++step) {
        if (step->kind == StepKind::grad) written = Linear(step->index);
        if (step->kind == StepKind::op && work[step->index].backward) out[step->index] = written;
    }
    return out;
}

inline Count LayerActivations::rebuilt(Recompute mode) const {
    Count made, mlp_half;  // selective recomputation rebuilds one half of the layer at a time
    const std::size_t half = first_mlp_half_row();
    for (std::size_t i = 0; i < rows.size(); ++i)
        if (rebuilt_by(rows[i], mode))
            (mode == Recompute::selective && i >= half ? mlp_half : made) += rows[i].bytes;
    return std::max(made, mlp_half);
}

inline Count EagerTraffic::under(Recompute mode, const std::vector<SavedTensor>& rows) const {
    if (backward) return bytes;
    const bool reruns = row < rows.size() ? !rows[row].kept(mode) : checkpoints_layer(mode);
    return reruns ? Count(2) * bytes : bytes;
}

inline std::uint64_t LayerActivations::checkpoints(Recompute mode) const {
    if (checkpoints_layer(mode)) return 1;
    std::vector<Module> modules;
    for (const auto& r : rows)
        if (rebuilt_by(r, mode) &&
            std::find(modules.begin(), modules.end(), r.module) == modules.end())
            modules.push_back(r.module);
    return modules.size();
}

/// Rewrites a layer's table so that Recompute::selective recomputes `modules` (Megatron-LM's
/// recompute_modules) rather than the core attention alone; the other modes keep what they kept. A
/// recomputed module's rows become Keep::not_selective but its input, and its checkpoint's own copy
/// of the input a Keep::only_selective row; the copies of modules not recomputed leave the table.
/// The core attention's rows are Korthikanti's (Keep), kept whole when core_attn is not recomputed.
inline void select_modules(LayerActivations& layer, ModuleSet modules) {
    const bool core = modules.has(Module::core_attn), norms = modules.has(Module::layernorm);
    constexpr std::uint32_t dropped = ~std::uint32_t{0};
    std::vector<std::uint32_t> index(layer.rows.size(), dropped);
    std::vector<SavedTensor> out;
    out.reserve(layer.rows.size());
    for (std::size_t i = 0; i < layer.rows.size(); ++i) {
        SavedTensor r = layer.rows[i];
        const bool discarded =
            r.norm_output && norms;  // the norm's output storage, freed and recomputed
        // Inside the MoE layer, which `moe` checkpoints whole: its parts' inputs are its internals.
        const bool in_moe = (r.module == Module::moe_act || r.module == Module::shared_experts) &&
                            modules.has(Module::moe);
        if (r.module == Module::mla_up_proj && r.role == ModuleRole::inside &&
            modules.has(Module::mla_up_proj)) {
            // Discarded once the core attention has read it, its own checkpoint included (b > 1's
            // v).
            if (r.keep == Keep::only_selective) continue;
            r.keep = Keep::not_selective;
        } else if (r.keep != Keep::always &&
                   r.role != ModuleRole::checkpoint) {  // the core attention's
            if (!core && r.keep == Keep::only_selective) continue;
            if (!core) r.keep = Keep::always;
        } else if (r.role == ModuleRole::checkpoint) {
            if (!modules.recomputes(r.module) || in_moe || discarded) continue;
        } else if ((r.module != Module::core_attn && modules.recomputes(r.module) &&
                    (r.role == ModuleRole::inside || in_moe)) ||
                   discarded) {
            r.keep = Keep::not_selective;
        }
        index[i] = std::uint32_t(out.size());
        out.push_back(r);
    }
    layer.rows = std::move(out);
    for (EagerTraffic& e : layer.eager_traffic)  // a dropped row's op: EagerTraffic::no_row
        e.row =
            e.row >= index.size() || index[e.row] == dropped ? EagerTraffic::no_row : index[e.row];
    std::size_t steps = 0;  // the program without the dropped rows' steps
    for (ProgramStep step : layer.program) {
        if (step.kind == StepKind::row && (step.index = index[step.index]) == dropped) continue;
        layer.program[steps++] = step;
    }
    layer.program.resize(steps);
}

/// A workspace against one table (a rank's share, say): its bytes, the rows it makes absent, and
/// what it adds to its step, the layer's own gradients aside.
struct WorkspaceSum {
    Count added, covered;
    Count adds() const {
        return added > covered ? Count(added.value() - covered.value()) : Count(0);
    }
};

/// The kernels of Korthikanti et al.'s GPT layer as Megatron-LM runs it: two LayerNorms, two
/// residual dropouts and adds, its heads merged and GELU beside the core attention (its dropout
/// among it); one fused QKV projection, so no gradients summed.
inline void korthikanti_launches(LayerActivations& layer) {
    // CUDA's kernels, as the formula's 1-byte dropout masks are.
    const Launches dropout = kernels_of(Platform::cuda).dropout_launches,
                   gelu = activation_function(Activation::gelu).launches;
    layer.launches[static_cast<std::size_t>(Module::none)] =
        launches_of(LaunchOp::layer_norm) * 2 + dropout * 2 +
        launches_of(LaunchOp::residual_add) * 2 + launches_of(LaunchOp::merge_heads) + gelu;
    layer.launches[static_cast<std::size_t>(Module::core_attn)] =
        launches_of(LaunchOp::eager_core) + dropout;
}

/// Korthikanti et al.'s GPT layer (4h GELU MLP, dropout, `d`-byte activations, 1-byte masks).
/// With d = 2 its rows add up to s b h (34 + 5 a s / h) bytes.
inline LayerActivations korthikanti_layer(const Architecture& m, std::uint64_t seq,
                                          std::uint64_t micro_batch, std::uint64_t d) {
    const Count sbh = Count(seq) * micro_batch * m.hidden;
    const Count as2b = Count(m.heads) * seq * seq * micro_batch;
    LayerActivations layer;
    layer.rows.reserve(14);
    // `split`: tensor-parallel rows hold 24 sbh / t + 5 as^2b / t of the total; the other 10 sbh
    // sit on the residual stream, replicated unless sequence parallelism splits them.
    auto row = [&](Text op, Text tensor, Text why, bool scores, std::uint64_t copies,
                   std::uint64_t bytes, ActivationSplit split) {
        // Made in place, a field at a time: a row built aside and copied in is read back in wider
        // pieces than it was written, which stalls every row on store-to-load forwarding.
        SavedTensor& r = layer.rows.emplace_back();
        r.op = op, r.tensor = tensor, r.why = why, r.symbol = scores ? "as^2b" : "sbh";
        r.copies = copies, r.bytes_per_element = bytes,
        r.keep = scores ? Keep::not_selective : Keep::always;
        r.elements = Count(copies) * (scores ? as2b : sbh), r.bytes = r.elements * bytes,
        r.split = split;
    };
    constexpr auto T = ActivationSplit::tensor, S = ActivationSplit::sequence;
    // clang-format off
    //  op                            tensor kept              why backward needs it                
    //                   s x s  copies  bytes  split
    row("attention LayerNorm",        "its input",
                    "normalisation's gradient needs the input (mean, var)",  false, 1, d, S);
    layer.rows.back().layer_input = true;
    row("QKV projection",             "its input",
                    "weight gradient = input^T x output gradient",           false, 1, d, S);
    row("Q K^T",                      "Q and K",
                      "each is the other's factor in the gradient",            false, 2, d, T);
    row("softmax",                    "its output",
                   "softmax's gradient is written in its output",           true,  1, d, T);
    row("attention dropout",          "mask",                  "which scores were zeroed",
                                     true,  1, dtype::mask, T);
    row("attention over V",           "dropout output",
               "gradient w.r.t. V needs the attention weights",         true,  1, d, T);
    row("attention over V",           "V",
                            "gradient w.r.t. the weights needs "
                            "V",                   false, 1, d, T);
    row("output projection",          "its input",
                    "weight gradient = input^T x output gradient",           false, 1, d, T);
    row("attention residual dropout", "mask",                  "which elements were zeroed",
                                   false, 1, dtype::mask, S);
    row("MLP LayerNorm",              "its input",
                    "normalisation's gradient needs the input (mean, var)",  false, 1, d, S);
    row("MLP up projection",          "its input",
                    "weight gradient = input^T x output gradient",           false, 1, d, S);
    row("GELU",                       "its input (4h wide)",
          "GELU's derivative is evaluated at its input",           false, 4, d, T);
    row("MLP down projection",        "its input (4h wide)",
          "weight gradient = input^T x output gradient",           false, 4, d, T);
    row("MLP residual dropout",       "mask",                  "which elements were zeroed",
                                   false, 1, dtype::mask, S);
    // clang-format on
    layer.input_bytes = sbh * d;
    korthikanti_launches(layer);
    return layer;
}

}  // namespace memcalc
