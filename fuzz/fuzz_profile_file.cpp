// libFuzzer target: a framework profile file (--profile-file); one that reads is estimated with,
// pipelined and shown step by step, through the program in process.
#include "in_process.hpp"
#include "profile_file.hpp"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    enter_scratch_folder();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    run_with_file(data, size, memcalc::cli::parse_profile_json, "profile.json",
                  {"--preset gpt2 --seq 64 --profile-file profile.json --format json",
                   "--preset mixtral-8x7b --seq 128 --tp 2 --pp 2 --dp 2 --microbatches 4 --ep 2 "
                   "--activations architecture --profile-file profile.json --timeline",
                   "--preset llama-7b --seq 256 --activations architecture --recompute op "
                   "--profile-file profile.json"});
    return 0;
}
