// The WebAssembly build's entry point: memcalc's whole command line, run in-process. post.js wraps
// it as Module.run(args) -> {status, out, err}, which the page (app.js) and the node test call.
#include <emscripten/emscripten.h>

#include <sstream>
#include <string>
#include <vector>

#include "command_line.hpp"

namespace {
std::string out_text;
std::string err_text;
}  // namespace

extern "C" {

/// Runs `memcalc` with the arguments in `buffer`: `size` bytes of NUL-terminated strings, one after
/// another. Returns the exit status; memcalc_out() and memcalc_err() then hold what it printed.
EMSCRIPTEN_KEEPALIVE int memcalc_run(const char* buffer, int size) {
    std::vector<std::string> args{"memcalc"};
    for (int start = 0; start < size;) {
        args.emplace_back(buffer + start);
        start += static_cast<int>(args.back().size()) + 1;
    }
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    std::ostringstream out;
    std::ostringstream err;
    const int status =
        memcalc::cli::run_command_line(static_cast<int>(argv.size()), argv.data(), out, err);
    out_text = out.str();
    err_text = err.str();
    return status;
}

EMSCRIPTEN_KEEPALIVE const char* memcalc_out() { return out_text.c_str(); }
EMSCRIPTEN_KEEPALIVE const char* memcalc_err() { return err_text.c_str(); }
}
