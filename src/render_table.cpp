#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>

#include "memcalc/version.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;
constexpr Align L = Align::left, R = Align::right;

std::string dims_text(const Dims& dims) {
    std::string out;
    for (auto d : dims) out += (out.empty() ? "" : " x ") + std::to_string(d);
    return out;
}

std::string header(const Report& r) {
    const std::uint64_t M = r.settings.parallel.steps_per_batch();
    // Every framework setting that is not the chapter's, so the assumptions show: "loss bf16".
    std::string framework;
    const Framework chapter;
    for_each_switch([&](const auto& row) {
        if (row.key == Text("moe_kernel") && !r.model.any_moe())
            return;  // it changes nothing in a dense model
        if (r.settings.framework.*row.member != chapter.*row.member)
            framework += fmt::format(", {} {}", row.option().substr(2),
                                     row.name(r.settings.framework.*row.member));
    });
    if (r.model.expert_imbalance != 1.0)
        framework += fmt::format(", expert imbalance {:g}", r.model.expert_imbalance);
    const Framework& f = r.settings.framework;
    if (chunked_loss(f.loss) && f.loss_chunk_tokens > 0)
        framework += fmt::format(", loss-chunk-tokens {}", f.loss_chunk_tokens);
    else if (chunks_by_count(f.loss))
        framework += fmt::format(", loss-chunks {}", f.loss_chunks);
    if (f.cublas_workspace)
        framework += fmt::format(", cuBLAS workspace {} B", digits(Count(*f.cublas_workspace)));
    return fmt::format(
        "memcalc {}: {}, seq {}, micro-batch {}{}, recompute {}, recipe {}{}\n", memcalc::version,
        r.model.name, r.settings.seq, r.settings.micro_batch,
        M > 1 ? fmt::format(" x {} per step", M) : "",
        std::string(recompute_name(r.settings.recompute)) +
            (r.settings.recompute_modules.is_default()
                 ? ""
                 : " (" + r.settings.recompute_modules.names() + ")") +
            recompute_layers_text(r.settings.parallel),
        r.settings.recipe.name,
        framework + (r.settings.tuning.is_full()
                         ? ""
                         : fmt::format(", train {}", training_name(r.settings.tuning.mode))));
}

/// " 'dense'" for a model of several kinds of layer, "" for one kind.
std::string kind_label(const Report& r, std::size_t kind) {
    return r.parameters->kinds == 1 ? std::string()
                                    : fmt::format(" '{}'", r.model.layer_kinds[kind].name);
}

/// QLoRA's base: "; base linears nf4 in blocks of 64 with int8 scales (one fp32 per 256 of
/// them)", and what its quantiser and bitsandbytes' release change.
std::string quantized_base(const QuantizedLinears& q) {
    const Storage s = q.storage();
    std::string out =
        fmt::format("; base linears{} {} in blocks of {} with {} scales",
                    q.head() ? " and head" : "", dtype_name(s.dtype), s.block, dtype_name(s.scale));
    if (s.scale_block > 0)
        out += fmt::format(" (one {} per {} of them)", dtype_name(s.scale_scale), s.scale_block);
    if (s.quantized_from) out += fmt::format(", quantised from {}", dtype_name(*s.quantized_from));
    if (q.keeps_input()) out += ", each keeping its input (bitsandbytes before 0.43.2)";
    return out;
}

/// Under fine-tuning: what trains, and what the frozen base keeps.
std::string training_line(const Report& r) {
    const FineTuning& f = r.settings.tuning;
    if (f.is_full()) return "";
    const Count trainable = trainable_parameters(*r.parameters);
    std::string how;
    if (f.mode == Training::frozen)
        how = fmt::format("frozen: {}", fmt::join(f.frozen, ", "));
    else if (training_row(f.mode).prompt)
        how = fmt::format("a {}-token prompt, gated, in every layer from {}{}", f.prompt.tokens,
                          f.prompt.start_layer,
                          training_row(f.mode).scaled
                              ? "; a trained scale and bias on every linear, the norms trained"
                              : "");
    else
        how = fmt::format("{}rank {} on {}, {}, {} adapters{}",
                          lora_variant_row(f.lora.variant).magnitude ? "DoRA, " : "", f.lora.rank,
                          fmt::join(f.lora.targets, ", "),
                          f.lora.dropout ? "dropout on their inputs" : "no dropout",
                          f.lora.fp32 ? "fp32" : "model-dtype",
                          training_row(f.mode).quantized_base ? quantized_base(f.quantized) : "");
    return fmt::format("  training {} ({}): {} trainable, {:.4f}% of {}\n", training_name(f.mode),
                       how, digits(trainable),
                       100.0 * static_cast<double>(trainable.value()) /
                           static_cast<double>(r.parameter_count.value()),
                       digits(r.parameter_count));
}

