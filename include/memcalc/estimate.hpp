#pragma once
/// One call: (model, run settings) -> a report of plain data, which the program renders.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "memcalc/activations.hpp"
#include "memcalc/architecture_activations.hpp"
#include "memcalc/blocks/vision_tower.hpp"
#include "memcalc/finetune.hpp"
#include "memcalc/flops.hpp"
#include "memcalc/framework.hpp"
#include "memcalc/model.hpp"
#include "memcalc/model_equality.hpp"
#include "memcalc/parallel.hpp"
#include "memcalc/params.hpp"
#include "memcalc/recipe.hpp"
#include "memcalc/tape/ops.hpp"
#include "memcalc/timeline.hpp"
#include "memcalc/layout_peak.hpp"
#include "memcalc/stage_facts.hpp"
#include "memcalc/stage_inputs.hpp"
#include "memcalc/state_splits.hpp"
#include "memcalc/units.hpp"
#include "memcalc/workload.hpp"

namespace memcalc {

struct Settings {
    std::uint64_t seq = 0;          ///< s, tokens per sequence
    std::uint64_t micro_batch = 1;  ///< b, sequences per micro-batch on one device
    Recompute recompute = Recompute::none;
    /// What selective recomputation checkpoints (Megatron-LM's recompute_modules); core_attn is
    /// Korthikanti's.
    ModuleSet recompute_modules;
    Recipe recipe = builtin_recipe(default_recipe);  ///< the recipe itself, not its name
    FineTuning tuning;                               ///< which parameters train: all, by default
    ActivationModel activations = ActivationModel::korthikanti;
    Framework framework;   ///< kernels, attention, optimiser step, gradient lifetime
    Parallelism parallel;  ///< every degree 1: one device
    /// Also write each kind of layer's op tape as rows (Report::ops): what `--ops` shows.
    bool ops = false;
    ImageInput images;  ///< a micro-batch's images, through a vision tower; none by default
};

namespace detail {
/// A rank's timeline, made the first time a caller reads it: an estimate weighs each rank's peak
/// in closed form (peak_step), so a caller that reads no steps builds none. Copies of a report
/// share it; its inputs never change, so whichever thread makes it first makes the same steps.
class TimelineOnce {
public:
    /// The inputs of f's stage, made in place (1.1 KB: not made aside and copied in).
    TimelineOnce(const Workload& w, const Parallelism& p, const StageFacts& f)
        : in_(stage_inputs(w, p, f)), model_(w.parameters) {}
    const TimelineInputs& inputs() const { return in_; }
    const TimelineWithPeak& get() const {
        std::call_once(once_, [this] { made_ = timeline_with_peak(in_); });
        return made_;
    }

private:
    TimelineInputs in_;                             ///< its layer pattern is model_'s
    std::shared_ptr<const ParameterSplits> model_;  ///< kept alive for that pattern
    mutable std::once_flag once_;
    mutable TimelineWithPeak made_;
};
}  // namespace detail

/// One kind of device: every rank of one pipeline stage holds the same (tensor, data, context and
/// expert parallel ranks are alike).
struct RankReport {
    std::uint64_t stage = 0;               ///< pipeline stage, 0 first
    std::vector<std::uint64_t> layer_ids;  ///< its layers, in forward order
    bool holds_embedding = false, holds_head = false;
    std::uint64_t in_flight =
        1;                ///< micro-batches (interleaved: model chunks) whose activations it holds
    Count parameters;     ///< on this rank: after tensor, expert and pipeline splits
    TrainingState state;  ///< on the device, after ZeRO sharding and offload
    Count host;           ///< what offload keeps in host memory for this rank
    Step peak_at{Phase::forward, 0, {}, 1};             ///< the peak step, the earliest largest
    std::shared_ptr<const detail::TimelineOnce> steps;  ///< what timeline() reads; none: no steps

