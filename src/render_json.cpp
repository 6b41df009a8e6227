#include "memcalc/version.hpp"
#include "render.hpp"
#include <limits>
#include <type_traits>

#include "memcalc/program_facts.hpp"

namespace memcalc::cli {
namespace {

using nlohmann::json;

json number_or_null(std::optional<std::uint64_t> n) { return n ? json(*n) : json(nullptr); }

const char* mlp_name(Mlp m) { return m == Mlp::gated ? "gated" : "plain"; }
const char* norm_name(Norm n) { return n == Norm::rmsnorm ? "rmsnorm" : "layernorm"; }
const char* bias_name(Bias b) {
    switch (b) {
        case Bias::none: return "none";
        case Bias::qkv: return "qkv";
        case Bias::attention: return "attention";
        case Bias::all: return "all";
    }
    return "?";
}
const char* position_name(Position p) {
    return p == Position::rotary ? "rotary" : p == Position::learned ? "learned" : "none";
}

void add_mla_and_mamba_json(json& out, const Architecture& m);
void add_layer_kinds_json(json& out, const Architecture& m);

json model_json(const Architecture& m) {
    json out = {{"name", m.name},
                {"hidden", m.hidden},
                {"layers", m.layers},
                {"heads", m.heads},
                {"kv_heads", m.key_value_heads()},
                {"head_dim", m.head_size()},
                {"ffn", m.ffn},
                {"vocab", m.vocab},
                {"max_positions", m.max_positions},
                {"mlp", mlp_name(m.mlp)},
                {"norm", norm_name(m.norm)},
                {"bias", bias_name(m.bias)},
                {"position", position_name(m.position)},
                {"tied_embeddings", m.tied_embeddings},
                {"experts", m.experts},
                {"experts_per_token", m.is_moe() ? m.active_experts() : 0},
                {"position_rows", m.position == Position::learned ? m.learned_positions() : 0},
                {"activation", std::string(activation_function(m.activation).name)},
                {"norms_per_layer", m.norms_per_layer},
                {"parallel_attention", m.parallel_attention},
                {"embedding_norm", m.embedding_norm},
                {"attention_dropout", m.attention_dropout},
                {"hidden_dropout", m.hidden_dropout},
                {"mlp_dropout", m.mlp_dropout},
                {"head_bias", m.head_bias},
                {"qk_norm", qk_norm_name(m.qk_norm)},
                {"norm_position", norm_position_name(m.norm_position)},
                {"attention_sinks", m.attention_sinks},
                {"window", m.window},
                {"shared_ffn", m.shared_ffn},
                {"shared_expert_gate", m.shared_expert_gate},
                {"router_bias", router_bias_name(m.router_bias)},
                {"renormalize_topk", m.renormalize_topk},
                {"attention_chunk", m.attention_chunk},
                {"attention_temperature", m.attention_temperature},
                {"router", router_name(m.router)},
                {"input_jitter", m.input_jitter},
                {"mtp_layers", m.mtp_layers}};
    for_each_program_fact([&](const auto& row) {  // a flag as a boolean, any other by its name
        using Value = std::decay_t<decltype(row.values[0])>;
        if constexpr (std::is_same_v<Value, bool>)
            out[std::string(row.key)] = m.*row.member;
        else
            out[std::string(row.key)] = row.name(m.*row.member);
    });
    add_mla_and_mamba_json(out, m);
    if (!m.layer_kinds.empty()) add_layer_kinds_json(out, m);
    if (m.vision.enabled()) {  // appended where the model has one, as a model file gives it
        json& v = out["vision"];
        for (const auto& f : vision_counts) v[std::string(f.key)] = m.vision.*f.member;
        for (const auto& f : vision_flags) v[std::string(f.key)] = m.vision.*f.member;
    }
    return out;
}

/// Latent attention's and the Mamba mixer's keys, where the model has them.
void add_mla_and_mamba_json(json& out, const Architecture& m) {
    if (m.mla.enabled())
        for (auto [key, value] : {std::pair{"q_lora_rank", m.mla.q_lora_rank},
                                  {"kv_lora_rank", m.mla.kv_lora_rank},
                                  {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                                  {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                                  {"v_head_dim", m.mla.v_head_dim}})
            out[key] = value;
    if (m.mla.indexed())  // appended: the keys before stay as they were
        for (auto [key, value] : {std::pair{"index_n_heads", m.mla.index_heads},
                                  {"index_head_dim", m.mla.index_head_dim},
                                  {"index_topk", m.mla.index_topk}})
            out[key] = value;
    if (m.attention_output_gate) out["attention_output_gate"] = true;  // only where set
    if (m.embedding_rows != 0) out["embedding_rows"] = m.embedding_rows;
    if (m.ssm.enabled()) {  // appended: the keys before stay as they were
        out["mixer"] = mixer_name(m.mixer);
        for (auto [key, value] : {std::pair{"mamba_inner", m.ssm.d_inner},
                                  {"mamba_state", m.ssm.d_state},
                                  {"mamba_conv", m.ssm.d_conv},
                                  {"mamba_dt_rank", m.ssm.dt_rank}})
            out[key] = value;
        for (auto [key, value] : {std::pair{"mamba_conv_bias", m.ssm.conv_bias},
                                  {"mamba_proj_bias", m.ssm.proj_bias},
                                  {"mamba_inner_norms", m.ssm.inner_norms},
                                  {"mamba_kernels", m.ssm.kernels}})
            out[key] = value;
        if (m.ssm.heads > 0)  // Mamba-2's widths
            for (auto [key, value] : {std::pair{"mamba_heads", m.ssm.heads},
                                      {"mamba_groups", m.ssm.groups},
                                      {"mamba_chunk", m.ssm.chunk}})
                out[key] = value;
        if (!m.ssm.gated_norm) out["mamba_gated_norm"] = false;  // only where unset
    }
}

/// "layer_kinds" and "layer_pattern", as a model file gives them.
void add_layer_kinds_json(json& out, const Architecture& m) {
    const auto given = [](const std::optional<std::uint64_t>& v) {
        return v ? json(*v) : json(nullptr);
    };
    json kinds = json::array(), pattern = json::array();
    for (const auto& k : m.layer_kinds)
        kinds.push_back(
            {{"name", k.name},
             {"ffn", given(k.ffn)},
             {"experts", given(k.experts)},
             {"experts_per_token", given(k.experts_per_token)},
             {"shared_ffn", given(k.shared_ffn)},
             {"shared_expert_gate",
              k.shared_expert_gate ? json(*k.shared_expert_gate) : json(nullptr)},
             {"router_bias",
              k.router_bias ? json(router_bias_name(*k.router_bias)) : json(nullptr)},
             {"window", given(k.window)},
             {"attention_chunk", given(k.attention_chunk)},
             {"position", k.position ? json(position_name(*k.position)) : json(nullptr)},
             {"qk_norm", k.qk_norm ? json(qk_norm_name(*k.qk_norm)) : json(nullptr)},
             {"mixer", k.mixer ? json(mixer_name(*k.mixer)) : json(nullptr)},
             {"has_mlp", k.has_mlp ? json(*k.has_mlp) : json(nullptr)}});
    for (const auto& run : m.layer_pattern)
        pattern.push_back({{"kind", m.layer_kinds[run.kind].name}, {"layers", run.count}});
    out["layer_kinds"] = kinds;
    out["layer_pattern"] = pattern;
}

json breakdown_json(const Breakdown& b) {
    json out = json::object();
    for (const auto& c : categories) out[c.key] = (b.*c.member).value();
    return out;
}

json parameters_json(const Report& r) {
    const ParameterTable& t = *r.parameters;
    const bool mixed = t.kinds > 1;
    json tensors = json::array();
    for (const auto& row : t.rows) {
        json tensor = {
            {"part", part_name(row.part)},
            {"tensor", row.tensor},
            {"shape", row.shape},
            {"dims", row.dims},
            {"count", row.count.value()},
            {"per_layer", row.group == Group::layer},
            {"trainable", row.trainable},
            {"storage", row.storage ? json(dtype_name(row.storage->dtype)) : json(nullptr)}};
        if (mixed && row.group == Group::layer) tensor["kind"] = r.model.layer_kinds[row.kind].name;
        tensors.push_back(std::move(tensor));
    }
    // One layer of `kind`, by part.
    const auto one_layer = [&](std::size_t kind) {
        const auto part = [&](Part p) {
            Count n;
            for (const auto& row : t.rows)
                if (row.group == Group::layer && row.kind == kind && row.part == p) n += row.count;
            return n.value();
        };
        return json{{"attention", part(Part::attention)},
                    {"mlp", part(Part::mlp)},
                    {"router", part(Part::router)},
                    {"norms", part(Part::norms)},
                    {"total", t.per_layer(kind).value()}};
    };
    json out = {
        {"total", r.parameter_count.value()},
        {"trainable", trainable_parameters(t).value()},
        {"layers", t.layers},
        {"embedding", t.part(Part::embedding).value()},
        {"per_layer", mixed ? json(nullptr) : one_layer(0)},  // layers differ: see layer_kinds
        {"final_norm", t.part(Part::final_norm).value()},
        {"head", t.part(Part::head).value()},
        {"tensors", tensors}};
    if (r.model.vision.enabled()) out["vision"] = t.part(Part::vision).value();
    if (mixed) {
        json kinds = json::array();
        for (std::size_t k = 0; k < t.kinds; ++k) {
            json kind = one_layer(k);
            kind["name"] = r.model.layer_kinds[k].name;
            kind["layers"] = t.kind_layers[k];
            kinds.push_back(std::move(kind));
        }
        out["layer_kinds"] = kinds;
    }
    return out;
}

json tensors_json(const std::vector<SavedTensor>& rows, Recompute mode) {
    json tensors = json::array();
    for (const auto& t : rows) {
        tensors.push_back({{"op", t.op},
                           {"tensor", t.tensor},
                           {"why", t.why},
                           {"symbol", t.symbol},
                           {"copies", t.copies},
                           {"bytes_per_element", t.bytes_per_element},
                           {"elements", t.elements.value()},
                           {"bytes", t.bytes.value()},
                           {"keep", keep_name(t.keep)},
                           {"kept", t.kept(mode)}});
    }
    return tensors;
}

}  // namespace

json parallel_json(const Parallelism& p) {
    return {{"devices", p.devices()},
            {"dp", p.dp},
            {"tp", p.tp},
            {"pp", p.pp},
            {"cp", p.cp},
            {"ep", p.ep},
            {"etp", p.expert_tp()},
            {"vpp", p.vpp},
            {"sequence_parallel", p.sequence_parallel},
            {"zero", p.zero},
            {"offload", p.offload_mode().name()},
            {"shard_group", p.sharding()},
            {"microbatches", p.steps_per_batch()},
            {"first_stage_layers", p.first_stage_layers},
            {"last_stage_layers", p.last_stage_layers},
            {"schedule", schedule_name(p.pipeline_schedule())},
            {"parameter_copies", schedule_row(p).parameter_copies}};
}

/// Each pipeline stage's device: its state, peak and (where modelled) reserved and device figures.
json ranks_json(const Report& r, const std::vector<DeviceFigures>& devices) {
    json ranks = json::array();
    // A stage's figure `what` (of its DeviceFigures), null where none is modelled.
    const auto figure = [&](std::uint64_t stage, auto what) {
        for (const DeviceFigures& d : devices)
            if (d.stage == stage) return json(what(d).value());
        return json(nullptr);
    };
    const auto reserved = [](const DeviceFigures& d) { return d.reserved.bytes; };
    const auto device = [](const DeviceFigures& d) { return d.bytes; };
    const auto high = [](const DeviceFigures& d) { return d.high_bytes; };
    for (const auto& k : r.ranks)
        ranks.push_back({{"stage", k.stage},
                         {"layers", k.layer_ids},
                         {"holds_embedding", k.holds_embedding},
                         {"holds_head", k.holds_head},
                         {"in_flight", k.in_flight},
                         {"host_bytes", k.host.value()},
                         {"parameters", k.parameters.value()},
                         {"state",
                          {{"bytes", k.state.total().value()},
                           {"weights", k.state.weights.value()},
                           {"gradients", k.state.gradients.value()},
                           {"master_weights", k.state.master_weights.value()},
                           {"optimizer_state", k.state.optimizer_state.value()}}},
                         {"peak",
                          {{"bytes", k.peak_step().bytes.total().value()},
                           {"step", k.peak_step().name()},
                           {"microbatch", k.peak_step().microbatch},
                           {"by_category", breakdown_json(k.peak_step().bytes)},
                           {"reserved_bytes", figure(k.stage, reserved)},
                           {"device_bytes", figure(k.stage, device)},
                           {"device_high_bytes", figure(k.stage, high)}}}});
    return ranks;
}

namespace {

/// One layer's saved tensors (and, in the architecture model, its workspaces), under `mode`.
void layer_json(json& out, const LayerActivations& layer, Recompute mode, bool workspaces) {
    out["formula"] = layer_formula(layer);
    out["layer_bytes"] = layer.total().value();
    out["kept_layer_bytes"] = layer.kept(mode).value();
    out["rebuilt_layer_bytes"] = layer.rebuilt(mode).value();
    out["layer_input_bytes"] = layer.input_bytes.value();
    out["tensors"] = tensors_json(layer.rows, mode);
    if (mode == Recompute::op) {  // only then, so that the other modes' JSON stays as it was
        out["policy_output_tensors"] = tensors_json(layer.policy_output_rows(), mode);
    }
    if (!workspaces) return;
    json work = json::array();
    const std::vector<WorkspaceSum> sums = tape::workspace_sums(layer, mode);
    const std::vector<Linear> written = layer.gradients_by_op();
    for (std::size_t i = 0; i < layer.work.size(); ++i) {
        const Workspace& w = layer.work[i];
        const WorkspaceSum& sum = sums[i];
        work.push_back(
            {{"phase", w.backward ? "backward" : "forward"},
             {"op", w.op},
             {"tensor", w.tensor},
             {"formula", w.formula},
             {"bytes", w.bytes.value()},
             {"absent_bytes", sum.covered.value()},
             {"adds_bytes", sum.adds().value()},
             {"gradients_from", linear_row(written[i]).tensor},
             {"stream_beside_bytes", layer.beside_bytes(i, mode, Holder::caller).value()}});
    }
    out["workspaces"] = work;
}

}  // namespace

json per_layer_json(const Report& r) {
    const Recompute mode = r.settings.recompute;
    const bool architecture = r.settings.activations == ActivationModel::architecture;
    json out = {{"model", activation_model_name(r.settings.activations)},
                {"attention", attention_name(r.settings.framework.attention)},
                {"bytes", r.activations.value()},
                {"kept_bytes", r.kept_activations.value()}};
    if (r.parameters->kinds == 1) {
        layer_json(out, r.layer, mode, architecture);
    } else {  // one entry per kind of layer, each with its layers' count
        json kinds = json::array();
        for (std::size_t k = 0; k < r.parameters->kinds; ++k) {
            json kind = {{"name", r.model.layer_kinds[k].name},
                         {"layers", r.parameters->kind_layers[k]}};
            layer_json(kind, r.layer_of(k), mode, architecture);
            kinds.push_back(std::move(kind));
        }
        out["layer_kinds"] = kinds;
    }
    if (architecture) {
        out["input_side_bytes"] = saved_bytes(r.input_side).value();
        out["input_side_tensors"] = tensors_json(r.input_side, Recompute::none);
        out["head_bytes"] = saved_bytes(r.head).value();
        out["head_tensors"] = tensors_json(r.head, Recompute::none);
        out["forward_buffer_bytes"] = saved_bytes(r.forward_buffers).value();
        out["forward_buffer_tensors"] = tensors_json(r.forward_buffers, Recompute::none);
    }
    return out;
}

namespace {

/// One layer of each kind's kernel launches, one micro-batch (LayerLaunches): its matrix
/// products' and its other ops', forward and backward, and the forward kernels its recomputation
/// reruns.
json layer_launches_json(const Report& r) {
    json kinds = json::array();
    for (std::size_t k = 0; k < r.parameters->kinds; ++k) {
        const LayerLaunches l =
            layer_launches(r.layer_of(k), r.settings.recompute, *r.parameters, k);
        kinds.push_back({{"matmul_forward", l.matmuls.forward},
                         {"matmul_backward", l.matmuls.backward},
                         {"other_forward", l.other.forward},
                         {"other_backward", l.other.backward},
                         {"rerun", l.rerun_matmuls + l.rerun_other}});
    }
    return kinds;
}

/// The report's "settings": what was estimated.
json settings_json(const Report& r) {
    json settings = {{"seq", r.settings.seq},
                     {"micro_batch", r.settings.micro_batch},
                     {"recompute", recompute_name(r.settings.recompute)},
                     {"recipe", r.settings.recipe.name},
                     {"activations", activation_model_name(r.settings.activations)},
                     {"parallel", parallel_json(r.settings.parallel)}};
    // pp did not divide the layers and neither end was given: the split is memcalc's assumption.
    settings["parallel"]["stage_split_assumed"] = r.stage_split_assumed;
    for_each_switch([&](const auto& row) {
        settings[std::string(row.key)] = row.name(r.settings.framework.*row.member);
    });
    const Framework& framework = r.settings.framework;
    settings["expert_imbalance"] =
        r.model.any_moe() ? json(r.model.expert_imbalance) : json(nullptr);
    const bool by_tokens = chunked_loss(framework.loss) && framework.loss_chunk_tokens > 0;
    settings["loss_chunks"] =
        chunks_by_count(framework.loss) && !by_tokens ? json(framework.loss_chunks) : json(nullptr);
    settings["loss_chunk_tokens"] = by_tokens ? json(framework.loss_chunk_tokens) : json(nullptr);
    settings["cublas_workspace_bytes"] =
        framework.cublas_workspace ? json(*framework.cublas_workspace) : json(nullptr);
    if (!r.settings.recompute_modules.is_default())
        settings["recompute_modules"] = r.settings.recompute_modules.names();
    // Partial recomputation: layers recomputed per stage (per chunk with vpp); null: every layer.
    const auto& partial = r.settings.parallel.recompute_layers;
    settings["recompute_layers"] = partial ? json(*partial) : json(nullptr);
    const FineTuning& f = r.settings.tuning;
    json training = {{"mode", training_name(f.mode)}};
    if (f.mode == Training::frozen) training["frozen"] = f.frozen;
    if (training_row(f.mode).prompt)
        training["prompt"] = {{"tokens", f.prompt.tokens}, {"start_layer", f.prompt.start_layer}};
    if (training_row(f.mode).adapters)
        training["lora"] = {{"rank", f.lora.rank},
                            {"targets", f.lora.targets},
                            {"dropout", f.lora.dropout},
                            {"fp32_adapters", f.lora.fp32},
                            {"variant", lora_variant_row(f.lora.variant).name}};
    if (training_row(f.mode).quantized_base) {
        const Storage base = f.base();
        training["base_storage"] = {
            {"dtype", dtype_name(base.dtype)},
            {"block", base.block},
            {"scale", dtype_name(base.scale)},
            {"scale_block", base.scale_block},
            {"scale_scale", dtype_name(base.scale_scale)},
            {"quantized_from",
             base.quantized_from ? json(dtype_name(*base.quantized_from)) : json(nullptr)}};
        const QuantizedLinears& q = f.quantized;
        training["quantization"] = {
            {"quantizer", quantizer_row(q.quantizer).name},
            {"bitsandbytes_version", bitsandbytes_version_name(q.bitsandbytes)},
            {"double_quant", q.double_quant},
            {"head", q.head()},
            {"keeps_input", q.keeps_input()}};
    }
    settings["training"] = training;
    return settings;
}

}  // namespace

namespace {

/// The device the peak was checked against (null without one), and the verdict: `fits`,
/// `spare_bytes` (negative when over), null without a device.
json device_json(const View& view) {
    if (!view.device_memory) return nullptr;
    const DeviceFit rule{*view.device_memory, view.reserve};
    return {{"memory_bytes", rule.memory.value()},
            {"reserve_bytes", rule.reserve.value()},
            {"usable_bytes", rule.usable().value()}};
}

void add_verdict(json& peak, Count bytes, const View& view) {
    if (!view.device_memory) {
        peak["fits"] = nullptr, peak["spare_bytes"] = nullptr;
        return;
    }
    const DeviceFit rule{*view.device_memory, view.reserve};
    peak["fits"] = rule.fits(bytes), peak["spare_bytes"] = rule.spare(bytes);
}

/// The reserved and device figures beside the allocated peak (null where none is modelled: a
/// sweep, the CPU platform).
void add_device_figures(json& peak, const std::optional<DeviceFigures>& d, const View& view) {
    if (!d) {
        peak["reserved_bytes"] = nullptr, peak["device_bytes"] = nullptr;
        peak["outside"] = nullptr, peak["reserved"] = nullptr, peak["device_band"] = nullptr;
        return;
    }
    const ReservedPeak& res = d->reserved;
    peak["reserved_bytes"] = res.bytes.value();
    peak["device_bytes"] = d->bytes.value();
    peak["outside"] = device_rows_json(d->rows);
    peak["reserved"] = {{"stage", d->stage},
                        {"step", res.at.name()},
                        {"training_step", res.iteration},
                        {"first_step_bytes", res.first_step_bytes.value()},
                        {"high_bytes", res.high_bytes.value()},
                        {"allocated_bytes", res.allocated_bytes.value()},
                        {"loaded_allocated_bytes", res.loaded_allocated_bytes.value()},
                        {"loaded_bytes", res.loaded_bytes.value()},
                        {"segments", res.segments},
                        {"simulated", res.simulated}};
    peak["reserved"].update(device_settings_json(view.device));
    peak["device_band"] = {{"low_bytes", d->low_bytes.value()},
                           {"high_bytes", d->high_bytes.value()}};
}

}  // namespace

namespace {
/// The loading peak of the rank that peaks highest while loading (loading.hpp).
json loading_json(const LoadingView& l) {
    const LoadingMethod& m = *l.peak.method;
    return {{"method", m.name},
            {"description", m.description},
            {"source", m.source},
            {"device_bytes", l.peak.device_bytes.value()},
            {"device_high_bytes", l.device_high.value()},
            {"host_bytes_per_node", l.peak.host_bytes_per_node.value()},
            {"above_step", l.peak.above_step},
            {"fits", l.fits ? json(*l.fits) : json(nullptr)}};
}
}  // namespace

json device_rows_json(const std::vector<DeviceRow>& rows) {
    json out = json::array();
    for (const DeviceRow& row : rows)
        out.push_back({{"name", row.name},
                       {"in_allocator", row.in_allocator},
                       {"count", row.count},
                       {"bytes", row.bytes.value()},
                       {"low_bytes", row.low_bytes.value()},
                       {"high_bytes", row.high_bytes.value()},
                       {"why", row.why},
                       {"source", row.source}});
    return out;
}

json device_settings_json(const DeviceSettings& device) {
    const AllocatorConfig& a = device.allocator;
    return {{"allocator", a.mode == AllocatorMode::expandable ? "expandable" : "caching"},
            {"max_split_size_bytes", a.max_split_size == std::numeric_limits<std::uint64_t>::max()
                                         ? json(nullptr)
                                         : json(a.max_split_size)},
            {"gpu", device.gpu ? json(std::string(device.gpu->gpu)) : json(nullptr)}};
}

json report_json(const Report& r, const View& view) {
    json timeline = json::array();
    for (const auto& step : r.timeline())
        timeline.push_back({{"step", step.name()},
                            {"microbatch", step.microbatch},
                            {"bytes", step.bytes.total().value()},
                            {"by_category", breakdown_json(step.bytes)}});
    const Step& peak = r.peak_step();
    json peak_json = {{"step", peak.name()},
                      {"bytes", peak.bytes.total().value()},
                      {"stage", r.busiest().stage},
                      {"microbatch", peak.microbatch},
                      {"by_category", breakdown_json(peak.bytes)}};
    const std::vector<DeviceFigures> devices = every_device(r, view);
    const std::optional<DeviceFigures> device =
        devices.empty() ? std::nullopt : std::optional<DeviceFigures>(devices.front());
    add_device_figures(peak_json, device, view);
    add_verdict(peak_json, verdict_peak(r, device), view);
    return {
        {"memcalc", memcalc::version},
        {"schema", memcalc::json_schema},
        {"model", model_json(r.model)},
        {"settings", settings_json(r)},
        {"compare", view.compare.empty() ? json(nullptr) : compare_json(r, view)},
        {"parameters", parameters_json(r)},
        {"state",
         {{"bytes", r.state.total().value()},
          // null where the optimiser's state is counted tensor by tensor (optimizer_rule says how)
          {"bytes_per_parameter", number_or_null(r.settings.recipe.bytes_per_parameter())},
          {"zero_k", number_or_null(r.settings.recipe.zero_k())},
          {"optimizer_rule", r.settings.recipe.optimizer.rule.empty()
                                 ? json(nullptr)
                                 : json(std::string(r.settings.recipe.optimizer.rule))},
          {"weights", r.state.weights.value()},
          {"gradients", r.state.gradients.value()},
          {"master_weights", r.state.master_weights.value()},
          {"optimizer_state", r.state.optimizer_state.value()}}},
        {"activations", per_layer_json(r)},
        {"compute",
         {{"step_flops", r.compute.step},
          {"recompute_flops", r.compute.recompute},
          {"recompute_fraction", r.compute.recompute_fraction()},
          {"layer_launches", layer_launches_json(r)}}},
        {"timeline", timeline},
        {"ranks", ranks_json(r, devices)},
        {"device", device_json(view)},
        {"loading", loading_json(loading_view(r, view, device))},
        {"peak", peak_json}};
}

}  // namespace memcalc::cli