std::string parameters_section(const Report& r) {
    const ParameterTable& t = *r.parameters;
    TextTable table({L, L, L, L, R, L});
    table.row({"part", "tensor", "shape", "", "count", ""});
    const auto one_layer = [&](std::size_t kind) {  // the subtotal after a kind's rows
        table.row({fmt::format("one{} layer", kind_label(r, kind)), "", "", "",
                   digits(t.per_layer(kind)),
                   fmt::format("x {} = {}", t.kind_layers[kind],
                               digits(Count(t.kind_layers[kind]) * t.per_layer(kind)))});
    };
    const ParamRow* previous = nullptr;
    for (const auto& row : t.rows) {
        const bool layer = row.group == Group::layer;
        if (previous != nullptr && previous->group == Group::layer &&
            (!layer || row.kind != previous->kind))
            one_layer(previous->kind);
        previous = &row;
        table.row(
            {part_name(row.part), row.tensor, row.shape, dims_text(row.dims), digits(row.count),
             layer ? fmt::format("x {}{} layers", t.kind_layers[row.kind], kind_label(r, row.kind))
             : row.mtp ? "multi-token prediction"
                       : ""});
    }
    table.rule();
    table.row({"total", "", "", "", digits(r.parameter_count), ""});
    std::string by_part;
    for (std::size_t k = 0; k < t.kinds; ++k) {
        const auto part = [&](Part p) {
            Count n;
            for (const auto& row : t.rows)
                if (row.group == Group::layer && row.kind == k && row.part == p) n += row.count;
            return n;
        };
        const Architecture view = r.model.kind_view(k);
        by_part += fmt::format("  per{} layer: attention {}, mlp {}, norms {}", kind_label(r, k),
                               digits(part(Part::attention)), digits(part(Part::mlp)),
                               digits(part(Part::norms)));
        if (view.is_moe() || (t.kinds == 1 && r.model.is_moe()))
            by_part += fmt::format(", router {}", digits(part(Part::router)));
        by_part += "\n";
    }
    return fmt::format("Parameters: {} ({:.2f} B)\n", digits(r.parameter_count),
                       static_cast<double>(r.parameter_count.value()) / 1e9) +
           table.str() + by_part + training_line(r);
}

std::string state_section(const Report& r, const View& view) {
    const Recipe& p = r.settings.recipe;
    TextTable table({L, L, R, R, R});
    auto line = [&](const char* what, std::string dtype, std::optional<std::uint64_t> per_param,
                    Count bytes) {
        // A per-tensor rule (8-bit blocks, factored moments, Muon's parts) has no one figure per
        // parameter.
        table.row({what, std::move(dtype),
                   per_param ? fmt::format("{} B/param", *per_param) : "per tensor",
                   digits(bytes) + " B", amount(bytes, view.unit)});
    };
    // Under fine-tuning the gradients, master weights and optimiser state are the trainable
    // parameters' alone, and the frozen ones keep their weights in their own storage (QLoRA's 4-bit
    // base).
    const FineTuning& f = r.settings.tuning;
    const bool tuned = !f.is_full();
    const std::string weights =
        training_row(f.mode).quantized_base
            ? fmt::format("{}, base linears {}", dtype_name(p.weights), dtype_name(f.base().dtype))
            : std::string(dtype_name(p.weights));
    line("weights", weights,
         training_row(f.mode).quantized_base ? std::optional<std::uint64_t>{} : p.weight_bytes(),
         r.state.weights);
    line("gradients", dtype_name(p.gradients), p.gradient_bytes(), r.state.gradients);
    if (p.master)
        line("master weights", dtype_name(*p.master), p.master_bytes(), r.state.master_weights);
    line("optimizer state", std::string(p.optimizer_state()), p.optimizer_bytes(),
         r.state.optimizer_state);
    table.rule();
    line("total", "", tuned ? std::optional<std::uint64_t>{} : p.bytes_per_parameter(),
         r.state.total());
    const std::string heading =
        tuned ? fmt::format(
                    "Training state: {} (gradients, master weights and optimizer state: {} "
                    "trainable parameters "
                    "only)\n",
                    p.name, digits(trainable_parameters(*r.parameters)))
        : p.bytes_per_parameter()
            ? fmt::format("Training state: {} ({} B per parameter, ZeRO K = {})\n", p.name,
                          *p.bytes_per_parameter(), *p.zero_k())
            : fmt::format("Training state: {} (optimizer state per tensor: {})\n", p.name,
                          p.optimizer.rule);
    return heading + table.str();
}