    const Step& peak_step() const { return peak_at; }
    /// Every step in order (timeline.hpp), made on first use.
    const std::vector<Step>& timeline() const { return made().steps; }
    /// The peak's index in timeline().
    std::size_t peak() const { return made().peak; }

private:
    const TimelineWithPeak& made() const {
        static const TimelineWithPeak none;
        return steps ? steps->get() : none;
    }
};

struct Report {
    Architecture model;
    Settings settings;  ///< its recipe among them
    /// The model's parameter table as the settings train it: the estimator's own, shared (no copy
    /// an estimate), never null.
    std::shared_ptr<const ParameterTable> parameters;
    Count parameter_count;
    TrainingState state;  ///< the whole model's, unsharded
    LayerActivations
        layer;  ///< one layer's saved tensors on one rank, this s and b (the first kind's)
    std::vector<LayerActivations> other_kinds;  ///< the same for each further kind of layer
    std::vector<SavedTensor>
        input_side;                 ///< what the embedding side saves (architecture model only)
    std::vector<SavedTensor> head;  ///< what the head and the loss save (architecture model only)
    std::vector<SavedTensor>
        forward_buffers;     ///< built for all layers by the forward pass (architecture model)
    Count activations;       ///< all L layers of one micro-batch, no recomputation
    Count kept_activations;  ///< the same, under the chosen recomputation
    ComputeCost compute;
    std::vector<RankReport> ranks;  ///< one per pipeline stage
    std::size_t most_loaded = 0;  ///< the rank with the highest peak (the earliest stage on a tie)
    /// By kind of layer, one layer's op tape on one rank (only when Settings::ops).
    std::vector<std::vector<tape::OpRow>> ops;
    /// Whether the first and last stages' layer counts in settings.parallel are memcalc's
    /// assumption (assume_stage_split: pp did not divide the layers, and neither was given).
    bool stage_split_assumed = false;

