// libFuzzer target: the whole program, in process. The input is a command line, one argument per
// line, after "memcalc"; every option and subcommand is reachable (fuzz/command_line.dict names
// them). It runs in a scratch folder of its own, and an input naming a path outside it is skipped,
// so
// --output, --plot, --model-file and --config only ever touch files there.
#include "in_process.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    enter_scratch_folder();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    const auto words = split(std::string(reinterpret_cast<const char*>(data), size));
    if (!fit_to_run(words)) return -1;
    run_memcalc(words);
    return 0;
}
