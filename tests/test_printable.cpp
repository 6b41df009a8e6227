// Every name a user's file or command line gives reaches a terminal as characters, never as a
// control sequence: printable() escapes, and the program prints each such text through it.
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "printable.hpp"
#include "run_program.hpp"

namespace {

/// Whether `text` holds what a terminal could take as control: a C0 control but a newline, DEL,
/// a C1 control in UTF-8 (0xc2 0x80..0x9f) or U+202E, the right-to-left override.
bool has_controls(const std::string& text) {
    for (std::size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
        const bool c0 = (c < 0x20 && c != '\n') || c == 0x7f;
        const bool c1 = c == 0xc2 && next >= 0x80 && next <= 0x9f;
        if (c0 || c1 || text.compare(i, 3, "\xe2\x80\xae") == 0) return true;
    }
    return false;
}

}  // namespace

TEST_CASE("printable escapes controls, bidi overrides and ill-formed UTF-8", "[printable]") {
    using memcalc::cli::printable;
    using Row = std::pair<std::string, std::string>;
    auto [raw, shown] = GENERATE(table<std::string, std::string>({
        Row{"llama-7b", "llama-7b"},
        Row{"tab\there", "tab\\x09here"},
        Row{"esc\x1b[31mred", "esc\\x1b[31mred"},
        Row{"del\x7f", "del\\x7f"},
        Row{"csi \xc2\x9b"
            "31m",
            "csi \\x9b31m"},               // U+009B, the 8-bit CSI, as UTF-8
        Row{"nel \xc2\x85", "nel \\x85"},  // U+0085, next line
        Row{"raw \x9b", "raw \\x9b"},      // a lone C1 byte: not UTF-8
        Row{"rlo \xe2\x80\xae"
            "gpj.exe",
            "rlo \\u202egpj.exe"},  // U+202E, right-to-left override
        Row{"isolate \xe2\x81\xa6", "isolate \\u2066"},
        Row{"line \xe2\x80\xa8", "line \\u2028"},
        Row{"overlong \xc0\xaf", "overlong \\xc0\\xaf"},
        Row{"surrogate \xed\xa0\x80", "surrogate \\xed\\xa0\\x80"},
        Row{"cut \xe2\x82", "cut \\xe2\\x82"},
        Row{"caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80",
            "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80"},
    }));
    CAPTURE(raw);
    CHECK(printable(raw) == shown);
    CHECK(printable(shown) == shown);  // escaping twice changes nothing
}

TEST_CASE("names from recipe, GPU and model files reach stdout escaped", "[printable][cli]") {
    const std::string evil = R"(evil\u001b]0;title\u0007\u009b31m\u0085\u202e\nforged)";
    const std::string shown = "evil\\x1b]0;title\\x07\\x9b31m\\x85\\u202e\\x0aforged";
    std::ofstream("printable_recipe.json")
        << R"({"name": ")" << evil << R"(", "description": ")" << evil
        << R"(", "weights": "bf16", "gradients": "bf16", "activations": "bf16",
        "optimizer": "adam"})";
    std::ofstream("printable_gpu.json") << R"({"name": ")" << evil << R"(", "description": ")"
                                        << evil << R"(", "memory_bytes": 25757220864})";
    std::ofstream("printable_model.json") << R"({"name": ")" << evil << R"(", "hidden": 64,
        "layers": 2, "heads": 4, "ffn": 256, "vocab": 100})";
    const std::string base =
        "--model-file printable_model.json --seq 16 --activations architecture"
        " --recipe-file printable_recipe.json";
    const std::string fit = "fit --model-file printable_model.json --gpu-file printable_gpu.json";
    const std::vector<std::string> runs = {base, base + " --format json", base + " --format csv",
                                           fit, fit + " --format json"};
    for (const std::string& args : runs) {
        const auto run = testing::memcalc(args);
        CAPTURE(args, run.err);
        REQUIRE(run.status == 0);
        CHECK_FALSE(has_controls(run.out));
        CHECK_THAT(run.out, Catch::Contains(args.find("--format json") != std::string::npos
                                                ? nlohmann::json(shown).dump().substr(1, 20)
                                                : shown));
    }
    for (const char* f : {"printable_recipe.json", "printable_gpu.json", "printable_model.json"})
        std::remove(f);
}

TEST_CASE("an error quoting the user's value prints it escaped, on one line", "[printable][cli]") {
    // printf's octal escapes: the shell that runs the program is sh, which has no $'...'.
    for (const char* args :
         {R"sh(--preset "$(printf 'llama\033[2J\302\233')")sh",
          R"sh(--profile "$(printf 'x\ny\342\200\256')")sh", R"sh(--seq "$(printf '12\033')")sh",
          R"sh("$(printf -- '--no-such-option-\033')")sh"}) {
        const auto run = testing::shell(std::string("memcalc ") + args);
        CAPTURE(args, run.err);
        CHECK(run.status != 0);
        CHECK(run.out.empty());
        CHECK_FALSE(has_controls(run.err));
        CHECK(std::count(run.err.begin(), run.err.end(), '\n') == 1);
    }
}