    const RankReport& busiest() const { return ranks[most_loaded]; }
    /// One layer of kind `kind`'s saved tensors.
    const LayerActivations& layer_of(std::size_t kind) const {
        return kind == 0 ? layer : other_kinds[kind - 1];
    }
    const std::vector<Step>& timeline() const { return busiest().timeline(); }
    std::size_t peak() const { return busiest().peak(); }
    const Step& peak_step() const { return busiest().peak_step(); }
};

namespace detail {
/// The model's parameters as `f` trains them, split as a workload needs them; an overflow names
/// its cause, the model's widths or the adapters' rank.
inline std::shared_ptr<const ParameterSplits> trained_parameters(const Architecture& m,
                                                                 const FineTuning& f) {
    ParameterTable own;
    try {
        own = parameter_table(m);
    } catch (const overflow_error&) {
        throw error(parameter_overflow(m));
    }
    try {
        return parameter_splits(fine_tuned_table(m, std::move(own), f), m.vocab);
    } catch (const overflow_error&) {
        throw error(adapters_overflow(m, f));
    }
}

/// One pipeline stage's device: its parameters, sharded state and timeline.
inline RankReport rank_report(const Workload& w, const Parallelism& p, std::uint64_t stage) {
    const StageFacts f = stage_facts(w, p, stage);
    RankReport rank;
    rank.stage = stage;
    rank.layer_ids = stage_layers(p, w.model.layers, stage);
    rank.holds_embedding = holds_embedding(p, stage);
    rank.holds_head = holds_head(p, stage);
    rank.in_flight = f.in_flight;
    rank.parameters = f.parameters;
    rank.state = f.state;
    rank.host = f.host;
    auto steps = std::make_shared<const TimelineOnce>(w, p, f);
    rank.peak_at = peak_step(steps->inputs());
    rank.steps = std::move(steps);
    return rank;
}

/// Whether some layer of `m` has the part `module` names.
inline bool has_module(const Architecture& m, Module module) {
    for (std::size_t k = 0; k < m.kind_count(); ++k) {
        if (!m.layer_kinds.empty() && m.layers_of_kind(k) == 0) continue;
        const Architecture& v = m.layer_kinds.empty() ? m : m.kind_view(k);
        const bool moe = v.is_moe();
        switch (module) {
            case Module::mlp:
                if (!moe) return true;
                break;
            case Module::moe:
            case Module::moe_act:
                if (moe) return true;
                break;
            case Module::shared_experts:
                if (moe && v.shared_ffn > 0) return true;
                break;
            case Module::mla_up_proj:
                if (v.mla.enabled()) return true;
                break;
            default: return true;
        }
    }
    return false;
}

}  // namespace detail

/// Whether the framework's gradient switches are modelled on layout `p`. The optimizer in backward
/// (GradBuffer::stepped) steps what one backward pass made, on one replica: each gradient is
/// stepped as soon as it is whole, so none accumulates or is reduced. FSDP's no_sync
/// (GradSync::last_microbatch) beside an offloaded step keeps its unsharded gradients where memcalc
/// cannot say (FSDP1 accumulates them on the device or the host by version).
inline bool gradients_modelled(const Framework& f, const Parallelism& p) {
    const bool single = p.steps_per_batch() == 1;
    const bool stepped_ok = f.grad_buffer != GradBuffer::stepped ||
                            (single && p.dp == 1 && p.zero == 0 && p.offload == Offload::none);
    const bool sync_ok = f.grad_sync != GradSync::last_microbatch || p.zero < 2 ||
                         p.offload == Offload::none || single;
    return stepped_ok && sync_ok;
}

namespace detail {

/// FSDP's no_sync beside an offloaded step (gradients_modelled): refused rather than counted
/// sharded, which could lean low.
inline void validate_grad_sync(const Settings& s) {
    if (s.framework.grad_sync != GradSync::last_microbatch ||
        gradients_modelled(s.framework, s.parallel))
        return;
    throw error(std::string("grad_sync last-microbatch with offload ") +
                offload_name(s.parallel.offload) +
                ": where no_sync keeps the unsharded gradients beside an offloaded step is not "
                "modelled");
}

/// Throws naming what the optimizer in backward cannot run with.
inline void validate_stepped(const Settings& s) {
    if (s.framework.grad_buffer != GradBuffer::stepped) return;
    const Parallelism& p = s.parallel;
    const std::string what = "grad_buffer stepped (the optimizer in backward)";
    if (p.steps_per_batch() > 1)
        throw error(what + " with " + std::to_string(p.steps_per_batch()) +
                    " micro-batches a step: each gradient is stepped as backward makes it, so "
                    "none can accumulate (torchtune refuses it too)");
    if (p.dp > 1 || p.zero > 0 || p.offload != Offload::none)
        throw error(what +
                    " is modelled on one replica's own gradients and state (dp 1, zero 0, "
                    "no offload; got dp " +
                    std::to_string(p.dp) + ", zero " + std::to_string(p.zero) +
                    "): data parallelism holds gradients until reduced");
    if (s.recipe.optimizer.step == StepWork::newton_schulz)
        throw error(what + " with " + std::string(s.recipe.name) +
                    ": a Newton-Schulz step per matrix in backward is not modelled");
}

/// Throws naming a recompute_modules entry the settings or the model cannot honour.
inline void validate_modules(const Architecture& m, const Settings& settings) {
    const ModuleSet& modules = settings.recompute_modules;
    if (modules.is_default()) return;
    if (modules.bits == 0) throw error("recompute_modules must name at least one module");
    if (settings.recompute == Recompute::full || settings.recompute == Recompute::op)
        throw error("recompute_modules (" + modules.names() + ") needs recompute selective (got " +
                    recompute_name(settings.recompute) + ")");
    if (settings.activations == ActivationModel::korthikanti)
        throw error("recompute_modules (" + modules.names() +
                    ") needs the architecture activation model (--activations architecture): "
                    "Korthikanti's formula "
                    "has no modules");
    for (Module module : recomputable_modules)
        if (modules.has(module) && !has_module(m, module))
            throw error(std::string("recompute module ") + module_name(module) + ": " +
                        model_name(m) + " has no " +
                        (module == Module::mlp              ? "dense MLP layer"
                         : module == Module::shared_experts ? "shared experts"
                         : module == Module::mla_up_proj    ? "multi-latent attention"
                                                            : "mixture-of-experts layer"));
}

/// Throws where fine-tuning `f` cannot be counted under these settings.
inline void validate_tuning(const FineTuning& f, ActivationModel activations,
                            const Recipe& recipe) {
    if (f.is_full()) return;
    if (activations == ActivationModel::korthikanti)
        throw error(std::string("training ") + training_name(f.mode) +
                    " needs the architecture activation model: Korthikanti's formula has every "
                    "weight trained");
    if (training_row(f.mode).frozen_base() && recipe.linears)
        throw error(std::string("training ") + training_name(f.mode) + " with recipe " +
                    std::string(recipe.name) +
                    ": adapters beside narrow (fp8) linears are not modelled");
    if (recipe.casts != nullptr)
        throw error(std::string("training ") + training_name(f.mode) + " with recipe " +
                    std::string(recipe.name) + ": frozen or adapted " +
                    std::string(recipe.casts->name) + " linears are not modelled");
}

/// Throws where a recipe's casting linears (torchao's) meet layers whose linears are not each a
/// table step: experts (torchao trains them with grouped GEMMs of its own), latent attention, and
/// state-space mixers (their out_proj).
inline void validate_casts(const Architecture& m, const Recipe& r, const Parallelism& p) {
    if (r.casts == nullptr) return;
    if (r.casts->gathered_weight_bytes != 0 && p.zero < 3)
        throw error("recipe " + std::string(r.name) +
                    " gathers the weights in float8, which needs --zero 3 (FSDP); zero is " +
                    std::to_string(p.zero));
    const bool stepped = !m.mla.enabled() && m.every_kind([](const Architecture& v) {
        return !v.is_moe() && !state_space(v.mixer);
    });
    if (!stepped)
        throw error("recipe " + std::string(r.name) + ": " + std::string(r.casts->name) +
                    " linears in " + m.name +
                    "'s layers (experts, latent attention or a state-space mixer) are not "
                    "modelled");
}

}  // namespace detail

/// Whether `mode`'s memory is modelled on layout `p`: torchtitan's per-op policy not under tensor
/// parallelism, where it also saves row-parallel layers' partial sums and reduce-scatter outputs.
inline bool recompute_modelled(Recompute mode, const Parallelism& p) {
    return mode != Recompute::op || p.tp == 1;
}

/// The figures of one configuration that a sweep's row prints: an estimate without its tables and
/// timelines, the peak from the closed form.
struct Summary {
    Settings settings;
    Count parameters;        ///< the whole model's
    TrainingState state;     ///< the whole model's, unsharded
    Count activations;       ///< all layers of one micro-batch on one rank, no recomputation
    Count kept_activations;  ///< the same, under the chosen recomputation
    Step peak{Phase::forward, 0, {}, 1};
    std::uint64_t peak_stage =
        0;  ///< the most loaded rank's pipeline stage (the earliest on a tie)
    ComputeCost compute;
    /// The device figure's high end (device_memory.hpp), where the caller weighed it.
    std::optional<Count> device;
};

/// The summary of a report already made.
inline Summary summary(const Report& r) {
    return {r.settings,    r.parameter_count, r.state,   r.activations, r.kept_activations,
            r.peak_step(), r.busiest().stage, r.compute, std::nullopt};
}

/// One model, prepared for many configurations: its parameter table and how it splits are built
/// once, so each estimate or summary counts only what the settings change. estimate() is one of
/// these.
class Estimator {
public:
    explicit Estimator(const Architecture& model) : Estimator(model, std::nullopt) {}

