#include "model_file.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "memcalc/error.hpp"
#include "presets_data.hpp"
#include "suggest.hpp"

namespace memcalc::cli {
namespace {

using nlohmann::json;

const std::vector<std::string> architecture_keys = {
    "hidden", "layers", "heads", "kv_heads", "head_dim", "ffn", "vocab", "max_positions", "mlp", "norm",
    "bias", "position", "tied_embeddings", "experts", "experts_per_token"};
const std::vector<std::string> metadata_keys = {"name", "description", "source", "published_parameters"};

/// Reads one JSON object's keys with messages that name the file, the key and the value.
class Reader {
public:
    Reader(const json& object, std::string origin) : object_(object), origin_(std::move(origin)) {}

    [[noreturn]] void fail(const std::string& message) const { throw error(origin_ + ": " + message); }

    bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

    std::uint64_t positive(const char* key) const {
        if (!object_.contains(key)) fail(std::string("missing key '") + key + "'");
        const json& v = object_.at(key);
        // nlohmann stores non-negative integers as unsigned, negative ones as signed.
        if (v.is_number_unsigned() && v.get<std::uint64_t>() > 0) return v.get<std::uint64_t>();
        if (v.is_number_integer()) fail(std::string(key) + " must be a positive integer (got " + v.dump() + ")");
        if (v.is_number_float())
            fail(std::string(key) + " must be a positive integer below 2^64 (got " + v.dump() + ")");
        fail(std::string(key) + " must be a positive integer (got " + type_and_value(v) + ")");
    }
    std::uint64_t positive_or(const char* key, std::uint64_t otherwise) const {
        return has(key) ? positive(key) : otherwise;
    }

    std::string text_or(const char* key, std::string otherwise) const {
        if (!has(key)) return otherwise;
        const json& v = object_.at(key);
        if (!v.is_string()) fail(std::string(key) + " must be a string (got " + type_and_value(v) + ")");
        return v.get<std::string>();
    }

    bool flag_or(const char* key, bool otherwise) const {
        if (!has(key)) return otherwise;
        const json& v = object_.at(key);
        if (!v.is_boolean()) fail(std::string(key) + " must be true or false (got " + type_and_value(v) + ")");
        return v.get<bool>();
    }

    template <typename Enum>
    Enum choice_or(const char* key, const std::map<std::string, Enum>& choices, Enum otherwise) const {
        if (!has(key)) return otherwise;
        const std::string value = text_or(key, "");
        const auto it = choices.find(value);
        if (it != choices.end()) return it->second;
        std::string names;
        std::vector<std::string> candidates;
        for (const auto& [name, unused] : choices) {
            names += (names.empty() ? "" : ", ") + name;
            candidates.push_back(name);
        }
        fail(std::string(key) + " must be one of " + names + " (got '" + value + "')" + did_you_mean(value, candidates));
    }

private:
    static std::string type_and_value(const json& v) {
        if (v.is_structured()) return v.type_name();  // not dumped: it may be large or deeply nested
        std::string shown = v.dump();
        if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
        return std::string(v.type_name()) + " " + shown;
    }
    const json& object_;
    std::string origin_;
};

}  // namespace

ModelFile parse_model_json(std::string_view text, const std::string& origin, const std::string& default_name) {
    json document;
    try {
        document = json::parse(text.begin(), text.end());
    } catch (const json::parse_error& e) {
        // nlohmann's message says where ("at line 3, column 5") and what it expected; drop its tag.
        std::string what = e.what();
        const auto tag_end = what.find("] ");
        if (tag_end != std::string::npos) what = what.substr(tag_end + 2);
        throw error(origin + ": malformed JSON: " + what);
    }
    if (!document.is_object()) throw error(origin + ": expected a JSON object describing a model (got " +
                                           std::string(document.type_name()) + ")");

    std::vector<std::string> known = architecture_keys;
    known.insert(known.end(), metadata_keys.begin(), metadata_keys.end());
    for (const auto& [key, unused] : document.items())
        if (std::find(known.begin(), known.end(), key) == known.end())
            throw error(origin + ": unknown key '" + key + "'" + did_you_mean(key, known));

    const Reader in(document, origin);
    ModelFile file;
    Architecture& m = file.architecture;
    m.name = in.text_or("name", default_name);
    m.hidden = in.positive("hidden");
    m.layers = in.positive("layers");
    m.heads = in.positive("heads");
    m.kv_heads = in.positive_or("kv_heads", 0);
    m.head_dim = in.positive_or("head_dim", 0);
    m.ffn = in.positive("ffn");
    m.vocab = in.positive("vocab");
    m.max_positions = in.positive_or("max_positions", 0);
    m.mlp = in.choice_or<Mlp>("mlp", {{"gated", Mlp::gated}, {"plain", Mlp::plain}}, Mlp::gated);
    m.norm = in.choice_or<Norm>("norm", {{"rmsnorm", Norm::rmsnorm}, {"layernorm", Norm::layernorm}}, Norm::rmsnorm);
    m.bias = in.choice_or<Bias>("bias", {{"none", Bias::none}, {"qkv", Bias::qkv}, {"all", Bias::all}}, Bias::none);
    m.position = in.choice_or<Position>(
        "position", {{"rotary", Position::rotary}, {"learned", Position::learned}, {"none", Position::none}},
        Position::rotary);
    m.tied_embeddings = in.flag_or("tied_embeddings", false);
    m.experts = in.positive_or("experts", 0);
    m.experts_per_token = in.positive_or("experts_per_token", 0);
    file.description = in.text_or("description", "");
    file.source = in.text_or("source", "");
    if (in.has("published_parameters")) file.published_parameters = in.positive("published_parameters");

    try {
        validate(m);
    } catch (const error& e) {
        throw error(origin + ": " + e.what());
    }
    return file;
}

ModelFile load_model_file(const std::string& path) {
    std::ifstream stream(path, std::ios::binary);
    if (!stream) throw error("cannot read model file '" + path + "'");
    std::ostringstream text;
    text << stream.rdbuf();
    if (stream.bad()) throw error("cannot read model file '" + path + "'");
    return parse_model_json(text.str(), path, std::filesystem::path(path).stem().string());
}

std::vector<std::string> preset_names() {
    std::vector<std::string> names;
    for (const auto& p : embedded_presets) names.emplace_back(p.name);
    std::sort(names.begin(), names.end());
    return names;
}

ModelFile load_preset(const std::string& name) {
    for (const auto& p : embedded_presets)
        if (name == p.name) return parse_model_json(p.json, "preset " + name, name);
    throw error("unknown preset '" + name + "'" + did_you_mean(name, preset_names()) +
                "; 'memcalc presets' lists them");
}

}  // namespace memcalc::cli
