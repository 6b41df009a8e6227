// --compare: other tools' figures for the same configuration, beside memcalc's.
#include <fmt/format.h>

#include "memcalc/compare.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

/// How Megatron's most loaded shard is made up: parameters and bytes for each, experts apart.
std::string megatron_shard_note(const MegatronEstimate& e) {
    const double dense = e.tensor_parallel_parameters + e.replicated_parameters;
    if (e.expert_parameters > 0)
        return fmt::format(
            "  {:.4g} parameters on the most loaded shard x {:.4g} B each, and {:.4g} of routed "
            "experts\n"
            "  x {:.4g} B each (their optimiser state sharded over an expert-data-parallel group "
            "of {});\n",
            dense, e.bytes_per_parameter, e.expert_parameters, e.expert_bytes_per_parameter,
            e.expert_data_parallel);
    return fmt::format("  {:.4g} parameters on the most loaded shard x {:.4g} B each;\n", dense,
                       e.bytes_per_parameter);
}

/// memcalc's first pipeline stage, where Megatron puts its most loaded shard and its activations.
struct FirstStage {
    Count state, activations, peak;
    std::string step;
};

FirstStage first_stage(const Report& r) {
    const RankReport& k = r.ranks.front();
    const Breakdown& b = k.peak_step().bytes;
    return {k.state.total(),
            b.kept_activations + b.rebuilt_activations + b.logits + b.activation_gradient,
            b.total(), k.peak_step().name()};
}

}  // namespace

std::string compare_table(const Report& r, const View& view) {
    TextTable table({Align::left, Align::right, Align::right});
    if (view.compare == "megatron") {
        const MegatronEstimate e = megatron_estimate(r);
        const FirstStage m = first_stage(r);
        table.row({"", "Megatron-LM", "memcalc"});
        table.row({"weights and optimizer", amount(e.weight_and_optimizer_bytes(), view.unit),
                   amount(m.state, view.unit)});
        table.row({"activations", amount(e.activation_bytes(), view.unit),
                   amount(m.activations, view.unit)});
        table.row({"total", amount(e.total_bytes(), view.unit), amount(m.peak, view.unit)});
        return fmt::format(
                   "Compared with Megatron-LM's theoretical memory formula (first pipeline stage, "
                   "per device)\n") +
               table.str() + fmt::format("  Megatron-LM as on its {}:\n", megatron_follows) +
               megatron_shard_note(e) +
               fmt::format(
                   "  vocabulary padded to {}; activations by its {} formula.\n"
                   "  memcalc: the stage's state and, at its peak ({}), what else is live.\n",
                   digits(e.padded_vocab),
                   e.sequence_parallel_formula ? "sequence-parallel + selective (Table 2)"
                                               : "no-SP (10 + 24/t) sbh per layer, x 1.05",
                   m.step);
    }
    const DeepSpeedEstimate e = deepspeed_estimate(r, view.gpus_per_node);
    const RankReport& k = r.busiest();
    const std::uint64_t per_node = std::min(view.gpus_per_node, r.settings.parallel.devices());
    table.row({"", "DeepSpeed", "memcalc"});
    table.row({"per GPU: weights, gradients, optimizer", amount(e.gpu, view.unit),
               amount(k.state.total(), view.unit)});
    table.row(
        {"host memory per node", amount(e.cpu, view.unit), amount(k.host * per_node, view.unit)});
    return fmt::format(
               "Compared with DeepSpeed's ZeRO-{} model-state estimator ({} GPUs per node)\n",
               e.stage, per_node) +
           table.str() + fmt::format("  DeepSpeed as on its {}:\n", deepspeed_follows) +
           (e.stage == 3 ? fmt::format("  4 B x the largest module ({} parameters) per GPU; ",
                                       digits(e.largest_layer))
                         : std::string("  ")) +
           "host memory includes its 1.5 x buffer factor.\n";
}

std::vector<Count> compare_figures(const Report& r, const View& view) {
    if (view.compare == "megatron") {
        const MegatronEstimate e = megatron_estimate(r);
        return {e.weight_and_optimizer_bytes(), e.activation_bytes(), e.total_bytes()};
    }
    if (view.compare == "deepspeed") {
        const DeepSpeedEstimate e = deepspeed_estimate(r, view.gpus_per_node);
        return {e.gpu, e.cpu};
    }
    return {};
}

nlohmann::json compare_json(const Report& r, const View& view) {
    if (view.compare == "megatron") {
        const MegatronEstimate e = megatron_estimate(r);
        const FirstStage m = first_stage(r);
        return {{"tool", "megatron"},
                {"megatron",
                 {{"follows", fmt::format("Megatron-LM {}", megatron_follows)},
                  {"parameters_on_most_loaded_shard", e.parameters_on_most_loaded_shard()},
                  {"tensor_parallel_parameters", e.tensor_parallel_parameters},
                  {"replicated_parameters", e.replicated_parameters},
                  {"expert_parameters", e.expert_parameters},
                  {"bytes_per_parameter", e.bytes_per_parameter},
                  {"expert_bytes_per_parameter", e.expert_bytes_per_parameter},
                  {"expert_data_parallel_size", e.expert_data_parallel},
                  {"padded_vocab", e.padded_vocab},
                  {"weight_and_optimizer_bytes", e.weight_and_optimizer_bytes()},
                  {"activation_bytes", e.activation_bytes()},
                  {"total_bytes", e.total_bytes()},
                  {"formula",
                   e.sequence_parallel_formula ? "sequence_parallel_selective" : "without_sp"}}},
                {"memcalc",
                 {{"stage", 0},
                  {"state_bytes", m.state.value()},
                  {"activation_bytes", m.activations.value()},
                  {"peak_bytes", m.peak.value()},
                  {"peak_step", m.step}}}};
    }
    const DeepSpeedEstimate e = deepspeed_estimate(r, view.gpus_per_node);
    return {{"tool", "deepspeed"},
            {"deepspeed",
             {{"follows", fmt::format("DeepSpeed {}", deepspeed_follows)},
              {"zero_stage", e.stage},
              {"gpu_bytes", e.gpu},
              {"cpu_bytes", e.cpu},
              {"largest_layer", e.largest_layer}}},
            {"memcalc",
             {{"state_bytes", r.busiest().state.total().value()},
              {"host_bytes", r.busiest().host.value()}}}};
}

}  // namespace memcalc::cli