    /// With the model's parameter table as the caller edited it: frozen tensors
    /// (ParamRow::trainable) and the storage of their weights (ParamRow::storage). The table must
    /// be the model's own rows.
    Estimator(const Architecture& model, ParameterTable table)
        : Estimator(model, std::optional<ParameterTable>(std::move(table))) {}

    const Architecture& model() const { return model_; }

    /// Every table, each rank's peak, and its timeline when read. Where pp does not divide the
    /// layers and neither end stage is given, the split assume_stage_split makes.
    Report estimate(const Settings& given) const {
        // The settings' one copy is the report's (with the stage split it assumes); its model the
        // model as the step runs it (step_model).
        Report r{model_, given, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, 0, {}, false};
        const Settings& settings = r.settings;
        r.stage_split_assumed = assume_stage_split(r.settings.parallel, model_.layers);
        const Configuration c = configure(settings);
        if (const std::uint64_t tokens = image_tokens(settings))
            r.model.cross_attention_tokens = tokens;
        const Architecture& stepped = r.model;
        r.parameters = std::shared_ptr<const ParameterTable>(c.splits, &c.splits->table);
        r.parameter_count = c.parameter_count;
        r.state = c.state;
        const Parallelism& p = settings.parallel;
        std::optional<KindCounts> recomputed;  // partial recomputation's layers, by kind
        KindFlops spared{};
        counted(settings, [&] {
            ActivationTables t = tables(stepped, settings, c);
            spared = policy_spared_flops(t, model_.kind_count());
            const Workload w = workload(settings, t, c);
            if (p.recompute_layers) recomputed = recomputed_layers(w, p);
            if (settings.ops)
                for (std::size_t k = 0; k < model_.kind_count(); ++k)
                    r.ops.push_back(tape::op_rows(
                        tape::from_program(t.of_kind(k), settings.recompute), p, model_.vocab));
            split(t, p);
            r.activations = all_layers(t, [](const LayerActivations& l) { return l.total(); });
            r.kept_activations = kept_layers(t, settings.recompute, recomputed);
            r.layer = std::move(t.layer);
            r.other_kinds = std::move(t.other_kinds);
            r.input_side = std::move(t.input_side);
            r.head = std::move(t.head.rows);
            r.forward_buffers = std::move(t.forward_buffers);
            r.ranks.reserve(p.pp);
            for (std::uint64_t stage = 0; stage < p.pp; ++stage)
                r.ranks.push_back(detail::rank_report(w, p, stage));
            for (std::size_t i = 1; i < r.ranks.size(); ++i)
                if (r.ranks[i].peak_step().bytes.total() > r.busiest().peak_step().bytes.total())
                    r.most_loaded = i;
        });
        r.compute =
            compute_cost(stepped, settings.seq, settings.micro_batch, settings.recompute,
                         settings.recompute_modules, recomputed ? &*recomputed : nullptr, &spared);
        return r;
    }

