#pragma once
/// Fine-tuning as rows: which parameters train (all; all but the parts named frozen; low-rank
/// adapters beside a frozen base, peft's LoRA; the same over a base whose linear weights
/// bitsandbytes stores in 4 bits, QLoRA), the parameter table each makes, and what it changes in a
/// layer's saved tensors. A frozen tensor keeps its weights alone; an adapter is a row of its own,
/// trained under the recipe like any other.
#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memcalc/bitsandbytes.hpp"
#include "memcalc/dtype.hpp"
#include "memcalc/error.hpp"
#include "memcalc/model.hpp"
#include "memcalc/params.hpp"
#include "memcalc/text.hpp"

namespace memcalc {

enum class Training : std::uint8_t {
    full,
    frozen,
    lora,
    qlora,
    adapter,
    qadapter,
    adapter_v2,
    qadapter_v2
};

struct TrainingRow {
    Training mode;
    const char* name;
    bool adapters;        ///< LoRA adapters train beside a frozen base
    bool quantized_base;  ///< the base's linear weights in 4 bits (QLoRA)
    bool prompt;          ///< LLaMA-Adapter's gated prompt trains beside a frozen base
    /// LLaMA-Adapter v2: a trained scale and bias on every linear's output, the norms trained
    bool scaled;
    const char* summary;

    bool frozen_base() const { return adapters || prompt; }
};

inline constexpr std::array<TrainingRow, 8> training_rows{{
    {Training::full, "full", false, false, false, false, "every parameter trains"},
    {Training::frozen, "frozen", false, false, false, false,
     "the parts --frozen names keep their weights alone; the rest trains"},
    {Training::lora, "lora", true, false, false, false,
     "low-rank adapters train beside a frozen base (peft's LoRA)"},
    {Training::qlora, "qlora", true, true, false, false,
     "LoRA over a base whose linear weights are 4-bit NF4 with double quantisation (bitsandbytes)"},
    {Training::adapter, "adapter", false, false, true, false,
     "LLaMA-Adapter (lit-gpt's adapter.py): a learned prompt in each layer from a start layer, "
     "attended by every query and gated per head, beside a frozen base"},
    {Training::qadapter, "qadapter", false, true, true, false,
     "LLaMA-Adapter over a base whose linear weights are 4-bit NF4 (lit-gpt's adapter.py "
     "--quantize bnb.nf4)"},
    {Training::adapter_v2, "adapter-v2", false, false, true, true,
     "LLaMA-Adapter v2 (lit-gpt's adapter_v2.py): the prompt, a trained scale and bias on every "
     "linear's output, the head's too, and the norms trained"},
    {Training::qadapter_v2, "qadapter-v2", false, true, true, true,
     "LLaMA-Adapter v2 over a base whose linear weights are 4-bit NF4 (lit-gpt's adapter_v2.py "
     "--quantize bnb.nf4)"},
}};

/// The --train names whose row has `column` ("qlora, qadapter or qadapter-v2"); all of them
/// without one.
inline std::string training_names_with(bool TrainingRow::*column = nullptr) {
    std::vector<std::string> names;
    for (const TrainingRow& r : training_rows)
        if (column == nullptr || r.*column) names.emplace_back(r.name);
    std::string out;
    for (std::size_t i = 0; i < names.size(); ++i)
        out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
    return out;
}

constexpr const TrainingRow& training_row(Training t) {
    return training_rows[static_cast<std::size_t>(t)];
}
inline const char* training_name(Training t) { return training_row(t).name; }

/// What an adapter adds to its linear: LoRA's B A x, or DoRA's (peft's use_dora) magnitude-scaled
/// direction, m (W + B A) / ||W + B A|| per output row, with m a trained vector of out_features;
/// or, merged, one LoRA per fused linear over the parts targeted (loralib's MergedLinear, lit-gpt's
/// LoRAQKVLinear).
enum class LoraVariant : std::uint8_t { lora, dora, merged };

struct LoraVariantRow {
    LoraVariant variant;
    const char* name;
    bool magnitude;  ///< a trained magnitude vector per adapted linear, and the weight norm per
                     ///< forward
    /// Targets may name a fused linear's parts (q_proj of a fused q/k/v): one adapter whose A has
    /// r rows per part and B a part's width each, its output zero-padded into the fused one.
    bool merged;
    const char* summary;
};

inline constexpr std::array<LoraVariantRow, 3> lora_variant_rows{{
    {LoraVariant::lora, "lora", false, false, "B A x beside the frozen linear (peft's default)"},
    {LoraVariant::dora, "dora", true, false,
     "DoRA (peft's use_dora): a magnitude vector per adapted linear, the norm of W + B A made "
     "every forward"},
    {LoraVariant::merged, "merged", false, true,
     "on a fused linear, one adapter for the parts targeted (q_proj,v_proj of a fused q/k/v): A "
     "r rows a part, B a part's width each, zero-padded into the fused output by index_copy, "
     "which keeps its source (lit-gpt's LoRAQKVLinear, loralib's MergedLinear)"},
}};

constexpr const LoraVariantRow& lora_variant_row(LoraVariant v) {
    return lora_variant_rows[static_cast<std::size_t>(v)];
}

/// Low-rank adapters (peft's LoraConfig): rank r, the linears they sit beside, and whether a
/// dropout (lora_dropout > 0) acts on each adapter's input. alpha only scales: no memory.
struct Lora {
    LoraVariant variant = LoraVariant::lora;
    std::uint64_t rank = 8;
    std::vector<std::string> targets{"q_proj",
                                     "v_proj"};  ///< names as peft matches them; "all-linear"
    bool dropout = true;
    /// The adapters' weights: fp32 by default, as peft makes them beside a 16-bit base
    /// (autocast_adapter_dtype), so each adapter casts its input to fp32, a copy of its own; or the
    /// recipe's weight dtype.
    bool fp32 = true;
};

/// LLaMA-Adapter's prompt (lit-gpt's adapter.py Config): its tokens, learned per layer, in the
/// layers from start_layer (0-based) on; lit-gpt's defaults.
struct PromptAdapter {
    std::uint64_t tokens = 10;      ///< adapter_prompt_length
    std::uint64_t start_layer = 2;  ///< adapter_start_layer
};

struct FineTuning {
    Training mode = Training::full;
    PromptAdapter prompt;  ///< TrainingRow::prompt's modes
    std::vector<std::string>
        frozen;  ///< Training::frozen: parts (embeddings, attention, ...) or tensor names
    Lora lora;
    QuantizedLinears quantized;  ///< a 4-bit base (qlora, qadapter): who quantises it, and
                                 ///< bitsandbytes' release