/// A saved-tensor table; `why` adds the column that says why backward needs each tensor.
std::string saved_table(const std::vector<SavedTensor>& rows, Recompute mode, bool why) {
    TextTable table({L, L, R, R, L, L});
    table.row({"op", "tensor kept for backward", "formula", "bytes",
               mode == Recompute::none ? "" : recompute_name(mode),
               why ? "why backward needs it" : ""});
    for (const auto& t : rows) {
        const std::string fate = mode == Recompute::none
                                     ? (t.keep == Keep::only_selective ? "(selective only)" : "")
                                 : t.kept(mode)            ? "kept"
                                 : rebuilt_by(t, mode)     ? "rebuilt"
                                 : t.kept(Recompute::none) ? "the checkpoint"
                                                           : "";
        table.row({t.op, t.tensor, fmt::format("{} {}", t.copies * t.bytes_per_element, t.symbol),
                   digits(t.bytes), fate, why ? t.why : ""});
    }
    return table.str();
}

std::string layers_text(const std::vector<std::uint64_t>& ids) {
    // Contiguous runs: "1-20", or "1-5, 21-25" for an interleaved rank.
    std::string out;
    for (std::size_t i = 0; i < ids.size();) {
        std::size_t j = i;
        while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
        out += (out.empty() ? "" : ", ") +
               (i == j ? std::to_string(ids[i]) : fmt::format("{}-{}", ids[i], ids[j]));
        i = j + 1;
    }
    return out;
}

/// The schedule's name, with its chunks per rank and weight copies where it has more than one.
std::string schedule_text(const Parallelism& p) {
    const ScheduleRow& row = schedule_row(p);
    std::string out = row.title;
    if (chunks_per_rank(p) > 1) out += fmt::format(", {} chunks per rank", chunks_per_rank(p));
    if (row.parameter_copies > 1)
        out += fmt::format(", {} copies of the weights", row.parameter_copies);
    return out;
}

std::string parallel_section(const Report& r, const View& view) {
    const Parallelism& p = r.settings.parallel;
    std::string layout =
        fmt::format("{} devices = dp {} x tp {} x pp {}", p.devices(), p.dp, p.tp, p.pp);
    if (p.cp > 1) layout += fmt::format(" x cp {}", p.cp);
    if (p.sequence_parallel) layout += ", sequence parallel";
    if (p.ep > 1) layout += fmt::format(", experts over {} ranks", p.ep);
    if (p.etp != 0) layout += fmt::format(", each expert split over etp {}", p.etp);
    if (p.zero > 0) layout += fmt::format(", ZeRO-{} over {} ranks", p.zero, p.dense_shards());
    if (p.zero > 0 && p.ep > 1) layout += fmt::format(" ({} for expert state)", p.expert_shards());
    if (p.pp > 1)
        layout +=
            fmt::format(", {} micro-batches per step ({})", p.steps_per_batch(), schedule_text(p));
    const bool host = p.offloads();
    if (host) layout += fmt::format(", {} offloaded to host memory", p.offload_mode().name());
    TextTable table({L, L, L, R, R, R, R, R, L, L});
    table.row({"stage", "layers", "holds", "in flight", "parameters", "state", host ? "host" : "",
               "peak", "peak step", ""});
    for (std::size_t i = 0; i < r.ranks.size(); ++i) {
        const RankReport& k = r.ranks[i];
        const std::string holds = k.holds_embedding && k.holds_head ? "embedding, head"
                                  : k.holds_embedding               ? "embedding"
                                  : k.holds_head                    ? "head"
                                                                    : "";
        table.row({std::to_string(k.stage), layers_text(k.layer_ids), holds,
                   std::to_string(k.in_flight), digits(k.parameters),
                   amount(k.state.total(), view.unit), host ? amount(k.host, view.unit) : "",
                   amount(k.peak_step().bytes.total(), view.unit), k.peak_step().name(),
                   i == r.most_loaded ? "<- most loaded" : ""});
    }
    return "Parallel layout: " + layout + "\n" + table.str();
}