    /// The same figures a report's summary gives, with no table kept and no timeline built.
    Summary summary(const Settings& settings) const {
        return summaries(settings, {settings.recompute}).front();
    }

    /// summary() under each of `modes` in turn (settings.recompute aside): the saved-tensor tables,
    /// which recomputation does not change, are built once for all of them. Its settings carry the
    /// stage split it assumed, as a report's do.
    std::vector<Summary> summaries(const Settings& given,
                                   const std::vector<Recompute>& modes) const {
        return summaries(given, modes, nullptr);
    }

    /// summaries(), and for each mode every step its peak was chosen from (layout_peak_candidates):
    /// what a sweep along the micro-batch draws its lines through (micro_batch_line.hpp).
    std::vector<Summary> summaries(const Settings& given, const std::vector<Recompute>& modes,
                                   std::vector<std::vector<LayoutPeak>>* candidates) const {
        Settings settings = given;
        assume_stage_split(settings.parallel, model_.layers);
        const Configuration c = configure(settings);
        Architecture with_images;
        const Architecture& stepped = step_model(settings, with_images);
        std::vector<Summary> out;
        out.reserve(modes.size());
        counted(settings, [&] {
            ActivationTables t = tables(stepped, settings, c);
            const KindFlops spared = policy_spared_flops(t, model_.kind_count());
            std::vector<std::optional<KindCounts>>
                recomputed;  // by mode: partial recomputation's layers
            for (Recompute mode : modes) {
                Settings with = settings;
                with.recompute = mode;
                validate_recompute_layers(with.parallel, model_.layers, mode);
                const Workload w = workload(with, t, c);
                const LayoutPeak peak = candidates ? earliest_largest(candidates->emplace_back(
                                                         layout_peak_candidates(w, with.parallel)))
                                                   : layout_peak(w, with.parallel);
                recomputed.push_back(with.parallel.recompute_layers
                                         ? std::optional(recomputed_layers(w, with.parallel))
                                         : std::nullopt);
                out.push_back(
                    {with,
                     c.parameter_count,
                     c.state,
                     {},
                     {},
                     peak.step,
                     peak.stage,
                     compute_cost(stepped, with.seq, with.micro_batch, mode, with.recompute_modules,
                                  recomputed.back() ? &*recomputed.back() : nullptr, &spared),
                     std::nullopt});
            }
            split(t, settings.parallel);
            for (std::size_t i = 0; i < out.size(); ++i) {
                out[i].activations =
                    all_layers(t, [](const LayerActivations& l) { return l.total(); });
                out[i].kept_activations = kept_layers(t, out[i].settings.recompute, recomputed[i]);
            }
        });
        return out;
    }

private:
    Estimator(const Architecture& model, std::optional<ParameterTable> table) : model_(model) {
        try {
            ParameterTable own = parameter_table(model_);  // which validates the model first
            if (table) {  // the model's rows, each frozen or stored as the caller says, and nothing
                          // else
                const bool same =
                    table->layers == own.layers && table->rows.size() == own.rows.size() &&
                    std::equal(table->rows.begin(), table->rows.end(), own.rows.begin(),
                               [](const ParamRow& a, const ParamRow& b) {
                                   return a.tensor == b.tensor && a.count == b.count &&
                                          a.group == b.group && a.split == b.split &&
                                          a.expert == b.expert && a.kind == b.kind &&
                                          a.linear == b.linear && a.role == b.role;
                               });
                if (!same)
                    throw error("the parameter table given is not " + model_name(model) +
                                "'s: only its rows' trainable and storage may change");
                own = std::move(*table);
                own.hidden = model_.hidden;  // the model's, whatever the caller's copy says
            }
            parameter_count_ = own.total();
            tunings_ = layer_tunings(model_, own, FineTuning{});  // an edited table's frozen rows
            splits_ = parameter_splits(std::move(own), model_.vocab);  // which keeps the table
        } catch (const overflow_error&) {  // every estimate says so, once its settings are checked
            overflow_ = detail::parameter_overflow(model);
        }
    }

