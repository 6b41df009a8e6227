// memcalc serve: the memory of serving a model: weights in a storage format, the KV cache, prefill.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "arguments.hpp"
#include "commands.hpp"
#include "memcalc/memcalc.hpp"
#include "render.hpp"
#include "text_table.hpp"

namespace memcalc::cli {
namespace {

using Align = TextTable::Align;

DType kv_dtype_named(const std::string& text) {
    if (text.empty()) return DType::bf16;
    for (DType d : {DType::bf16, DType::fp16, DType::fp8_e4m3, DType::fp8_e5m2, DType::fp32})
        if (text == dtype_name(d) || (text == "fp8" && d == DType::fp8_e4m3)) return d;
    throw usage_error(fmt::format(
        "--kv-dtype must be bf16, fp16, fp8 (e4m3), fp8-e5m2 or fp32 (got '{}')", text));
}

const WeightFormat& weight_format_named(const std::string& text) {
    if (const WeightFormat* f = weight_format(text)) return *f;
    std::string names;
    for (const auto& f : weight_formats) names += (names.empty() ? "" : ", ") + std::string(f.name);
    throw usage_error(fmt::format("--weights must be one of {} (got '{}')", names, text));
}

struct ServeRun {
    std::string model;
    Count model_parameters;
    std::uint64_t layers = 0;
    ServeSettings settings;
    ServeReport report;
    DeviceSettings device_settings;                  ///< the allocator's and the GPU's
    ServeDevice figures;                             ///< allocated, reserved and device
    std::optional<Count> memory, reserve, capacity;  ///< with a device
    std::string device;
    std::optional<ServeFit> fit;
    std::optional<EngineBudget> engine;  ///< with --engine
    std::optional<ModelFile> draft;      ///< with --draft-preset or --draft-config
};

/// What the device shows: the rows inside the allocator, reserved, the rows outside, device.
std::string device_section(const ServeRun& r, Unit unit) {
    const ServeDevice& d = r.figures;
    return fmt::format("\nOn the device ({}):\n", device_settings_text(r.device_settings, unit)) +
           device_lines({d.allocated, "the peak (above)"}, d.rows,
                        {d.reserved, "at the prefill, the cache made"}, d.bytes, unit) +
           fmt::format(
               "  band {} to {}: the rows' ends; once the weights are loaded the "
               "allocator reserves {}\n",
               amount(d.low_bytes, unit), amount(d.high_bytes, unit), amount(d.loaded_bytes, unit));
}

/// The three figures: allocated (`bytes`), reserved and device, with the band and the rows.
nlohmann::json peak_json(const ServeRun& r) {
    const ServeDevice& d = r.figures;
    nlohmann::json reserved = {{"loaded_bytes", d.loaded_bytes.value()},
                               {"high_bytes", d.reserved_high.value()},
                               {"segments", d.segments},
                               {"simulated", d.simulated}};
    reserved.update(device_settings_json(r.device_settings));
    return {
        {"bytes", r.report.peak().value()},
        {"reserved_bytes", d.reserved.value()},
        {"device_bytes", d.bytes.value()},
        {"device_band", {{"low_bytes", d.low_bytes.value()}, {"high_bytes", d.high_bytes.value()}}},
        {"outside", device_rows_json(d.rows)},
        {"reserved", reserved}};
}

/// The engine's budget, term by term, and the cache it makes.
std::string engine_section(const EngineBudget& b, const ServeSettings& s, Unit unit) {
    const EngineRule& rule = *b.rule;
    TextTable table({Align::left, Align::right, Align::right, Align::left});
    for (const BudgetTerm& t : b.terms)
        table.row({fmt::format("{} {}", t.adds ? " " : "-", t.name), digits(t.bytes),
                   amount(t.bytes, unit), t.why});
    const bool vllm = rule.share == ShareRule::profiled;
    const std::string batch =
        vllm ? fmt::format(" max_num_seqs {},\nmax_num_batched_tokens {};",
                           digits(Count(b.max_num_seqs)), digits(Count(b.max_num_batched_tokens)))
             : "";
    std::string out = fmt::format(
        "\n{} {} ({}) budgets its KV cache (max_model_len {},{} CUDA's "
        "total {}):\n",
        rule.engine, rule.version, rule.mode, digits(Count(b.max_model_len)), batch,
        amount(b.cuda_total, unit));
    if (b.shortfall > Count(0)) {
        table.row({"= KV cache", "0", amount(Count(0), unit),
                   fmt::format("the terms overdraw the share by {}: the engine does not start",
                               amount(b.shortfall, unit))});
        return out + table.str();
    }
    table.row({"= KV cache", digits(b.kv_cache_bytes), amount(b.kv_cache_bytes, unit),
               vllm ? fmt::format("{} blocks of {} tokens", digits(Count(b.blocks)), s.block_size)
                    : fmt::format("{} tokens", digits(Count(b.tokens)))});
    out += table.str();
    out += fmt::format("  {}; maximum concurrency for {} tokens per request: {:.2f}x{}\n",
                       vllm ? "GPU KV cache size: " + digits(Count(b.tokens)) + " tokens"
                            : "KV Cache is allocated. #tokens: " + digits(Count(b.tokens)),
                       digits(Count(b.max_model_len)), b.max_concurrency,
                       b.approximate ? " (approximate: sliding-window or Mamba layers)" : "");
    return out;
}

nlohmann::json engine_json(const EngineBudget& b, const ServeSettings& s) {
    nlohmann::json terms = nlohmann::json::array();
    for (const BudgetTerm& t : b.terms)
        terms.push_back(
            {{"name", t.name}, {"bytes", t.bytes.value()}, {"adds", t.adds}, {"why", t.why}});
    return {
        {"name", b.rule->engine},
        {"version", b.rule->version},
        {"mode", b.rule->mode},
        {"source", b.rule->source},
        {"share", b.share},
        {b.rule->share == ShareRule::profiled ? "gpu_memory_utilization" : "mem_fraction_static",
         b.share},
        {"max_model_len", b.max_model_len},
        {"max_num_seqs", b.max_num_seqs},
        {"max_num_batched_tokens", b.max_num_batched_tokens},
        {"block_size", s.block_size},
        {"cuda_total_bytes", b.cuda_total.value()},
        {"terms", terms},
        {"starts", b.shortfall == Count(0)},
        {"shortfall_bytes", b.shortfall.value()},
        {"kv_cache_bytes", b.kv_cache_bytes.value()},
        {"kv_cache_tokens", b.tokens},
        {"blocks", b.blocks},
        {"max_concurrency", b.max_concurrency},
        {"approximate", b.approximate}};
}

/// What the activations row holds: the prefill chunk's, and before it the images' encoder pass.
std::string activations_note(const ServeReport& p, const ServeSettings& s) {
    std::string note =
        fmt::format(s.hf_generate ? "every prompt's prefill in one forward ({} tokens), k and v "
                                    "repeated to every head, and the last tokens' logits"
                                  : "a prefill chunk of {} tokens, and the last tokens' logits",
                    digits(Count(p.prefill_tokens)));
    if (p.encoder_items > 0)
        note += fmt::format(
            "; {} images' encoder outputs ({} tokens each, {} B{}) and the larger of the tower's "
            "forward and the model's",
            p.encoder_items, digits(Count(p.encoder_tokens_per_item)), digits(p.encoder_outputs),
            p.cross_tokens > 0 ? ": the projector's and the tower's own" : "");
    if (p.encoder_items > 0 && p.cross_tokens > 0)
        note +=
            ", with its cross-attention mask (bf16; int64 and fp32 while made) and a layer's "
            "k and v repeated to every head";
    return note;
}

/// What the KV cache row holds: a token's bytes over the layers, the blocks a sequence, and what
/// sliding windows and mllama's cross-attention layers keep (their own cache or the engine's pool).
std::string kv_cache_note(const ServeRun& r) {
    const ServeSettings& s = r.settings;
    const ServeReport& p = r.report;
    const std::string what =
        p.kv_latent ? fmt::format("the {} latent and k's rotary part{}", dtype_name(s.kv_dtype),
                                  p.indexer_key_bytes == 0
                                      ? ""
                                      : fmt::format(", the indexer's fp8 key and scale ({} B)",
                                                    p.indexer_key_bytes))
                    : fmt::format("k and v of {} {} head{}{}", p.kv_heads_per_rank,
                                  dtype_name(s.kv_dtype), p.kv_heads_per_rank == 1 ? "" : "s",
                                  p.kv_replicated ? ", replicated" : "");
    std::string note = fmt::format("{} B a token ({} x {} layers), {} blocks of {} per sequence",
                                   digits(p.kv_bytes_per_token), what, p.cache_layers,
                                   digits(Count(p.blocks_per_sequence)), s.block_size);
    if (p.windowed_layers > 0)
        note += fmt::format("; {} sliding-window layers keep their window's", p.windowed_layers);
    if (p.cross_layers > 0)
        note += fmt::format(s.engine_pool ? "; {} cross-attention layers among them, the images' "
                                            "{} tokens a sequence in the pool beside its text"
                                          : "; {} cross-attention layers keep the images' {} "
                                            "tokens a sequence",
                            p.cross_layers, digits(Count(p.cross_tokens)));
    return note;
}

/// With a device: whether the batch fits (the device's high end), the cache's capacity beside the
/// weights and activations, and the largest batch.
std::string device_verdict(const ServeRun& r, Unit unit) {
    const ServeSettings& s = r.settings;
    std::string out;
    const Count high = r.figures.high_bytes;
    const std::string usable =
        *r.reserve == Count(0) ? amount(*r.memory, unit)
                               : fmt::format("{} ({} less a {} reserve)", amount(*r.capacity, unit),
                                             amount(*r.memory, unit), amount(*r.reserve, unit));
    out += fmt::format(
        "\n{}: {}\n", r.device,
        r.fit->fits ? fmt::format("fits in {}: {} to spare at the device's high end", usable,
                                  amount(Count(r.capacity->value() - high.value()), unit))
                    : fmt::format("does not fit in {}: the device's {} (high end) is {} over",
                                  usable, amount(high, unit),
                                  amount(Count(high.value() - r.capacity->value()), unit)));
    out += fmt::format("  KV cache capacity beside the weights and activations: {} tokens\n",
                       digits(r.fit->kv_capacity_tokens));
    out +=
        r.fit->max_batch == 0
            ? fmt::format("  largest batch at context {}: none fits\n", digits(Count(s.context)))
            : fmt::format("  largest batch at context {}: {} (peak {})\n", digits(Count(s.context)),
                          digits(Count(r.fit->max_batch)), amount(r.fit->at_max->peak(), unit));
    return out;
}

std::string serve_table(const ServeRun& r, Unit unit) {
    const ServeSettings& s = r.settings;
    const ServeReport& p = r.report;
    std::string out = fmt::format(
        "memcalc serve: {} ({} parameters), {} weights, context {}, batch {}, tp {}\n\n", r.model,
        digits(r.model_parameters), s.weights->name, digits(Count(s.context)),
        digits(Count(s.batch)), s.tp);
    TextTable table({Align::left, Align::right, Align::right, Align::left});
    table.row({"per device", "bytes", "", "what"});
    table.row({"weights", digits(p.weights), amount(p.weights, unit),
               fmt::format("{} parameters on this rank; linear layers {}", digits(p.parameters),
                           s.weights->name)});
    table.row({"KV cache", digits(p.kv_cache), amount(p.kv_cache, unit), kv_cache_note(r)});
    if (r.draft)
        table.row({"draft model", digits(p.draft_weights + p.draft_kv_cache),
                   amount(p.draft_weights + p.draft_kv_cache, unit),
                   fmt::format("{}: weights {} ({} parameters, bf16), KV cache {} ({} B a token, "
                               "{} layers); {} speculative tokens",
                               r.draft->architecture.name, amount(p.draft_weights, unit),
                               digits(p.draft_parameters), amount(p.draft_kv_cache, unit),
                               digits(p.draft_kv_bytes_per_token), p.draft_cache_layers,
                               s.num_speculative_tokens)});
    if (p.lora > Count(0))
        table.row({"LoRA adapters", digits(p.lora), amount(p.lora, unit),
                   fmt::format("{} slots at rank {}: A and B of {} linears, bf16 (vLLM's)",
                               s.max_loras, s.max_lora_rank, p.lora_linears)});
    if (p.state_layers > 0)
        table.row({"Mamba state", digits(p.ssm_state), amount(p.ssm_state, unit),
                   fmt::format("{} B a sequence, any length ({} layers: conv state bf16, scan "
                               "state fp32){}",
                               digits(p.state_bytes_per_sequence), p.state_layers,
                               p.cache_layers > 0 ? "" : ", no KV cache")});
    table.row({"activations", digits(p.activations), amount(p.activations, unit),
               activations_note(p, s)});
    table.row({"peak", digits(p.peak()), amount(p.peak(), unit), ""});
    out += table.str() + device_section(r, unit);
    if (r.capacity) out += device_verdict(r, unit);
    if (r.engine) return out + engine_section(*r.engine, s, unit);
    out +=
        "\nThe KV cache is the batch's: an engine preallocates its whole budget (vLLM's "
        "--gpu-memory-utilization\nof the device), and its profiling run's peak may differ from "
        "the prefill's here.\n";
    return out;
}

/// The draft model: its weights and KV cache on this rank, and the tokens it proposes.
nlohmann::json draft_json(const ServeRun& r) {
    const ServeReport& p = r.report;
    return {{"model", r.draft->architecture.name},
            {"parameters", p.draft_parameters.value()},
            {"weights_bytes", p.draft_weights.value()},
            {"kv_bytes_per_token", p.draft_kv_bytes_per_token.value()},
            {"kv_cache_bytes", p.draft_kv_cache.value()},
            {"num_speculative_tokens", r.settings.num_speculative_tokens}};
}

/// A prefill's images: the most a prompt holds, the largest's size, the encoder's pass.
nlohmann::json images_json(const ServeRun& r) {
    const ServeReport& p = r.report;
    const ImageInput& in = r.settings.images;
    return {{"per_prompt", in.images},
            {"width", in.width},
            {"height", in.height},
            {"encoder_items", p.encoder_items},
            {"tokens_per_item", p.encoder_tokens_per_item},
            {"encoder_output_bytes", p.encoder_outputs.value()}};
}

/// The KV cache: its bytes and how they are made; the keys of some models appended.
nlohmann::json kv_cache_json(const ServeRun& r) {
    const ServeReport& p = r.report;
    nlohmann::json j = {{"bytes", p.kv_cache.value()},
                        {"bytes_per_token", p.kv_bytes_per_token.value()},
                        {"kv_heads_per_rank", p.kv_heads_per_rank},
                        {"replicated", p.kv_replicated},
                        {"latent", p.kv_latent},
                        {"windowed_layers", p.windowed_layers},
                        {"blocks_per_sequence", p.blocks_per_sequence},
                        {"dtype", dtype_name(r.settings.kv_dtype)}};
    if (p.indexer_key_bytes > 0) j["indexer_key_bytes"] = p.indexer_key_bytes;
    if (p.cross_layers > 0) {  // mllama's
        j["cross_attention_layers"] = p.cross_layers;
        j["cross_attention_tokens"] = p.cross_tokens;
    }
    return j;
}

nlohmann::json serve_json(const ServeRun& r) {
    const ServeSettings& s = r.settings;
    const ServeReport& p = r.report;
    nlohmann::json j = {
        {"memcalc", memcalc::version},
        {"schema", memcalc::json_schema},
        {"command", "serve"},
        {"model", {{"name", r.model}, {"parameters", r.model_parameters.value()}}},
        {"settings",
         {{"context", s.context},
          {"batch", s.batch},
          {"tp", s.tp},
          {"kv_dtype", dtype_name(s.kv_dtype)},
          {"weights", s.weights->name},
          {"block_size", s.block_size},
          // none under transformers' generate(), which prefills every prompt in one forward
          {"prefill_chunk", s.hf_generate ? nlohmann::json() : nlohmann::json(s.prefill_chunk)}}},
        {"weights",
         {{"bytes", p.weights.value()},
          {"parameters", p.parameters.value()},
          {"format", s.weights->name}}},
        {"kv_cache", kv_cache_json(r)},
        {"activations", {{"bytes", p.activations.value()}, {"prefill_tokens", p.prefill_tokens}}},
        {"peak", peak_json(r)},
    };
    j["settings"]["cuda_graphs"] = s.cuda_graphs;
    if (r.engine) j["engine"] = engine_json(*r.engine, s);
    if (s.max_loras > 0)  // appended, as the keys above stay as they were
        j["lora"] = {{"bytes", p.lora.value()},
                     {"max_loras", s.max_loras},
                     {"max_lora_rank", s.max_lora_rank},
                     {"linears", p.lora_linears},
                     {"dtype", "bf16"}};
    if (r.draft) j["draft"] = draft_json(r);  // appended: the keys above stay as they were
    if (p.state_layers > 0)                   // appended: the keys above stay as they were
        j["ssm_state"] = {{"bytes", p.ssm_state.value()},
                          {"bytes_per_sequence", p.state_bytes_per_sequence.value()},
                          {"layers", p.state_layers}};
    if (p.encoder_items > 0) j["images"] = images_json(r);  // appended, as the keys above
    if (r.capacity)
        j["device"] = {{"name", r.device},
                       {"memory_bytes", r.memory->value()},
                       {"reserve_bytes", r.reserve->value()},
                       {"capacity_bytes", r.capacity->value()},
                       {"fits", r.fit->fits},
                       {"kv_capacity_tokens", r.fit->kv_capacity_tokens.value()},
                       {"max_batch", r.fit->max_batch}};
    return j;
}

std::string serve_csv(const ServeRun& r) {
    const ServeReport& p = r.report;
    std::string out =
        "model,weights_format,context,batch,tp,kv_dtype,weights_bytes,kv_cache_bytes,"
        "activations_bytes,peak_bytes,fits,max_batch,kv_capacity_tokens,reserved_bytes,"
        "device_bytes,device_high_bytes\n";
    out += fmt::format(
        "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(r.model),
        r.settings.weights->name, r.settings.context, r.settings.batch, r.settings.tp,
        dtype_name(r.settings.kv_dtype), p.weights.value(), p.kv_cache.value(),
        p.activations.value(), p.peak().value(), r.fit ? (r.fit->fits ? "true" : "false") : "",
        r.fit ? std::to_string(r.fit->max_batch) : "",
        r.fit ? std::to_string(r.fit->kv_capacity_tokens.value()) : "", r.figures.reserved.value(),
        r.figures.bytes.value(), r.figures.high_bytes.value());
    return out;
}

}  // namespace

/// --engine's settings; none without it, and the engine's options without it are an error.
std::optional<EngineSettings> engine_settings(const ServeOptions& q) {
    // hf: transformers' generate() budgets nothing; its cache is the batch's, as without --engine.
    if (q.engine.empty() || q.engine == "hf") {
        for (const auto& [option, value] :
             {std::pair{"--engine-version", &q.engine_version},
              {"--gpu-memory-utilization", &q.gpu_memory_utilization},
              {"--mem-fraction-static", &q.mem_fraction_static},
              {"--max-model-len", &q.max_model_len},
              {"--max-num-seqs", &q.max_num_seqs},
              {"--max-num-batched-tokens", &q.max_num_batched_tokens}})
            if (!value->empty())
                throw usage_error(
                    fmt::format("{} {} needs --engine vllm or sglang", option, *value));
        return std::nullopt;
    }
    if (!engine_rule(q.engine))
        throw usage_error(fmt::format("--engine must be vllm, sglang or hf (got '{}')", q.engine));
    EngineSettings e;
    e.rule = engine_rule(q.engine, q.engine_version);
    if (!e.rule)
        throw usage_error(fmt::format(
            "--engine-version '{}' is not a version of {} that memcalc models (0.6 or later)",
            q.engine_version, q.engine));
    const bool vllm = e.rule->share == ShareRule::profiled;
    const char* option = vllm ? "--gpu-memory-utilization" : "--mem-fraction-static";
    const std::string& other = vllm ? q.mem_fraction_static : q.gpu_memory_utilization;
    if (!other.empty())
        throw usage_error(fmt::format("{} {} is not {}'s: its share is {}",
                                      vllm ? "--mem-fraction-static" : "--gpu-memory-utilization",
                                      other, q.engine, option));
    const std::string& text = vllm ? q.gpu_memory_utilization : q.mem_fraction_static;
    if (!text.empty()) {
        char* end = nullptr;
        const double share = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size() || !(share > 0 && share <= 1))
            throw usage_error(fmt::format("{}: '{}' is not a share in (0, 1]", option, text));
        e.share = share;
    }
    const auto count = [](const char* option, const std::string& text) {
        return text.empty() ? std::nullopt
                            : std::optional<std::uint64_t>(parse_count(option, text, 0));
    };
    e.max_model_len = count("--max-model-len", q.max_model_len);
    e.max_num_seqs = count("--max-num-seqs", q.max_num_seqs);
    e.max_num_batched_tokens = count("--max-num-batched-tokens", q.max_num_batched_tokens);
    return e;
}

