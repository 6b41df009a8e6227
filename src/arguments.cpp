#include "arguments.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <iterator>
#include <limits>

#include "suggest.hpp"

namespace memcalc::cli {

std::vector<std::string> split_list(const std::string& option, const std::string& text) {
    std::vector<std::string> items;
    std::string item;
    for (std::size_t i = 0; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == ',') {
            if (item.empty())
                throw usage_error(fmt::format("{}: empty item in '{}'", option, text));
            items.push_back(item);
            item.clear();
        } else if (!std::isspace(static_cast<unsigned char>(text[i]))) {
            item += text[i];
        }
    }
    return items;
}

std::vector<std::uint64_t> parse_sizes(const std::string& option, const std::string& text) {
    std::vector<std::uint64_t> values;
    for (const auto& item : split_list(option, text)) {
        bool all_digits = true;
        for (char c : item) all_digits = all_digits && std::isdigit(static_cast<unsigned char>(c));
        if (!all_digits)
            throw usage_error(
                fmt::format("{} must be a positive integer (got '{}')", option, item));
        std::uint64_t value = 0;
        for (char c : item) {
            const std::uint64_t digit = static_cast<std::uint64_t>(c - '0');
            if (value > (std::numeric_limits<std::uint64_t>::max() - digit) / 10)
                throw usage_error(
                    fmt::format("{} is too large (got '{}'; the limit is 2^64 - 1)", option, item));
            value = value * 10 + digit;
        }
        if (value == 0)
            throw usage_error(
                fmt::format("{} must be a positive integer (got '{}')", option, item));
        values.push_back(value);
    }
    return values;
}

std::vector<Recompute> parse_modes(const std::string& text) {
    const std::vector<std::string> names = {"none", "selective", "full", "op"};
    if (text == "all") return {Recompute::none, Recompute::selective, Recompute::full};
    std::vector<Recompute> modes;
    for (const auto& item : split_list("--recompute", text)) {
        if (item == "none")
            modes.push_back(Recompute::none);
        else if (item == "selective")
            modes.push_back(Recompute::selective);
        else if (item == "full")
            modes.push_back(Recompute::full);
        else if (item == "op")
            modes.push_back(Recompute::op);
        else
            throw usage_error(
                fmt::format("--recompute must be none, selective, full, op or all (got '{}'){}",
                            item, did_you_mean(item, names)));
    }
    return modes;
}