/// The temporaries of the layer's ops and of the forward pass, and what each adds to its step.
std::string workspace_table(const Report& r) {
    std::string out =
        "\nWorkspaces: temporaries of the op running now, never saved. Each adds to its step what "
        "the\n"
        "rows not live meanwhile (made later in forward, freed earlier in backward) do not cover;\n"
        "a backward one also finds the layer's gradients from the named tensor on written, a "
        "forward one\n"
        "the residual stream's tensors no row keeps (the layer's input, the attention half's "
        "sum).\n";
    TextTable table({L, L, L, R, R, R, L});
    table.row({"op", "makes", "formula", "bytes", "rows not live", "adds", "gradients from"});
    for (std::size_t k = 0; k < r.parameters->kinds; ++k) {
        const LayerActivations& layer = r.layer_of(k);
        const std::vector<WorkspaceSum> sums = tape::workspace_sums(layer, r.settings.recompute);
        const std::vector<Linear> written = layer.gradients_by_op();
        for (std::size_t i = 0; i < layer.work.size(); ++i) {
            const Workspace& w = layer.work[i];
            const WorkspaceSum& sum = sums[i];
            table.row({std::string(w.op) + kind_label(r, k), w.tensor, w.formula, digits(w.bytes),
                       digits(sum.covered), digits(sum.adds()),
                       written[i] == Linear::none ? "-" : linear_row(written[i]).tensor});
        }
    }
    for (const auto& b : r.forward_buffers)
        table.row({b.op, "built once per forward pass", b.symbol, digits(b.bytes), "",
                   digits(b.bytes), "-"});
    return out + table.str();
}

/// One kind of layer's saved tensors and their totals under the recomputation.
std::string layer_tables(const Report& r, std::size_t kind, bool why) {
    const Recompute mode = r.settings.recompute;
    const LayerActivations& layer = r.layer_of(kind);
    std::string out = saved_table(layer.rows, mode, why);
    if (mode == Recompute::op && !layer.policy_outputs.empty()) {
        out += "op outputs the policy saves beyond the rows (no backward needs them):\n" +
               saved_table(layer.policy_output_rows(), mode, why);
    }
    TextTable totals({L, R, R});
    totals.row({fmt::format("one{} layer, no recomputation", kind_label(r, kind)),
                layer_formula(layer), digits(layer.total())});
    if (mode != Recompute::none) {
        totals.row({fmt::format("kept under {}", recompute_name(mode)),
                    mode == Recompute::full ? "the layer's input"
                    : mode == Recompute::op ? "the layer's input and the saved op outputs"
                                            : "",
                    digits(layer.kept(mode))});
        totals.row({"rebuilt in its backward step", "", digits(layer.rebuilt(mode))});
    }
    return out + totals.str();
}

