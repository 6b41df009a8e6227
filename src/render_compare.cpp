// --compare: other tools' figures for the same configuration, beside memcalc's.
#include <fmt/format.h>

#include <cmath>

#include "memcalc/compare.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

Count rounded(double bytes) { return Count(static_cast<std::uint64_t>(std::llround(bytes))); }

/// memcalc's first pipeline stage, where Megatron puts its most loaded shard and its activations.
struct FirstStage {
    Count state, activations, peak;
    std::string step;
};

FirstStage first_stage(const Report& r) {
    const RankReport& k = r.ranks.front();
    const Breakdown& b = k.peak_step().bytes;
    return {k.state.total(), b.kept_activations + b.rebuilt_activations + b.logits + b.activation_gradient,
            b.total(), k.peak_step().name()};
}

}  // namespace

std::string compare_table(const Report& r, const View& view) {
    TextTable table({Align::left, Align::right, Align::right});
    if (view.compare == "megatron") {
        const MegatronEstimate e = megatron_estimate(r);
        const FirstStage m = first_stage(r);
        table.row({"", "Megatron-LM", "memcalc"});
        table.row({"weights and optimizer", amount(rounded(e.weight_and_optimizer), view.unit), amount(m.state, view.unit)});
        table.row({"activations", amount(rounded(e.activations), view.unit), amount(m.activations, view.unit)});
        table.row({"total", amount(rounded(e.total()), view.unit), amount(m.peak, view.unit)});
        return fmt::format("Compared with Megatron-LM's theoretical memory formula (first pipeline stage, per device)\n") +
               table.str() +
               fmt::format("  Megatron: {:.4g} parameters on the most loaded shard x {:.4g} B each; vocabulary padded to {};\n"
                           "  activations by its {} formula. memcalc: the stage's state and, at its peak ({}), what else is live.\n",
                           e.parameters_on_most_loaded_shard, e.bytes_per_parameter, digits(e.padded_vocab),
                           e.sequence_parallel_formula ? "sequence-parallel + selective (Table 2)"
                                                       : "no-SP (10 + 24/t) sbh per layer, x 1.05",
                           m.step);
    }
    const DeepSpeedEstimate e = deepspeed_estimate(r, view.gpus_per_node);
    const RankReport& k = r.busiest();
    const std::uint64_t per_node = std::min(view.gpus_per_node, r.settings.parallel.devices());
    table.row({"", "DeepSpeed", "memcalc"});
    table.row({"per GPU: weights, gradients, optimizer", amount(rounded(e.gpu), view.unit), amount(k.state.total(), view.unit)});
    table.row({"host memory per node", amount(rounded(e.cpu), view.unit), amount(k.host * per_node, view.unit)});
    return fmt::format("Compared with DeepSpeed's ZeRO-{} model-state estimator ({} GPUs per node)\n", e.stage, per_node) +
           table.str() +
           (e.stage == 3 ? fmt::format("  DeepSpeed adds 4 B x the largest module ({} parameters) per GPU; ", digits(e.largest_layer))
                         : std::string("  ")) +
           "host memory includes its 1.5 x buffer factor.\n";
}

std::vector<Count> compare_figures(const Report& r, const View& view) {
    if (view.compare == "megatron") {
        const MegatronEstimate e = megatron_estimate(r);
        return {rounded(e.weight_and_optimizer), rounded(e.activations), rounded(e.total())};
    }
    if (view.compare == "deepspeed") {
        const DeepSpeedEstimate e = deepspeed_estimate(r, view.gpus_per_node);
        return {rounded(e.gpu), rounded(e.cpu)};
    }
    return {};
}

nlohmann::json compare_json(const Report& r, const View& view) {
    if (view.compare == "megatron") {
        const MegatronEstimate e = megatron_estimate(r);
        const FirstStage m = first_stage(r);
        return {{"tool", "megatron"},
                {"megatron",
                 {{"parameters_on_most_loaded_shard", e.parameters_on_most_loaded_shard},
                  {"bytes_per_parameter", e.bytes_per_parameter},
                  {"padded_vocab", e.padded_vocab},
                  {"weight_and_optimizer_bytes", e.weight_and_optimizer},
                  {"activation_bytes", e.activations},
                  {"total_bytes", e.total()},
                  {"formula", e.sequence_parallel_formula ? "sequence_parallel_selective" : "without_sp"}}},
                {"memcalc",
                 {{"stage", 0},
                  {"state_bytes", m.state.value()},
                  {"activation_bytes", m.activations.value()},
                  {"peak_bytes", m.peak.value()},
                  {"peak_step", m.step}}}};
    }
    const DeepSpeedEstimate e = deepspeed_estimate(r, view.gpus_per_node);
    return {{"tool", "deepspeed"},
            {"deepspeed", {{"zero_stage", e.stage}, {"gpu_bytes", e.gpu}, {"cpu_bytes", e.cpu}, {"largest_layer", e.largest_layer}}},
            {"memcalc", {{"state_bytes", r.busiest().state.total().value()}, {"host_bytes", r.busiest().host.value()}}}};
}

}  // namespace memcalc::cli