    /// The model's parameter table (once configure() has found it countable).
    const ParameterTable& table() const { return splits_->table; }

    struct Configuration {
        TrainingState state;  ///< the whole model's, under the settings' recipe
        std::shared_ptr<const ParameterSplits>
            splits;                        ///< the model's table as settings.tuning trains it
        Count parameter_count;             ///< adapters included
        std::vector<LayerTuning> tunings;  ///< per kind of layer; empty: every tensor trains
    };

    /// A micro-batch's images need a tower to run through, a size, and the input side's tables.
    void check_images(const Settings& settings) const {
        memcalc::check_images(model_, settings.images);
        if (settings.images.any() && settings.activations != ActivationModel::architecture)
            throw error(
                "images need the architecture activation model (--activations "
                "architecture): the tower's tensors are its blocks' rows");
    }

    /// The checks of the settings against the model, before any table is made.
    void check_settings(const Settings& settings) const {
        detail::require_positive("seq", settings.seq);
        detail::require_positive("micro_batch", settings.micro_batch);
        if ((model_.position == Position::learned ||
             causal_mask_buffer(model_.causal_mask_buffer).registered) &&
            settings.seq > model_.max_positions)
            throw error("seq " + std::to_string(settings.seq) + " exceeds the " +
                        std::to_string(model_.max_positions) +
                        (model_.position == Position::learned ? " learned positions of "
                                                              : " positions of the mask of ") +
                        (model_.name.empty() ? "the model" : model_.name));
        validate(settings.parallel, model_, settings.seq);
        validate_recompute_layers(settings.parallel, model_.layers, settings.recompute);
        check_images(settings);
        if (!overflow_.empty()) throw error(overflow_);
        if (settings.activations == ActivationModel::korthikanti &&
            settings.framework.attention == Attention::flash)
            throw error(
                "flash attention needs the architecture activation model: Korthikanti's formula "
                "describes "
                "eager attention");
        if (settings.recompute == Recompute::op &&
            settings.activations == ActivationModel::korthikanti)
            throw error(
                "recompute op needs the architecture activation model (--activations "
                "architecture): "
                "Korthikanti's formula has no ops for the policy to save");
        if (model_.compile != Compile::none && settings.activations == ActivationModel::korthikanti)
            throw error(std::string("compile ") + compile_name(model_.compile) +
                        " needs the architecture activation model (--activations architecture): "
                        "Korthikanti's formula has no ops for the partition to keep");
        if (model_.mtp_layers > 0 && settings.activations == ActivationModel::korthikanti)
            throw error("mtp_layers " + std::to_string(model_.mtp_layers) +
                        " needs the architecture activation model (--activations architecture): "
                        "Korthikanti's formula has no head for the modules to follow");
        if (!recompute_modelled(settings.recompute, settings.parallel))
            throw error("recompute op with tp " + std::to_string(settings.parallel.tp) +
                        " is not modelled: under tensor parallelism the policy also saves whole "
                        "partial sums and "
                        "reduce-scatter outputs");
        detail::validate_modules(model_, settings);
        detail::validate_casts(model_, settings.recipe, settings.parallel);
        detail::validate_stepped(settings);
        detail::validate_grad_sync(settings);
    }