namespace {

LoraVariant parse_lora_variant(const std::string& text) {
    const auto* variant = std::find_if(lora_variant_rows.begin(), lora_variant_rows.end(),
                                       [&](const LoraVariantRow& r) { return text == r.name; });
    if (variant == lora_variant_rows.end())
        throw usage_error(fmt::format("--lora-variant: '{}' is not lora, dora or merged", text));
    return variant->variant;
}

/// The adapters' options need --train lora or qlora; the 4-bit base's, qlora; the prompt's,
/// adapter.
void check_tuning_options(const TrainingOptions& q, const TrainingRow& row) {
    struct Needs {
        const char* option;
        const std::string& value;
        bool TrainingRow::*mode;  ///< the row's column that allows it
    };
    constexpr auto lora = &TrainingRow::adapters;
    constexpr auto qlora = &TrainingRow::quantized_base;
    constexpr auto prompt = &TrainingRow::prompt;
    for (const Needs& n : {Needs{"--lora-rank", q.lora_rank, lora},
                           {"--lora-targets", q.lora_targets, lora},
                           {"--lora-dropout", q.lora_dropout, lora},
                           {"--lora-dtype", q.lora_dtype, lora},
                           {"--lora-variant", q.lora_variant, lora},
                           {"--qlora-quantizer", q.quantizer, qlora},
                           {"--qlora-double-quant", q.double_quant, qlora},
                           {"--bitsandbytes-version", q.bitsandbytes_version, qlora},
                           {"--adapter-prompt-tokens", q.prompt_tokens, prompt},
                           {"--adapter-start-layer", q.prompt_start, prompt}})
        if (!n.value.empty() && !(row.*n.mode))
            throw usage_error(fmt::format("{} {} needs --train {} (got --train {})", n.option,
                                          n.value, training_names_with(n.mode), q.train));
}

/// `text` as a whole number (0 included), or none where any of it is not one or it overflows.
std::optional<std::uint64_t> whole_number(const std::string& text) {
    std::uint64_t n = 0;
    const auto [end, failed] = std::from_chars(text.data(), text.data() + text.size(), n);
    if (failed != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return n;
}

/// --adapter-start-layer: a layer's index, from 0.
std::uint64_t parse_layer_index(const std::string& text) {
    if (const auto n = whole_number(text)) return *n;
    throw usage_error(fmt::format(
        "--adapter-start-layer must be a layer's index, counted from 0 (got '{}')", text));
}

/// QLoRA's base as --qlora-quantizer, --qlora-double-quant and --bitsandbytes-version say it.
QuantizedLinears parse_quantized_linears(const TrainingOptions& q) {
    QuantizedLinears out;
    if (!q.quantizer.empty()) {
        const auto* row =
            std::find_if(quantizer_rows.begin(), quantizer_rows.end(),
                         [&](const QuantizerRow& r) { return q.quantizer == r.name; });
        if (row == quantizer_rows.end())
            throw usage_error(fmt::format(
                "--qlora-quantizer: '{}' is not transformers or lightning", q.quantizer));
        out.quantizer = row->quantizer;
    }
    if (!q.double_quant.empty()) {
        if (q.double_quant != "true" && q.double_quant != "false")
            throw usage_error(
                fmt::format("--qlora-double-quant: '{}' is not true or false", q.double_quant));
        out.double_quant = q.double_quant == "true";
    }
    if (!q.bitsandbytes_version.empty()) {
        const auto version = bitsandbytes_version_of(q.bitsandbytes_version);
        if (!version)
            throw usage_error(fmt::format(
                "--bitsandbytes-version: '{}' is no bitsandbytes release with 4-bit weights "
                "(0.39.0 or later, as MAJOR.MINOR[.PATCH])",
                q.bitsandbytes_version));
        out.bitsandbytes = *version;
    }
    return out;
}

}  // namespace

FineTuning parse_fine_tuning(const TrainingOptions& q) {
    FineTuning f;
    const auto* row = std::find_if(training_rows.begin(), training_rows.end(),
                                   [&](const TrainingRow& r) { return q.train == r.name; });
    if (row == training_rows.end()) {
        std::vector<std::string> names;
        for (const auto& r : training_rows) names.emplace_back(r.name);
        throw usage_error(fmt::format("unknown --train '{}'{} ({})", q.train,
                                      did_you_mean(q.train, names), training_names_with()));
    }
    f.mode = row->mode;
    if (!q.frozen.empty()) {
        if (f.mode != Training::frozen && f.mode != Training::full)
            throw usage_error(
                fmt::format("--frozen {} is for --train frozen: --train {} freezes the whole base",
                            q.frozen, q.train));
        f.mode = Training::frozen;  // --frozen alone implies it
        f.frozen = split_list("--frozen", q.frozen);
    } else if (f.mode == Training::frozen) {
        throw usage_error(
            "--train frozen needs --frozen PARTS (embeddings, attention, mlp, router, norms, head, "
            "vision, or tensor names such as q_proj)");
    }
    check_tuning_options(q, *row);
    f.quantized = parse_quantized_linears(q);
    f.prompt.tokens = parse_count("--adapter-prompt-tokens", q.prompt_tokens, f.prompt.tokens);
    if (!q.prompt_start.empty()) f.prompt.start_layer = parse_layer_index(q.prompt_start);
    f.lora.rank = parse_count("--lora-rank", q.lora_rank, f.lora.rank);
    if (!q.lora_targets.empty()) f.lora.targets = split_list("--lora-targets", q.lora_targets);
    if (!q.lora_dropout.empty()) {
        char* end = nullptr;
        const double p = std::strtod(q.lora_dropout.c_str(), &end);
        if (end != q.lora_dropout.c_str() + q.lora_dropout.size() || !(p >= 0 && p < 1))
            throw usage_error(
                fmt::format("--lora-dropout: '{}' is not a probability in [0, 1)", q.lora_dropout));
        f.lora.dropout = p > 0;
    }
    if (!q.lora_dtype.empty()) {
        if (q.lora_dtype != "fp32" && q.lora_dtype != "bf16" && q.lora_dtype != "fp16")
            throw usage_error(fmt::format(
                "--lora-dtype: '{}' is not fp32 (peft's default), bf16 or fp16", q.lora_dtype));
        f.lora.fp32 = q.lora_dtype == "fp32";
    }
    if (!q.lora_variant.empty()) f.lora.variant = parse_lora_variant(q.lora_variant);
    return f;
}

ModuleSet parse_recompute_modules(const StepOptions& q) {
    if (q.recompute_modules.empty()) return {};
    if (q.recompute != "selective")
        throw usage_error(
            fmt::format("--recompute-modules needs --recompute selective (got '{}')", q.recompute));
    std::string known;
    for (Module m : recomputable_modules)
        known += (known.empty() ? "" : ", ") + std::string(module_name(m));
    ModuleSet modules{0};
    for (const auto& item : split_list("--recompute-modules", q.recompute_modules)) {
        const auto* found =
            std::find_if(std::begin(recomputable_modules), std::end(recomputable_modules),
                         [&](Module m) { return item == module_name(m); });
        if (found == std::end(recomputable_modules))
            throw usage_error(
                fmt::format("--recompute-modules: unknown module '{}' (known: {})", item, known));
        modules.bits |= ModuleSet::of({*found}).bits;
    }
    return modules;
}

std::vector<Attention> parse_attention(const std::string& text) {
    std::vector<Attention> kinds;
    for (const auto& item : split_list("--attention", text)) {
        if (item == "eager")
            kinds.push_back(Attention::eager);
        else if (item == "flash" || item == "sdpa")  // SDPA's kernels keep what flash's keep
            kinds.push_back(Attention::flash);
        else
            throw usage_error(fmt::format(
                "--attention must be eager, flash (or sdpa) or a comma list of them (got '{}'){}",
                item, did_you_mean(item, {"eager", "flash", "sdpa"})));
    }
    return kinds;
}

Format parse_format(const std::string& text) {
    return text == "json" ? Format::json : text == "csv" ? Format::csv : Format::table;
}

Count parse_size(const std::string& option, const std::string& text) {
    const auto bad = [&]() {
        return usage_error(fmt::format(
            "{} must be a size such as 80GB, 80GiB, 1.5TB or 512B (got '{}')", option, text));
    };
    std::size_t i = 0;
    std::string whole, fraction;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) whole += text[i++];
    if (i < text.size() && text[i] == '.')
        for (++i; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]));)
            fraction += text[i++];
    while (i < text.size() && text[i] == ' ') ++i;
    std::string unit;
    for (; i < text.size(); ++i)
        unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
    const std::pair<const char*, std::uint64_t> units[] = {{"", 1},
                                                           {"b", 1},
                                                           {"kb", 1000},
                                                           {"mb", 1000000},
                                                           {"gb", 1000000000},
                                                           {"tb", 1000000000000ULL},
                                                           {"kib", 1ULL << 10},
                                                           {"mib", 1ULL << 20},
                                                           {"gib", 1ULL << 30},
                                                           {"tib", 1ULL << 40}};
    const auto found = std::find_if(std::begin(units), std::end(units),
                                    [&](const auto& u) { return unit == u.first; });
    if (whole.empty() || found == std::end(units) || fraction.size() > 9) throw bad();
    if (unit.empty())  // "80" is far more likely 80 GB meant than 80 bytes
        throw usage_error(fmt::format("{} {} has no unit: write {}GB, {}GiB, or {}B for bytes",
                                      option, text, text, text, text));
    try {
        Count bytes = Count(std::stoull(whole)) * found->second;
        if (!fraction.empty())  // the fraction of a unit, rounded to the byte
            bytes += Count(static_cast<std::uint64_t>(std::llround(
                std::stold("0." + fraction) * static_cast<long double>(found->second))));
        return bytes;
    } catch (const std::exception&) {
        throw usage_error(fmt::format("{} is too large (got '{}')", option, text));
    }
}