    /// A 4-bit base (TrainingRow::quantized_base): its linears' storage.
    Storage base() const { return quantized.storage(); }

    bool is_full() const { return mode == Training::full; }
};

/// An adapted linear's widths (one expert's, for experts) and how many modules of it a layer has.
struct AdaptedShape {
    std::uint64_t in = 0, out = 0, modules = 0;
    std::uint64_t rank = 0;  ///< A's output width: r, or r a part for a merged adapter
    bool fused = false;      ///< the adapter sits beside a fused linear (fused_row's)
};

/// What fine-tuning changes in one kind of layer's saved tensors (architecture_activations.hpp).
struct LayerTuning {
    LinearSet frozen =
        0;  ///< linears whose weight gets no gradient: their input is not kept for one
    LinearSet adapted = 0;  ///< LoRA's targets
    /// LLaMA-Adapter v2's: a trained scale times the output plus a trained bias, which keeps that
    /// sum (s x out) for the scale's gradient; shapes[] has each one's width
    LinearSet scaled = 0;
    std::uint64_t rank = 0;
    bool adapter_dropout = false;
    bool adapter_fp32 =
        false;  ///< fp32 adapters: an input of another dtype is cast to fp32 for each
    bool frozen_norms = false;  ///< the RMSNorm weights: x_norm is not kept for their gradient
    Count
        dequantized;  ///< QLoRA: the largest 4-bit weight's elements, dequantised while it computes
    Linear dequantized_linear = Linear::none;  ///< whose weight that is
    std::optional<DType> dequantized_from;     ///< the dtype it dequantises to first (Storage's)
    LinearSet quantized = 0;                   ///< the layer's 4-bit linears, the head's too
    /// Their matmul keeps its input though their weight gets no gradient (bitsandbytes before
    /// 0.43.2).
    bool quantized_keep_inputs = false;
    bool dora =
        false;  ///< DoRA: each adapter scales by m / ||W + B A|| (LoraVariantRow::magnitude)
    bool merged = false;  ///< a fused linear's adapter over its targeted parts, zero-padded
    /// The layer's input needs a gradient; false in the first layer where the embedding is frozen:
    /// its ops save nothing until an adapter's output joins (the autograd graph starts there).
    bool input_grad = true;
    /// Adapters on a frozen base, the embedding too: the first layer's input needs no gradient.
    bool embedding_frozen = false;
    /// LLaMA-Adapter: the prompt's tokens each query attends to beside the sequence, gated (0:
    /// none), in the layers from prompt_start (0-based) on.
    std::uint64_t prompt_tokens = 0;
    std::uint64_t prompt_start = 0;
    std::array<AdaptedShape, linear_rows.size()> shapes{};  ///< by Linear: the adapted ones' widths

