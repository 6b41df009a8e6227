#pragma once
// The program run in process for the fuzz targets, in a scratch folder of their own, its output
// captured. A run that ends in memcalc's "internal error" (an exception nothing named), or one that
// fails yet printed on stdout, is a bug: it aborts.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "memcalc/error.hpp"

#include "command_line.hpp"

/// Moves into a new folder under /tmp, where every file a run reads or writes then lies.
inline void enter_scratch_folder() {
    char folder[] = "/tmp/memcalc-fuzz-XXXXXX";
    if (mkdtemp(folder) == nullptr || chdir(folder) != 0) std::abort();
}

/// The words of `text` split at `separator`: a fuzzed command line's arguments, one a line.
inline std::vector<std::string> split(const std::string& text, char separator = '\n') {
    std::vector<std::string> words(1);
    for (char c : text)
        if (c == separator)
            words.emplace_back();
        else
            words.back() += c;
    return words;
}

/// Whether to run a fuzzed command line: not one naming a path outside the scratch folder, nor a
/// plan or fit of a huge cluster or batch (slow, not wrong: their numbers are kept small).
inline bool fit_to_run(const std::vector<std::string>& words) {
    if (words.size() > 40) return false;
    bool plans = false;
    for (const auto& w : words) {
        if (w.find('/') != std::string::npos || w.find("..") != std::string::npos || w.size() > 200)
            return false;
        plans = plans || w == "plan" || w == "fit";
    }
    if (plans)
        for (const auto& w : words)
            if (w.size() > 5 && w.find_first_not_of("0123456789") == std::string::npos)
                return false;
    return true;
}

/// Runs `memcalc words...`, aborting on a bug.
inline void run_memcalc(const std::vector<std::string>& words) {
    std::vector<const char*> argv{"memcalc"};
    for (const auto& w : words) argv.push_back(w.c_str());
    std::ostringstream out, err;
    std::streambuf* const cout = std::cout.rdbuf(out.rdbuf());
    std::streambuf* const cerr = std::cerr.rdbuf(err.rdbuf());
    const int status = memcalc::cli::run_command_line(static_cast<int>(argv.size()), argv.data());
    std::cout.rdbuf(cout);
    std::cerr.rdbuf(cerr);
    if (err.str().rfind("memcalc: internal error", 0) == 0) {  // at the start: no argument echoed
        std::cerr << err.str();
        std::abort();
    }
    if (status != 0 && !out.str().empty() && out.str().find("Usage") == std::string::npos) {
        std::cerr << "a failed run printed on stdout\n";
        std::abort();
    }
}

/// A file the program reads (--recipe-file, ...): read by `parse`, and, when it reads, written to
/// `name` and given to each of `command_lines` (words split at spaces) that names it.
template <typename Parse>
void run_with_file(const std::uint8_t* data, std::size_t size, Parse parse, const std::string& name,
                   std::initializer_list<const char*> command_lines) {
    const std::string text(reinterpret_cast<const char*>(data), size);
    try {
        (void)parse(text, name);
    } catch (const memcalc::error&) {
        return;
    }
    std::ofstream(name, std::ios::binary) << text;
    for (const char* line : command_lines) run_memcalc(split(line, ' '));
}
