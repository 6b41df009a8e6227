#pragma once
// Reading the keys of one JSON object with messages that name the file, the key and the value.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memcalc/error.hpp"
#include "printable.hpp"
#include "suggest.hpp"

namespace memcalc::cli {

/// Reads one JSON object's keys with messages that name the file, the key and the value.
class JsonReader {
public:
    JsonReader(const nlohmann::json& object, std::string origin)
        : object_(object), origin_(std::move(origin)) {}

    [[noreturn]] void fail(const std::string& message) const {
        throw error(origin_ + ": " + message);
    }

    bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

    std::uint64_t positive(const char* key) const {
        if (!object_.contains(key)) fail(std::string("missing key '") + key + "'");
        const nlohmann::json& v = object_.at(key);
        // nlohmann stores non-negative integers as unsigned, negative ones as signed.
        if (v.is_number_unsigned() && v.get<std::uint64_t>() > 0) return v.get<std::uint64_t>();
        if (v.is_number_integer())
            fail(std::string(key) + " must be a positive integer (got " + v.dump() + ")");
        if (v.is_number_float())
            fail(std::string(key) + " must be a positive integer below 2^64 (got " + v.dump() +
                 ")");
        fail(std::string(key) + " must be a positive integer (got " + type_and_value(v) + ")");
    }
    std::uint64_t positive_or(const char* key, std::uint64_t otherwise) const {
        return has(key) ? positive(key) : otherwise;
    }
    /// A non-negative integer (0 allowed: "experts": 0 is a dense layer), when given.
    std::optional<std::uint64_t> count_if_given(const char* key) const {
        if (!has(key)) return std::nullopt;
        const nlohmann::json& v = object_.at(key);
        if (v.is_number_unsigned()) return v.get<std::uint64_t>();
        fail(std::string(key) + " must be a non-negative integer (got " + type_and_value(v) + ")");
    }

    /// An array of non-negative integers (layer indices), empty when absent.
    std::vector<std::uint64_t> counts_or_empty(const char* key) const {
        std::vector<std::uint64_t> values;
        if (!has(key)) return values;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_array())
            fail(std::string(key) + " must be an array of non-negative integers (got " +
                 type_and_value(v) + ")");
        for (const auto& item : v) {
            if (!item.is_number_unsigned())
                fail(std::string(key) + " must hold non-negative integers (got " +
                     type_and_value(item) + ")");
            values.push_back(item.get<std::uint64_t>());
        }
        return values;
    }

    /// How many entries an array holds (supported_aspect_ratios' pairs), `otherwise` when absent.
    std::uint64_t entries_or(const char* key, std::uint64_t otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_array())
            fail(std::string(key) + " must be an array (got " + type_and_value(v) + ")");
        return v.size();
    }

    /// An array of strings, when given.
    std::optional<std::vector<std::string>> texts_if_given(const char* key) const {
        if (!has(key)) return std::nullopt;
        const nlohmann::json& v = object_.at(key);
        std::vector<std::string> out;
        if (v.is_array())
            for (const auto& item : v)
                if (item.is_string()) out.push_back(item.get<std::string>());
        if (!v.is_array() || out.size() != v.size())
            fail(std::string(key) + " must be an array of strings (got " + type_and_value(v) + ")");
        return out;
    }

    double number_or(const char* key, double otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_number())
            fail(std::string(key) + " must be a number (got " + type_and_value(v) + ")");
        return v.get<double>();
    }

    double probability_or(const char* key, double otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() < 1))
            fail(std::string(key) + " must be a probability in [0, 1) (got " + type_and_value(v) +
                 ")");
        return v.get<double>();
    }

    /// Whether the key is given as a string (a key that may be a number or a word, "auto").
    bool is_text(const char* key) const { return has(key) && object_.at(key).is_string(); }

    std::string text_or(const char* key, std::string otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_string())
            fail(std::string(key) + " must be a string (got " + type_and_value(v) + ")");
        return v.get<std::string>();
    }

    /// A text the program prints (a name, a description, a source): its controls escaped.
    std::string shown_text_or(const char* key, std::string otherwise) const {
        return printable(text_or(key, std::move(otherwise)));
    }

    bool flag_or(const char* key, bool otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_boolean())
            fail(std::string(key) + " must be true or false (got " + type_and_value(v) + ")");
        return v.get<bool>();
    }

    /// true or false, or a count read as "non-zero" (configs that once wrote a flag as a number).
    bool flag_or_count(const char* key, bool otherwise) const {
        if (!has(key)) return otherwise;
        if (object_.at(key).is_boolean()) return object_.at(key).get<bool>();
        if (object_.at(key).is_number_unsigned()) return object_.at(key).get<std::uint64_t>() != 0;
        fail(std::string(key) + " must be true, false or a non-negative integer (got " +
             type_and_value(object_.at(key)) + ")");
    }

    template <typename Enum>
    Enum choice_or(const char* key, const std::map<std::string, Enum>& choices,
                   Enum otherwise) const {
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
        fail(std::string(key) + " must be one of " + names + " (got '" + value + "')" +
             did_you_mean(value, candidates));
    }

