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
    JsonReader(const nlohmann::json& object, std::string origin) : object_(object), origin_(std::move(origin)) {}

    [[noreturn]] void fail(const std::string& message) const { throw error(origin_ + ": " + message); }

    bool has(const char* key) const { return object_.contains(key) && !object_.at(key).is_null(); }

    std::uint64_t positive(const char* key) const {
        if (!object_.contains(key)) fail(std::string("missing key '") + key + "'");
        const nlohmann::json& v = object_.at(key);
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
        if (!v.is_array()) fail(std::string(key) + " must be an array of non-negative integers (got " + type_and_value(v) + ")");
        for (const auto& item : v) {
            if (!item.is_number_unsigned())
                fail(std::string(key) + " must hold non-negative integers (got " + type_and_value(item) + ")");
            values.push_back(item.get<std::uint64_t>());
        }
        return values;
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

    double probability_or(const char* key, double otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() < 1))
            fail(std::string(key) + " must be a probability in [0, 1) (got " + type_and_value(v) + ")");
        return v.get<double>();
    }

    /// Whether the key is given as a string (a key that may be a number or a word, "auto").
    bool is_text(const char* key) const { return has(key) && object_.at(key).is_string(); }

    std::string text_or(const char* key, std::string otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_string()) fail(std::string(key) + " must be a string (got " + type_and_value(v) + ")");
        return v.get<std::string>();
    }

    /// A text the program prints (a name, a description, a source): its controls escaped.
    std::string shown_text_or(const char* key, std::string otherwise) const {
        return printable(text_or(key, std::move(otherwise)));
    }

    bool flag_or(const char* key, bool otherwise) const {
        if (!has(key)) return otherwise;
        const nlohmann::json& v = object_.at(key);
        if (!v.is_boolean()) fail(std::string(key) + " must be true or false (got " + type_and_value(v) + ")");
        return v.get<bool>();
    }

    /// true or false, or a count read as "non-zero" (configs that once wrote a flag as a number).
    bool flag_or_count(const char* key, bool otherwise) const {
        if (!has(key)) return otherwise;
        if (object_.at(key).is_boolean()) return object_.at(key).get<bool>();
        if (object_.at(key).is_number_unsigned()) return object_.at(key).get<std::uint64_t>() != 0;
        fail(std::string(key) + " must be true, false or a non-negative integer (got " + type_and_value(object_.at(key)) + ")");
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
    static std::string type_and_value(const nlohmann::json& v) {
        if (v.is_structured()) return v.type_name();  // not dumped: it may be large or deeply nested
        std::string shown = v.dump();
        if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
        return std::string(v.type_name()) + " " + shown;
    }
    const nlohmann::json& object_;
    std::string origin_;
};

/// `document` as one JSON object describing `what` ("a model"), with no key outside `known`: else an
/// error naming the text, and the nearest known key.
inline void expect_object(const nlohmann::json& document, const std::string& origin, const char* what,
                          const std::vector<std::string>& known) {
    if (!document.is_object())
        throw error(origin + ": expected a JSON object describing " + what + " (got " + document.type_name() + ")");
    for (const auto& [key, unused] : document.items())
        if (std::find(known.begin(), known.end(), key) == known.end())
            throw error(origin + ": unknown key '" + key + "'" + did_you_mean(key, known));
}

/// Parses JSON text, turning a syntax error into memcalc::error that says where ("at line 3, column 5").
/// A key given twice in one object is an error: JSON parsers disagree on which one wins.
inline nlohmann::json parse_json(std::string_view text, const std::string& origin) {
    std::vector<std::vector<std::string>> keys;  // the keys seen so far in each open object
    const auto refuse_duplicates = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start) keys.emplace_back();
        if (event == Event::object_end) keys.pop_back();
        if (event == Event::key) {
            const std::string key = parsed.get<std::string>();
            if (std::find(keys.back().begin(), keys.back().end(), key) != keys.back().end())
                throw error(origin + ": key '" + key + "' appears twice in one object");
            keys.back().push_back(key);
        }
        return true;
    };
    try {
        return nlohmann::json::parse(text.begin(), text.end(), refuse_duplicates);
    } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number too large for a double
        std::string what = e.what();  // drop nlohmann's "[json.exception.parse_error.101] " tag
        const auto tag_end = what.find("] ");
        if (tag_end != std::string::npos) what = what.substr(tag_end + 2);
        throw error(origin + ": malformed JSON: " + what);
    }
}

}  // namespace memcalc::cli