    /// The checks every estimate makes before it counts, in the order it makes them.
    Configuration configure(const Settings& settings) const {
        check_settings(settings);
        Configuration c{{}, splits_, parameter_count_, tunings_};
        if (!settings.tuning.is_full()) {
            const FineTuning& f = settings.tuning;
            detail::validate_tuning(f, settings.activations, settings.recipe);
            // The model's own table counts (overflow_ says so): only the adapters can overflow.
            try {
                c.splits = parameter_splits(fine_tuned_table(model_, table(), f), model_.vocab);
                c.parameter_count = c.splits->table.total();
                c.tunings = layer_tunings(model_, c.splits->table, f);
            } catch (const overflow_error&) {
                throw error(detail::adapters_overflow(model_, f));
            }
        }
        // Weights in a storage of their own are dequantised in the layer's workspace, which only
        // the architecture model has.
        if (settings.activations == ActivationModel::korthikanti)
            for (const StateClass& k : c.splits->classes)
                if (k.storage)
                    throw error(std::string("weights stored as ") + dtype_name(k.storage->dtype) +
                                " need the architecture activation model: Korthikanti's formula "
                                "has no workspace to "
                                "dequantise them in");
        c.state = model_state(*c.splits, settings.recipe);
        c.state.weights +=
            registered_buffer_bytes(model_, settings.recipe, settings.framework, settings.seq) *
            Count(model_.layers);
        return c;
    }

    /// The tokens mllama's cross-attention layers read from a step's images; 0: none.
    std::uint64_t image_tokens(const Settings& settings) const {
        return cross_attention_tokens(model_.vision, settings.images, settings.micro_batch);
    }

    /// The model as a step of `settings` runs it (image_tokens), a copy in `storage`; else the
    /// model itself.
    const Architecture& step_model(const Settings& settings, Architecture& storage) const {
        const std::uint64_t tokens = image_tokens(settings);
        if (tokens == 0) return model_;
        storage = model_;
        storage.cross_attention_tokens = tokens;
        return storage;
    }

    /// The layers' tables of `m`, the model as the step runs it (step_model), and the input side's.
    ActivationTables tables(const Architecture& m, const Settings& settings,
                            const Configuration& c) const {
        ActivationTables t = activation_tables(
            m, settings.seq, settings.micro_batch, settings.recipe.precision(),
            settings.activations, settings.framework, settings.recompute_modules, c.tunings);
        if (settings.images.any()) {  // on the input side, beside the embedding's
            const auto& rows = c.splits->table.rows;
            const bool trains = std::any_of(rows.begin(), rows.end(), [](const ParamRow& r) {
                return r.part == Part::vision && r.trainable;
            });
            const Framework& f = settings.framework;
            for (const SavedTensor& row :
                 image_rows(model_.vision, settings.images, settings.recipe.precision(),
                            f.attention, runtime_of(f), settings.recompute, trains))
                t.input_side.push_back(row);
            detail::TableBuilder input_side(t.input_side);
            detail::cross_attention_mask_rows(input_side, m, settings.seq, settings.micro_batch,
                                              settings.recipe.precision(), f.attention);
        }
        return t;
    }