std::string activations_section(const Report& r, const View& view, bool why) {
    const Recompute mode = r.settings.recompute;
    const auto& m = r.model;
    std::string out;
    for (std::size_t k = 0; k < r.parameters->kinds; ++k) {
        const Architecture layer = m.kind_view(k);
        if (k > 0) out += "\n";
        if (!layer.runs_in_step()) {
            out +=
                fmt::format("Activations of one{} layer: none, the layer skipped without images\n",
                            kind_label(r, k));
            continue;
        }
        if (r.settings.activations == ActivationModel::korthikanti) {
            out += fmt::format(
                "Activations of one{} layer (Korthikanti et al. 2022; s={} b={} h={} a={}, {}-byte "
                "values, 1-byte masks)\n"
                "  the formula's GPT layer: LayerNorm, a 4h GELU MLP and dropout, whatever the "
                "model's own ops\n",
                kind_label(r, k), r.settings.seq, r.settings.micro_batch, m.hidden, m.heads,
                r.settings.recipe.activation_bytes());
        } else {
            out += fmt::format(
                "Activations of one{} layer ({}'s own ops as PyTorch keeps them, {} attention; "
                "s={} b={} h={} a={} k={} "
                "d={} f={}{}, {}-byte values)\n",
                kind_label(r, k), m.name, attention_name(r.settings.framework.attention),
                r.settings.seq, r.settings.micro_batch, m.hidden, m.heads, m.key_value_heads(),
                m.head_size(), layer.ffn,
                layer.is_moe() && r.parameters->kinds > 1
                    ? fmt::format(" E={} top-{}", layer.experts, layer.active_experts())
                : layer.mixer == Mixer::cross_attention  // the images' tokens its keys are over
                    ? fmt::format(" N={}", layer.cross_attention_tokens)
                    : "",
                r.settings.recipe.activation_bytes());
        }
        out += layer_tables(r, k, why);
    }
    out += fmt::format("  all {} layers: {} B ({}) without recomputation", m.layers,
                       digits(r.activations), amount(r.activations, view.unit));
    if (mode != Recompute::none)
        out += fmt::format("; kept under {}: {} B ({})", recompute_name(mode),
                           digits(r.kept_activations), amount(r.kept_activations, view.unit));
    out += "\n";
    if (why && r.settings.activations == ActivationModel::architecture) {
        out += fmt::format("\nEmbedding side, kept until the last backward step: {} B\n",
                           digits(saved_bytes(r.input_side)));
        out += saved_table(r.input_side, Recompute::none, true);
        out +=
            fmt::format("\nHead and loss, kept from the loss step to the head's backward: {} B\n",
                        digits(saved_bytes(r.head)));
        out += saved_table(r.head, Recompute::none, true);
        out += workspace_table(r);
    }
    return out;
}

std::string compute_section(const Report& r) {
    const ComputeCost& c = r.compute;
    std::string out = fmt::format(
        "Compute: {:.3g} TFLOP per step (forward + backward, matrix products)", c.step / 1e12);
    if (r.settings.recompute == Recompute::none) return out + "; no recomputation\n";
    return out + fmt::format("; {} recomputation adds {:.3g} TFLOP ({:.1f}%)\n",
                             recompute_name(r.settings.recompute), c.recompute / 1e12,
                             100 * c.recompute_fraction());
}

/// A bar proportional to `part` of `whole`, 24 characters at most.
std::string bar(Count part, Count whole) {
    const double share =
        whole.value() == 0 ? 0
                           : static_cast<double>(part.value()) / static_cast<double>(whole.value());
    return std::string(static_cast<std::size_t>(share * 24 + 0.5), '#');
}

