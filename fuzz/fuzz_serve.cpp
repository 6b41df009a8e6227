// libFuzzer target: `memcalc serve` in process, the input its arguments, one a line (its options in
// fuzz/command_line.dict): the weights' formats, the KV cache, prefill and the largest batch.
#include "in_process.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    enter_scratch_folder();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    std::vector<std::string> words = split(std::string(reinterpret_cast<const char*>(data), size));
    words.insert(words.begin(), "serve");
    if (!fit_to_run(words)) return -1;
    run_memcalc(words);
    return 0;
}
