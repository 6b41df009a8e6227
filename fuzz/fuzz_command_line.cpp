// libFuzzer target: the whole program, in process. The input is a command line, one argument per
// line, after "memcalc"; every option and subcommand is reachable (fuzz/command_line.dict names them).
// It runs in a scratch folder of its own, and an input naming a path outside it is skipped, so
// --output, --plot, --model-file and --config only ever touch files there. A run that ends in
// memcalc's "internal error" (an exception nothing named) is a bug: it aborts.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "command_line.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    char folder[] = "/tmp/memcalc-fuzz-XXXXXX";
    if (mkdtemp(folder) == nullptr || chdir(folder) != 0) std::abort();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::vector<std::string> words{"memcalc"};
    std::string word;
    for (std::size_t i = 0; i <= size; ++i) {
        if (i == size || data[i] == '\n') {
            words.push_back(word);
            word.clear();
        } else {
            word += static_cast<char>(data[i]);
        }
    }
    if (words.size() > 40) return 0;
    bool plans = false;
    for (const auto& w : words) {
        if (w.find('/') != std::string::npos || w.find("..") != std::string::npos || w.size() > 200) return -1;
        plans = plans || w == "plan" || w == "fit";
    }
    // A plan or fit of a huge cluster or batch is slow, not wrong: keep their numbers small.
    if (plans)
        for (const auto& w : words)
            if (w.size() > 5 && w.find_first_not_of("0123456789") == std::string::npos) return -1;
    std::vector<const char*> argv;
    for (const auto& w : words) argv.push_back(w.c_str());
    std::ostringstream out, err;
    std::streambuf* const cout = std::cout.rdbuf(out.rdbuf());
    std::streambuf* const cerr = std::cerr.rdbuf(err.rdbuf());
    const int status = memcalc::cli::run_command_line(static_cast<int>(argv.size()), argv.data());
    std::cout.rdbuf(cout);
    std::cerr.rdbuf(cerr);
    if (err.str().rfind("memcalc: internal error", 0) == 0) {  // at the start: not an argument echoed back
        std::cerr << err.str();
        std::abort();
    }
    if (status != 0 && !out.str().empty() && out.str().find("Usage") == std::string::npos) {
        std::cerr << "a failed run printed on stdout\n";
        std::abort();
    }
    return 0;
}