std::uint64_t parse_count(const std::string& option, const std::string& text,
                          std::uint64_t fallback) {
    if (text.empty()) return fallback;
    const auto values = parse_sizes(option, text);
    if (values.size() != 1)
        throw usage_error(fmt::format("{} takes one value (got '{}')", option, text));
    return values.front();
}

std::uint64_t parse_cublas_workspace_config(const std::string& option, const std::string& text) {
    const auto bytes = cublas_workspace_config_bytes(text);
    if (!bytes)
        throw usage_error(fmt::format(
            "{} '{}': not ':SIZE:COUNT' pairs, SIZE in KiB (CUBLAS_WORKSPACE_CONFIG, e.g. :4096:8)",
            option, text));
    return *bytes;
}

ImageInput parse_images(const std::string& images, const std::string& size) {
    ImageInput in;
    in.images = parse_count("--images", images, 0);
    if (size.empty()) return in;  // a tower of a fixed size needs none (the model says)
    if (in.images == 0) throw usage_error(fmt::format("--image-size {} needs --images N", size));
    const auto x = size.find('x');
    const auto side = [&](const std::string& text) {
        const std::uint64_t n = text.empty() ? 0 : parse_count("--image-size", text, 0);
        if (n == 0)
            throw usage_error(fmt::format(
                "--image-size '{}' must be WIDTHxHEIGHT in pixels (e.g. 448x448)", size));
        return n;
    };
    if (x == std::string::npos) side("");
    in.width = side(size.substr(0, x));
    in.height = side(size.substr(x + 1));
    return in;
}