namespace {

/// `text` where the engine takes it for `option` (a row of engine_choices), else one line naming
/// the value and the engine's choices.
void require_engine_takes(const EngineRule& rule, const char* option, const std::string& text) {
    const EngineChoice* choice = engine_choice(rule, option);
    if (!choice || engine_takes(*choice, text)) return;
    throw usage_error(fmt::format("{} '{}' is not one {} {} takes ({})", option, text, rule.engine,
                                  rule.version, fmt::join(engine_values(*choice), ", ")));
}

/// --kv-cache-dtype as the engine spells it, memcalc's dtype for it: auto is the model's (bf16).
DType engine_kv_dtype(const ServeOptions& q, const std::optional<EngineSettings>& engine) {
    if (q.kv_cache_dtype.empty()) return kv_dtype_named(q.kv_dtype);
    if (!engine)
        throw usage_error(
            fmt::format("--kv-cache-dtype {} needs --engine vllm or sglang", q.kv_cache_dtype));
    if (!q.kv_dtype.empty())
        throw usage_error(fmt::format("--kv-cache-dtype {} and --kv-dtype {}: give one",
                                      q.kv_cache_dtype, q.kv_dtype));
    require_engine_takes(*engine->rule, "--kv-cache-dtype", q.kv_cache_dtype);
    if (q.kv_cache_dtype == "fp8_e5m2") return DType::fp8_e5m2;
    return q.kv_cache_dtype.rfind("fp8", 0) == 0 ? DType::fp8_e4m3 : DType::bf16;
}

/// vLLM's LoRA slots: --max-loras turns them on; --max-lora-rank one the engine takes.
void lora_settings(const ServeOptions& q, const std::optional<EngineSettings>& engine,
                   ServeSettings& s) {
    s.max_loras = parse_count("--max-loras", q.max_loras, 0);
    s.max_lora_rank = parse_count("--max-lora-rank", q.max_lora_rank, 16);
    if (q.max_loras.empty() && !q.max_lora_rank.empty())
        throw usage_error(fmt::format("--max-lora-rank {} needs --max-loras", q.max_lora_rank));
    if (!engine || q.max_loras.empty()) return;
    if (engine->rule->share != ShareRule::profiled)
        throw usage_error(
            fmt::format("--max-loras {} is vLLM's: memcalc does not model {}'s LoRA memory pool",
                        q.max_loras, engine->rule->engine));
    require_engine_takes(*engine->rule, "--max-lora-rank", std::to_string(s.max_lora_rank));
}

/// What serve's options say, checked against the engine's choices where one is given.
ServeSettings serve_settings(const ServeOptions& q, const std::optional<EngineSettings>& engine) {
    ServeSettings s;
    s.context = parse_count("--context", q.context, 0);
    s.batch = parse_count("--batch", q.batch, 1);
    s.tp = parse_count("--tp", q.tp, 1);
    s.block_size = parse_count("--block-size", q.block_size, 16);
    if (engine && !q.block_size.empty())
        require_engine_takes(*engine->rule, "--block-size", std::to_string(s.block_size));
    s.prefill_chunk = parse_count("--prefill-chunk", q.prefill_chunk, 8192);
    s.hf_generate = q.engine == "hf";
    if (s.hf_generate && !q.prefill_chunk.empty())
        throw usage_error(fmt::format(
            "--prefill-chunk {} is an engine's: transformers' generate() (--engine hf) prefills "
            "every prompt in one forward",
            q.prefill_chunk));
    s.kv_dtype = engine_kv_dtype(q, engine);
    s.weights = &weight_format_named(q.weights);
    s.cuda_graphs = !q.enforce_eager && !s.hf_generate;  // generate() captures none
    s.images = parse_images(q.images, q.image_size);
    s.engine_pool = engine.has_value();
    lora_settings(q, engine, s);
    return s;
}

/// --draft-preset or --draft-config, which need --engine and --num-speculative-tokens.
std::optional<ModelFile> draft_model(const ServeOptions& q, bool engine, ServeSettings& s) {
    const std::string& named = q.draft_preset.empty() ? q.draft_config : q.draft_preset;
    const char* option = q.draft_preset.empty() ? "--draft-config" : "--draft-preset";
    if (named.empty()) {
        if (!q.num_speculative_tokens.empty())
            throw usage_error(
                fmt::format("--num-speculative-tokens {} needs --draft-preset or "
                            "--draft-config",
                            q.num_speculative_tokens));
        return std::nullopt;
    }
    if (!q.draft_preset.empty() && !q.draft_config.empty())
        throw usage_error(fmt::format("--draft-preset {} and --draft-config {}: give one",
                                      q.draft_preset, q.draft_config));
    if (!engine)
        throw usage_error(fmt::format(
            "{} {} needs --engine vllm: the engine's pool holds its cache", option, named));
    if (q.num_speculative_tokens.empty())
        throw usage_error(fmt::format("{} {} needs --num-speculative-tokens", option, named));
    s.num_speculative_tokens = parse_count("--num-speculative-tokens", q.num_speculative_tokens, 0);
    ModelOptions m;
    (q.draft_preset.empty() ? m.config : m.preset) = named;
    return load_model(m);
}

}  // namespace

