// libFuzzer target: the command line's values: sizes ("80GB"), comma lists, modes, ZeRO stages,
// framework switches.
#include <cstdint>
#include <string>

#include "arguments.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace memcalc::cli;
    const std::string text(reinterpret_cast<const char*>(data), size);
    const auto attempt = [](auto&& parse) {
        try {
            parse();
        } catch (const usage_error&) {}
    };
    attempt([&] { (void)parse_size("--device-memory", text); });
    attempt([&] { (void)parse_sizes("--seq", text); });
    attempt([&] { (void)parse_modes(text); });
    attempt([&] { (void)parse_attention(text); });
    attempt([&] { (void)parse_zero(text); });
    memcalc::for_each_switch(
        [&](const auto& row) { attempt([&] { (void)parse_switch(row, text); }); });
    attempt([&] {
        ParallelOptions q;
        q.dp = text, q.global_batch = text, q.first_stage_layers = text;
        (void)parse_layouts(q, StepOptions{}, 1);
    });
    return 0;
}