    bool any() const { return frozen != 0 || adapted != 0 || scaled != 0 || frozen_norms; }
};

namespace detail {

/// peft's match: `name` is the row's tensor or the last part of its dotted path ("down_proj" is
/// also "shared_expert.down_proj"), or the module whose weight or bias it is.
inline bool names_tensor(const std::string& name, Text tensor) {
    const std::string t(tensor);
    if (t == name) return true;
    const auto ends_with = [](const std::string& s, const std::string& end) {
        return s.size() >= end.size() && s.compare(s.size() - end.size(), end.size(), end) == 0;
    };
    return ends_with(t, "." + name) || t == name + ".bias" || t == name + ".weight" ||
           ends_with(t, "." + name + ".bias") || ends_with(t, "." + name + ".weight");
}

/// An nn.Linear weight of a layer: what LoRA can target and bitsandbytes quantises. Stacked experts
/// (one Parameter of E x in x out) are not Linear modules.
inline bool linear_weight(const Architecture& m, const ParamRow& r) {
    return r.group == Group::layer && r.dims.size() - (r.expert ? 1 : 0) == 2 &&
           !(r.expert && m.stacked_experts);
}

/// A weight `q` stores in 4 bits: a layer's linear, and the output head's where the quantiser
/// converts every nn.Linear (a tied head is the embedding's table, no Linear).
inline bool quantized(const Architecture& m, const ParamRow& r, const QuantizedLinears& q) {
    const bool head = r.part == Part::head && r.role == ParamRole::weight && !r.mtp;
    return linear_weight(m, r) || (q.head() && head);
}

/// A part's rows, by the name --frozen gives it.
inline bool in_part(const std::string& part, const ParamRow& r) {
    if (part == "all") return true;
    if (part == "embeddings") return r.part == Part::embedding;
    if (part == "attention") return r.part == Part::attention;
    if (part == "mlp") return r.part == Part::mlp;
    if (part == "router") return r.part == Part::router;
    if (part == "vision") return r.part == Part::vision;
    if (part == "norms") return r.part == Part::norms || r.part == Part::final_norm;
    if (part == "head")
        return r.part == Part::head ||
               (r.part == Part::embedding && r.group == Group::head);  // tied
    return false;
}

/// "h x a*d" split at its last " x ": the input and output letters of a linear's shape.
inline std::pair<std::string, std::string> shape_ends(Text shape) {
    const std::string s(shape);
    const auto at = s.rfind(" x ");
    if (at == std::string::npos) return {s, s};
    return {s.substr(0, at), s.substr(at + 3)};
}

}  // namespace detail

/// Checks a fine-tuning's own values (before any model is read).
inline void validate(const FineTuning& f) {
    if (f.mode == Training::frozen && f.frozen.empty())
        throw error(
            "training frozen needs the parts to freeze (embeddings, attention, mlp, router, norms, "
            "head, vision, or tensor names)");
    if (f.mode != Training::frozen && !f.frozen.empty())
        throw error(std::string("frozen parts are for training frozen (got training ") +
                    training_name(f.mode) +
                    (training_row(f.mode).frozen_base() ? ", whose base is frozen whole)" : ")"));
    if (training_row(f.mode).prompt && f.prompt.tokens == 0)
        throw error("adapter prompt tokens must be at least 1");
    if (training_row(f.mode).adapters) {
        if (f.lora.rank == 0) throw error("lora rank must be at least 1");
        if (f.lora.targets.empty()) throw error("lora targets must name at least one linear layer");
        const auto& targets = f.lora.targets;
        const bool all = std::find(targets.begin(), targets.end(), "all-linear") != targets.end();
        if (targets.size() > 1 && all) {
            std::string listed;
            for (const std::string& name : targets) listed += (listed.empty() ? "" : ",") + name;
            throw error(
                "lora target all-linear adapts every linear layer: give it alone, or "
                "names alone (got " +
                listed + ")");
        }
    }
}

namespace detail {
/// `table` with the rows `frozen` names (parts or tensors) frozen; each name must name one, and
/// something must be left to train.
inline ParameterTable frozen_table(const Architecture& m, ParameterTable table,
                                   const std::vector<std::string>& frozen) {
    std::vector<bool> used(frozen.size(), false);
    for (ParamRow& r : table.rows)
        for (std::size_t i = 0; i < frozen.size(); ++i)
            if (detail::in_part(frozen[i], r) || detail::names_tensor(frozen[i], r.tensor))
                r.trainable = false, used[i] = true;
    for (std::size_t i = 0; i < frozen.size(); ++i)
        if (!used[i])
            throw error("frozen '" + frozen[i] + "' names no tensor of " + model_name(m) +
                        " (parts: embeddings, attention, mlp, router, norms, head, vision; or a "
                        "tensor such as q_proj)");
    for (const ParamRow& r : table.rows)
        if (r.trainable) return table;
    throw error("frozen " + frozen.front() + (frozen.size() > 1 ? ",..." : "") +
                " leaves nothing of " + model_name(m) + " to train");
}

/// LLaMA-Adapter v2's rows after a linear's weight `row` (lit-gpt's AdapterV2Linear): a bias and a
/// scale, one per output, split as the output is. A tied head's row is the embedding's table
/// (V x h): its linear is the head, its output the vocabulary.
inline void add_scale_rows(std::vector<ParamRow>& rows, const ParamRow& row) {
    const bool tied = row.part == Part::embedding;
    const std::uint64_t E = row.expert ? *row.dims.begin() : 0;
    Dims out{row.dims.begin()[tied ? 0 : E ? 2 : 1]};
    if (E) out.stack(E);
    const auto [in_letters, out_letters] = shape_ends(row.shape);
    const Text letters = Label(tied ? in_letters : out_letters).text;
    const Linear linear = tied ? Linear::head : row.linear;
    const ParamSplit split = row.split == ParamSplit::vocab ? ParamSplit::vocab
                             : row.split == ParamSplit::tensor && !linear_row(linear).row_parallel
                                 ? ParamSplit::tensor
                                 : ParamSplit::replicated;
    const std::string tensor(tied ? Text("lm_head") : row.tensor);
    for (const char* name : {".adapter_bias", ".adapter_scale"})
        rows.emplace_back(Part::adapter, row.group, Label(tensor + name).text, letters, out, split,
                          row.expert, row.kind, linear, ParamRole::scale);
}

/// A linear weight LLaMA-Adapter v2 scales: a layer's, and the output head's (a tied one too).
inline bool scaled_linear(const Architecture& m, const ParamRow& r) {
    const bool head = r.part == Part::head && r.role == ParamRole::weight && !r.mtp;
    const bool tied = r.part == Part::embedding && r.group == Group::head;
    return linear_weight(m, r) || head || tied;
}

/// `table` frozen whole (its linears in 4 bits where `base` says), with LLaMA-Adapter's trained
/// rows for the layers from the start layer on: each layer's prompt (tokens x h, an embedding
/// table) and its gate (one factor per head), kept with the first stage's rows (Group::input) as
/// one tensor each. `scaled` (v2): every linear's scale and bias (add_scale_rows), the head's
/// too, and the norms trained.
inline ParameterTable prompt_table(const Architecture& m, ParameterTable table,
                                   const PromptAdapter& p, const QuantizedLinears* base,
                                   bool scaled) {
    if (p.start_layer >= m.layers)
        throw error("adapter start layer " + std::to_string(p.start_layer) +
                    " leaves no layer of " + model_name(m) + " (" + std::to_string(m.layers) +
                    " layers, counted from 0) a prompt");
    if (scaled && (m.any_moe() || m.mixer != Mixer::attention || m.mla.enabled() || !m.has_mlp))
        throw error("LLaMA-Adapter v2 on " + model_name(m) +
                    ": its scales and biases are modelled on dense attention and MLP layers "
                    "alone (lit-gpt's adapter_v2.py's)");
    std::vector<ParamRow> rows;
    rows.reserve(table.rows.size() * (scaled ? 3 : 1) + 2);
    for (ParamRow& r : table.rows) {
        const bool norm = r.part == Part::norms || r.part == Part::final_norm;
        r.trainable = scaled && norm;
        if (base != nullptr && quantized(m, r, *base)) r.storage = base->storage();
        rows.push_back(r);
        if (scaled && scaled_linear(m, r)) add_scale_rows(rows, r);
    }
    table.rows = std::move(rows);
    const std::uint64_t adapted = m.layers - p.start_layer;
    table.rows.emplace_back(Part::adapter, Group::input, Text("adapter_wte"),
                            Text("(L - S) x p x h"), Dims{adapted, p.tokens, m.hidden},
                            ParamSplit::replicated, false, 0);
    table.rows.emplace_back(Part::adapter, Group::input, Text("gating_factor"), Text("(L - S) x a"),
                            Dims{adapted, m.heads}, ParamSplit::replicated, false, 0);
    return table;
}

/// A LoRA target's adapter rows after its own, `row`: A (in x r) and B (r x out), and DoRA's
/// magnitude. Tensor parallelism splits an adapter as its base: A whole and B by columns beside a
/// column-parallel layer, A by rows and B whole beside a row-parallel one.
/// `parts`: a merged adapter's (LoraVariantRow::merged), its A r rows for each part of the fused
/// linear it adapts.
inline void add_adapter_rows(std::vector<ParamRow>& rows, const ParamRow& row, const Lora& lora,
                             std::uint64_t parts = 1) {
    const std::uint64_t r = lora.rank;
    const std::uint64_t E = row.expert ? *row.dims.begin() : 0;
    const std::uint64_t in = row.dims.begin()[E ? 1 : 0], out = row.dims.begin()[E ? 2 : 1];
    const auto [in_letters, out_letters] = detail::shape_ends(row.shape);
    const bool row_parallel = linear_row(row.linear).row_parallel;
    const bool split = row.split == ParamSplit::tensor;
    Dims a{in, r * parts}, b{r, out};
    if (E) a.stack(E), b.stack(E);
    const std::string tensor(row.tensor);
    rows.emplace_back(
        Part::adapter, row.group, Label(tensor + ".lora_A").text,
        Label(in_letters + (parts > 1 ? " x " + std::to_string(parts) + "r" : " x r")).text, a,
        split && row_parallel ? ParamSplit::tensor : ParamSplit::replicated, row.expert, row.kind,
        row.linear, ParamRole::lora_a);
    rows.emplace_back(Part::adapter, row.group, Label(tensor + ".lora_B").text,
                      Label("r x " + out_letters).text, b,
                      split && !row_parallel ? ParamSplit::tensor : ParamSplit::replicated,
                      row.expert, row.kind, row.linear, ParamRole::lora_b);
    if (!lora_variant_row(lora.variant).magnitude) return;
    Dims magnitude{out};  // ||W + B A|| per output row at the start, trained from there
    if (E) magnitude.stack(E);
    rows.emplace_back(Part::adapter, row.group, Label(tensor + ".lora_magnitude_vector").text,
                      Label(out_letters).text, magnitude,
                      split && !row_parallel ? ParamSplit::tensor : ParamSplit::replicated,
                      row.expert, row.kind, row.linear, ParamRole::magnitude);
}
}  // namespace detail

namespace detail {
/// Linears a program makes as one module where a switch says so: LoRA adapts each as one, which
/// peft's target_modules name by `names` (the adapter's own name first).
struct FusedLinear {
    const char* key;  ///< the switch's model-file key
    bool Architecture::*fused;
    std::array<Linear, 3> members;  ///< in the order of its output; Linear::none pads
    std::array<const char*, 5> names;
};
inline constexpr std::array<FusedLinear, 2> fused_linears{{
    {"fused_qkv",
     &Architecture::fused_qkv,
     {Linear::q, Linear::k, Linear::v},
     {"qkv_proj", "c_attn", "in_proj", "query_key_value", "Wqkv"}},
    {"fused_gate_up",
     &Architecture::fused_gate_up,
     {Linear::gate, Linear::up, Linear::none},
     {"gate_up_proj", nullptr, nullptr, nullptr, nullptr}},
}};

inline std::size_t fused_members(const FusedLinear& f) {
    return static_cast<std::size_t>(std::count_if(f.members.begin(), f.members.end(),
                                                  [](Linear l) { return l != Linear::none; }));
}

/// The fused linear whose weight row `r` is part of, where `m`'s switch fuses it; none otherwise.
inline const FusedLinear* fused_linear_of(const Architecture& m, const ParamRow& r) {
    if (r.group != Group::layer || r.expert || r.role != ParamRole::weight) return nullptr;
    for (const FusedLinear& f : fused_linears)
        if (m.*f.fused &&
            std::find(f.members.begin(), f.members.end(), r.linear) != f.members.end())
            return &f;
    return nullptr;
}

/// The names `f` answers to, "a (or b, c)".
inline std::string fused_names(const FusedLinear& f) {
    std::string others;
    for (std::size_t i = 1; i < f.names.size() && f.names[i] != nullptr; ++i)
        others += (others.empty() ? "" : ", ") + std::string(f.names[i]);
    return std::string(f.names.front()) + (others.empty() ? "" : " (or " + others + ")");
}

/// Whether peft's target_modules name `f` by `name`.
inline bool answers_to(const FusedLinear& f, const std::string& name) {
    return std::any_of(f.names.begin(), f.names.end(),
                       [&](const char* n) { return n != nullptr && name == n; });
}

/// Where `name` is a fused linear's and the model does not fuse it: the switch that says its code
/// does.
inline std::string unfused_hint(const std::string& name) {
    for (const FusedLinear& f : fused_linears)
        if (answers_to(f, name))
            return std::string("; ") + name + " is a fused linear: " + f.key +
                   " true says the code makes one";
    return "";
}

/// Whether target `name` adapts row `r` (all-linear: every linear weight); a fused linear's weight
/// answers to the fused module's names, and to its own only for a merged adapter (peft finds no
/// such module).
inline bool targets_row(const Architecture& m, const std::string& name, const ParamRow& r,
                        bool merged) {
    if (name == "all-linear") return true;
    const FusedLinear* f = fused_linear_of(m, r);
    if (f == nullptr || (merged && names_tensor(name, r.tensor)))
        return names_tensor(name, r.tensor);
    if (names_tensor(name, r.tensor)) {
        std::string members;
        for (std::size_t i = 0; i < fused_members(*f); ++i)
            members += (i == 0                       ? ""
                        : i + 1 == fused_members(*f) ? " and "
                                                     : ", ") +
                       std::string(linear_row(f->members[i]).tensor);
        throw error("lora target '" + name + "': " + members + " are one linear in " +
                    model_name(m) + " (" + f->key + "): target it as " + fused_names(*f) +
                    ", or its parts with --lora-variant merged");
    }
    return answers_to(*f, name);
}

/// A fused linear as one row (`first` its first member's weight, `out` all members' width), for
/// add_adapter_rows: one adapter of in x r and r x out.
inline ParamRow fused_row(const FusedLinear& f, ParamRow first, std::uint64_t out) {
    first.tensor = Label(f.names.front()).text;
    first.shape = Label(shape_ends(first.shape).first + " x " + f.names.front() + "'s out").text;
    first.dims = Dims{first.dims.begin()[0], out};
    first.count = Count(first.dims.begin()[0]) * out;
    return first;
}

/// One adapter over a fused linear's targeted parts: its row (fused_row) and how many parts.
struct FusedTarget {
    ParamRow row;
    std::uint64_t parts;
};

/// Collects a layer's fused weights as the table lists them, `targeted` or not, and once all of a
/// fused linear's are read, the one adapter over those targeted (none if none is).
class FusedRows {
public:
    std::optional<FusedTarget> add(const FusedLinear& f, const ParamRow& r, bool targeted) {
        Pending& p = pending_[static_cast<std::size_t>(&f - fused_linears.data())];
        if (targeted) {
            if (!p.first) p.first = r;
            p.out += r.dims.begin()[1];
            ++p.parts;
        }
        if (++p.seen < fused_members(f)) return std::nullopt;
        const Pending done = std::exchange(p, Pending{});
        if (!done.first) return std::nullopt;
        return FusedTarget{fused_row(f, *done.first, done.out), done.parts};
    }

private:
    struct Pending {
        std::optional<ParamRow> first;
        std::uint64_t out = 0, parts = 0;
        std::size_t seen = 0;
    };
    std::array<Pending, fused_linears.size()> pending_{};
};
}  // namespace detail

/// `table` (the model's own) as `f` trains it: rows frozen, 4-bit storage for QLoRA's base linears,
/// and each LoRA target followed by its adapter's rows (add_adapter_rows); a fused linear's after
/// its last weight, one adapter for them all.
inline ParameterTable fine_tuned_table(const Architecture& m, ParameterTable table,
                                       const FineTuning& f) {
    validate(f);
    if (f.mode == Training::full) return table;
    const bool merged = lora_variant_row(f.lora.variant).merged;
    if (f.mode == Training::frozen) return detail::frozen_table(m, std::move(table), f.frozen);
    if (training_row(f.mode).prompt)
        return detail::prompt_table(m, std::move(table), f.prompt,
                                    training_row(f.mode).quantized_base ? &f.quantized : nullptr,
                                    training_row(f.mode).scaled);
    std::vector<bool> used(f.lora.targets.size(), false);
    const auto targeted = [&](const ParamRow& r) {
        if (!detail::linear_weight(m, r)) return false;
        bool hit = false;
        for (std::size_t i = 0; i < f.lora.targets.size(); ++i)
            if (detail::targets_row(m, f.lora.targets[i], r, merged)) hit = true, used[i] = true;
        return hit;
    };
    std::vector<ParamRow> rows;
    rows.reserve(table.rows.size() * 3);
    detail::FusedRows fused;
    for (ParamRow row : table.rows) {
        row.trainable = false;
        if (training_row(f.mode).quantized_base && detail::quantized(m, row, f.quantized))
            row.storage = f.base();
        const bool target = targeted(row);
        rows.push_back(row);
        const detail::FusedLinear* one = detail::fused_linear_of(m, row);
        if (one == nullptr && target)
            detail::add_adapter_rows(rows, row, f.lora);
        else if (one != nullptr)
            if (const auto whole = fused.add(*one, row, target))
                detail::add_adapter_rows(rows, whole->row, f.lora, merged ? whole->parts : 1);
    }
    const bool all_linear = f.lora.targets.size() == 1 && f.lora.targets.front() == "all-linear";
    for (std::size_t i = 0; i < f.lora.targets.size(); ++i)
        if (!used[i])
            throw error("lora target '" + f.lora.targets[i] + "' names no linear layer of " +
                        model_name(m) +
                        (all_linear ? ""
                                    : " (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, "
                                      "down_proj, ...; or all-linear)" +
                                          detail::unfused_hint(f.lora.targets[i])));
    table.rows = std::move(rows);
    return table;
}

namespace detail {
/// Why a model whose own parameters count has a fine-tuned table that does not: its adapters' rank.
inline std::string adapters_overflow(const Architecture& m, const FineTuning& f) {
    if (!training_row(f.mode).adapters)
        return std::string("the parameter count of ") + model_name(m) + " trained " +
               training_name(f.mode) + " overflows 64 bits";
    return "lora rank " + std::to_string(f.lora.rank) + " makes the adapters of " + model_name(m) +
           " (in x r and r x out beside each target) overflow 64 bits";
}

/// An adapter's row `r` in `t`: its linear adapted, and A's input width (in x r) or B's output
/// width (r x out), stacked experts first.
inline void adapted_row(LayerTuning& t, const ParamRow& r) {
    t.adapted |= bit(r.linear);
    AdaptedShape& shape = t.shapes[static_cast<std::size_t>(r.linear)];
    const std::size_t e = r.expert ? 1 : 0;
    shape.modules = e ? *r.dims.begin() : 1;
    if (r.role == ParamRole::lora_a)
        shape.in = r.dims.begin()[e], shape.rank = r.dims.begin()[e + 1];
    if (r.role == ParamRole::lora_b) shape.out = r.dims.begin()[e + 1];
    for (const FusedLinear& f : fused_linears)  // fused_row names the adapter after the module
        if (std::string(r.tensor).rfind(std::string(f.names.front()) + ".", 0) == 0)
            shape.fused = true;
}

/// LLaMA-Adapter v2's scale row `r` in `t`: its linear scaled, and the linear's output width.
inline void scaled_row(LayerTuning& t, const ParamRow& r) {
    t.scaled |= bit(r.linear);
    AdaptedShape& shape = t.shapes[static_cast<std::size_t>(r.linear)];
    const std::size_t e = r.expert ? 1 : 0;
    shape.modules = e ? *r.dims.begin() : 1;
    shape.out = r.dims.begin()[e];
}
}  // namespace detail

/// What `table` (fine-tuned) changes in layer kind `kind`'s saved tensors.
/// The table decides what is frozen or adapted (a caller may edit one by hand); `f` the adapters'
/// settings.
inline LayerTuning layer_tuning(const ParameterTable& table, const FineTuning& f,
                                std::size_t kind) {
    LayerTuning t;
    t.rank = f.lora.rank;
    t.adapter_dropout = f.lora.dropout;
    t.adapter_fp32 = f.lora.fp32;
    t.dora = lora_variant_row(f.lora.variant).magnitude;
    t.merged = lora_variant_row(f.lora.variant).merged;
    t.quantized_keep_inputs = f.quantized.keeps_input();
    if (training_row(f.mode).prompt)
        t.prompt_tokens = f.prompt.tokens, t.prompt_start = f.prompt.start_layer;
    bool norms = false, trained_norm = false;
    for (const ParamRow& r : table.rows) {
        const bool here = r.group == Group::layer ? r.kind == kind : r.group == Group::head;
        if (!here) continue;
        if (r.part == Part::norms) {
            norms = true;
            trained_norm = trained_norm || r.trainable;
        }
        // Mamba's linears (not tuned) and the rows of no linear count in no set.
        const bool tuned = linear_row(r.linear).tuned;
        if (r.part == Part::adapter) {
            if (tuned && r.role == ParamRole::scale) detail::scaled_row(t, r);
            if (tuned && r.role != ParamRole::scale) detail::adapted_row(t, r);
            continue;
        }
        if (tuned && r.role == ParamRole::weight && !r.trainable) t.frozen |= bit(r.linear);
        if (r.part == Part::embedding && r.group == Group::head && !r.trainable)
            t.frozen |= bit(Linear::head);  // tied
        if (!r.storage || r.storage->dtype != DType::nf4) continue;
        t.quantized |= bit(r.linear);
        const Count one = r.expert ? Count(r.count.value() / *r.dims.begin()) : r.count;
        if (r.group == Group::layer && one > t.dequantized)
            t.dequantized = one, t.dequantized_linear = r.linear,
            t.dequantized_from = r.storage->quantized_from;
    }
    t.frozen_norms = norms && !trained_norm;
    return t;
}

/// layer_tuning for each kind of layer of `m`; empty when every tensor trains.
inline std::vector<LayerTuning> layer_tunings(const Architecture& m, const ParameterTable& table,
                                              const FineTuning& f) {
    std::vector<LayerTuning> out;
    const bool all_train = std::all_of(table.rows.begin(), table.rows.end(),
                                       [](const ParamRow& r) { return r.trainable; });
    if (all_train) return out;
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        out.push_back(layer_tuning(table, f, k));
        // Adapters (and a prompt) freeze the whole base, the embedding too: its output needs one
        // only where the program asks for one (input_require_grads).
        out.back().embedding_frozen = training_row(f.mode).frozen_base() && !m.input_require_grads;
    }
    return out;
}

/// Parameters the optimiser steps.
inline Count trainable_parameters(const ParameterTable& t) {
    Count n;
    for (const auto& r : t.rows)
        if (r.trainable) n += t.in_model(r);
    return n;
}

}  // namespace memcalc