std::vector<unsigned> parse_zero(const std::string& text) {
    std::vector<unsigned> stages;
    for (const auto& item : split_list("--zero", text)) {
        if (item != "0" && item != "1" && item != "2" && item != "3")
            throw usage_error(fmt::format("--zero must be 0, 1, 2 or 3 (got '{}')", item));
        stages.push_back(static_cast<unsigned>(item[0] - '0'));
    }
    return stages;
}

std::vector<OffloadMode> parse_offloads(const std::string& text) {
    const std::vector<Offload> all = {Offload::none, Offload::optimizer, Offload::parameters};
    std::vector<std::string> names;  // every alternative's spelling, for "did you mean"
    for (bool activations : {false, true})
        for (Offload o : all) names.emplace_back(OffloadMode(o, activations).name());
    std::vector<OffloadMode> modes;
    for (const auto& item : split_list("--offload", text)) {
        // An alternative joins a ZeRO-Offload mode and activations with '+', in either order.
        OffloadMode mode;
        bool state_named = false, valid = !item.empty();
        for (std::size_t from = 0; valid && from <= item.size();) {
            const std::size_t plus = std::min(item.find('+', from), item.size());
            const std::string part = item.substr(from, plus - from);
            const auto state = std::find(names.begin(), names.begin() + 3, part);
            if (part == "activations" && !mode.activations) {
                mode.activations = true;
            } else if (state != names.begin() + 3 && !state_named &&
                       (part != "none" || item == "none")) {
                mode.state = all[static_cast<std::size_t>(state - names.begin())];
                state_named = true;
            } else {
                valid = false;
            }
            from = plus + 1;
        }
        if (!valid)
            throw usage_error(
                fmt::format("--offload must be none, optimizer, parameters or activations, or "
                            "optimizer+activations or parameters+activations (got '{}'){}",
                            item, did_you_mean(item, names)));
        modes.push_back(mode);
    }
    return modes;
}