std::string run_serve(const ServeOptions& q) {
    const std::optional<EngineSettings> engine = engine_settings(q);
    if (q.context.empty() && !engine)
        throw usage_error("serve needs --context, the tokens of each sequence (prompt and output)");
    ServeSettings s = serve_settings(q, engine);
    ServeRun run;
    run.device_settings = device_settings(q.device);
    if (const std::optional<UsableMemory> device = usable_memory(q.device)) {
        run.memory = device->rule.memory;
        run.reserve = device->rule.reserve;
        run.capacity = device->rule.usable();
        run.device = device->device.given_by;
    }
    if (engine && !run.memory)
        throw usage_error(
            fmt::format("--engine {} needs --device-memory, --gpu or --gpu-file: "
                        "it budgets a share of the device's memory",
                        q.engine));
    const ModelFile model = load_model(q.model);
    run.draft = draft_model(q, engine.has_value(), s);
    if (run.draft) s.draft = &run.draft->architecture;
    if (engine) {
        run.engine =
            engine_budget(model.architecture, s, *engine, *run.memory, run.device_settings);
        if (q.context.empty()) s.context = run.engine->max_model_len;
    }
    run.model = model.architecture.name;
    run.layers = model.architecture.layers;
    run.settings = s;
    run.report = serve(model.architecture, s);  // which names an overflow's inputs
    run.figures = serve_device(run.report, s, run.device_settings);
    const Architecture& m = model.architecture;
    run.model_parameters = detail::named_overflow([&] { return parameter_table(m).total(); },
                                                  [&] { return detail::parameter_overflow(m); });
    if (run.capacity)
        run.fit = serve_fit_on_device(model.architecture, s, *run.capacity, run.device_settings);
    return in_format(
        q.output.format, [&] { return serve_json(run); }, [&] { return serve_csv(run); },
        [&] { return serve_table(run, unit_of(q.output)); });
}

}  // namespace memcalc::cli