    /// Runs `count`, saying which sizes overflowed where a byte count passes 64 bits (LoRA's
    /// activations grow with its rank as others with the sequence).
    template <class Count_>
    static void counted(const Settings& settings, Count_ count) {
        try {
            count();
        } catch (const overflow_error&) {
            const FineTuning& f = settings.tuning;
            const std::string rank = training_row(f.mode).adapters
                                         ? " and lora rank " + std::to_string(f.lora.rank)
                                         : "";
            throw error("seq " + std::to_string(settings.seq) + " with micro-batch " +
                        std::to_string(settings.micro_batch) + rank +
                        " needs more bytes than 64 bits can count");
        }
    }

    Workload workload(const Settings& settings, const ActivationTables& t,
                      const Configuration& c) const {
        return make_workload(model_, settings.recipe, settings.seq, settings.micro_batch,
                             settings.recompute, c.splits, t, settings.framework);
    }

    /// Every layer's `of(one layer)`, by kind: one rank's bytes of one micro-batch.
    template <class Of>
    Count all_layers(const ActivationTables& t, Of of) const {
        Count sum;
        for (std::size_t k = 0; k < model_.kind_count(); ++k)
            sum += Count(table().kind_layers[k]) * of(t.of_kind(k));
        return sum;
    }

    /// Every layer's kept bytes under `mode`; under partial recomputation (`recomputed`: its layers
    /// by kind) the others' under none.
    Count kept_layers(const ActivationTables& t, Recompute mode,
                      const std::optional<KindCounts>& recomputed) const {
        if (!recomputed)
            return all_layers(t, [&](const LayerActivations& l) { return l.kept(mode); });
        Count sum;
        for (std::size_t k = 0; k < model_.kind_count(); ++k) {
            const LayerActivations& l = t.of_kind(k);
            const std::uint64_t n = (*recomputed)[k];
            sum += Count(n) * l.kept(mode) +
                   Count(table().kind_layers[k] - n) * l.kept(Recompute::none);
        }
        return sum;
    }

    /// The tables a report shows are one rank's share of every tensor.
    void split(ActivationTables& t, const Parallelism& p) const {
        const std::uint64_t V = model_.vocab;
        const auto split_layer = [&](LayerActivations& layer) {
            split_rows(layer.rows, p, V);
            split_rows(layer.work, p, V);
            split_rows(layer.policy_outputs, p, V);
            split_rows(layer.beside, p, V);
            split_rows(layer.eager_traffic, p, V);
            layer.input_bytes = rank_stream(layer.input_bytes, p);
        };
        split_layer(t.layer);
        for (LayerActivations& layer : t.other_kinds) split_layer(layer);
        split_rows(t.input_side, p, V);
        split_layer(t.head);
        split_rows(t.forward_buffers, p, V);
    }

    Architecture model_;
    Count parameter_count_;
    std::vector<LayerTuning>
        tunings_;  ///< what the table's frozen rows change in the layers; empty: all train
    std::shared_ptr<const ParameterSplits> splits_;
    std::string overflow_;  ///< why the parameter count cannot be counted, when it cannot
};

/// The Estimator of the model this thread estimated last is kept: a loop over settings of one
/// model (a notebook's sweep, the browser page's every change) makes the model's tables once.
inline Report estimate(const Architecture& model, const Settings& settings) {
    thread_local std::optional<Estimator> last;
    if (!last || last->model() != model) last.emplace(model);  // a throw leaves it empty
    return last->estimate(settings);
}

}  // namespace memcalc