std::string timeline_section(const Report& r, const View& view) {
    const std::vector<Step>& steps = r.timeline();
    const std::size_t n = steps.size(), peak = r.peak();
    std::set<std::size_t> shown;
    for (std::size_t i = 0; i < n; ++i) {
        // Compact: the first two and the last step of each phase, and the peak wherever it is.
        const bool starts = i == 0 || steps[i - 1].phase != steps[i].phase;
        const bool second = i >= 1 && (i == 1 || steps[i - 2].phase != steps[i].phase) &&
                            steps[i - 1].phase == steps[i].phase;
        const bool ends = i + 1 == n || steps[i + 1].phase != steps[i].phase;
        if (view.full_timeline || starts || second || ends || i == peak) shown.insert(i);
    }
    const Scale scale = scale_for(r.peak_step().bytes.total(), view.unit);
    // The workspace column only where the model has workspaces (the architecture model).
    const bool work = std::any_of(steps.begin(), steps.end(),
                                  [](const Step& s) { return s.bytes.workspace != 0; });
    std::vector<Align> align{Align::left, R, R, R, R, R, R, R};
    std::vector<std::string> head{"step",     "total",   "weights+opt", "gradients",
                                  "kept act", "rebuilt", "logits",      "act grad"};
    if (work) align.push_back(R), head.push_back("workspace");
    align.insert(align.end(), {Align::left, Align::left});
    head.insert(head.end(), {"", ""});
    TextTable table(align);
    table.row(head);
    std::size_t previous = 0;
    bool first = true;
    for (std::size_t i : shown) {
        if (!first && i != previous + 1) {
            std::vector<std::string> gap(head.size());
            gap[0] = "...";
            table.row(gap);
        }
        first = false;
        previous = i;
        const Breakdown& b = steps[i].bytes;
        std::vector<std::string> row{steps[i].name(),
                                     scaled(b.total(), scale),
                                     scaled(b.weights + b.master_weights + b.optimizer_state +
                                                b.gathered_weights + b.weight_copies,
                                            scale),
                                     scaled(b.gradients, scale),
                                     scaled(b.kept_activations, scale),
                                     scaled(b.rebuilt_activations, scale),
                                     scaled(b.logits, scale),
                                     scaled(b.activation_gradient, scale)};
        if (work) row.push_back(scaled(b.workspace, scale));
        row.push_back(bar(b.total(), r.peak_step().bytes.total()));
        row.push_back(i == peak ? "<- peak" : "");
        table.row(row);
    }
    const std::string which =
        r.ranks.size() > 1 ? fmt::format(" of pipeline stage {}", r.busiest().stage) : "";
    const std::string title =
        view.full_timeline
            ? fmt::format("Timeline{}: all {} steps, {}\n", which, n, scale.name)
            : fmt::format("Timeline{} ({}; --timeline shows all {} steps)\n", which, scale.name, n);
    return title + table.str();
}

/// What the device shows beside the allocated peak: the allocator's reserved bytes (the
/// libraries' workspaces among them) and what lies outside it, each row with its count.
std::string device_section(const DeviceFigures& d, const View& view) {
    const ReservedPeak& res = d.reserved;
    return fmt::format("\nOn the device{} ({}):\n",
                       d.stage > 0 ? fmt::format(" of pipeline stage {}", d.stage) : "",
                       device_settings_text(view.device, view.unit)) +
           device_lines({d.allocated, "the model's tensors (above)"}, d.rows,
                        {res.bytes, fmt::format("at {} of step {}", res.at.name(), res.iteration)},
                        d.bytes, view.unit) +
           fmt::format(
               "  band {} to {}: the rows' ends, and each step's tensors made before the last's "
               "go;\n  the first training step reserves {}\n",
               amount(d.low_bytes, view.unit), amount(d.high_bytes, view.unit),
               amount(res.first_step_bytes, view.unit));
}

/// The verdict on `peak` (the device figure's high end where there is one).
std::string device_verdict(Count peak, bool on_device, const View& view) {
    const DeviceFit rule{*view.device_memory, view.reserve};
    const std::string usable =
        rule.reserve == Count(0)
            ? amount(rule.memory, view.unit)
            : fmt::format("{} ({} less a {} reserve)", amount(rule.usable(), view.unit),
                          amount(rule.memory, view.unit), amount(rule.reserve, view.unit));
    const std::string what =
        on_device ? fmt::format("the device's {} (high end)", amount(peak, view.unit)) : "it";
    return rule.fits(peak)
               ? fmt::format("  fits in {}: {} to spare\n", usable,
                             amount(Count(rule.usable().value() - peak.value()), view.unit))
               : fmt::format("  does not fit in {}: {} is {} over\n", usable, what,
                             amount(Count(peak.value() - rule.usable().value()), view.unit));
}