std::vector<Schedule> parse_schedules(const std::string& text) {
    std::vector<std::string> names;
    for (const ScheduleRow& row : schedule_rows) names.emplace_back(row.name);
    std::vector<Schedule> schedules;
    for (const auto& item : split_list("--schedule", text)) {
        if (item == "all") {
            for (const ScheduleRow& row : schedule_rows) schedules.push_back(row.schedule);
            continue;
        }
        const auto found = std::find(names.begin(), names.end(), item);
        if (found == names.end())
            throw usage_error(fmt::format("--schedule must be {} (got '{}'){}",
                                          fmt::join(names, ", "), item, did_you_mean(item, names)));
        schedules.push_back(
            schedule_rows[static_cast<std::size_t>(found - names.begin())].schedule);
    }
    return schedules;
}

std::optional<std::uint64_t> parse_recompute_layers(const StepOptions& q, bool searched) {
    if (q.recompute_layers.empty()) return std::nullopt;
    const std::string& text = q.recompute_layers;
    const std::optional<std::uint64_t> number = whole_number(text);
    const bool all = text == "all";
    if (!all && !number)
        throw usage_error(fmt::format(
            "--recompute-layers must be a whole number of layers or all (got '{}')", text));
    const std::uint64_t n = number.value_or(0);
    // A plan searches the modes it is given, full among them (none given: all three); an estimate
    // takes full alone.
    const std::vector<Recompute> modes =
        q.recompute.empty() ? std::vector<Recompute>{Recompute::full} : parse_modes(q.recompute);
    const bool full = searched
                          ? std::find(modes.begin(), modes.end(), Recompute::full) != modes.end()
                          : modes == std::vector<Recompute>{Recompute::full};
    if (!full)
        throw usage_error(fmt::format("--recompute-layers {} needs --recompute full (got '{}')",
                                      text, q.recompute.empty() ? "none" : q.recompute));
    if (all) return std::nullopt;  // every layer: full recomputation itself
    return n;
}

namespace {

/// What every layout of parse_layouts shares: the options that take one value.
Parallelism base_layout(const ParallelOptions& q, const StepOptions& step) {
    Parallelism base;
    base.cp = parse_count("--cp", q.cp, 1);
    base.ep = parse_count("--ep", q.ep, 1);
    base.etp = parse_count("--etp", q.etp, 0);
    base.vpp = parse_count("--vpp", q.vpp, 1);
    base.shard_group = parse_count("--shard-group", q.shard_group, 0);
    base.microbatches = parse_count("--microbatches", q.microbatches, 0);
    base.first_stage_layers = parse_count("--first-stage-layers", q.first_stage_layers, 0);
    base.last_stage_layers = parse_count("--last-stage-layers", q.last_stage_layers, 0);
    const std::vector<OffloadMode> offload = parse_offloads(q.offload);
    if (offload.size() != 1)
        throw usage_error(
            fmt::format("--offload takes one mode (got '{}'); join ZeRO-Offload and "
                        "activation offload with '+', e.g. optimizer+activations",
                        q.offload));
    base.offload = offload.front().state;
    base.offload_activations = offload.front().activations;
    if (!q.schedule.empty()) {
        const std::vector<Schedule> schedules = parse_schedules(q.schedule);
        if (schedules.size() != 1)
            throw usage_error(
                fmt::format("--schedule takes one schedule here (got '{}')", q.schedule));
        base.schedule = schedules.front();
        // --vpp alone means interleaved; named 1F1B with it is a contradiction, not a quiet switch.
        if (base.schedule == Schedule::one_f_one_b && base.vpp > 1)
            throw usage_error(fmt::format(
                "--schedule 1f1b runs one chunk per rank: --vpp must be 1 (got {})", base.vpp));
    }
    base.recompute_layers = parse_recompute_layers(step);
    return base;
}

/// The micro-batches per step --global-batch implies at this micro-batch and dp, into `p`.
void apply_global_batch(Parallelism& p, const std::string& global_batch,
                        std::uint64_t micro_batch) {
    const std::uint64_t global = parse_count("--global-batch", global_batch, 0);
    const std::uint64_t dp = p.dp;
    // Sequences one micro-batch step takes; a product past 64 bits is more than any batch.
    if (dp > std::numeric_limits<std::uint64_t>::max() / micro_batch)
        throw usage_error(
            fmt::format("--global-batch {} is not a multiple of micro-batch x dp = "
                        "{} x {}, which exceeds 2^64",
                        global, micro_batch, dp));
    const std::uint64_t per_step = micro_batch * dp;
    if (global % per_step != 0)
        throw usage_error(
            fmt::format("--global-batch {} is not a multiple of micro-batch x dp = {} x {} = {}",
                        global, micro_batch, dp, per_step));
    const std::uint64_t implied = global / per_step;
    if (p.microbatches != 0 && p.microbatches != implied)
        throw usage_error(
            fmt::format("--microbatches {} disagrees with --global-batch {} (which implies {})",
                        p.microbatches, global, implied));
    p.microbatches = implied;
}

}  // namespace

