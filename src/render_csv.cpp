#include <fmt/compile.h>
#include <fmt/format.h>

#include "render.hpp"

namespace memcalc::cli {

std::string csv_header() {
    return "model,seq,micro_batch,recompute,recipe,activations,attention,parameters,state_bytes,activation_bytes,"
           "kept_activation_bytes,peak_bytes,peak_step,step_flops,recompute_flops,dp,tp,pp,cp,ep,zero,"
           "sequence_parallel,microbatches,peak_stage,peak_microbatch,grad_buffer,first_stage_layers,last_stage_layers\n";
}

std::string csv_row(const Report& r) {
    const Parallelism& p = r.settings.parallel;
    // Compiled at build time: a sweep formats a row per configuration.
    return fmt::format(FMT_COMPILE("{},{},{},{},{},{},{},{},{},{},{},{},{},{:.0f},{:.0f},{},{},{},{},{},{},{},{},{},{},{},{},{}\n"),
                       csv_field(r.model.name), r.settings.seq,
                       r.settings.micro_batch, recompute_name(r.settings.recompute), r.settings.recipe,
                       activation_model_name(r.settings.activations), attention_name(r.settings.attention),
                       r.parameter_count.value(), r.state.total().value(), r.activations.value(),
                       r.kept_activations.value(), r.peak_step().bytes.total().value(), r.peak_step().name(),
                       r.compute.step, r.compute.recompute, p.dp, p.tp, p.pp, p.cp, p.ep, p.zero,
                       p.sequence_parallel, p.steps_per_batch(), r.busiest().stage, r.peak_step().microbatch,
                       grad_buffer_name(r.settings.grad_buffer), p.first_stage_layers, p.last_stage_layers);
}

std::string per_layer_csv(const Report& r) {
    std::string out = "op,tensor,symbol,copies,bytes_per_element,elements,bytes,keep\n";
    for (const auto& t : r.layer.rows)
        out += fmt::format("{},{},{},{},{},{},{},{}\n", csv_field(t.op), csv_field(t.tensor), t.symbol, t.copies,
                           t.bytes_per_element, t.elements.value(), t.bytes.value(), keep_name(t.keep));
    return out;
}

std::string presets_csv(const std::vector<std::pair<std::string, ModelFile>>& presets) {
    std::string out = "name,parameters,published_parameters,description\n";
    for (const auto& [name, file] : presets)
        out += fmt::format("{},{},{},{}\n", name, parameter_table(file.architecture).total().value(),
                           file.published_parameters ? std::to_string(*file.published_parameters) : "",
                           csv_field(file.description));
    return out;
}

std::string recipes_csv() {
    std::string out = "name,weight_bytes,gradient_bytes,master_bytes,optimizer_bytes,activation_bytes,bytes_per_parameter\n";
    for (const auto& r : recipes)
        out += fmt::format("{},{},{},{},{},{},{}\n", r.name, r.weight_bytes, r.gradient_bytes, r.master_bytes,
                           r.optimizer_bytes, r.activation_bytes, r.bytes_per_parameter());
    return out;
}

}  // namespace memcalc::cli