private:
    static std::string type_and_value(const nlohmann::json& v) {
        if (v.is_structured())
            return v.type_name();  // not dumped: it may be large or deeply nested
        std::string shown = v.dump();
        if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
        return std::string(v.type_name()) + " " + shown;
    }
    const nlohmann::json& object_;
    std::string origin_;
};

/// `document` as one JSON object describing `what` ("a model"), with no key outside `known`: else
/// an error naming the text, and the nearest known key.
inline void expect_object(const nlohmann::json& document, const std::string& origin,
                          const char* what, const std::vector<std::string>& known) {
    if (!document.is_object())
        throw error(origin + ": expected a JSON object describing " + what + " (got " +
                    document.type_name() + ")");
    for (const auto& [key, unused] : document.items())
        if (std::find(known.begin(), known.end(), key) == known.end())
            throw error(origin + ": unknown key '" + key + "'" + did_you_mean(key, known));
}

/// How deep parse_json lets arrays and objects nest: far past any config, and shallow enough that
/// copying or printing a document (recursive in nlohmann) never runs out of stack.
inline constexpr std::size_t max_json_depth = 512;

/// nlohmann's SAX events built into a document, each object's keys checked as they arrive (its map
/// finds a repeated key in log time) and the nesting bounded: linear in the text, unlike the
/// callback parser, whose end of each object rescans its parent.
class JsonDocumentBuilder {
public:
    using json = nlohmann::json;
    JsonDocumentBuilder(json& root, const std::string& origin) : root_(root), origin_(origin) {}

    bool null() { return place(nullptr); }
    bool boolean(bool value) { return place(value); }
    bool number_integer(json::number_integer_t value) { return place(value); }
    bool number_unsigned(json::number_unsigned_t value) { return place(value); }
    bool number_float(json::number_float_t value, const json::string_t&) { return place(value); }
    bool string(json::string_t& value) { return place(std::move(value)); }
    bool binary(json::binary_t& value) { return place(json::binary(std::move(value))); }
    bool start_object(std::size_t) { return open(json::value_t::object); }
    bool start_array(std::size_t) { return open(json::value_t::array); }
    bool end_object() { return close(); }
    bool end_array() { return close(); }

    bool key(json::string_t& name) {
        auto& members = open_.back()->get_ref<json::object_t&>();
        const auto [member, fresh] = members.emplace(std::move(name), nullptr);
        if (!fresh)
            throw error(origin_ + ": key '" + member->first + "' appears twice in one object");
        member_ = &member->second;
        return true;
    }

    /// A syntax error, or a number too large for a double: nlohmann's message, less its tag.
    template <typename Exception>
    bool parse_error(std::size_t, const std::string&, const Exception& e) {
        std::string what = e.what();  // drop "[json.exception.parse_error.101] "
        const auto tag_end = what.find("] ");
        if (tag_end != std::string::npos) what = what.substr(tag_end + 2);
        throw error(origin_ + ": malformed JSON: " + what);
    }

private:
    /// Puts a value where the document is up to: the root, the next array element or the member
    /// whose key came last.
    json& put(json value) {
        if (open_.empty()) return root_ = std::move(value);
        json& parent = *open_.back();
        if (!parent.is_array()) return *member_ = std::move(value);
        auto& elements = parent.get_ref<json::array_t&>();
        elements.push_back(std::move(value));
        return elements.back();
    }
    bool place(json value) {
        put(std::move(value));
        return true;
    }
    bool open(json::value_t type) {
        if (open_.size() == max_json_depth)
            throw error(origin_ + ": JSON nested deeper than " + std::to_string(max_json_depth) +
                        " arrays and objects (memcalc's limit)");
        open_.push_back(&put(json(type)));
        return true;
    }
    bool close() {
        open_.pop_back();
        return true;
    }

    json& root_;
    const std::string& origin_;
    std::vector<json*> open_;  // the arrays and objects not yet closed, innermost last
    json* member_ = nullptr;   // where the value of the key just read goes
};

/// Parses JSON text, turning a syntax error into memcalc::error that says where ("at line 3,
/// column 5"). A key given twice in one object is an error: parsers disagree on which one wins.
inline nlohmann::json parse_json(std::string_view text, const std::string& origin) {
    nlohmann::json document;
    JsonDocumentBuilder builder(document, origin);
    nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
    return document;
}

}  // namespace memcalc::cli