/// The loading peak, where --loading asks for it or it passes the step's.
std::string loading_section(const Report& r, const View& view,
                            const std::optional<DeviceFigures>& device) {
    const LoadingView l = loading_view(r, view, device);
    if (!view.loading && !l.peak.above_step) return "";
    const LoadingMethod& m = *l.peak.method;
    std::string out = fmt::format(
        "\nLoading ({}: {}): {} on the device{}, {} on each node's host\n", m.name, m.description,
        amount(l.peak.device_bytes, view.unit), l.peak.above_step ? ", above the step's peak" : "",
        amount(l.peak.host_bytes_per_node, view.unit));
    if (l.fits)
        out += fmt::format("  with the step's rows beside it, {}: {}\n",
                           amount(l.device_high, view.unit),
                           *l.fits ? "fits" : "does not fit: loading runs out of memory first");
    return out;
}

std::string peak_section(const Report& r, const View& view) {
    const Step& peak = r.peak_step();
    TextTable table({Align::left, R, R});
    for (const auto& c : categories) {
        const Count bytes = peak.bytes.*c.member;
        if (bytes.value() > 0) table.row({c.label, digits(bytes) + " B", amount(bytes, view.unit)});
    }
    const std::string where =
        r.ranks.size() > 1 ? fmt::format(" of pipeline stage {}", r.busiest().stage) : "";
    const std::string per = r.settings.parallel.any() ? " per device" : "";
    const std::optional<DeviceFigures> device = fullest_device(r, view);
    std::string verdict;
    if (view.device_memory)
        verdict = device_verdict(verdict_peak(r, device), device.has_value(), view);
    if (view.host_memory && r.settings.parallel.offloads()) {
        const RankReport* most = &r.ranks.front();  // the device keeping the most in host memory
        for (const RankReport& k : r.ranks)
            if (k.host > most->host) most = &k;
        const Count host = most->host, memory = *view.host_memory;
        const std::string whose = r.ranks.size() > 1 ? fmt::format(" (stage {})", most->stage) : "";
        verdict += host <= memory
                       ? fmt::format("  host memory{}: {} fits in {}: {} to spare\n", whose,
                                     amount(host, view.unit), amount(memory, view.unit),
                                     amount(Count(memory.value() - host.value()), view.unit))
                       : fmt::format("  host memory{}: {} does not fit in {}: {} over\n", whose,
                                     amount(host, view.unit), amount(memory, view.unit),
                                     amount(Count(host.value() - memory.value()), view.unit));
    }
    const std::string later =
        peak.microbatch > 1 && peak.phase != Phase::optimizer
            ? "  micro-batch 2 stands for every later one: each starts with the gradients the "
              "earlier ones\n"
              "  accumulated (with --grad-buffer persistent, every micro-batch does)\n"
            : "";
    return fmt::format("Peak{}: {} at {}{} ({} B)\n", per, amount(peak.bytes.total(), view.unit),
                       peak.name(), where, digits(peak.bytes.total())) +
           later + verdict + table.str() + (device ? device_section(*device, view) : "") +
           loading_section(r, view, device);
}

}  // namespace

std::string device_lines(const Figure& allocated, const std::vector<DeviceRow>& rows,
                         const Figure& reserved, Count device, Unit unit) {
    const auto line = [&](const std::string& what, Count bytes, const std::string& note) {
        return std::vector<std::string>{what, digits(bytes) + " B", amount(bytes, unit), note};
    };
    const auto add_rows = [&](TextTable& table, bool inside) {
        for (const DeviceRow& row : rows)
            if (row.in_allocator == inside)
                table.row(line("+ " + std::string(row.name), Count(row.count) * row.bytes,
                               fmt::format("{} x {}", row.count, amount(row.bytes, unit))));
    };
    TextTable table({Align::left, R, R, Align::left});
    table.row(line("allocated", allocated.bytes, allocated.note));
    add_rows(table, true);
    table.row(line("reserved", reserved.bytes, reserved.note));
    add_rows(table, false);
    table.row(line("device", device, "nvidia-smi -q's used and reserved"));
    return table.str();
}

