#include "recipe_file.hpp"

#include <algorithm>
#include <map>
#include <vector>

#include "json_reader.hpp"
#include "memcalc/text.hpp"
#include "model_file.hpp"
#include "suggest.hpp"

namespace memcalc::cli {

namespace {

const std::vector<std::string> recipe_keys = {"name",     "description", "weights",     "gradients",
                                              "master",   "activations", "optimizer",   "state",
                                              "autocast", "linears",     "linear_casts"};
/// What the listing derives from the keys above: accepted, and checked against them.
const std::vector<std::string> derived_keys = {
    "weight_bytes",     "gradient_bytes",      "master_bytes",   "optimizer_bytes",
    "activation_bytes", "bytes_per_parameter", "optimizer_rule", "linear_casts_source"};

std::map<std::string, DType> dtype_choices() {
    std::map<std::string, DType> choices;
    for (const auto& row : dtype_rows)
        if (bytes_per_element(row.dtype) != 0)
            choices.emplace(row.name, row.dtype);  // whole bytes: computed in
    return choices;
}

/// The recipe's linears: Transformer Engine's narrow ones, or casting ones (torchao's).
void read_linears(const JsonReader& in, Recipe& r, const std::map<std::string, DType>& dtypes) {
    // Narrow linears as Transformer Engine runs them: two casts of each weight kept. A dtype's
    // name, or a block-scaled format's (narrow_linear_formats).
    if (in.has("linears")) {
        std::map<std::string, NarrowLinears> formats;  // the named rows first: their sources
        for (const auto& row : narrow_linear_formats) formats.emplace(row.key, row.linears);
        for (const auto& [name, dtype] : dtypes) formats.emplace(name, NarrowLinears{{dtype}, 2});
        r.linears = in.choice_or<NarrowLinears>("linears", formats, recipe_table::te_fp8);
    }
    if (r.linears && dtype_bits(r.linears->storage.dtype) >= 8 * r.activation_bytes())
        in.fail(std::string("linears is ") + narrow_linear_key(*r.linears) +
                ", not narrower than the activations (" + dtype_name(r.activations) + ")");
    if (r.linears && r.autocast) in.fail("a recipe with linears cannot also run under autocast");
    if (in.has("linear_casts")) {
        std::map<std::string, const LinearCasts*> casts;
        for (const auto& row : linear_cast_rows) casts.emplace(std::string(row.key), &row);
        r.casts = in.choice_or<const LinearCasts*>("linear_casts", casts, nullptr);
    }
    if (r.casts != nullptr && (r.linears || r.autocast))
        in.fail(
            "a recipe with linear_casts keeps its linears' inputs as they came: no linears "
            "or autocast beside it");
}

}  // namespace

Recipe parse_recipe_json(std::string_view text, const std::string& origin) {
    const nlohmann::json document = parse_json(text, origin);
    std::vector<std::string> known = recipe_keys;
    known.insert(known.end(), derived_keys.begin(), derived_keys.end());
    expect_object(document, origin, "a recipe", known);

    const JsonReader in(document, origin);
    if (!in.has("name")) in.fail("missing key 'name'");
    for (const char* key : {"weights", "gradients", "activations", "optimizer"})
        if (!in.has(key)) in.fail(std::string("missing key '") + key + "'");
    const std::map<std::string, DType> dtypes = dtype_choices();
    std::map<std::string, const Optimizer*> optimizer_choices;
    for (const auto& o : optimizers) optimizer_choices.emplace(std::string(o.name), &o);

    Recipe r{intern(in.shown_text_or("name", "")),
             in.choice_or<DType>("weights", dtypes, DType::bf16),
             in.choice_or<DType>("gradients", dtypes, DType::bf16),
             std::nullopt,  // "master": null or absent for none
             in.choice_or<DType>("activations", dtypes, DType::bf16),
             *in.choice_or<const Optimizer*>("optimizer", optimizer_choices, nullptr),
             in.choice_or<DType>("state", dtypes,
                                 DType::fp32),  // absent: fp32, as memcalc 1.2's files meant
             intern(in.shown_text_or("description", ""))};
    if (r.name.empty()) in.fail("name must not be empty");
    if (in.has("master")) r.master = in.choice_or<DType>("master", dtypes, DType::fp32);
    if (in.has("autocast")) r.autocast = in.flag_or("autocast", false);
    read_linears(in, r, dtypes);

    // null where the optimiser's state is counted tensor by tensor; the rule says how.
    const auto number = [](std::optional<std::uint64_t> n) {
        return n ? nlohmann::json(*n) : nlohmann::json(nullptr);
    };
    const std::map<std::string, nlohmann::json> derived = {
        {"weight_bytes", r.weight_bytes()},
        {"gradient_bytes", r.gradient_bytes()},
        {"master_bytes", r.master_bytes()},
        {"optimizer_bytes", number(r.optimizer_bytes())},
        {"activation_bytes", r.activation_bytes()},
        {"bytes_per_parameter", number(r.bytes_per_parameter())},
        {"linear_casts_source", linears_source(r).empty()
                                    ? nlohmann::json(nullptr)
                                    : nlohmann::json(std::string(linears_source(r)))},
        {"optimizer_rule", r.optimizer.rule.empty()
                               ? nlohmann::json(nullptr)
                               : nlohmann::json(std::string(r.optimizer.rule))}};
    for (const auto& [key, value] : derived) {
        if (!document.contains(key)) continue;
        const nlohmann::json& given = document.at(key);
        const bool same =
            value.is_number() ? given.is_number_unsigned() && given == value : given == value;
        if (!same)
            in.fail(key + " is " + given.dump() + ", but the dtypes and the optimiser make it " +
                    value.dump());
    }
    return r;
}

Recipe load_recipe_file(const std::string& path) {
    return parse_recipe_json(read_text_file(path, "recipe file"), path);
}

}  // namespace memcalc::cli
