// parse_json, the one JSON reader of every file memcalc reads: its messages, its bound on nesting,
// and its time against the input's size.
#include <catch2/catch.hpp>
#include <algorithm>
#include <chrono>
#include <string>

#include "json_reader.hpp"

using memcalc::cli::parse_json;

namespace {

/// An object of `n` members, each `member(i)`'s text.
template <typename Member>
std::string object_of(std::size_t n, Member member) {
    std::string text = "{";
    for (std::size_t i = 0; i < n; ++i)
        text += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":" + member(i);
    return text + "}";
}

/// The fastest of three parses of `text`, in seconds: the least disturbed by other work.
double seconds_to_parse(const std::string& text) {
    const auto start = std::chrono::steady_clock::now();
    const nlohmann::json document = parse_json(text, "big.json");
    const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
    REQUIRE(document.size() > 0);
    return took.count();
}

/// The fastest parse of `large` over the fastest of `small`, the two taken in turn, so that a busy
/// machine slows both alike.
double parse_time_ratio(const std::string& small, const std::string& large) {
    double best_small = 1e9, best_large = 1e9;
    for (int run = 0; run < 7; ++run) {
        best_small = std::min(best_small, seconds_to_parse(small));
        best_large = std::min(best_large, seconds_to_parse(large));
    }
    return best_large / best_small;
}

}  // namespace

TEST_CASE("parse_json: syntax errors say where, repeated keys and huge numbers are named",
          "[json]") {
    using Row = std::pair<std::string, std::string>;
    const auto [text, message] = GENERATE(table<std::string, std::string>({
        Row{"{\"a\": 1,\n \"b\": }",
            "f.json: malformed JSON: parse error at line 2, column 7: syntax error"},
        Row{"", "f.json: malformed JSON: parse error at line 1, column 1"},
        Row{"{} []", "f.json: malformed JSON: parse error at line 1, column 4"},
        Row{R"({"a": {"b": 1, "c": [{"b": 2, "b": 3}]}})",
            "f.json: key 'b' appears twice in one object"},
        Row{R"({"a": 1e999})", "f.json: malformed JSON: number overflow parsing '1e999'"},
    }));
    CAPTURE(text);
    CHECK_THROWS_WITH(parse_json(text, "f.json"), Catch::StartsWith(message));
}

TEST_CASE("parse_json: the document as nlohmann builds it, keys in their own objects", "[json]") {
    const auto text = R"({"b": [1, -2, 2.5, "x", true, null, {}, []], "a": {"b": {"a": 0}},
                          "c": 18446744073709551615})";
    CHECK(parse_json(text, "f.json") == nlohmann::json::parse(text));
    CHECK(parse_json("7", "f.json") == 7);
}

TEST_CASE("parse_json: nesting deeper than its limit is refused, naming the limit", "[json]") {
    const auto nested = [](std::size_t depth) {
        return std::string(depth, '[') + std::string(depth, ']');
    };
    CHECK(parse_json(nested(memcalc::cli::max_json_depth), "f.json").is_array());
    // 100,000 levels parsed whole, then copied or printed recursively, overflow the stack.
    std::string objects;
    for (int level = 0; level < 100'000; ++level) objects += "{\"a\":";
    for (const std::string& text : {nested(memcalc::cli::max_json_depth + 1), nested(100'000),
                                    std::string(100'000, '['), objects})
        CHECK_THROWS_WITH(
            parse_json(text, "f.json"),
            "f.json: JSON nested deeper than 512 arrays and objects (memcalc's limit)");
}

TEST_CASE("parse_json: time linear in the input, however many keys an object has",
          "[json][slow-sanitized]") {
    // Eight times the keys: 9 to 16 times the time (a map's log n, the cache); 64 if quadratic.
    const auto number = [](std::size_t i) { return std::to_string(i); };
    const auto tensor = [](std::size_t i) {  // an object in an object: a safetensors header's shape
        return R"({"dtype":"BF16","shape":[64],"data_offsets":[)" + std::to_string(128 * i) + "," +
               std::to_string(128 * i + 128) + "]}";
    };
    // A shared machine can slow one size's runs: measured again (three times at most) over 32,
    // where a quadratic parse stays at 64 every time.
    const auto ratio = [](const std::string& small, const std::string& large) {
        double best = parse_time_ratio(small, large);
        for (int again = 0; again < 2 && best >= 32; ++again)
            best = std::min(best, parse_time_ratio(small, large));
        return best;
    };
    CHECK(ratio(object_of(6'000, number), object_of(48'000, number)) < 32);
    CHECK(ratio(object_of(2'000, tensor), object_of(16'000, tensor)) < 32);
}