std::string device_settings_text(const DeviceSettings& device, Unit unit) {
    const AllocatorConfig& a = device.allocator;
    return fmt::format(
        "{} allocator{}; {}",
        a.mode == AllocatorMode::expandable ? "expandable-segments" : "caching",
        a.max_split_size == std::numeric_limits<std::uint64_t>::max()
            ? ""
            : ", max split " + amount(Count(a.max_split_size), unit),
        device.gpu ? fmt::format("{}'s rows", device.gpu->gpu) : "no --gpu: each row's highest");
}

std::string report_table(const Report& r, const View& view) {
    return header(r) + "\n" + parameters_section(r) + "\n" + state_section(r, view) + "\n" +
           (r.settings.parallel.any() ? parallel_section(r, view) + "\n" : "") +
           activations_section(r, view, false) + "\n" + compute_section(r) + "\n" +
           timeline_section(r, view) + "\n" + peak_section(r, view) +
           (view.compare.empty() ? "" : "\n" + compare_table(r, view));
}

std::string per_layer_table(const Report& r, const View& view) {
    return header(r) + "\n" + activations_section(r, view, true);
}

std::string recompute_layers_text(const Parallelism& p) {
    if (!p.recompute_layers) return "";
    return fmt::format(" (first {} layers of each {})", *p.recompute_layers,
                       p.vpp > 1 ? "model chunk" : "stage");
}

std::string layout_text(const Parallelism& p) {
    std::string out = fmt::format("dp {}", p.dp);
    if (p.tp > 1) out += fmt::format(" tp {}{}", p.tp, p.sequence_parallel ? "+sp" : "");
    if (p.pp > 1) out += fmt::format(" pp {}{}", p.pp, p.vpp > 1 ? fmt::format("x{}", p.vpp) : "");
    const Schedule schedule = p.pipeline_schedule();  // "pp 4x2" says interleaved already
    if (p.pp > 1 && schedule != Schedule::one_f_one_b && schedule != Schedule::interleaved)
        out += fmt::format(" {}", schedule_name(schedule));
    if (p.first_stage_layers > 0) out += fmt::format(" first {}", p.first_stage_layers);
    if (p.last_stage_layers > 0) out += fmt::format(" last {}", p.last_stage_layers);
    if (p.cp > 1) out += fmt::format(" cp {}", p.cp);
    if (p.ep > 1) out += fmt::format(" ep {}", p.ep);
    if (p.etp != 0) out += fmt::format(" etp {}", p.etp);
    if (p.zero > 0) out += fmt::format(" ZeRO-{}", p.zero);
    if (p.offloads()) out += fmt::format(" offload {}", p.offload_mode().name());
    return out;
}

struct SweepTable::Rows {
    TextTable table{{L, L, R, R, L, L, R, R, R, L, R, R, R}, ""};
};

SweepTable::SweepTable(const View& view) : view_(view), rows_(std::make_unique<Rows>()) {
    std::vector<std::string> head = {"model",     "layout",    "seq",         "micro-batch",
                                     "attention", "recompute", "activations", "kept",
                                     "peak",      "peak step"};
    if (view.compare == "megatron")
        head.insert(head.end(), {"Megatron w+opt", "Megatron act", "Megatron total"});
    if (view.compare == "deepspeed")
        head.insert(head.end(), {"DeepSpeed GPU", "DeepSpeed host/node"});
    rows_->table.row(head);
}

SweepTable::~SweepTable() = default;

void SweepTable::add(const Report& r) {
    std::vector<std::string> row = {r.model.name,
                                    layout_text(r.settings.parallel),
                                    std::to_string(r.settings.seq),
                                    std::to_string(r.settings.micro_batch),
                                    attention_name(r.settings.framework.attention),
                                    recompute_name(r.settings.recompute),
                                    amount(r.activations, view_.unit),
                                    amount(r.kept_activations, view_.unit),
                                    amount(r.peak_step().bytes.total(), view_.unit),
                                    r.peak_step().name()};
    for (const auto& figure : compare_figures(r, view_)) row.push_back(amount(figure, view_.unit));
    rows_->table.row(row);
}

std::string SweepTable::str() const { return rows_->table.str(); }

}  // namespace memcalc::cli