/// The layouts of one step over devices: every combination of the --dp, --tp, --pp and --zero
/// lists. The micro-batch count follows from --global-batch when given.
std::vector<Parallelism> parse_layouts(const ParallelOptions& q, const StepOptions& step,
                                       std::uint64_t micro_batch) {
    const Parallelism base = base_layout(q, step);
    const auto list = [](const char* option, const std::string& text) {
        return text.empty() ? std::vector<std::uint64_t>{1} : parse_sizes(option, text);
    };
    const auto tps = list("--tp", q.tp);
    if (q.sp && tps == std::vector<std::uint64_t>{1})
        throw usage_error("--sp (sequence parallelism) needs --tp greater than 1");
    std::vector<Parallelism> layouts;
    for (auto dp : list("--dp", q.dp))
        for (auto tp : tps)
            for (auto pp : list("--pp", q.pp))
                for (auto zero : q.zero.empty() ? std::vector<unsigned>{0} : parse_zero(q.zero)) {
                    Parallelism p = base;
                    p.dp = dp, p.tp = tp, p.pp = pp, p.zero = zero;
                    // in a sweep, --sp applies where there is tensor parallelism
                    p.sequence_parallel = q.sp && tp > 1;
                    if (!q.global_batch.empty()) apply_global_batch(p, q.global_batch, micro_batch);
                    layouts.push_back(p);
                }
    return layouts;
}

ListLengths layout_list_lengths(const ParallelOptions& q) {
    ListLengths lengths;
    for (const auto& [option, text] : {std::pair<const char*, const std::string&>{"--dp", q.dp},
                                       {"--tp", q.tp},
                                       {"--pp", q.pp},
                                       {"--zero", q.zero}})
        lengths.emplace_back(option, text.empty() ? 1 : split_list(option, text).size());
    return lengths;
}

void check_sweep_size(const std::string& sweep_limit, const ListLengths& lists) {
    const std::uint64_t limit = parse_count("--sweep-limit", sweep_limit, default_sweep_limit);
    std::uint64_t product = 1;
    bool past = false;  // past 64 bits, let alone the limit
    std::vector<std::string> factors;
    for (const auto& [option, length] : lists) {
        if (length < 2) continue;
        factors.push_back(fmt::format("{} {}", option, length));
        past = past || product > std::numeric_limits<std::uint64_t>::max() / length;
        product = past ? product : product * length;
    }
    if (!past && product <= limit) return;
    const std::string size = past ? "over 2^64" : digits(Count(product));
    throw usage_error(
        fmt::format("a sweep of {} configurations ({}) exceeds the limit of {}: "
                    "shorten the lists or raise --sweep-limit",
                    size, fmt::join(factors, " x "), digits(Count(limit))));
}

}  // namespace memcalc::cli
